//! The etcd side shared by the agent and `cluster status`: key names,
//! connecting, the one-transaction snapshot, the plan rule and the
//! leader's guarded plan write.

use crate::report::NodeReport;
use anyhow::{anyhow, bail, Context, Result};
use espgate_api::cluster::PlanDoc;
use espgate_config::cluster::Cluster;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, SortOrder,
    SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// The keys of one cluster (`/espgate/NAME/...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// `/espgate/NAME/nodes/`: one report per node.
    pub nodes: String,
    /// `/espgate/NAME/leader`: the election's name (its keys are
    /// `leader/LEASE`).
    pub leader: String,
    /// `/espgate/NAME/plan`.
    pub plan: String,
    /// `/espgate/NAME/sas/`: the shared SAs, sealed under the cluster key.
    pub sas: String,
    /// `/espgate/NAME/ike/`: the leader's IKE SA states, one per
    /// connection, sealed under the cluster key.
    pub ike: String,
}

impl Keys {
    /// The keys of cluster `name`.
    pub fn new(name: &str) -> Keys {
        let base = format!("/espgate/{name}/");
        Keys {
            nodes: format!("{base}nodes/"),
            leader: format!("{base}leader"),
            plan: format!("{base}plan"),
            sas: format!("{base}sas/"),
            ike: format!("{base}ike/"),
        }
    }

    /// The key of the shared SA named `name` ([`SharedSa::name`](espgate_api::cluster::SharedSa::name)).
    pub fn sa(&self, name: &str) -> String {
        format!("{}{name}", self.sas)
    }

    /// The key of the IKE SA state of connection `conn`: `ike/` and the
    /// name with every byte other than an ASCII letter, digit, `-`, `_` or
    /// `.` written as `%XX` (so a `/` in a name makes no deeper key, and
    /// two names never share a key).
    pub fn ike(&self, conn: &str) -> String {
        let mut k = self.ike.clone();
        for b in conn.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                k.push(char::from(b));
            } else {
                k.push_str(&format!("%{b:02X}"));
            }
        }
        k
    }

    /// The report key of node `id`.
    pub fn node(&self, id: u16) -> String {
        format!("{}{id}", self.nodes)
    }

    /// The prefix of the election's keys.
    fn leader_prefix(&self) -> String {
        format!("{}/", self.leader)
    }
}

/// How to reach a cluster's etcd: endpoints and connect options (TLS,
/// password), read once from the files the configuration names.
#[derive(Clone)]
pub(crate) struct Endpoints {
    pub(crate) urls: Vec<String>,
    options: ConnectOptions,
    /// The endpoint to try first (the last one that answered).
    next: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Endpoints {
    /// From the `[cluster]` table; fails with the file or key at fault.
    pub(crate) fn new(c: &Cluster) -> Result<Endpoints> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            // HTTP/2 pings notice a dead etcd even while only the
            // campaign's or the watch's stream is open.
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        let https = c.etcd.iter().filter(|e| e.starts_with("https://")).count();
        if https > 0 && https != c.etcd.len() {
            bail!(
                "etcd endpoints {}: mix http:// and https://; use one scheme for all",
                c.etcd.join(", ")
            );
        }
        if https > 0 {
            let Some(ca) = &c.etcd_ca else {
                bail!(
                    "etcd endpoints {} are https:// but [cluster] has no etcd_ca: name the CA \
                     that signed the etcd servers' certificates (the system's roots are not used)",
                    c.etcd.join(", ")
                );
            };
            let pem = std::fs::read(ca).with_context(|| format!("etcd_ca {}", ca.display()))?;
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(pem));
            if let (Some(cert), Some(key)) = (&c.etcd_cert, &c.etcd_key) {
                let cert =
                    std::fs::read(cert).with_context(|| format!("etcd_cert {}", cert.display()))?;
                let key =
                    std::fs::read(key).with_context(|| format!("etcd_key {}", key.display()))?;
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            options = options.with_tls(tls);
        } else if c.etcd_ca.is_some() || c.etcd_cert.is_some() {
            bail!("etcd_ca/etcd_cert are set but the etcd endpoints are http://: use https://");
        }
        if let Some(user) = &c.etcd_user {
            let password = c
                .etcd_password()
                .context("reading etcd_password_file")?
                .ok_or_else(|| anyhow!("etcd_user is set but etcd_password_file is not"))?;
            options = options.with_user(user.clone(), password.as_str());
        }
        Ok(Endpoints {
            urls: c.etcd.clone(),
            options,
            next: Default::default(),
        })
    }

