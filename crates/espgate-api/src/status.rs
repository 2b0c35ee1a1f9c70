//! What `espgate status` and `espgate sa list` show: the JSON documents
//! the daemon answers with on its control socket, and their rendering as
//! text tables.

use crate::table::{Column, Table};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The daemon's state (`{"cmd":"status"}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// espgate version.
    pub version: String,
    /// Daemon process id.
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_secs: u64,
    /// The configuration file.
    pub config: String,
    /// The TUN device.
    pub tun: TunStatus,
    /// `gateway.encap` (connections may override it).
    pub encap: String,
    /// The UDP address ESP-in-UDP is received on, when a connection uses it.
    pub listen: Option<String>,
    /// Firewall mark on outer packets (also the routing table), if any.
    pub fwmark: Option<u32>,
    /// Data-plane threads running.
    pub workers: usize,
    /// With several workers: each worker's packets from the TUN
    /// (`tun_rx`) and from the network (`net_rx`), and what it sent on
    /// each outbound SA (`out_sa_0x…`, its own copy's count), worker 0
    /// first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_worker: Vec<BTreeMap<String, u64>>,
    /// Batching and offloads in use (`udp_gso`, `udp_gro`), as probed at
    /// start-up; an offload the kernel refused is absent.
    #[serde(default)]
    pub offloads: Vec<String>,
    /// Where the outbound sequence reservations are kept.
    pub state_dir: String,
    /// Per connection, in configuration order.
    pub connections: Vec<ConnectionStatus>,
    /// Packets dropped, by reason, over all SAs and both directions
    /// (non-zero counts only). Core reasons (`replay`, `icv_failure`, …)
    /// and the daemon's own (`no_policy`, `send_error`, …).
    pub drops: BTreeMap<String, u64>,
    /// Other counters: packets read from / written to the TUN and the
    /// network, NAT keepalives and IKE packets ignored, …
    pub counters: BTreeMap<String, u64>,
    /// IKEv2: IKE SAs with their children, counters and per-operation
    /// costs (only when a connection uses IKE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ike: Option<crate::ike::IkeDoc>,
    /// Per-stage costs, present only while cost accounting is on
    /// (`gateway.cost_accounting`, `espgate costs on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub costs: Option<crate::costs::CostsReport>,
    /// Seed 003's flat cluster, when this gateway is a cluster node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::ClusterStatus>,
}

/// The TUN device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunStatus {
    /// Interface name.
    pub name: String,
    /// Its MTU: the longest packet every outbound bundle keeps within
    /// `gateway.mtu`.
    pub mtu: u32,
}

impl Status {
    /// Adds the document of another worker's engine: its counters and
    /// drops are summed into these; per SA (by connection, direction,
    /// protocol and SPI) packets, bytes, dummies and drops are summed, and
    /// an SA only that worker holds (an inbound SA steered to it) is
    /// appended to its connection. Lifetimes and sequence numbers are this
    /// document's (the copies share their counters).
    pub fn merge_worker(&mut self, other: &Status) {
        fn add(into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>) {
            for (k, v) in from {
                *into.entry(k.clone()).or_insert(0) += v;
            }
        }
        add(&mut self.counters, &other.counters);
        add(&mut self.drops, &other.drops);
        for oc in &other.connections {
            let Some(c) = self.connections.iter_mut().find(|c| c.name == oc.name) else {
                self.connections.push(oc.clone());
                continue;
            };
            for osa in &oc.sas {
                let same = |s: &&mut SaStatus| {
                    s.direction == osa.direction && s.protocol == osa.protocol && s.spi == osa.spi
                };
                match c.sas.iter_mut().find(same) {
                    Some(s) => {
                        s.packets += osa.packets;
                        s.bytes += osa.bytes;
                        s.dummies += osa.dummies;
                        add(&mut s.drops, &osa.drops);
                        s.highest_seq = s.highest_seq.max(osa.highest_seq);
                    }
                    None => c.sas.push(osa.clone()),
                }
            }
        }
        if let (Some(c), Some(o)) = (&mut self.costs, &other.costs) {
            c.merge(o);
        } else if self.costs.is_none() {
            self.costs.clone_from(&other.costs);
        }
    }
}

