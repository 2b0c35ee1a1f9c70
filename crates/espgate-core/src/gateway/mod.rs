//! The gateway's packet logic, sans-IO: the SAD and SPD built from the
//! connections, the outbound path (clear packet → SPD → SA bundle → outer
//! packet), the inbound path (outer packet → SAD → inner packet, bundle
//! checked against the connection), MSS clamping, SA lifetimes, and the
//! run-time SA changes (`espgate sa add` / `sa del`, IKE installs).
//!
//! The shell reads a packet into a [`PacketBuf`], calls
//! [`Engine::outbound`] or [`Engine::inbound`], and sends or writes what
//! they leave in the buffer. A drop comes back as a [`Dropped`] — a reason
//! and a copyable context, counted already; the shell formats it with
//! [`Engine::describe`] only when its rate limiter lets a log line
//! through. Counters live in [`WorkerStats`], which other threads read
//! without stopping the engine ([`Engine::stats`]).
//!
//! Several data-plane workers each run an engine holding copies of the
//! same SAs ([`Engine::for_workers`]): outbound copies share one sequence
//! counter, each inbound SA lives in the one worker its SPI is steered to
//! ([`worker_of`]).

mod admin;
mod all;
mod cluster;
mod conn;
mod dropped;
mod status;

pub use admin::{NegotiatedSa, SaChange, SaKeyView};
pub use all::{add_sa_all, del_sa_all, install_negotiated_all, set_peer_all};
pub use cluster::{ClusterOptions, ClusterReport, ClusterSaReport, LockState};
pub use conn::{ConnSpec, Layers, MssClamp, SaSettings};
pub use dropped::{Describe, DropContext, Dropped};
pub use status::{SaEntry, WorkerStats};

use crate::buf::{PacketBuf, Rest};
use crate::cost::{NoProbe, Probe, Stage};
use crate::error::DropReason;
use crate::mss::{self, MssLimit};
use crate::sa::{Classifier, Encap, Protocol, Sa, SaConfig, SaEvent, SeqLease};
use crate::sad::{InGate, InboundError, InboundOutcome, SaId, Sad, MAX_LAYERS};
use crate::selector::TrafficSelector;
use crate::spd::{Action, Direction, Policy, Spd};
use crate::wire::flow::{self, Flow};
use crate::wire::icmp;
use crate::wire::ip::{self, IpInfo};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Gives outbound SAs their sequence-number leases: the first number each
/// may use and the lease ([`SeqLease`]) that bounds the rest. The daemon's
/// keeps them on disk, so a restart never reuses a nonce.
pub trait LeaseSource: Send + Sync {
    /// The lease for outbound SA `sa` of connection `conn`.
    fn lease(&self, sa: &SaConfig, conn: &str) -> Result<(u64, Arc<dyn SeqLease>), String>;
}

/// How an engine runs.
#[derive(Clone)]
pub struct EngineOptions {
    /// The outer path MTU (`gateway.mtu`).
    pub mtu: u16,
    /// What outer packets carry IPsec: the IP protocols and the ESP-in-UDP
    /// ports (e.g. `Classifier::new().udp_port(4500)`).
    pub classifier: Classifier,
    /// Where outbound SAs get their sequence numbers (none: from 1, no
    /// limit — for tests and offline tools).
    pub leases: Option<Arc<dyn LeaseSource>>,
    /// A node of seed 003's flat cluster: its id, dispatch scheme and
    /// hold (`None`: an ordinary gateway).
    pub cluster: Option<ClusterOptions>,
}

impl std::fmt::Debug for EngineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineOptions")
            .field("mtu", &self.mtu)
            .field("classifier", &self.classifier)
            .field("leases", &self.leases.is_some())
            .field("cluster", &self.cluster)
            .finish()
    }
}

/// One connection at run time.
#[derive(Debug)]
struct ConnState {
    spec: ConnSpec,
    /// Outbound SAs in bundle order (ESP first, AH outermost), at most one
    /// per layer (per-CPU pairs: one per pair). A layer whose SA was
    /// removed is missing: the connection then sends nothing (`no_sa`).
    out_ids: Vec<SaId>,
    /// Inbound SAs: the configured ones, then those added at run time. Any
    /// of a layer's SAs is accepted.
    in_ids: Vec<SaId>,
    /// The narrowed selector sets of the connection's negotiated child SAs
    /// (a peer may agree to less than the configured selectors, and keep
    /// several children with different selectors): outbound SA group
    /// `k + 1` carries `groups[k]`'s traffic; group 0 the configured
    /// selectors. A group goes when its last outbound SA does.
    groups: Vec<Vec<TrafficSelector>>,
    /// MSS clamping of TCP SYNs both ways.
    mss: Option<MssLimit>,
    /// The outer path MTU the shell learnt for this connection's peer
    /// ([`Engine::note_path_mtu`]), and when.
    path_mtu: Option<(u16, Duration)>,
}

impl ConnState {
    /// True when a bundle of `n` outbound SAs (of one selector group) has
    /// every layer.
    fn complete(&self, n: usize) -> bool {
        n == self.spec.layers.protocols().len() || (self.spec.per_cpu_sas > 1 && n >= 1)
    }
}

#[derive(Debug, Clone, Copy)]
struct SaMeta {
    conn: usize,
    outbound: bool,
    protocol: Protocol,
    /// Installed at run time (`espgate sa add`, IKE), not configured.
    added: bool,
    /// Per-CPU SAs: the pair (slot) an outbound SA belongs to; 0 for every
    /// other SA.
    slot: u32,
    /// An outbound SA's selector group ([`ConnState::groups`]): 0 for the
    /// configured selectors, and for every inbound SA.
    group: u32,
}

/// What the engine tells the shell, from [`Engine::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// An SA reached a lifetime limit or ran out of sequence numbers.
    Sa {
        /// Its connection's name.
        conn: String,
        /// Outbound (we send on it) or inbound.
        outbound: bool,
        /// ESP or AH.
        protocol: Protocol,
        /// Its SPI.
        spi: u32,
        /// What happened.
        event: SaEvent,
    },
}

