//! The status document (`espgate status`, `sa list`, the metrics), built on
//! the control thread from what the workers publish: their counters and SA
//! directories ([`WorkerStats`]), read without locking an engine.

use espgate_api::costs::CostsReport;
use espgate_api::ike::IkeDoc;
use espgate_api::status::{
    ConnectionStatus, Left, LifetimeStatus, SaStatus, SelectorSetStatus, Status, TunStatus,
};
use espgate_core::gateway::{ConnSpec, SaEntry, WorkerStats};
use espgate_core::sa::{Encap, Mode, Protocol};
use espgate_core::stats::LifeState;
use espgate_core::DropReason;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Static facts shown by `espgate status`.
#[derive(Debug, Clone)]
pub struct Info {
    /// The configuration file.
    pub config: String,
    /// TUN name and MTU.
    pub tun: TunStatus,
    /// `gateway.encap`.
    pub encap: String,
    /// The UDP listen address, when open.
    pub listen: Option<SocketAddr>,
    /// `gateway.fwmark`.
    pub fwmark: Option<u32>,
    /// `gateway.state_dir`.
    pub state_dir: String,
    /// Offloads in use.
    pub offloads: Vec<String>,
    /// `[cluster]`'s name, on a cluster node.
    pub cluster: Option<String>,
}

/// What `espgate status` shows of a connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    name: String,
    mode: Mode,
    layers: &'static str,
    udp: bool,
    local: String,
    remote: String,
    remote_addr: IpAddr,
    local_ts: Vec<String>,
    remote_ts: Vec<String>,
    more_ts: Vec<SelectorSetStatus>,
}

impl ConnInfo {
    /// The status facts of `c` (no keys).
    pub fn of(c: &ConnSpec) -> ConnInfo {
        ConnInfo {
            name: c.name.clone(),
            mode: c.mode,
            layers: c.layers.name(),
            udp: c.udp,
            local: c.local.to_string(),
            remote: if c.udp {
                SocketAddr::new(c.remote, c.remote_port).to_string()
            } else {
                c.remote.to_string()
            },
            remote_addr: c.remote,
            local_ts: c.local_ts.iter().map(ToString::to_string).collect(),
            remote_ts: c.remote_ts.iter().map(ToString::to_string).collect(),
            more_ts: c
                .more_ts
                .iter()
                .map(|(l, r)| SelectorSetStatus {
                    local_ts: l.iter().map(ToString::to_string).collect(),
                    remote_ts: r.iter().map(ToString::to_string).collect(),
                })
                .collect(),
        }
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Tunnel => "tunnel",
        Mode::Transport => "transport",
    }
}

/// One SA's line in the status document, from worker `entry`'s counters.
fn sa_status(conn: &str, e: &SaEntry, now: Duration) -> SaStatus {
    let c = &e.counters;
    let (bytes, packets) = (c.bytes.get(), c.packets.get());
    let age = now.saturating_sub(e.created);
    let l = e.limits;
    let left = |b: Option<u64>, p: Option<u64>, t: Option<Duration>| Left {
        bytes: b.map(|b| b.saturating_sub(bytes)),
        packets: p.map(|p| p.saturating_sub(packets)),
        secs: t.map(|t| t.saturating_sub(age).as_secs()),
    };
    let soft_reached = l.soft_bytes.is_some_and(|b| bytes >= b)
        || l.soft_packets.is_some_and(|p| packets >= p)
        || l.soft_time.is_some_and(|t| age >= t);
    let state = match c.life() {
        LifeState::HardExpired => LifeState::HardExpired,
        _ if soft_reached => LifeState::SoftExpired,
        s => s,
    };
    SaStatus {
        connection: conn.to_string(),
        direction: if e.outbound { "out" } else { "in" }.into(),
        added: e.added,
        spi: format!("{:#010x}", e.spi),
        protocol: e.protocol.name().into(),
        suite: e.suite.name(),
        mode: mode_name(e.mode).into(),
        encap: match e.encap {
            Encap::None => "none",
            Encap::Udp { .. } => "udp",
        }
        .into(),
        udp_ports: match e.encap {
            Encap::None => None,
            Encap::Udp { src_port, dst_port } => Some((src_port, dst_port)),
        },
        // Set by the caller, who knows the connection's remote.
        peer: None,
        esn: e.esn,
        packets,
        bytes,
        dummies: c.dummies.get(),
        drops: DropReason::PER_SA
            .iter()
            .map(|d| (d.as_str().to_string(), c.drops.get(*d)))
            .filter(|(_, n)| *n > 0)
            .collect(),
        next_seq: e.outbound.then(|| e.next_seq()),
        seq_reserved: if e.outbound { e.seq_limit() } else { None },
        seq_reserve_failed: e.seq_reserve_failures(),
        highest_seq: (!e.outbound).then(|| c.replay_top.get()),
        lifetime: LifetimeStatus {
            state: state.as_str().into(),
            soft_left: left(l.soft_bytes, l.soft_packets, l.soft_time),
            hard_left: left(l.hard_bytes, l.hard_packets, l.hard_time),
        },
    }
}