/// One further selector set of a connection ([`ConnectionStatus::more_ts`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectorSetStatus {
    /// Our selectors.
    pub local_ts: Vec<String>,
    /// The peer's selectors.
    pub remote_ts: Vec<String>,
}

/// One `[[connection]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// Name.
    pub name: String,
    /// `tunnel` or `transport`.
    pub mode: String,
    /// `esp`, `ah` or `esp+ah`.
    pub protocol: String,
    /// `udp` or `none`.
    pub encap: String,
    /// Our outer address.
    pub local: String,
    /// The peer's outer address (with the port for UDP).
    pub remote: String,
    /// Our selectors.
    pub local_ts: Vec<String>,
    /// The peer's selectors.
    pub remote_ts: Vec<String>,
    /// Further selector sets of an IKE connection
    /// (`[[connection.ike.child]]`), each a child SA of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_ts: Vec<SelectorSetStatus>,
    /// Its SAs: inbound then outbound, each in bundle order.
    pub sas: Vec<SaStatus>,
}

/// One SA.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaStatus {
    /// The connection it belongs to.
    pub connection: String,
    /// `in` or `out`.
    pub direction: String,
    /// Installed at run time by `espgate sa add` (gone after a restart),
    /// not from the configuration file.
    #[serde(default)]
    pub added: bool,
    /// SPI in hex (`0x0000c0de`).
    pub spi: String,
    /// `esp`, `ah` or `qesp`.
    pub protocol: String,
    /// strongSwan keyword.
    pub suite: String,
    /// `tunnel` or `transport`.
    pub mode: String,
    /// `udp` or `none`.
    pub encap: String,
    /// ESP-in-UDP: the UDP source and destination ports of the SA's
    /// packets (outbound: ours, then the peer's, which IKE may have learnt
    /// from the peer's NAT; inbound: the peer's, then ours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_ports: Option<(u16, u16)>,
    /// The peer's address on this SA when it is not the connection's
    /// `remote`: IKE followed the peer to a NAT's new public address (RFC
    /// 7296 §2.23).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// 64-bit sequence numbers.
    pub esn: bool,
    /// Packets processed.
    pub packets: u64,
    /// Payload bytes processed.
    pub bytes: u64,
    /// Dummy packets received and discarded.
    pub dummies: u64,
    /// Drops by reason (non-zero only).
    pub drops: BTreeMap<String, u64>,
    /// Outbound: the next sequence number to send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_seq: Option<u64>,
    /// Outbound: numbers below this are reserved on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_reserved: Option<u64>,
    /// Outbound: failed attempts to write a larger reservation (a full or
    /// read-only state directory); the SA stops at `seq_reserved` and
    /// counts `seq_not_reserved` drops while they fail.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq_reserve_failed: u64,
    /// Inbound: the highest sequence number authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_seq: Option<u64>,
    /// Lifetime state and what is left.
    pub lifetime: LifetimeStatus,
}

/// Lifetime of an SA.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LifetimeStatus {
    /// `ok`, `soft_expired` or `hard_expired`.
    pub state: String,
    /// What is left before the soft limits (configured ones only).
    pub soft_left: Left,
    /// What is left before the hard limits (configured ones only).
    pub hard_left: Left,
}

/// Remaining bytes, packets, seconds; `None` where no limit is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Left {
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<u64>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs: Option<u64>,
}

impl Left {
    fn is_empty(&self) -> bool {
        self.bytes.is_none() && self.packets.is_none() && self.secs.is_none()
    }

    fn render(&self) -> String {
        let mut parts = Vec::new();
        if let Some(s) = self.secs {
            parts.push(duration(s));
        }
        if let Some(b) = self.bytes {
            parts.push(format!("{}B", si(b)));
        }
        if let Some(p) = self.packets {
            parts.push(format!("{}pkt", si(p)));
        }
        parts.join("/")
    }
}