/// What an inbound packet turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// The buffer holds the inner packet, for the TUN.
    Packet,
    /// An ESP dummy packet, discarded (counted).
    Dummy,
    /// IKE on the NAT-T port (counted); the shell hands it to IKE.
    Ike,
    /// A NAT keepalive, ignored (counted).
    Keepalive,
    /// A cluster node advanced the SA's state and dropped the packet:
    /// another node of the cluster processes it (counted per SA,
    /// `observed`).
    Observed,
}

/// The packet logic of one data-plane worker; see the module
/// documentation.
pub struct Engine {
    sad: Sad,
    spd: Spd,
    /// Policy index → (connection index, selector group).
    policy_conn: Vec<(usize, u32)>,
    conns: Vec<ConnState>,
    /// By `SaId.0`.
    meta: Vec<Option<SaMeta>>,
    /// The outer path MTU (`gateway.mtu`) and the TUN MTU sized for it at
    /// start.
    outer_mtu: u16,
    sized_mtu: u32,
    applied: Vec<SaId>,
    classifier: Classifier,
    leases: Option<Arc<dyn LeaseSource>>,
    stats: Arc<WorkerStats>,
    events: VecDeque<EngineEvent>,
    /// Byte and packet lifetimes of the SAs are divided by this (the
    /// number of workers holding copies).
    volume_split: u64,
    /// This engine's worker index: with per-CPU SAs it sends on pair
    /// `worker % per_cpu_sas`.
    worker: usize,
    /// Seed 003's cluster node state (`None`: an ordinary gateway).
    cluster: Option<Box<cluster::ClusterNode>>,
    /// The ICMP rate limit: the current one-second window's start and the
    /// messages sent in it.
    icmp_window: (Duration, u32),
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("sas", &self.sad.len())
            .field("policies", &self.spd.len())
            .field("worker", &self.worker)
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

/// How long a learnt path MTU holds before packets are again let through
/// at full size (RFC 1191 §6.3 suggests ten minutes): if the path is still
/// narrow, the next refused send teaches it again.
pub const PATH_MTU_AGE: Duration = Duration::from_secs(600);

/// At most this many ICMP "too big" messages per second per engine (RFC
/// 1812 §4.3.2.8, RFC 4443 §2.4 (f): ICMP errors are rate-limited); the
/// packets over the limit are refused without one.
pub const ICMP_PER_SECOND: u32 = 100;

/// The worker (of `n`) that receives the inbound SA with `spi`: ESP-in-UDP
/// datagrams are steered to socket `SPI % n` of the shell's
/// `SO_REUSEPORT` group; raw ESP/AH is read by worker 0 alone.
pub fn worker_of(encap: Encap, spi: u32, n: usize) -> usize {
    match encap {
        Encap::Udp { .. } if n > 1 => spi as usize % n,
        _ => 0,
    }
}

impl Engine {
    /// Installs every connection's manually keyed SAs and its policies.
    /// Outbound SAs start at the sequence number their lease gives (1
    /// without [`EngineOptions::leases`]).
    pub fn new(conns: &[ConnSpec], opts: &EngineOptions, now: Duration) -> Result<Engine, String> {
        Engine::build(conns, opts, now, true)
    }

    fn build(
        conns: &[ConnSpec],
        opts: &EngineOptions,
        now: Duration,
        take_leases: bool,
    ) -> Result<Engine, String> {
        let mut e = Engine {
            sad: Sad::new(),
            spd: Spd::new(),
            policy_conn: Vec::new(),
            conns: Vec::new(),
            meta: Vec::new(),
            outer_mtu: opts.mtu,
            sized_mtu: 0,
            applied: Vec::with_capacity(MAX_LAYERS),
            classifier: opts.classifier,
            leases: opts.leases.clone(),
            stats: Arc::new(WorkerStats::default()),
            events: VecDeque::new(),
            volume_split: 1,
            worker: 0,
            cluster: opts.cluster.map(|o| Box::new(cluster::ClusterNode::new(o))),
            icmp_window: (Duration::ZERO, 0),
        };
        for (ci, c) in conns.iter().enumerate() {
            let what = |sc: &SaConfig, dir: &str| {
                format!(
                    "connection \"{}\": installing {dir} {} SA {:#010x}",
                    c.name,
                    sc.protocol.name().to_uppercase(),
                    sc.spi
                )
            };
            let mut in_ids = Vec::new();
            for sc in &c.inbound {
                let ctx = what(sc, "inbound");
                let sa = Sa::new(sc.clone(), now).map_err(|err| format!("{ctx}: {err}"))?;
                let id = e.sad.insert(sa).map_err(|err| format!("{ctx}: {err}"))?;
                *slot(&mut e.meta, id) = Some(SaMeta {
                    conn: ci,
                    outbound: false,
                    protocol: sc.protocol,
                    added: false,
                    slot: 0,
                    group: 0,
                });
                in_ids.push(id);
            }
            let mut out_ids = Vec::new();
            for (k, sc) in c.outbound.iter().enumerate() {
                let ctx = what(sc, "outbound");
                let mut sc = sc.clone();
                if let Some(o) = &opts.cluster {
                    sc.iv_source = crate::sa::IvSource::PerNode { node: o.node };
                }
                let lease = match e.leases.as_ref().filter(|_| take_leases) {
                    Some(src) => {
                        let (start, l) = src
                            .lease(&sc, &c.name)
                            .map_err(|err| format!("{ctx}: {err}"))?;
                        sc.start_at_lease(start);
                        Some(l)
                    }
                    None => None,
                };
                let protocol = sc.protocol;
                let mut sa = Sa::new(sc, now).map_err(|err| format!("{ctx}: {err}"))?;
                if let Some(l) = lease {
                    sa.set_lease(l);
                }
                let id = e.sad.insert(sa).map_err(|err| format!("{ctx}: {err}"))?;
                *slot(&mut e.meta, id) = Some(SaMeta {
                    conn: ci,
                    outbound: true,
                    protocol,
                    added: false,
                    // Per-CPU pairs are configured in slot order.
                    slot: if c.per_cpu_sas > 1 { k as u32 } else { 0 },
                    group: 0,
                });
                out_ids.push(id);
            }
            e.conns.push(ConnState {
                spec: c.clone(),
                out_ids,
                in_ids,
                groups: Vec::new(),
                mss: None,
                path_mtu: None,
            });
        }
        e.rebuild_spd();
        let tun_mtu = e.tun_mtu(opts.mtu);
        e.sized_mtu = tun_mtu;
        for c in &mut e.conns {
            c.mss = c.spec.mss_limit(tun_mtu);
        }
        for ci in 0..e.conns.len() {
            e.fit_tfc(ci);
        }
        e.publish();
        Ok(e)
    }