    /// The endpoints, for messages.
    pub(crate) fn list(&self) -> String {
        self.urls.join(", ")
    }

    /// A client of one endpoint that answers, tried in turn from the one
    /// that answered last. One endpoint per client, not etcd-client's
    /// balanced list: with a member down, the balanced channel kept
    /// sending some requests to it for seconds (longer than a lease), so
    /// one dead member of three took nodes out of the plan.
    pub(crate) async fn connect(&self) -> Result<Client> {
        let n = self.urls.len();
        let first = self.next.load(std::sync::atomic::Ordering::Relaxed) % n.max(1);
        let mut why = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let url = &self.urls[i];
            let tried = async {
                let mut c = Client::connect([url.as_str()], Some(self.options.clone())).await?;
                c.status().await?;
                Ok::<Client, etcd_client::Error>(c)
            };
            match tokio::time::timeout(Duration::from_secs(2), tried).await {
                Ok(Ok(c)) => {
                    self.next.store(i, std::sync::atomic::Ordering::Relaxed);
                    return Ok(c);
                }
                Ok(Err(e)) => why.push(format!("{url}: {}", describe(&e))),
                Err(_) => why.push(format!("{url}: no answer within 2s")),
            }
        }
        Err(anyhow!("connecting: {}", why.join("; ")))
    }
}

/// An etcd error in words (gRPC statuses by their message, transport
/// errors with their cause).
pub(crate) fn describe(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let (mut s, mut src) = match e {
        etcd_client::Error::GRpcStatus(st) => {
            (format!("{} ({:?})", st.message(), st.code()), st.source())
        }
        other => (other.to_string(), other.source()),
    };
    while let Some(cause) = src {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
        src = cause.source();
    }
    s
}

/// The cluster as one transaction read it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    /// The plan and its key's mod revision (0: no plan key).
    pub(crate) plan: Option<PlanDoc>,
    pub(crate) plan_rev: i64,
    /// A plan key whose value is not a plan.
    pub(crate) plan_error: Option<String>,
    /// The leader: node id, its election key and that key's create
    /// revision.
    pub(crate) leader: Option<Leader>,
    /// Every node with a report (a live lease).
    pub(crate) nodes: BTreeMap<u16, NodeReport>,
    /// Report keys that could not be read: (key, why).
    pub(crate) bad: Vec<(String, String)>,
    /// Every `sas/` entry as stored (sealed).
    pub(crate) sas: Vec<SealedEntry>,
    /// Every `ike/` entry as stored (sealed).
    pub(crate) ike: Vec<SealedEntry>,
}

/// One `sas/` or `ike/` entry as etcd holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SealedEntry {
    pub(crate) key: String,
    pub(crate) value: Vec<u8>,
    pub(crate) mod_rev: i64,
}

/// The elected leader as the snapshot shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leader {
    pub(crate) node: Option<u16>,
    pub(crate) key: Vec<u8>,
    pub(crate) create_rev: i64,
}

