//! The IKEv2 driver: the sans-IO engine (`espgate_ike`) run by the control
//! thread. IKE arrives on UDP 500 (its own socket) and on the NAT-T port
//! behind the four-byte non-ESP marker (the data-plane workers read that
//! socket and hand those datagrams over a queue); negotiated child SAs are
//! installed into every worker's engine as they come.

use super::shared::SharedSas;
use crate::ratelimit::RateLimiter;
use crate::sockets::UdpSock;
use crate::spifilter::SpiFilter;
use crate::sys::RecvBatch;
use crate::worker::lock;
use crate::worker::EngineLock;
use anyhow::{Context, Result};
use espgate_api::cluster::SharedIke;
use espgate_api::control::secret_json;
use espgate_api::ike::{ChildSaStatus, IkeDoc, IkeOpCost, IkeSaStatus};
use espgate_config::LoadedConfig;
use espgate_core::gateway::WorkerStats;
use espgate_core::gateway::{
    del_sa_all, install_negotiated_all, set_peer_all, Engine, NegotiatedSa,
};
use espgate_core::selector::TrafficSelector;
use espgate_ike::engine::IkeSnapshot;
use espgate_ike::engine::{CommandError, Event, Ike, IkeOp, IkeStatus, Level, Ports};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// The IKE side of the daemon.
pub struct IkeDriver {
    ike: Ike,
    /// UDP 500.
    sock: UdpSock,
    /// The data plane's NAT-T socket, to send IKE on port 4500 from.
    nat_t: Option<Arc<UdpSock>>,
    ports: Ports,
    /// Connections to initiate once the loop runs (`start_action = "start"`).
    to_start: Vec<String>,
    /// Receive buffers for UDP 500: many datagrams per `recvmmsg`, so a
    /// flood costs one system call per batch rather than one per request.
    rx: RecvBatch,
    /// Log lines by their first words: when each was last written and how
    /// many were suppressed since (a flood of IKE_SA_INIT from a spoofed
    /// peer address must not flood the log).
    log_limit: RateLimiter<String>,
    /// On a cluster node: whether it leads, and the SAs it shares.
    cluster: Option<ClusterIke>,
    /// Inbound packets per inbound SPI over all workers at the last look
    /// ([`IkeDriver::note_traffic`]).
    inbound_seen: HashMap<u32, u64>,
    /// When to look again.
    next_look: Duration,
    /// The data plane's kernel-side SPI filter, refreshed after SA
    /// installs and before the answer that lets the peer use them.
    spi_filter: Option<Arc<SpiFilter>>,
}

/// The IKE side of a cluster node: only the leader runs IKE (the others
/// see the same datagrams on the shared segment and leave them).
#[derive(Debug)]
pub struct ClusterIke {
    /// This node leads: its IKE runs.
    active: bool,
    /// The SAs it shares with the other nodes.
    pub shared: SharedSas,
    /// IKE datagrams left because another node leads.
    ignored: u64,
    /// The leader's IKE SAs as etcd last held them (from the agent): what
    /// this node continues if it becomes the leader.
    seen: Vec<SharedIke>,
}

/// One log line per kind (its first 48 bytes) per second.
const LOG_PERIOD: Duration = Duration::from_secs(1);

/// Datagrams per `recvmmsg` on UDP 500.
const IKE_RECV_SLOTS: usize = 16;

/// Datagrams read from UDP 500 per wake-up before the engine's answers go
/// out and the other tasks of the control thread get their turn.
const IKE_RECV_PER_WAKE: usize = 256;

/// How often the data plane's inbound counters are read for liveness.
pub const TRAFFIC_LOOK: Duration = Duration::from_secs(1);

/// Monotonic nanoseconds for the engine's cost accounting.
/// The most data-plane selectors one negotiated child SA may need (its
/// ranges split into prefixes, local × remote); beyond it the configured
/// selector set it belongs to is used and a warning says so.
const MAX_CHILD_SELECTORS: usize = 256;

