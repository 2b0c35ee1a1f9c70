//! The agent: one thread running a current-thread tokio runtime that
//! holds the node's lease, publishes its report, campaigns for leader,
//! writes the plan when it leads and tells its daemon the plan once a
//! second (see the crate documentation for the layout and timings).

use crate::etcd::{self, describe, Endpoints, Keys, Leader, SealedEntry, SealedWrite, Snapshot};
use crate::node::{ControlNode, Node};
use crate::report::NodeReport;
use crate::sealed::Sealer;
use anyhow::{anyhow, Context, Result};
use espgate_api::cluster::{ClusterSas, ClusterUpdate, PlanDoc, SharedIke, SharedSa};
use espgate_config::cluster::Cluster;
use etcd_client::{Client, LeaderKey, PutOptions, ResignOptions, WatchFilterType, WatchOptions};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

/// How often the agent reads its daemon, publishes its report, reads the
/// cluster and tells its daemon the plan.
pub const PERIOD: Duration = Duration::from_secs(1);

/// How often the leader asks its daemon whether its shared SAs changed
/// (with a cluster key): a rekey's new SA reaches etcd, and so the other
/// nodes, within this, not within a [`PERIOD`].
pub const SA_POLL: Duration = Duration::from_millis(100);

/// For this long after one of its SAs is found waiting to be shared, the
/// leader also reads the other nodes' reports every [`SA_POLL`] to share
/// it as soon as they have it ready; then only once a [`PERIOD`].
const SHARE_POLL_FOR: Duration = Duration::from_secs(10);

/// The longest one cycle's etcd part may take (connecting included).
const CYCLE_TIMEOUT: Duration = Duration::from_secs(3);
/// An IKE SA state whose export generation has not moved is written again
/// this often, no more: its remaining times (rekey, expiry) follow the
/// clock, so the text differs at every export, and a write each time
/// would wake every agent's watch, the leader's own included — a loop of
/// writes at etcd's round-trip speed. A successor's timers are late by
/// at most this much.
const IKE_REFRESH: Duration = Duration::from_secs(10);

/// The longest each of resign and revoke may take when the agent stops.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(1);
/// After the plan stopped naming a leaving node: time for the other
/// agents (they watch the plan) to give it to their daemons before this
/// node stops forwarding.
const TAKEOVER_MARGIN: Duration = Duration::from_millis(300);

/// The first and the longest wait between two attempts to reconnect.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(4);

/// Failed cycles in a row after which the connection is made anew (to
/// the next endpoint that answers, at once: a lease lasts only a few
/// seconds).
const FAILURES_BEFORE_RECONNECT: u32 = 1;

/// How a stop was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Run,
    /// Resign and revoke the lease: the others see the leave at once.
    Leave,
    /// Stop as a crash would: nothing more is said to etcd.
    Abandon,
}

/// A running cluster agent (its own thread). Stop it with
/// [`Agent::stop`]; dropping it stops it the same way.
#[derive(Debug)]
pub struct Agent {
    node: u16,
    stop: watch::Sender<Stop>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the agent's loop needs from the configuration.
#[derive(Debug, Clone)]
struct Settings {
    name: String,
    node: u16,
    ttl: Duration,
    hold: Duration,
    keys: Keys,
    /// Seals and opens the shared SAs (with a cluster key).
    sealer: Option<Arc<Sealer>>,
}

impl Agent {
    /// Starts the agent of the node whose daemon answers on
    /// `control_socket`. Fails only on what will not get better by
    /// waiting (unreadable TLS or password files, no thread); an etcd or a
    /// daemon that does not answer yet is retried for ever.
    pub fn start(cluster: &Cluster, control_socket: PathBuf) -> Result<Agent> {
        Agent::start_with(cluster, Arc::new(ControlNode::new(control_socket)))
    }