/// Reads `plan`, the leader, every report, every shared SA and every
/// IKE SA state in one transaction.
pub(crate) async fn snapshot(client: &mut Client, keys: &Keys) -> Result<Snapshot> {
    let leader_opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let txn = Txn::new().and_then([
        TxnOp::get(keys.plan.as_str(), None),
        TxnOp::get(keys.leader_prefix(), Some(leader_opts)),
        TxnOp::get(keys.nodes.as_str(), Some(GetOptions::new().with_prefix())),
        TxnOp::get(keys.sas.as_str(), Some(GetOptions::new().with_prefix())),
        TxnOp::get(keys.ike.as_str(), Some(GetOptions::new().with_prefix())),
    ]);
    let resp = client
        .txn(txn)
        .await
        .map_err(|e| anyhow!("reading the cluster's keys: {}", describe(&e)))?;
    let gets: Vec<_> = resp
        .op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        })
        .collect();
    let [plan, leader, nodes, sas, ike] = &gets[..] else {
        bail!(
            "etcd answered the cluster read with {} parts, not 5",
            gets.len()
        );
    };
    let mut snap = Snapshot::default();
    if let Some(kv) = plan.kvs().first() {
        snap.plan_rev = kv.mod_revision();
        match serde_json::from_slice::<PlanDoc>(kv.value()) {
            Ok(p) => snap.plan = Some(p),
            Err(e) => snap.plan_error = Some(format!("{}: not a plan: {e}", keys.plan)),
        }
    }
    if let Some(kv) = leader.kvs().first() {
        snap.leader = Some(Leader {
            node: std::str::from_utf8(kv.value())
                .ok()
                .and_then(|s| s.trim().parse().ok()),
            key: kv.key().to_vec(),
            create_rev: kv.create_revision(),
        });
    }
    for kv in nodes.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let id = key[keys.nodes.len().min(key.len())..].parse::<u16>();
        let parsed = serde_json::from_slice::<NodeReport>(kv.value());
        match (id, parsed) {
            (Ok(id), Ok(r)) if r.node == id => {
                snap.nodes.insert(id, r);
            }
            (Ok(id), Ok(r)) => snap
                .bad
                .push((key, format!("the report says node {}, not {id}", r.node))),
            (Err(_), _) => snap.bad.push((key, "not a node id".into())),
            (_, Err(e)) => snap.bad.push((key, format!("not a node report: {e}"))),
        }
    }
    let sealed = |r: &etcd_client::GetResponse| -> Vec<SealedEntry> {
        r.kvs()
            .iter()
            .map(|kv| SealedEntry {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: kv.value().to_vec(),
                mod_rev: kv.mod_revision(),
            })
            .collect()
    };
    snap.sas = sealed(sas);
    snap.ike = sealed(ike);
    Ok(snap)
}

/// May this reported node be in the plan? Its daemon answered as a
/// cluster node and says every SA is in step.
pub fn eligible(r: &NodeReport) -> bool {
    r.daemon && r.in_step
}

/// The plan's members for these live nodes: the eligible ones, by id.
pub fn plan_members<'a>(nodes: impl IntoIterator<Item = &'a NodeReport>) -> Vec<u16> {
    let mut m: Vec<u16> = nodes
        .into_iter()
        .filter(|r| eligible(r))
        .map(|r| r.node)
        .collect();
    m.sort_unstable();
    m.dedup();
    m
}

/// The plan the leader should write, if any: `None` when `snap`'s plan
/// already has exactly the eligible members.
pub(crate) fn next_plan(snap: &Snapshot) -> Option<PlanDoc> {
    let members = plan_members(snap.nodes.values());
    match &snap.plan {
        Some(p) if p.members == members => None,
        Some(p) => Some(PlanDoc {
            epoch: p.epoch + 1,
            members,
        }),
        // No plan yet (or a plan key that is not a plan): epoch 1.
        None => Some(PlanDoc { epoch: 1, members }),
    }
}

/// Writes `plan` if the plan key is still at `snap`'s revision and the
/// leader's election key (`leader`) still exists as created: true when
/// written.
pub(crate) async fn write_plan(
    client: &mut Client,
    keys: &Keys,
    snap: &Snapshot,
    leader: &Leader,
    plan: &PlanDoc,
) -> Result<bool> {
    let value = serde_json::to_vec(plan).context("encoding the plan")?;
    let txn = Txn::new()
        .when([
            Compare::mod_revision(keys.plan.as_str(), CompareOp::Equal, snap.plan_rev),
            Compare::create_revision(leader.key.clone(), CompareOp::Equal, leader.create_rev),
        ])
        .and_then([TxnOp::put(keys.plan.as_str(), value, None)]);
    let resp = client
        .txn(txn)
        .await
        .map_err(|e| anyhow!("writing the plan: {}", describe(&e)))?;
    Ok(resp.succeeded())
}

/// One change of a `sas/` or `ike/` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SealedWrite {
    /// Put this (sealed) value at this key.
    Put(String, Vec<u8>),
    /// Delete this key.
    Delete(String),
}