/// `12s`, `5m3s`, `2h10m`, `3d4h`.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// 1024-based with K/M/G/T, one decimal below 10.
pub fn si(n: u64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        n.to_string()
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

fn counts(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn lifetime_cell(l: &LifetimeStatus) -> String {
    match l.state.as_str() {
        "hard_expired" => "EXPIRED".into(),
        state => {
            let left = if !l.hard_left.is_empty() {
                l.hard_left.render()
            } else if !l.soft_left.is_empty() && state != "soft_expired" {
                format!("soft {}", l.soft_left.render())
            } else {
                String::new()
            };
            match (state, left.is_empty()) {
                ("soft_expired", true) => "soft-expired".into(),
                ("soft_expired", false) => format!("soft-expired, {left}"),
                (_, true) => "-".into(),
                (_, false) => left,
            }
        }
    }
}

fn seq_cell(s: &SaStatus) -> String {
    match (s.next_seq, s.highest_seq) {
        (Some(n), _) => n.to_string(),
        (None, Some(h)) => h.to_string(),
        _ => "-".into(),
    }
}

const SA_HEADER: [&str; 10] = [
    "DIR", "SPI", "PROTO", "SUITE", "MODE", "PACKETS", "BYTES", "SEQ", "LIFETIME", "DROPS",
];

/// `tunnel/udp 4500>31000`: the mode, the encapsulation and, with UDP,
/// the ports of the SA's packets (source>destination), with the peer's
/// address on the peer's side when IKE moved it away from `remote`
/// (raw ESP: `tunnel/none >192.0.2.3`, `tunnel/none 192.0.2.3>`).
fn mode_cell(s: &SaStatus) -> String {
    let Some((src, dst)) = s.udp_ports else {
        return match (&s.peer, s.direction.as_str()) {
            (Some(p), "out") => format!("{}/{} >{p}", s.mode, s.encap),
            (Some(p), _) => format!("{}/{} {p}>", s.mode, s.encap),
            (None, _) => format!("{}/{}", s.mode, s.encap),
        };
    };
    let (src, dst) = match (&s.peer, s.direction.as_str()) {
        (Some(p), "out") => (src.to_string(), sock(p, dst)),
        (Some(p), _) => (sock(p, src), dst.to_string()),
        (None, _) => (src.to_string(), dst.to_string()),
    };
    format!("{}/{} {src}>{dst}", s.mode, s.encap)
}

/// `addr:port`, with brackets for IPv6.
fn sock(addr: &str, port: u16) -> String {
    if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

fn sa_row(s: &SaStatus, with_conn: bool) -> Vec<String> {
    let mut r = Vec::new();
    if with_conn {
        r.push(s.connection.clone());
    }
    r.extend([
        s.direction.clone(),
        if s.added {
            format!("{}+", s.spi)
        } else {
            s.spi.clone()
        },
        s.protocol.clone(),
        s.suite.clone(),
        mode_cell(s),
        s.packets.to_string(),
        si(s.bytes),
        seq_cell(s),
        lifetime_cell(&s.lifetime),
        counts(&s.drops),
    ]);
    r
}

/// The SAs as a table, left-aligned, each row starting with its
/// connection's name if `with_conn`.
fn sa_table(sas: &[SaStatus], with_conn: bool, indent: usize) -> String {
    let conn = with_conn.then_some("CONNECTION");
    let mut t = Table::new(conn.into_iter().chain(SA_HEADER).map(Column::left)).indent(indent);
    for sa in sas {
        t.row(sa_row(sa, with_conn));
    }
    t.render()
}

/// The text of `espgate status`.
pub fn render_status(s: &Status) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "espgate {} (pid {}), up {}, config {}",
        s.version,
        s.pid,
        duration(s.uptime_secs),
        s.config
    );
    let _ = write!(
        out,
        "TUN {} mtu {}, encap {}",
        s.tun.name, s.tun.mtu, s.encap
    );
    if let Some(l) = &s.listen {
        let _ = write!(out, ", listen {l}");
    }
    if let Some(m) = s.fwmark {
        let _ = write!(out, ", fwmark {m:#x}");
    }
    let _ = write!(out, ", {} worker thread(s)", s.workers);
    if s.offloads.is_empty() {
        let _ = writeln!(out, ", no offloads");
    } else {
        let _ = writeln!(out, ", offloads {}", s.offloads.join(" "));
    }
    for c in &s.connections {
        // IKE followed the peer away from `remote` (a NAT, MOBIKE).
        let now = c
            .sas
            .iter()
            .find(|sa| sa.direction == "out")
            .and_then(|sa| {
                let p = sa.peer.as_deref()?;
                Some(match sa.udp_ports {
                    Some((_, port)) => format!(" (now {})", sock(p, port)),
                    None => format!(" (now {p})"),
                })
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "\nconnection {}: {} {} over {}, {} -> {}{now}",
            c.name, c.mode, c.protocol, c.encap, c.local, c.remote
        );
        let _ = writeln!(
            out,
            "  {} <-> {}",
            c.local_ts.join(","),
            c.remote_ts.join(",")
        );
        for m in &c.more_ts {
            let _ = writeln!(
                out,
                "  {} <-> {}",
                m.local_ts.join(","),
                m.remote_ts.join(",")
            );
        }
        out.push_str(&sa_table(&c.sas, false, 2));
        let missing: Vec<&str> = c
            .protocol
            .split('+')
            .filter(|p| {
                !c.sas
                    .iter()
                    .any(|sa| sa.direction == "out" && sa.protocol == *p)
            })
            .collect();
        if !missing.is_empty() {
            let _ = writeln!(
                out,
                "  no outbound {} SA (not negotiated by IKE yet, or removed by `espgate sa del`): \
                 outbound traffic is dropped (no_sa)",
                missing.join("+").to_uppercase()
            );
        }
    }
    if s.connections.iter().flat_map(|c| &c.sas).any(|sa| sa.added) {
        out.push_str(ADDED_NOTE);
    }
    if let Some(ike) = &s.ike {
        render_ike(&mut out, ike);
    }
    if let Some(c) = &s.cluster {
        render_cluster(&mut out, c);
    }
    let _ = writeln!(out, "\ndrops: {}", counts(&s.drops).replace(',', ", "));
    let _ = writeln!(out, "counters: {}", counts(&s.counters).replace(',', ", "));
    if let Some(c) = &s.costs {
        let _ = writeln!(
            out,
            "cost accounting: on for {:.0}s, {} + {} packets (espgate status --costs)",
            c.seconds, c.outbound.packets, c.inbound.packets
        );
    }
    out
}

fn render_cluster(out: &mut String, c: &crate::cluster::ClusterStatus) {
    let plan = match &c.plan {
        Some(p) => format!("plan {} {:?}", p.epoch, p.members),
        None => "no plan".into(),
    };
    let age = c
        .plan_age_ms
        .map(|a| format!(", confirmed {:.1} s ago", a as f64 / 1000.0))
        .unwrap_or_default();
    let leader = c
        .leader
        .map(|l| format!(", leader {l}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "\ncluster \"{}\": node {} ({}), {}; {plan}{leader}{age}; {}",
        c.name,
        c.node,
        c.dispatch,
        c.state,
        if c.in_step { "in step" } else { "NOT in step" }
    );
    for sa in &c.sas {
        let seen = sa.processed + sa.observed;
        let lock = match sa.lockstep {
            Some(l) => format!(
                ", {}",
                serde_json::to_string(&l)
                    .unwrap_or_default()
                    .trim_matches('"')
            ),
            None => String::new(),
        };
        let resyncs = if sa.resyncs > 0 {
            format!(", {} resyncs", sa.resyncs)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {} {} {:#010x}: processed {} of {seen} seen{lock}{resyncs}",
            sa.conn,
            if sa.outbound { "out" } else { "in " },
            sa.spi,
            sa.processed
        );
    }
}

/// The text of `espgate sa list`.
pub fn render_sa_list(sas: &[SaStatus]) -> String {
    if sas.is_empty() {
        return "no SAs installed\n".into();
    }
    let mut out = sa_table(sas, true, 0);
    if sas.iter().any(|sa| sa.added) {
        out.push_str(ADDED_NOTE);
    }
    out
}

const ADDED_NOTE: &str =
    "(+ added by `espgate sa add`: a run-time change, gone when the daemon restarts)\n";

/// The IKE part of `espgate status`.
fn render_ike(out: &mut String, ike: &crate::ike::IkeDoc) {
    let _ = writeln!(out, "\nIKE SAs: {}", ike.sas.len());
    let opt_secs = |v: Option<u64>| v.map_or("never".to_string(), duration);
    for sa in &ike.sas {
        let _ = writeln!(
            out,
            "  {}: {}, {}, {} <-> {}{}, peer {}, {}",
            sa.connection,
            sa.state,
            if sa.initiator {
                "initiator"
            } else {
                "responder"
            },
            sa.local,
            sa.remote,
            match (sa.nat, sa.mobike) {
                (true, true) => " (NAT-T, MOBIKE)",
                (true, false) => " (NAT-T)",
                (false, true) => " (MOBIKE)",
                (false, false) => "",
            },
            sa.peer_id.as_deref().unwrap_or("-"),
            sa.algorithms.as_deref().unwrap_or("-"),
        );
        let _ = writeln!(
            out,
            "    SPIs {}, up {}, rekey in {}",
            sa.spis,
            sa.established_secs.map_or("-".to_string(), duration),
            opt_secs(sa.rekey_in_secs)
        );
        let per_cpu = sa.children.iter().any(|c| c.slot > 0);
        for c in &sa.children {
            let _ = writeln!(
                out,
                "    child {}_i {}_o {}{}{} {}, rekey in {}, expires in {}: {} === {}",
                c.spi_in,
                c.spi_out,
                if per_cpu {
                    format!("slot {} ", c.slot)
                } else {
                    String::new()
                },
                if c.protocol == "esp" {
                    String::new()
                } else {
                    format!("{} ", c.protocol)
                },
                c.algorithms,
                c.state,
                opt_secs(c.rekey_in_secs),
                opt_secs(c.expire_in_secs),
                c.local_ts.join(","),
                c.remote_ts.join(",")
            );
        }
    }
    let _ = writeln!(
        out,
        "IKE counters: {}",
        counts(&ike.counters).replace(',', ", ")
    );
}

/// For `skip_serializing_if`: a zero counter is left out.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Status {
        let sa = |dir: &str, spi: &str, drops: &[(&str, u64)]| SaStatus {
            connection: "site-b".into(),
            direction: dir.into(),
            added: false,
            spi: spi.into(),
            protocol: "esp".into(),
            suite: "aes128gcm16".into(),
            mode: "tunnel".into(),
            encap: "udp".into(),
            // A peer behind a NAT that gave it port 31000.
            udp_ports: Some(if dir == "out" {
                (4500, 31000)
            } else {
                (31000, 4500)
            }),
            peer: None,
            esn: false,
            packets: 3,
            bytes: 3 * 84,
            dummies: 0,
            drops: drops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            next_seq: (dir == "out").then_some(4),
            seq_reserved: (dir == "out").then_some(1_048_580),
            seq_reserve_failed: 0,
            highest_seq: (dir == "in").then_some(3),
            lifetime: LifetimeStatus {
                state: "ok".into(),
                ..Default::default()
            },
        };
        let mut inbound = sa("in", "0x00001001", &[("replay", 2)]);
        inbound.lifetime.hard_left = Left {
            bytes: None,
            packets: None,
            secs: Some(3540),
        };
        Status {
            version: "0.1.0".into(),
            pid: 42,
            uptime_secs: 75,
            config: "/etc/espgate/gw.toml".into(),
            tun: TunStatus {
                name: "espgate0".into(),
                mtu: 1438,
            },
            encap: "udp".into(),
            listen: Some("0.0.0.0:4500".into()),
            fwmark: None,
            workers: 1,
            per_worker: Vec::new(),
            offloads: vec!["udp_gso".into(), "udp_gro".into()],
            state_dir: "/var/lib/espgate".into(),
            connections: vec![ConnectionStatus {
                name: "site-b".into(),
                mode: "tunnel".into(),
                protocol: "esp".into(),
                encap: "udp".into(),
                local: "192.0.2.1".into(),
                remote: "192.0.2.2:4500".into(),
                local_ts: vec!["10.1.0.0/24".into()],
                remote_ts: vec!["10.2.0.0/24".into()],
                more_ts: vec![SelectorSetStatus {
                    local_ts: vec!["10.1.0.0/24".into()],
                    remote_ts: vec!["10.3.0.0/24".into()],
                }],
                sas: vec![inbound, sa("out", "0x00001002", &[])],
            }],
            ike: None,
            drops: [("replay".to_string(), 2), ("unknown_spi".to_string(), 1)]
                .into_iter()
                .collect(),
            counters: [("keepalives".to_string(), 0), ("tun_rx".to_string(), 3)]
                .into_iter()
                .collect(),
            costs: None,
            cluster: None,
        }
    }

    #[test]
    fn status_text() {
        let text = render_status(&sample());
        let want = "\
espgate 0.1.0 (pid 42), up 1m15s, config /etc/espgate/gw.toml
TUN espgate0 mtu 1438, encap udp, listen 0.0.0.0:4500, 1 worker thread(s), offloads udp_gso udp_gro

connection site-b: tunnel esp over udp, 192.0.2.1 -> 192.0.2.2:4500
  10.1.0.0/24 <-> 10.2.0.0/24
  10.1.0.0/24 <-> 10.3.0.0/24
  DIR  SPI         PROTO  SUITE        MODE                   PACKETS  BYTES  SEQ  LIFETIME  DROPS
  in   0x00001001  esp    aes128gcm16  tunnel/udp 31000>4500  3        252    3    59m0s     replay=2
  out  0x00001002  esp    aes128gcm16  tunnel/udp 4500>31000  3        252    4    -         -

drops: replay=2, unknown_spi=1
counters: keepalives=0, tun_rx=3
";
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn the_mode_cell_names_a_moved_peer_on_its_side() {
        let s = sample();
        let (inbound, outbound) = (&s.connections[0].sas[0], &s.connections[0].sas[1]);
        assert_eq!(mode_cell(outbound), "tunnel/udp 4500>31000");
        let moved = |sa: &SaStatus, peer: &str| SaStatus {
            peer: Some(peer.into()),
            ..sa.clone()
        };
        assert_eq!(
            mode_cell(&moved(outbound, "192.0.2.3")),
            "tunnel/udp 4500>192.0.2.3:31000"
        );
        assert_eq!(
            mode_cell(&moved(inbound, "2001:db8::3")),
            "tunnel/udp [2001:db8::3]:31000>4500"
        );
        let raw = SaStatus {
            encap: "none".into(),
            udp_ports: None,
            ..moved(outbound, "192.0.2.3")
        };
        assert_eq!(mode_cell(&raw), "tunnel/none >192.0.2.3");
        let raw_in = SaStatus {
            encap: "none".into(),
            udp_ports: None,
            ..moved(inbound, "192.0.2.3")
        };
        assert_eq!(mode_cell(&raw_in), "tunnel/none 192.0.2.3>");
        let unmoved = SaStatus { peer: None, ..raw };
        assert_eq!(mode_cell(&unmoved), "tunnel/none");
    }

    #[test]
    fn the_connection_line_names_where_a_moved_peer_is_now() {
        let mut s = sample();
        let text = render_status(&s);
        assert!(!text.contains("(now "), "{text}");
        for sa in &mut s.connections[0].sas {
            sa.peer = Some("192.0.2.3".into());
        }
        let c = &s.connections[0];
        let line = format!(
            "connection {}: {} {} over {}, {} -> {} (now 192.0.2.3:31000)",
            c.name, c.mode, c.protocol, c.encap, c.local, c.remote
        );
        let text = render_status(&s);
        assert!(text.contains(&line), "{text}");
    }

    #[test]
    fn a_connection_without_outbound_sa_says_so() {
        let mut s = sample();
        s.connections[0].sas.retain(|sa| sa.direction == "in");
        let text = render_status(&s);
        assert!(
            text.contains(
                "  no outbound ESP SA (not negotiated by IKE yet, or removed by `espgate sa del`)"
            ),
            "{text}"
        );
        assert!(!render_status(&sample()).contains("no outbound"));
    }

    #[test]
    fn sa_list_text() {
        let s = sample();
        let text = render_sa_list(&s.connections[0].sas);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("CONNECTION  DIR  SPI"), "{text}");
        assert!(
            lines[1].starts_with("site-b      in   0x00001001"),
            "{text}"
        );
        assert!(lines[2].ends_with(" -"), "{text}");
        assert_eq!(render_sa_list(&[]), "no SAs installed\n");
        // SAs added at run time are marked, with a note.
        let mut sas = s.connections[0].sas.clone();
        sas[1].added = true;
        let text = render_sa_list(&sas);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[2].contains(" 0x00001002+ "), "{text}");
        assert!(lines[3].contains("espgate sa add"), "{text}");
    }

    #[test]
    fn sa_list_text_is_pinned() {
        let mut sas = sample().connections[0].sas.clone();
        sas[1].added = true;
        sas[1].connection = "a-longer-name".into();
        sas[1].lifetime.state = "soft_expired".into();
        let want = "\
CONNECTION     DIR  SPI          PROTO  SUITE        MODE                   PACKETS  BYTES  SEQ  LIFETIME      DROPS
site-b         in   0x00001001   esp    aes128gcm16  tunnel/udp 31000>4500  3        252    3    59m0s         replay=2
a-longer-name  out  0x00001002+  esp    aes128gcm16  tunnel/udp 4500>31000  3        252    4    soft-expired  -
(+ added by `espgate sa add`: a run-time change, gone when the daemon restarts)
";
        let text = render_sa_list(&sas);
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn json_round_trip_omits_absent_fields() {
        let s = sample();
        let j = serde_json::to_value(&s).unwrap();
        let out = &j["connections"][0]["sas"][1];
        assert_eq!(out["next_seq"], 4);
        assert!(out.get("highest_seq").is_none());
        assert_eq!(
            j["connections"][0]["sas"][0]["lifetime"]["hard_left"]["secs"],
            3540
        );
        assert!(j.get("costs").is_none(), "absent while accounting is off");
        let back: Status = serde_json::from_value(j).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn costs_show_in_the_document_and_a_line_of_text_when_on() {
        use crate::costs::{ClockKind, Costs, Dir};
        use espgate_core::cost::{Probe, Stage};
        let mut c = Costs::with_clock(ClockKind::Monotonic);
        c.begin(Dir::Outbound);
        c.mark(Stage::Cipher);
        let mut s = sample();
        s.costs = Some(c.report());
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["costs"]["outbound"]["stages"]["cipher"]["packets"], 1);
        assert_eq!(j["costs"]["inbound"]["packets"], 0);
        let text = render_status(&s);
        assert!(
            text.ends_with("1 + 0 packets (espgate status --costs)\n"),
            "{text}"
        );
    }

    #[test]
    fn cells() {
        assert_eq!(duration(0), "0s");
        assert_eq!(duration(3600 * 26 + 5), "1d2h");
        assert_eq!(si(1023), "1023");
        assert_eq!(si(1536), "1.5K");
        assert_eq!(si(50 << 20), "50M");
        let mut l = LifetimeStatus {
            state: "soft_expired".into(),
            ..Default::default()
        };
        assert_eq!(lifetime_cell(&l), "soft-expired");
        l.hard_left.bytes = Some(2048);
        assert_eq!(lifetime_cell(&l), "soft-expired, 2.0KB");
        l.state = "hard_expired".into();
        assert_eq!(lifetime_cell(&l), "EXPIRED");
        let l = LifetimeStatus {
            state: "ok".into(),
            soft_left: Left {
                packets: Some(10),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(lifetime_cell(&l), "soft 10pkt");
    }
}