    /// [`Agent::start`] with the daemon side given (tests give a fake).
    pub fn start_with(cluster: &Cluster, node: Arc<dyn Node>) -> Result<Agent> {
        let endpoints = Endpoints::new(cluster)?;
        let settings = Settings {
            name: cluster.name.clone(),
            node: cluster.node,
            ttl: cluster.lease_ttl.max(Duration::from_secs(2)),
            hold: cluster.hold,
            keys: Keys::new(&cluster.name),
            sealer: cluster
                .key
                .as_ref()
                .map(Sealer::new)
                .transpose()
                .context("the cluster key")?
                .map(Arc::new),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the cluster agent's runtime")?;
        let (stop_tx, stop_rx) = watch::channel(Stop::Run);
        let thread = std::thread::Builder::new()
            .name(format!("espgate-cluster-{}", cluster.node))
            .spawn(move || {
                let state = State::new(settings, endpoints, node);
                rt.block_on(run(state, stop_rx));
                // A daemon call still blocking in the pool ends within its
                // own timeout; do not wait for it longer than that.
                rt.shutdown_timeout(crate::node::DAEMON_TIMEOUT);
            })
            .context("starting the cluster agent's thread")?;
        Ok(Agent {
            node: cluster.node,
            stop: stop_tx,
            thread: Some(thread),
        })
    }

    /// The node this agent speaks for.
    pub fn node(&self) -> u16 {
        self.node
    }

    /// Leaves the cluster (resigns the leadership, revokes the lease, so
    /// the others drop this node from the plan within a second) and
    /// stops the thread.
    pub fn stop(mut self) {
        self.finish(Stop::Leave);
    }

    /// Stops the thread as a crash would: no resign, no revoke, no more
    /// keep-alives. The node leaves the plan when its lease expires.
    /// For failover tests and drills.
    pub fn abandon(mut self) {
        self.finish(Stop::Abandon);
    }

    fn finish(&mut self, how: Stop) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        // The loop reads the value when it sees the change; a send only
        // fails when the loop has already ended.
        let _ = self.stop.send(how);
        if thread.join().is_err() {
            tracing::error!("the cluster agent's thread panicked");
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.finish(Stop::Leave);
    }
}

/// The agent's loop: a cycle every [`PERIOD`] or when the plan changes,
/// and on the leader with a cluster key a look at its shared SAs every
/// [`SA_POLL`], until asked to stop.
async fn run(mut st: State, mut stop: watch::Receiver<Stop>) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut poll = tokio::time::interval(SA_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let wake = st.wake.clone();
    loop {
        let full = tokio::select! {
            _ = stop.changed() => break,
            _ = tick.tick() => true,
            _ = wake.notified() => true,
            _ = poll.tick(), if st.polls_sas() => false,
        };
        tokio::select! {
            _ = stop.changed() => break,
            _ = async {
                if full {
                    st.cycle().await
                } else {
                    st.poll_sas().await
                }
            } => {}
        }
    }
    let how = *stop.borrow();
    match how {
        Stop::Abandon => {
            tracing::info!(
                "cluster {}: node {}'s agent stops without leaving (its lease expires in {}s)",
                st.cfg.name,
                st.cfg.node,
                st.cfg.ttl.as_secs()
            );
        }
        // A dropped sender (the Agent gone without a word) is a leave too.
        Stop::Leave | Stop::Run => st.leave().await,
    }
}

/// One connection to etcd with this node's lease and the tasks that use it.
struct Session {
    client: Client,
    lease: i64,
    /// Set by the keeper when etcd says the lease is gone.
    lost: Arc<AtomicBool>,
    /// This node's election key, once elected.
    elected: watch::Receiver<Option<LeaderKey>>,
    elected_tx: Arc<watch::Sender<Option<LeaderKey>>>,
    /// Runs a cycle at once (elected, or the plan changed).
    wake: Arc<Notify>,
    keeper: JoinHandle<()>,
    campaign: JoinHandle<()>,
    plan_watch: JoinHandle<()>,
    leave_watch: JoinHandle<()>,
    /// With a cluster key: any change of `sas/` or `ike/` (a follower
    /// installs a new SA, or holds the leader's latest IKE state, at once).
    sealed_watches: Vec<JoinHandle<()>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keeper.abort();
        self.campaign.abort();
        self.plan_watch.abort();
        self.leave_watch.abort();
        for w in &self.sealed_watches {
            w.abort();
        }
    }
}

/// Is this the error of a lease etcd no longer has?
fn lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(m) => m.contains("not found"),
        etcd_client::Error::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}