/// The data plane's selectors for a negotiated SA: its negotiated ones as
/// prefixes. When they need more than [`MAX_CHILD_SELECTORS`] policies,
/// the configured selector set they lie in (not the whole connection's,
/// which on a connection with several sets would take the other sets'
/// traffic); empty (the connection's) only if that too is beyond it.
fn data_plane_selectors(s: &espgate_ike::engine::SaInstall) -> Vec<TrafficSelector> {
    use espgate_ike::ts::to_selectors;
    if let Some(v) = to_selectors(&s.local_ts, &s.remote_ts, MAX_CHILD_SELECTORS) {
        return v;
    }
    let set = to_selectors(&s.set_ts.0, &s.set_ts.1, MAX_CHILD_SELECTORS).filter(|v| !v.is_empty());
    tracing::warn!(
        "ike: connection \"{}\": SA {:#010x}'s negotiated selectors need more than \
         {MAX_CHILD_SELECTORS} prefix pairs; the data plane uses {} for it",
        s.conn,
        s.spi,
        if set.is_some() {
            "the configured selector set they lie in"
        } else {
            "the connection's configured selectors"
        }
    );
    set.unwrap_or_default()
}

fn mono_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

fn secs_until(t: Option<Duration>, now: Duration) -> Option<u64> {
    t.map(|t| t.saturating_sub(now).as_secs())
}

/// Costs as rows.
pub fn cost_rows(c: &espgate_ike::engine::IkeCosts) -> Vec<IkeOpCost> {
    IkeOp::ALL
        .iter()
        .filter_map(|op| {
            c.ops.get(op).map(|(n, ns)| IkeOpCost {
                op: op.name().to_string(),
                count: *n,
                micros: *ns as f64 / 1000.0,
            })
        })
        .collect()
}

