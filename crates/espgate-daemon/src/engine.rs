//! The gateway's packet logic without its I/O: the SAD and SPD built from
//! the configuration, the outbound path (clear packet from the TUN → SPD →
//! SA bundle → outer packet, with sequence numbers reserved on disk first),
//! the inbound path (outer packet → SAD → inner packet, bundle checked
//! against the connection), counters, rate-limited drop logging, timers,
//! the status documents, and the run-time SA changes of `espgate sa add` /
//! `sa del` (see [`Engine::add_sa`]).
//!
//! The I/O loop in [`super::dataplane`] reads packets into a [`PacketBuf`],
//! calls [`Engine::outbound`] or [`Engine::inbound`] and sends or writes
//! what they leave in the buffer. Unit tests run two engines back to back.

use crate::control::{error_response, Request};
use crate::ratelimit::{suppressed_note, RateLimiter};
use crate::seqstate::{self, Reservation, SeqStore};
use anyhow::{anyhow, bail, Context, Result};
use espgate_api::costs::{Costs, CostsReport, Dir};
use espgate_api::status::{ConnectionStatus, Left, LifetimeStatus, SaStatus};
use espgate_api::wireshark::SaKeys;
use espgate_config::{Connection, Encapsulation, LoadedConfig, MssClamp, Protocols};
use espgate_core::cost::{Probe, Stage};
use espgate_core::mss::{self, MssLimit};
use espgate_core::sa::{Encap, Mode, Protocol, SaEvent, SharedSeq};
use espgate_core::sad::{InboundOutcome, SaId, Sad};
use espgate_core::spd::{Action, Direction, Policy, Spd};
use espgate_core::wire::flow::{self, Flow};
use espgate_core::{DropReason, PacketBuf, Sa, SaConfig};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Packet counters of the daemon.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Drops by reason, both directions, indexed by [`DropReason::index`].
    pub drops: [u64; DropReason::COUNT],
    /// Packets read from the TUN.
    pub tun_rx: u64,
    /// Packets written to the TUN.
    pub tun_tx: u64,
    /// Outer packets received (UDP datagrams and raw ESP/AH).
    pub net_rx: u64,
    /// Outer packets sent.
    pub net_tx: u64,
    /// RFC 3948 NAT keepalives received and ignored.
    pub keepalives: u64,
    /// IKE messages received behind the non-ESP marker (queued for the IKE
    /// engine, or ignored when no connection uses IKE).
    pub ike: u64,
    /// ESP dummy packets (next header 59) discarded.
    pub dummies: u64,
    /// Multicast, broadcast and link-local packets from the TUN (IPv6
    /// neighbour discovery, MLD, …), which no SA carries; not logged.
    pub not_unicast: u64,
    /// TCP SYNs whose MSS option was lowered (`mss_clamp`).
    pub mss_clamped: u64,
    /// RFC 3948 NAT keepalives sent (`nat_keepalive`).
    pub keepalives_sent: u64,
    /// `UDP_SEGMENT` sends (each carried several datagrams).
    pub gso_sends: u64,
    /// UDP reads that returned several datagrams coalesced by `UDP_GRO`.
    pub gro_reads: u64,
    /// TUN reads that returned a TCP/UDP super-segment (TSO/USO), cut
    /// into MTU-sized packets before encryption.
    pub tso_reads: u64,
    /// TUN writes of a super-segment coalesced from several decrypted TCP
    /// segments of one flow.
    pub tun_gso_writes: u64,
}

/// One connection at run time.
#[derive(Debug)]
pub struct ConnState {
    /// Its configuration.
    pub conn: Connection,
    /// Outbound SAs in bundle order (ESP first, AH outermost), at most one
    /// per layer. A layer whose SA was removed (`espgate sa del`) is
    /// missing: the connection then sends nothing (drops counted as
    /// `no_sa`) until `espgate sa add` installs one.
    pub out_ids: Vec<SaId>,
    /// Inbound SAs: the configured ones (ESP first, then AH), then those
    /// added at run time. Any of a layer's SAs is accepted.
    pub in_ids: Vec<SaId>,
    /// MSS clamping of TCP SYNs both ways, from `mss_clamp`.
    pub mss: Option<MssLimit>,
}

impl ConnState {
    /// True when every layer has its outbound SA.
    pub fn can_send(&self) -> bool {
        let n = self.out_ids.len();
        n == layers(self.conn.protocol).len() || (self.conn.per_cpu_sas > 1 && n >= 1)
    }
}

/// A connection's IPsec layers in bundle order: ESP first, AH outermost.
pub fn layers(p: Protocols) -> &'static [Protocol] {
    match p {
        Protocols::Esp => &[Protocol::Esp],
        Protocols::Ah => &[Protocol::Ah],
        Protocols::EspAh => &[Protocol::Esp, Protocol::Ah],
    }
}

#[derive(Debug, Clone, Copy)]
struct SaMeta {
    conn: usize,
    outbound: bool,
    protocol: Protocol,
    /// Installed by `espgate sa add` (not from the configuration).
    added: bool,
}

/// The most an IKE-negotiated ESP SA of connection `c` can add to a packet:
/// the worst of its ESP proposals (the TUN MTU is sized at start, before
/// any SA exists). Zero for a manually keyed connection.
fn ike_overhead(c: &Connection) -> usize {
    let Some(ike) = &c.ike else { return 0 };
    let outer = match (c.mode, c.remote) {
        (Mode::Transport, _) => 0,
        (Mode::Tunnel, IpAddr::V6(_)) => 40,
        (Mode::Tunnel, IpAddr::V4(_)) => 20,
    };
    let udp = if c.encap == Encapsulation::Udp { 8 } else { 0 };
    let mut worst = 0;
    for p in &ike.esp_proposals {
        for e in &p.encr {
            let integs: Vec<Option<espgate_core::crypto::Integ>> = if p.integ.is_empty() {
                vec![None]
            } else {
                p.integ.iter().copied().map(Some).collect()
            };
            for i in integs {
                let suite = espgate_core::crypto::Suite {
                    enc: Some(*e),
                    integ: i,
                };
                // ESP header 8, IV, padding, pad length + next header 2, ICV.
                let esp = 8 + suite.iv_len() + (suite.block_len().max(4) - 1) + 2 + suite.icv_len();
                worst = worst.max(outer + udp + esp);
            }
        }
    }
    worst
}

/// What `espgate sa add` / `sa del` changed: the answer to the client
/// (and the info log line). Never holds key material.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SaChange {
    /// One line saying what changed.
    pub message: String,
    /// What the operator should know: a connection left without an SA,
    /// a bundle larger than the TUN MTU allows for.
    pub warnings: Vec<String>,
}

/// The packet logic; see the module documentation.
/// The worker (of `n`) that receives the inbound SA with `spi`: ESP-in-UDP
/// datagrams are steered to socket `SPI % n` of the `SO_REUSEPORT` group
/// ([`crate::sockets::UdpSock::steer_by_spi`]); raw ESP/AH is read by
/// worker 0 alone.
pub fn worker_of(encap: Encap, spi: u32, n: usize) -> usize {
    match encap {
        Encap::Udp { .. } if n > 1 => spi as usize % n,
        _ => 0,
    }
}

/// An outbound SA's sequence numbers reserved on disk: owned by this
/// engine, or shared by the copies of the SA that several workers hold
/// (their numbers come from one [`SharedSeq`]; the reservation is locked
/// only when it must grow, about once per `seqstate::STEP / 2` packets).
enum Res {
    Own(Reservation),
    Shared {
        r: Arc<Mutex<Reservation>>,
        seq: Arc<SharedSeq>,
        /// This engine's copy of the reservation's low-water mark: below
        /// it nothing needs the lock.
        low: u64,
    },
}

/// What [`Res::check`] found wrong, if anything.
enum ResCheck {
    Ok,
    /// The extension failed but the next number is still covered.
    Retry(String),
    /// The next number is not covered: do not send.
    Fatal(String),
}

fn lock(r: &Mutex<Reservation>) -> std::sync::MutexGuard<'_, Reservation> {
    // A worker that panicked while holding it left a valid reservation
    // (every write is atomic): keep going.
    r.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Res {
    /// Grows the reservation before `next` (the SA's next number) needs it.
    fn check(&mut self, next: u64) -> ResCheck {
        fn extend(r: &mut Reservation, next: u64) -> ResCheck {
            if !r.should_extend(next) {
                return ResCheck::Ok;
            }
            // Once per `seqstate::STEP / 2` packets: a disk write,
            // amortised, not a per-packet cost.
            let _cold = crate::alloc_count::cold();
            match r.extend(next) {
                Ok(()) => ResCheck::Ok,
                Err(err) => {
                    let msg = format!(
                        "cannot reserve sequence numbers in {}: {err}",
                        r.path().display()
                    );
                    if r.covers(next) {
                        ResCheck::Retry(msg)
                    } else {
                        ResCheck::Fatal(msg)
                    }
                }
            }
        }
        match self {
            Res::Own(r) => extend(r, next),
            Res::Shared { r, seq, low } => {
                let next = seq.next();
                if next < *low {
                    return ResCheck::Ok;
                }
                let mut g = lock(r);
                let out = extend(&mut g, next);
                *low = g.low_water();
                // The shared counter never hands out an unreserved number.
                seq.set_ceiling(g.reserved());
                out
            }
        }
    }

    fn reserved(&self) -> u64 {
        match self {
            Res::Own(r) => r.reserved(),
            Res::Shared { r, .. } => lock(r).reserved(),
        }
    }

    /// Writes the exact next number (see [`Reservation::release`]).
    fn release(&mut self, next: u64) {
        fn write(r: &mut Reservation, next: u64) {
            if let Err(e) = r.release(next) {
                tracing::warn!("writing {}: {e}", r.path().display());
            }
        }
        match self {
            Res::Own(r) => write(r, next),
            Res::Shared { r, .. } => write(&mut lock(r), next),
        }
    }
}

pub struct Engine {
    sad: Sad,
    spd: Spd,
    /// Policy index → connection index.
    policy_conn: Vec<usize>,
    conns: Vec<ConnState>,
    /// By `SaId.0`.
    meta: Vec<Option<SaMeta>>,
    /// Outbound sequence reservations, by `SaId.0`.
    reservations: Vec<Option<Res>>,
    /// Where outbound SAs added at run time reserve their sequence numbers.
    store: Option<SeqStore>,
    /// The bundle overhead the TUN MTU was sized for at start.
    sized_overhead: usize,
    applied: Vec<SaId>,
    nat_t_port: u16,
    /// Counters.
    pub counters: Counters,
    /// IKE datagrams received on the NAT-T socket (non-ESP marker removed),
    /// waiting for worker 0's IKE engine: (our address, sender, message).
    pub ike_rx: crate::ike::IkeQueue,
    /// An IKE engine runs (worker 0 with IKE connections): IKE on the
    /// NAT-T port is queued for it rather than dropped.
    pub ike_enabled: bool,
    limiter: RateLimiter,
    /// Per-stage cost accounting, when on (`gateway.cost_accounting`,
    /// `espgate costs on`); `None` keeps the packet paths unprobed.
    costs: Option<Costs>,
    /// Byte and packet lifetimes of the SAs are divided by this (the
    /// number of workers holding copies; see [`Engine::for_workers`]).
    volume_split: u64,
    /// This engine's worker index: with per-CPU SAs it sends on pair
    /// `worker % per_cpu_sas`.
    worker: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("sas", &self.sad.len())
            .field("policies", &self.spd.len())
            .finish_non_exhaustive()
    }
}

fn slot<T>(v: &mut Vec<Option<T>>, id: SaId) -> &mut Option<T> {
    let i = id.0 as usize;
    if v.len() <= i {
        v.resize_with(i + 1, || None);
    }
    &mut v[i]
}

/// False for packets no unicast SA carries: multicast, limited broadcast,
/// and IPv6 link-local or unspecified addresses.
pub fn is_unicast(f: &Flow) -> bool {
    let ok = |a: IpAddr, is_dst: bool| match a {
        IpAddr::V4(v) => !(v.is_multicast() || v.is_broadcast() || (is_dst && v.is_unspecified())),
        IpAddr::V6(v) => {
            !(v.is_multicast() || v.is_unspecified() || (v.segments()[0] & 0xffc0) == 0xfe80)
        }
    };
    ok(f.src, false) && ok(f.dst, true)
}