    /// The counters and the SA directory of this engine, for readers on
    /// other threads.
    pub fn stats(&self) -> &Arc<WorkerStats> {
        &self.stats
    }

    /// This engine's worker index.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// The connections, in configuration order.
    pub fn connections(&self) -> impl ExactSizeIterator<Item = &ConnSpec> {
        self.conns.iter().map(|c| &c.spec)
    }

    /// The SAD (read-only).
    pub fn sad(&self) -> &Sad {
        &self.sad
    }

    /// The TUN MTU for an outer path MTU of `outer_mtu`: the longest
    /// packet every connection's outbound bundle keeps within it.
    pub fn tun_mtu(&self, outer_mtu: u16) -> u32 {
        let room = usize::from(outer_mtu);
        let fit = self
            .conns
            .iter()
            .map(|c| self.conn_fit(c, room))
            .min()
            .unwrap_or(room);
        u32::try_from(fit).unwrap_or(u32::MAX)
    }

    /// The largest number of bytes a connection's outbound bundle adds to
    /// a packet, worst-case padding included (for buffer sizing; the TUN
    /// MTU is [`Engine::tun_mtu`], which pads exactly).
    pub fn max_overhead(&self) -> usize {
        self.conns
            .iter()
            .map(|c| {
                let installed = (0..=c.groups.len() as u32)
                    .map(|g| {
                        [true, false]
                            .map(|ah| {
                                let worst = self.layer(c, g, ah).map(|sa| sa.overhead());
                                worst.max().unwrap_or(0)
                            })
                            .iter()
                            .sum::<usize>()
                    })
                    .max()
                    .unwrap_or(0);
                let negotiated = c.spec.negotiated.iter().map(|g| g.worst()).max();
                installed.max(negotiated.unwrap_or(0))
            })
            .max()
            .unwrap_or(0)
    }

    /// The longest packet connection `c` keeps within `room` bytes: that of
    /// its tightest selector group, and of any SA IKE may negotiate for it.
    fn conn_fit(&self, c: &ConnState, room: usize) -> usize {
        let installed = (0..=c.groups.len() as u32)
            .map(|g| self.group_fit(c, g, room))
            .min()
            .unwrap_or(room);
        let negotiated = c.spec.negotiated.iter().map(|g| g.fit(room)).min();
        installed.min(negotiated.unwrap_or(room))
    }

    /// The longest packet selector group `g` of `c` keeps within `room`
    /// bytes. A bundle is ESP (or Q-ESP) inside, AH outside; each layer
    /// leaves the least room any of its SAs leaves (per-CPU pairs are
    /// several SAs of one layer, of which a packet crosses one).
    fn group_fit(&self, c: &ConnState, g: u32, room: usize) -> usize {
        // A transport-mode SA wraps packets of the peer's family.
        let v6 = c.spec.remote.is_ipv6();
        let fit = |ah: bool, room: usize| {
            self.layer(c, g, ah)
                .map(|sa| sa.growth_in(v6).fit(room))
                .min()
                .unwrap_or(room)
        };
        fit(false, fit(true, room))
    }

    /// Caps the TFC padding of connection `ci`'s outbound SAs at the
    /// longest packet their group keeps within the path (`gateway.mtu`,
    /// or the path MTU learnt for the connection): a `tfc_pad_to` above it
    /// pads to exactly the path MTU instead of beyond it (`65535` means
    /// "as long as fits"). Called whenever a bundle or the path changes.
    fn fit_tfc(&mut self, ci: usize) {
        let Some(c) = self.conns.get(ci) else { return };
        let room = c
            .path_mtu
            .map_or(self.outer_mtu, |(m, _)| m.min(self.outer_mtu));
        for k in 0..c.out_ids.len() {
            let c = &self.conns[ci];
            let id = c.out_ids[k];
            // Only SAs that pad: the others never read the cap.
            if self
                .sad
                .get(id)
                .is_none_or(|sa| sa.config().tfc_pad_to.is_none())
            {
                continue;
            }
            let Some(g) = self.meta_of(id).map(|m| m.group) else {
                continue;
            };
            let fit = self.group_fit(c, g, usize::from(room));
            if let Some(sa) = self.sad.get_mut(id) {
                sa.limit_tfc(fit);
            }
        }
    }

    /// The connections whose `tfc_pad_to` asks for more than their bundle
    /// keeps within the path, each once: its name, the `tfc_pad_to` asked
    /// for and the length packets are padded to (for the start-up log).
    pub fn tfc_capped(&self) -> Vec<(&str, u16, usize)> {
        let mut out = Vec::new();
        for c in &self.conns {
            let capped = c
                .out_ids
                .iter()
                .filter_map(|id| self.sad.get(*id))
                .find_map(Sa::tfc_cap);
            if let Some((asked, to)) = capped {
                out.push((c.spec.name.as_str(), asked, to));
            }
        }
        out
    }

    /// The outbound SAs of group `g` of `c` in its AH layer (`ah`) or its
    /// ESP-like one.
    fn layer<'a>(&'a self, c: &'a ConnState, g: u32, ah: bool) -> impl Iterator<Item = &'a Sa> {
        c.out_ids
            .iter()
            .filter(move |id| self.meta_of(**id).is_some_and(|m| m.group == g))
            .filter_map(|id| self.sad.get(*id))
            .filter(move |sa| (sa.config().protocol == Protocol::Ah) == ah)
    }