/// An IKE SA's snapshot as [`SharedIke::state`]: its JSON, keys
/// included, in hex. Every buffer is allocated once at its final size and
/// wiped (`serde_json::to_string` grows its buffer and frees the old
/// allocations with parts of the keys in them); [`SharedIke`] wipes the
/// result. Hex, not the JSON text itself: the state travels inside other
/// JSON (control lines, etcd values), where JSON text would be an escaped
/// string, and serde_json unescapes into a scratch buffer that it grows
/// and frees unwiped. A hex string has nothing to unescape, so the parsers
/// copy it straight into a string of its size.
fn snapshot_state(snap: &IkeSnapshot) -> serde_json::Result<String> {
    let json = secret_json(|w| serde_json::to_writer(w, snap), 0)?;
    let mut out = vec![0u8; json.len() * 2];
    hex::encode_to_slice(&*json, &mut out).map_err(serde::ser::Error::custom)?;
    // Hex digits are ASCII; the bytes move into the string.
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// The snapshot in a [`snapshot_state`] string.
fn parse_state(state: &str) -> Result<IkeSnapshot, String> {
    let mut json = Zeroizing::new(vec![0u8; state.len() / 2]);
    hex::decode_to_slice(state, &mut json[..]).map_err(|e| format!("it is not hex: {e}"))?;
    serde_json::from_slice(&json).map_err(|e| format!("its state does not parse: {e}"))
}

impl IkeDriver {
    /// The IKE side for `cfg`'s IKE connections (`None` when it has none).
    /// Binds UDP 500 on the listen address of `gateway.listen`, marked like
    /// the data plane's sockets.
    pub fn open(cfg: &LoadedConfig, nat_t: Option<Arc<UdpSock>>) -> Result<Option<IkeDriver>> {
        let conns: Vec<_> = cfg
            .connections
            .iter()
            .filter_map(espgate_config::Connection::ike_config)
            .collect();
        if conns.is_empty() {
            return Ok(None);
        }
        let g = &cfg.gateway;
        let nat_t_port = nat_t.as_ref().map_or(g.listen.port(), |u| u.local.port());
        let addr = SocketAddr::new(g.listen.ip(), 500);
        let sock = UdpSock::open(addr, g.fwmark, false)
            .with_context(|| format!("opening the IKE socket on {addr}"))?;
        let ports = Ports {
            ike: 500,
            nat_t: nat_t_port,
        };
        let to_start = cfg
            .connections
            .iter()
            .filter(|c| c.start_on_boot())
            .map(|c| c.name.clone())
            .collect();
        let mut ike = Ike::new(conns, ports);
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        ike.set_unix_time_at_epoch(unix);
        ike.set_cost_clock(Some(mono_ns));
        ike.set_fragment_size(g.ike_fragment_size);
        ike.set_cookie_threshold(g.ike_cookie_threshold);
        ike.set_half_open_limit(g.ike_half_open_limit);
        // ESP-in-UDP reaches worker `spi % workers` (the SO_REUSEPORT
        // program): per-CPU child SAs get SPIs that spread over them.
        ike.set_spi_steering(g.workers);
        tracing::info!(
            "IKEv2 on {addr} and port {nat_t_port} (NAT-T): {} connection(s)",
            ike.conns().len()
        );
        Ok(Some(IkeDriver {
            ike,
            sock,
            nat_t,
            ports,
            to_start,
            rx: RecvBatch::new(IKE_RECV_SLOTS, 65536),
            log_limit: RateLimiter::new(LOG_PERIOD),
            cluster: cfg.cluster.as_ref().map(|c| ClusterIke {
                active: false,
                shared: SharedSas::new(c.node),
                ignored: 0,
                seen: Vec::new(),
            }),
            inbound_seen: HashMap::new(),
            next_look: Duration::ZERO,
            spi_filter: None,
        }))
    }

    /// Refreshes `f` after SA installs, before the answers go out.
    pub fn set_spi_filter(&mut self, f: Arc<SpiFilter>) {
        self.spi_filter = Some(f);
    }

    /// The UDP 500 socket (for the control thread's readiness wait).
    pub fn socket(&self) -> &UdpSock {
        &self.sock
    }

    /// A cluster node that does not lead: its IKE waits.
    fn passive(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| !c.active)
    }

    /// The cluster side (`None`: not a cluster node).
    pub fn cluster(&mut self) -> Option<&mut ClusterIke> {
        self.cluster.as_mut()
    }

    /// The cluster agent named the leader: IKE runs here only while this
    /// node leads. A node that takes over continues the previous leader's
    /// IKE SAs from their state in etcd, and re-establishes the other
    /// connections whose SAs it installed from etcd (docs/CLUSTER.md §8).
    /// True when IKE has work now.
    pub fn set_leader(&mut self, leader: Option<u16>, now: Duration) -> bool {
        let Some(c) = self.cluster.as_mut() else {
            return false;
        };
        let me = c.shared.node();
        let lead = leader == Some(me);
        if lead == c.active {
            return false;
        }
        c.active = lead;
        if !lead {
            tracing::warn!(
                "cluster: node {me} no longer leads ({}): its IKE stops answering; the \
                 leader's IKE runs the tunnels",
                leader.map_or("no leader".to_string(), |l| format!("node {l} leads"))
            );
            return false;
        }
        let mut again = c.shared.imported_conns();
        let seen = std::mem::take(&mut c.seen);
        // Continue the previous leader's IKE SAs where their state is in
        // etcd; negotiate anew for the others.
        let mut continued = Vec::new();
        for s in seen.iter().filter(|s| s.owner != me) {
            let r = parse_state(&s.state)
                .and_then(|snap| self.ike.import(now, &snap).map_err(|e| e.to_string()));
            match r {
                Ok(()) => continued.push(s.conn.clone()),
                Err(e) => tracing::warn!(
                    "cluster: connection \"{}\": the previous leader's IKE SA cannot be \
                     continued ({e}); negotiating a new one",
                    s.conn
                ),
            }
        }
        again.retain(|n| !continued.contains(n));
        self.to_start.retain(|n| !continued.contains(n));
        tracing::info!(
            "cluster: node {me} leads: IKE runs here{}{}",
            if continued.is_empty() {
                String::new()
            } else {
                format!(
                    "; continuing the previous leader's IKE SA of {}",
                    continued.join(", ")
                )
            },
            if again.is_empty() {
                String::new()
            } else {
                format!(
                    "; re-establishing {} (their SAs came from the previous leader)",
                    again.join(", ")
                )
            }
        );
        for name in again {
            if !self.to_start.contains(&name) {
                self.to_start.push(name);
            }
        }
        self.start(now);
        true
    }

    /// The leader's IKE SAs as etcd holds them (the agent's update).
    pub fn seen_ike(&mut self, list: Vec<SharedIke>) {
        if let Some(c) = self.cluster.as_mut() {
            c.seen = list;
        }
    }

    /// What the leader's agent publishes of this node's IKE: the IKE SAs'
    /// state (none unless this node leads) and a generation that grows
    /// when it changes.
    pub fn export_ike(&self, now: Duration) -> (u64, Vec<SharedIke>) {
        let Some(c) = self.cluster.as_ref().filter(|c| c.active) else {
            return (0, Vec::new());
        };
        let me = c.shared.node();
        let list = self
            .ike
            .export(now)
            .into_iter()
            .filter_map(|snap| match snapshot_state(&snap) {
                Ok(state) => Some(SharedIke {
                    conn: snap.conn.clone(),
                    owner: me,
                    state,
                }),
                Err(e) => {
                    tracing::warn!("cluster: encoding the IKE SA of \"{}\": {e}", snap.conn);
                    None
                }
            })
            .collect();
        (self.ike.export_generation(), list)
    }

    /// Initiates the `start_action = "start"` connections (once).
    pub fn start(&mut self, now: Duration) {
        if self.passive() {
            return;
        }
        for name in std::mem::take(&mut self.to_start) {
            if let Err(e) = self.ike.initiate(now, &name) {
                tracing::warn!("ike: {e}");
            }
        }
    }

    /// Reads up to `IKE_RECV_PER_WAKE` waiting datagrams on UDP 500, many
    /// per `recvmmsg`; false when the socket has no more (`WouldBlock`).
    pub fn on_readable(&mut self, now: Duration) -> bool {
        let mut read = 0;
        while read < IKE_RECV_PER_WAKE {
            let n = match self.rx.recv(self.sock.as_fd()) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("ike: receive: {e}");
                    return false;
                }
            };
            read += n;
            if self.passive() {
                if let Some(c) = self.cluster.as_mut() {
                    c.ignored += n as u64;
                }
                continue;
            }
            for i in 0..n {
                // `None`: longer than 64 KiB, which UDP cannot carry.
                let Some((data, meta)) = self.rx.get(i) else {
                    continue;
                };
                let Some(src) = meta.src else { continue };
                let src = SocketAddr::new(src.ip().to_canonical(), src.port());
                let dst = SocketAddr::new(
                    meta.dst.map_or(self.sock.local.ip(), |d| d.to_canonical()),
                    self.ports.ike,
                );
                self.ike.handle(now, dst, src, data);
            }
        }
        true
    }

    /// An IKE message from the NAT-T socket (non-ESP marker removed).
    pub fn handle(&mut self, now: Duration, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        if self.passive() {
            if let Some(c) = self.cluster.as_mut() {
                c.ignored += 1;
            }
            return;
        }
        self.ike.handle(now, local, remote, data);
    }

    /// Tells the IKE engine which child SAs received packets since the
    /// last look (at most once a second, and always before a due timer
    /// runs): inbound ESP proves the peer alive, so no liveness check goes
    /// out while it keeps coming (RFC 7296 §2.4). Reads the workers'
    /// counters without stopping them.
    pub fn note_traffic(&mut self, stats: &[Arc<WorkerStats>], now: Duration) {
        let due = self.ike.poll_timeout().is_some_and(|t| t <= now);
        if self.passive() || (!due && now < self.next_look) {
            return;
        }
        self.next_look = now + TRAFFIC_LOOK;
        let mut counts: HashMap<u32, u64> = HashMap::new();
        for s in stats {
            for e in s.sas().iter().filter(|e| !e.outbound) {
                *counts.entry(e.spi).or_default() += e.counters.packets.get();
            }
        }
        let active: Vec<u32> = counts
            .iter()
            .filter(|(spi, n)| self.inbound_seen.get(spi).map_or(**n > 0, |m| *n > m))
            .map(|(spi, _)| *spi)
            .collect();
        self.inbound_seen = counts;
        self.ike.traffic_received(now, &active);
    }

    /// Runs due timers, sends what the engine wants sent and applies its
    /// events to the data plane. `engines`: every worker's engine (worker 0
    /// first), locked only when the IKE engine has SA changes for them.
    pub fn pump(&mut self, engines: &[EngineLock], now: Duration) {
        if self.passive() {
            return;
        }
        if self.ike.poll_timeout().is_some_and(|t| t <= now) {
            self.ike.handle_timeout(now);
        }
        let mut sas_changed = false;
        while let Some(ev) = self.ike.poll_event() {
            match ev {
                Event::InstallSa(s) => {
                    sas_changed = true;
                    let selectors = data_plane_selectors(&s);
                    let sa = NegotiatedSa {
                        conn: &s.conn,
                        outbound: s.outbound,
                        protocol: s.protocol,
                        spi: s.spi,
                        suite: s.suite,
                        enc_key: &s.enc_key,
                        integ_key: &s.integ_key,
                        esn: s.esn,
                        encap: s.encap,
                        peer: Some(s.remote),
                        slot: s.slot,
                        selectors: &selectors,
                    };
                    let mut guards = lock_all(engines);
                    let mut refs: Vec<&mut Engine> = guards.iter_mut().map(|g| &mut **g).collect();
                    match install_negotiated_all(&mut refs, &sa, now) {
                        Ok(c) => {
                            if let (Some(cl), Some(e)) = (self.cluster.as_mut(), refs.first_mut()) {
                                cl.shared.negotiated(e, &sa, now);
                            }
                            tracing::info!("ike: {}", c.message);
                            for w in &c.warnings {
                                tracing::warn!("{w}");
                            }
                        }
                        Err(e) => tracing::error!(
                            "ike: connection \"{}\": installing SA {:#010x}: {e}",
                            s.conn,
                            s.spi
                        ),
                    }
                }
                Event::RemoveSa {
                    conn,
                    spi,
                    protocol,
                    outbound,
                } => {
                    // An inbound SA lives in one worker only: removed where found.
                    let mut guards = lock_all(engines);
                    let mut refs: Vec<&mut Engine> = guards.iter_mut().map(|g| &mut **g).collect();
                    match del_sa_all(&mut refs, spi, Some(protocol), Some(outbound), Some(&conn)) {
                        Ok(c) => tracing::info!("ike: {}", c.message),
                        Err(e) => tracing::debug!(
                            "ike: connection \"{conn}\": removing SA {spi:#010x}: {e}"
                        ),
                    }
                }
                Event::PeerMoved { conn, remote } => {
                    // RFC 7296 §2.23: ESP follows the peer's new NAT
                    // mapping, not only IKE; and RFC 4555 §3.5: its
                    // MOBIKE address update. (Raw ESP: the port is unused.)
                    let remote = SocketAddr::new(remote.ip().to_canonical(), remote.port());
                    let mut guards = lock_all(engines);
                    let mut refs: Vec<&mut Engine> = guards.iter_mut().map(|g| &mut **g).collect();
                    match set_peer_all(&mut refs, &conn, remote) {
                        Ok(n) => tracing::info!(
                            "ike: connection \"{conn}\": {n} outbound SA(s) now send ESP to \
                             {remote}"
                        ),
                        Err(e) => tracing::warn!("ike: {e}"),
                    }
                    if let Some(cl) = self.cluster.as_mut() {
                        // The other nodes follow through etcd.
                        cl.shared.peer_moved(&conn, remote);
                    }
                    // The kernel filter keeps each SA's peer address.
                    sas_changed = true;
                }
                Event::IkeUp { conn, algorithms } => {
                    tracing::debug!("ike: connection \"{conn}\" up ({algorithms})");
                }
                Event::IkeDown { conn, reason } => {
                    tracing::info!("ike: connection \"{conn}\" down: {reason}");
                }
                Event::Log {
                    level,
                    conn,
                    message,
                } => {
                    let c = conn
                        .map(|c| format!("connection \"{c}\": "))
                        .unwrap_or_default();
                    let Some(suppressed) = self.may_log(&c, &message, now) else {
                        continue;
                    };
                    let message = if suppressed > 0 {
                        format!("{message} ({suppressed} similar lines suppressed)")
                    } else {
                        message
                    };
                    match level {
                        Level::Warn => tracing::warn!("ike: {c}{message}"),
                        Level::Info => tracing::info!("ike: {c}{message}"),
                        Level::Debug => tracing::debug!("ike: {c}{message}"),
                    }
                }
            }
        }
        // Transmit after the installs: a peer that gets our answer may use
        // the new SAs at once, and the data plane must know them by then
        // (the workers run beside this thread), its SPI filter included.
        if sas_changed {
            if let Some(f) = &self.spi_filter {
                f.refresh(engines);
            }
        }
        while let Some(t) = self.ike.poll_transmit() {
            // From the address the peer sent to (or that the
            // connection names), not whichever the route prefers.
            let r = if t.local.port() == self.ports.ike {
                self.sock.send_from(&t.data, t.local.ip(), t.remote)
            } else if let Some(u) = &self.nat_t {
                let mut d = Vec::with_capacity(t.data.len() + 4);
                d.extend_from_slice(&[0; 4]);
                d.extend_from_slice(&t.data);
                u.send_from(&d, t.local.ip(), t.remote)
            } else {
                Err(std::io::Error::other(
                    "no NAT-T socket (gateway.encap is not udp)",
                ))
            };
            if let Err(e) = r {
                tracing::warn!("ike: sending to {}: {e}", t.remote);
            }
        }
    }

    /// Rate limit, per connection and kind of message
    /// ([`message_kind`]): `Some(suppressed since the last line)` if this
    /// line may be written now.
    fn may_log(&mut self, conn: &str, message: &str, now: Duration) -> Option<u64> {
        self.log_limit
            .check(format!("{conn}{}", message_kind(message)), now)
    }

    /// When the engine next needs [`IkeDriver::pump`] without input.
    pub fn next_timeout(&self) -> Option<Duration> {
        if self.passive() {
            return None;
        }
        self.ike.poll_timeout()
    }

    /// `espgate initiate NAME`.
    pub fn initiate(&mut self, now: Duration, name: &str) -> Result<String, CommandError> {
        self.ike.initiate(now, name)?;
        Ok(format!("connection \"{name}\": IKE_SA_INIT sent"))
    }

    /// `espgate terminate NAME`.
    pub fn terminate(&mut self, now: Duration, name: &str) -> Result<String, CommandError> {
        self.ike.terminate(now, name)?;
        Ok(format!("connection \"{name}\": deleting its IKE SA"))
    }

    /// IKE SAs for `espgate status`.
    pub fn status(&self, now: Duration) -> Vec<IkeSaStatus> {
        self.ike
            .status()
            .iter()
            .map(|s| sa_status(s, now))
            .collect()
    }

    /// Engine counters and global costs, for status and metrics.
    pub fn counters(&self) -> std::collections::BTreeMap<String, u64> {
        let mut m: std::collections::BTreeMap<String, u64> = self
            .ike
            .counters()
            .nonzero()
            .map(|(e, v)| (e.as_str().to_string(), v))
            .collect();
        if let Some(c) = self.cluster.as_ref().filter(|c| c.ignored > 0) {
            m.insert("not_leader".into(), c.ignored);
        }
        m
    }

    /// Global per-operation costs.
    pub fn costs(&self) -> Vec<IkeOpCost> {
        cost_rows(self.ike.costs())
    }

    /// The IKE part of the status document.
    pub fn doc(&self, now: Duration) -> IkeDoc {
        IkeDoc {
            sas: self.status(now),
            counters: self.counters(),
            costs: self.costs(),
        }
    }

    /// Clears the cost records.
    pub fn reset_costs(&mut self) {
        self.ike.reset_costs();
    }
}

