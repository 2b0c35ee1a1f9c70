//! Security associations: configuration, per-SA state, and ESP/AH
//! processing in tunnel and transport mode (RFC 4301, 4302, 4303, 3948).

mod ah;
mod classifier;
mod esp;
pub mod lifetime;
mod per_cpu;
pub mod replay;
pub mod spec;

use crate::buf::{PacketBuf, Rest};
use crate::cost::{NoProbe, Probe, Stage};
use crate::crypto::{GcmImpl, Suite, SuiteError, Transform};
use crate::error::{DropReason, PResult};
use crate::selector::TrafficSelector;
use crate::stats::{LifeState, SaCounters};
use crate::wire::esp::{EspLayout, Rfc4303};
use crate::wire::flow;
use crate::wire::ip::{self, IpInfo};
use crate::wire::qesp::Qesp;
use crate::wire::{checksum, ipv4, ipv6, proto, udp};
pub use classifier::{classify, Classified, Classifier, Inbound, MAX_UDP_PORTS};
pub use lifetime::{Lifetime, LifetimeState, SaEvent};
pub use per_cpu::per_cpu_key;
use replay::ReplayWindow;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// IPsec protocol of an SA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// Encapsulating Security Payload (RFC 4303).
    Esp,
    /// Authentication Header (RFC 4302).
    Ah,
    /// Q-ESP (seed paper 002, `docs/QESP.md`): ESP with the flow's ports
    /// in a clear header and the outer addresses authenticated.
    Qesp,
}

impl Protocol {
    /// IP protocol number (Q-ESP's default; a gateway may choose another,
    /// [`SaConfig::ip_protocol`]).
    pub const fn number(self) -> u8 {
        match self {
            Protocol::Esp => proto::ESP,
            Protocol::Ah => proto::AH,
            Protocol::Qesp => crate::wire::qesp::DEFAULT_IP_PROTOCOL,
        }
    }
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Esp => "esp",
            Protocol::Ah => "ah",
            Protocol::Qesp => "qesp",
        }
    }
    /// The protocol named `s` (`esp`, `ah`, `qesp`).
    pub fn from_name(s: &str) -> Option<Protocol> {
        match s {
            "esp" => Some(Protocol::Esp),
            "ah" => Some(Protocol::Ah),
            "qesp" => Some(Protocol::Qesp),
            _ => None,
        }
    }
    /// ESP or Q-ESP: an encrypting protocol on the ESP path.
    pub fn is_esp_like(self) -> bool {
        matches!(self, Protocol::Esp | Protocol::Qesp)
    }
}

/// Tunnel or transport mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The whole inner packet is protected behind a new outer header.
    Tunnel,
    /// The packet's own header stays; its payload is protected.
    Transport,
}

/// How ESP travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encap {
    /// Raw ESP/AH over IP (protocol 50/51).
    None,
    /// ESP in UDP (RFC 3948).
    Udp {
        /// Source port of outbound packets.
        src_port: u16,
        /// Destination port of outbound packets.
        dst_port: u16,
    },
}

impl Encap {
    /// RFC 3948 on port 4500 both ways.
    pub const NAT_T: Encap = Encap::Udp {
        src_port: udp::NAT_T_PORT,
        dst_port: udp::NAT_T_PORT,
    };
}

/// Everything needed to install an SA.
#[derive(Clone)]
pub struct SaConfig {
    /// Security Parameters Index.
    pub spi: u32,
    /// ESP or AH.
    pub protocol: Protocol,
    /// Algorithms.
    pub suite: Suite,
    /// Encryption key (with the 4-byte salt for combined modes).
    pub enc_key: Zeroizing<Vec<u8>>,
    /// Integrity key.
    pub integ_key: Zeroizing<Vec<u8>>,
    /// Tunnel or transport.
    pub mode: Mode,
    /// UDP encapsulation.
    pub encap: Encap,
    /// Outer source address of packets on this SA (tunnel mode).
    pub tunnel_src: Option<IpAddr>,
    /// Outer destination address of packets on this SA (tunnel mode).
    pub tunnel_dst: Option<IpAddr>,
    /// 64-bit extended sequence numbers.
    pub esn: bool,
    /// Replay window in packets (0 disables the check).
    pub replay_window: u32,
    /// First sequence number to send; inbound, the window starts just below it.
    pub initial_seq: u64,
    /// Lifetime limits.
    pub lifetime: Lifetime,
    /// Selectors that inbound inner packets must match (empty: any).
    pub selectors: Vec<TrafficSelector>,
    /// Accept legacy suites (DES, 3DES, MD5, encryption without integrity).
    pub allow_insecure: bool,
    /// Tunnel-mode TFC padding: pad inner packets up to this many bytes.
    pub tfc_pad_to: Option<u16>,
    /// TTL / hop limit of outer headers.
    pub ttl: u8,
    /// Copy DSCP from inner to outer header (ECN always follows RFC 6040).
    pub copy_dscp: bool,
    /// IP protocol number of raw packets on this SA: the protocol's own
    /// ([`Protocol::number`]) unless the gateway gives Q-ESP another.
    pub ip_protocol: u8,
    /// Where the explicit IV of an AEAD suite comes from (seed 003's
    /// cluster: [`IvSource::PerNode`]).
    pub iv_source: IvSource,
    /// With [`IvSource::PerNode`]: the first node-local IV counter (from
    /// the SA's lease, so that a node that restarts under the same manual
    /// keys never repeats an IV).
    pub initial_iv: u64,
    /// The library that runs an AES-GCM suite ([`GcmImpl`]); by default
    /// the process's choice, [`GcmImpl::current`].
    pub gcm: GcmImpl,
}

/// Where an AEAD suite's 8-byte explicit IV comes from. RFC 4106 §3.1
/// and RFC 7634 §2 require only that it never repeats under one key; the
/// sequence number is the usual choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IvSource {
    /// The 64-bit sequence number.
    Sequence,
    /// Cluster node `node`: the node id in the high 16 bits and a
    /// node-local counter in the low 48. The nodes of a flat cluster share
    /// one SA and keep its sequence numbers in step by counting the same
    /// packets; if one misses a packet their numbers diverge, and with
    /// [`IvSource::Sequence`] two nodes could then seal different packets
    /// under one nonce. With this source no two nodes ever share an IV,
    /// whatever their counters do. The local counter starts at
    /// [`SaConfig::initial_iv`]; with a [`SeqLease`] it is the local
    /// counter, not the sequence number, that the lease covers, so a
    /// restarted node continues above every IV it may have used.
    PerNode {
        /// This node's id.
        node: crate::cluster::NodeId,
    },
}

