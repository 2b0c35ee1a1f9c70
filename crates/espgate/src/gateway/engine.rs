//! The gateway's packet logic without its I/O: the SAD and SPD built from
//! the configuration, the outbound path (clear packet from the TUN → SPD →
//! SA bundle → outer packet, with sequence numbers reserved on disk first),
//! the inbound path (outer packet → SAD → inner packet, bundle checked
//! against the connection), counters, rate-limited drop logging, timers,
//! and the status documents.
//!
//! The I/O loop in [`super::dataplane`] reads packets into a [`PacketBuf`],
//! calls [`Engine::outbound`] or [`Engine::inbound`] and sends or writes
//! what they leave in the buffer. Unit tests run two engines back to back.

use super::mss::{self, MssLimit};
use super::ratelimit::{suppressed_note, RateLimiter};
use super::seqstate::{Reservation, SeqStore};
use super::status::{ConnectionStatus, Left, LifetimeStatus, SaStatus};
use crate::config::{Connection, Encapsulation, LoadedConfig, MssClamp};
use anyhow::{anyhow, Context, Result};
use espgate_core::sa::{Encap, Mode, SaEvent};
use espgate_core::sad::{InboundOutcome, SaId, Sad};
use espgate_core::spd::{Action, Direction, Policy, Spd};
use espgate_core::wire::flow::{self, Flow};
use espgate_core::{Drop, PacketBuf, Sa};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// Drop reasons of the daemon itself (the core's are [`Drop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum GwDrop {
    /// An outbound packet matched no policy.
    NoPolicy,
    /// An inbound packet was authenticated by SAs that are not exactly one
    /// connection's inbound bundle (e.g. ESP alone where ESP+AH is due).
    PolicyMismatch,
    /// The sequence number reservation could not be written to disk.
    SeqReserve,
    /// Sending the outer packet failed.
    SendError,
    /// Writing the inner packet to the TUN failed.
    TunWrite,
    /// A packet was received from an address family or socket no
    /// connection uses, or an internal inconsistency.
    Internal,
}

impl GwDrop {
    /// All reasons, in index order.
    pub const ALL: [GwDrop; 6] = [
        GwDrop::NoPolicy,
        GwDrop::PolicyMismatch,
        GwDrop::SeqReserve,
        GwDrop::SendError,
        GwDrop::TunWrite,
        GwDrop::Internal,
    ];

    /// Counter name.
    pub const fn as_str(self) -> &'static str {
        match self {
            GwDrop::NoPolicy => "no_policy",
            GwDrop::PolicyMismatch => "policy_mismatch",
            GwDrop::SeqReserve => "seq_reserve_failed",
            GwDrop::SendError => "send_error",
            GwDrop::TunWrite => "tun_write_error",
            GwDrop::Internal => "internal_error",
        }
    }
}

/// Packet counters of the daemon.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Core drop reasons, both directions, indexed by [`Drop::index`].
    pub drops: [u64; Drop::ALL.len()],
    /// The daemon's own drop reasons, indexed by `GwDrop as usize`.
    pub gw_drops: [u64; GwDrop::ALL.len()],
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
    /// IKE packets (non-ESP marker) received and ignored: no IKE yet.
    pub ike: u64,
    /// ESP dummy packets (next header 59) discarded.
    pub dummies: u64,
    /// Multicast, broadcast and link-local packets from the TUN (IPv6
    /// neighbour discovery, MLD, …), which no SA carries; not logged.
    pub not_unicast: u64,
    /// TCP SYNs whose MSS option was lowered (`mss_clamp`).
    pub mss_clamped: u64,
}

/// One connection at run time.
#[derive(Debug)]
pub struct ConnState {
    /// Its configuration.
    pub conn: Connection,
    /// Outbound SAs in bundle order (ESP first, AH outermost).
    pub out_ids: Vec<SaId>,
    /// Inbound SAs in configuration order (ESP first, then AH).
    pub in_ids: Vec<SaId>,
    /// MSS clamping of TCP SYNs both ways, from `mss_clamp`.
    pub mss: Option<MssLimit>,
}