/// Every connection with its SAs over all workers: the copies of an SA in
/// several workers are one line, their packets, bytes, dummies and drops
/// summed, the highest sequence number the largest; lifetimes and next
/// sequence numbers are the first copy's (the copies share counters).
pub fn connections(
    conns: &[ConnInfo],
    workers: &[Arc<WorkerStats>],
    now: Duration,
) -> Vec<ConnectionStatus> {
    let mut out: Vec<ConnectionStatus> = conns
        .iter()
        .map(|c| ConnectionStatus {
            name: c.name.clone(),
            mode: mode_name(c.mode).into(),
            protocol: c.layers.into(),
            encap: if c.udp { "udp" } else { "none" }.into(),
            local: c.local.clone(),
            remote: c.remote.clone(),
            local_ts: c.local_ts.clone(),
            remote_ts: c.remote_ts.clone(),
            more_ts: c.more_ts.clone(),
            sas: Vec::new(),
        })
        .collect();
    let mut seen: BTreeMap<(usize, bool, Protocol, u32), usize> = BTreeMap::new();
    for w in workers {
        for e in w.sas().iter() {
            let Some(c) = out.get_mut(e.conn) else {
                continue;
            };
            let key = (e.conn, e.outbound, e.protocol, e.spi);
            let mut line = sa_status(&c.name, e, now);
            let remote = conns.get(e.conn).map(|c| c.remote_addr);
            line.peer = e.peer.filter(|p| Some(*p) != remote).map(|p| p.to_string());
            match seen.get(&key) {
                Some(&i) => {
                    let s = &mut c.sas[i];
                    s.packets += line.packets;
                    s.bytes += line.bytes;
                    s.dummies += line.dummies;
                    for (k, v) in line.drops {
                        *s.drops.entry(k).or_insert(0) += v;
                    }
                    s.highest_seq = s.highest_seq.max(line.highest_seq);
                }
                None => {
                    seen.insert(key, c.sas.len());
                    c.sas.push(line);
                }
            }
        }
    }
    // Inbound, then outbound, as each worker lists them.
    for c in &mut out {
        c.sas.sort_by_key(|s| s.direction == "out");
        // An IKE connection's one layer is ESP or Q-ESP as negotiated: it
        // is what its outbound SA is (the configuration said ESP).
        if matches!(c.protocol.as_str(), "esp" | "qesp") {
            if let Some(sa) = c
                .sas
                .iter()
                .find(|s| s.direction == "out" && matches!(s.protocol.as_str(), "esp" | "qesp"))
            {
                c.protocol.clone_from(&sa.protocol);
            }
        }
    }
    out
}

/// The whole status document.
pub fn document(
    info: &Info,
    conns: &[ConnInfo],
    workers: &[Arc<WorkerStats>],
    now: Duration,
    costs: Option<CostsReport>,
    ike: Option<IkeDoc>,
) -> Status {
    let mut drops: BTreeMap<String, u64> = BTreeMap::new();
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    let mut per_worker = Vec::new();
    for w in workers {
        let c = &w.counters;
        for (d, n) in c.drops.all() {
            if n > 0 {
                *drops.entry(d.as_str().to_string()).or_insert(0) += n;
            }
        }
        for (k, v) in c.named() {
            *counters.entry(k.to_string()).or_insert(0) += v;
        }
        let mut mine: BTreeMap<String, u64> =
            [("tun_rx", c.tun_rx.get()), ("net_rx", c.net_rx.get())]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
        // What this worker sent on each outbound SA (its own copy's
        // count): with per-CPU SAs each worker shows its own SA.
        for e in w.sas().iter() {
            let n = e.counters.packets.get();
            if e.outbound && n > 0 {
                mine.insert(format!("out_sa_{:#010x}", e.spi), n);
            }
        }
        per_worker.push(mine);
    }
    // A process-wide count, not a per-worker one.
    counters.insert("hot_path_allocs".into(), crate::alloc_count::hot_allocs());
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        uptime_secs: now.as_secs(),
        config: info.config.clone(),
        tun: info.tun.clone(),
        encap: info.encap.clone(),
        listen: info.listen.map(|l| l.to_string()),
        fwmark: info.fwmark,
        workers: workers.len(),
        per_worker: if workers.len() > 1 {
            per_worker
        } else {
            Vec::new()
        },
        offloads: info.offloads.clone(),
        state_dir: info.state_dir.clone(),
        connections: connections(conns, workers, now),
        drops,
        counters,
        costs,
        ike,
        cluster: None,
    }
}