fn sa_protocol(sad: &Sad, id: SaId) -> Protocol {
    sad.get(id).map_or(Protocol::Esp, |sa| sa.config().protocol)
}

fn encap_name(e: Encap) -> &'static str {
    match e {
        Encap::None => "none",
        Encap::Udp { .. } => "udp",
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Tunnel => "tunnel",
        Mode::Transport => "transport",
    }
}

fn parse_dir(d: Option<&str>) -> Result<Option<bool>, String> {
    match d {
        None => Ok(None),
        Some("in") => Ok(Some(false)),
        Some("out") => Ok(Some(true)),
        Some(other) => Err(format!("dir: expected in or out, got {other:?}")),
    }
}

fn parse_proto(p: Option<&str>) -> Result<Option<Protocol>, String> {
    match p {
        None => Ok(None),
        Some("esp") => Ok(Some(Protocol::Esp)),
        Some("ah") => Ok(Some(Protocol::Ah)),
        Some(other) => Err(format!("proto: expected esp or ah, got {other:?}")),
    }
}

/// Answers the control commands that change SAs or read their keys:
/// `sa_add`, `sa_del` and `wireshark_keys`, and `costs` (cost accounting
/// on, off or reset; see [`super::control`]).
pub fn admin_answer(engine: &mut Engine, now: Duration, req: &Request) -> String {
    let need = |what: &str| format!("{} needs \"{what}\"", req.cmd);
    let changed = match req.cmd.as_str() {
        "sa_add" => (|| {
            let conn = req.conn.as_deref().ok_or_else(|| need("conn"))?;
            let out = parse_dir(req.dir.as_deref())?.ok_or_else(|| need("dir"))?;
            let spec = req.spec.as_deref().ok_or_else(|| need("spec"))?;
            engine.add_sa(conn, out, spec, now)
        })(),
        "sa_del" => (|| {
            let spi = req.spi.ok_or_else(|| need("spi"))?;
            let proto = parse_proto(req.proto.as_deref())?;
            let dir = parse_dir(req.dir.as_deref())?;
            engine.del_sa(spi, proto, dir, req.conn.as_deref())
        })(),
        "wireshark_keys" => {
            #[derive(serde::Serialize)]
            struct Keys<'a> {
                ok: bool,
                sas: &'a [SaKeys],
            }
            let sas = engine.sa_keys();
            tracing::info!(
                "wireshark_keys: {} SA keys handed out on the control socket",
                sas.len()
            );
            return serde_json::to_string(&Keys {
                ok: true,
                sas: &sas,
            })
            .unwrap_or_else(|e| error_response(&format!("encoding the keys: {e}")));
        }
        "costs" => engine.costs_command(req.action.as_deref().unwrap_or("")),
        other => Err(format!("unknown command {other:?}")),
    };
    match changed {
        Ok(c) => serde_json::json!({"ok": true, "message": c.message, "warnings": c.warnings})
            .to_string(),
        Err(e) => error_response(&e),
    }
}

/// The keys of an SA spec with their raw values, in order (the spec
/// parsed already, so every item is `key=value`).
fn spec_keys(spec: &str) -> Vec<(&str, &str)> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|item| item.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

fn parse_port(key: &str, v: &str) -> Result<u16, String> {
    let n = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u16::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    };
    n.ok_or_else(|| format!("{key}: '{v}' is not a port"))
}

/// Refuses spec keys of an added SA that contradict its connection: mode,
/// encapsulation, addresses and ports come from the connection (a key
/// equal to the connection's value is accepted), and an outbound SA's
/// first sequence number comes from its reservation on disk.
fn check_spec_against(
    c: &Connection,
    outbound: bool,
    protocol: Protocol,
    given: &[(&str, &str)],
    parsed: &espgate_core::SaConfig,
) -> Result<(), String> {
    let dir = if outbound { "outbound" } else { "inbound" };
    let (src, dst) = if outbound {
        (c.local, c.remote)
    } else {
        (c.remote, c.local)
    };
    let (sport, dport) = if outbound {
        (c.local_port, c.remote_port)
    } else {
        (c.remote_port, c.local_port)
    };
    let from_conn = "the mode, encapsulation, addresses and ports of an added SA come from its \
                     connection: leave the key out";
    let name = &c.name;
    for (k, v) in given {
        let conflict = match *k {
            "mode" => (parsed.mode != c.mode)
                .then(|| format!("connection \"{name}\" is in {} mode", mode_name(c.mode))),
            "encap" => (matches!(parsed.encap, Encap::Udp { .. })
                != (c.encap == Encapsulation::Udp))
                .then(|| format!("connection \"{name}\" uses encap {}", c.encap.name())),
            "src" | "dst" => {
                let want = if *k == "src" { src } else { dst };
                let got = if *k == "src" {
                    parsed.tunnel_src
                } else {
                    parsed.tunnel_dst
                };
                (got != Some(want)).then(|| {
                    format!("the {dir} SAs of connection \"{name}\" go from {src} to {dst}")
                })
            }
            "sport" | "dport" => {
                if c.encap != Encapsulation::Udp {
                    Some(format!(
                        "connection \"{name}\" sends raw {}, without UDP ports",
                        protocol.name().to_uppercase()
                    ))
                } else {
                    let want = if *k == "sport" { sport } else { dport };
                    (parse_port(k, v)? != want).then(|| {
                        format!(
                            "the {dir} SAs of connection \"{name}\" use UDP ports {sport} -> \
                             {dport}"
                        )
                    })
                }
            }
            "seq" if outbound => {
                return Err(format!(
                    "seq={v}: an outbound SA starts at the sequence number reserved on disk for \
                     its key (gateway.state_dir), so that no nonce is ever reused: leave seq out"
                ))
            }
            "tfc" if protocol == Protocol::Ah => {
                return Err(format!("tfc={v}: TFC padding is for ESP, not AH"))
            }
            _ => None,
        };
        if let Some(why) = conflict {
            return Err(format!("{k}={v}: {why}; {from_conn}"));
        }
    }
    Ok(())
}

impl Engine {
    /// Installs every connection's SAs and policies. Outbound SAs start at
    /// the sequence number `store` has reserved for their key (1 without a
    /// store, for tests).
    pub fn new(cfg: &LoadedConfig, store: Option<&SeqStore>, now: Duration) -> Result<Engine> {
        let mut e = Engine {
            sad: Sad::new(),
            spd: Spd::new(),
            policy_conn: Vec::new(),
            conns: Vec::new(),
            meta: Vec::new(),
            reservations: Vec::new(),
            store: store.cloned(),
            sized_overhead: 0,
            applied: Vec::with_capacity(espgate_core::sad::MAX_LAYERS),
            nat_t_port: cfg.gateway.listen.port(),
            counters: Counters::default(),
            ike_rx: Vec::new(),
            ike_enabled: false,
            limiter: RateLimiter::new(Duration::from_secs(1)),
            costs: cfg.gateway.cost_accounting.then(Costs::new),
            volume_split: 1,
            worker: 0,
        };
        for (ci, c) in cfg.connections.iter().enumerate() {
            let sas = c.sa_configs();
            let what = |sc: &espgate_core::SaConfig, dir: &str| {
                format!(
                    "connection \"{}\": installing {dir} {} SA {:#010x}",
                    c.name,
                    sc.protocol.name().to_uppercase(),
                    sc.spi
                )
            };
            let mut in_ids = Vec::new();
            for sc in sas.inbound {
                let ctx = what(&sc, "inbound");
                let sa = Sa::new(sc, now).map_err(|err| anyhow!("{ctx}: {err}"))?;
                let id = e.sad.insert(sa).map_err(|err| anyhow!("{ctx}: {err}"))?;
                *slot(&mut e.meta, id) = Some(SaMeta {
                    conn: ci,
                    outbound: false,
                    protocol: sa_protocol(&e.sad, id),
                    added: false,
                });
                in_ids.push(id);
            }
            let mut out_ids = Vec::new();
            for mut sc in sas.outbound {
                let ctx = what(&sc, "outbound");
                let res = match store {
                    Some(st) => {
                        let (start, r) = st.reserve(&sc, &c.name).context(ctx.clone())?;
                        sc.initial_seq = start;
                        Some(Res::Own(r))
                    }
                    None => None,
                };
                let sa = Sa::new(sc, now).map_err(|err| anyhow!("{ctx}: {err}"))?;
                let id = e.sad.insert(sa).map_err(|err| anyhow!("{ctx}: {err}"))?;
                *slot(&mut e.meta, id) = Some(SaMeta {
                    conn: ci,
                    outbound: true,
                    protocol: sa_protocol(&e.sad, id),
                    added: false,
                });
                *slot(&mut e.reservations, id) = res;
                out_ids.push(id);
            }
            for selector in c.selectors() {
                e.spd.push(Policy {
                    selector,
                    action: Action::Protect(out_ids.clone()),
                });
                e.policy_conn.push(ci);
            }
            let per_cpu = c.per_cpu_sas > 1;
            e.conns.push(ConnState {
                conn: c.clone(),
                out_ids,
                in_ids,
                mss: None,
            });
            if per_cpu {
                e.refresh_policies(ci);
            }
        }
        e.sized_overhead = e.max_overhead();
        let tun_mtu = e.tun_mtu(cfg.gateway.mtu);
        for c in &mut e.conns {
            c.mss = match c.conn.mss_clamp {
                MssClamp::Off => None,
                MssClamp::Fixed(n) => Some(MssLimit::fixed(n)),
                MssClamp::Auto => Some(MssLimit::for_mtu(tun_mtu)),
            };
        }
        Ok(e)
    }

    /// The TUN MTU for an outer path MTU of `outer_mtu`: what is left after
    /// the largest bundle overhead.
    pub fn tun_mtu(&self, outer_mtu: u16) -> u32 {
        u32::from(outer_mtu).saturating_sub(self.max_overhead() as u32)
    }

    /// The connections.
    pub fn conns(&self) -> &[ConnState] {
        &self.conns
    }

    /// The SAD (read-only).
    pub fn sad(&self) -> &Sad {
        &self.sad
    }

    /// The largest number of bytes a connection's outbound bundle adds to
    /// a packet (the TUN MTU is the outer MTU minus this).
    pub fn max_overhead(&self) -> usize {
        self.conns
            .iter()
            .map(|c| {
                let configured = c
                    .out_ids
                    .iter()
                    .filter_map(|id| self.sad.get(*id))
                    .map(Sa::overhead)
                    .sum::<usize>();
                configured.max(ike_overhead(&c.conn))
            })
            .max()
            .unwrap_or(0)
    }

    /// Counts a drop and logs `msg` (rate-limited per reason; `no_policy`
    /// at info level, the others at warn).
    pub fn drop_packet(&mut self, d: DropReason, now: Duration, msg: impl FnOnce() -> String) {
        self.counters.drops[d.index()] += 1;
        if let Some(n) = self.limiter.check(d.as_str(), now) {
            let note = suppressed_note(n);
            match d {
                DropReason::NoPolicy => {
                    tracing::info!("dropped ({}): {}{note}", d.as_str(), msg())
                }
                _ => tracing::warn!("dropped ({}): {}{note}", d.as_str(), msg()),
            }
        }
    }