/// The most operations in one transaction (etcd's default limit is 128).
const MAX_TXN_OPS: usize = 100;

/// Writes `changes` while `leader`'s election key still exists as created
/// (as [`write_plan`] does, so that a deposed leader cannot write): true
/// when all were written. More than [`MAX_TXN_OPS`] changes go in several
/// transactions, each guarded the same way.
pub(crate) async fn write_sealed(
    client: &mut Client,
    leader: &Leader,
    changes: &[SealedWrite],
) -> Result<bool> {
    for chunk in changes.chunks(MAX_TXN_OPS) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|c| match c {
                SealedWrite::Put(k, v) => TxnOp::put(k.as_str(), v.clone(), None),
                SealedWrite::Delete(k) => TxnOp::delete(k.as_str(), None),
            })
            .collect();
        let txn = Txn::new()
            .when([Compare::create_revision(
                leader.key.clone(),
                CompareOp::Equal,
                leader.create_rev,
            )])
            .and_then(ops);
        let resp = client
            .txn(txn)
            .await
            .map_err(|e| anyhow!("writing the shared SAs and IKE states: {}", describe(&e)))?;
        if !resp.succeeded() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(node: u16, in_step: bool) -> NodeReport {
        NodeReport {
            node,
            state: "standby".into(),
            daemon: true,
            in_step,
            sas: Vec::new(),
            ready: Vec::new(),
        }
    }

    #[test]
    fn keys_live_under_the_cluster_name() {
        let k = Keys::new("gw");
        assert_eq!(k.node(3), "/espgate/gw/nodes/3");
        assert_eq!(k.leader_prefix(), "/espgate/gw/leader/");
        assert_eq!(k.plan, "/espgate/gw/plan");
        assert_eq!(k.sa("0x0000c0de-out"), "/espgate/gw/sas/0x0000c0de-out");
        assert_eq!(k.ike, "/espgate/gw/ike/");
    }

    #[test]
    fn an_ike_key_per_connection_with_odd_bytes_escaped() {
        let k = Keys::new("gw");
        assert_eq!(k.ike("site-1_a.b"), "/espgate/gw/ike/site-1_a.b");
        // A slash makes no deeper key; a percent is escaped too, so an
        // escaped name never equals another name's key.
        assert_eq!(k.ike("a/b"), "/espgate/gw/ike/a%2Fb");
        assert_eq!(k.ike("a%2Fb"), "/espgate/gw/ike/a%252Fb");
        assert_ne!(k.ike("a/b"), k.ike("a%2Fb"));
        assert_eq!(k.ike("x y"), "/espgate/gw/ike/x%20y");
        assert_eq!(k.ike("café"), "/espgate/gw/ike/caf%C3%A9");
        for name in ["a/b", "../x", "a b", "", "ü/"] {
            let key = k.ike(name);
            assert!(key.starts_with(&k.ike), "{key}");
            assert!(!key[k.ike.len()..].contains('/'), "{key}");
        }
        // Not under sas/, nodes/ or plan: their watches and reads never
        // see it.
        for other in [&k.sas, &k.nodes, &k.plan] {
            assert!(!k.ike("site").starts_with(other.as_str()));
        }
    }

    #[test]
    fn the_plan_holds_the_in_step_nodes_by_id() {
        let mut down = report(9, true);
        down.daemon = false;
        let nodes = [report(3, true), report(1, true), report(2, false), down];
        assert_eq!(plan_members(&nodes), [1, 3]);
    }

    #[test]
    fn a_new_plan_only_when_the_members_change() {
        let mut snap = Snapshot::default();
        snap.nodes.insert(2, report(2, true));
        snap.nodes.insert(1, report(1, true));
        assert_eq!(
            next_plan(&snap),
            Some(PlanDoc {
                epoch: 1,
                members: vec![1, 2]
            })
        );
        snap.plan = Some(PlanDoc {
            epoch: 4,
            members: vec![1, 2],
        });
        snap.plan_rev = 10;
        assert_eq!(next_plan(&snap), None);
        snap.nodes.insert(2, report(2, false));
        assert_eq!(
            next_plan(&snap),
            Some(PlanDoc {
                epoch: 5,
                members: vec![1]
            })
        );
    }
}