impl Session {
    /// Connects, takes up lease `resume` if etcd still has it (after a
    /// reconnect) or grants a new one, and starts the keeper, the
    /// campaign and the watch on the plan.
    async fn open(
        endpoints: &Endpoints,
        cfg: &Settings,
        resume: Option<i64>,
        wake: Arc<Notify>,
    ) -> Result<Session> {
        let mut client = endpoints.connect().await?;
        let mut lease = None;
        if let Some(id) = resume {
            match client.lease_keep_alive(id).await {
                Ok(_) => lease = Some(id),
                Err(e) if lease_gone(&e) => {
                    tracing::info!(
                        "cluster {}: lease {id:x} expired while etcd was away; granting a new one",
                        cfg.name
                    );
                }
                Err(e) => return Err(anyhow!("renewing lease {id:x}: {}", describe(&e))),
            }
        }
        let lease = match lease {
            Some(id) => id,
            None => {
                let ttl = i64::try_from(cfg.ttl.as_secs()).unwrap_or(60);
                client
                    .lease_grant(ttl, None)
                    .await
                    .map_err(|e| anyhow!("granting a lease of {ttl}s: {}", describe(&e)))?
                    .id()
            }
        };
        let lost = Arc::new(AtomicBool::new(false));
        let (elected_tx, elected) = watch::channel(None);
        let elected_tx = Arc::new(elected_tx);
        let keeper = tokio::spawn(keep_lease(client.clone(), lease, cfg.ttl, lost.clone()));
        let campaign = tokio::spawn(campaign(
            client.clone(),
            cfg.keys.leader.clone(),
            cfg.node,
            lease,
            elected_tx.clone(),
            wake.clone(),
        ));
        let plan_watch = tokio::spawn(watch_key(
            client.clone(),
            cfg.keys.plan.clone(),
            None,
            wake.clone(),
        ));
        // Deletes only: every report is put once a second, but a leave or
        // an expiry is worth a cycle at once (the leader replans).
        let leave_watch = tokio::spawn(watch_key(
            client.clone(),
            cfg.keys.nodes.clone(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_filters([WatchFilterType::NoPut]),
            ),
            wake.clone(),
        ));
        // Two prefixes, not their common parent: that would wake on
        // every report (`nodes/`) too.
        let sealed_watches = if cfg.sealer.is_some() {
            [&cfg.keys.sas, &cfg.keys.ike]
                .into_iter()
                .map(|prefix| {
                    tokio::spawn(watch_key(
                        client.clone(),
                        prefix.clone(),
                        Some(WatchOptions::new().with_prefix()),
                        wake.clone(),
                    ))
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Session {
            client,
            lease,
            lost,
            elected,
            elected_tx,
            wake,
            keeper,
            campaign,
            plan_watch,
            leave_watch,
            sealed_watches,
        })
    }

    /// Campaigns again (this node's election key is gone while its lease
    /// lives: deleted by hand, say).
    fn campaign_again(&mut self, cfg: &Settings) {
        self.campaign.abort();
        self.elected_tx.send_replace(None);
        self.campaign = tokio::spawn(campaign(
            self.client.clone(),
            cfg.keys.leader.clone(),
            cfg.node,
            self.lease,
            self.elected_tx.clone(),
            self.wake.clone(),
        ));
    }
}

/// Renews lease `id` every `ttl / 3` until etcd says it is gone (then
/// sets `lost`); a broken stream is opened again.
async fn keep_lease(mut client: Client, id: i64, ttl: Duration, lost: Arc<AtomicBool>) {
    let every = ttl / 3;
    loop {
        match tokio::time::timeout(every, client.lease_keep_alive(id)).await {
            Ok(Ok((mut keeper, mut stream))) => loop {
                tokio::time::sleep(every).await;
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match tokio::time::timeout(every, stream.message()).await {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                    Ok(Ok(Some(_))) => {
                        lost.store(true, Ordering::Relaxed);
                        return;
                    }
                    _ => break,
                }
            },
            Ok(Err(e)) if lease_gone(&e) => {
                lost.store(true, Ordering::Relaxed);
                return;
            }
            Ok(Err(e)) => tracing::debug!("keeping lease {id:x} alive: {}", describe(&e)),
            Err(_) => tracing::debug!("keeping lease {id:x} alive: no answer"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Campaigns for leader with etcd's election API until elected, then
/// says so through `elected` and wakes the loop (`wake`), so that a new
/// leader plans at once.
async fn campaign(
    mut client: Client,
    name: String,
    node: u16,
    lease: i64,
    elected: Arc<watch::Sender<Option<LeaderKey>>>,
    wake: Arc<Notify>,
) {
    loop {
        match client
            .campaign(name.as_str(), node.to_string(), lease)
            .await
        {
            Ok(mut r) => {
                if let Some(key) = r.take_leader() {
                    elected.send_replace(Some(key));
                    wake.notify_one();
                    return;
                }
                tracing::debug!("campaign for {name}: elected without a key; again");
            }
            Err(e) if lease_gone(&e) => return,
            Err(e) => tracing::debug!("campaign for {name}: {}", describe(&e)),
        }
        tokio::time::sleep(PERIOD).await;
    }
}

/// Wakes the loop on every event of `key` (with `options`); a broken
/// watch is opened again.
async fn watch_key(
    mut client: Client,
    key: String,
    options: Option<WatchOptions>,
    wake: Arc<Notify>,
) {
    loop {
        match client.watch(key.as_str(), options.clone()).await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(r)) if r.canceled() => break,
                    Ok(Some(r)) => {
                        if !r.events().is_empty() {
                            wake.notify_one();
                        }
                    }
                    Ok(None) | Err(_) => break,
                }
            },
            Err(e) => tracing::debug!("watching {key}: {}", describe(&e)),
        }
        tokio::time::sleep(PERIOD).await;
    }
}

/// Everything the loop keeps between cycles.
struct State {
    cfg: Settings,
    endpoints: Endpoints,
    node: Arc<dyn Node>,
    session: Option<Session>,
    /// The lease to take up again at the next connection.
    resume: Option<i64>,
    /// Not before this instant, and the wait after the next failure.
    next_connect: Instant,
    backoff: Duration,
    /// Failed cycles in a row on the current session.
    failures: u32,
    /// Since when etcd fails (logged once when it starts and ends).
    etcd_down: Option<Instant>,
    /// The daemon's status call fails (logged on change).
    daemon_down: bool,
    /// The daemon refuses the updates (logged on change).
    update_failing: bool,
    /// Told once: another lease held this node's report key.
    warned_duplicate: bool,
    /// Last leader and plan seen, for a log line when they change.
    last_leader: Option<Option<u16>>,
    last_plan: Option<PlanDoc>,
    /// Runs a cycle at once (elected, or the plan changed).
    wake: Arc<Notify>,
    /// The shared SAs as etcd holds them, by key: from the latest read,
    /// and on the leader its own writes since.
    sas: BTreeMap<String, Held<SharedSa>>,
    /// Entries that did not open, told once each: key, mod revision.
    warned_sas: BTreeMap<String, i64>,
    /// The IKE SA states as etcd holds them, by key (as `sas`).
    ike: BTreeMap<String, Held<SharedIke>>,
    /// `ike/` entries that did not open, told once each.
    warned_ike: BTreeMap<String, i64>,
    /// While this node leads: its election key, which guards its writes.
    leading: Option<Leader>,
    /// The export generation whose SAs are all in etcd.
    written_generation: Option<u64>,
    /// When this node last wrote its IKE SA states ([`IKE_REFRESH`]).
    ike_written_at: Option<tokio::time::Instant>,
    /// The shared SAs last given to the daemon.
    sent_sas: Option<Vec<SharedSa>>,
    /// The daemon took an update carrying the shared SAs (so its export
    /// holds those it could install: until then the leader deletes
    /// nothing from etcd).
    daemon_has_sas: bool,
    /// This node's SAs that wait for the others to be ready, since when.
    share_waiting: BTreeMap<(u32, bool), Instant>,
    /// The export call fails (logged on change).
    export_failing: bool,
    /// The SAs whose share call failed (logged once each; retried).
    share_failing: BTreeSet<(u32, bool)>,
    /// Publishing the shared SAs fails (logged on change).
    publish_failing: bool,
}

/// A `sas/` or `ike/` entry as this agent last knew it.
#[derive(Debug, Clone)]
struct Held<T> {
    /// Its mod revision when read (0: written by this agent since).
    mod_rev: i64,
    /// The SA or IKE state; `None`: it did not open.
    value: Option<T>,
}

/// What a sealed entry holds, for [`open_entries`].
trait Sealed: DeserializeOwned + Clone {
    /// Its key.
    fn key(&self, keys: &Keys) -> String;
    /// It in words, for logs (never a key or a state).
    fn what(&self) -> String;
}

impl Sealed for SharedSa {
    fn key(&self, keys: &Keys) -> String {
        keys.sa(&self.name())
    }
    fn what(&self) -> String {
        format!("SA {}", self.name())
    }
}

impl Sealed for SharedIke {
    fn key(&self, keys: &Keys) -> String {
        keys.ike(&self.conn)
    }
    fn what(&self) -> String {
        format!("the IKE SA of connection \"{}\"", self.conn)
    }
}

/// `entries` as [`Held`], opening those that are new or changed since
/// `held` (the others are taken from it); an entry that does not open, or
/// holds another item than its key names, is kept as such and told once
/// per key and mod revision (`warned`).
fn open_entries<T: Sealed>(
    cfg: &Settings,
    sealer: &Sealer,
    entries: &[SealedEntry],
    held: &BTreeMap<String, Held<T>>,
    warned: &mut BTreeMap<String, i64>,
) -> BTreeMap<String, Held<T>> {
    let mut now = BTreeMap::new();
    for e in entries {
        if let Some(h) = held.get(&e.key).filter(|h| h.mod_rev == e.mod_rev) {
            now.insert(e.key.clone(), h.clone());
            continue;
        }
        let opened = sealer.open::<T>(&e.key, &e.value).and_then(|item| {
            if item.key(&cfg.keys) == e.key {
                Ok(item)
            } else {
                Err(anyhow!(
                    "it holds {}, not the one its key names",
                    item.what()
                ))
            }
        });
        let value = match opened {
            Ok(item) => {
                warned.remove(&e.key);
                Some(item)
            }
            Err(err) => {
                if warned.get(&e.key) != Some(&e.mod_rev) {
                    tracing::warn!(
                        "cluster {}: skipping {}: {err:#}; is key_file the same on every node?",
                        cfg.name,
                        e.key
                    );
                    warned.insert(e.key.clone(), e.mod_rev);
                }
                None
            }
        };
        now.insert(
            e.key.clone(),
            Held {
                mod_rev: e.mod_rev,
                value,
            },
        );
    }
    warned.retain(|k, _| now.contains_key(k));
    now
}

impl State {
    fn new(cfg: Settings, endpoints: Endpoints, node: Arc<dyn Node>) -> State {
        State {
            cfg,
            endpoints,
            node,
            session: None,
            resume: None,
            next_connect: Instant::now(),
            backoff: BACKOFF_MIN,
            failures: 0,
            etcd_down: None,
            daemon_down: false,
            update_failing: false,
            warned_duplicate: false,
            last_leader: None,
            last_plan: None,
            wake: Arc::new(Notify::new()),
            sas: BTreeMap::new(),
            warned_sas: BTreeMap::new(),
            ike: BTreeMap::new(),
            warned_ike: BTreeMap::new(),
            leading: None,
            written_generation: None,
            ike_written_at: None,
            sent_sas: None,
            daemon_has_sas: false,
            share_waiting: BTreeMap::new(),
            export_failing: false,
            share_failing: BTreeSet::new(),
            publish_failing: false,
        }
    }

    /// One cycle: the daemon's status, the report, the cluster read and,
    /// when etcd answered, the update to the daemon.
    async fn cycle(&mut self) {
        let node = self.node.clone();
        let status = tokio::task::spawn_blocking(move || node.status())
            .await
            .unwrap_or_else(|e| Err(anyhow!("the daemon status call failed: {e}")));
        match &status {
            Err(e) if !self.daemon_down => {
                tracing::warn!(
                    "cluster {}: no status from the daemon ({e:#}); node {} reports itself \
                     as not in step, so it leaves the plan",
                    self.cfg.name,
                    self.cfg.node
                );
                self.daemon_down = true;
            }
            Ok(_) if self.daemon_down => {
                tracing::info!("cluster {}: the daemon answers again", self.cfg.name);
                self.daemon_down = false;
            }
            _ => {}
        }
        if status.is_err() {
            // It may come back without the SAs it had installed.
            self.daemon_has_sas = false;
        }
        let report = match &status {
            Ok(s) => NodeReport::from_status(self.cfg.node, Ok(s.as_ref())),
            Err(_) => NodeReport::from_status(self.cfg.node, Err(())),
        };
        // The leader's shared SAs, read before the etcd part so that a
        // slow daemon does not count as an etcd failure.
        let export = if self.cfg.sealer.is_some() && self.elected() {
            self.export().await
        } else {
            None
        };
        let result = tokio::time::timeout(CYCLE_TIMEOUT, self.etcd_cycle(&report, export))
            .await
            .unwrap_or_else(|_| Err(anyhow!("no answer within {}s", CYCLE_TIMEOUT.as_secs())));
        match result {
            Ok((mut update, to_share)) => {
                self.failures = 0;
                if let Some(since) = self.etcd_down.take() {
                    tracing::info!(
                        "cluster {}: etcd at {} answers again (after {:.1}s); updates to the \
                         daemon resume",
                        self.cfg.name,
                        self.endpoints.list(),
                        since.elapsed().as_secs_f64()
                    );
                }
                if !to_share.is_empty() {
                    self.share(to_share).await;
                }
                // With the writes of this cycle.
                if let Some(list) = update.sas.as_mut() {
                    *list = self.shared_list();
                }
                if let Some(list) = update.ike.as_mut() {
                    *list = self.ike_list();
                }
                self.send(update).await;
            }
            Err(e) => self.etcd_failed(e),
        }
    }

    fn etcd_failed(&mut self, e: anyhow::Error) {
        if self.session.is_some() {
            self.failures += 1;
            if self.failures >= FAILURES_BEFORE_RECONNECT {
                // Connect anew, keeping the lease if etcd still has it,
                // in a cycle of its own right away.
                self.resume = self.session.take().map(|s| s.lease);
                self.failures = 0;
                self.wake.notify_one();
            }
        }
        match self.etcd_down {
            None => {
                tracing::warn!(
                    "cluster {}: etcd at {}: {e:#}; node {} sends its daemon no cluster updates \
                     until etcd answers (the daemon keeps forwarding on its last plan for \
                     hold = {}s, then stops processing)",
                    self.cfg.name,
                    self.endpoints.list(),
                    self.cfg.node,
                    self.cfg.hold.as_secs()
                );
                self.etcd_down = Some(Instant::now());
            }
            Some(_) => tracing::debug!(
                "cluster {}: etcd at {}: {e:#}",
                self.cfg.name,
                self.endpoints.list()
            ),
        }
    }

    /// The etcd part of a cycle: (re)connect when needed, publish the
    /// report, read the cluster, write the plan and the shared SAs
    /// (`export`) when leading; the update for the daemon, and the SAs to
    /// share now.
    async fn etcd_cycle(
        &mut self,
        report: &NodeReport,
        export: Option<ClusterSas>,
    ) -> Result<(ClusterUpdate, Vec<(u32, bool)>)> {
        if self
            .session
            .as_ref()
            .is_some_and(|s| s.lost.load(Ordering::Relaxed))
        {
            tracing::warn!(
                "cluster {}: etcd dropped node {}'s lease; granting a new one",
                self.cfg.name,
                self.cfg.node
            );
            self.session = None;
            self.resume = None;
        }
        if self.session.is_none() {
            self.leading = None;
            let now = Instant::now();
            if now < self.next_connect {
                return Err(anyhow!(
                    "unreachable; next attempt in {:.1}s",
                    (self.next_connect - now).as_secs_f64()
                ));
            }
            let opened =
                Session::open(&self.endpoints, &self.cfg, self.resume, self.wake.clone()).await;
            match opened {
                Ok(s) => {
                    tracing::info!(
                        "cluster {}: node {} is in etcd at {} (lease {:x}, ttl {}s)",
                        self.cfg.name,
                        self.cfg.node,
                        self.endpoints.list(),
                        s.lease,
                        self.cfg.ttl.as_secs()
                    );
                    self.session = Some(s);
                    self.resume = None;
                    self.backoff = BACKOFF_MIN;
                }
                Err(e) => {
                    self.next_connect = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    return Err(e);
                }
            }
        }
        let Some(s) = self.session.as_mut() else {
            return Err(anyhow!("no etcd session"));
        };
        let value = serde_json::to_vec(report).context("encoding the node report")?;
        let key = self.cfg.keys.node(self.cfg.node);
        let put = s
            .client
            .put(
                key.as_str(),
                value,
                Some(PutOptions::new().with_lease(s.lease).with_prev_key()),
            )
            .await;
        match put {
            Ok(r) => {
                let other = r
                    .prev_key()
                    .map(|kv| kv.lease())
                    .filter(|&l| l != 0 && l != s.lease);
                if let (Some(other), false) = (other, self.warned_duplicate) {
                    tracing::warn!(
                        "cluster {}: {key} was held by lease {other:x}, not this agent's: \
                         is another agent running as node {} (or did this node's previous \
                         run not leave)?",
                        self.cfg.name,
                        self.cfg.node
                    );
                    self.warned_duplicate = true;
                }
            }
            Err(e) => {
                if lease_gone(&e) {
                    s.lost.store(true, Ordering::Relaxed);
                }
                return Err(anyhow!("publishing {key}: {}", describe(&e)));
            }
        }
        // Taken before the read: a node elected by then has the first
        // election key for as long as its key exists.
        let elected = s.elected.borrow().clone();
        let snap = etcd::snapshot(&mut s.client, &self.cfg.keys).await?;
        self.open_sas(&snap);
        let plan = match elected {
            Some(mine) => self.lead(&snap, &mine).await?,
            None => {
                self.leading = None;
                snap.plan.clone()
            }
        };
        let to_share = match export {
            Some(export) if self.leading.is_some() => {
                self.publish_or_warn(&export).await;
                self.shareable(&export, plan.as_ref(), &snap.nodes)
            }
            _ => Vec::new(),
        };
        let me = self.cfg.node;
        let leader = snap.leader.as_ref().and_then(|l| l.node);
        if self.last_leader != Some(leader) {
            match leader {
                Some(l) if l == me => tracing::info!("cluster {}: this node leads", self.cfg.name),
                Some(l) => tracing::info!("cluster {}: node {l} leads", self.cfg.name),
                None => tracing::info!("cluster {}: no leader yet", self.cfg.name),
            }
            self.last_leader = Some(leader);
        }
        if plan.is_some() && self.last_plan != plan {
            if let Some(p) = &plan {
                tracing::info!(
                    "cluster {}: plan epoch {}: members {:?}",
                    self.cfg.name,
                    p.epoch,
                    p.members
                );
            }
            self.last_plan = plan.clone();
        }
        if let Some(e) = &snap.plan_error {
            tracing::debug!("cluster {}: {e}", self.cfg.name);
        }
        let update = ClusterUpdate {
            plan,
            leader,
            checkpoints: snap
                .nodes
                .values()
                .filter(|r| r.node != me)
                .flat_map(NodeReport::checkpoints)
                .collect(),
            sas: self.cfg.sealer.is_some().then(|| self.shared_list()),
            ike: self.cfg.sealer.is_some().then(|| self.ike_list()),
        };
        Ok((update, to_share))
    }

    /// When this node was elected (`mine`, its election key): writes the plan if its members changed. The
    /// plan in force afterwards.
    async fn lead(&mut self, snap: &Snapshot, mine: &LeaderKey) -> Result<Option<PlanDoc>> {
        let Some(s) = self.session.as_mut() else {
            return Ok(snap.plan.clone());
        };
        let leader = match &snap.leader {
            Some(l) if l.key == mine.key() => l.clone(),
            _ => {
                self.leading = None;
                tracing::warn!(
                    "cluster {}: node {}'s election key is gone while its lease lives; \
                     campaigning again",
                    self.cfg.name,
                    self.cfg.node
                );
                s.campaign_again(&self.cfg);
                return Ok(snap.plan.clone());
            }
        };
        self.leading = Some(leader.clone());
        let Some(next) = etcd::next_plan(snap) else {
            return Ok(snap.plan.clone());
        };
        if etcd::write_plan(&mut s.client, &self.cfg.keys, snap, &leader, &next).await? {
            tracing::info!(
                "cluster {}: the leader writes plan epoch {}: members {:?}",
                self.cfg.name,
                next.epoch,
                next.members
            );
            Ok(Some(next))
        } else {
            // The plan moved (or this node no longer leads) since the
            // read: the next cycle decides on fresh data.
            Ok(snap.plan.clone())
        }
    }

    /// Sends the daemon its update.
    async fn send(&mut self, update: ClusterUpdate) {
        let node = self.node.clone();
        let sas = update.sas.clone();
        let r = tokio::task::spawn_blocking(move || node.update(update))
            .await
            .unwrap_or_else(|e| Err(anyhow!("the daemon update call failed: {e}")));
        if r.is_ok() && sas.is_some() {
            self.daemon_has_sas = true;
            if self.sent_sas != sas {
                // A new list: once more at once, so that the report says
                // which of the SAs the daemon has now installed (the
                // leader waits for that to share them).
                self.sent_sas = sas;
                self.wake.notify_one();
            }
        }
        match r {
            Err(e) if !self.update_failing => {
                tracing::warn!("cluster {}: {e:#}", self.cfg.name);
                self.update_failing = true;
            }
            Ok(()) if self.update_failing => {
                tracing::info!("cluster {}: the daemon takes updates again", self.cfg.name);
                self.update_failing = false;
            }
            _ => {}
        }
    }

    /// Whether this node's campaign has won (as far as this agent knows).
    fn elected(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| s.elected.borrow().is_some())
    }

    /// Whether to look at the daemon's shared SAs every [`SA_POLL`]: this
    /// node leads, with a cluster key, and etcd answers.
    fn polls_sas(&self) -> bool {
        self.cfg.sealer.is_some()
            && self.leading.is_some()
            && self.session.is_some()
            && self.etcd_down.is_none()
    }

    /// The daemon's shared SAs (`None` when it did not answer: logged on
    /// change).
    async fn export(&mut self) -> Option<ClusterSas> {
        let node = self.node.clone();
        let r = tokio::task::spawn_blocking(move || node.export())
            .await
            .unwrap_or_else(|e| Err(anyhow!("the daemon export call failed: {e}")));
        match r {
            Ok(x) => {
                if self.export_failing {
                    tracing::info!(
                        "cluster {}: the daemon exports its shared SAs again",
                        self.cfg.name
                    );
                    self.export_failing = false;
                }
                Some(x)
            }
            Err(e) => {
                if !self.export_failing {
                    tracing::warn!(
                        "cluster {}: {e:#}; the leader publishes no SA changes until it answers",
                        self.cfg.name
                    );
                    self.export_failing = true;
                }
                None
            }
        }
    }

    /// Every [`SA_POLL`] on the leader: when the daemon's shared SAs
    /// changed, publishes them at once (and shares those ready); while one
    /// waits to be shared, checks the other nodes' reports too.
    async fn poll_sas(&mut self) {
        let Some(export) = self.export().await else {
            return;
        };
        let changed = self.written_generation != Some(export.generation);
        let waiting = self
            .share_waiting
            .values()
            .any(|t| t.elapsed() < SHARE_POLL_FOR);
        if !changed && !waiting {
            return;
        }
        let step = tokio::time::timeout(CYCLE_TIMEOUT, self.lead_sas(&export)).await;
        match step {
            Ok(Ok(to_share)) if !to_share.is_empty() => self.share(to_share).await,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!("cluster {}: {e:#}", self.cfg.name),
            Err(_) => tracing::debug!(
                "cluster {}: publishing the shared SAs: no answer within {}s",
                self.cfg.name,
                CYCLE_TIMEOUT.as_secs()
            ),
        }
    }

    /// [`poll_sas`](State::poll_sas)'s etcd part: a fresh read (the
    /// leadership, the entries, the reports), the writes; the SAs to
    /// share now.
    async fn lead_sas(&mut self, export: &ClusterSas) -> Result<Vec<(u32, bool)>> {
        let Some(s) = self.session.as_mut() else {
            return Ok(Vec::new());
        };
        let snap = etcd::snapshot(&mut s.client, &self.cfg.keys).await?;
        self.open_sas(&snap);
        let still = match (&self.leading, &snap.leader) {
            (Some(mine), Some(l)) => mine.key == l.key && mine.create_rev == l.create_rev,
            _ => false,
        };
        if !still {
            // The next cycle finds out who leads.
            self.leading = None;
            return Ok(Vec::new());
        }
        self.publish(export).await?;
        Ok(self.shareable(export, snap.plan.as_ref(), &snap.nodes))
    }

    /// Takes the `sas/` and `ike/` entries of `snap`, opening those that
    /// are new or changed; an entry that does not open is kept as such
    /// (the leader deletes an SA's if its daemon does not export it) and
    /// told once.
    fn open_sas(&mut self, snap: &Snapshot) {
        let Some(sealer) = self.cfg.sealer.clone() else {
            return;
        };
        self.sas = open_entries(
            &self.cfg,
            &sealer,
            &snap.sas,
            &self.sas,
            &mut self.warned_sas,
        );
        self.ike = open_entries(
            &self.cfg,
            &sealer,
            &snap.ike,
            &self.ike,
            &mut self.warned_ike,
        );
    }

    /// The shared SAs for the daemon: every entry that opened.
    fn shared_list(&self) -> Vec<SharedSa> {
        self.sas.values().filter_map(|h| h.value.clone()).collect()
    }

    /// The IKE SA states for the daemon: every entry that opened.
    fn ike_list(&self) -> Vec<SharedIke> {
        self.ike.values().filter_map(|h| h.value.clone()).collect()
    }

    /// [`publish`](State::publish), a failure logged (on change) rather
    /// than failing the cycle: the plan's confirmation still goes out.
    async fn publish_or_warn(&mut self, export: &ClusterSas) {
        match self.publish(export).await {
            Ok(()) if self.publish_failing => {
                tracing::info!(
                    "cluster {}: the shared SAs are published again",
                    self.cfg.name
                );
                self.publish_failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                if !self.publish_failing {
                    tracing::warn!("cluster {}: {e:#}", self.cfg.name);
                    self.publish_failing = true;
                }
            }
        }
    }

    /// On the leader: makes `sas/` hold exactly the daemon's export (puts
    /// the SAs whose entry is missing or differs, deletes the entries it
    /// does not list) and `ike/` hold its IKE SA states (puts those whose
    /// entry is missing or differs, deletes only this node's own entries
    /// that it no longer lists: another node's stay until this one
    /// publishes that connection's), guarded by this node's election key.
    /// Everything is sealed before anything is written: a sealing failure
    /// writes nothing.
    async fn publish(&mut self, export: &ClusterSas) -> Result<()> {
        let (Some(sealer), Some(leader)) = (self.cfg.sealer.clone(), self.leading.clone()) else {
            return Ok(());
        };
        let me = self.cfg.node;
        let want: BTreeMap<String, &SharedSa> = export
            .sas
            .iter()
            .map(|sa| (self.cfg.keys.sa(&sa.name()), sa))
            .collect();
        let want_ike: BTreeMap<String, &SharedIke> = export
            .ike
            .iter()
            .map(|ike| (self.cfg.keys.ike(&ike.conn), ike))
            .collect();
        let mut changes = Vec::new();
        let mut lines = Vec::new();
        // Told at debug level only: an IKE state changes with every
        // exchange.
        let mut quiet = Vec::new();
        for (k, sa) in &want {
            let had = self.sas.get(k).and_then(|h| h.value.as_ref());
            if had == Some(*sa) {
                continue;
            }
            changes.push(SealedWrite::Put(k.clone(), sealer.seal(k, *sa)?));
            let from = sa
                .share_from
                .map_or_else(|| "not yet".to_string(), |f| f.to_string());
            lines.push(match had {
                Some(h) if h.share_from.is_none() && sa.share_from.is_some() => format!(
                    "SA {} of connection \"{}\" is shared over the plan (share_from {from})",
                    sa.name(),
                    sa.conn
                ),
                Some(h) if h.encap != sa.encap => format!(
                    "updates SA {} of connection \"{}\": the peer's NAT moved it to UDP port {} \
                     (share_from {from})",
                    sa.name(),
                    sa.conn,
                    sa.encap
                        .map_or_else(|| "none".to_string(), |(_, peer)| peer.to_string())
                ),
                Some(_) => format!(
                    "updates SA {} of connection \"{}\" (share_from {from})",
                    sa.name(),
                    sa.conn
                ),
                None => format!(
                    "publishes SA {} of connection \"{}\" (negotiated by node {}{}; \
                     share_from {from})",
                    sa.name(),
                    sa.conn,
                    sa.owner,
                    if sa.owner == me { ", this one" } else { "" }
                ),
            });
        }
        if self.daemon_has_sas {
            for (k, h) in &self.sas {
                if want.contains_key(k) {
                    continue;
                }
                changes.push(SealedWrite::Delete(k.clone()));
                lines.push(match &h.value {
                    Some(sa) => format!(
                        "removes SA {} of connection \"{}\" (share_from {}): the leader's \
                         daemon no longer has it",
                        sa.name(),
                        sa.conn,
                        sa.share_from
                            .map_or_else(|| "not yet".to_string(), |f| f.to_string())
                    ),
                    None => format!("removes {k}: it did not open, and no daemon exports it"),
                });
            }
        }
        // Only the remaining times can have changed (see IKE_REFRESH).
        let ike_fresh = self.written_generation == Some(export.generation)
            && self
                .ike_written_at
                .is_some_and(|t| t.elapsed() < IKE_REFRESH);
        for (k, ike) in &want_ike {
            let had = self.ike.get(k).and_then(|h| h.value.as_ref());
            if had == Some(*ike) || (ike_fresh && had.is_some_and(|h| h.owner == ike.owner)) {
                continue;
            }
            changes.push(SealedWrite::Put(k.clone(), sealer.seal(k, *ike)?));
            match had {
                Some(h) if h.owner == ike.owner => quiet.push(format!(
                    "updates the IKE SA state of connection \"{}\"",
                    ike.conn
                )),
                Some(h) => lines.push(format!(
                    "publishes the IKE SA state of connection \"{}\" run by node {} (it \
                     replaces node {}'s)",
                    ike.conn, ike.owner, h.owner
                )),
                None => lines.push(format!(
                    "publishes the IKE SA state of connection \"{}\" (run by node {}{})",
                    ike.conn,
                    ike.owner,
                    if ike.owner == me { ", this one" } else { "" }
                )),
            }
        }
        if self.daemon_has_sas {
            for (k, h) in &self.ike {
                // Only this node's own: a previous leader's state stays
                // for this node's daemon to continue (it then exports it
                // as its own), and one that does not open is not known to
                // be this node's.
                let Some(ike) = h.value.as_ref().filter(|i| i.owner == me) else {
                    continue;
                };
                if want_ike.contains_key(k) {
                    continue;
                }
                changes.push(SealedWrite::Delete(k.clone()));
                lines.push(format!(
                    "removes the IKE SA state of connection \"{}\": the leader's daemon no \
                     longer runs it",
                    ike.conn
                ));
            }
        }
        if !changes.is_empty() {
            let Some(s) = self.session.as_mut() else {
                return Ok(());
            };
            if !etcd::write_sealed(&mut s.client, &leader, &changes).await? {
                tracing::info!(
                    "cluster {}: the shared SAs were not written: node {} no longer leads",
                    self.cfg.name,
                    me
                );
                self.leading = None;
                return Ok(());
            }
            for c in &changes {
                match c {
                    SealedWrite::Put(k, _) => {
                        if let Some(sa) = want.get(k) {
                            let value = Some((*sa).clone());
                            self.sas.insert(k.clone(), Held { mod_rev: 0, value });
                        } else if let Some(ike) = want_ike.get(k) {
                            let value = Some((*ike).clone());
                            self.ike.insert(k.clone(), Held { mod_rev: 0, value });
                            self.ike_written_at = Some(tokio::time::Instant::now());
                        }
                    }
                    SealedWrite::Delete(k) => {
                        self.sas.remove(k);
                        self.ike.remove(k);
                    }
                }
            }
            for l in lines {
                tracing::info!("cluster {}: {l}", self.cfg.name);
            }
            for l in quiet {
                tracing::debug!("cluster {}: {l}", self.cfg.name);
            }
        }
        // Deletions held back (see `daemon_has_sas`) are left to the next
        // cycle.
        self.written_generation = Some(export.generation);
        Ok(())
    }

    /// The SAs of `export` to share now: this node's own, not shared yet,
    /// that every other member of `plan` reports ready (at once when the
    /// plan names only this node). Notes since when each other one waits.
    fn shareable(
        &mut self,
        export: &ClusterSas,
        plan: Option<&PlanDoc>,
        nodes: &BTreeMap<u16, NodeReport>,
    ) -> Vec<(u32, bool)> {
        let me = self.cfg.node;
        let mut now = Vec::new();
        let mut waiting = BTreeMap::new();
        for sa in export
            .sas
            .iter()
            .filter(|sa| sa.owner == me && sa.share_from.is_none())
        {
            let ready = plan.is_some_and(|p| {
                p.members.iter().filter(|&&m| m != me).all(|m| {
                    nodes
                        .get(m)
                        .is_some_and(|r| r.is_ready(sa.spi, sa.outbound))
                })
            });
            let id = (sa.spi, sa.outbound);
            if ready {
                now.push(id);
            } else {
                let since = self.share_waiting.get(&id).copied();
                waiting.insert(id, since.unwrap_or_else(Instant::now));
            }
        }
        self.share_waiting = waiting;
        now
    }

    /// Asks the daemon to share each SA of `list`, then publishes the
    /// updated list at once.
    async fn share(&mut self, list: Vec<(u32, bool)>) {
        let mut latest = None;
        for (spi, outbound) in list {
            let node = self.node.clone();
            let r = tokio::task::spawn_blocking(move || node.share(spi, outbound))
                .await
                .unwrap_or_else(|e| Err(anyhow!("the daemon share call failed: {e}")));
            match r {
                Ok(x) => {
                    self.share_failing.remove(&(spi, outbound));
                    latest = Some(x);
                }
                Err(e) if self.share_failing.insert((spi, outbound)) => {
                    tracing::warn!(
                        "cluster {}: {e:#} (tried again while it waits)",
                        self.cfg.name
                    )
                }
                Err(e) => tracing::debug!("cluster {}: {e:#}", self.cfg.name),
            }
        }
        let Some(export) = latest else {
            return;
        };
        let r = tokio::time::timeout(CYCLE_TIMEOUT, self.publish(&export)).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("cluster {}: {e:#}", self.cfg.name),
            Err(_) => tracing::warn!(
                "cluster {}: publishing the shared SAs: no answer within {}s",
                self.cfg.name,
                CYCLE_TIMEOUT.as_secs()
            ),
        }
    }