    /// Protects the clear packet in `buf` (read from the TUN). On success
    /// `buf` holds the outer packet and the connection to send it on is
    /// returned; `None` means dropped (and counted).
    pub fn outbound(&mut self, buf: &mut PacketBuf, now: Duration) -> Option<usize> {
        if let Some(c) = &mut self.costs {
            c.begin(Dir::Outbound);
        }
        self.counters.tun_rx += 1;
        let f = match flow::of_packet(buf.as_slice()) {
            Ok(f) => f,
            Err(d) => {
                self.drop_packet(d, now, || "unparsable packet from the TUN".into());
                return None;
            }
        };
        if !is_unicast(&f) {
            self.counters.not_unicast += 1;
            return None;
        }
        let Some(pi) = self.spd.lookup(&f, Direction::Outbound).map(|(i, _)| i) else {
            self.drop_packet(DropReason::NoPolicy, now, || {
                format!(
                    "{} -> {} (protocol {}) from the TUN matches no connection's selectors",
                    f.src, f.dst, f.proto
                )
            });
            return None;
        };
        let conn = self.policy_conn[pi];
        if !self.conns[conn].can_send() {
            let c = &self.conns[conn].conn;
            let missing: Vec<&str> = layers(c.protocol)
                .iter()
                .filter(|p| {
                    !self.conns[conn]
                        .out_ids
                        .iter()
                        .any(|id| self.meta_of(*id).is_some_and(|m| m.protocol == **p))
                })
                .map(|p| p.name())
                .collect();
            let msg = format!(
                "{} -> {} on connection \"{}\": no outbound {} SA (removed by `espgate sa del`; \
                 `espgate sa add --conn {} --dir out` installs one)",
                f.src,
                f.dst,
                c.name,
                missing.join("+").to_uppercase(),
                c.name
            );
            self.drop_packet(DropReason::NoSa, now, || msg);
            return None;
        }
        if let Some(limit) = self.conns[conn].mss {
            if mss::clamp(buf.as_mut_slice(), limit) {
                self.counters.mss_clamped += 1;
            }
        }
        enum Fail {
            NotProtect,
            Reserve(String),
            Core(DropReason),
        }
        let mut retry_note = None;
        let result = {
            let Engine {
                sad,
                spd,
                reservations,
                costs,
                ..
            } = &mut *self;
            match &spd.policies()[pi].action {
                Action::Protect(ids) => {
                    // Reserve sequence numbers on disk before using them.
                    let mut fatal = None;
                    for id in ids {
                        let Some(Some(r)) = reservations.get_mut(id.0 as usize) else {
                            continue;
                        };
                        let next = sad.get(*id).map_or(0, Sa::next_seq);
                        match r.check(next) {
                            ResCheck::Ok => {}
                            ResCheck::Retry(msg) => retry_note = Some(msg),
                            ResCheck::Fatal(msg) => {
                                fatal = Some(msg);
                                break;
                            }
                        }
                    }
                    match (fatal, costs) {
                        (Some(msg), _) => Err(Fail::Reserve(msg)),
                        (None, None) => sad.encapsulate(ids, buf, now).map_err(Fail::Core),
                        (None, Some(c)) => {
                            // Flow, policy, bundle check, MSS clamp, reservation.
                            c.mark(Stage::Lookup);
                            sad.encapsulate_probed(ids, buf, now, c).map_err(Fail::Core)
                        }
                    }
                }
                Action::Bypass | Action::Discard => Err(Fail::NotProtect),
            }
        };
        if let Some(msg) = retry_note {
            if self.limiter.check("seq_reserve_retry", now).is_some() {
                tracing::warn!("{msg} (the numbers in use are still covered; will retry)");
            }
        }
        match result {
            Ok(()) => Some(conn),
            Err(Fail::NotProtect) => {
                self.drop_packet(DropReason::NoPolicy, now, || {
                    "the policy is not PROTECT".into()
                });
                None
            }
            Err(Fail::Reserve(msg)) => {
                self.drop_packet(DropReason::SeqReserve, now, || msg);
                None
            }
            Err(Fail::Core(d)) => {
                let name = &self.conns[conn].conn.name;
                let msg = format!("outbound {} -> {} on connection \"{name}\"", f.src, f.dst);
                self.drop_packet(d, now, || msg);
                None
            }
        }
    }

    /// Verifies and removes the IPsec layers of the outer packet in `buf`
    /// (received from `from`). `true`: `buf` holds the inner packet, to be
    /// written to the TUN; `false`: consumed or dropped (and counted).
    pub fn inbound(&mut self, buf: &mut PacketBuf, now: Duration, from: IpAddr) -> bool {
        self.counters.net_rx += 1;
        let r = match &mut self.costs {
            None => self.sad.decapsulate_into(
                buf,
                &espgate_core::sa::Classifier::new().udp_port(self.nat_t_port),
                now,
                &mut self.applied,
            ),
            Some(c) => {
                c.begin(Dir::Inbound);
                self.sad.decapsulate_into_probed(
                    buf,
                    &espgate_core::sa::Classifier::new().udp_port(self.nat_t_port),
                    now,
                    &mut self.applied,
                    c,
                )
            }
        };
        match r {
            Ok(InboundOutcome::Packet) => {
                // The layers must be one connection's inbound bundle: per
                // layer, any of its inbound SAs of that protocol.
                let conn = self
                    .applied
                    .first()
                    .and_then(|id| self.meta_of(*id))
                    .map(|m| m.conn);
                let ok = conn.is_some_and(|c| self.is_inbound_bundle(c));
                if let Some(limit) = conn.and_then(|c| self.conns[c].mss).filter(|_| ok) {
                    if mss::clamp(buf.as_mut_slice(), limit) {
                        self.counters.mss_clamped += 1;
                    }
                }
                if let Some(c) = &mut self.costs {
                    // The inbound policy check (and MSS clamp).
                    c.mark(Stage::Lookup);
                }
                if !ok {
                    let got: Vec<String> = self
                        .applied
                        .iter()
                        .filter_map(|id| self.sad.get(*id))
                        .map(|sa| {
                            format!(
                                "{} {:#010x}",
                                sa.config().protocol.name().to_uppercase(),
                                sa.config().spi
                            )
                        })
                        .collect();
                    self.drop_packet(DropReason::PolicyMismatch, now, || {
                        format!(
                            "packet from {from} came through {} but not its connection's whole \
                             inbound bundle",
                            got.join(" + ")
                        )
                    });
                    return false;
                }
                true
            }
            Ok(InboundOutcome::Dummy(_)) => {
                self.counters.dummies += 1;
                false
            }
            Ok(InboundOutcome::Ike) => {
                self.counters.ike += 1;
                if self.limiter.check("ike", now).is_some() {
                    tracing::info!(
                        "ignoring IKE packet from {from}: no connection of this gateway uses IKE"
                    );
                }
                false
            }
            Ok(InboundOutcome::Keepalive) => {
                self.counters.keepalives += 1;
                false
            }
            Err(e) => {
                let conn =
                    e.sa.and_then(|id| self.meta.get(id.0 as usize).copied().flatten())
                        .map(|m| self.conns[m.conn].conn.name.clone());
                self.drop_packet(e.reason, now, || {
                    let spi = e.spi.map(|s| format!(" SPI {s:#010x}")).unwrap_or_default();
                    let conn = conn
                        .map(|c| format!(" (connection \"{c}\")"))
                        .unwrap_or_default();
                    format!("inbound from {from}{spi}{conn}")
                });
                false
            }
        }
    }

    /// A clock reading for [`Engine::cost_received`] / [`Engine::cost_sent`]
    /// when cost accounting is on (`None`, and nothing read, when off).
    #[inline]
    pub fn cost_clock(&self) -> Option<u64> {
        self.costs.as_ref().map(Costs::now)
    }

    /// The read that started at `start` ([`Engine::cost_clock`]) returned:
    /// its time is `dir`'s receive stage. A no-op when accounting is off.
    #[inline]
    pub fn cost_received(&mut self, start: Option<u64>, dir: Dir) {
        if let (Some(c), Some(t)) = (&mut self.costs, start) {
            c.received(t, dir);
        }
    }

    /// The send or write of `packets` packets that started at `start`
    /// returned: its time is `dir`'s send stage. A no-op when off.
    #[inline]
    pub fn cost_sent(&mut self, start: Option<u64>, dir: Dir, packets: usize) {
        if let (Some(c), Some(t)) = (&mut self.costs, start) {
            c.sent(t, dir, packets as u64);
        }
    }

    /// The cost accountant, when accounting is on.
    pub fn costs_mut(&mut self) -> Option<&mut Costs> {
        self.costs.as_mut()
    }

    /// The accumulated per-stage costs, when accounting is on.
    pub fn costs_report(&self) -> Option<CostsReport> {
        self.costs.as_ref().map(Costs::report)
    }

    /// `espgate costs on|off|reset`: `on` starts accounting (keeping the
    /// counts if it was on already), `off` stops it and drops the counts,
    /// `reset` zeroes them.
    pub fn costs_command(&mut self, action: &str) -> Result<SaChange, String> {
        let message = match (action, self.costs.is_some()) {
            ("on", true) => "cost accounting is already on".to_string(),
            ("on", false) => {
                let c = Costs::new();
                let m = format!(
                    "cost accounting on (clock {}); `espgate status --costs` shows it",
                    c.clock().as_str()
                );
                self.costs = Some(c);
                m
            }
            ("off", true) => {
                self.costs = None;
                "cost accounting off; its counts are gone".to_string()
            }
            ("off", false) => "cost accounting is already off".to_string(),
            ("reset", true) => {
                if let Some(c) = &mut self.costs {
                    c.reset();
                }
                "cost accounting counts reset".to_string()
            }
            ("reset", false) => {
                return Err("cost accounting is off; `espgate costs on` starts it".into())
            }
            (other, _) => return Err(format!("costs: expected on, off or reset, got {other:?}")),
        };
        tracing::info!("{message}");
        Ok(SaChange {
            message,
            warnings: Vec::new(),
        })
    }

    /// About once a second: advances SA lifetimes, logs their events, and
    /// reports drop log lines the rate limiter held back.
    pub fn tick(&mut self, now: Duration) {
        for i in 0..self.meta.len() {
            let Some(m) = self.meta[i] else { continue };
            let Some(sa) = self.sad.get_mut(SaId(i as u32)) else {
                continue;
            };
            sa.tick(now);
            while let Some(ev) = sa.poll_event() {
                let c = &self.conns[m.conn].conn.name;
                let what = format!(
                    "connection \"{c}\": {} {} SA {:#010x}",
                    if m.outbound { "outbound" } else { "inbound" },
                    sa.config().protocol.name().to_uppercase(),
                    sa.config().spi
                );
                match ev {
                    SaEvent::SoftExpired => tracing::warn!(
                        "{what} reached its soft lifetime limit: configure new keys soon \
                         (manual SAs are never replaced automatically)"
                    ),
                    SaEvent::HardExpired => tracing::warn!(
                        "{what} reached its hard lifetime limit and refuses all traffic until \
                         new keys are configured"
                    ),
                    SaEvent::SeqExhausted => tracing::warn!(
                        "{what} has used up its sequence numbers and refuses to send; \
                         configure new keys (and esn = true)"
                    ),
                }
            }
        }
        for (key, n) in self.limiter.flush(now) {
            tracing::warn!("{n} more {key} lines suppressed in the last second");
        }
    }

    /// One engine per data-plane worker, all from `cfg`: engine 0 reserves
    /// sequence numbers in `store`; the others hold copies of the same SAs
    /// (same ids) whose outbound counters and reservations are those of
    /// engine 0 ([`SharedSeq`]), so no number is used twice whichever
    /// worker sends. Byte and packet lifetimes are split between the
    /// copies, each counting its own traffic, so that none outlives the
    /// configured limit. Inbound SAs are copied too; the sockets steer each
    /// SPI to one worker, whose copy alone keeps its replay window.
    pub fn for_workers(
        cfg: &LoadedConfig,
        store: Option<&SeqStore>,
        now: Duration,
        n: usize,
    ) -> Result<Vec<Engine>> {
        let mut engines = vec![Engine::new(cfg, store, now)?];
        for _ in 1..n {
            engines.push(Engine::new(cfg, None, now)?);
        }
        if n > 1 {
            let (first, rest) = engines.split_at_mut(1);
            first[0].link_workers(rest, None)?;
            for (k, e) in engines.iter_mut().enumerate() {
                e.keep_own_inbound(k, n);
                e.volume_split = n as u64;
                e.worker = k;
                for ci in 0..e.conns.len() {
                    e.refresh_policies(ci);
                }
                let ids: Vec<SaId> = e.sad.iter().map(|(id, _)| id).collect();
                for id in ids {
                    if let Some(sa) = e.sad.get_mut(id) {
                        sa.split_volume_limits(n as u64);
                    }
                }
            }
        }
        Ok(engines)
    }