    /// The shell learnt that outer packets of connection `conn` longer
    /// than `mtu` bytes do not reach its peer (the kernel refused a send
    /// and reports this path MTU, e.g. after an ICMP "fragmentation
    /// needed" from a router). For [`PATH_MTU_AGE`], a clear packet that
    /// would exceed it once protected and may not be fragmented (IPv4 with
    /// DF, IPv6) is refused, and its sender gets ICMP "too big" announcing
    /// what fits (RFC 4301 §8.2.1). Returns that inner MTU (`None`: no
    /// such connection).
    pub fn note_path_mtu(&mut self, conn: usize, mtu: u16, now: Duration) -> Option<u32> {
        let fit = self.conn_fit(self.conns.get(conn)?, usize::from(mtu));
        self.conns[conn].path_mtu = Some((mtu, now));
        self.fit_tfc(conn);
        Some(u32::try_from(fit).unwrap_or(u32::MAX))
    }

    /// Where connection `conn`'s ESP-in-UDP goes now: the peer of its
    /// current outbound SA (for a peer behind a NAT, the address and port
    /// the NAT gave it, as IKE learnt them), else the configured `remote`
    /// and `remote_port`; `None` for raw ESP/AH or no such connection. For
    /// the shell's NAT keepalives, which go where the ESP goes.
    pub fn peer_udp(&self, conn: usize) -> Option<SocketAddr> {
        let c = self.conns.get(conn).filter(|c| c.spec.udp)?;
        let sa = c
            .out_ids
            .first()
            .and_then(|&id| self.sad.get(id))
            .map(|sa| sa.config());
        let port = sa.and_then(|sa| match sa.encap {
            Encap::Udp { dst_port, .. } => Some(dst_port),
            Encap::None => None,
        });
        let addr = sa.and_then(|sa| sa.tunnel_dst);
        Some(SocketAddr::new(
            addr.unwrap_or(c.spec.remote),
            port.unwrap_or(c.spec.remote_port),
        ))
    }

    /// The peer of connection `name` is now at `peer` (IKE saw a validated
    /// message from a NAT's new mapping of it, RFC 7296 §2.23): the
    /// connection's outbound SAs send there from the next packet (tunnel
    /// mode: address and port; transport mode: the port), and its inbound
    /// ones show it in the status. Returns how many outbound SAs changed;
    /// an error for no such connection, or for an address of the other
    /// family than `remote` (the outer headers would change size).
    pub fn set_peer(&mut self, name: &str, peer: SocketAddr) -> Result<usize, String> {
        let ci = self.conn_index(name)?;
        let c = &self.conns[ci];
        let peer = SocketAddr::new(peer.ip().to_canonical(), peer.port());
        if peer.is_ipv4() != c.spec.remote.is_ipv4() {
            return Err(format!(
                "connection \"{name}\": the peer moved to {peer}, not of the family of its \
                 remote {}: the SAs keep sending to their address",
                c.spec.remote
            ));
        }
        let mut changed = (0, 0);
        for (ids, outbound) in [(&c.out_ids, true), (&c.in_ids, false)] {
            for &id in ids {
                if self
                    .sad
                    .get_mut(id)
                    .is_some_and(|sa| sa.set_peer(peer, outbound))
                {
                    if outbound {
                        changed.0 += 1;
                    } else {
                        changed.1 += 1;
                    }
                }
            }
        }
        if changed != (0, 0) {
            // `sa list` and the kernel filter read the published entries.
            self.publish();
        }
        Ok(changed.0)
    }

    /// The path MTU learnt for connection `conn`, while it holds.
    pub fn path_mtu(&self, conn: usize, now: Duration) -> Option<u16> {
        match self.conns.get(conn)?.path_mtu {
            Some((mtu, since)) if now.saturating_sub(since) < PATH_MTU_AGE => Some(mtu),
            _ => None,
        }
    }

    /// True when connection `conn` has no path MTU learnt within `within`
    /// (the shell asks the kernel again only then).
    pub fn path_mtu_stale(&self, conn: usize, now: Duration, within: Duration) -> bool {
        match self.conns.get(conn).and_then(|c| c.path_mtu) {
            Some((_, since)) => now.saturating_sub(since) >= within,
            None => true,
        }
    }

    /// Refuses the clear packet in `buf` if it exceeds connection `conn`'s
    /// learnt path MTU once protected and may not be fragmented; `buf`
    /// then holds the ICMP "too big" for its sender when the rate limit
    /// allows one (`Dropped::reply`).
    fn check_path_mtu(
        &mut self,
        conn: usize,
        buf: &mut PacketBuf,
        f: &Flow,
        now: Duration,
    ) -> Option<Dropped> {
        let Some(mtu) = self.path_mtu(conn, now) else {
            self.conns[conn].path_mtu = None;
            self.fit_tfc(conn);
            return None;
        };
        let room = self.conn_fit(&self.conns[conn], usize::from(mtu));
        if buf.len() <= room {
            return None;
        }
        // IPv4 without DF: the outer packet keeps DF clear too (tunnel
        // mode copies it) and the kernel fragments it.
        let pkt = buf.as_slice();
        if pkt.first().map(|b| b >> 4) == Some(4) && pkt.get(6).is_some_and(|b| b & 0x40 == 0) {
            return None;
        }
        let (src, dst) = (f.src, f.dst);
        let mut d = self.count_drop(
            DropReason::PathMtu,
            DropContext::Outbound { conn, src, dst },
        );
        let (start, sent) = &mut self.icmp_window;
        if now.saturating_sub(*start) >= Duration::from_secs(1) {
            (*start, *sent) = (now, 0);
        }
        if *sent < ICMP_PER_SECOND && icmp::too_big_in_place(buf, room as u32).is_ok() {
            *sent += 1;
            self.stats.counters.icmp_too_big.incr();
            d.reply = true;
        }
        Some(d)
    }