/// The kind of a log message, for the rate limit: its first words, with
/// every word that holds a digit (an address, a port, an SPI, a count)
/// made one placeholder. A flood of IKE_SA_INIT from spoofed addresses so
/// writes one line a second, not one per address.
fn message_kind(message: &str) -> String {
    let mut kind = String::with_capacity(64);
    for w in message.split_whitespace() {
        if kind.len() >= 48 {
            break;
        }
        if w.bytes().any(|b| b.is_ascii_digit()) {
            kind.push('#');
        } else {
            kind.push_str(w);
        }
        kind.push(' ');
    }
    kind
}

fn sa_status(s: &IkeStatus, now: Duration) -> IkeSaStatus {
    IkeSaStatus {
        connection: s.conn.clone(),
        spis: format!("{:016x}_i {:016x}_r", s.spi_i, s.spi_r),
        state: s.state.to_string(),
        initiator: s.initiator,
        local: s.local.to_string(),
        remote: s.remote.to_string(),
        peer_id: s.peer_id.clone(),
        algorithms: s.algorithms.clone(),
        established_secs: s.established_at.map(|t| now.saturating_sub(t).as_secs()),
        rekey_in_secs: secs_until(s.rekey_at, now),
        nat: s.nat,
        mobike: s.mobike,
        costs: cost_rows(&s.costs),
        children: s
            .children
            .iter()
            .map(|c| ChildSaStatus {
                spi_in: format!("{:#010x}", c.spi_in),
                spi_out: format!("{:#010x}", c.spi_out),
                protocol: c.protocol.name().to_string(),
                state: c.state.to_string(),
                algorithms: c.algorithms.clone(),
                rekey_in_secs: secs_until(c.rekey_at, now),
                expire_in_secs: secs_until(c.expire_at, now),
                local_ts: c.local_ts.clone(),
                remote_ts: c.remote_ts.clone(),
                slot: c.slot,
            })
            .collect(),
    }
}

/// Every worker's engine, locked (worker 0 first).
pub fn lock_all(engines: &[EngineLock]) -> Vec<parking_lot::MutexGuard<'_, Engine>> {
    engines.iter().map(lock).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_that_differ_only_in_addresses_are_one_kind() {
        let a =
            message_kind("IKE_SA_INIT from 198.51.100.7:500: no connection has this peer address");
        let b = message_kind(
            "IKE_SA_INIT from 203.0.113.250:4500: no connection has this peer address",
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            message_kind("IKE_SA_INIT from 198.51.100.7:500: bad syntax")
        );
        assert_eq!(
            message_kind("SPI 0x00001001 unknown"),
            message_kind("SPI 0xdeadbeef unknown")
        );
        // A flood from 100,000 spoofed sources within one period: one line.
        let mut limit = RateLimiter::new(LOG_PERIOD);
        let written = (0..100_000u32)
            .filter(|i| {
                let m = format!(
                    "IKE_SA_INIT from 10.{}.{}.{}:500: no connection has this peer address",
                    i >> 16,
                    (i >> 8) & 255,
                    i & 255
                );
                limit
                    .check(message_kind(&m), Duration::from_millis(500))
                    .is_some()
            })
            .count();
        assert_eq!(written, 1);
    }
}