    /// Removes the inbound SAs that the sockets steer to another of `n`
    /// workers (see [`worker_of`]): each inbound SA, and so its replay
    /// window, lives in exactly one worker's engine.
    pub fn keep_own_inbound(&mut self, worker: usize, n: usize) {
        let foreign: Vec<SaId> = self
            .sad
            .iter()
            .filter(|(id, sa)| {
                self.meta_of(*id).is_some_and(|m| !m.outbound)
                    && worker_of(sa.config().encap, sa.config().spi, n) != worker
            })
            .map(|(id, _)| id)
            .collect();
        for id in foreign {
            self.remove_sa(id);
        }
    }

    /// Makes the outbound SAs of `others` (copies of this engine, with the
    /// same SA ids) take their numbers from this engine's counters and
    /// reservations; only SA `only` when given (after `sa add`).
    pub fn link_workers(&mut self, others: &mut [Engine], only: Option<SaId>) -> Result<()> {
        let mut refs: Vec<&mut Engine> = others.iter_mut().collect();
        self.link_worker_refs(&mut refs, only)
    }

    /// [`Engine::link_workers`] over references (engines behind locks).
    pub fn link_worker_refs(
        &mut self,
        others: &mut [&mut Engine],
        only: Option<SaId>,
    ) -> Result<()> {
        if others.is_empty() {
            // One worker: its SAs keep their own plain counters.
            return Ok(());
        }
        let ids: Vec<SaId> = self
            .sad
            .iter()
            .map(|(id, _)| id)
            .filter(|id| only.is_none_or(|o| o == *id))
            .filter(|id| self.meta_of(*id).is_some_and(|m| m.outbound))
            .collect();
        for id in ids {
            let spi = self.sad.get(id).map(|sa| sa.config().spi);
            let Some(sa) = self.sad.get_mut(id) else {
                continue;
            };
            let seq = sa.share_seq();
            let res = match self
                .reservations
                .get_mut(id.0 as usize)
                .and_then(Option::take)
            {
                Some(Res::Own(r)) => {
                    seq.set_ceiling(r.reserved());
                    Some(Arc::new(Mutex::new(r)))
                }
                Some(Res::Shared { r, .. }) => Some(r),
                None => None,
            };
            if let Some(r) = &res {
                *slot(&mut self.reservations, id) = Some(Res::Shared {
                    r: r.clone(),
                    seq: seq.clone(),
                    low: lock(r).low_water(),
                });
            }
            let (conn, protocol) = match self.meta_of(id) {
                Some(m) => (self.conns[m.conn].conn.name.clone(), m.protocol),
                None => continue,
            };
            for e in others.iter_mut() {
                // Ids differ between engines (each holds only its own
                // inbound SAs): the copy is found by what it is.
                let Some(theirs) = spi.and_then(|spi| e.find_sa(&conn, true, protocol, spi)) else {
                    bail!(
                        "worker engines disagree: outbound SA {:#010x} of \"{conn}\" is missing \
                         in one (internal error)",
                        spi.unwrap_or(0)
                    );
                };
                if let Some(sa) = e.sad.get_mut(theirs) {
                    sa.join_seq(seq.clone());
                }
                *slot(&mut e.reservations, theirs) = res.as_ref().map(|r| Res::Shared {
                    r: r.clone(),
                    seq: seq.clone(),
                    low: lock(r).low_water(),
                });
            }
        }
        Ok(())
    }

    /// The SA of connection `conn` with `spi`, `protocol` and direction.
    pub fn find_sa(
        &self,
        conn: &str,
        outbound: bool,
        protocol: Protocol,
        spi: u32,
    ) -> Option<SaId> {
        self.sad.iter().map(|(id, _)| id).find(|id| {
            self.meta_of(*id).is_some_and(|m| {
                m.outbound == outbound
                    && m.protocol == protocol
                    && self.conns[m.conn].conn.name == conn
            }) && self.sad.get(*id).is_some_and(|sa| sa.config().spi == spi)
        })
    }

    /// On a clean stop: records each outbound SA's exact next sequence
    /// number, so a restart continues without a gap.
    pub fn release_reservations(&mut self) {
        for (i, r) in self.reservations.iter_mut().enumerate() {
            let Some(r) = r else { continue };
            let next = self.sad.get(SaId(i as u32)).map_or(1, Sa::next_seq);
            r.release(next);
        }
    }

    fn meta_of(&self, id: SaId) -> Option<SaMeta> {
        self.meta.get(id.0 as usize).copied().flatten()
    }

    /// True when the SAs just applied (outermost first) are connection
    /// `c`'s inbound bundle: one of its inbound SAs per layer, AH outside.
    fn is_inbound_bundle(&self, c: usize) -> bool {
        let want = layers(self.conns[c].conn.protocol);
        self.applied.len() == want.len()
            && self.applied.iter().zip(want.iter().rev()).all(|(id, p)| {
                self.meta_of(*id)
                    .is_some_and(|m| m.conn == c && !m.outbound && m.protocol == *p)
            })
    }

    /// Points connection `ci`'s policies at its current outbound bundle,
    /// or DISCARD while a layer has no SA (counted as `no_sa`).
    fn refresh_policies(&mut self, ci: usize) {
        let c = &self.conns[ci];
        let action = if c.can_send() {
            if c.conn.per_cpu_sas > 1 && c.out_ids.len() > 1 {
                // Per-CPU SAs: this worker's pair alone.
                Action::Protect(vec![c.out_ids[self.worker % c.out_ids.len()]])
            } else {
                Action::Protect(c.out_ids.clone())
            }
        } else {
            Action::Discard
        };
        for (pi, c) in self.policy_conn.iter().enumerate() {
            if *c == ci {
                self.spd.set_action(pi, action.clone());
            }
        }
    }

    /// "ESP SA 0x00001001".
    fn sa_name(&self, id: SaId) -> String {
        match self.sad.get(id) {
            Some(sa) => format!(
                "{} SA {:#010x}",
                sa.config().protocol.name().to_uppercase(),
                sa.config().spi
            ),
            None => format!("SA #{}", id.0),
        }
    }

    /// Removes SA `id` from the SAD and its connection; an outbound SA's
    /// exact next sequence number is written to its state file first.
    fn remove_sa(&mut self, id: SaId) -> Option<SaMeta> {
        let m = self.meta.get_mut(id.0 as usize)?.take()?;
        if let Some(mut r) = self
            .reservations
            .get_mut(id.0 as usize)
            .and_then(Option::take)
        {
            let next = self.sad.get(id).map_or(1, Sa::next_seq);
            r.release(next);
        }
        self.sad.remove(id);
        let c = &mut self.conns[m.conn];
        c.in_ids.retain(|x| *x != id);
        c.out_ids.retain(|x| *x != id);
        if m.outbound {
            self.refresh_policies(m.conn);
        }
        Some(m)
    }

    fn conn_index(&self, name: &str) -> Result<usize, String> {
        self.conns
            .iter()
            .position(|c| c.conn.name == name)
            .ok_or_else(|| {
                let names: Vec<String> = self
                    .conns
                    .iter()
                    .map(|c| format!("\"{}\"", c.conn.name))
                    .collect();
                format!(
                    "no connection named \"{name}\" (this gateway has {})",
                    names.join(", ")
                )
            })
    }

    /// `espgate sa add --conn NAME --dir in|out SPEC`: installs an SA on a
    /// connection at run time (lost on restart). `spec` is the one-line SA
    /// spec for the keying parts (`spi`, `suite`, `enc`, `integ`, `proto`,
    /// `esn`, `window`, `tfc`, `allow_insecure`, inbound `seq`); mode,
    /// encapsulation, addresses, ports, lifetimes and selectors come from
    /// the connection, and spec keys that contradict it are refused.
    ///
    /// An inbound SA is added next to the connection's others (all are
    /// accepted: make-before-break). An outbound SA replaces the
    /// connection's outbound SA of its protocol for the next packet; it
    /// starts at the sequence number reserved on disk for its key, like a
    /// configured SA. Errors are messages for the operator (no keys).
    pub fn add_sa(
        &mut self,
        conn: &str,
        outbound: bool,
        spec: &str,
        now: Duration,
    ) -> Result<SaChange, String> {
        let ci = self.conn_index(conn)?;
        let parsed =
            espgate_core::sa::spec::parse(spec).map_err(|e| format!("bad SA spec: {e}"))?;
        let given = spec_keys(spec);
        let has = |k: &str| given.iter().any(|(g, _)| *g == k);
        let c = &self.conns[ci].conn;
        let dir = if outbound { "outbound" } else { "inbound" };
        let protocol = if has("proto") {
            parsed.protocol
        } else {
            match c.protocol {
                Protocols::Esp => Protocol::Esp,
                Protocols::Ah => Protocol::Ah,
                Protocols::EspAh => {
                    return Err(format!(
                        "connection \"{}\" is esp+ah: say proto=esp or proto=ah in the spec",
                        c.name
                    ))
                }
            }
        };
        if !layers(c.protocol).contains(&protocol) {
            return Err(format!(
                "proto={}: connection \"{}\" uses {}, not {}",
                protocol.name(),
                c.name,
                c.protocol.name(),
                protocol.name()
            ));
        }
        check_spec_against(c, outbound, protocol, &given, &parsed)?;
        let sas = c.sa_configs();
        let mut sc = if outbound { sas.outbound } else { sas.inbound }
            .into_iter()
            .find(|t| t.protocol == protocol)
            .ok_or_else(|| {
                format!(
                    "connection \"{}\" has no {dir} {} layer",
                    c.name,
                    protocol.name()
                )
            })?;
        sc.spi = parsed.spi;
        sc.suite = parsed.suite;
        sc.enc_key = parsed.enc_key.clone();
        sc.integ_key = parsed.integ_key.clone();
        if has("esn") {
            sc.esn = parsed.esn;
        }
        if has("window") {
            sc.replay_window = parsed.replay_window;
        }
        if has("tfc") {
            sc.tfc_pad_to = parsed.tfc_pad_to;
        }
        if has("allow_insecure") {
            sc.allow_insecure = parsed.allow_insecure;
        }
        if has("seq") {
            sc.initial_seq = parsed.initial_seq;
        }
        self.install_sa(ci, outbound, protocol, sc, true, now)
    }

    /// Installs a child SA negotiated by IKE (`outbound`: it replaces the
    /// connection's outbound SA for the next packet; inbound: accepted
    /// next to the others until removed). Mode, addresses, replay window,
    /// lifetimes and selectors come from the connection, keys, SPI, suite,
    /// ESN and UDP ports from the negotiation. Fresh keys per SA: no
    /// sequence-number reservation on disk is needed to avoid nonce reuse.
    pub fn install_negotiated(
        &mut self,
        s: &espgate_ike::engine::SaInstall,
        now: Duration,
    ) -> Result<SaChange, String> {
        let ci = self.conn_index(&s.conn)?;
        let c = &self.conns[ci].conn;
        let mut sc = SaConfig::new(s.spi, Protocol::Esp, s.suite, &s.enc_key, &s.integ_key);
        let ports = s.encap.unwrap_or((c.local_port, c.remote_port));
        c.shape_sa(&mut sc, c.mode, s.outbound, ports);
        // Negotiated, not configured.
        sc.esn = s.esn;
        sc.allow_insecure = false;
        self.install_sa(ci, s.outbound, Protocol::Esp, sc, false, now)
    }