    /// The log line of a drop this engine reported: formatted only when
    /// written.
    pub fn describe<'a>(&'a self, dropped: &'a Dropped) -> Describe<'a> {
        Describe {
            engine: self,
            dropped,
        }
    }

    /// Counts a drop and returns it, for the shell to log.
    fn count_drop(&self, reason: DropReason, context: DropContext) -> Dropped {
        self.stats.counters.drops.count(reason);
        Dropped::new(reason, context)
    }

    /// Protects the clear packet in `buf` (read from the TUN). `Some(c)`:
    /// `buf` holds the outer packet, to send on connection `c`; `None`: a
    /// multicast, broadcast or link-local packet no SA carries, ignored
    /// (counted as `not_unicast`, not a drop).
    pub fn outbound(
        &mut self,
        buf: &mut PacketBuf,
        now: Duration,
    ) -> Result<Option<usize>, Dropped> {
        self.outbound_probed(buf, now, &mut NoProbe)
    }

    /// [`Engine::outbound`], marking its stages on `probe` (the policy
    /// lookup is [`Stage::Lookup`]; the SAs mark theirs).
    pub fn outbound_probed<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> Result<Option<usize>, Dropped> {
        let c = &self.stats.counters;
        c.tun_rx.incr();
        let f = match flow::of_packet(buf.as_slice()) {
            Ok(f) => f,
            Err(d) => return Err(self.count_drop(d, DropContext::TunUnparsable)),
        };
        if !is_unicast(&f) {
            // Neighbour discovery, MLD and the like: no SA carries them,
            // and they are not worth a log line.
            c.not_unicast.incr();
            return Ok(None);
        }
        let Some(pi) = self.spd.lookup_memo(&f, Direction::Outbound) else {
            let (src, dst, proto) = (f.src, f.dst, f.proto);
            return Err(self.count_drop(
                DropReason::NoPolicy,
                DropContext::NoPolicy { src, dst, proto },
            ));
        };
        let (conn, group) = self.policy_conn[pi];
        if matches!(&self.spd.policies()[pi].action, Action::Protect(ids) if ids.is_empty()) {
            let (src, dst) = (f.src, f.dst);
            let narrowed = group == 0 && !self.conns[conn].groups.is_empty();
            return Err(self.count_drop(
                DropReason::NoSa,
                DropContext::NoSa {
                    conn,
                    src,
                    dst,
                    narrowed,
                },
            ));
        }
        if self.conns[conn].path_mtu.is_some() {
            if let Some(d) = self.check_path_mtu(conn, buf, &f, now) {
                return Err(d);
            }
        }
        self.clamp_mss(conn, buf.as_mut_slice());
        probe.mark(Stage::Lookup);
        if self.cluster.is_some() {
            if let Action::Protect(ids) = &self.spd.policies()[pi].action {
                if let Some(&id) = ids.first() {
                    let gate = self.cluster_outbound(id, buf.as_slice(), &f, now);
                    if let Some(g @ (cluster::Gate::Theirs | cluster::Gate::Nobody(_))) = gate {
                        let len = buf.len();
                        let r = self
                            .sad
                            .get_mut(id)
                            .ok_or(DropReason::UnknownSpi)
                            .and_then(|sa| sa.observe_outbound(len, now));
                        let (src, dst) = (f.src, f.dst);
                        return match (r, g) {
                            (Err(d), _) | (Ok(_), cluster::Gate::Nobody(d)) => {
                                Err(self.count_drop(d, DropContext::Outbound { conn, src, dst }))
                            }
                            _ => Ok(None),
                        };
                    }
                }
            }
        }
        let r = match &self.spd.policies()[pi].action {
            Action::Protect(ids) => self.sad.encapsulate_probed(ids, buf, now, probe),
            Action::Bypass | Action::Discard => {
                return Err(self.count_drop(DropReason::NoPolicy, DropContext::NotProtect))
            }
        };
        self.sealed(r, conn, &f)
    }

    /// Clamps the MSS of a TCP SYN in `pkt` to connection `conn`'s limit,
    /// if it has one.
    fn clamp_mss(&self, conn: usize, pkt: &mut [u8]) {
        if let Some(limit) = self.conns[conn].mss {
            if mss::clamp(pkt, limit) {
                self.stats.counters.mss_clamped.incr();
            }
        }
    }

    /// The outcome of sealing flow `f` on connection `conn`: the
    /// connection to send on, or the drop, counted.
    fn sealed(
        &self,
        r: crate::error::PResult<()>,
        conn: usize,
        f: &Flow,
    ) -> Result<Option<usize>, Dropped> {
        match r {
            Ok(()) => Ok(Some(conn)),
            Err(d) => {
                let (src, dst) = (f.src, f.dst);
                Err(self.count_drop(d, DropContext::Outbound { conn, src, dst }))
            }
        }
    }

    /// [`Engine::outbound`] for a clear packet that lies outside `out`
    /// (a segment of a TSO read, its headers written in front of its
    /// payload): the same result, counters and bytes in `out` as loading
    /// `clear` into `out` and calling [`Engine::outbound`]. In the common
    /// case (one SA that [`Sa::seals_from`], no learnt path MTU, no
    /// cluster) the SA seals straight from `clear` and the copy is not
    /// made; every other case takes that copy and the general path. The
    /// MSS clamp, if on, edits `clear` itself.
    pub fn outbound_from(
        &mut self,
        clear: &mut [u8],
        out: &mut PacketBuf,
        now: Duration,
    ) -> Result<Option<usize>, Dropped> {
        self.outbound_from_probed(clear, out, now, &mut NoProbe)
    }