#[derive(Debug, Clone, Copy)]
struct SaMeta {
    conn: usize,
    outbound: bool,
}

/// The packet logic; see the module documentation.
pub struct Engine {
    sad: Sad,
    spd: Spd,
    /// Policy index → connection index.
    policy_conn: Vec<usize>,
    conns: Vec<ConnState>,
    /// By `SaId.0`.
    meta: Vec<Option<SaMeta>>,
    /// Outbound sequence reservations, by `SaId.0`.
    reservations: Vec<Option<Reservation>>,
    applied: Vec<SaId>,
    nat_t_port: u16,
    /// Counters.
    pub counters: Counters,
    limiter: RateLimiter,
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
            applied: Vec::with_capacity(espgate_core::sad::MAX_LAYERS),
            nat_t_port: cfg.gateway.listen.port(),
            counters: Counters::default(),
            limiter: RateLimiter::new(Duration::from_secs(1)),
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
                        Some(r)
                    }
                    None => None,
                };
                let sa = Sa::new(sc, now).map_err(|err| anyhow!("{ctx}: {err}"))?;
                let id = e.sad.insert(sa).map_err(|err| anyhow!("{ctx}: {err}"))?;
                *slot(&mut e.meta, id) = Some(SaMeta {
                    conn: ci,
                    outbound: true,
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
            e.conns.push(ConnState {
                conn: c.clone(),
                out_ids,
                in_ids,
                mss: None,
            });
        }
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
                c.out_ids
                    .iter()
                    .filter_map(|id| self.sad.get(*id))
                    .map(Sa::overhead)
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Counts a daemon-level drop and logs `msg` (rate-limited per reason).
    pub fn gw_drop(&mut self, d: GwDrop, now: Duration, msg: impl FnOnce() -> String) {
        self.counters.gw_drops[d as usize] += 1;
        if let Some(n) = self.limiter.check(d.as_str(), now) {
            let note = suppressed_note(n);
            match d {
                GwDrop::NoPolicy => tracing::info!("dropped ({}): {}{note}", d.as_str(), msg()),
                _ => tracing::warn!("dropped ({}): {}{note}", d.as_str(), msg()),
            }
        }
    }

    /// Counts a core drop reason and logs `msg` (rate-limited per reason).
    pub fn core_drop(&mut self, d: Drop, now: Duration, msg: impl FnOnce() -> String) {
        self.counters.drops[d.index()] += 1;
        if let Some(n) = self.limiter.check(d.as_str(), now) {
            tracing::warn!("dropped ({}): {}{}", d.as_str(), msg(), suppressed_note(n));
        }
    }

    /// Protects the clear packet in `buf` (read from the TUN). On success
    /// `buf` holds the outer packet and the connection to send it on is
    /// returned; `None` means dropped (and counted).
    pub fn outbound(&mut self, buf: &mut PacketBuf, now: Duration) -> Option<usize> {
        self.counters.tun_rx += 1;
        let f = match flow::of_packet(buf.as_slice()) {
            Ok(f) => f,
            Err(d) => {
                self.core_drop(d, now, || "unparsable packet from the TUN".into());
                return None;
            }
        };
        if !is_unicast(&f) {
            self.counters.not_unicast += 1;
            return None;
        }
        let Some(pi) = self.spd.lookup(&f, Direction::Outbound).map(|(i, _)| i) else {
            self.gw_drop(GwDrop::NoPolicy, now, || {
                format!(
                    "{} -> {} (protocol {}) from the TUN matches no connection's selectors",
                    f.src, f.dst, f.proto
                )
            });
            return None;
        };
        let conn = self.policy_conn[pi];
        if let Some(limit) = self.conns[conn].mss {
            if mss::clamp(buf.as_mut_slice(), limit) {
                self.counters.mss_clamped += 1;
            }
        }
        enum Fail {
            NotProtect,
            Reserve(String),
            Core(Drop),
        }
        let mut retry_note = None;
        let result = {
            let Engine {
                sad,
                spd,
                reservations,
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
                        if !r.should_extend(next) {
                            continue;
                        }
                        if let Err(err) = r.extend(next) {
                            let msg = format!(
                                "cannot reserve sequence numbers in {}: {err}",
                                r.path().display()
                            );
                            if r.covers(next) {
                                retry_note = Some(msg);
                            } else {
                                fatal = Some(msg);
                                break;
                            }
                        }
                    }
                    match fatal {
                        Some(msg) => Err(Fail::Reserve(msg)),
                        None => sad.encapsulate(ids, buf, now).map_err(Fail::Core),
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
                self.gw_drop(GwDrop::NoPolicy, now, || "the policy is not PROTECT".into());
                None
            }
            Err(Fail::Reserve(msg)) => {
                self.gw_drop(GwDrop::SeqReserve, now, || msg);
                None
            }
            Err(Fail::Core(d)) => {
                let name = &self.conns[conn].conn.name;
                let msg = format!("outbound {} -> {} on connection \"{name}\"", f.src, f.dst);
                self.core_drop(d, now, || msg);
                None
            }
        }
    }

    /// Verifies and removes the IPsec layers of the outer packet in `buf`
    /// (received from `from`). `true`: `buf` holds the inner packet, to be
    /// written to the TUN; `false`: consumed or dropped (and counted).
    pub fn inbound(&mut self, buf: &mut PacketBuf, now: Duration, from: IpAddr) -> bool {
        self.counters.net_rx += 1;
        match self
            .sad
            .decapsulate_into(buf, self.nat_t_port, now, &mut self.applied)
        {
            Ok(InboundOutcome::Packet) => {
                // The layers must be exactly one connection's inbound bundle.
                let conn = self
                    .applied
                    .first()
                    .and_then(|id| self.meta.get(id.0 as usize).copied().flatten())
                    .map(|m| m.conn);
                let ok =
                    conn.is_some_and(|c| self.applied.iter().eq(self.conns[c].in_ids.iter().rev()));
                if let Some(limit) = conn.and_then(|c| self.conns[c].mss).filter(|_| ok) {
                    if mss::clamp(buf.as_mut_slice(), limit) {
                        self.counters.mss_clamped += 1;
                    }
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
                    self.gw_drop(GwDrop::PolicyMismatch, now, || {
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
                    tracing::info!("ignoring IKE packet from {from}: IKE is not built yet");
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
                self.core_drop(e.reason, now, || {
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

    /// On a clean stop: records each outbound SA's exact next sequence
    /// number, so a restart continues without a gap.
    pub fn release_reservations(&mut self) {
        for (i, r) in self.reservations.iter_mut().enumerate() {
            let Some(r) = r else { continue };
            let next = self.sad.get(SaId(i as u32)).map_or(1, Sa::next_seq);
            if let Err(e) = r.release(next) {
                tracing::warn!("writing {}: {e}", r.path().display());
            }
        }
    }

    /// Drops by reason, core and daemon, non-zero only.
    pub fn drops(&self) -> BTreeMap<String, u64> {
        let core = Drop::ALL
            .iter()
            .map(|d| (d.as_str(), self.counters.drops[d.index()]));
        let gw = GwDrop::ALL
            .iter()
            .map(|d| (d.as_str(), self.counters.gw_drops[*d as usize]));
        core.chain(gw)
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
            .map(Reservation::reserved);
        Some(SaStatus {
            connection: self.conns[m.conn].conn.name.clone(),
            direction: if m.outbound { "out" } else { "in" }.into(),
            spi: format!("{:#010x}", cfg.spi),
            protocol: cfg.protocol.name().into(),
            suite: cfg.suite.name().to_string(),
            mode: mode_name(cfg.mode).into(),
            encap: encap_name(cfg.encap).into(),
            esn: cfg.esn,
            packets: st.packets,
            bytes: st.bytes,
            dummies: st.dummies,
            drops: Drop::ALL
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
    use crate::config;
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