    /// The common end of `sa add` and IKE installs: checks the SPI and
    /// keys, reserves sequence numbers (`reserve`, manual keys only),
    /// inserts the SA and points the connection's policies at it.
    fn install_sa(
        &mut self,
        ci: usize,
        outbound: bool,
        protocol: Protocol,
        mut sc: SaConfig,
        reserve: bool,
        now: Duration,
    ) -> Result<SaChange, String> {
        let c = &self.conns[ci].conn;
        let dir = if outbound { "outbound" } else { "inbound" };
        let what = format!(
            "{dir} {} SA {:#010x}",
            protocol.name().to_uppercase(),
            sc.spi
        );
        let name = c.name.clone();
        if let Some(other) = self.sad.lookup(protocol, sc.spi) {
            let owner = self
                .meta_of(other)
                .map(|m| {
                    format!(
                        "connection \"{}\"'s {} SA",
                        self.conns[m.conn].conn.name,
                        if m.outbound { "outbound" } else { "inbound" }
                    )
                })
                .unwrap_or_else(|| "another SA".into());
            return Err(format!(
                "{} SPI {:#010x} is already in use ({owner}); SPIs are unique per protocol on a \
                 gateway: pick another one",
                protocol.name().to_uppercase(),
                sc.spi
            ));
        }
        // The suite, key lengths and options, checked before anything is
        // reserved or replaced.
        Sa::new(sc.clone(), now).map_err(|e| format!("{what}: {e}"))?;
        let old = if outbound {
            self.conns[ci]
                .out_ids
                .iter()
                .copied()
                .find(|id| self.meta_of(*id).is_some_and(|m| m.protocol == protocol))
        } else {
            None
        };
        let mut reservation = None;
        if outbound {
            let fp = seqstate::fingerprint(&sc);
            if let Some((id, _)) = self.sad.iter().find(|(id, sa)| {
                self.meta_of(*id).is_some_and(|m| m.outbound)
                    && seqstate::fingerprint(sa.config()) == fp
            }) {
                return Err(format!(
                    "{what}: its keys are those of the {} already in use{}; one key on two SAs \
                     would reuse nonces: generate new keys",
                    self.sa_name(id),
                    if Some(id) == old {
                        ", which it would replace"
                    } else {
                        ""
                    }
                ));
            }
            if let Some(store) = self.store.as_ref().filter(|_| reserve) {
                let (start, r) = store.reserve(&sc, &name).map_err(|e| format!("{e:#}"))?;
                sc.initial_seq = start;
                reservation = Some(Res::Own(r));
            }
        }
        let mut sa = Sa::new(sc, now).map_err(|e| format!("{what}: {e}"))?;
        sa.split_volume_limits(self.volume_split);
        let id = self.sad.insert(sa).map_err(|e| format!("{what}: {e}"))?;
        *slot(&mut self.meta, id) = Some(SaMeta {
            conn: ci,
            outbound,
            protocol,
            added: true,
        });
        *slot(&mut self.reservations, id) = reservation;
        let suite = self
            .sad
            .get(id)
            .map_or(String::new(), |sa| sa.config().suite.name());
        let mut warnings = Vec::new();
        let message = if outbound {
            let replaced = old.map(|o| self.sa_name(o));
            if let Some(o) = old {
                self.remove_sa(o);
            }
            let at = layers(self.conns[ci].conn.protocol)
                .iter()
                .position(|p| *p == protocol)
                .unwrap_or(0)
                .min(self.conns[ci].out_ids.len());
            self.conns[ci].out_ids.insert(at, id);
            self.refresh_policies(ci);
            let next = self.sad.get(id).map_or(1, Sa::next_seq);
            if self.conns[ci].can_send() {
                let overhead: usize = self.conns[ci]
                    .out_ids
                    .iter()
                    .filter_map(|i| self.sad.get(*i))
                    .map(Sa::overhead)
                    .sum();
                if overhead > self.sized_overhead {
                    warnings.push(format!(
                        "connection \"{name}\"'s bundle now adds up to {overhead} bytes per \
                         packet, {} more than the TUN MTU was sized for at start: packets near \
                         the TUN MTU exceed gateway.mtu outside and are fragmented or dropped; \
                         put the keys in the configuration and restart to resize the TUN",
                        overhead - self.sized_overhead
                    ));
                }
            } else {
                warnings.push(self.no_outbound_warning(ci));
            }
            match replaced {
                Some(r) => format!(
                    "connection \"{name}\": {what} ({suite}) replaces {r} for new packets, \
                     starting at sequence number {next}"
                ),
                None => format!(
                    "connection \"{name}\": added {what} ({suite}), starting at sequence number \
                     {next}"
                ),
            }
        } else {
            self.conns[ci].in_ids.push(id);
            let all: Vec<String> = self
                .layer_spis(ci, false, protocol)
                .iter()
                .map(|s| format!("{s:#010x}"))
                .collect();
            format!(
                "connection \"{name}\": added {what} ({suite}); {} inbound SAs accepted now: {}",
                protocol.name().to_uppercase(),
                all.join(", ")
            )
        };
        if reserve {
            tracing::info!("sa add: {message} (run-time change, not in the configuration file)");
        } else {
            tracing::info!("ike: {message}");
        }
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Ok(SaChange { message, warnings })
    }

    /// SPIs of connection `ci`'s SAs of one direction and protocol.
    fn layer_spis(&self, ci: usize, outbound: bool, protocol: Protocol) -> Vec<u32> {
        let c = &self.conns[ci];
        if outbound { &c.out_ids } else { &c.in_ids }
            .iter()
            .filter(|id| self.meta_of(**id).is_some_and(|m| m.protocol == protocol))
            .filter_map(|id| self.sad.get(*id))
            .map(|sa| sa.config().spi)
            .collect()
    }

    fn no_outbound_warning(&self, ci: usize) -> String {
        let name = &self.conns[ci].conn.name;
        format!(
            "connection \"{name}\" has no complete outbound bundle now: its outbound packets are \
             dropped and counted as no_sa until `espgate sa add --conn {name} --dir out` \
             installs the missing SA"
        )
    }

    /// `espgate sa del --spi SPI [--proto esp|ah] [--dir in|out] [--conn
    /// NAME]`: removes an SA (configured or added) at run time. Without
    /// `proto`, the SPI must name one SA. An outbound SA's exact next
    /// sequence number is written to its state file.
    pub fn del_sa(
        &mut self,
        spi: u32,
        protocol: Option<Protocol>,
        outbound: Option<bool>,
        conn: Option<&str>,
    ) -> Result<SaChange, String> {
        if let Some(c) = conn {
            self.conn_index(c)?;
        }
        let found: Vec<SaId> = [Protocol::Esp, Protocol::Ah]
            .into_iter()
            .filter(|p| protocol.is_none_or(|q| q == *p))
            .filter_map(|p| self.sad.lookup(p, spi))
            .collect();
        let id = match found.as_slice() {
            [] => {
                return Err(format!(
                    "no {}SA with SPI {spi:#010x} is installed (`espgate sa list` shows them)",
                    protocol
                        .map(|p| format!("{} ", p.name().to_uppercase()))
                        .unwrap_or_default()
                ))
            }
            [id] => *id,
            _ => {
                return Err(format!(
                    "both an ESP and an AH SA have SPI {spi:#010x}: say --proto esp or --proto ah"
                ))
            }
        };
        let m = self
            .meta_of(id)
            .ok_or_else(|| format!("SPI {spi:#010x}: internal error, SA without a connection"))?;
        let cname = self.conns[m.conn].conn.name.clone();
        let dir = |o: bool| if o { "outbound" } else { "inbound" };
        let what = format!("{} {}", dir(m.outbound), self.sa_name(id));
        if let Some(o) = outbound.filter(|o| *o != m.outbound) {
            return Err(format!(
                "{what} of connection \"{cname}\" is not an {} SA; nothing removed",
                dir(o)
            ));
        }
        if let Some(c) = conn.filter(|c| *c != cname) {
            return Err(format!(
                "{what} belongs to connection \"{cname}\", not \"{c}\"; nothing removed"
            ));
        }
        let (packets, bytes) = self
            .sad
            .get(id)
            .map_or((0, 0), |sa| (sa.stats().packets, sa.stats().bytes));
        self.remove_sa(id);
        let mut warnings = Vec::new();
        if m.outbound {
            if !self.conns[m.conn].can_send() {
                warnings.push(self.no_outbound_warning(m.conn));
            }
        } else if self.layer_spis(m.conn, false, m.protocol).is_empty() {
            warnings.push(format!(
                "connection \"{cname}\" has no inbound {} SA left: its peer's packets are \
                 dropped (unknown_spi) until `espgate sa add --conn {cname} --dir in` installs \
                 one",
                m.protocol.name().to_uppercase()
            ));
        }
        let message = format!(
            "connection \"{cname}\": removed {what} after {packets} packets, {bytes} bytes"
        );
        tracing::info!("sa del: {message} (run-time change, not in the configuration file)");
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Ok(SaChange { message, warnings })
    }

    /// The keys of every installed SA, for `espgate wireshark-keys` (its
    /// own control command: key material leaves the daemon only there).
    pub fn sa_keys(&self) -> Vec<SaKeys> {
        let mut out = Vec::new();
        for (ci, c) in self.conns.iter().enumerate() {
            for id in c.in_ids.iter().chain(&c.out_ids) {
                let (Some(sa), Some(m)) = (self.sad.get(*id), self.meta_of(*id)) else {
                    continue;
                };
                debug_assert_eq!(m.conn, ci);
                let k = &c.conn;
                let cfg = sa.config();
                let (src, dst) = if m.outbound {
                    (k.local, k.remote)
                } else {
                    (k.remote, k.local)
                };
                let ports = match cfg.encap {
                    Encap::Udp { src_port, dst_port } => Some((src_port, dst_port)),
                    Encap::None => None,
                };
                out.push(SaKeys {
                    connection: k.name.clone(),
                    direction: if m.outbound { "out" } else { "in" }.into(),
                    protocol: cfg.protocol.name().into(),
                    spi: cfg.spi,
                    suite: cfg.suite.name(),
                    mode: mode_name(cfg.mode).into(),
                    src: src.to_string(),
                    dst: dst.to_string(),
                    sport: ports.map(|p| p.0),
                    dport: ports.map(|p| p.1),
                    esn: cfg.esn,
                    enc_key: hex::encode(&cfg.enc_key[..]),
                    integ_key: hex::encode(&cfg.integ_key[..]),
                });
            }
        }
        out
    }