impl std::fmt::Debug for SaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaConfig")
            .field("spi", &format_args!("{:#010x}", self.spi))
            .field("protocol", &self.protocol)
            .field("suite", &self.suite.name())
            .field("mode", &self.mode)
            .field("encap", &self.encap)
            .field("esn", &self.esn)
            .finish_non_exhaustive()
    }
}

impl SaConfig {
    /// Addresses the SA to the peer at `peer`. Outbound it sends there: in
    /// tunnel mode to the address, with ESP-in-UDP to the port. Inbound,
    /// where packets from any source are accepted, `peer` is recorded as
    /// their source (for the status and the kernel filter). True if that
    /// changed anything. The address stays in transport mode (the outer
    /// addresses are the inner packet's) and when `peer` is of the other
    /// family (the outer header would change size; the engine refuses
    /// that first, [`crate::gateway::Engine::set_peer`]).
    pub fn set_peer(&mut self, peer: SocketAddr, outbound: bool) -> bool {
        let mut changed = false;
        let addr = if outbound {
            &mut self.tunnel_dst
        } else {
            &mut self.tunnel_src
        };
        if let Some(a) = addr.as_mut() {
            if a.is_ipv4() == peer.is_ipv4() && *a != peer.ip() {
                *a = peer.ip();
                changed = true;
            }
        }
        if let Encap::Udp { src_port, dst_port } = &mut self.encap {
            let port = if outbound { dst_port } else { src_port };
            if *port != peer.port() {
                *port = peer.port();
                changed = true;
            }
        }
        changed
    }

    /// A config with defaults: tunnel mode, raw ESP, 32-bit sequence
    /// numbers, a 1024-packet window, first sequence number 1, no limits.
    pub fn new(
        spi: u32,
        protocol: Protocol,
        suite: Suite,
        enc_key: &[u8],
        integ_key: &[u8],
    ) -> SaConfig {
        SaConfig {
            spi,
            protocol,
            suite,
            enc_key: Zeroizing::new(enc_key.to_vec()),
            integ_key: Zeroizing::new(integ_key.to_vec()),
            mode: Mode::Tunnel,
            encap: Encap::None,
            tunnel_src: None,
            tunnel_dst: None,
            esn: false,
            replay_window: 1024,
            initial_seq: 1,
            lifetime: Lifetime::default(),
            selectors: Vec::new(),
            allow_insecure: false,
            tfc_pad_to: None,
            ttl: 64,
            copy_dscp: true,
            ip_protocol: protocol.number(),
            iv_source: IvSource::Sequence,
            initial_iv: 1,
            gcm: GcmImpl::current(),
        }
    }

    /// Starts where the SA's lease says: the sequence number, or with
    /// [`IvSource::PerNode`] the node-local IV counter (see
    /// [`Sa::lease_position`]).
    pub fn start_at_lease(&mut self, start: u64) {
        match self.iv_source {
            IvSource::Sequence => self.initial_seq = start,
            IvSource::PerNode { .. } => self.initial_iv = start,
        }
    }