    /// [`Engine::outbound_from`], marking the stages of
    /// [`Engine::outbound_probed`] on `probe`.
    pub fn outbound_from_probed<P: Probe + ?Sized>(
        &mut self,
        clear: &mut [u8],
        out: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> Result<Option<usize>, Dropped> {
        let Some((conn, id, f, info)) = self.direct_target(clear) else {
            out.load(clear);
            return self.outbound_probed(out, now, probe);
        };
        self.stats.counters.tun_rx.incr();
        self.clamp_mss(conn, clear);
        probe.mark(Stage::Lookup);
        let r = self
            .sad
            .get_mut(id)
            .ok_or(DropReason::UnknownSpi)
            .and_then(|sa| sa.encapsulate_parsed(clear, &info, out, now, probe));
        self.sealed(r, conn, &f)
    }

    /// Where [`Engine::outbound_from`] may seal `clear` without the
    /// general path: (connection, its one SA, the flow, its parsed IP
    /// header, which the SA then need not parse again) when the packet
    /// parses, is unicast, its policy protects it with exactly one SA and
    /// neither a learnt path MTU nor a cluster has a say. Counts nothing:
    /// `None` leaves every count to [`Engine::outbound`].
    fn direct_target(&mut self, clear: &[u8]) -> Option<(usize, SaId, Flow, IpInfo)> {
        if self.cluster.is_some() {
            return None;
        }
        let info = ip::parse(clear).ok()?;
        let f = flow::of_parsed(clear, &info);
        if !is_unicast(&f) {
            return None;
        }
        let pi = self.spd.lookup_memo(&f, Direction::Outbound)?;
        let (conn, _) = self.policy_conn[pi];
        if self.conns[conn].path_mtu.is_some() {
            return None;
        }
        match &self.spd.policies()[pi].action {
            Action::Protect(ids) if ids.len() == 1 => Some((conn, ids[0], f, info)),
            _ => None,
        }
    }

    /// Verifies and removes the IPsec layers of the outer packet in `buf`
    /// (received from `from`).
    pub fn inbound(
        &mut self,
        buf: &mut PacketBuf,
        now: Duration,
        from: IpAddr,
    ) -> Result<Received, Dropped> {
        self.inbound_probed(buf, now, from, &mut NoProbe)
    }

    /// [`Engine::inbound`], marking its stages on `probe`.
    pub fn inbound_probed<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        now: Duration,
        from: IpAddr,
        probe: &mut P,
    ) -> Result<Received, Dropped> {
        self.stats.counters.net_rx.incr();
        let r = match self.cluster.as_deref_mut() {
            None => self.sad.decapsulate_into_probed(
                buf,
                &self.classifier,
                now,
                &mut self.applied,
                probe,
            ),
            Some(c) => self.sad.decapsulate_gated(
                buf,
                &self.classifier,
                now,
                &mut self.applied,
                probe,
                &mut |id, seq, len| match c.inbound(id, seq, len, now) {
                    cluster::Gate::Mine => InGate::Process,
                    cluster::Gate::Theirs => InGate::Observe,
                    cluster::Gate::Nobody(d) => InGate::ObserveDrop(d),
                },
            ),
        };
        self.inbound_outcome(r, buf, from, probe)
    }

    /// [`Engine::inbound`] of a packet whose tail `src` (the bytes after a
    /// synthetic outer header, as received) is loaded into `buf` with
    /// [`PacketBuf::load_head`] only: the outermost ESP layer is decrypted
    /// straight from `src` into `buf`, saving the copy of the packet into
    /// the buffer. Where the whole packet is needed first (AH, a cluster
    /// node) the rest is copied in. The same result, bytes, drops and
    /// counters as [`Engine::inbound`] on the whole packet; a `buf`
    /// shorter than `src` is dropped as `BadLength`.
    pub fn inbound_from(
        &mut self,
        buf: &mut PacketBuf,
        src: &[u8],
        now: Duration,
        from: IpAddr,
    ) -> Result<Received, Dropped> {
        self.inbound_from_probed(buf, src, now, from, &mut NoProbe)
    }

    /// [`Engine::inbound_from`], marking its stages on `probe`.
    pub fn inbound_from_probed<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        src: &[u8],
        now: Duration,
        from: IpAddr,
        probe: &mut P,
    ) -> Result<Received, Dropped> {
        if self.cluster.is_some() {
            if let Some(r) = Rest::of(buf, src) {
                r.fill(buf);
                return self.inbound_probed(buf, now, from, probe);
            }
        }
        self.stats.counters.net_rx.incr();
        let r = self.sad.decapsulate_from_probed(
            buf,
            src,
            &self.classifier,
            now,
            &mut self.applied,
            probe,
        );
        self.inbound_outcome(r, buf, from, probe)
    }