    /// Drops by reason, core and daemon, non-zero only.
    pub fn drops(&self) -> BTreeMap<String, u64> {
        DropReason::ALL
            .iter()
            .map(|d| (d.as_str(), self.counters.drops[d.index()]))
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.to_string(), n))
            .collect()
    }

    /// The other counters (all of them, zero or not).
    pub fn counter_map(&self) -> BTreeMap<String, u64> {
        let c = &self.counters;
        [
            ("tun_rx", c.tun_rx),
            ("tun_tx", c.tun_tx),
            ("net_rx", c.net_rx),
            ("net_tx", c.net_tx),
            ("keepalives", c.keepalives),
            ("ike", c.ike),
            ("dummies", c.dummies),
            ("not_unicast", c.not_unicast),
            ("mss_clamped", c.mss_clamped),
            ("keepalives_sent", c.keepalives_sent),
            ("gso_sends", c.gso_sends),
            ("gro_reads", c.gro_reads),
            ("tso_reads", c.tso_reads),
            ("tun_gso_writes", c.tun_gso_writes),
            ("hot_path_allocs", crate::alloc_count::hot_allocs()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn sa_status(&self, id: SaId, now: Duration) -> Option<SaStatus> {
        let sa = self.sad.get(id)?;
        let m = self.meta.get(id.0 as usize).copied().flatten()?;
        let cfg = sa.config();
        let st = sa.stats();
        let life = sa.lifetime();
        let l = life.limits();
        let age = now.saturating_sub(life.created());
        let left = |b: Option<u64>, p: Option<u64>, t: Option<Duration>| Left {
            bytes: b.map(|b| b.saturating_sub(life.bytes)),
            packets: p.map(|p| p.saturating_sub(life.packets)),
            secs: t.map(|t| t.saturating_sub(age).as_secs()),
        };
        let soft_reached = l.soft_bytes.is_some_and(|b| life.bytes >= b)
            || l.soft_packets.is_some_and(|p| life.packets >= p)
            || l.soft_time.is_some_and(|t| age >= t);
        let state = if life.is_hard_expired() {
            "hard_expired"
        } else if soft_reached {
            "soft_expired"
        } else {
            "ok"
        };
        let reserved = self
            .reservations
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .map(Res::reserved);
        Some(SaStatus {
            connection: self.conns[m.conn].conn.name.clone(),
            direction: if m.outbound { "out" } else { "in" }.into(),
            added: m.added,
            spi: format!("{:#010x}", cfg.spi),
            protocol: cfg.protocol.name().into(),
            suite: cfg.suite.name().to_string(),
            mode: mode_name(cfg.mode).into(),
            encap: encap_name(cfg.encap).into(),
            esn: cfg.esn,
            packets: st.packets,
            bytes: st.bytes,
            dummies: st.dummies,
            drops: DropReason::PER_SA
                .iter()
                .filter(|d| st.drops_for(**d) > 0)
                .map(|d| (d.as_str().to_string(), st.drops_for(*d)))
                .collect(),
            next_seq: m.outbound.then(|| sa.next_seq()),
            seq_reserved: if m.outbound { reserved } else { None },
            highest_seq: (!m.outbound).then(|| sa.replay_top()),
            lifetime: LifetimeStatus {
                state: state.into(),
                soft_left: left(l.soft_bytes, l.soft_packets, l.soft_time),
                hard_left: left(l.hard_bytes, l.hard_packets, l.hard_time),
            },
        })
    }

    /// Every SA: per connection, inbound then outbound.
    pub fn sa_list(&self, now: Duration) -> Vec<SaStatus> {
        self.connection_status(now)
            .into_iter()
            .flat_map(|c| c.sas)
            .collect()
    }

    /// Per connection, with its SAs.
    pub fn connection_status(&self, now: Duration) -> Vec<ConnectionStatus> {
        self.conns
            .iter()
            .map(|c| {
                let k = &c.conn;
                let remote = match k.encap {
                    Encapsulation::Udp => {
                        std::net::SocketAddr::new(k.remote, k.remote_port).to_string()
                    }
                    Encapsulation::None => k.remote.to_string(),
                };
                ConnectionStatus {
                    name: k.name.clone(),
                    mode: mode_name(k.mode).into(),
                    protocol: k.protocol.name().into(),
                    encap: k.encap.name().into(),
                    local: k.local.to_string(),
                    remote,
                    local_ts: k.local_ts.iter().map(|p| p.to_string()).collect(),
                    remote_ts: k.remote_ts.iter().map(|p| p.to_string()).collect(),
                    sas: c
                        .in_ids
                        .iter()
                        .chain(&c.out_ids)
                        .filter_map(|id| self.sa_status(*id, now))
                        .collect(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_config as config;
    use espgate_core::wire::{ip, ipv4, proto, udp};
    use std::net::Ipv4Addr;
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const K_AB: &str = "000102030405060708090a0b0c0d0e0f10111213";
    const K_BA: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3";
    const I_AB: &str = "0001020304050607080900010203040506070809000102030405060708090001";
    const I_BA: &str = "1011121314151617181910111213141516171819101112131415161718191011";

    fn temp_dir() -> std::path::PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "espgate-engine-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Mirrored configurations for sites A (10.1/16) and B (10.2/16).
    fn pair(protocol: &str, encap: &str) -> (LoadedConfig, LoadedConfig) {
        let side = |a: bool| {
            let (local, remote, lts, rts) = if a {
                ("192.0.2.1", "192.0.2.2", "10.1.0.0/16", "10.2.0.0/16")
            } else {
                ("192.0.2.2", "192.0.2.1", "10.2.0.0/16", "10.1.0.0/16")
            };
            let (si, so, ki, ko, ii, io) = if a {
                (0x1001, 0x1002, K_BA, K_AB, I_BA, I_AB)
            } else {
                (0x1002, 0x1001, K_AB, K_BA, I_AB, I_BA)
            };
            let mut s = format!(
                "[gateway]\nencap = \"{encap}\"\n[[connection]]\nname = \"peer\"\n\
                 local = \"{local}\"\nremote = \"{remote}\"\nprotocol = \"{protocol}\"\n\
                 local_ts = [\"{lts}\"]\nremote_ts = [\"{rts}\"]\n"
            );
            if protocol.contains("esp") {
                s += &format!(
                    "[connection.esp]\nsuite = \"aes128gcm16\"\nspi_in = {si}\nspi_out = {so}\n\
                     enc_in = \"{ki}\"\nenc_out = \"{ko}\"\n"
                );
            }
            if protocol.contains("ah") {
                s += &format!(
                    "[connection.ah]\nsuite = \"sha256\"\nspi_in = {}\nspi_out = {}\n\
                     integ_in = \"{ii}\"\ninteg_out = \"{io}\"\n",
                    si + 0x100,
                    so + 0x100
                );
            }
            config::parse(&s, Path::new("/nonexistent"), "t.toml").unwrap_or_else(|e| panic!("{e}"))
        };
        (side(true), side(false))
    }

    fn packet(src: &str, dst: &str, n: usize) -> Vec<u8> {
        let mut p = vec![0u8; 28 + n];
        ipv4::Ipv4Repr {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: proto::UDP,
            tos: 0,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            payload_len: 8 + n,
        }
        .emit(&mut p)
        .unwrap();
        udp::emit(&mut p[20..], 1000, 2000, n).unwrap();
        p
    }

    const T: Duration = Duration::from_secs(1);

    #[test]
    fn tunnel_round_trip_every_protocol() {
        for (protocol, encap) in [
            ("esp", "udp"),
            ("esp", "none"),
            ("ah", "none"),
            ("esp+ah", "none"),
        ] {
            let (ca, cb) = pair(protocol, encap);
            let mut a = Engine::new(&ca, None, T).unwrap();
            let mut b = Engine::new(&cb, None, T).unwrap();
            let clear = packet("10.1.0.5", "10.2.0.9", 100);
            let mut buf = PacketBuf::with_capacity(2000);
            buf.load(&clear);
            let conn = a.outbound(&mut buf, T).expect("sent");
            assert_eq!(conn, 0);
            let outer = ip::parse(buf.as_slice()).unwrap();
            assert_eq!(outer.src, "192.0.2.1".parse::<IpAddr>().unwrap());
            assert!(buf.len() - clear.len() <= a.max_overhead(), "{protocol}");
            assert!(
                b.inbound(&mut buf, T, outer.src),
                "{protocol}/{encap}: {:?}",
                b.drops()
            );
            assert_eq!(buf.as_slice(), &clear[..]);
            let st = b.connection_status(T);
            let sas = &st[0].sas;
            assert!(sas
                .iter()
                .filter(|s| s.direction == "in")
                .all(|s| s.packets == 1));
            assert!(b.drops().is_empty());
            let out = a.sa_list(T);
            assert!(out
                .iter()
                .filter(|s| s.direction == "out")
                .all(|s| s.next_seq == Some(2)));
        }
    }

    #[test]
    fn drops_are_counted_by_reason() {
        let (ca, cb) = pair("esp", "udp");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        let mut buf = PacketBuf::with_capacity(2000);
        // No policy: outside the selectors.
        buf.load(&packet("10.1.0.5", "10.3.0.9", 10));
        assert_eq!(a.outbound(&mut buf, T), None);
        // Multicast and link-local: counted apart, not as drops.
        buf.load(&packet("10.1.0.5", "224.0.0.22", 10));
        assert_eq!(a.outbound(&mut buf, T), None);
        assert_eq!(a.counters.not_unicast, 1);
        assert_eq!(a.drops().get("no_policy"), Some(&1));
        assert_eq!(a.drops().len(), 1);
        // Replay.
        buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
        a.outbound(&mut buf, T).unwrap();
        let wire = buf.as_slice().to_vec();
        let from: IpAddr = Ipv4Addr::new(192, 0, 2, 1).into();
        assert!(b.inbound(&mut buf, T, from));
        buf.load(&wire);
        assert!(!b.inbound(&mut buf, T, from));
        // ICV failure, with the next packet.
        buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
        a.outbound(&mut buf, T).unwrap();
        let n = buf.len();
        buf.as_mut_slice()[n - 3] ^= 1;
        assert!(!b.inbound(&mut buf, T, from));
        let d = b.drops();
        assert_eq!(
            (d.get("replay"), d.get("icv_failure")),
            (Some(&1), Some(&1))
        );
        let inbound = &b.sa_list(T)[0];
        assert_eq!(inbound.direction, "in");
        assert_eq!(inbound.drops.get("replay"), Some(&1));
        assert_eq!(inbound.highest_seq, Some(1));
        b.tick(T * 3);
    }

    #[test]
    fn an_incomplete_bundle_is_refused() {
        // B expects AH around ESP; A's ESP SA alone (same keys) must not pass.
        let (ca, cb) = pair("esp+ah", "none");
        let (ca_esp, _) = pair("esp", "none");
        let mut a = Engine::new(&ca_esp, None, T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
        a.outbound(&mut buf, T).unwrap();
        assert!(!b.inbound(&mut buf, T, "192.0.2.1".parse().unwrap()));
        assert_eq!(b.drops().get("policy_mismatch"), Some(&1));
        drop(ca);
    }

    #[test]
    fn sequence_numbers_continue_across_engines() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let (ca, cb) = pair("esp", "udp");
        let mut b = Engine::new(&cb, None, T).unwrap();
        let mut buf = PacketBuf::with_capacity(2000);
        let send = |a: &mut Engine, b: &mut Engine, buf: &mut PacketBuf| {
            buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
            a.outbound(buf, T).unwrap();
            b.inbound(buf, T, "192.0.2.1".parse().unwrap())
        };
        let mut a = Engine::new(&ca, Some(&store), T).unwrap();
        for _ in 0..5 {
            assert!(send(&mut a, &mut b, &mut buf));
        }
        // A second engine on the same key is refused while A runs.
        assert!(Engine::new(&ca, Some(&store), T).is_err());
        // Clean stop: the restarted A continues at 6, and B (not
        // restarted) accepts it.
        a.release_reservations();
        drop(a);
        let mut a = Engine::new(&ca, Some(&store), T).unwrap();
        assert_eq!(a.sa_list(T)[1].next_seq, Some(6));
        assert!(send(&mut a, &mut b, &mut buf));
        // Crash (no release): the restart jumps past the reservation.
        let reserved = a.sa_list(T)[1].seq_reserved.unwrap();
        drop(a);
        let mut a = Engine::new(&ca, Some(&store), T).unwrap();
        let next = a.sa_list(T)[1].next_seq.unwrap();
        assert_eq!(next, reserved);
        assert!(next > 6);
        assert!(send(&mut a, &mut b, &mut buf));
        assert_eq!(b.sa_list(T)[0].highest_seq, Some(next));
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tcp_syns_are_clamped_both_ways() {
        let (ca, cb) = pair("esp", "udp");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        let tun_mtu = a.tun_mtu(ca.gateway.mtu);
        assert_eq!(tun_mtu as usize, 1500 - a.max_overhead());
        // A SYN with MSS 1460 from 10.1.0.5 to 10.2.0.9 (its checksum is
        // not checked here; mss.rs tests that).
        let mut syn = vec![0u8; 20];
        ipv4::Ipv4Repr {
            src: "10.1.0.5".parse().unwrap(),
            dst: "10.2.0.9".parse().unwrap(),
            protocol: proto::TCP,
            tos: 0,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            payload_len: 24,
        }
        .emit(&mut syn)
        .unwrap();
        let mut tcp = [0u8; 24];
        tcp[12] = 6 << 4; // 24-byte header
        tcp[13] = 0x02; // SYN
        tcp[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]);
        syn.extend_from_slice(&tcp);
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&syn);
        a.outbound(&mut buf, T).unwrap();
        assert!(b.inbound(&mut buf, T, "192.0.2.1".parse().unwrap()));
        let mss = u16::from_be_bytes([buf.as_slice()[42], buf.as_slice()[43]]);
        assert_eq!(u32::from(mss), tun_mtu - 40);
        assert_eq!(a.counters.mss_clamped, 1);
        assert_eq!(b.counters.mss_clamped, 0, "already clamped by A");
        assert_eq!(a.counter_map()["mss_clamped"], 1);
    }

    #[test]
    fn hard_lifetime_stops_the_sa_and_shows_in_status() {
        let (mut ca, _) = pair("esp", "udp");
        for c in &mut ca.connections {
            c.lifetime.hard_packets = Some(3);
            c.lifetime.soft_packets = Some(2);
        }
        let mut a = Engine::new(&ca, None, T).unwrap();
        let mut buf = PacketBuf::with_capacity(2000);
        let mut sent = 0;
        for _ in 0..5 {
            buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
            if a.outbound(&mut buf, T).is_some() {
                sent += 1;
            }
        }
        assert_eq!(sent, 3);
        assert_eq!(a.drops().get("sa_expired"), Some(&2));
        let out = &a.sa_list(T)[1];
        assert_eq!(out.lifetime.state, "hard_expired");
        assert_eq!(out.lifetime.hard_left.packets, Some(0));
        assert_eq!(out.drops.get("sa_expired"), Some(&2));
        let inbound = &a.sa_list(T)[0];
        assert_eq!(inbound.lifetime.state, "ok");
        assert_eq!(inbound.lifetime.soft_left.packets, Some(2));
        // The events (soft, then hard) are drained and logged by tick.
        a.tick(T * 2);
        let sa = a.sad.get(a.conns[0].out_ids[0]).unwrap();
        assert!(sa.lifetime().is_hard_expired());
    }

    const K_NEW_AB: &str = "5051525354555657585950515253545556575859";

    #[test]
    fn cost_accounting_counts_each_stage_and_switches_at_run_time() {
        let (ca, cb) = pair("esp", "udp");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        assert!(a.costs_report().is_none() && a.cost_clock().is_none());
        assert!(send_one(&mut a, &mut b));
        let ask = |e: &mut Engine, action: &str| {
            let mut r = Request::new("costs");
            r.action = Some(action.into());
            let v: serde_json::Value = serde_json::from_str(&admin_answer(e, T, &r)).unwrap();
            (
                v["ok"] == true,
                v["message"]
                    .as_str()
                    .or(v["error"].as_str())
                    .unwrap_or("")
                    .to_string(),
            )
        };
        let (ok, msg) = ask(&mut b, "reset");
        assert!(!ok && msg.contains("off"), "{msg}");
        for e in [&mut a, &mut b] {
            let (ok, msg) = ask(e, "on");
            assert!(ok && msg.starts_with("cost accounting on"), "{msg}");
        }
        for _ in 0..3 {
            assert!(send_one(&mut a, &mut b));
        }
        // A replay stops inbound at the replay check.
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
        a.outbound(&mut buf, T).unwrap();
        let wire = buf.as_slice().to_vec();
        assert!(b.inbound(&mut buf, T, "192.0.2.1".parse().unwrap()));
        buf.load(&wire);
        assert!(!b.inbound(&mut buf, T, "192.0.2.1".parse().unwrap()));
        let out = a.costs_report().unwrap().outbound;
        assert_eq!(out.packets, 4);
        for s in [Stage::Lookup, Stage::Replay, Stage::Encap, Stage::Cipher] {
            assert_eq!(out.stage(s).packets, 4, "{s:?}");
        }
        // AEAD: no separate integrity; no I/O here.
        assert_eq!(out.stage(Stage::Integrity).packets, 0);
        assert_eq!(out.stage(Stage::Send).packets, 0);
        let inb = b.costs_report().unwrap().inbound;
        assert_eq!(inb.packets, 5);
        assert_eq!(inb.stage(Stage::Replay).packets, 5);
        for s in [Stage::Lookup, Stage::Cipher, Stage::Decap] {
            // Lookup counts the replayed packet too (SAD lookup before the check).
            let want = if s == Stage::Lookup { 5 } else { 4 };
            assert_eq!(inb.stage(s).packets, want, "{s:?}");
        }
        assert_eq!(b.costs_report().unwrap().outbound.packets, 0);
        // I/O stages are charged by the data plane through these calls.
        let t = a.cost_clock();
        assert!(t.is_some());
        a.cost_sent(t, Dir::Outbound, 3);
        a.cost_received(t, Dir::Outbound);
        let out = a.costs_report().unwrap().outbound;
        assert_eq!(out.stage(Stage::Send).packets, 3);
        assert_eq!(out.stage(Stage::Receive).packets, 4);
        let (ok, msg) = ask(&mut a, "on");
        assert!(ok && msg.contains("already on"), "{msg}");
        assert_eq!(
            a.costs_report().unwrap().outbound.packets,
            4,
            "on keeps the counts"
        );
        assert!(ask(&mut a, "reset").0);
        assert_eq!(a.costs_report().unwrap().outbound.packets, 0);
        assert!(ask(&mut a, "off").0);
        assert!(a.costs_report().is_none() && a.cost_clock().is_none());
        // Off: the I/O calls are no-ops, and packets still flow.
        a.cost_sent(t, Dir::Outbound, 1);
        assert!(send_one(&mut a, &mut b));
        let (ok, msg) = ask(&mut a, "sideways");
        assert!(!ok && msg.contains("on, off or reset"), "{msg}");
        // gateway.cost_accounting = true starts with accounting on.
        let mut on = ca;
        on.gateway.cost_accounting = true;
        assert!(Engine::new(&on, None, T).unwrap().costs_report().is_some());
    }

    #[test]
    fn worker_engines_share_outbound_numbers_and_split_inbound_sas() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let (ca, cb) = pair("esp", "udp");
        let mut b = Engine::new(&cb, None, T).unwrap();
        let mut ws = Engine::for_workers(&ca, Some(&store), T, 2).unwrap();
        // A's inbound SA 0x1001 is steered to worker 1 (0x1001 % 2) and
        // lives there only; both hold the outbound SA 0x1002.
        let spis = |e: &Engine, dir: &str| -> Vec<String> {
            e.sa_list(T)
                .into_iter()
                .filter(|s| s.direction == dir)
                .map(|s| s.spi)
                .collect()
        };
        assert!(spis(&ws[0], "in").is_empty());
        assert_eq!(spis(&ws[1], "in"), ["0x00001001"]);
        for w in &ws {
            assert_eq!(spis(w, "out"), ["0x00001002"]);
        }
        assert_eq!(worker_of(Encap::NAT_T, 0x1001, 2), 1);
        assert_eq!(worker_of(Encap::None, 0x1001, 2), 0);
        // Packets sent alternately by both workers: the receiver accepts
        // every one (a reused number would be a replay drop).
        for i in 0..10 {
            assert!(send_one(&mut ws[i % 2], &mut b), "packet {i}");
        }
        assert_eq!(b.sa_list(T)[0].highest_seq, Some(10));
        assert_eq!(b.counters.drops.iter().sum::<u64>(), 0);
        for w in &ws {
            assert_eq!(
                w.sa_list(T)
                    .iter()
                    .find(|s| s.direction == "out")
                    .unwrap()
                    .next_seq,
                Some(11)
            );
        }
        // The reservation on disk is shared: a restart after a clean stop
        // continues at 11.
        for w in &mut ws {
            w.release_reservations();
        }
        drop(ws);
        let a = Engine::new(&ca, Some(&store), T).unwrap();
        assert_eq!(a.sa_list(T)[1].next_seq, Some(11));
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn per_cpu_sas_give_each_worker_its_own_pair() {
        let (mut ca, mut cb) = pair("esp", "udp");
        ca.connections[0].per_cpu_sas = 2;
        cb.connections[0].per_cpu_sas = 2;
        // SPI ranges of two pairs each that do not overlap: A sends on
        // 0x2000, 0x2001 and receives on 0x1001, 0x1002.
        ca.connections[0].esp.as_mut().unwrap().spi_out = 0x2000;
        cb.connections[0].esp.as_mut().unwrap().spi_in = 0x2000;
        let mut aw = Engine::for_workers(&ca, None, T, 2).unwrap();
        let mut bw = Engine::for_workers(&cb, None, T, 2).unwrap();
        // Worker w of A sends on 0x2000 + w; B receives 0x2000 + w on
        // worker (0x2000 + w) % 2 = w, with its own key.
        for (w, a) in aw.iter_mut().enumerate() {
            let mut buf = PacketBuf::with_capacity(2000);
            buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
            assert!(a.outbound(&mut buf, T).is_some(), "{:?}", a.drops());
            let wire = buf.as_slice().to_vec();
            let spi = u32::from_be_bytes(wire[28..32].try_into().unwrap());
            assert_eq!(spi, 0x2000 + w as u32);
            assert!(bw[w].inbound(&mut buf, T, "192.0.2.1".parse().unwrap()));
            // The other worker of B does not hold that SA.
            buf.load(&wire);
            assert!(!bw[1 - w].inbound(&mut buf, T, "192.0.2.1".parse().unwrap()));
        }
        let outs: Vec<Option<u64>> = aw[0]
            .sa_list(T)
            .into_iter()
            .filter(|s| s.direction == "out")
            .map(|s| s.next_seq)
            .collect();
        // Each pair's counter moved once.
        assert_eq!(outs, [Some(2), Some(2)]);
        // Pair 1's keys differ from pair 0's.
        let keys = aw[0].sa_keys();
        assert_eq!(
            keys.len(),
            3,
            "two outbound copies, one inbound on worker 0"
        );
        assert_ne!(
            espgate_config::per_cpu_key(&[7u8; 20], 1).to_vec(),
            espgate_config::per_cpu_key(&[7u8; 20], 0).to_vec()
        );
    }

    fn send_one(a: &mut Engine, b: &mut Engine) -> bool {
        let mut buf = PacketBuf::with_capacity(2000);
        buf.load(&packet("10.1.0.5", "10.2.0.9", 10));
        if a.outbound(&mut buf, T).is_none() {
            return false;
        }
        b.inbound(&mut buf, T, "192.0.2.1".parse().unwrap())
    }

    fn spis(e: &Engine, dir: &str) -> Vec<String> {
        e.sa_list(T)
            .into_iter()
            .filter(|s| s.direction == dir)
            .map(|s| s.spi)
            .collect()
    }

    #[test]
    fn manual_rekey_make_before_break() {
        let (ca, cb) = pair("esp", "udp");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        assert!(send_one(&mut a, &mut b));
        // A packet A sent on the old SA, still in flight during the rekey.
        let mut in_flight = PacketBuf::with_capacity(2000);
        in_flight.load(&packet("10.1.0.5", "10.2.0.9", 10));
        a.outbound(&mut in_flight, T).unwrap();
        // B accepts a second inbound SA next to the first.
        let spec = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
        let ch = b.add_sa("peer", false, &spec, T).unwrap();
        assert!(ch.message.contains("0x00001002, 0x00003001"), "{ch:?}");
        assert!(ch.warnings.is_empty());
        assert_eq!(spis(&b, "in"), ["0x00001002", "0x00003001"]);
        // A switches its outbound SA: the old one is gone.
        let ch = a.add_sa("peer", true, &spec, T).unwrap();
        assert!(ch.message.contains("replaces ESP SA 0x00001002"), "{ch:?}");
        assert_eq!(spis(&a, "out"), ["0x00003001"]);
        assert!(a.sad().lookup(Protocol::Esp, 0x1002).is_none());
        let out = a.sa_list(T).into_iter().find(|s| s.direction == "out");
        let out = out.unwrap();
        assert!(out.added);
        assert_eq!(out.next_seq, Some(1));
        // Both the new SA and the old one (the packet in flight) pass.
        assert!(send_one(&mut a, &mut b), "{:?}", b.drops());
        assert!(b.inbound(&mut in_flight, T, "192.0.2.1".parse().unwrap()));
        let inb: Vec<(String, u64, bool)> = b
            .sa_list(T)
            .into_iter()
            .filter(|s| s.direction == "in")
            .map(|s| (s.spi, s.packets, s.added))
            .collect();
        assert_eq!(
            inb,
            [
                ("0x00001002".to_string(), 2, false),
                ("0x00003001".to_string(), 1, true)
            ]
        );
        assert!(b.drops().is_empty(), "{:?}", b.drops());
        // Break: B removes the old inbound SA; its packets are unknown now.
        let ch = b.del_sa(0x1002, None, Some(false), Some("peer")).unwrap();
        assert!(ch
            .message
            .contains("removed inbound ESP SA 0x00001002 after 2 packets"));
        assert!(ch.warnings.is_empty());
        assert_eq!(spis(&b, "in"), ["0x00003001"]);
        assert!(send_one(&mut a, &mut b));
        // The other direction is untouched.
        assert_eq!(spis(&b, "out"), ["0x00001001"]);
    }

    #[test]
    fn a_connection_without_outbound_sa_counts_its_drops() {
        let (ca, cb) = pair("esp", "udp");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        let ch = a.del_sa(0x1002, Some(Protocol::Esp), None, None).unwrap();
        assert!(ch.warnings[0].contains("no_sa"), "{ch:?}");
        assert!(spis(&a, "out").is_empty());
        for _ in 0..3 {
            assert!(!send_one(&mut a, &mut b));
        }
        assert_eq!(a.drops().get("no_sa"), Some(&3));
        assert_eq!(a.drops().len(), 1, "{:?}", a.drops());
        // A new outbound SA (B accepts it first) restores the traffic.
        let spec = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
        b.add_sa("peer", false, &spec, T).unwrap();
        let ch = a.add_sa("peer", true, &spec, T).unwrap();
        assert!(
            ch.message.contains("added outbound ESP SA 0x00003001"),
            "{ch:?}"
        );
        assert!(send_one(&mut a, &mut b));
        // The last inbound SA removed: a warning, and unknown_spi drops.
        b.del_sa(0x1002, None, None, None).unwrap();
        let ch = b.del_sa(0x3001, None, None, None).unwrap();
        assert!(ch.warnings[0].contains("no inbound ESP SA left"), "{ch:?}");
        assert!(!send_one(&mut a, &mut b));
        assert_eq!(b.drops().get("unknown_spi"), Some(&1));
    }

    #[test]
    fn bad_sa_changes_are_refused_with_clear_errors() {
        let (ca, _) = pair("esp", "udp");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let before = a.sa_list(T);
        let good = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
        let err = |a: &mut Engine, conn: &str, out: bool, spec: &str| {
            a.add_sa(conn, out, spec, T).unwrap_err()
        };
        let e = err(&mut a, "nope", false, &good);
        assert!(
            e.contains("no connection named \"nope\"") && e.contains("\"peer\""),
            "{e}"
        );
        // The SPI of an installed SA, either direction.
        let e = err(&mut a, "peer", false, &good.replace("0x3001", "0x1001"));
        assert!(
            e.contains("SPI 0x00001001 is already in use") && e.contains("inbound"),
            "{e}"
        );
        let e = err(&mut a, "peer", true, &good.replace("0x3001", "0x1002"));
        assert!(
            e.contains("already in use") && e.contains("outbound"),
            "{e}"
        );
        let e = err(
            &mut a,
            "peer",
            false,
            "spi=0x3001,suite=aes128gcm16,enc=abc",
        );
        assert!(e.starts_with("bad SA spec: enc:"), "{e}");
        let e = err(
            &mut a,
            "peer",
            false,
            "spi=0x3001,suite=aes128gcm16,enc=0011",
        );
        assert!(e.contains("key must be 20 bytes"), "{e}");
        let e = err(&mut a, "peer", false, &format!("{good},mode=transport"));
        assert!(
            e.starts_with("mode=transport: connection \"peer\" is in tunnel mode"),
            "{e}"
        );
        let e = err(&mut a, "peer", false, &format!("{good},encap=none"));
        assert!(e.contains("uses encap udp"), "{e}");
        let e = err(
            &mut a,
            "peer",
            true,
            &format!("{good},src=192.0.2.2,dst=192.0.2.1"),
        );
        assert!(e.contains("go from 192.0.2.1 to 192.0.2.2"), "{e}");
        let e = err(&mut a, "peer", true, &format!("{good},dport=4501"));
        assert!(e.contains("UDP ports 4500 -> 4500"), "{e}");
        let e = err(&mut a, "peer", true, &format!("{good},seq=5"));
        assert!(e.contains("reserved on disk"), "{e}");
        let e = err(&mut a, "peer", false, &format!("{good},proto=ah"));
        assert!(e.contains("uses esp, not ah"), "{e}");
        // The outbound key in use, under another SPI: nonces would repeat.
        let e = err(
            &mut a,
            "peer",
            true,
            &format!("spi=0x3001,suite=aes128gcm16,enc={K_AB}"),
        );
        assert!(
            e.contains("which it would replace") && e.contains("new keys"),
            "{e}"
        );
        // Nothing changed.
        assert_eq!(a.sa_list(T), before);
        // Keys equal to the connection's are accepted.
        a.add_sa(
            "peer",
            false,
            &format!("{good},encap=udp,mode=tunnel,src=192.0.2.2,dst=192.0.2.1,sport=4500"),
            T,
        )
        .unwrap();
        assert_eq!(a.sa_list(T).len(), 3);
        // sa del errors.
        let e = a.del_sa(0x4444, None, None, None).unwrap_err();
        assert!(e.contains("no SA with SPI 0x00004444"), "{e}");
        let e = a.del_sa(0x1001, None, Some(true), None).unwrap_err();
        assert!(e.contains("is not an outbound SA"), "{e}");
        let e = a.del_sa(0x1002, None, None, Some("other")).unwrap_err();
        assert!(e.contains("no connection named \"other\""), "{e}");
        let e = a
            .del_sa(0x1002, Some(Protocol::Ah), None, None)
            .unwrap_err();
        assert!(e.contains("no AH SA with SPI"), "{e}");
        assert_eq!(a.sa_list(T).len(), 3);
    }

    #[test]
    fn bundles_accept_any_inbound_sa_per_layer() {
        let (ca, cb) = pair("esp+ah", "none");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        let esp = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
        let e = b.add_sa("peer", false, &esp, T).unwrap_err();
        assert!(e.contains("say proto=esp or proto=ah"), "{e}");
        b.add_sa("peer", false, &format!("{esp},proto=esp"), T)
            .unwrap();
        a.add_sa("peer", true, &format!("{esp},proto=esp"), T)
            .unwrap();
        // New ESP inside the old AH.
        assert!(send_one(&mut a, &mut b), "{:?}", b.drops());
        // Then a new AH too.
        let ah = format!("spi=0x3101,suite=sha256,integ={I_BA},proto=ah");
        b.add_sa("peer", false, &ah, T).unwrap();
        a.add_sa("peer", true, &ah, T).unwrap();
        assert_eq!(spis(&a, "out"), ["0x00003001", "0x00003101"]);
        assert!(send_one(&mut a, &mut b), "{:?}", b.drops());
        // Without its AH layer, A sends nothing (no_sa), never ESP alone.
        a.del_sa(0x3101, None, None, None).unwrap();
        assert!(!send_one(&mut a, &mut b));
        assert_eq!(a.drops().get("no_sa"), Some(&1));
        // A B-side SA (outbound at B) on an inbound packet is a mismatch.
        let (ca_esp, _) = pair("esp", "none");
        let mut lone = Engine::new(&ca_esp, None, T).unwrap();
        assert!(!send_one(&mut lone, &mut b));
        assert_eq!(b.drops().get("policy_mismatch"), Some(&1));
    }

    #[test]
    fn added_outbound_sas_reserve_sequence_numbers_on_disk() {
        let dir = temp_dir();
        let store = SeqStore::open(&dir).unwrap();
        let (ca, cb) = pair("esp", "udp");
        let mut a = Engine::new(&ca, Some(&store), T).unwrap();
        let mut b = Engine::new(&cb, None, T).unwrap();
        let spec = format!("spi=0x3001,suite=aes128gcm16,enc={K_NEW_AB}");
        b.add_sa("peer", false, &spec, T).unwrap();
        a.add_sa("peer", true, &spec, T).unwrap();
        let out = |a: &Engine| {
            a.sa_list(T)
                .into_iter()
                .find(|s| s.direction == "out")
                .unwrap()
        };
        assert_eq!(out(&a).next_seq, Some(1));
        assert!(out(&a).seq_reserved.unwrap() > 1);
        for _ in 0..3 {
            assert!(send_one(&mut a, &mut b));
        }
        // Removed, then added again: the key continues where it stopped
        // (the state file says 4), it never starts over at 1.
        a.del_sa(0x3001, None, None, None).unwrap();
        let ch = a.add_sa("peer", true, &spec, T).unwrap();
        assert!(
            ch.message.contains("starting at sequence number 4"),
            "{ch:?}"
        );
        assert!(send_one(&mut a, &mut b));
        // Replacing the configured SA released its reservation (next = 1,
        // nothing sent on it), so that key continues exactly too.
        let old = format!("spi=0x1002,suite=aes128gcm16,enc={K_AB}");
        let ch = a.add_sa("peer", true, &old, T).unwrap();
        assert!(
            ch.message.contains("starting at sequence number 1"),
            "{ch:?}"
        );
        a.release_reservations();
        drop(a);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn control_answers_and_keys() {
        let (ca, _) = pair("esp", "udp");
        let mut a = Engine::new(&ca, None, T).unwrap();
        let ask = |a: &mut Engine, line: &str| {
            let req = crate::control::parse_request(line.as_bytes()).unwrap();
            let v: serde_json::Value = serde_json::from_str(&admin_answer(a, T, &req)).unwrap();
            v
        };
        let v = ask(
            &mut a,
            &format!(
                r#"{{"cmd":"sa_add","conn":"peer","dir":"in","spec":"spi=0x3001,suite=aes256-sha1,enc={},integ={}"}}"#,
                &I_AB[..64],
                &I_BA[..40]
            ),
        );
        assert_eq!(v["ok"], true, "{v}");
        assert!(v["message"].as_str().unwrap().contains("(aes256-sha1)"));
        assert!(
            !v.to_string().contains(&I_AB[..64]),
            "no keys in the answer"
        );
        let v = ask(
            &mut a,
            r#"{"cmd":"sa_add","conn":"peer","dir":"sideways","spec":"x"}"#,
        );
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("dir: expected in or out"),
            "{v}"
        );
        let v = ask(&mut a, r#"{"cmd":"sa_add","conn":"peer"}"#);
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("sa_add needs \"dir\""),
            "{v}"
        );
        let v = ask(&mut a, r#"{"cmd":"sa_del"}"#);
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("sa_del needs \"spi\""),
            "{v}"
        );
        let v = ask(&mut a, r#"{"cmd":"wireshark_keys"}"#);
        let keys: Vec<SaKeys> = serde_json::from_value(v["sas"].clone()).unwrap();
        let got: Vec<(String, u32, String, String, String, String)> = keys
            .iter()
            .map(|k| {
                (
                    k.direction.clone(),
                    k.spi,
                    k.src.clone(),
                    k.dst.clone(),
                    k.suite.clone(),
                    k.enc_key.clone(),
                )
            })
            .collect();
        let s = |x: &str| x.to_string();
        assert_eq!(
            got,
            [
                (
                    s("in"),
                    0x1001,
                    s("192.0.2.2"),
                    s("192.0.2.1"),
                    s("aes128gcm16"),
                    s(K_BA)
                ),
                (
                    s("in"),
                    0x3001,
                    s("192.0.2.2"),
                    s("192.0.2.1"),
                    s("aes256-sha1"),
                    s(&I_AB[..64])
                ),
                (
                    s("out"),
                    0x1002,
                    s("192.0.2.1"),
                    s("192.0.2.2"),
                    s("aes128gcm16"),
                    s(K_AB)
                ),
            ]
        );
        assert_eq!(keys[1].integ_key, &I_BA[..40]);
        assert_eq!((keys[2].sport, keys[2].dport), (Some(4500), Some(4500)));
        let v = ask(
            &mut a,
            r#"{"cmd":"sa_del","spi":12289,"proto":"esp","dir":"in"}"#,
        );
        assert_eq!(v["ok"], true, "{v}");
        assert_eq!(a.sa_list(T).len(), 2);
    }

    #[test]
    fn unicast_filter() {
        let f = |s: &str, d: &str| Flow {
            src: s.parse().unwrap(),
            dst: d.parse().unwrap(),
            proto: 17,
            sport: None,
            dport: None,
        };
        assert!(is_unicast(&f("10.1.0.1", "10.2.0.1")));
        assert!(is_unicast(&f("0.0.0.0", "10.2.0.1")));
        assert!(!is_unicast(&f("10.1.0.1", "255.255.255.255")));
        assert!(!is_unicast(&f("10.1.0.1", "239.1.1.1")));
        assert!(!is_unicast(&f("fe80::1", "2001:db8::1")));
        assert!(!is_unicast(&f("::", "ff02::16")));
        assert!(is_unicast(&f("2001:db8::1", "2001:db8:2::1")));
    }
}