    /// Checks that what is needed to *send* on this SA is present.
    pub fn validate_outbound(&self) -> Result<(), SaError> {
        if self.mode == Mode::Tunnel {
            match (self.tunnel_src, self.tunnel_dst) {
                (Some(s), Some(d)) if s.is_ipv4() == d.is_ipv4() => {}
                (Some(_), Some(_)) => {
                    return Err(SaError::Config(
                        "tunnel src and dst must be of the same IP family".into(),
                    ))
                }
                _ => {
                    return Err(SaError::Config(
                        "tunnel mode needs outer src and dst addresses".into(),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// Why an SA could not be installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaError {
    /// Suite or key problem.
    Suite(SuiteError),
    /// Inconsistent configuration.
    Config(String),
}

impl std::fmt::Display for SaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaError::Suite(e) => e.fmt(f),
            SaError::Config(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for SaError {}

impl From<SuiteError> for SaError {
    fn from(e: SuiteError) -> Self {
        SaError::Suite(e)
    }
}

/// A snapshot of an SA's counters ([`Sa::stats`]; the live ones are
/// [`Sa::counters`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaStats {
    /// Packets processed successfully.
    pub packets: u64,
    /// Payload bytes processed successfully.
    pub bytes: u64,
    /// Dummy (next header 59) packets received and discarded.
    pub dummies: u64,
    /// Drops by reason, indexed by [`DropReason::index`].
    pub drops: [u64; DropReason::COUNT],
}

impl SaStats {
    /// A snapshot of `c`.
    pub fn of(c: &SaCounters) -> SaStats {
        let mut drops = [0; DropReason::COUNT];
        for (d, n) in c.drops.all() {
            drops[d.index()] = n;
        }
        SaStats {
            packets: c.packets.get(),
            bytes: c.bytes.get(),
            dummies: c.dummies.get(),
            drops,
        }
    }
}

impl SaStats {
    /// Drops for one reason.
    pub fn drops_for(&self, d: DropReason) -> u64 {
        self.drops[d.index()]
    }
}

/// Result of inbound processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decapsulated {
    /// The buffer now holds the inner IP packet (tunnel) or the restored packet (transport).
    Packet,
    /// A dummy packet (next header 59, RFC 4303 §2.6): discard silently.
    Dummy,
}

/// The outbound sequence counter of an SA that several copies share, one
/// per data-plane worker: each packet takes its number with one atomic
/// `fetch_add`, so no number is used twice whichever worker sends it (an
/// AEAD nonce is never reused).
#[derive(Debug)]
pub struct SharedSeq {
    next: AtomicU64,
}

impl SharedSeq {
    /// A counter whose next number is `next`.
    pub fn new(next: u64) -> SharedSeq {
        SharedSeq {
            next: AtomicU64::new(next),
        }
    }

    /// The next number to be taken.
    pub fn next(&self) -> u64 {
        self.next.load(Ordering::Relaxed)
    }

    #[inline]
    fn take(&self) -> u64 {
        // Saturating: after u64::MAX the counter stays there (exhausted).
        self.next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(1))
            })
            .unwrap_or(u64::MAX)
    }
}

/// Where an outbound SA may take sequence numbers from: a lease on a range
/// of them, kept by the shell (on disk across restarts, or from a
/// coordination service in a cluster), so that no number — and so no AEAD
/// nonce — is ever used twice.
///
/// The packet path only reads: a number at or above [`SeqLease::limit`] is
/// refused ([`DropReason::SeqNotReserved`]) and never used. Extending the
/// lease happens off the packet path: [`SeqLease::want`] only notes that
/// more will be needed (it must not block, write files or allocate on
/// every call), and the shell raises the limit when the new range is safe.
pub trait SeqLease: Send + Sync + std::fmt::Debug {
    /// Numbers below this may be sent now.
    fn limit(&self) -> u64;
    /// The SA is about to send `next`: extend the lease ahead of it if it
    /// is running low. Called for every packet; must be cheap.
    fn want(&self, next: u64);
    /// The SA stops using the lease (removed, or a clean stop): every
    /// number it sent is below `next`.
    fn release(&self, next: u64);
    /// Attempts to extend the lease that failed (a full or read-only
    /// disk): shown with the SA, which stops at [`SeqLease::limit`] while
    /// they fail.
    fn failures(&self) -> u64 {
        0
    }
}

/// An installed SA.
pub struct Sa {
    cfg: SaConfig,
    transform: Transform,
    next_seq: u64,
    /// Set when copies of this outbound SA in several workers share one
    /// counter; `next_seq` is then unused.
    shared_seq: Option<Arc<SharedSeq>>,
    /// The numbers this outbound SA may use (none: all of them).
    lease: Option<Arc<dyn SeqLease>>,
    ip_id: u16,
    /// The tunnel-mode outer header, built on the first packet.
    outer: Option<OuterTemplate>,
    replay: ReplayWindow,
    life: LifetimeState,
    counters: Arc<SaCounters>,
    events: [Option<SaEvent>; 3],
    seq_exhausted_raised: bool,
    /// The next node-local IV counter ([`IvSource::PerNode`]).
    iv_local: u64,
    /// Unprobed outbound packets take [`Sa::esp_tunnel_out`]
    /// ([`Sa::is_plain_tunnel`]).
    plain_tunnel: bool,
    /// The longest inner packet this SA's bundle keeps within the path
    /// ([`Sa::limit_tfc`]): TFC padding stops there.
    tfc_fit: usize,
}

impl std::fmt::Debug for Sa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sa")
            .field("cfg", &self.cfg)
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

/// Q-ESP's mandatory services (`docs/QESP.md` §4): encryption, integrity
/// and anti-replay, and raw IP (the ICV covers the outer addresses, which
/// NAT rewrites).
fn check_qesp(cfg: &SaConfig) -> Result<(), SaError> {
    use crate::crypto::Enc;
    let why = match cfg.suite.enc {
        None | Some(Enc::Null) => Some(format!(
            "Q-ESP requires encryption; {} has none",
            cfg.suite.name()
        )),
        Some(Enc::AesGmac(_)) => Some(format!(
            "Q-ESP requires encryption; {} only authenticates",
            cfg.suite.name()
        )),
        Some(_) if cfg.suite.lacks_integrity() => Some(format!(
            "Q-ESP requires integrity; {} has none",
            cfg.suite.name()
        )),
        Some(_) if cfg.replay_window == 0 => {
            Some("Q-ESP requires anti-replay; replay_window = 0 turns it off".to_string())
        }
        Some(_) if cfg.encap != Encap::None => Some(
            "Q-ESP cannot be UDP-encapsulated: its ICV covers the outer addresses, which NAT rewrites"
                .to_string(),
        ),
        Some(_) => None,
    };
    match why {
        Some(w) => Err(SaError::Config(w)),
        None => Ok(()),
    }
}

impl Sa {
    /// Validates the config, keys the transform and starts the SA at `now`.
    pub fn new(cfg: SaConfig, now: Duration) -> Result<Sa, SaError> {
        cfg.suite.check_policy(cfg.allow_insecure)?;
        match cfg.protocol {
            Protocol::Esp if cfg.suite.enc.is_none() => {
                return Err(SaError::Config(format!(
                    "ESP needs an encryption algorithm; for integrity only use null-{}",
                    cfg.suite.name()
                )))
            }
            Protocol::Ah if cfg.suite.enc.is_some() => {
                return Err(SaError::Config(format!(
                    "AH takes an integrity algorithm only (sha1, sha256, sha384, sha512, aesxcbc, md5), not {}",
                    cfg.suite.name()
                )))
            }
            Protocol::Ah if cfg.encap != Encap::None => {
                return Err(SaError::Config("AH cannot be UDP-encapsulated (RFC 3948 covers ESP only)".into()))
            }
            Protocol::Qesp => check_qesp(&cfg)?,
            _ => {}
        }
        if cfg.protocol == Protocol::Qesp {
            crate::wire::qesp::check_ip_protocol(cfg.ip_protocol).map_err(SaError::Config)?;
        } else if cfg.ip_protocol != cfg.protocol.number() {
            return Err(SaError::Config(format!(
                "{} travels as IP protocol {}, not {}",
                cfg.protocol.name(),
                cfg.protocol.number(),
                cfg.ip_protocol
            )));
        }
        if cfg.spi < 256 {
            return Err(SaError::Config(format!(
                "SPI {:#x} is reserved (RFC 4301 §4.1: 1..255 reserved, 0 invalid)",
                cfg.spi
            )));
        }
        if cfg.initial_seq == 0 {
            return Err(SaError::Config("sequence numbers start at 1".into()));
        }
        if !cfg.esn && cfg.initial_seq > u64::from(u32::MAX) {
            return Err(SaError::Config(
                "a sequence number above 2^32-1 needs esn".into(),
            ));
        }
        let transform = Transform::with_gcm(cfg.suite, &cfg.enc_key, &cfg.integ_key, cfg.gcm)?;
        let replay = ReplayWindow::new(cfg.replay_window, cfg.esn, cfg.initial_seq - 1);
        let counters = Arc::new(SaCounters::default());
        counters.next_seq.set(cfg.initial_seq);
        counters.replay_top.set(replay.top());
        Ok(Sa {
            next_seq: cfg.initial_seq,
            shared_seq: None,
            lease: None,
            ip_id: (cfg.spi as u16) ^ 0x5a5a,
            outer: None,
            replay,
            life: LifetimeState::new(cfg.lifetime, now),
            counters,
            events: [None; 3],
            seq_exhausted_raised: false,
            iv_local: cfg.initial_iv.max(1),
            plain_tunnel: Sa::is_plain_tunnel(&cfg, &transform),
            tfc_fit: usize::MAX,
            transform,
            cfg,
        })
    }

    /// Caps TFC padding at `fit` bytes: the longest inner packet this
    /// SA's bundle keeps within the path MTU (the owner of the bundle
    /// knows it). Padding to `tfc_pad_to` beyond that would make every
    /// padded packet exceed the path; Linux caps it the same way
    /// (`esp_output`: the pad target is at most the state's MTU).
    pub fn limit_tfc(&mut self, fit: usize) {
        self.tfc_fit = fit;
    }

    /// The length TFC padding brings inner packets to: `tfc_pad_to`,
    /// capped by [`Sa::limit_tfc`] (`None`: no TFC padding).
    pub fn tfc_pad_target(&self) -> Option<usize> {
        let t = usize::from(self.cfg.tfc_pad_to?);
        Some(t.min(self.tfc_fit))
    }

    /// `tfc_pad_to` and the shorter length the path caps it at, when
    /// [`Sa::limit_tfc`] caps it (for the operator's log).
    pub fn tfc_cap(&self) -> Option<(u16, usize)> {
        let asked = self.cfg.tfc_pad_to?;
        let to = self.tfc_pad_target()?;
        (to < usize::from(asked)).then_some((asked, to))
    }

    /// The peer is at `peer` from now on (RFC 7296 §2.23: a validated IKE
    /// message came from a NAT's new mapping of it): [`SaConfig::set_peer`].
    pub fn set_peer(&mut self, peer: SocketAddr, outbound: bool) -> bool {
        let changed = self.cfg.set_peer(peer, outbound);
        if changed {
            // The outer header is built from the template again.
            self.outer = None;
        }
        changed
    }

    /// Configuration (keys included; never log it with keys).
    pub fn config(&self) -> &SaConfig {
        &self.cfg
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SaStats {
        SaStats::of(&self.counters)
    }

    /// The live counters, readable from any thread while the SA works.
    pub fn counters(&self) -> &Arc<SaCounters> {
        &self.counters
    }

    /// Takes sequence numbers only below `lease`'s limit from now on.
    pub fn set_lease(&mut self, lease: Arc<dyn SeqLease>) {
        self.lease = Some(lease);
    }

    /// The lease of this outbound SA, if any.
    pub fn lease(&self) -> Option<&Arc<dyn SeqLease>> {
        self.lease.as_ref()
    }

    /// Lifetime counters and limits.
    pub fn lifetime(&self) -> &LifetimeState {
        &self.life
    }

    /// Next outbound sequence number.
    pub fn next_seq(&self) -> u64 {
        match &self.shared_seq {
            Some(s) => s.next(),
            None => self.next_seq,
        }
    }

    /// What the SA's lease counts: the next sequence number, or with
    /// [`IvSource::PerNode`] the next node-local IV counter. A clean stop
    /// releases the lease at this.
    pub fn lease_position(&self) -> u64 {
        match self.cfg.iv_source {
            IvSource::Sequence => self.next_seq(),
            IvSource::PerNode { .. } => self.iv_local,
        }
    }

    /// Seed 003's lockstep: moves this outbound SA's next sequence number
    /// to where the other nodes of the cluster are. Only for an SA whose
    /// IVs are per node ([`IvSource::PerNode`]): there a sequence number
    /// used twice costs a replay drop at the peer, never a nonce. Refused
    /// (false) otherwise, for a shared counter, and for 0 or beyond the
    /// sequence space.
    pub fn resync_seq(&mut self, next: u64) -> bool {
        let max = if self.cfg.esn {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        };
        let per_node = matches!(self.cfg.iv_source, IvSource::PerNode { .. });
        if !per_node || self.shared_seq.is_some() || next == 0 || next > max {
            return false;
        }
        self.next_seq = next;
        self.counters.next_seq.set(next);
        true
    }

    /// This SA's sequence counter, made shareable: later packets take their
    /// numbers from it, and [`Sa::join_seq`] lets copies of the SA (same
    /// SPI and keys, in other workers) take theirs from it too.
    pub fn share_seq(&mut self) -> Arc<SharedSeq> {
        let next = self.next_seq;
        self.shared_seq
            .get_or_insert_with(|| Arc::new(SharedSeq::new(next)))
            .clone()
    }

    /// The counter this SA shares with its copies in other workers, if any.
    pub fn shared_seq(&self) -> Option<&Arc<SharedSeq>> {
        self.shared_seq.as_ref()
    }

    /// Takes sequence numbers from `seq` (made by [`Sa::share_seq`] on
    /// the copy of this SA that owns the counter) from now on.
    pub fn join_seq(&mut self, seq: Arc<SharedSeq>) {
        self.shared_seq = Some(seq);
    }

    /// Divides the byte and packet lifetime limits by `n` (rounding up),
    /// for one of `n` copies of an SA that each count only their own
    /// packets: every copy expires no later than the whole SA would.
    pub fn split_volume_limits(&mut self, n: u64) {
        self.life.split_volume_limits(n);
    }

    /// Highest inbound sequence number authenticated.
    pub fn replay_top(&self) -> u64 {
        self.replay.top()
    }

    /// How outbound processing grows a packet: outer header, UDP, ESP
    /// header, IV and ICV (or the AH header) whatever its length, plus a
    /// padded trailer for ESP and Q-ESP. A transport-mode AH SA is counted
    /// for IPv6, whose AH header may be 4 bytes longer.
    pub fn growth(&self) -> Growth {
        self.growth_in(true)
    }

    /// [`Sa::growth`] for packets of IPv6 (`v6`) or IPv4 where the SA does
    /// not fix the family itself (a transport-mode SA).
    pub fn growth_in(&self, v6: bool) -> Growth {
        let (mode, suite) = (self.cfg.mode, self.transform.suite());
        let v6 = match (mode, self.cfg.tunnel_dst) {
            (Mode::Tunnel, Some(d)) => d.is_ipv6(),
            _ => v6,
        };
        match self.cfg.protocol {
            Protocol::Esp | Protocol::Qesp => {
                let udp = matches!(self.cfg.encap, Encap::Udp { .. });
                Growth::esp(mode, v6, udp, self.cfg.protocol, &suite)
            }
            Protocol::Ah => Growth::ah(mode, v6, &suite),
        }
    }

    /// Largest number of bytes outbound processing adds to a packet, for
    /// buffer sizing: [`Growth::worst`] (worst-case padding included).
    pub fn overhead(&self) -> usize {
        self.growth().worst()
    }

    /// Next pending event, if any.
    pub fn poll_event(&mut self) -> Option<SaEvent> {
        let i = self.events.iter().position(Option::is_some)?;
        self.events[i].take()
    }

    fn raise(&mut self, e: SaEvent) {
        match e {
            SaEvent::SoftExpired => self.counters.set_life(LifeState::SoftExpired),
            SaEvent::HardExpired => self.counters.set_life(LifeState::HardExpired),
            SaEvent::SeqExhausted => {}
        }
        if let Some(slot) = self.events.iter_mut().find(|s| s.is_none()) {
            *slot = Some(e);
        }
    }

    /// Advances time-based lifetimes; call from a timer.
    pub fn tick(&mut self, now: Duration) {
        if let Some(e) = self.life.poll(now) {
            self.raise(e);
        }
    }

    #[inline(always)]
    fn account(&mut self, bytes: usize, now: Duration) {
        self.counters.packets.incr();
        self.counters.bytes.add(bytes as u64);
        if let Some(e) = self.life.account(bytes, now) {
            self.raise(e);
        }
    }

    /// Counts a packet this node kept the state of without processing it
    /// (seed 003's cluster): the lifetime advances as on the node that
    /// processed it; `packets`/`bytes` stay this node's own work.
    fn observed(&mut self, bytes: usize, now: Duration) {
        self.counters.observed.incr();
        if let Some(e) = self.life.account(bytes, now) {
            self.raise(e);
        }
    }

    /// Seed 003's flat cluster, outbound, on a node that does not process
    /// this packet: takes the sequence number and advances the lifetime
    /// exactly as [`Sa::encapsulate`] would for an inner packet of
    /// `inner_len` bytes, and seals nothing. Returns the number taken.
    /// (Every node peeks [`Sa::next_seq`] first, asks the dispatcher, then
    /// encapsulates or observes.)
    pub fn observe_outbound(&mut self, inner_len: usize, now: Duration) -> PResult<u64> {
        let r = self.take_seq(now);
        if r.is_ok() {
            self.observed(inner_len, now);
        }
        self.count_drop(r)
    }

    /// Seed 003's flat cluster, inbound, on a node that does not process
    /// this packet: the replay check, the ICV (without decrypting where
    /// the suite allows, [`Transform::verify`]) and the window update, as
    /// [`Sa::decapsulate`] does them; the packet goes no further. AH is
    /// verified in full (it has nothing to decrypt). Returns the sequence
    /// number.
    pub fn observe_inbound(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        now: Duration,
    ) -> PResult<u64> {
        let r = match inb.protocol {
            Protocol::Esp => self.esp_observe::<Rfc4303>(buf, inb, now),
            Protocol::Qesp => self.esp_observe::<Qesp>(buf, inb, now),
            Protocol::Ah => {
                let seq = self.replay.top();
                self.ah_in(buf, inb, now, &mut NoProbe)
                    .map(|_| self.replay.top().max(seq))
            }
        };
        self.count_drop(r)
    }

    fn count_drop<T>(&mut self, r: PResult<T>) -> PResult<T> {
        if let Err(d) = &r {
            self.counters.drops.count(*d);
        }
        r
    }

    /// Reserves the next outbound sequence number, refusing to wrap.
    ///
    /// This, [`Sa::account`] and [`Sa::push_outer`] are forced inline:
    /// the one-function outbound path ([`Sa::esp_tunnel_out`]) and the
    /// path sealing from the caller's packet gain only with them inlined
    /// (with `#[inline]` alone they stayed calls).
    #[inline(always)]
    fn take_seq(&mut self, now: Duration) -> PResult<u64> {
        if self.life.has_pending_time_limit() {
            self.tick(now);
        }
        if self.life.is_hard_expired() {
            return Err(DropReason::SaExpired);
        }
        let max = if self.cfg.esn {
            u64::MAX
        } else {
            u64::from(u32::MAX)
        };
        let (seq, shared) = match &self.shared_seq {
            Some(s) => (s.take(), true),
            None => (self.next_seq, false),
        };
        if seq > max || seq == 0 || (shared && seq == u64::MAX) {
            if !self.seq_exhausted_raised {
                self.seq_exhausted_raised = true;
                self.raise(SaEvent::SeqExhausted);
            }
            return Err(DropReason::SeqExhausted);
        }
        if let (Some(l), IvSource::Sequence) = (&self.lease, self.cfg.iv_source) {
            if seq >= l.limit() {
                return Err(DropReason::SeqNotReserved);
            }
            l.want(seq);
        }
        // After u64::MAX, 0 marks exhaustion (checked above).
        let after = seq.wrapping_add(1);
        if !shared {
            self.next_seq = after;
            self.counters.next_seq.set(after);
        }
        if after > max || after == 0 {
            // That was the last number: ask for a replacement now.
            if !self.seq_exhausted_raised {
                self.seq_exhausted_raised = true;
                self.raise(SaEvent::SeqExhausted);
            }
        }
        Ok(seq)
    }

    /// Protects the IP packet in `buf` in place; `buf` then holds the packet to send.
    pub fn encapsulate(&mut self, buf: &mut PacketBuf, now: Duration) -> PResult<()> {
        self.encapsulate_probed(buf, now, &mut NoProbe)
    }

    /// [`Sa::encapsulate`], marking its stages on `probe` (see
    /// [`crate::cost`]): `Replay` (sequence number), `Encap`, `Cipher`,
    /// `Integrity`, `Encap`.
    pub fn encapsulate_probed<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> PResult<()> {
        let r = if self.plain_tunnel && !probe.active() {
            self.esp_tunnel_out(buf, now)
        } else {
            self.encapsulate_inner(buf, now, probe)
        };
        self.count_drop(r)
    }

    fn encapsulate_inner<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> PResult<()> {
        let info = ip::parse(buf.as_slice())?;
        buf.truncate(info.packet_len);
        self.numbered(info.packet_len, now, probe, |sa, seq, probe| {
            match sa.cfg.protocol {
                Protocol::Esp => sa.esp_out::<Rfc4303, P>(buf, &info, seq, probe),
                Protocol::Qesp => sa.esp_out::<Qesp, P>(buf, &info, seq, probe),
                Protocol::Ah => sa.ah_out(buf, &info, seq, probe),
            }
        })
    }

    /// Protects one packet of `len` bytes with the next sequence number:
    /// takes it, lets `seal` protect the packet with it, then counts the
    /// packet against the lifetime (the steps around the sealing that
    /// [`Sa::encapsulate`] and [`Sa::encapsulate_from`] share).
    fn numbered<P: Probe + ?Sized>(
        &mut self,
        len: usize,
        now: Duration,
        probe: &mut P,
        seal: impl FnOnce(&mut Sa, u64, &mut P) -> PResult<()>,
    ) -> PResult<()> {
        let seq = self.take_seq(now);
        probe.mark(Stage::Replay);
        seal(self, seq?, probe)?;
        self.account(len, now);
        probe.mark(Stage::Encap);
        Ok(())
    }

    /// Whether [`Sa::encapsulate_from`] seals straight from the caller's
    /// packet: ESP in tunnel mode with AES-GCM and no TFC padding
    /// ([`Transform::seals_from`]). Otherwise it copies the packet into
    /// the buffer first.
    pub fn seals_from(&self) -> bool {
        self.cfg.protocol == Protocol::Esp
            && self.cfg.mode == Mode::Tunnel
            && self.cfg.tfc_pad_to.is_none()
            && self.transform.seals_from()
    }

    /// Protects the IP packet `clear` into `out`, which then holds the
    /// packet to send: the same bytes, counters and events as
    /// [`Sa::encapsulate`] on a copy of `clear`. Where [`Sa::seals_from`]
    /// holds the copy is not made: the cipher reads `clear` where it lies
    /// (a segment of a TSO read) and writes into `out`.
    pub fn encapsulate_from(
        &mut self,
        clear: &[u8],
        out: &mut PacketBuf,
        now: Duration,
    ) -> PResult<()> {
        self.encapsulate_from_probed(clear, out, now, &mut NoProbe)
    }

    /// [`Sa::encapsulate_from`], marking the stages of
    /// [`Sa::encapsulate_probed`] on `probe`.
    pub fn encapsulate_from_probed<P: Probe + ?Sized>(
        &mut self,
        clear: &[u8],
        out: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> PResult<()> {
        match ip::parse(clear) {
            Ok(info) => self.encapsulate_parsed(clear, &info, out, now, probe),
            Err(d) if self.seals_from() => self.count_drop(Err(d)),
            // The general path finds (and counts) what is wrong with it.
            Err(_) => self.encapsulate_copy(clear, out, now, probe),
        }
    }

    /// [`Sa::encapsulate_from_probed`] of a packet whose IP header `info`
    /// the caller already parsed (the engine, to find its flow), so the
    /// per-packet path parses it once.
    pub(crate) fn encapsulate_parsed<P: Probe + ?Sized>(
        &mut self,
        clear: &[u8],
        info: &IpInfo,
        out: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> PResult<()> {
        if !self.seals_from() {
            return self.encapsulate_copy(clear, out, now, probe);
        }
        let r = clear
            .get(..info.packet_len)
            .ok_or(DropReason::BadLength)
            .and_then(|clear| {
                self.numbered(clear.len(), now, probe, |sa, seq, probe| {
                    sa.esp_out_from::<Rfc4303, P>(clear, out, info, seq, probe)
                })
            });
        self.count_drop(r)
    }

    /// The way without [`Sa::seals_from`]: `clear` copied into `out`, then
    /// [`Sa::encapsulate_probed`].
    fn encapsulate_copy<P: Probe + ?Sized>(
        &mut self,
        clear: &[u8],
        out: &mut PacketBuf,
        now: Duration,
        probe: &mut P,
    ) -> PResult<()> {
        out.load(clear);
        self.encapsulate_probed(out, now, probe)
    }

    /// Verifies and removes this SA's ESP/AH layer (`inb` from [`classify`]).
    pub fn decapsulate(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        now: Duration,
    ) -> PResult<Decapsulated> {
        self.decapsulate_probed(buf, inb, now, &mut NoProbe)
    }

    /// [`Sa::decapsulate`], marking its stages on `probe` (see
    /// [`crate::cost`]): `Replay` (check), `Integrity`, `Cipher`, `Replay`
    /// (update), `Decap`; a packet refused stops at the stage refusing it.
    pub fn decapsulate_probed<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        now: Duration,
        probe: &mut P,
    ) -> PResult<Decapsulated> {
        self.decapsulate_rest(buf, inb, None, now, probe)
    }

    /// [`Sa::decapsulate`] of a buffer loaded with
    /// [`PacketBuf::load_head`] from `src` (then headers may have been
    /// pushed in front: the buffer's last `src.len()` bytes stand for
    /// `src`), as the gateway receives a datagram: ESP and Q-ESP decrypt
    /// the body straight from `src`. The same result, bytes and counters
    /// as loading `src` whole; a buffer shorter than `src` is `BadLength`.
    pub fn decapsulate_from(
        &mut self,
        buf: &mut PacketBuf,
        src: &[u8],
        inb: &Inbound,
        now: Duration,
    ) -> PResult<Decapsulated> {
        match Rest::of(buf, src) {
            Some(r) => self.decapsulate_rest(buf, inb, Some(&r), now, &mut NoProbe),
            None => self.count_drop(Err(DropReason::BadLength)),
        }
    }

    /// [`Sa::decapsulate_probed`] of a buffer loaded with
    /// [`PacketBuf::load_head`] whose `rest` is still outside it: ESP and
    /// Q-ESP decrypt the body straight from it, AH (which authenticates
    /// the whole packet in place) copies it in first.
    pub(crate) fn decapsulate_rest<P: Probe + ?Sized>(
        &mut self,
        buf: &mut PacketBuf,
        inb: &Inbound,
        rest: Option<&Rest<'_>>,
        now: Duration,
        probe: &mut P,
    ) -> PResult<Decapsulated> {
        let r = match inb.protocol {
            Protocol::Esp => self.esp_in::<Rfc4303, P>(buf, inb, rest, now, probe),
            Protocol::Qesp => self.esp_in::<Qesp, P>(buf, inb, rest, now, probe),
            Protocol::Ah => {
                if let Some(r) = rest {
                    r.fill(buf);
                }
                self.ah_in(buf, inb, now, probe)
            }
        };
        self.count_drop(r)
    }

    fn esn_hi(&self, seq: u64) -> Option<[u8; 4]> {
        self.cfg.esn.then(|| ((seq >> 32) as u32).to_be_bytes())
    }

    /// Checks the restored inner packet against the SA's selectors.
    fn check_selectors(&self, pkt: &[u8]) -> PResult<()> {
        if self.cfg.selectors.is_empty() {
            return Ok(());
        }
        let f = flow::of_packet(pkt)?;
        if self.cfg.selectors.iter().any(|s| s.matches_inbound(&f)) {
            Ok(())
        } else {
            Err(DropReason::SelectorMismatch)
        }
    }

    /// Writes the outer header for tunnel mode in front of `buf`, from the
    /// SA's template ([`OuterTemplate`]).
    #[inline(always)]
    fn push_outer(&mut self, buf: &mut PacketBuf, inner: &IpInfo, protocol: u8) -> PResult<()> {
        let t = match &self.outer {
            Some(t) if t.protocol == protocol => t,
            _ => self.outer.insert(OuterTemplate::new(&self.cfg, protocol)?),
        };
        let tos = if self.cfg.copy_dscp {
            inner.tos
        } else {
            inner.tos & 0x03
        };
        let payload_len = buf.len();
        if t.v6 {
            let len = u16::try_from(payload_len).map_err(|_| DropReason::TooBig)?;
            let h = &mut buf.push_front(ipv6::HEADER_LEN)[..ipv6::HEADER_LEN];
            h.copy_from_slice(&t.hdr);
            // Version 6, the traffic class across bytes 0-1, flow label 0.
            h[0] = 0x60 | (tos >> 4);
            h[1] = tos << 4;
            h[4..6].copy_from_slice(&len.to_be_bytes());
        } else {
            let total = u16::try_from(payload_len + ipv4::MIN_HEADER_LEN)
                .map_err(|_| DropReason::TooBig)?;
            self.ip_id = self.ip_id.wrapping_add(1);
            let flags: u16 = if inner.dont_frag { 0x4000 } else { 0 };
            let sum = t.sum
                + u32::from(tos)
                + u32::from(total)
                + u32::from(self.ip_id)
                + u32::from(flags);
            let h = &mut buf.push_front(ipv4::MIN_HEADER_LEN)[..ipv4::MIN_HEADER_LEN];
            h.copy_from_slice(&t.hdr[..ipv4::MIN_HEADER_LEN]);
            h[1] = tos;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[4..6].copy_from_slice(&self.ip_id.to_be_bytes());
            h[6..8].copy_from_slice(&flags.to_be_bytes());
            h[10..12].copy_from_slice(&checksum::finish(sum).to_be_bytes());
        }
        Ok(())
    }
}

/// The outer header of a tunnel-mode SA with its fixed fields (version,
/// TTL, protocol, addresses) written once, and for IPv4 the checksum sum
/// of those fields: each packet copies it and writes only what varies
/// (TOS, length, identification, DF), finishing the checksum from the sum
/// instead of summing the header again. The same bytes as
/// [`ipv4::Ipv4Repr::emit`] and [`ipv6::Ipv6Repr::emit`] (a test compares
/// them).
#[derive(Debug, Clone, Copy)]
struct OuterTemplate {
    /// The outer protocol it was built for.
    protocol: u8,
    v6: bool,
    /// 20 bytes for IPv4, 40 for IPv6 (TOS, lengths, identification, flags
    /// and checksum zero).
    hdr: [u8; ipv6::HEADER_LEN],
    /// IPv4: the one's-complement sum of the fixed header words.
    sum: u32,
}

impl OuterTemplate {
    fn new(cfg: &SaConfig, protocol: u8) -> PResult<OuterTemplate> {
        let mut hdr = [0u8; ipv6::HEADER_LEN];
        let v6 = match (cfg.tunnel_src, cfg.tunnel_dst) {
            (Some(IpAddr::V4(s)), Some(IpAddr::V4(d))) => {
                ipv4::Ipv4Repr {
                    src: s,
                    dst: d,
                    protocol,
                    tos: 0,
                    ident: 0,
                    dont_frag: false,
                    ttl: cfg.ttl,
                    payload_len: 0,
                }
                .emit(&mut hdr)?;
                // Length and checksum out: the packet's are added later.
                hdr[2..4].fill(0);
                hdr[10..12].fill(0);
                false
            }
            (Some(IpAddr::V6(s)), Some(IpAddr::V6(d))) => {
                ipv6::Ipv6Repr {
                    src: s,
                    dst: d,
                    next_header: protocol,
                    traffic_class: 0,
                    flow_label: 0,
                    hop_limit: cfg.ttl,
                    payload_len: 0,
                }
                .emit(&mut hdr)?;
                true
            }
            _ => return Err(DropReason::Unsupported),
        };
        let sum = if v6 {
            0
        } else {
            checksum::sum(0, &hdr[..ipv4::MIN_HEADER_LEN])
        };
        Ok(OuterTemplate {
            protocol,
            v6,
            hdr,
            sum,
        })
    }
}

/// Inner-packet checks common to tunnel-mode decapsulation: the next header
/// must name an IP version that matches the packet, the packet is trimmed to
/// its own length (dropping TFC padding), and ECN is merged (RFC 6040 §4.2).
fn finish_tunnel_inner(
    buf: &mut PacketBuf,
    start: usize,
    len: usize,
    nh: u8,
    outer_tos: u8,
) -> PResult<()> {
    let want = match nh {
        proto::IPV4 => 4,
        proto::IPV6 => 6,
        _ => return Err(DropReason::BadNextHeader),
    };
    buf.trim_front(start);
    buf.truncate(len);
    let info = ip::parse(buf.as_slice()).map_err(|_| DropReason::BadNextHeader)?;
    if info.version != want {
        return Err(DropReason::BadNextHeader);
    }
    buf.truncate(info.packet_len);
    let outer_ecn = outer_tos & 0x03;
    let inner_ecn = info.tos & 0x03;
    if outer_ecn == 0x03 && inner_ecn != 0x03 {
        if inner_ecn == 0 {
            // Not-ECT inner with CE outer: the congestion mark cannot be carried.
            return Err(DropReason::EcnDrop);
        }
        set_tos(buf.as_mut_slice(), info.version, info.tos | 0x03);
    }
    Ok(())
}

/// Rewrites the DS byte of an IP header (IPv4 checksum updated).
fn set_tos(pkt: &mut [u8], version: u8, tos: u8) {
    if version == 4 {
        if let Ok(mut h) = ipv4::Ipv4::new_checked(&mut pkt[..]) {
            h.set_tos(tos);
            h.fill_checksum();
        }
    } else {
        ipv6::set_traffic_class(pkt, tos);
    }
}

/// After a header was inserted or removed behind the IP header (transport
/// mode), fixes the next-header byte at `nh_field`, the length field, and the
/// IPv4 checksum.
fn fix_transport_header(pkt: &mut [u8], version: u8, nh_field: usize, nh: u8) -> PResult<()> {
    let total = pkt.len();
    pkt[nh_field] = nh;
    if version == 4 {
        let total = u16::try_from(total).map_err(|_| DropReason::TooBig)?;
        let mut h = ipv4::Ipv4::new_header_checked(pkt)?;
        h.set_packet_len(total);
        h.fill_checksum();
    } else {
        let plen = u16::try_from(total - ipv6::HEADER_LEN).map_err(|_| DropReason::TooBig)?;
        ipv6::set_payload_len(pkt, plen);
    }
    Ok(())
}

/// How one protection layer grows a packet: `fixed` bytes whatever its
/// length, and a body (the packet, padding and a `trailer` of fixed
/// length) padded to a multiple of `align` bytes. ESP and Q-ESP: outer
/// header, UDP, ESP header, IV and ICV fixed, the 2-byte trailer, the
/// suite's [`Suite::pad_align`]; AH: its whole header fixed, nothing
/// padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Growth {
    /// Bytes added whatever the packet's length.
    pub fixed: usize,
    /// Bytes of trailer inside the padded body.
    pub trailer: usize,
    /// The body's length is a multiple of this (at least 1).
    pub align: usize,
}

impl Growth {
    /// An ESP (or Q-ESP, whose header is longer) layer of `suite` in
    /// `mode` over IPv6 (`v6`) or IPv4, in UDP if `udp`. In transport mode
    /// the padded body starts after the packet's IP header, whose length
    /// varies: [`Growth::unaligned`].
    pub fn esp(mode: Mode, v6: bool, udp: bool, protocol: Protocol, suite: &Suite) -> Growth {
        let header = if protocol == Protocol::Qesp {
            Qesp::HEADER_LEN
        } else {
            Rfc4303::HEADER_LEN
        };
        let g = Growth {
            fixed: Growth::outer(mode, v6)
                + if udp { udp::HEADER_LEN } else { 0 }
                + header
                + suite.iv_len()
                + suite.icv_len(),
            trailer: crate::wire::esp::TRAILER_LEN,
            align: suite.pad_align().max(4),
        };
        match mode {
            Mode::Tunnel => g,
            Mode::Transport => g.unaligned(),
        }
    }

    /// An AH layer of `suite` in `mode` over IPv6 (`v6`) or IPv4: its
    /// header is padded to 4 bytes in IPv4, to 8 in IPv6 (RFC 4302 §2.6),
    /// and nothing else is.
    pub fn ah(mode: Mode, v6: bool, suite: &Suite) -> Growth {
        Growth {
            fixed: Growth::outer(mode, v6) + crate::wire::ah::header_len(suite.icv_len(), v6),
            trailer: 0,
            align: 1,
        }
    }

    /// The outer IP header a tunnel-mode layer adds (none in transport
    /// mode).
    fn outer(mode: Mode, v6: bool) -> usize {
        match (mode, v6) {
            (Mode::Transport, _) => 0,
            (Mode::Tunnel, true) => ipv6::HEADER_LEN,
            (Mode::Tunnel, false) => ipv4::MIN_HEADER_LEN,
        }
    }

    /// The same layer where the padded body does not start at the packet's
    /// first byte but after a header of varying length (transport mode:
    /// after the IP header, its options or extension headers): the padding
    /// is counted at its worst, as fixed bytes.
    pub fn unaligned(self) -> Growth {
        Growth {
            fixed: self.fixed + self.align.max(1) - 1,
            trailer: self.trailer,
            align: 1,
        }
    }

    /// The most bytes it adds to any packet (`align - 1` bytes of padding).
    pub fn worst(self) -> usize {
        self.fixed + self.trailer + self.align.max(1) - 1
    }

    /// The longest packet that is at most `room` bytes once protected: the
    /// body gets what is left of `room` after the fixed bytes, rounded down
    /// to whole `align`s, less the trailer (as Linux sizes its ESP MTU,
    /// `esp4_get_mtu`). Exact, where `room` less [`Growth::worst`] may be
    /// short by up to `align - 1` bytes: at a 1500-byte MTU an AES-GCM
    /// tunnel in UDP over IPv4 fits 1438-byte packets, not 1423.
    pub fn fit(self, room: usize) -> usize {
        let body = room.saturating_sub(self.fixed);
        (body - body % self.align.max(1)).saturating_sub(self.trailer)
    }
}

#[cfg(test)]
mod tests;