    /// What [`Engine::inbound`] makes of the SAD's outcome: the inbound
    /// policy check and MSS clamp, counters, drops.
    fn inbound_outcome<P: Probe + ?Sized>(
        &mut self,
        r: Result<InboundOutcome, InboundError>,
        buf: &mut PacketBuf,
        from: IpAddr,
        probe: &mut P,
    ) -> Result<Received, Dropped> {
        let c = &self.stats.counters;
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
                        c.mss_clamped.incr();
                    }
                }
                // The inbound policy check (and MSS clamp).
                probe.mark(Stage::Lookup);
                if !ok {
                    let mut layers = [(Protocol::Esp, 0); MAX_LAYERS];
                    let mut n = 0;
                    for (slot, sa) in layers
                        .iter_mut()
                        .zip(self.applied.iter().filter_map(|id| self.sad.get(*id)))
                    {
                        *slot = (sa.config().protocol, sa.config().spi);
                        n += 1;
                    }
                    return Err(self.count_drop(
                        DropReason::PolicyMismatch,
                        DropContext::PolicyMismatch { from, layers, n },
                    ));
                }
                Ok(Received::Packet)
            }
            Ok(InboundOutcome::Dummy(_)) => {
                c.dummies.incr();
                Ok(Received::Dummy)
            }
            Ok(InboundOutcome::Ike) => {
                c.ike.incr();
                Ok(Received::Ike)
            }
            Ok(InboundOutcome::Keepalive) => {
                c.keepalives.incr();
                Ok(Received::Keepalive)
            }
            Ok(InboundOutcome::Observed(_)) => Ok(Received::Observed),
            Err(e) => {
                let conn = e.sa.and_then(|id| self.meta_of(id)).map(|m| m.conn);
                Err(self.count_drop(
                    e.reason,
                    DropContext::Inbound {
                        from,
                        spi: e.spi,
                        conn,
                    },
                ))
            }
        }
    }

    /// About once a second: advances SA lifetimes; their events come out
    /// of [`Engine::poll_event`].
    pub fn tick(&mut self, now: Duration) {
        for i in 0..self.meta.len() {
            let Some(m) = self.meta[i] else { continue };
            let Some(sa) = self.sad.get_mut(SaId(i as u32)) else {
                continue;
            };
            sa.tick(now);
            while let Some(event) = sa.poll_event() {
                self.events.push_back(EngineEvent::Sa {
                    conn: self.conns[m.conn].spec.name.clone(),
                    outbound: m.outbound,
                    protocol: m.protocol,
                    spi: sa.config().spi,
                    event,
                });
            }
        }
    }

    /// The next event for the shell (lifetime limits reached), if any.
    pub fn poll_event(&mut self) -> Option<EngineEvent> {
        self.events.pop_front()
    }

    /// On a clean stop: tells each outbound SA's lease the exact next
    /// sequence number, so a restart continues without a gap.
    pub fn release_leases(&mut self) {
        for (_, sa) in self.sad.iter() {
            if let Some(l) = sa.lease() {
                l.release(sa.lease_position());
            }
        }
    }

    fn meta_of(&self, id: SaId) -> Option<SaMeta> {
        self.meta.get(id.0 as usize).copied().flatten()
    }

    /// True when an SA of `protocol` fills connection `ci`'s layer
    /// `layer`: the same protocol, or — on a connection keyed by IKE
    /// (`negotiated` not empty), whose one ESP-like layer is negotiated
    /// as ESP or Q-ESP per child SA — either ESP-like protocol, so that an
    /// SA of the other one still in its rekey overlap is not a mismatch.
    fn same_layer(&self, ci: usize, layer: Protocol, protocol: Protocol) -> bool {
        layer == protocol
            || (!self.conns[ci].spec.negotiated.is_empty()
                && layer.is_esp_like()
                && protocol.is_esp_like())
    }

    /// The layers of connection `conn` without an outbound SA.
    fn missing_layers(&self, conn: usize) -> impl Iterator<Item = Protocol> + '_ {
        let c = &self.conns[conn];
        c.spec.layers.protocols().iter().copied().filter(move |p| {
            !c.out_ids.iter().any(|id| {
                self.meta_of(*id)
                    .is_some_and(|m| self.same_layer(conn, *p, m.protocol))
            })
        })
    }

    /// True when the SAs just applied (outermost first) are connection
    /// `c`'s inbound bundle: one of its inbound SAs per layer, AH outside.
    fn is_inbound_bundle(&self, c: usize) -> bool {
        let want = self.conns[c].spec.layers.protocols();
        self.applied.len() == want.len()
            && self.applied.iter().zip(want.iter().rev()).all(|(id, p)| {
                self.meta_of(*id).is_some_and(|m| {
                    m.conn == c && !m.outbound && self.same_layer(c, *p, m.protocol)
                })
            })
    }

    /// Connection `ci`'s outbound SAs of selector group `g`, in bundle
    /// (or slot) order.
    fn group_ids(&self, ci: usize, g: u32) -> Vec<SaId> {
        self.conns[ci]
            .out_ids
            .iter()
            .copied()
            .filter(|id| self.meta_of(*id).is_some_and(|m| m.group == g))
            .collect()
    }

    /// True when connection `ci`'s selector group `g` has every layer's
    /// outbound SA.
    fn group_can_send(&self, ci: usize, g: u32) -> bool {
        self.conns[ci].complete(self.group_ids(ci, g).len())
    }

    /// True when connection `ci` can send some of its traffic: one of its
    /// selector groups has a complete bundle.
    fn can_send(&self, ci: usize) -> bool {
        (0..=self.conns[ci].groups.len() as u32).any(|g| self.group_can_send(ci, g))
    }

    /// Points connection `ci`'s policies at their groups' current outbound
    /// bundles, or at none while a layer has no SA (counted as `no_sa`).
    fn refresh_policies(&mut self, ci: usize) {
        let c = &self.conns[ci];
        let actions: Vec<Action> = (0..=c.groups.len() as u32)
            .map(|g| {
                let ids = self.group_ids(ci, g);
                if !c.complete(ids.len()) {
                    Action::Protect(Vec::new())
                } else if c.spec.per_cpu_sas > 1 && ids.len() > 1 {
                    // Per-CPU SAs: this worker's pair alone.
                    Action::Protect(vec![ids[self.worker % ids.len()]])
                } else {
                    Action::Protect(ids)
                }
            })
            .collect();
        for (pi, (c, g)) in self.policy_conn.iter().enumerate() {
            if *c == ci {
                if let Some(a) = actions.get(*g as usize) {
                    self.spd.set_action(pi, a.clone());
                }
            }
        }
    }

    /// Builds the SPD from the connections in order: each connection's
    /// narrowed selector groups first (they lie inside its configured
    /// selectors, so they must match before them), then its configured
    /// selectors. Control path only: it allocates.
    fn rebuild_spd(&mut self) {
        self.spd = Spd::new();
        self.policy_conn.clear();
        for (ci, c) in self.conns.iter().enumerate() {
            let narrowed = c.groups.iter().enumerate().map(|(k, g)| (k as u32 + 1, g));
            for (g, sels) in narrowed.chain(std::iter::once((0, &c.spec.selectors))) {
                for selector in sels {
                    self.spd.push(Policy {
                        selector: *selector,
                        action: Action::Protect(Vec::new()),
                    });
                    self.policy_conn.push((ci, g));
                }
            }
        }
        for ci in 0..self.conns.len() {
            self.refresh_policies(ci);
        }
    }

    /// The selector group of connection `ci` an outbound SA with these
    /// negotiated selectors joins: 0 when they are the configured ones
    /// (in any order) or empty, else an existing group's or `None` (a new
    /// group is needed).
    fn find_group(&self, ci: usize, selectors: &[TrafficSelector]) -> Option<u32> {
        let same = crate::selector::same_set::<TrafficSelector>;
        let c = &self.conns[ci];
        if selectors.is_empty() || same(selectors, &c.spec.selectors) {
            return Some(0);
        }
        c.groups
            .iter()
            .position(|g| same(g, selectors))
            .map(|k| k as u32 + 1)
    }

    /// Drops connection `ci`'s selector group `g` (not 0) once it has no
    /// outbound SA left, renumbering the groups above it; true if it did.
    fn prune_group(&mut self, ci: usize, g: u32) -> bool {
        // By the SAs' records, not `out_ids`: an SA being installed in
        // the group (replacing its last one) has its record already.
        let ours = |m: &SaMeta| m.conn == ci && m.outbound;
        if g == 0 || self.meta.iter().flatten().any(|m| ours(m) && m.group == g) {
            return false;
        }
        self.conns[ci].groups.remove(g as usize - 1);
        for m in self.meta.iter_mut().flatten() {
            if ours(m) && m.group > g {
                m.group -= 1;
            }
        }
        true
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
    /// exact next sequence number goes to its lease first.
    fn remove_sa(&mut self, id: SaId) -> Option<SaMeta> {
        let m = self.meta.get_mut(id.0 as usize)?.take()?;
        if let Some(sa) = self.sad.remove(id) {
            if let Some(l) = sa.lease() {
                l.release(sa.lease_position());
            }
        }
        let c = &mut self.conns[m.conn];
        c.in_ids.retain(|x| *x != id);
        c.out_ids.retain(|x| *x != id);
        if m.outbound {
            if self.prune_group(m.conn, m.group) {
                self.rebuild_spd();
            } else {
                self.refresh_policies(m.conn);
            }
            self.fit_tfc(m.conn);
        }
        Some(m)
    }

    fn conn_index(&self, name: &str) -> Result<usize, String> {
        self.conns
            .iter()
            .position(|c| c.spec.name == name)
            .ok_or_else(|| {
                let names: Vec<String> = self
                    .conns
                    .iter()
                    .map(|c| format!("\"{}\"", c.spec.name))
                    .collect();
                format!(
                    "no connection named \"{name}\" (this gateway has {})",
                    names.join(", ")
                )
            })
    }

    /// One engine per data-plane worker: engine 0 takes the leases; the
    /// others hold copies of the same SAs whose outbound counters and leases
    /// are those of engine 0, so no number is used twice whichever worker
    /// sends. Byte and packet lifetimes are split between the copies, each
    /// counting its own traffic, so that none outlives the configured
    /// limit. Each inbound SA stays only in the engine of the worker its
    /// SPI is steered to ([`worker_of`]), which alone keeps its replay
    /// window.
    pub fn for_workers(
        conns: &[ConnSpec],
        opts: &EngineOptions,
        now: Duration,
        n: usize,
    ) -> Result<Vec<Engine>, String> {
        let mut engines = vec![Engine::build(conns, opts, now, true)?];
        for _ in 1..n {
            let mut e = Engine::build(conns, opts, now, false)?;
            // Only engine 0 takes leases; the others share its.
            e.leases = None;
            engines.push(e);
        }
        if n > 1 {
            let (first, rest) = engines.split_at_mut(1);
            let mut rest: Vec<&mut Engine> = rest.iter_mut().collect();
            first[0].link_workers(&mut rest, None)?;
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
                e.publish();
            }
        }
        Ok(engines)
    }

    /// Removes the inbound SAs that the shell steers to another of `n`
    /// workers: each inbound SA, and so its replay window, lives in exactly
    /// one worker's engine.
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
        self.publish();
    }

    /// Makes the outbound SAs of `others` (copies of this engine's) take
    /// their numbers from this engine's counters and leases; only SA
    /// `only` when given (after an install at run time).
    pub fn link_workers(
        &mut self,
        others: &mut [&mut Engine],
        only: Option<SaId>,
    ) -> Result<(), String> {
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
            let Some(m) = self.meta_of(id) else { continue };
            let Some(sa) = self.sad.get_mut(id) else {
                continue;
            };
            let spi = sa.config().spi;
            let seq = sa.share_seq();
            let lease = sa.lease().cloned();
            let conn = self.conns[m.conn].spec.name.clone();
            for e in others.iter_mut() {
                // Ids differ between engines (each holds only its own
                // inbound SAs): the copy is found by what it is.
                let Some(theirs) = e.find_sa(&conn, true, m.protocol, spi) else {
                    return Err(format!(
                        "worker engines disagree: outbound SA {spi:#010x} of \"{conn}\" is \
                         missing in one (internal error)"
                    ));
                };
                if let Some(sa) = e.sad.get_mut(theirs) {
                    sa.join_seq(seq.clone());
                    if let Some(l) = &lease {
                        sa.set_lease(l.clone());
                    }
                }
                e.publish();
            }
        }
        self.publish();
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
        let id = self.sad.lookup(protocol, spi)?;
        self.meta_of(id)
            .filter(|m| m.outbound == outbound && self.conns[m.conn].spec.name == conn)
            .map(|_| id)
    }

    /// Publishes the SA directory for readers ([`WorkerStats::sas`]):
    /// after every change to the SAs, never on the packet path.
    fn publish(&self) {
        let mut entries = Vec::with_capacity(self.sad.len());
        for (ci, c) in self.conns.iter().enumerate() {
            for id in c.in_ids.iter().chain(&c.out_ids) {
                let (Some(sa), Some(m)) = (self.sad.get(*id), self.meta_of(*id)) else {
                    continue;
                };
                entries.push(SaEntry::of(sa, ci, m.outbound, m.added));
            }
        }
        self.stats.publish(entries);
    }
}