    /// Resigns and revokes the lease, each bounded by [`LEAVE_TIMEOUT`].
    async fn leave(&mut self) {
        let Some(s) = self.session.take() else {
            return;
        };
        let mut client = s.client.clone();
        let lease = s.lease;
        let elected = s.elected.borrow().clone();
        // No more keep-alives or campaign from here.
        drop(s);
        if let Some(key) = elected {
            let resign = client.resign(Some(ResignOptions::new().with_leader(key)));
            match tokio::time::timeout(LEAVE_TIMEOUT, resign).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(
                    "cluster {}: resigning the leadership: {}",
                    self.cfg.name,
                    describe(&e)
                ),
                Err(_) => tracing::warn!(
                    "cluster {}: resigning the leadership: etcd did not answer",
                    self.cfg.name
                ),
            }
        }
        match tokio::time::timeout(LEAVE_TIMEOUT, client.lease_revoke(lease)).await {
            Ok(Ok(_)) => {
                // The daemon still forwards: wait (bounded) until the plan
                // no longer names this node, then a moment for the other
                // agents, which watch the plan, to hand it to their daemons.
                let t0 = Instant::now();
                let limit = self.cfg.ttl + Duration::from_secs(1);
                let me = self.cfg.node;
                let mut out = false;
                while t0.elapsed() < limit {
                    let read = tokio::time::timeout(
                        LEAVE_TIMEOUT,
                        crate::etcd::snapshot(&mut client, &self.cfg.keys),
                    )
                    .await;
                    if let Ok(Ok(snap)) = read {
                        if snap.plan.as_ref().is_none_or(|p| !p.members.contains(&me)) {
                            out = true;
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if out {
                    tokio::time::sleep(TAKEOVER_MARGIN).await;
                }
                tracing::info!(
                    "cluster {}: node {} left (lease {lease:x} revoked); {} after {} ms",
                    self.cfg.name,
                    self.cfg.node,
                    if out {
                        "the plan no longer names it"
                    } else {
                        "the plan still named it"
                    },
                    t0.elapsed().as_millis()
                )
            }
            Ok(Err(e)) => tracing::warn!(
                "cluster {}: revoking lease {lease:x}: {}; the node leaves the plan when it \
                 expires ({}s)",
                self.cfg.name,
                describe(&e),
                self.cfg.ttl.as_secs()
            ),
            Err(_) => tracing::warn!(
                "cluster {}: revoking lease {lease:x}: etcd did not answer; the node leaves \
                 the plan when it expires ({}s)",
                self.cfg.name,
                self.cfg.ttl.as_secs()
            ),
        }
    }
}
