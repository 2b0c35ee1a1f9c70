//! The IKEv2 state machine (RFC 7296), sans-IO.
//!
//! [`Ike`] takes datagrams ([`Ike::handle`]), commands ([`Ike::initiate`],
//! [`Ike::terminate`]) and the passing of time ([`Ike::handle_timeout`]),
//! always with the current time as a `Duration` since an epoch the caller
//! picks. It answers with datagrams to send ([`Ike::poll_transmit`]) and
//! events ([`Ike::poll_event`]): child SAs to install or remove, IKE SAs up
//! and down, log lines. It never reads a clock (an optional cost clock can
//! be lent to it for measurements), never opens a socket.

use super::cert::{verify_chain, Certificate, Identity};
use super::config::{DpdAction, IkeConfig, LocalAuth, QespMode, RemoteAuth};
use super::dh::{DhError, Group, KeyExchange};
use super::keys::{derive_child_keys, derive_ike_keys, psk_auth, signed_octets, IkeKeyInput, Prf};
use super::proposal::{qesp_capable, select, select_as, Chosen, ProposalKind, ProposalSpec};
use super::rng::{self, Rng, RngError, SystemRng};
use super::sk::{SkCrypto, SkError};
use super::ts;
use super::wire::{
    self, auth_method, cert_encoding, protocol, Delete, ExchangeType, Header, Id, Message, Notify,
    NotifyType, Payload, PayloadType, TrafficSelector,
};
use espgate_core::crypto::Suite;
use espgate_core::sa::{Mode, Protocol};
use slab::Slab;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use zeroize::Zeroizing;

mod counters;
mod snapshot;
mod timer;
pub use counters::{Counters, IkeEvent};
pub use snapshot::{ChildSnapshot, IkeSnapshot};
use timer::{Timer, TimerTable};

/// A datagram to send. When `local` is the NAT-T port the shell prefixes
/// the four-byte non-ESP marker (RFC 3948 §2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Our address and port to send from.
    pub local: SocketAddr,
    /// Where to.
    pub remote: SocketAddr,
    /// The IKE message.
    pub data: Vec<u8>,
}

/// One direction of a negotiated child SA, ready for the data plane.
pub struct SaInstall {
    /// Connection name.
    pub conn: String,
    /// We send on it (else we receive on it).
    pub outbound: bool,
    /// SPI (chosen by the receiving side).
    pub spi: u32,
    /// ESP, or Q-ESP when the child SA was negotiated with Protocol ID
    /// [`protocol::QESP`] (`docs/QESP.md` §7).
    pub protocol: Protocol,
    /// Cipher suite.
    pub suite: Suite,
    /// Encryption key (with salt for AEAD).
    pub enc_key: Zeroizing<Vec<u8>>,
    /// Integrity key.
    pub integ_key: Zeroizing<Vec<u8>>,
    /// Extended sequence numbers.
    pub esn: bool,
    /// Tunnel or transport.
    pub mode: Mode,
    /// UDP encapsulation ports (ours, the peer's), when NAT-T is in use.
    pub encap: Option<(u16, u16)>,
    /// Our outer address.
    pub local: IpAddr,
    /// The peer's outer address.
    pub remote: IpAddr,
    /// Negotiated selectors, our side.
    pub local_ts: Vec<TrafficSelector>,
    /// Negotiated selectors, the peer's side.
    pub remote_ts: Vec<TrafficSelector>,
    /// The configured selector set (ours, the peer's) that the negotiated
    /// ones lie in: what the data plane falls back to if the negotiated
    /// ones are too many prefixes to install, rather than every set of
    /// the connection.
    pub set_ts: (Vec<TrafficSelector>, Vec<TrafficSelector>),
    /// Its per-CPU slot (RFC 9611, `per_cpu_sas`): an outbound SA replaces
    /// only the connection's outbound SA of the same slot, and the data
    /// plane's worker `w` sends on slot `w % slots`. 0 for a connection
    /// with one child.
    pub slot: u32,
}

impl fmt::Debug for SaInstall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaInstall")
            .field("conn", &self.conn)
            .field("outbound", &self.outbound)
            .field("spi", &format_args!("{:#010x}", self.spi))
            .field("protocol", &self.protocol)
            .field("suite", &self.suite.name())
            .field("esn", &self.esn)
            .field("encap", &self.encap)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

/// Severity of an [`Event::Log`] line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Something failed or was refused.
    Warn,
    /// A state change an operator wants to see.
    Info,
    /// Detail.
    Debug,
}

/// What the engine tells the shell.
#[derive(Debug)]
pub enum Event {
    /// Install one direction of a child SA. An outbound install replaces
    /// the connection's current outbound SA (make-before-break: the old
    /// inbound SA stays until a [`Event::RemoveSa`]).
    InstallSa(SaInstall),
    /// Remove an SA.
    RemoveSa {
        /// Connection name.
        conn: String,
        /// SPI.
        spi: u32,
        /// ESP or Q-ESP, as it was installed.
        protocol: Protocol,
        /// Direction.
        outbound: bool,
    },
    /// The peer of an established IKE SA now sends from `remote`: behind
    /// a NAT that gave it another port or address (RFC 7296 §2.23), or
    /// moved there itself and said so with MOBIKE (RFC 4555). Everything
    /// goes there now, so the connection's outbound ESP should follow, not
    /// only IKE.
    PeerMoved {
        /// Connection name.
        conn: String,
        /// Where the peer's authenticated message came from.
        remote: SocketAddr,
    },
    /// An IKE SA is established (or replaced one by rekeying).
    IkeUp {
        /// Connection name.
        conn: String,
        /// Negotiated algorithms.
        algorithms: String,
    },
    /// An IKE SA is gone with all its children.
    IkeDown {
        /// Connection name.
        conn: String,
        /// Why.
        reason: String,
    },
    /// A log line for the operator.
    Log {
        /// Severity.
        level: Level,
        /// Connection, when known.
        conn: Option<String>,
        /// Text (never key material).
        message: String,
    },
}

/// Operations whose cost is accounted (seed 004's breakdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IkeOp {
    /// Key pair generation and shared secret computation.
    Dh,
    /// Creating our AUTH payload (signature or PSK MAC).
    AuthCreate,
    /// Checking the peer's AUTH (signature, certificate chain, PSK MAC).
    AuthVerify,
    /// SKEYSEED, prf+ and child KEYMAT.
    KeyDerivation,
    /// Encoding and encrypting a protected message (SK/SKF).
    Encrypt,
    /// Decrypting a protected message and parsing its payloads.
    Decrypt,
    /// Encoding a clear message (IKE_SA_INIT).
    Encode,
    /// Parsing a clear message (IKE_SA_INIT) or a reassembled fragmented one.
    Decode,
}

impl IkeOp {
    /// Every operation.
    pub const ALL: [IkeOp; 8] = [
        IkeOp::Dh,
        IkeOp::AuthCreate,
        IkeOp::AuthVerify,
        IkeOp::KeyDerivation,
        IkeOp::Encrypt,
        IkeOp::Decrypt,
        IkeOp::Encode,
        IkeOp::Decode,
    ];

    /// Name for tables and metrics.
    pub fn name(self) -> &'static str {
        match self {
            IkeOp::Dh => "dh",
            IkeOp::AuthCreate => "auth_create",
            IkeOp::AuthVerify => "auth_verify",
            IkeOp::KeyDerivation => "key_derivation",
            IkeOp::Encrypt => "encrypt",
            IkeOp::Decrypt => "decrypt",
            IkeOp::Encode => "encode",
            IkeOp::Decode => "decode",
        }
    }
}

/// Operation counts and cumulative nanoseconds (times only with a clock lent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IkeCosts {
    /// Per operation: (count, nanoseconds).
    pub ops: BTreeMap<IkeOp, (u64, u64)>,
}

impl IkeCosts {
    fn add(&mut self, op: IkeOp, ns: u64) {
        let e = self.ops.entry(op).or_default();
        e.0 += 1;
        e.1 += ns;
    }

    /// Adds another record into this one.
    pub fn merge(&mut self, o: &IkeCosts) {
        for (op, (c, n)) in &o.ops {
            let e = self.ops.entry(*op).or_default();
            e.0 += c;
            e.1 += n;
        }
    }
}

/// UDP ports of IKE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// IKE (500).
    pub ike: u16,
    /// NAT-T (4500): IKE with the non-ESP marker, and ESP-in-UDP.
    pub nat_t: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            ike: 500,
            nat_t: 4500,
        }
    }
}

/// State of a child SA, for status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildStatus {
    /// Our inbound SPI.
    pub spi_in: u32,
    /// Our outbound SPI.
    pub spi_out: u32,
    /// ESP or Q-ESP.
    pub protocol: Protocol,
    /// Negotiated algorithms.
    pub algorithms: String,
    /// Installed / rekeying / rekeyed (waiting for deletion) / ...
    pub state: &'static str,
    /// When it is rekeyed, if scheduled.
    pub rekey_at: Option<Duration>,
    /// When it expires.
    pub expire_at: Option<Duration>,
    /// Selectors (ours, theirs) as text.
    pub local_ts: Vec<String>,
    /// Selectors of the peer side.
    pub remote_ts: Vec<String>,
    /// Its per-CPU slot (RFC 9611); 0 with one child per connection.
    pub slot: u32,
}

/// State of an IKE SA, for status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IkeStatus {
    /// Connection name.
    pub conn: String,
    /// Initiator SPI.
    pub spi_i: u64,
    /// Responder SPI.
    pub spi_r: u64,
    /// We are the original initiator.
    pub initiator: bool,
    /// connecting / established / deleting.
    pub state: &'static str,
    /// Peer's IKE address.
    pub remote: SocketAddr,
    /// Our IKE address.
    pub local: SocketAddr,
    /// The peer's authenticated identity.
    pub peer_id: Option<String>,
    /// Negotiated algorithms.
    pub algorithms: Option<String>,
    /// When it was established.
    pub established_at: Option<Duration>,
    /// When it is rekeyed.
    pub rekey_at: Option<Duration>,
    /// NAT detected (or forced): IKE on port 4500, ESP in UDP.
    pub nat: bool,
    /// MOBIKE (RFC 4555) negotiated: the peer may move the SA with
    /// UPDATE_SA_ADDRESSES.
    pub mobike: bool,
    /// Child SAs.
    pub children: Vec<ChildStatus>,
    /// Operation costs of this IKE SA.
    pub costs: IkeCosts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Initiator: IKE_SA_INIT sent.
    InitSent,
    /// Responder: IKE_SA_INIT answered, waiting for IKE_AUTH.
    InitDone,
    /// Initiator: IKE_AUTH sent.
    AuthSent,
    /// Authenticated both ways.
    Established,
    /// Being deleted (our Delete sent).
    Deleting,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChildState {
    Installed,
    /// We are rekeying it.
    Rekeying,
    /// Replaced by a new child; waiting for its deletion.
    Rekeyed,
    /// We sent a Delete for it.
    Deleting,
}

impl Child {
    /// Carries traffic: installed, or being rekeyed (it keeps its slot
    /// and set until its successor is up); not one replaced or being
    /// deleted.
    fn live(&self) -> bool {
        matches!(self.state, ChildState::Installed | ChildState::Rekeying)
    }

    /// Made by the peer's rekey of child `spi_in` (see `replaces`).
    fn succeeds(&self, spi_in: u32) -> bool {
        self.replaces.is_none_or(|r| r == spi_in)
    }

    /// True when the child's selectors are these (in any order).
    fn same_ts(&self, local_ts: &[TrafficSelector], remote_ts: &[TrafficSelector]) -> bool {
        ts::same(&self.local_ts, local_ts) && ts::same(&self.remote_ts, remote_ts)
    }
}

struct Child {
    spi_in: u32,
    spi_out: u32,
    /// ESP or Q-ESP (Protocol ID 3 or 201 in its notifies and deletes).
    protocol: Protocol,
    chosen: Chosen,
    local_ts: Vec<TrafficSelector>,
    remote_ts: Vec<TrafficSelector>,
    state: ChildState,
    rekey_at: Option<Duration>,
    expire_at: Option<Duration>,
    /// A rekey responder holds its new outbound SA until the old SA is
    /// deleted (or this deadline passes), so that the initiator has its
    /// new inbound SA before packets arrive on it.
    pending_out: Option<(SaInstall, Duration)>,
    /// Our outbound SA of this child is the connection's current one.
    out_active: bool,
    /// A newer child took over its traffic (a rekey): when it is deleted,
    /// its inbound SA lingers for [`REKEYED_INBOUND_LINGER`].
    replaced: bool,
    /// Nonces of the exchange that created it (rekey collisions, §2.8.1).
    nonces: (Vec<u8>, Vec<u8>),
    /// Its per-CPU slot (RFC 9611): 0 for the first child; a rekey keeps
    /// the slot of the child it replaces.
    slot: u32,
    /// Made by the peer's rekey of our child with this inbound SPI (we
    /// answered): what its held outbound SA takes over from, so that with
    /// several children rekeyed at once (selector sets, per-CPU slots) a
    /// delete or a collision finds this child's successor, not another's.
    /// `None` with a held outbound SA only when continued from an older
    /// snapshot that did not say: then it succeeds any child.
    replaces: Option<u32>,
}

enum Req {
    Init,
    Auth {
        spi_in: u32,
    },
    Child {
        spi_in: u32,
        rekey_of: Option<u32>,
        ni: Vec<u8>,
        ke: Option<KeyExchange>,
        /// The per-CPU slot the new child takes.
        slot: u32,
        /// The connection's selector set it asks for (a rekey: the set of
        /// the child it replaces): the answer must lie inside it.
        set: u32,
    },
    IkeRekey {
        new_spi: u64,
        ni: Vec<u8>,
        ke: KeyExchange,
    },
    Dpd,
    DeleteChild {
        spi_in: u32,
    },
    DeleteIke,
}

/// The exchange that negotiates a child SA (responder side).
#[derive(Clone, Copy)]
enum ChildExchange<'a> {
    /// IKE_AUTH: the IKE SA's nonces key the child, no KE.
    IkeAuth,
    /// CREATE_CHILD_SA: a new child, or the rekey of the child whose
    /// outbound SPI `rekey_of` is; `ke`: the request's KEi (group, data).
    CreateChildSa {
        ke: Option<(u16, &'a [u8])>,
        rekey_of: Option<u32>,
    },
}

struct Pending {
    id: u32,
    /// The request's datagrams (several when fragmented).
    data: Vec<Vec<u8>>,
    tries: u32,
    next_at: Duration,
    what: Req,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    RekeyChild(u32),
    /// A new child SA on the IKE SA (CREATE_CHILD_SA without REKEY_SA)
    /// for the connection's selector set `k` ([`ChildConfig::set`]).
    CreateChild(u32),
    /// One more per-CPU child SA (RFC 9611, SA_RESOURCE_INFO) for
    /// selector set `k`, into the lowest slot free in that set.
    CreatePerCpu(u32),
    RekeyIke,
    Dpd,
    DeleteChild(u32),
    DeleteIke,
}

impl Task {
    /// A child task, which an IKE rekey moves to the new IKE SA with the
    /// children (the old one only waits for its delete): a queued
    /// selector set or per-CPU slot still to open as well as rekeys and
    /// deletes.
    fn moves_with_children(&self) -> bool {
        matches!(
            self,
            Task::RekeyChild(_)
                | Task::DeleteChild(_)
                | Task::CreateChild(_)
                | Task::CreatePerCpu(_)
        )
    }
}

struct IkeSa {
    /// Creation number: tells an SA from a later one in the same slab slot.
    serial: u64,
    /// The timers, derived from the state by [`IkeSa::arm_timers`].
    timers: TimerTable,
    /// The earliest of `timers`, as filed in [`Ike`]'s deadline set.
    deadline: Option<Duration>,
    /// (SPIi, peer address) under which a responder SA made by
    /// IKE_SA_INIT is found by retransmitted IKE_SA_INIT requests.
    init_key: Option<(u64, IpAddr)>,
    conn: usize,
    initiator: bool,
    spi_i: u64,
    spi_r: u64,
    state: State,
    local: SocketAddr,
    remote: SocketAddr,
    nat: bool,
    chosen: Option<Chosen>,
    sk: Option<SkCrypto>,
    /// The raw keys `sk` was made from, for [`Ike::export`] ([`SkCrypto`]
    /// keeps them only inside its ciphers).
    sk_keys: Option<SkKeys>,
    sk_d: Zeroizing<Vec<u8>>,
    sk_pi: Zeroizing<Vec<u8>>,
    sk_pr: Zeroizing<Vec<u8>>,
    ni: Vec<u8>,
    nr: Vec<u8>,
    init_req: Vec<u8>,
    init_resp: Vec<u8>,
    ke: Option<KeyExchange>,
    cookie: Option<Vec<u8>>,
    group: Group,
    next_out_id: u32,
    pending: Option<Pending>,
    tasks: VecDeque<Task>,
    next_in_id: u32,
    last_resp: Option<(u32, Vec<Vec<u8>>)>,
    children: Vec<Child>,
    created: Duration,
    established_at: Option<Duration>,
    rekey_at: Option<Duration>,
    last_rx: Duration,
    peer_id: Option<Identity>,
    costs: IkeCosts,
    /// A replaced IKE SA is removed at this time if the peer never deletes it.
    remove_at: Option<Duration>,
    /// RFC 7296 §2.8.2: the peer rekeyed this SA while our own rekey of it
    /// was in flight; this is the local SPI of the SA the peer's rekey
    /// made. Its fate waits for our answer: the new SA made with the
    /// lowest nonce is the redundant one, and the other takes the
    /// children. Not carried in a snapshot: a continued engine resolves
    /// nothing and keeps the children where our answer puts them.
    crossed_by: Option<u64>,
    /// Both sides announced IKEV2_FRAGMENTATION_SUPPORTED (RFC 7383).
    fragmentation: bool,
    /// Both sides announced MOBIKE_SUPPORTED (RFC 4555): the peer (the
    /// initiator) moves the SAs with UPDATE_SA_ADDRESSES.
    mobike: bool,
    /// The PFS group the peer asked for (INVALID_KE_PAYLOAD) in a rekey.
    pfs_group: Option<Group>,
    /// The peer answered our Q-ESP + ESP offer (`qesp = "prefer"`) with
    /// NO_PROPOSAL_CHOSEN: from then on this IKE SA (and the ones that
    /// replace it) proposes ESP alone.
    qesp_declined: bool,
    /// The fragments of the message being received.
    reasm: Option<Reassembly>,
    /// The peer announced SA_RESOURCE_INFO (RFC 9611) with the first
    /// child: it keeps several children with the same selectors.
    per_cpu_peer: bool,
    /// Per selector set, when a per-CPU child of it that the peer deleted
    /// was last opened again ([`PER_CPU_REOPEN_HOLDOFF`]); at most one
    /// entry per set of the connection.
    per_cpu_reopened: Vec<(u32, Duration)>,
    /// Continued from another engine's snapshot ([`Ike::import`]) and
    /// nothing authenticated heard from the peer since: if the peer
    /// never answers, the connection is negotiated anew.
    continued: bool,
    /// Continued from a snapshot that may be behind the peer: the first
    /// request whose message ID is at or a little past `next_in_id` is
    /// taken (once), and the IDs follow it from then on.
    resync_in: bool,
    /// Continued from a snapshot written while the previous engine's rekey
    /// of the IKE SA crossed the peer's, this being the peer's new SA
    /// ([`Ike::export`]): until then, the peer's Delete of it says that
    /// the peer kept the other new SA, the previous engine's, which this
    /// engine cannot finish (§2.8.2). The children it holds are the
    /// peer's too, so they stay while a new IKE SA is negotiated
    /// ([`CROSSED_TAKEOVER_WINDOW`]).
    crossed_until: Option<Duration>,
    /// [`snapshot::fingerprint`] of the SA when it was last rearmed.
    export_fp: u64,
}

/// SK_ei, SK_er, SK_ai, SK_ar of an IKE SA.
struct SkKeys {
    ei: Zeroizing<Vec<u8>>,
    er: Zeroizing<Vec<u8>>,
    ai: Zeroizing<Vec<u8>>,
    ar: Zeroizing<Vec<u8>>,
}

/// Fragments of one message (RFC 7383 §2.6), by number.
struct Reassembly {
    /// (message ID, response flag).
    key: (u32, bool),
    total: u16,
    first: PayloadType,
    parts: BTreeMap<u16, Vec<u8>>,
}

/// Fragments per message we reassemble at most.
const MAX_FRAGMENTS: usize = 64;

/// How far past `next_in_id` the first request of a continued IKE SA may
/// be (the snapshot is at most an exchange or so behind the peer).
const RESYNC_WINDOW: u32 = 16;

impl IkeSa {
    /// A new IKE SA with nothing negotiated yet: no keys, nonces, children
    /// or exchanges; the caller fills in what it knows.
    fn new(
        conn: usize,
        initiator: bool,
        (spi_i, spi_r): (u64, u64),
        state: State,
        (local, remote): (SocketAddr, SocketAddr),
        now: Duration,
    ) -> IkeSa {
        IkeSa {
            serial: 0,
            timers: TimerTable::default(),
            deadline: None,
            init_key: None,
            conn,
            initiator,
            spi_i,
            spi_r,
            state,
            local,
            remote,
            nat: false,
            chosen: None,
            sk: None,
            sk_keys: None,
            sk_d: Zeroizing::new(Vec::new()),
            sk_pi: Zeroizing::new(Vec::new()),
            sk_pr: Zeroizing::new(Vec::new()),
            ni: Vec::new(),
            nr: Vec::new(),
            init_req: Vec::new(),
            init_resp: Vec::new(),
            ke: None,
            cookie: None,
            group: Group::Curve25519,
            next_out_id: 0,
            pending: None,
            tasks: VecDeque::new(),
            next_in_id: 0,
            last_resp: None,
            children: Vec::new(),
            created: now,
            established_at: None,
            rekey_at: None,
            last_rx: now,
            peer_id: None,
            costs: IkeCosts::default(),
            remove_at: None,
            crossed_by: None,
            fragmentation: false,
            mobike: false,
            reasm: None,
            pfs_group: None,
            qesp_declined: false,
            per_cpu_peer: false,
            per_cpu_reopened: Vec::new(),
            continued: false,
            resync_in: false,
            crossed_until: None,
            export_fp: 0,
        }
    }

    /// The timer table the state calls for (`dpd_delay`: the
    /// connection's; zero for none). Only what [`Ike::timeout_one`] acts
    /// on is armed.
    fn timer_table(&self, dpd_delay: Duration) -> TimerTable {
        let mut t = TimerTable::default();
        let established = self.state == State::Established;
        t.set(Timer::Retransmit, self.pending.as_ref().map(|p| p.next_at));
        t.set(
            Timer::HalfOpen,
            (self.state == State::InitDone).then(|| self.created + HALF_OPEN_TIMEOUT),
        );
        t.set(Timer::Replaced, self.remove_at);
        t.set(Timer::Rekey, self.rekey_at.filter(|_| established));
        t.set(
            Timer::Dpd,
            (established && !dpd_delay.is_zero() && self.pending.is_none())
                .then(|| self.last_rx + dpd_delay),
        );
        let child = self
            .children
            .iter()
            .flat_map(|c| {
                let (rekey, expire) = if established {
                    (c.rekey_at, c.expire_at)
                } else {
                    (None, None)
                };
                [rekey, expire, c.pending_out.as_ref().map(|p| p.1)]
            })
            .flatten()
            .min();
        t.set(Timer::Child, child);
        t
    }

    fn local_spi(&self) -> u64 {
        if self.initiator {
            self.spi_i
        } else {
            self.spi_r
        }
    }

    fn header(&self, exchange_type: ExchangeType, response: bool, message_id: u32) -> Header {
        Header {
            spi_i: self.spi_i,
            spi_r: self.spi_r,
            minor_version: 0,
            exchange_type,
            initiator: self.initiator,
            version: false,
            response,
            message_id,
        }
    }

    fn state_name(&self) -> &'static str {
        match self.state {
            State::InitSent | State::InitDone | State::AuthSent => "connecting",
            State::Established => "established",
            State::Deleting => "deleting",
        }
    }
}

/// Half-open IKE SAs (responder, waiting for IKE_AUTH) expire after this.
const HALF_OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Nonce length we send (RFC 7296 §2.10: at least half the PRF key size).
const NONCE_LEN: usize = 32;

/// Half-open IKE SAs (responder) from which on IKE_SA_INIT requests must
/// carry a COOKIE, by default (`gateway.ike_cookie_threshold`).
pub const DEFAULT_COOKIE_THRESHOLD: usize = 32;

/// Half-open IKE SAs (responder) beyond which IKE_SA_INIT requests are
/// dropped, by default (`gateway.ike_half_open_limit`): each holds a few
/// kilobytes for at most 30 s, so memory stays bounded (a few MB) whatever
/// the rate of requests that return their cookie.
pub const DEFAULT_HALF_OPEN_LIMIT: usize = 1000;
/// A rekey responder switches its outbound SA at the latest this long after
/// the rekey if the initiator never deletes the old SA.
const OUTBOUND_SWITCH_DEADLINE: Duration = Duration::from_secs(5);
/// A replaced IKE SA the peer never deletes is removed after this.
const OLD_IKE_SA_GRACE: Duration = Duration::from_secs(30);
/// How long after a takeover during crossed IKE SA rekeys the peer's Delete
/// of the continued SA is taken for the peer's decision that the previous
/// engine's rekey won (see `IkeSa::crossed_until`): the peer decides once
/// it has both requests and our answer, all sent before the takeover, so
/// its Delete comes within its retransmissions of it.
const CROSSED_TAKEOVER_WINDOW: Duration = Duration::from_secs(60);
/// RFC 7383 fragment size: an IKE message of 1200 bytes with IPv6, UDP and
/// the non-ESP marker stays within the IPv6 minimum MTU (1280).
const DEFAULT_FRAGMENT_SIZE: usize = 1200;
/// Retry a failed `restart` connection after this.
const RESTART_DELAY: Duration = Duration::from_secs(5);
/// Retry a rekey that was refused or could not be started after this.
const RETRY_DELAY: Duration = Duration::from_secs(10);
/// After a rekeyed child's Delete, its inbound SA stays installed this
/// long. The peer's last packets on the old SA can still be queued behind
/// the Delete: raw ESP and IKE arrive on different sockets, read by
/// different threads, so the Delete may be handled first (strongSwan's
/// `delete_rekeyed_delay` answers the same race, with 5 s). A second is
/// far beyond that reordering and stays short of the shortest rekey
/// interval a test or lab run uses, so at most two inbound SAs per child.
const REKEYED_INBOUND_LINGER: Duration = Duration::from_secs(1);

/// A per-CPU child (RFC 9611) that the peer deletes outside a rekey is
/// opened again, into the same slot, at most once in this long per IKE
/// SA: a peer that keeps deleting them (it wants fewer) is not answered
/// with a new one each time. A slot deleted again within the hold-off
/// stays closed until the IKE SA is established anew.
const PER_CPU_REOPEN_HOLDOFF: Duration = Duration::from_secs(60);

/// Selectors as log lines show them: `10.1.0.0/16,10.3.0.0/16`.
fn ts_list(v: &[TrafficSelector]) -> String {
    v.iter().map(ts::display).collect::<Vec<_>>().join(",")
}

/// The IKEv2 engine of one gateway: every connection's IKE SAs.
pub struct Ike {
    conns: Vec<IkeConfig>,
    /// The IKE SAs; a handle (slab key) stays valid until its SA is
    /// removed, whatever happens to the others.
    sas: Slab<IkeSa>,
    /// Our IKE SPI (SPIi of SAs we initiated, SPIr of those we answered)
    /// to the SA: routes every message but a new IKE_SA_INIT request.
    by_spi: HashMap<u64, usize>,
    /// (SPIi, peer address) to the responder SA an IKE_SA_INIT made:
    /// finds retransmitted IKE_SA_INIT requests (and cookie retries).
    by_init: HashMap<(u64, IpAddr), usize>,
    /// The SAs of each connection.
    by_conn: Vec<Vec<usize>>,
    /// The first connection with this peer address (IKE_SA_INIT requests).
    conn_by_remote: HashMap<IpAddr, usize>,
    /// Responder SAs waiting for IKE_AUTH.
    half_open: usize,
    /// Each SA's earliest deadline.
    deadlines: BTreeSet<(Duration, usize)>,
    /// SAs whose timers must be derived again before the engine returns.
    dirty: Vec<usize>,
    next_serial: u64,
    transmits: VecDeque<Transmit>,
    /// While a request of SA `.0` is handled: where it arrived and where
    /// it came from, which is where its answer goes (RFC 7296 §2.11), even
    /// when the SA does not move there (a MOBIKE peer testing a path).
    answer_to: Option<(usize, SocketAddr, SocketAddr)>,
    events: VecDeque<Event>,
    ports: Ports,
    cookie_threshold: usize,
    /// Half-open IKE SAs (responder) beyond which IKE_SA_INIT requests are
    /// dropped, cookie or not.
    half_open_limit: usize,
    /// Drawn when the first cookie is needed.
    cookie_secret: Option<Zeroizing<[u8; 32]>>,
    rng: Box<dyn Rng + Send>,
    unix_at_epoch: u64,
    counters: Counters,
    costs: IkeCosts,
    clock: Option<fn() -> u64>,
    child_spis: HashSet<u32>,
    ike_spis: HashSet<u64>,
    restart_at: BTreeMap<usize, Duration>,
    /// Inbound SAs of rekeyed children, removed at their deadline.
    lingering: Vec<(Duration, Event)>,
    fragment_size: usize,
    /// The shell steers inbound ESP to worker `spi % spi_steering`: a
    /// per-CPU child of slot `k` gets an inbound SPI that lands on worker
    /// `k % spi_steering` (1: any SPI).
    spi_steering: u32,
    /// Grows whenever what [`Ike::export`] returns changes.
    export_gen: u64,
    /// Tests: [`Ike::install_ike_keys`] fails.
    #[cfg(test)]
    fail_key_install: bool,
    /// Tests: SAs [`Ike::timeout_one`] visited.
    #[cfg(test)]
    timer_visits: u64,
}

/// A refused command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandError(pub String);

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CommandError {}

fn nat_hash(spi_i: u64, spi_r: u64, addr: SocketAddr) -> Vec<u8> {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(&spi_i.to_be_bytes());
    ctx.update(&spi_r.to_be_bytes());
    match addr.ip() {
        IpAddr::V4(a) => ctx.update(&a.octets()),
        IpAddr::V6(a) => ctx.update(&a.octets()),
    }
    ctx.update(&addr.port().to_be_bytes());
    ctx.finish().as_ref().to_vec()
}

/// NO_NATS_ALLOWED's data (RFC 4555 §4.2.3): the sender's source and
/// destination address, then source and destination port, as it sent them.
fn no_nats_data(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let mut v = Vec::with_capacity(36);
    for a in [src.ip(), dst.ip()] {
        match a {
            IpAddr::V4(a) => v.extend_from_slice(&a.octets()),
            IpAddr::V6(a) => v.extend_from_slice(&a.octets()),
        }
    }
    v.extend_from_slice(&src.port().to_be_bytes());
    v.extend_from_slice(&dst.port().to_be_bytes());
    v
}

fn notify(t: NotifyType, data: Vec<u8>) -> Payload {
    Payload::Notify(Notify {
        protocol: 0,
        spi: Vec::new(),
        notify_type: t,
        data,
    })
}

fn find_notify(p: &[Payload], t: NotifyType) -> Option<&Notify> {
    p.iter().find_map(|x| match x {
        Payload::Notify(n) if n.notify_type == t => Some(n),
        _ => None,
    })
}

/// The first error notify (types below 16384), if any.
fn error_notify(p: &[Payload]) -> Option<NotifyType> {
    p.iter().find_map(|x| match x {
        Payload::Notify(n) if n.notify_type.is_error() => Some(n.notify_type),
        _ => None,
    })
}

fn notify_name(t: NotifyType) -> String {
    match t.as_str() {
        Some(name) => name.to_string(),
        None => format!("notify {}", u16::from(t)),
    }
}

fn get_nonce(p: &[Payload]) -> Option<&[u8]> {
    p.iter().find_map(|x| match x {
        // RFC 7296 §3.9: 16 to 256 bytes.
        Payload::Nonce(n) if (16..=256).contains(&n.len()) => Some(&n[..]),
        _ => None,
    })
}

fn get_sa(p: &[Payload]) -> Option<&[wire::Proposal]> {
    p.iter().find_map(|x| match x {
        Payload::Sa(v) => Some(&v[..]),
        _ => None,
    })
}

fn get_ke(p: &[Payload]) -> Option<(u16, &[u8])> {
    p.iter().find_map(|x| match x {
        Payload::Ke { group, data } => Some((*group, &data[..])),
        _ => None,
    })
}

fn get_ts(p: &[Payload]) -> Option<(&[TrafficSelector], &[TrafficSelector])> {
    let i = p.iter().find_map(|x| match x {
        Payload::TsI(v) => Some(&v[..]),
        _ => None,
    })?;
    let r = p.iter().find_map(|x| match x {
        Payload::TsR(v) => Some(&v[..]),
        _ => None,
    })?;
    Some((i, r))
}

fn spi4(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.try_into().ok()?))
}

/// The Protocol ID of a child SA's proposals, notifies and deletes.
fn protocol_id(p: Protocol) -> u8 {
    match p {
        Protocol::Esp => protocol::ESP,
        Protocol::Ah => protocol::AH,
        Protocol::Qesp => protocol::QESP,
    }
}

/// "Q-ESP " before a Q-ESP child's algorithms in log lines; nothing for
/// ESP (whose lines read as before Q-ESP existed).
/// ", slot 1" in a child's log line when the connection keeps per-CPU
/// children, else nothing.
fn slot_label(per_cpu_sas: u32, slot: u32) -> String {
    if per_cpu_sas > 1 {
        format!(", slot {slot}")
    } else {
        String::new()
    }
}

fn qesp_label(p: Protocol) -> &'static str {
    if p == Protocol::Qesp {
        "Q-ESP "
    } else {
        ""
    }
}

/// Distinct SPIs a generator gets to produce a fresh one; a generator
/// that repeats itself this often is broken.
const SPI_TRIES: usize = 64;

impl Ike {
    /// An engine for these connections, drawing its randomness from the
    /// system CSPRNG ([`SystemRng`]).
    pub fn new(conns: Vec<IkeConfig>, ports: Ports) -> Ike {
        Ike::with_rng(conns, ports, Box::new(SystemRng))
    }

    /// An engine drawing every SPI, nonce, private key and cookie secret
    /// from `rng`.
    ///
    /// When `rng` fails, nothing is sent with a value that is not random
    /// (each failure counts [`IkeEvent::RngFailures`] and logs a warning):
    /// - [`Ike::initiate`] refuses (a restart is retried later);
    /// - an IKE_SA_INIT request is not answered (the peer retransmits);
    /// - our IKE_SA_INIT retried with a cookie or another group, or our
    ///   IKE_AUTH, fails the IKE SA;
    /// - a CREATE_CHILD_SA request (child or IKE SA) is answered with
    ///   TEMPORARY_FAILURE (so is a child SA in IKE_AUTH);
    /// - our own rekeys are retried 10 s later;
    /// - rekey jitter is left out (the deadline is the configured one).
    pub fn with_rng(conns: Vec<IkeConfig>, ports: Ports, rng: Box<dyn Rng + Send>) -> Ike {
        let mut conn_by_remote = HashMap::new();
        for (n, c) in conns.iter().enumerate() {
            conn_by_remote.entry(c.remote).or_insert(n);
        }
        Ike {
            rng,
            by_conn: vec![Vec::new(); conns.len()],
            conn_by_remote,
            conns,
            sas: Slab::new(),
            by_spi: HashMap::new(),
            by_init: HashMap::new(),
            half_open: 0,
            deadlines: BTreeSet::new(),
            dirty: Vec::new(),
            next_serial: 0,
            transmits: VecDeque::new(),
            answer_to: None,
            events: VecDeque::new(),
            ports,
            cookie_threshold: DEFAULT_COOKIE_THRESHOLD,
            half_open_limit: DEFAULT_HALF_OPEN_LIMIT,
            cookie_secret: None,
            unix_at_epoch: 0,
            counters: Counters::default(),
            costs: IkeCosts::default(),
            clock: None,
            child_spis: HashSet::new(),
            ike_spis: HashSet::new(),
            restart_at: BTreeMap::new(),
            lingering: Vec::new(),
            fragment_size: DEFAULT_FRAGMENT_SIZE,
            spi_steering: 1,
            export_gen: 0,
            #[cfg(test)]
            fail_key_install: false,
            #[cfg(test)]
            timer_visits: 0,
        }
    }

    /// Unix time (seconds) at the caller's epoch: certificate validity is
    /// checked at `unix_at_epoch + now`.
    pub fn set_unix_time_at_epoch(&mut self, secs: u64) {
        self.unix_at_epoch = secs;
    }

    /// Half-open IKE SAs (responder) above which IKE_SA_INIT requests must
    /// carry a COOKIE (RFC 7296 §2.6). 0 demands cookies always.
    pub fn set_cookie_threshold(&mut self, n: usize) {
        self.cookie_threshold = n;
    }

    /// Half-open IKE SAs (responder) beyond which IKE_SA_INIT requests are
    /// dropped even with a valid COOKIE.
    pub fn set_half_open_limit(&mut self, n: usize) {
        self.half_open_limit = n;
    }

    /// Largest IKE message (bytes) sent unfragmented once both sides
    /// support RFC 7383 fragmentation; larger ones go as fragments of at
    /// most this size.
    pub fn set_fragment_size(&mut self, n: usize) {
        self.fragment_size = n.max(200);
    }

    /// Lends a monotonic nanosecond clock for the per-operation costs.
    pub fn set_cost_clock(&mut self, clock: Option<fn() -> u64>) {
        self.clock = clock;
    }

    /// The connections.
    pub fn conns(&self) -> &[IkeConfig] {
        &self.conns
    }

    /// Counters: messages, exchanges and every reason a message or an
    /// exchange was dropped or failed.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// How many `event`s happened.
    pub fn counter(&self, event: IkeEvent) -> u64 {
        self.counters.get(event)
    }

    /// Operation costs of every IKE SA ever handled.
    pub fn costs(&self) -> &IkeCosts {
        &self.costs
    }

    /// Clears the cost records.
    pub fn reset_costs(&mut self) {
        self.costs = IkeCosts::default();
        for (_, sa) in &mut self.sas {
            sa.costs = IkeCosts::default();
        }
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn count(&mut self, what: IkeEvent) {
        self.counters.add(what);
    }

    fn log(&mut self, level: Level, conn: Option<usize>, message: String) {
        let conn = conn.and_then(|c| self.conns.get(c)).map(|c| c.name.clone());
        self.events.push_back(Event::Log {
            level,
            conn,
            message,
        });
    }

    fn timed<T>(&mut self, sa: Option<usize>, op: IkeOp, f: impl FnOnce(&mut Self) -> T) -> T {
        let t0 = self.clock.map(|c| c());
        let r = f(self);
        let ns = match (self.clock, t0) {
            (Some(c), Some(t0)) => c().saturating_sub(t0),
            _ => 0,
        };
        self.costs.add(op, ns);
        if let Some(s) = sa.and_then(|i| self.sas.get_mut(i)) {
            s.costs.add(op, ns);
        }
        r
    }

    /// A fresh inbound child SPI of connection `ci` for per-CPU slot `slot`, reserved: with
    /// SPI steering over `n` workers, one with `spi % n == slot % n`, so
    /// that each slot's inbound packets reach their own worker. The
    /// residue is set on a random draw (its other bits stay random).
    /// Connections with one child (`per_cpu_sas = 1`) take any SPI, so
    /// that connections spread over the workers.
    fn new_child_spi(&mut self, ci: usize, slot: u32) -> Result<u32, RngError> {
        let n = if self.conns[ci].child.per_cpu_sas > 1 {
            self.spi_steering.max(1)
        } else {
            1
        };
        for _ in 0..SPI_TRIES {
            let r = rng::u32(&mut *self.rng)?;
            // Near the top of the range the residue may not fit: draw again.
            let Some(s) = (r - r % n).checked_add(slot % n) else {
                continue;
            };
            // SPIs 1-255 are reserved (RFC 4303 §2.1).
            if s > 255 && self.child_spis.insert(s) {
                return Ok(s);
            }
        }
        Err(RngError)
    }

    /// Tells the engine that the shell steers inbound ESP-in-UDP to
    /// worker `spi % n` (its `SO_REUSEPORT` program): per-CPU children
    /// then get inbound SPIs that spread over the workers, slot `k` on
    /// worker `k % n`.
    pub fn set_spi_steering(&mut self, n: u32) {
        self.spi_steering = n.max(1);
    }

    /// The lowest per-CPU slot of connection `ci` (below its
    /// `per_cpu_sas`) that no live child of its IKE SAs holds; `None` when
    /// all are taken. A child being rekeyed holds its slot; one replaced
    /// by a rekey or being deleted does not.
    /// Only children for which `same` holds count: children with other
    /// selectors (another selector set, or other narrowed selectors)
    /// carry other traffic and have slots of their own.
    fn free_slot(&self, ci: usize, same: impl Fn(&Child) -> bool) -> Option<u32> {
        let n = self.conns[ci].child.per_cpu_sas.max(1);
        (0..n).find(|k| {
            !self.by_conn[ci].iter().any(|&i| {
                self.sas[i]
                    .children
                    .iter()
                    .any(|c| c.slot == *k && c.live() && same(c))
            })
        })
    }

    /// The connection's selector set a child belongs to: the first that
    /// holds its (possibly narrowed) selectors; 0 if none does (the sets do
    /// not overlap, so there is at most one).
    fn set_of(&self, ci: usize, c: &Child) -> u32 {
        self.set_of_ts(ci, &c.local_ts, &c.remote_ts)
    }

    /// [`Ike::set_of`] for selectors not yet in a child.
    fn set_of_ts(&self, ci: usize, local: &[TrafficSelector], remote: &[TrafficSelector]) -> u32 {
        let cc = &self.conns[ci].child;
        (0..cc.set_count())
            .find(|&k| {
                cc.set(k)
                    .is_some_and(|(l, r)| ts::covered(local, l) && ts::covered(remote, r))
            })
            .unwrap_or(0)
    }

    /// " for OURS === THEIRS" naming selector set `set` in log lines, on a
    /// connection with several sets; empty with one.
    fn set_label(&self, ci: usize, set: u32) -> String {
        match self.conns[ci].child.set(set) {
            Some((l, r)) => self.ts_label(ci, l, r),
            None => String::new(),
        }
    }

    /// " for OURS === THEIRS" naming these selectors in log lines, on a
    /// connection with several selector sets; empty with one.
    fn ts_label(&self, ci: usize, l: &[TrafficSelector], r: &[TrafficSelector]) -> String {
        if self.conns[ci].child.set_count() < 2 {
            return String::new();
        }
        format!(" for {} === {}", ts_list(l), ts_list(r))
    }

    /// The selector sets of IKE SA `i`'s connection that no child carries
    /// and none is being negotiated for (created, queued or awaiting its
    /// answer).
    fn missing_sets(&self, i: usize) -> Vec<u32> {
        let s = &self.sas[i];
        let live: Vec<u32> = s
            .children
            .iter()
            .filter(|c| c.live())
            .map(|c| self.set_of(s.conn, c))
            .collect();
        (0..self.conns[s.conn].child.set_count())
            .filter(|k| {
                !live.contains(k)
                    && !s.tasks.contains(&Task::CreateChild(*k))
                    && !matches!(
                        &s.pending,
                        Some(Pending {
                            what: Req::Child { rekey_of: None, set, .. },
                            ..
                        }) if set == k
                    )
            })
            .collect()
    }

    /// A fresh IKE SPI of ours, reserved.
    fn new_ike_spi(&mut self) -> Result<u64, RngError> {
        for _ in 0..SPI_TRIES {
            let s = rng::u64(&mut *self.rng)?;
            if s != 0 && self.ike_spis.insert(s) {
                return Ok(s);
            }
        }
        Err(RngError)
    }

    // -----------------------------------------------------------------
    // The SA store
    // -----------------------------------------------------------------

    /// Files a new SA under its handle, our SPI and its connection.
    fn insert_sa(&mut self, mut sa: IkeSa) -> usize {
        sa.serial = self.next_serial;
        self.next_serial += 1;
        let (spi, conn, init_key) = (sa.local_spi(), sa.conn, sa.init_key);
        let half_open = sa.state == State::InitDone;
        let i = self.sas.insert(sa);
        self.by_spi.insert(spi, i);
        if let Some(k) = init_key {
            self.by_init.insert(k, i);
        }
        self.by_conn[conn].push(i);
        if half_open {
            self.half_open += 1;
        }
        self.dirty.push(i);
        i
    }

    /// Takes SA `i` out of the store and every index, and releases its SPI.
    fn remove_sa(&mut self, i: usize) -> IkeSa {
        let sa = self.sas.remove(i);
        let spi = sa.local_spi();
        if self.by_spi.get(&spi) == Some(&i) {
            self.by_spi.remove(&spi);
        }
        if let Some(k) = sa.init_key {
            if self.by_init.get(&k) == Some(&i) {
                self.by_init.remove(&k);
            }
        }
        self.by_conn[sa.conn].retain(|&x| x != i);
        if let Some(d) = sa.deadline {
            self.deadlines.remove(&(d, i));
        }
        if sa.state == State::InitDone {
            self.half_open = self.half_open.saturating_sub(1);
        }
        self.ike_spis.remove(&spi);
        if let Some(p) = &sa.pending {
            self.release_reserved(&p.what);
        }
        if sa.export_fp != 0 {
            self.export_gen += 1;
        }
        sa
    }

    /// A request still in flight holds the SPIs it reserved for the SA it
    /// would make: released when nothing will answer it any more.
    fn release_reserved(&mut self, what: &Req) {
        match what {
            Req::IkeRekey { new_spi, .. } => {
                self.ike_spis.remove(new_spi);
            }
            Req::Child { spi_in, .. } | Req::Auth { spi_in } => {
                self.child_spis.remove(spi_in);
            }
            _ => {}
        }
    }

    /// Moves SA `i` to `state`, keeping the half-open count.
    fn set_state(&mut self, i: usize, state: State) {
        let sa = &mut self.sas[i];
        if sa.state == State::InitDone && state != State::InitDone {
            self.half_open = self.half_open.saturating_sub(1);
        }
        sa.state = state;
    }

    /// Derives SA `i`'s timers again and files its earliest deadline.
    fn rearm(&mut self, i: usize) {
        let Some(sa) = self.sas.get_mut(i) else {
            return;
        };
        sa.timers = sa.timer_table(self.conns[sa.conn].dpd_delay);
        let fp = snapshot::fingerprint(sa);
        if fp != sa.export_fp {
            sa.export_fp = fp;
            self.export_gen += 1;
        }
        let next = sa.timers.next();
        if sa.deadline != next {
            if let Some(d) = sa.deadline {
                self.deadlines.remove(&(d, i));
            }
            if let Some(d) = next {
                self.deadlines.insert((d, i));
            }
            sa.deadline = next;
        }
    }

    /// Rearms every SA touched since the last time (each public entry
    /// point ends with this).
    fn rearm_dirty(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for i in dirty {
            self.rearm(i);
        }
    }

    /// Tests: starts SA `i`'s next queued exchange and rearms it, as an
    /// entry point would.
    #[cfg(test)]
    fn kick_now(&mut self, i: usize, now: Duration) {
        self.kick(i, now);
        self.rearm_dirty();
    }

    /// A fresh nonce.
    fn new_nonce(&mut self) -> Result<Vec<u8>, RngError> {
        rng::bytes(&mut *self.rng, NONCE_LEN)
    }

    /// A fresh key pair of `group`, its cost accounted to SA `i`.
    fn new_ke(&mut self, i: Option<usize>, group: Group) -> Result<KeyExchange, DhError> {
        self.timed(i, IkeOp::Dh, |s| KeyExchange::generate(group, &mut *s.rng))
    }

    /// Counts and reports a failure of the random generator; `what`: what
    /// the engine does instead.
    fn rng_failed(&mut self, ci: Option<usize>, what: &str) {
        self.count(IkeEvent::RngFailures);
        self.log(
            Level::Warn,
            ci,
            format!("the random number generator failed: {what}"),
        );
    }

    /// `now + d` less a random jitter of at most `jitter` (and `d / 2`);
    /// `None` when `d` is zero (never).
    fn after(&mut self, now: Duration, d: Duration, jitter: Duration) -> Option<Duration> {
        if d.is_zero() {
            return None;
        }
        let j = if jitter.is_zero() {
            Duration::ZERO
        } else {
            match rng::u64(&mut *self.rng) {
                Ok(r) => {
                    let max = jitter.min(d / 2).as_nanos().max(1);
                    Duration::from_nanos(u64::try_from(u128::from(r) % max).unwrap_or(0))
                }
                Err(_) => {
                    // Jitter only spreads rekeys out; its absence is safe.
                    self.count(IkeEvent::RngFailures);
                    Duration::ZERO
                }
            }
        };
        Some(now + d - j)
    }

    /// Status of every IKE SA.
    pub fn status(&self) -> Vec<IkeStatus> {
        // In creation order (slab slots are reused).
        let mut sas: Vec<&IkeSa> = self.sas.iter().map(|(_, s)| s).collect();
        sas.sort_by_key(|s| s.serial);
        sas.into_iter()
            .map(|sa| IkeStatus {
                conn: self.conns[sa.conn].name.clone(),
                spi_i: sa.spi_i,
                spi_r: sa.spi_r,
                initiator: sa.initiator,
                state: sa.state_name(),
                remote: sa.remote,
                local: sa.local,
                peer_id: sa.peer_id.as_ref().map(|i| i.to_string()),
                algorithms: sa.chosen.map(|c| c.name()),
                established_at: sa.established_at,
                rekey_at: sa.rekey_at,
                nat: sa.nat,
                mobike: sa.mobike,
                costs: sa.costs.clone(),
                children: sa
                    .children
                    .iter()
                    .map(|c| ChildStatus {
                        spi_in: c.spi_in,
                        spi_out: c.spi_out,
                        protocol: c.protocol,
                        algorithms: c.chosen.name(),
                        state: match c.state {
                            ChildState::Installed => "installed",
                            ChildState::Rekeying => "rekeying",
                            ChildState::Rekeyed => "rekeyed",
                            ChildState::Deleting => "deleting",
                        },
                        rekey_at: c.rekey_at,
                        expire_at: c.expire_at,
                        local_ts: c.local_ts.iter().map(ts::display).collect(),
                        remote_ts: c.remote_ts.iter().map(ts::display).collect(),
                        slot: c.slot,
                    })
                    .collect(),
            })
            .collect()
    }

    /// Fuzzing only: a message of IKE SA number `sa` (in creation order)
    /// with `body` as its (possibly malformed) decrypted payload chain,
    /// sealed with that SA's keys, so that a fuzzer reaches the handlers
    /// behind the integrity check.
    /// The message ID is the SA's next request ID (or, for a response, the
    /// next ID it expects from the peer) plus `id_delta`, minus 2.
    #[cfg(fuzzing)]
    pub fn fuzz_seal(
        &mut self,
        sa: usize,
        exchange_type: u8,
        response: bool,
        id_delta: u8,
        first: u8,
        body: &[u8],
    ) -> Option<Transmit> {
        let n = self.sas.len();
        let (_, s) = self.sas.iter_mut().nth(sa % n.max(1))?;
        let base = if response {
            s.next_in_id
        } else {
            s.next_out_id
        };
        let id = base.wrapping_add(u32::from(id_delta)).wrapping_sub(2);
        let h = s.header(ExchangeType::from(exchange_type), response, id);
        let data =
            s.sk.as_mut()?
                .seal_raw(&h, PayloadType::from(first), body)
                .ok()?;
        Some(Transmit {
            local: s.local,
            remote: s.remote,
            data,
        })
    }

    /// Fuzzing only: every established IKE SA is taken to have negotiated
    /// MOBIKE (as if the initiator had offered it), so that a fuzzer
    /// reaches the address-update paths.
    #[cfg(fuzzing)]
    pub fn fuzz_mobike(&mut self) {
        for (_, s) in self.sas.iter_mut() {
            if s.state == State::Established {
                s.mobike = true;
            }
        }
    }

    // -----------------------------------------------------------------
    // Commands
    // -----------------------------------------------------------------

    fn conn_index(&self, name: &str) -> Result<usize, CommandError> {
        self.conns
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.conns.iter().map(|c| c.name.as_str()).collect();
                CommandError(format!(
                    "no IKE connection named \"{name}\" (IKE connections: {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ))
            })
    }

    /// Starts an IKE SA (and its children) for connection `name`; when
    /// the connection has an established IKE SA, asks on it, with a
    /// CREATE_CHILD_SA each, for every selector set that has no live
    /// child SA (the peer refused or deleted it, or it expired).
    pub fn initiate(&mut self, now: Duration, name: &str) -> Result<(), CommandError> {
        let ci = self.conn_index(name)?;
        let conn_sas = &self.by_conn[ci];
        // An established IKE SA without a child for some selector set (the
        // peer deleted it, or refused it): ask for those children again.
        if let Some((i, missing)) = conn_sas
            .iter()
            .copied()
            .filter(|&i| self.sas[i].conn == ci && self.sas[i].state == State::Established)
            .map(|i| (i, self.missing_sets(i)))
            .find(|(_, m)| !m.is_empty())
        {
            self.sas[i]
                .tasks
                .extend(missing.into_iter().map(Task::CreateChild));
            self.kick(i, now);
            self.rearm_dirty();
            return Ok(());
        }
        if let Some(sa) = conn_sas
            .iter()
            .map(|&i| &self.sas[i])
            .find(|s| s.state != State::Deleting)
        {
            return Err(CommandError(format!(
                "connection \"{name}\" already has an IKE SA ({})",
                sa.state_name()
            )));
        }
        self.restart_at.remove(&ci);
        let r = self.start_init(now, ci, None, None).map_err(CommandError);
        self.rearm_dirty();
        r
    }

    /// Deletes connection `name`'s IKE SA and its children (an INFORMATIONAL
    /// Delete; the SAs are removed when the peer answers or gives up).
    pub fn terminate(&mut self, now: Duration, name: &str) -> Result<(), CommandError> {
        let ci = self.conn_index(name)?;
        self.restart_at.remove(&ci);
        let idx = self.by_conn[ci].clone();
        if idx.is_empty() {
            return Err(CommandError(format!(
                "connection \"{name}\" has no IKE SA to terminate"
            )));
        }
        for i in idx {
            if self.sas[i].state == State::Established {
                self.sas[i].tasks.clear();
                self.sas[i].tasks.push_back(Task::DeleteIke);
                self.kick(i, now);
            } else {
                self.destroy(i, "terminated before it was established".into(), false);
            }
        }
        self.rearm_dirty();
        Ok(())
    }

    // -----------------------------------------------------------------
    // Sending
    // -----------------------------------------------------------------

    fn transmit(&mut self, i: usize, datagrams: Vec<Vec<u8>>) {
        let sa = &self.sas[i];
        self.transmit_to(sa.local, sa.remote, datagrams);
    }

    fn transmit_to(&mut self, local: SocketAddr, remote: SocketAddr, datagrams: Vec<Vec<u8>>) {
        for data in datagrams {
            self.transmits.push_back(Transmit {
                local,
                remote,
                data,
            });
            self.counters.add(IkeEvent::MessagesOut);
        }
    }

    /// Sends the answer to the request of SA `i` being handled to where
    /// that request came from (§2.11).
    fn transmit_answer(&mut self, i: usize, datagrams: Vec<Vec<u8>>) {
        match self.answer_to {
            Some((j, local, remote)) if j == i => self.transmit_to(local, remote, datagrams),
            _ => self.transmit(i, datagrams),
        }
    }

    /// Seals (or, for IKE_SA_INIT, emits) a message of SA `i`: one
    /// datagram, or its RFC 7383 fragments when both sides support them
    /// and it exceeds the fragment size.
    fn build(&mut self, i: usize, h: Header, payloads: Vec<Payload>) -> Option<Vec<Vec<u8>>> {
        let frag = self.sas[i].fragmentation.then_some(self.fragment_size);
        // Sealing includes encoding the inner payloads; a clear message
        // (IKE_SA_INIT) is only encoded.
        let op = if self.sas[i].sk.is_some() {
            IkeOp::Encrypt
        } else {
            IkeOp::Encode
        };
        let r = self.timed(Some(i), op, |s| match s.sas[i].sk.as_mut() {
            Some(sk) => match frag {
                Some(max) => sk
                    .seal_fragments(&h, &payloads, max)
                    .map_err(|e| e.to_string()),
                None => sk
                    .seal(&h, &payloads)
                    .map(|m| vec![m])
                    .map_err(|e| e.to_string()),
            },
            None => Message {
                header: h,
                payloads,
            }
            .emit()
            .map(|m| vec![m])
            .map_err(|e| e.to_string()),
        });
        if let Ok(m) = &r {
            if m.len() > 1 {
                self.count(IkeEvent::FragmentedMessagesOut);
            }
        }
        match r {
            Ok(m) => Some(m),
            Err(e) => {
                self.count(IkeEvent::BuildErrors);
                let c = self.sas[i].conn;
                self.log(
                    Level::Warn,
                    Some(c),
                    format!("could not build a message: {e}"),
                );
                None
            }
        }
    }

    fn send_request(
        &mut self,
        i: usize,
        now: Duration,
        exch: ExchangeType,
        payloads: Vec<Payload>,
        what: Req,
    ) {
        let id = self.sas[i].next_out_id;
        let h = self.sas[i].header(exch, false, id);
        let Some(data) = self.build(i, h, payloads) else {
            return;
        };
        let wait = self.conns[self.sas[i].conn].retransmit.wait(0);
        self.sas[i].next_out_id = id.wrapping_add(1);
        self.sas[i].pending = Some(Pending {
            id,
            data: data.clone(),
            tries: 0,
            next_at: now + wait,
            what,
        });
        self.transmit(i, data);
    }

    fn reply(&mut self, i: usize, exch: ExchangeType, id: u32, payloads: Vec<Payload>) {
        let h = self.sas[i].header(exch, true, id);
        let Some(data) = self.build(i, h, payloads) else {
            return;
        };
        self.sas[i].last_resp = Some((id, data.clone()));
        self.sas[i].next_in_id = id.wrapping_add(1);
        self.transmit_answer(i, data);
    }

    /// An unencrypted answer outside any IKE SA (IKE_SA_INIT errors, cookies).
    fn reply_plain(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
        req: &Header,
        payloads: Vec<Payload>,
    ) {
        let h = Header {
            spi_i: req.spi_i,
            spi_r: 0,
            minor_version: 0,
            exchange_type: req.exchange_type,
            initiator: false,
            version: false,
            response: true,
            message_id: req.message_id,
        };
        if let Ok(data) = (Message {
            header: h,
            payloads,
        })
        .emit()
        {
            self.transmits.push_back(Transmit {
                local,
                remote,
                data,
            });
            self.count(IkeEvent::MessagesOut);
        }
    }

    // -----------------------------------------------------------------
    // IKE_SA_INIT
    // -----------------------------------------------------------------

    /// A new IKE SA of connection `ci` and its IKE_SA_INIT request; `Err`
    /// says why nothing was sent.
    fn start_init(
        &mut self,
        now: Duration,
        ci: usize,
        group: Option<Group>,
        cookie: Option<Vec<u8>>,
    ) -> Result<(), String> {
        let c = &self.conns[ci];
        let Some(first_group) = c.proposals.first().and_then(|p| p.dh.first().copied()) else {
            let e = "no IKE proposal with a group".to_string();
            self.log(Level::Warn, Some(ci), e.clone());
            return Err(e);
        };
        let group = group.unwrap_or(first_group);
        let local = SocketAddr::new(c.local, self.ports.ike);
        let remote = SocketAddr::new(c.remote, self.ports.ike);
        let spi_i = match self.new_ike_spi() {
            Ok(s) => s,
            Err(e) => {
                self.rng_failed(Some(ci), "IKE SA not initiated");
                return Err(format!("cannot initiate: {e}"));
            }
        };
        let ni = match self.new_nonce() {
            Ok(n) => n,
            Err(e) => {
                self.ike_spis.remove(&spi_i);
                self.rng_failed(Some(ci), "IKE SA not initiated");
                return Err(format!("cannot initiate: {e}"));
            }
        };
        let mut sa = IkeSa::new(ci, true, (spi_i, 0), State::InitSent, (local, remote), now);
        sa.ni = ni;
        sa.cookie = cookie;
        sa.group = group;
        let i = self.insert_sa(sa);
        if let Err(e) = self.send_init(i, now) {
            self.fail(i, e.clone());
            return Err(e);
        }
        self.count(IkeEvent::IkeInitSent);
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "initiating IKE_SA_INIT to {remote} (group {})",
                group.name()
            ),
        );
        Ok(())
    }

    /// Sends (again, with a cookie or another group) SA `i`'s IKE_SA_INIT
    /// request with a new key pair; `Err` says why it was not sent.
    fn send_init(&mut self, i: usize, now: Duration) -> Result<(), String> {
        let group = self.sas[i].group;
        let ci = self.sas[i].conn;
        let ke = match self.new_ke(Some(i), group) {
            Ok(k) => k,
            Err(e) => {
                if matches!(e, DhError::Random(..)) {
                    self.rng_failed(Some(ci), "IKE_SA_INIT not sent");
                }
                return Err(format!("key exchange {}: {e}", group.name()));
            }
        };
        let fake_src = if self.conns[ci].force_encap {
            match rng::bytes(&mut *self.rng, 20) {
                Ok(b) => Some(b),
                Err(e) => {
                    self.rng_failed(Some(ci), "IKE_SA_INIT not sent");
                    return Err(format!("NAT detection: {e}"));
                }
            }
        } else {
            None
        };
        let ci = self.sas[i].conn;
        let c = &self.conns[ci];
        let mut payloads = Vec::new();
        if let Some(ck) = &self.sas[i].cookie {
            payloads.push(notify(NotifyType::Cookie, ck.clone()));
        }
        let props: Vec<wire::Proposal> = c
            .proposals
            .iter()
            .enumerate()
            .map(|(n, p)| p.to_wire(u8::try_from(n + 1).unwrap_or(255), &[], None))
            .collect();
        payloads.push(Payload::Sa(props));
        payloads.push(Payload::Ke {
            group: group.id(),
            data: ke.public_value().to_vec(),
        });
        payloads.push(Payload::Nonce(self.sas[i].ni.clone()));
        let (spi_i, local, remote) = (self.sas[i].spi_i, self.sas[i].local, self.sas[i].remote);
        let src = fake_src.unwrap_or_else(|| nat_hash(spi_i, 0, local));
        payloads.push(notify(NotifyType::NatDetectionSourceIp, src));
        payloads.push(notify(
            NotifyType::NatDetectionDestinationIp,
            nat_hash(spi_i, 0, remote),
        ));
        payloads.push(notify(NotifyType::Ikev2FragmentationSupported, vec![]));
        payloads.push(notify(
            NotifyType::SignatureHashAlgorithms,
            super::sig::encode_hash_algorithms(&super::sig::supported_hash_algorithms()),
        ));
        self.sas[i].ke = Some(ke);
        self.sas[i].next_out_id = 0;
        self.send_request(i, now, ExchangeType::IkeSaInit, payloads, Req::Init);
        if let Some(p) = &self.sas[i].pending {
            self.sas[i].init_req = p.data.first().cloned().unwrap_or_default();
        }
        Ok(())
    }

    /// The cookie the peer at `remote` must return (RFC 7296 §2.6); the
    /// secret is drawn when the first cookie is needed.
    fn cookie_for(
        &mut self,
        ni: &[u8],
        remote: SocketAddr,
        spi_i: u64,
    ) -> Result<Vec<u8>, RngError> {
        let secret = match &self.cookie_secret {
            Some(s) => s,
            None => {
                let mut s = Zeroizing::new([0u8; 32]);
                self.rng.fill(&mut s[..])?;
                self.cookie_secret.insert(s)
            }
        };
        // <VersionIDofSecret> | Hash(Ni | IPi | SPIi | <secret>).
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        ctx.update(ni);
        match remote.ip() {
            IpAddr::V4(a) => ctx.update(&a.octets()),
            IpAddr::V6(a) => ctx.update(&a.octets()),
        }
        ctx.update(&spi_i.to_be_bytes());
        ctx.update(&secret[..]);
        let mut out = vec![0, 0, 0, 1];
        out.extend_from_slice(ctx.finish().as_ref());
        Ok(out)
    }

    fn responder_init(
        &mut self,
        now: Duration,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        h: Header,
    ) {
        // A retransmitted request: answer with the cached response.
        if let Some(&i) = self.by_init.get(&(h.spi_i, remote.ip())) {
            if self.sas[i].state == State::InitDone && !self.sas[i].init_resp.is_empty() {
                self.count(IkeEvent::RetransmittedResponses);
                let d = self.sas[i].init_resp.clone();
                self.transmit(i, vec![d]);
            } else {
                self.count(IkeEvent::DroppedDuplicateInit);
            }
            return;
        }
        if h.message_id != 0 {
            self.count(IkeEvent::DroppedBadMessageId);
            return;
        }
        // An address no connection has: dropped before anything else is
        // parsed, and not answered. An answer would reflect a flood from
        // spoofed sources onto the addresses it names (RFC 7296 §2.21
        // leaves answering optional), and parsing the rest costs the
        // responder the time a flood is made to take.
        let Some(&ci) = self.conn_by_remote.get(&remote.ip()) else {
            self.count(IkeEvent::DroppedNoConnection);
            self.log(
                Level::Warn,
                None,
                format!(
                    "IKE_SA_INIT from {remote}: no connection has this peer address; not answered"
                ),
            );
            return;
        };
        let msg = match self.timed(None, IkeOp::Decode, |_| Message::parse(data)) {
            Ok(m) => m,
            Err(e) => {
                self.count(IkeEvent::DroppedMalformed);
                self.log(
                    Level::Debug,
                    None,
                    format!("IKE_SA_INIT from {remote}: {e}"),
                );
                return;
            }
        };
        if let Some(t) = msg.unsupported_critical() {
            self.reply_plain(
                local,
                remote,
                &h,
                vec![notify(
                    NotifyType::UnsupportedCriticalPayload,
                    vec![u8::from(t)],
                )],
            );
            return;
        }
        let p = &msg.payloads;
        let (Some(offered), Some((kg, kdata)), Some(ni)) = (get_sa(p), get_ke(p), get_nonce(p))
        else {
            self.count(IkeEvent::DroppedMalformed);
            self.reply_plain(
                local,
                remote,
                &h,
                vec![notify(NotifyType::InvalidSyntax, vec![])],
            );
            return;
        };
        // Cookies when many SAs are half open.
        if self.half_open >= self.cookie_threshold {
            let Ok(want) = self.cookie_for(ni, remote, h.spi_i) else {
                self.rng_failed(Some(ci), "IKE_SA_INIT request not answered");
                return;
            };
            let ok = find_notify(p, NotifyType::Cookie).is_some_and(|n| {
                aws_lc_rs::constant_time::verify_slices_are_equal(&n.data, &want).is_ok()
            });
            if !ok {
                self.count(IkeEvent::CookiesSent);
                self.reply_plain(local, remote, &h, vec![notify(NotifyType::Cookie, want)]);
                return;
            }
        }
        // Past the cookie, the sender's address is real; still, no more
        // than `half_open_limit` SAs wait for their IKE_AUTH (each holds a
        // key exchange and a little memory until `half_open` expiry).
        if self.half_open >= self.half_open_limit {
            self.count(IkeEvent::DroppedHalfOpenLimit);
            self.log(
                Level::Warn,
                Some(ci),
                format!(
                    "IKE_SA_INIT from {remote}: {} IKE SAs are already half open (the limit); not answered",
                    self.half_open
                ),
            );
            return;
        }
        let Some((num, _, chosen)) =
            select(&self.conns[ci].proposals, offered, ProposalKind::Ike, false)
        else {
            self.count(IkeEvent::NoProposalChosen);
            let offered_names: Vec<String> = offered.iter().map(describe_proposal).collect();
            self.log(
                Level::Warn,
                Some(ci),
                format!(
                    "IKE_SA_INIT from {remote}: no proposal acceptable (offered: {}; ours: {})",
                    offered_names.join(", "),
                    self.conns[ci]
                        .proposals
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            self.reply_plain(
                local,
                remote,
                &h,
                vec![notify(NotifyType::NoProposalChosen, vec![])],
            );
            return;
        };
        let Some(group) = chosen.dh else { return };
        if kg != group.id() {
            self.count(IkeEvent::InvalidKeSent);
            self.reply_plain(
                local,
                remote,
                &h,
                vec![notify(
                    NotifyType::InvalidKePayload,
                    group.id().to_be_bytes().to_vec(),
                )],
            );
            return;
        }
        let ke = match self.new_ke(None, group) {
            Ok(k) => k,
            Err(DhError::Random(..)) => {
                self.rng_failed(Some(ci), "IKE_SA_INIT request not answered");
                return;
            }
            Err(_) => return,
        };
        let g_ir = match self.timed(None, IkeOp::Dh, |_| ke.agree(kdata)) {
            Ok(g) => g,
            Err(e) => {
                self.count(IkeEvent::DroppedBadKe);
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!("IKE_SA_INIT from {remote}: bad KE: {e}"),
                );
                self.reply_plain(
                    local,
                    remote,
                    &h,
                    vec![notify(NotifyType::InvalidSyntax, vec![])],
                );
                return;
            }
        };
        let fake_src = if self.conns[ci].force_encap {
            rng::bytes(&mut *self.rng, 20).map(Some)
        } else {
            Ok(None)
        };
        let (spi_r, nr, fake_src) = match (self.new_ike_spi(), self.new_nonce(), fake_src) {
            (Ok(s), Ok(n), Ok(f)) => (s, n, f),
            (s, _, _) => {
                if let Ok(s) = s {
                    self.ike_spis.remove(&s);
                }
                self.rng_failed(Some(ci), "IKE_SA_INIT request not answered");
                return;
            }
        };
        let c = &self.conns[ci];
        let our_local = SocketAddr::new(c.local, local.port());
        // NAT detection (§2.23): compare the peer's hashes with what we see.
        let src_ok = find_notify(p, NotifyType::NatDetectionSourceIp)
            .map(|n| n.data == nat_hash(h.spi_i, 0, remote));
        let dst_ok = find_notify(p, NotifyType::NatDetectionDestinationIp)
            .map(|n| n.data == nat_hash(h.spi_i, 0, our_local));
        let nat = src_ok == Some(false) || dst_ok == Some(false) || c.force_encap;
        let mut out = vec![
            Payload::Sa(vec![chosen.to_wire(ProposalKind::Ike, num, &[])]),
            Payload::Ke {
                group: group.id(),
                data: ke.public_value().to_vec(),
            },
            Payload::Nonce(nr.clone()),
        ];
        if src_ok.is_some() {
            let src = fake_src.unwrap_or_else(|| nat_hash(h.spi_i, spi_r, our_local));
            out.push(notify(NotifyType::NatDetectionSourceIp, src));
            out.push(notify(
                NotifyType::NatDetectionDestinationIp,
                nat_hash(h.spi_i, spi_r, remote),
            ));
        }
        if let RemoteAuth::Ca(cas) = &c.remote_auth {
            out.push(certreq(cas));
        }
        out.push(notify(
            NotifyType::SignatureHashAlgorithms,
            super::sig::encode_hash_algorithms(&super::sig::supported_hash_algorithms()),
        ));
        let fragmentation = find_notify(p, NotifyType::Ikev2FragmentationSupported).is_some();
        if fragmentation {
            out.push(notify(NotifyType::Ikev2FragmentationSupported, vec![]));
        }
        let mut sa = IkeSa::new(
            ci,
            false,
            (h.spi_i, spi_r),
            State::InitDone,
            (our_local, remote),
            now,
        );
        sa.nat = nat;
        sa.chosen = Some(chosen);
        sa.ni = ni.to_vec();
        sa.nr = nr;
        sa.init_req = data.to_vec();
        sa.group = group;
        sa.fragmentation = fragmentation;
        sa.init_key = Some((h.spi_i, remote.ip()));
        let i = self.insert_sa(sa);
        self.reply(i, ExchangeType::IkeSaInit, 0, out);
        if let Some((_, d)) = &self.sas[i].last_resp {
            self.sas[i].init_resp = d.first().cloned().unwrap_or_default();
        }
        if !self.install_ike_keys(i, &g_ir, None) {
            self.remove_sa(i);
            return;
        }
        self.count(IkeEvent::IkeInitAnswered);
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "IKE_SA_INIT from {remote}: chose {}{}",
                chosen.name(),
                if nat {
                    ", NAT detected or forced: ESP in UDP"
                } else {
                    ""
                }
            ),
        );
    }

    /// Derives and installs the IKE SA keys of SA `i` (responder or initiator).
    fn install_ike_keys(&mut self, i: usize, g_ir: &[u8], old: Option<(Prf, &[u8])>) -> bool {
        let Some(chosen) = self.sas[i].chosen else {
            return false;
        };
        let Some(prf) = chosen.prf else { return false };
        #[cfg(test)]
        if self.fail_key_install {
            return false;
        }
        let keys = self.timed(Some(i), IkeOp::KeyDerivation, |s| {
            let sa = &s.sas[i];
            let input = IkeKeyInput {
                prf,
                ni: &sa.ni,
                nr: &sa.nr,
                g_ir,
                spi_i: sa.spi_i,
                spi_r: sa.spi_r,
                lens: chosen.key_lens(),
            };
            derive_ike_keys(&input, old)
        });
        let initiator = self.sas[i].initiator;
        let (out_keys, in_keys) = if initiator {
            ((&keys.sk_ei, &keys.sk_ai), (&keys.sk_er, &keys.sk_ar))
        } else {
            ((&keys.sk_er, &keys.sk_ar), (&keys.sk_ei, &keys.sk_ai))
        };
        match SkCrypto::new(
            chosen.suite(),
            (out_keys.0, out_keys.1),
            (in_keys.0, in_keys.1),
        ) {
            Ok(sk) => {
                let sa = &mut self.sas[i];
                sa.sk = Some(sk);
                sa.sk_keys = Some(SkKeys {
                    ei: keys.sk_ei.clone(),
                    er: keys.sk_er.clone(),
                    ai: keys.sk_ai.clone(),
                    ar: keys.sk_ar.clone(),
                });
                sa.sk_d = keys.sk_d.clone();
                sa.sk_pi = keys.sk_pi.clone();
                sa.sk_pr = keys.sk_pr.clone();
                true
            }
            Err(e) => {
                let c = self.sas[i].conn;
                self.log(Level::Warn, Some(c), format!("IKE SA keys: {e}"));
                false
            }
        }
    }

    fn initiator_init_response(&mut self, i: usize, now: Duration, msg: Message) {
        let ci = self.sas[i].conn;
        let p = &msg.payloads;
        if let Some(ck) = find_notify(p, NotifyType::Cookie) {
            if self.sas[i].cookie.is_some() && self.sas[i].cookie.as_ref() == Some(&ck.data) {
                return;
            }
            self.count(IkeEvent::CookiesReceived);
            self.sas[i].cookie = Some(ck.data.clone());
            self.sas[i].pending = None;
            if let Err(e) = self.send_init(i, now) {
                self.fail(i, e);
            }
            return;
        }
        if let Some(n) = find_notify(p, NotifyType::InvalidKePayload) {
            let want = (n.data.len() == 2).then(|| u16::from_be_bytes([n.data[0], n.data[1]]));
            let ok = want.and_then(Group::from_id).filter(|g| {
                *g != self.sas[i].group && self.conns[ci].proposals.iter().any(|p| p.dh.contains(g))
            });
            self.count(IkeEvent::InvalidKeReceived);
            match ok {
                Some(g) => {
                    self.log(
                        Level::Info,
                        Some(ci),
                        format!("peer asks for group {}: retrying", g.name()),
                    );
                    self.sas[i].group = g;
                    self.sas[i].pending = None;
                    if let Err(e) = self.send_init(i, now) {
                        self.fail(i, e);
                    }
                }
                None => self.fail(
                    i,
                    format!("peer asks for key exchange group {want:?}, which we do not offer"),
                ),
            }
            return;
        }
        if let Some(e) = error_notify(p) {
            self.fail(i, format!("peer refused IKE_SA_INIT: {}", notify_name(e)));
            return;
        }
        let (Some(answer), Some((kg, kdata)), Some(nr)) = (get_sa(p), get_ke(p), get_nonce(p))
        else {
            self.fail(i, "IKE_SA_INIT response lacks SA, KE or nonce".into());
            return;
        };
        let chosen = match answer {
            [one] => Chosen::from_answer(one, &self.conns[ci].proposals, ProposalKind::Ike, false),
            _ => None,
        };
        let Some(chosen) =
            chosen.filter(|c| c.dh == Some(self.sas[i].group) && kg == self.sas[i].group.id())
        else {
            self.fail(
                i,
                "IKE_SA_INIT response chose a proposal or group we did not offer".into(),
            );
            return;
        };
        let Some(ke) = self.sas[i].ke.take() else {
            return;
        };
        let g_ir = match self.timed(Some(i), IkeOp::Dh, |_| ke.agree(kdata)) {
            Ok(g) => g,
            Err(e) => {
                self.fail(i, format!("peer's key exchange value refused: {e}"));
                return;
            }
        };
        let (spi_i, spi_r) = (msg.header.spi_i, msg.header.spi_r);
        let (local, remote) = (self.sas[i].local, self.sas[i].remote);
        let src_ok = find_notify(p, NotifyType::NatDetectionSourceIp)
            .map(|n| n.data == nat_hash(spi_i, spi_r, remote));
        let dst_ok = find_notify(p, NotifyType::NatDetectionDestinationIp)
            .map(|n| n.data == nat_hash(spi_i, spi_r, local));
        let nat = src_ok == Some(false)
            || dst_ok == Some(false)
            || (self.conns[ci].force_encap && src_ok.is_some());
        {
            let sa = &mut self.sas[i];
            sa.spi_r = spi_r;
            sa.nr = nr.to_vec();
            sa.chosen = Some(chosen);
            sa.nat = nat;
            sa.fragmentation = find_notify(p, NotifyType::Ikev2FragmentationSupported).is_some();
        }
        if !self.install_ike_keys(i, &g_ir, None) {
            self.fail(i, "could not key the IKE SA".into());
            return;
        }
        if nat {
            // §2.23: move to port 4500 after IKE_SA_INIT.
            let sa = &mut self.sas[i];
            sa.local.set_port(self.ports.nat_t);
            sa.remote.set_port(self.ports.nat_t);
        }
        self.send_auth(i, now);
    }

    // -----------------------------------------------------------------
    // IKE_AUTH
    // -----------------------------------------------------------------

    fn our_id(&self, ci: usize) -> Id {
        let id = &self.conns[ci].local_id;
        Id {
            id_type: id.id_type(),
            data: id.data(),
        }
    }

    /// Our AUTH payload (and CERT payloads before it) over `signed`.
    fn make_auth(&mut self, i: usize, signed: &[u8]) -> Option<Vec<Payload>> {
        let ci = self.sas[i].conn;
        let prf = self.sas[i].chosen?.prf?;
        let auth = self.conns[ci].local_auth.clone();
        let r = self.timed(Some(i), IkeOp::AuthCreate, |_| match &auth {
            LocalAuth::Psk(k) => Ok(vec![Payload::Auth {
                method: auth_method::SHARED_KEY_MIC,
                data: psk_auth(prf, k, signed).to_vec(),
            }]),
            LocalAuth::Signature { key, certs } => {
                let mut v: Vec<Payload> = certs
                    .iter()
                    .map(|c| Payload::Cert {
                        encoding: cert_encoding::X509_SIGNATURE,
                        data: c.der().to_vec(),
                    })
                    .collect();
                match key.sign_auth(None, signed) {
                    Ok(data) => {
                        v.push(Payload::Auth {
                            method: auth_method::DIGITAL_SIGNATURE,
                            data,
                        });
                        Ok(v)
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        });
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!("could not sign our AUTH: {e}"),
                );
                None
            }
        }
    }

    /// Checks the peer's identity and AUTH; `Err` says why not.
    fn verify_peer(
        &mut self,
        i: usize,
        p: &[Payload],
        peer_id: &Id,
        signed: &[u8],
    ) -> Result<Identity, String> {
        let ci = self.sas[i].conn;
        let id = Identity::from_payload(peer_id.id_type, &peer_id.data)
            .map_err(|e| format!("peer identity: {e}"))?;
        if let Some(want) = &self.conns[ci].remote_id {
            if *want != id {
                return Err(format!("peer identity {id} is not the configured {want}"));
            }
        }
        let Some((method, data)) = p.iter().find_map(|x| match x {
            Payload::Auth { method, data } => Some((*method, data.clone())),
            _ => None,
        }) else {
            return Err("no AUTH payload".into());
        };
        let prf = self.sas[i].chosen.and_then(|c| c.prf).ok_or("no PRF")?;
        let remote_auth = self.conns[ci].remote_auth.clone();
        let unix = self.unix_at_epoch + self.sas[i].last_rx.as_secs();
        let certs: Vec<Vec<u8>> = p
            .iter()
            .filter_map(|x| match x {
                Payload::Cert { encoding, data } if *encoding == cert_encoding::X509_SIGNATURE => {
                    Some(data.clone())
                }
                _ => None,
            })
            .collect();
        self.timed(Some(i), IkeOp::AuthVerify, |_| -> Result<(), String> {
            match &remote_auth {
                RemoteAuth::Psk(k) => {
                    if method != auth_method::SHARED_KEY_MIC {
                        return Err(format!(
                            "peer used AUTH method {method}, we expect a pre-shared key (2)"
                        ));
                    }
                    let want = psk_auth(prf, k, signed);
                    aws_lc_rs::constant_time::verify_slices_are_equal(&want, &data).map_err(|_| {
                        "pre-shared key AUTH does not verify (different keys?)".to_string()
                    })
                }
                RemoteAuth::PublicKey(pk) => verify_sig(pk, method, &data, signed),
                RemoteAuth::Ca(cas) => {
                    let (ee, rest) = certs.split_first().ok_or("peer sent no certificate")?;
                    let ee =
                        Certificate::from_der(ee).map_err(|e| format!("peer certificate: {e}"))?;
                    let inter: Vec<Certificate> = rest
                        .iter()
                        .filter_map(|d| Certificate::from_der(d).ok())
                        .collect();
                    verify_chain(&ee, &inter, cas, unix)
                        .map_err(|e| format!("peer certificate: {e}"))?;
                    if !ee.matches_identity(&id) {
                        return Err(format!("peer certificate does not bind its identity {id}"));
                    }
                    let pk = ee
                        .public_key()
                        .map_err(|e| format!("peer certificate key: {e}"))?;
                    verify_sig(&pk, method, &data, signed)
                }
            }
        })?;
        Ok(id)
    }

    /// What IKE SA `i` proposes for a child SA, in order: per protocol
    /// (ESP, Q-ESP) its proposals (`docs/QESP.md` §7). `qesp = "prefer"`
    /// offers Q-ESP first and ESP second, unless a NAT was detected (Q-ESP
    /// cannot cross one) or the peer refused such an offer before.
    fn child_offer(&self, i: usize) -> Vec<(Protocol, Vec<ProposalSpec>)> {
        let sa = &self.sas[i];
        let c = &self.conns[sa.conn].child;
        let qesp = (Protocol::Qesp, qesp_capable(&c.proposals));
        let esp = (Protocol::Esp, c.proposals.clone());
        let offer = match c.qesp {
            QespMode::Off => vec![esp],
            QespMode::Prefer if sa.nat || sa.qesp_declined => vec![esp],
            QespMode::Prefer => vec![qesp, esp],
            QespMode::Require => vec![qesp],
        };
        offer.into_iter().filter(|(_, p)| !p.is_empty()).collect()
    }

    /// What IKE SA `i` accepts as responder, preferred first: Q-ESP only
    /// for a connection with `qesp = "prefer"` or `"require"` and without a
    /// NAT between the peers; ESP unless `qesp = "require"`.
    fn child_accepted(&self, i: usize) -> Vec<(Protocol, Vec<ProposalSpec>)> {
        let sa = &self.sas[i];
        let c = &self.conns[sa.conn].child;
        let mut out = Vec::new();
        if c.qesp != QespMode::Off && !sa.nat {
            out.push((Protocol::Qesp, qesp_capable(&c.proposals)));
        }
        if c.qesp != QespMode::Require {
            out.push((Protocol::Esp, c.proposals.clone()));
        }
        out
    }

    /// Our child SA proposals ([`Ike::child_offer`]) for IKE SA `i` with SPI
    /// `spi`, numbered from 1 across protocols; `with_pfs`: with their
    /// groups (a CREATE_CHILD_SA with a KE payload), else without
    /// (IKE_AUTH, or a CREATE_CHILD_SA without PFS). With `qesp = "off"`
    /// these are the ESP proposals alone, as before Q-ESP existed.
    fn child_proposals(&self, i: usize, spi: u32, with_pfs: bool) -> Vec<wire::Proposal> {
        let mut out: Vec<wire::Proposal> = Vec::new();
        for (proto, specs) in self.child_offer(i) {
            for p in &specs {
                let groups: &[Group] = if with_pfs { &p.dh } else { &[] };
                let mut w = p.to_wire(
                    u8::try_from(out.len() + 1).unwrap_or(255),
                    &spi.to_be_bytes(),
                    Some(groups),
                );
                w.protocol = protocol_id(proto);
                out.push(w);
            }
        }
        out
    }

    /// Our child SA offer was answered with error `e`: when it was Q-ESP
    /// and ESP (`qesp = "prefer"`) and the answer NO_PROPOSAL_CHOSEN, the
    /// peer may not know Q-ESP's Protocol ID (RFC 7296 lets it refuse the
    /// whole SA payload): IKE SA `i` proposes ESP alone from now on, and
    /// the caller retries. True when it should.
    fn qesp_refused(&mut self, i: usize, e: NotifyType) -> bool {
        let ci = self.sas[i].conn;
        let offered_qesp = self
            .child_offer(i)
            .iter()
            .any(|(p, _)| *p == Protocol::Qesp);
        if e != NotifyType::NoProposalChosen
            || self.conns[ci].child.qesp != QespMode::Prefer
            || !offered_qesp
        {
            return false;
        }
        self.sas[i].qesp_declined = true;
        self.log(
            Level::Info,
            Some(ci),
            "Q-ESP declined: the peer refused our Q-ESP and ESP proposals \
             (NO_PROPOSAL_CHOSEN); proposing ESP alone"
                .into(),
        );
        true
    }

    fn send_auth(&mut self, i: usize, now: Duration) {
        let ci = self.sas[i].conn;
        let id = self.our_id(ci);
        let prf = match self.sas[i].chosen.and_then(|c| c.prf) {
            Some(p) => p,
            None => return,
        };
        let signed = signed_octets(
            prf,
            &self.sas[i].init_req,
            &self.sas[i].nr,
            &self.sas[i].sk_pi,
            id.id_type,
            &id.data,
        );
        let Some(auth) = self.make_auth(i, &signed) else {
            self.fail(i, "could not create our AUTH payload".into());
            return;
        };
        // The first child takes slot 0.
        let Ok(spi_in) = self.new_child_spi(ci, 0) else {
            self.rng_failed(Some(ci), "IKE_AUTH not sent");
            self.fail(i, "no child SPI: the random number generator failed".into());
            return;
        };
        let c = &self.conns[ci];
        let mut payloads = vec![Payload::IdI(id)];
        let (certs, rest): (Vec<Payload>, Vec<Payload>) = auth
            .into_iter()
            .partition(|p| matches!(p, Payload::Cert { .. }));
        payloads.extend(certs);
        if let RemoteAuth::Ca(cas) = &c.remote_auth {
            payloads.push(certreq(cas));
        }
        payloads.push(notify(NotifyType::InitialContact, vec![]));
        if let Some(r) = &c.remote_id {
            payloads.push(Payload::IdR(Id {
                id_type: r.id_type(),
                data: r.data(),
            }));
        }
        payloads.extend(rest);
        if c.child.mode == Mode::Transport {
            payloads.push(notify(NotifyType::UseTransportMode, vec![]));
        }
        if c.child.per_cpu_sas > 1 {
            // RFC 9611: we keep one child per worker if the peer does too.
            payloads.push(notify(NotifyType::SaResourceInfo, vec![]));
        }
        payloads.push(Payload::Sa(self.child_proposals(i, spi_in, false)));
        payloads.push(Payload::TsI(c.child.local_ts.clone()));
        payloads.push(Payload::TsR(c.child.remote_ts.clone()));
        self.sas[i].state = State::AuthSent;
        self.send_request(
            i,
            now,
            ExchangeType::IkeAuth,
            payloads,
            Req::Auth { spi_in },
        );
    }

    fn responder_auth(&mut self, i: usize, now: Duration, id: u32, p: Vec<Payload>) {
        let ci = self.sas[i].conn;
        let Some(peer_id) = p.iter().find_map(|x| match x {
            Payload::IdI(v) => Some(v.clone()),
            _ => None,
        }) else {
            self.count(IkeEvent::AuthFailed);
            self.reply(
                i,
                ExchangeType::IkeAuth,
                id,
                vec![notify(NotifyType::AuthenticationFailed, vec![])],
            );
            self.destroy(i, "IKE_AUTH without IDi".into(), false);
            return;
        };
        let prf = match self.sas[i].chosen.and_then(|c| c.prf) {
            Some(p) => p,
            None => return,
        };
        let signed = signed_octets(
            prf,
            &self.sas[i].init_req,
            &self.sas[i].nr,
            &self.sas[i].sk_pi,
            peer_id.id_type,
            &peer_id.data,
        );
        let ident = match self.verify_peer(i, &p, &peer_id, &signed) {
            Ok(x) => x,
            Err(e) => {
                self.count(IkeEvent::AuthFailed);
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!("authentication of {} failed: {e}", self.sas[i].remote),
                );
                self.reply(
                    i,
                    ExchangeType::IkeAuth,
                    id,
                    vec![notify(NotifyType::AuthenticationFailed, vec![])],
                );
                self.destroy(i, format!("authentication failed: {e}"), false);
                return;
            }
        };
        let our = self.our_id(ci);
        let initial_contact = find_notify(&p, NotifyType::InitialContact).is_some();
        let signed_r = signed_octets(
            prf,
            &self.sas[i].init_resp,
            &self.sas[i].ni,
            &self.sas[i].sk_pr,
            our.id_type,
            &our.data,
        );
        let Some(auth) = self.make_auth(i, &signed_r) else {
            self.reply(
                i,
                ExchangeType::IkeAuth,
                id,
                vec![notify(NotifyType::AuthenticationFailed, vec![])],
            );
            self.destroy(i, "could not create our AUTH payload".into(), false);
            return;
        };
        let mut out = vec![Payload::IdR(our)];
        out.extend(auth);
        // RFC 4555 §3.3: MOBIKE if the initiator offers it and the
        // connection allows it. We are never its initiator (we do not move
        // ourselves); the peer is, and moves the SAs with
        // UPDATE_SA_ADDRESSES.
        let mobike =
            self.conns[ci].mobike && find_notify(&p, NotifyType::MobikeSupported).is_some();
        if mobike {
            out.push(notify(NotifyType::MobikeSupported, vec![]));
        }
        self.sas[i].mobike = mobike;
        self.sas[i].peer_id = Some(ident.clone());
        self.set_state(i, State::Established);
        self.sas[i].established_at = Some(now);
        let (rekey, jitter) = (self.conns[ci].rekey_time, self.conns[ci].jitter);
        self.sas[i].rekey_at = self.after(now, rekey, jitter);
        // The child SA.
        let ni = self.sas[i].ni.clone();
        let nr = self.sas[i].nr.clone();
        match self.accept_child(i, now, &p, ChildExchange::IkeAuth, &ni, &nr) {
            Ok(child_payloads) => out.extend(child_payloads),
            Err(n) => out.push(notify(n, vec![])),
        }
        self.reply(i, ExchangeType::IkeAuth, id, out);
        self.count(IkeEvent::IkeEstablished);
        self.ike_up(i);
        if initial_contact {
            // §2.4: the peer has no other IKE SA with us any more (it
            // restarted): drop ours with it, without telling it.
            let others: Vec<usize> = self.by_conn[ci]
                .iter()
                .copied()
                .filter(|&j| j != i)
                .collect();
            for j in others {
                self.count(IkeEvent::InitialContactCleared);
                self.destroy(j, format!("{ident} started over (INITIAL_CONTACT)"), false);
            }
        }
    }

    fn ike_up(&mut self, i: usize) {
        let ci = self.sas[i].conn;
        let algs = self.sas[i].chosen.map(|c| c.name()).unwrap_or_default();
        let peer = self.sas[i]
            .peer_id
            .as_ref()
            .map(|x| x.to_string())
            .unwrap_or_default();
        let remote = self.sas[i].remote;
        self.events.push_back(Event::IkeUp {
            conn: self.conns[ci].name.clone(),
            algorithms: algs.clone(),
        });
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "IKE SA {:016x}_i {:016x}_r established with {peer} at {remote} ({algs}{})",
                self.sas[i].spi_i,
                self.sas[i].spi_r,
                if self.sas[i].nat {
                    ", UDP-encapsulated"
                } else {
                    ""
                }
            ),
        );
        self.restart_at.remove(&ci);
    }

    /// Responder side of a child SA negotiation (IKE_AUTH or CREATE_CHILD_SA):
    /// chooses the proposal, narrows the selectors, derives the keys and
    /// installs the SAs. Returns the payloads of the answer, or the error
    /// notify type.
    #[allow(clippy::too_many_arguments)]
    fn accept_child(
        &mut self,
        i: usize,
        now: Duration,
        p: &[Payload],
        via: ChildExchange<'_>,
        ni: &[u8],
        nr: &[u8],
    ) -> Result<Vec<Payload>, NotifyType> {
        let (ke, rekey_of) = match via {
            ChildExchange::IkeAuth => (None, None),
            ChildExchange::CreateChildSa { ke, rekey_of } => (ke, rekey_of),
        };
        let ci = self.sas[i].conn;
        let Some(offered) = get_sa(p) else {
            return Err(NotifyType::InvalidSyntax);
        };
        let Some((ts_i, ts_r)) = get_ts(p) else {
            return Err(NotifyType::InvalidSyntax);
        };
        let accepted = self.child_accepted(i);
        let found = accepted.iter().find_map(|(proto, ours)| {
            select_as(
                ours,
                offered,
                ProposalKind::Esp,
                protocol_id(*proto),
                ke.is_some(),
            )
            .map(|x| (*proto, x))
        });
        let Some((protocol, (num, spi_out, chosen))) = found else {
            self.count(IkeEvent::NoProposalChosen);
            let offered_qesp = offered.iter().any(|p| p.protocol == protocol::QESP);
            let why = match self.conns[ci].child.qesp {
                QespMode::Require if self.sas[i].nat => {
                    "no acceptable Q-ESP proposal (qesp = \"require\", but a NAT was detected \
                     and Q-ESP cannot cross one)"
                }
                QespMode::Require => "no acceptable Q-ESP proposal (qesp = \"require\")",
                QespMode::Off if offered_qesp => {
                    "no acceptable ESP proposal (the peer's Q-ESP proposals are ignored: \
                     qesp = \"off\")"
                }
                _ => "no acceptable ESP proposal",
            };
            self.log(Level::Warn, Some(ci), format!("child SA: {why}"));
            return Err(NotifyType::NoProposalChosen);
        };
        if protocol == Protocol::Esp && self.conns[ci].child.qesp == QespMode::Prefer {
            let why = if self.sas[i].nat {
                "a NAT was detected and Q-ESP cannot cross one"
            } else {
                "the peer proposed none we accept"
            };
            self.log(
                Level::Info,
                Some(ci),
                format!("child SA: no Q-ESP ({why}): running ESP"),
            );
        }
        let Some(spi_out) = spi4(&spi_out) else {
            return Err(NotifyType::InvalidSyntax);
        };
        // The initiator's TSi is its side (our remote), TSr ours.
        // Narrowed into the first of our selector sets that both sides meet.
        let c = &self.conns[ci];
        let narrowed = (0..c.child.set_count()).find_map(|k| {
            let (ours, theirs) = c.child.set(k)?;
            let remote_ts = ts::narrow(ts_i, theirs);
            let local_ts = ts::narrow(ts_r, ours);
            (!remote_ts.is_empty() && !local_ts.is_empty()).then_some((local_ts, remote_ts))
        });
        let Some((local_ts, remote_ts)) = narrowed else {
            let ours = (0..c.child.set_count())
                .filter_map(|k| c.child.set(k))
                .map(|(l, r)| format!("{} === {}", ts_list(r), ts_list(l)))
                .collect::<Vec<_>>()
                .join("; ");
            let msg = format!(
                "child SA: traffic selectors {} === {} do not meet ours {ours}",
                ts_list(ts_i),
                ts_list(ts_r),
            );
            self.count(IkeEvent::TsUnacceptable);
            self.log(Level::Warn, Some(ci), msg);
            return Err(NotifyType::TsUnacceptable);
        };
        let transport = find_notify(p, NotifyType::UseTransportMode).is_some();
        if transport != (c.child.mode == Mode::Transport) {
            self.log(
                Level::Warn,
                Some(ci),
                format!(
                    "child SA: peer asks for {} mode, we are configured for {}",
                    if transport { "transport" } else { "tunnel" },
                    if transport { "tunnel" } else { "transport" }
                ),
            );
            return Err(NotifyType::NoProposalChosen);
        }
        let mode = c.child.mode;
        // RFC 9611: the peer keeps several children with these selectors
        // (one per resource) and we do too (`per_cpu_sas`).
        let per_cpu =
            c.child.per_cpu_sas > 1 && find_notify(p, NotifyType::SaResourceInfo).is_some();
        let slot = match (via, rekey_of) {
            (ChildExchange::IkeAuth, _) => 0,
            // A rekey keeps the slot of the child it replaces.
            (_, Some(old_out)) => self.sas[i]
                .children
                .iter()
                .find(|c| c.spi_out == old_out)
                .map_or(0, |c| c.slot),
            (_, None) => match self.free_slot(ci, |c| c.same_ts(&local_ts, &remote_ts)) {
                Some(k) => k,
                // Every slot is taken: a per-CPU request is refused
                // (RFC 9611 §4); a plain new child replaces slot 0 as
                // before.
                None if per_cpu => {
                    self.count(IkeEvent::ChildFailed);
                    self.log(
                        Level::Info,
                        Some(ci),
                        format!(
                            "child SA: the peer asked for one more per-CPU child SA, but all {} \
                             slots are taken (TS_MAX_QUEUE)",
                            self.conns[ci].child.per_cpu_sas
                        ),
                    );
                    return Err(NotifyType::TsMaxQueue);
                }
                None => 0,
            },
        };
        // What IKE_AUTH says, or a later child's notify (IKE_AUTH's child
        // may have been refused).
        if matches!(via, ChildExchange::IkeAuth) || per_cpu {
            self.sas[i].per_cpu_peer = per_cpu;
        }
        let mut out_ke = None;
        let g_ir = match (ke, chosen.dh) {
            (Some((kg, kd)), Some(g)) => {
                if kg != g.id() {
                    return Err(NotifyType::InvalidKePayload);
                }
                let k = self.new_ke(Some(i), g).map_err(|e| match e {
                    DhError::Random(..) => {
                        self.rng_failed(Some(ci), "child SA refused (TEMPORARY_FAILURE)");
                        NotifyType::TemporaryFailure
                    }
                    _ => NotifyType::NoProposalChosen,
                })?;
                let s = self
                    .timed(Some(i), IkeOp::Dh, |_| k.agree(kd))
                    .map_err(|_| NotifyType::InvalidSyntax)?;
                out_ke = Some(Payload::Ke {
                    group: g.id(),
                    data: k.public_value().to_vec(),
                });
                Some(s)
            }
            _ => None,
        };
        let Ok(spi_in) = self.new_child_spi(ci, slot) else {
            self.rng_failed(Some(ci), "child SA refused (TEMPORARY_FAILURE)");
            return Err(NotifyType::TemporaryFailure);
        };
        let prf = self.sas[i]
            .chosen
            .and_then(|c| c.prf)
            .ok_or(NotifyType::NoProposalChosen)?;
        let sk_d = self.sas[i].sk_d.clone();
        let keys = self
            .timed(Some(i), IkeOp::KeyDerivation, |_| {
                derive_child_keys(
                    prf,
                    &sk_d,
                    g_ir.as_deref().map(|v| &v[..]),
                    ni,
                    nr,
                    chosen.key_lens(),
                )
            })
            .ok_or(NotifyType::NoProposalChosen)?;
        let mut out = vec![Payload::Sa(vec![chosen.to_wire_as(
            ProposalKind::Esp,
            protocol_id(protocol),
            num,
            &spi_in.to_be_bytes(),
        )])];
        if let ChildExchange::CreateChildSa { .. } = via {
            // RFC 7296 §1.3.1/§1.3.2: SA, Nr, [KEr], TSi, TSr, for a new
            // child as for a rekey; KEr whenever the request had KEi and
            // the chosen proposal has a group (the keys then include g^ir,
            // §2.17).
            out.push(Payload::Nonce(nr.to_vec()));
            if let Some(k) = out_ke {
                out.push(k);
            }
        }
        out.push(Payload::TsI(remote_ts.clone()));
        out.push(Payload::TsR(local_ts.clone()));
        if mode == Mode::Transport {
            out.insert(0, notify(NotifyType::UseTransportMode, vec![]));
        }
        if per_cpu {
            out.insert(0, notify(NotifyType::SaResourceInfo, vec![]));
        }
        // We are the responder of this exchange: i->r keys are our inbound.
        let (inbound, outbound, mut child) = self.new_child(
            i,
            now,
            false,
            (spi_in, spi_out),
            (protocol, chosen),
            &keys,
            (local_ts, remote_ts),
            mode,
            (ni, nr),
            slot,
        );
        let ts_label = self.ts_label(ci, &child.local_ts, &child.remote_ts);
        self.events.push_back(Event::InstallSa(inbound));
        if let Some(old_out) = rekey_of {
            child.replaces = self.sas[i]
                .children
                .iter()
                .find(|c| c.spi_out == old_out)
                .map(|c| c.spi_in);
            let lost_out = child
                .replaces
                .is_some_and(|old_in| self.drop_abandoned_rekeys(i, old_in));
            if lost_out {
                // Our outbound traffic went out on an SA the peer never
                // had: holding the new one back would only prolong that.
                self.events.push_back(Event::InstallSa(outbound));
                self.outbound_replaced(ci, slot, (&child.local_ts, &child.remote_ts));
                child.out_active = true;
            } else {
                // Make-before-break: hold our new outbound SA until the
                // initiator deletes the old one (it has installed its
                // inbound SA by then).
                child.pending_out = Some((outbound, now + OUTBOUND_SWITCH_DEADLINE));
            }
        } else {
            self.events.push_back(Event::InstallSa(outbound));
            self.outbound_replaced(ci, slot, (&child.local_ts, &child.remote_ts));
            child.out_active = true;
        }
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "child SA {} {:08x}_i {:08x}_o ({}{}){}{}{}",
                if rekey_of.is_some() {
                    "rekeyed by peer:"
                } else {
                    "established:"
                },
                spi_in,
                spi_out,
                qesp_label(protocol),
                chosen.name(),
                slot_label(self.conns[ci].child.per_cpu_sas, slot),
                ts_label,
                rekey_of
                    .map(|o| format!(", replaces {o:08x}_i"))
                    .unwrap_or_default()
            ),
        );
        self.count(if rekey_of.is_some() {
            IkeEvent::ChildRekeys
        } else {
            IkeEvent::ChildrenEstablished
        });
        self.sas[i].children.push(child);
        Ok(out)
    }

    /// The two SAs of a new child and its record. `initiated`: we started
    /// the exchange (its initiator-to-responder keys are our outbound ones).
    #[allow(clippy::too_many_arguments)]
    fn new_child(
        &mut self,
        i: usize,
        now: Duration,
        initiated: bool,
        (spi_in, spi_out): (u32, u32),
        (protocol, chosen): (Protocol, Chosen),
        keys: &super::keys::ChildKeys,
        (local_ts, remote_ts): (Vec<TrafficSelector>, Vec<TrafficSelector>),
        mode: Mode,
        (ni, nr): (&[u8], &[u8]),
        slot: u32,
    ) -> (SaInstall, SaInstall, Child) {
        let ((ein, iin), (eout, iout)) = if initiated {
            ((&keys.enc_r, &keys.integ_r), (&keys.enc_i, &keys.integ_i))
        } else {
            ((&keys.enc_i, &keys.integ_i), (&keys.enc_r, &keys.integ_r))
        };
        let inbound = self.sa_install(
            i,
            false,
            (protocol, spi_in),
            &chosen,
            ein.clone(),
            iin.clone(),
            (&local_ts, &remote_ts),
            mode,
            slot,
        );
        let outbound = self.sa_install(
            i,
            true,
            (protocol, spi_out),
            &chosen,
            eout.clone(),
            iout.clone(),
            (&local_ts, &remote_ts),
            mode,
            slot,
        );
        let c = &self.conns[self.sas[i].conn].child;
        let (rekey, jitter, life) = (c.rekey_time, c.jitter, c.life_time);
        let child = Child {
            spi_in,
            spi_out,
            protocol,
            chosen,
            local_ts,
            remote_ts,
            state: ChildState::Installed,
            rekey_at: self.after(now, rekey, jitter),
            expire_at: (!life.is_zero()).then(|| now + life),
            pending_out: None,
            out_active: false,
            replaced: false,
            nonces: (ni.to_vec(), nr.to_vec()),
            slot,
            replaces: None,
        };
        (inbound, outbound, child)
    }

    #[allow(clippy::too_many_arguments)]
    fn sa_install(
        &self,
        i: usize,
        outbound: bool,
        (protocol, spi): (Protocol, u32),
        chosen: &Chosen,
        enc_key: Zeroizing<Vec<u8>>,
        integ_key: Zeroizing<Vec<u8>>,
        (local_ts, remote_ts): (&[TrafficSelector], &[TrafficSelector]),
        mode: Mode,
        slot: u32,
    ) -> SaInstall {
        let sa = &self.sas[i];
        let set = self.set_of_ts(sa.conn, local_ts, remote_ts);
        let set_ts = self.conns[sa.conn]
            .child
            .set(set)
            .map(|(l, r)| (l.to_vec(), r.to_vec()))
            .unwrap_or_default();
        SaInstall {
            conn: self.conns[sa.conn].name.clone(),
            outbound,
            spi,
            protocol,
            suite: chosen.suite(),
            enc_key,
            integ_key,
            esn: chosen.esn,
            mode,
            encap: sa.nat.then_some((sa.local.port(), sa.remote.port())),
            local: sa.local.ip(),
            remote: sa.remote.ip(),
            local_ts: local_ts.to_vec(),
            remote_ts: remote_ts.to_vec(),
            set_ts,
            slot,
        }
    }

    fn initiator_auth_response(&mut self, i: usize, now: Duration, spi_in: u32, p: Vec<Payload>) {
        let ci = self.sas[i].conn;
        if find_notify(&p, NotifyType::AuthenticationFailed).is_some() {
            self.count(IkeEvent::AuthFailed);
            self.child_spis.remove(&spi_in);
            self.fail(
                i,
                "peer refused our authentication (AUTHENTICATION_FAILED)".into(),
            );
            return;
        }
        let Some(peer_id) = p.iter().find_map(|x| match x {
            Payload::IdR(v) => Some(v.clone()),
            _ => None,
        }) else {
            self.fail(
                i,
                format!(
                    "IKE_AUTH response without IDr{}",
                    error_notify(&p)
                        .map(|n| format!(" ({})", notify_name(n)))
                        .unwrap_or_default()
                ),
            );
            return;
        };
        let prf = match self.sas[i].chosen.and_then(|c| c.prf) {
            Some(p) => p,
            None => return,
        };
        let init_resp_bytes = self.sas[i].init_resp.clone();
        let signed = signed_octets(
            prf,
            &init_resp_bytes,
            &self.sas[i].ni,
            &self.sas[i].sk_pr,
            peer_id.id_type,
            &peer_id.data,
        );
        match self.verify_peer(i, &p, &peer_id, &signed) {
            Ok(ident) => self.sas[i].peer_id = Some(ident),
            Err(e) => {
                self.count(IkeEvent::AuthFailed);
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!("authentication of the responder failed: {e}"),
                );
                // §2.21.2: tell the peer with an INFORMATIONAL, then drop the SA.
                self.sas[i].state = State::Established;
                self.send_request(
                    i,
                    now,
                    ExchangeType::Informational,
                    vec![notify(NotifyType::AuthenticationFailed, vec![])],
                    Req::DeleteIke,
                );
                self.destroy(i, format!("authentication failed: {e}"), false);
                return;
            }
        }
        self.sas[i].state = State::Established;
        self.sas[i].established_at = Some(now);
        let (rekey, jitter) = (self.conns[ci].rekey_time, self.conns[ci].jitter);
        self.sas[i].rekey_at = self.after(now, rekey, jitter);
        self.count(IkeEvent::IkeEstablished);
        self.ike_up(i);
        let ni = self.sas[i].ni.clone();
        let nr = self.sas[i].nr.clone();
        let installed = self.finish_child(i, now, spi_in, &p, None, &ni, &nr, None, (0, 0));
        let want = self.conns[ci].child.per_cpu_sas;
        if installed && want > 1 {
            if find_notify(&p, NotifyType::SaResourceInfo).is_some() {
                // RFC 9611: the peer keeps per-resource children too; one
                // more per worker slot, each its own CREATE_CHILD_SA.
                // Learnt before the further sets below are asked for, so
                // that their first requests carry the notify as well.
                self.sas[i].per_cpu_peer = true;
                self.queue_per_cpu(i, 0);
            } else {
                self.log(
                    Level::Info,
                    Some(ci),
                    format!(
                        "per_cpu_sas = {want}, but the peer did not announce SA_RESOURCE_INFO \
                         (RFC 9611): one child SA for all workers"
                    ),
                );
            }
        }
        // Each further selector set is a child of its own, asked for with
        // CREATE_CHILD_SA once the IKE SA is up (whether or not the first
        // was accepted: the peer may take some sets and not others).
        let sets = self.conns[ci].child.set_count();
        if sets > 1 {
            self.sas[i].tasks.extend((1..sets).map(Task::CreateChild));
        }
        self.kick(i, now);
    }

    /// RFC 9611: selector set `set` has its first child on IKE SA `i`,
    /// whose peer keeps per-resource children: one more per other slot,
    /// each its own CREATE_CHILD_SA (a task that finds no free slot then
    /// does nothing).
    fn queue_per_cpu(&mut self, i: usize, set: u32) {
        let want = self.conns[self.sas[i].conn].child.per_cpu_sas;
        if !self.sas[i].per_cpu_peer || want <= 1 {
            return;
        }
        for _ in 1..want {
            self.sas[i].tasks.push_back(Task::CreatePerCpu(set));
        }
    }

    /// Initiator side: reads the responder's child SA answer and installs it.
    #[allow(clippy::too_many_arguments)]
    fn finish_child(
        &mut self,
        i: usize,
        now: Duration,
        spi_in: u32,
        p: &[Payload],
        ke: Option<KeyExchange>,
        ni: &[u8],
        nr: &[u8],
        rekey_of: Option<u32>,
        (slot, set): (u32, u32),
    ) -> bool {
        let ci = self.sas[i].conn;
        if let Some(e) = error_notify(p) {
            self.child_spis.remove(&spi_in);
            self.count(IkeEvent::ChildFailed);
            self.log(
                Level::Warn,
                Some(ci),
                format!("child SA refused by peer: {}", notify_name(e)),
            );
            if self.qesp_refused(i, e) {
                self.sas[i].tasks.push_back(match rekey_of {
                    Some(old_in) => Task::RekeyChild(old_in),
                    None => Task::CreateChild(set),
                });
            }
            return false;
        }
        let answer = match get_sa(p) {
            Some([one]) => Some(one.clone()),
            _ => None,
        };
        // The answer must be one of the proposals we offered, of the
        // protocol it names.
        let offer = self.child_offer(i);
        let chosen = answer.as_ref().and_then(|a| {
            offer.iter().find_map(|(proto, specs)| {
                Chosen::from_answer_as(
                    a,
                    specs,
                    ProposalKind::Esp,
                    protocol_id(*proto),
                    ke.is_some(),
                )
                .map(|c| (*proto, c))
            })
        });
        let spi_out = answer.as_ref().and_then(|a| spi4(&a.spi));
        let tsr = get_ts(p).map(|(a, b)| (a.to_vec(), b.to_vec()));
        let (Some((protocol, chosen)), Some(spi_out), Some((ts_i, ts_r))) = (chosen, spi_out, tsr)
        else {
            self.child_spis.remove(&spi_in);
            self.count(IkeEvent::ChildFailed);
            self.log(
                Level::Warn,
                Some(ci),
                "child SA answer invalid (proposal, SPI or selectors)".into(),
            );
            return false;
        };
        let c = &self.conns[ci];
        let (our_ts, peer_ts) = c.child.set(set).unwrap_or((&[], &[]));
        if !ts::covered(&ts_i, our_ts) || !ts::covered(&ts_r, peer_ts) {
            self.child_spis.remove(&spi_in);
            self.count(IkeEvent::ChildFailed);
            self.log(
                Level::Warn,
                Some(ci),
                "child SA answer widened our traffic selectors".into(),
            );
            return false;
        }
        let transport = find_notify(p, NotifyType::UseTransportMode).is_some();
        if transport != (c.child.mode == Mode::Transport) {
            self.child_spis.remove(&spi_in);
            self.log(
                Level::Warn,
                Some(ci),
                "child SA answer has another mode than we asked".into(),
            );
            return false;
        }
        let mode = c.child.mode;
        let g_ir = match (&ke, chosen.dh) {
            (Some(k), Some(g)) if k.group() == g => match get_ke(p) {
                Some((kg, kd)) if kg == g.id() => {
                    self.timed(Some(i), IkeOp::Dh, |_| k.agree(kd)).ok()
                }
                _ => None,
            },
            (None, None) => None,
            _ => {
                self.child_spis.remove(&spi_in);
                self.log(Level::Warn, Some(ci), "child SA answer has a bad KE".into());
                return false;
            }
        };
        if ke.is_some() && g_ir.is_none() {
            self.child_spis.remove(&spi_in);
            self.log(Level::Warn, Some(ci), "child SA answer has a bad KE".into());
            return false;
        }
        let Some(prf) = self.sas[i].chosen.and_then(|c| c.prf) else {
            return false;
        };
        let sk_d = self.sas[i].sk_d.clone();
        let Some(keys) = self.timed(Some(i), IkeOp::KeyDerivation, |_| {
            derive_child_keys(
                prf,
                &sk_d,
                g_ir.as_deref().map(|v| &v[..]),
                ni,
                nr,
                chosen.key_lens(),
            )
        }) else {
            return false;
        };
        if protocol == Protocol::Esp && offer.iter().any(|(p, _)| *p == Protocol::Qesp) {
            self.log(
                Level::Info,
                Some(ci),
                "Q-ESP declined: the peer chose our ESP proposal; running ESP".into(),
            );
        }
        // We initiated this exchange: i->r keys are our outbound.
        let (inbound, outbound, mut child) = self.new_child(
            i,
            now,
            true,
            (spi_in, spi_out),
            (protocol, chosen),
            &keys,
            (ts_i, ts_r),
            mode,
            (ni, nr),
            slot,
        );
        let ts_label = self.ts_label(ci, &child.local_ts, &child.remote_ts);
        child.out_active = true;
        self.events.push_back(Event::InstallSa(inbound));
        self.events.push_back(Event::InstallSa(outbound));
        self.outbound_replaced(ci, slot, (&child.local_ts, &child.remote_ts));
        self.sas[i].children.push(child);
        self.count(if rekey_of.is_some() {
            IkeEvent::ChildRekeys
        } else {
            IkeEvent::ChildrenEstablished
        });
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "child SA {} {:08x}_i {:08x}_o ({}{}){}{}{}",
                if rekey_of.is_some() {
                    "rekeyed:"
                } else {
                    "established:"
                },
                spi_in,
                spi_out,
                qesp_label(protocol),
                chosen.name(),
                slot_label(self.conns[ci].child.per_cpu_sas, slot),
                ts_label,
                rekey_of
                    .map(|o| format!(", replaces {o:08x}_i"))
                    .unwrap_or_default()
            ),
        );
        true
    }

    // -----------------------------------------------------------------
    // Receiving
    // -----------------------------------------------------------------

    /// One received IKE datagram (without the non-ESP marker), its
    /// destination (our address and port) and its source.
    pub fn handle(&mut self, now: Duration, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        self.dispatch(now, local, remote, data);
        self.rearm_dirty();
    }

    /// Routes one datagram to its SA (or to IKE_SA_INIT handling).
    fn dispatch(&mut self, now: Duration, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        self.count(IkeEvent::MessagesIn);
        let h = match Header::parse(data) {
            Ok((h, _, _)) => h,
            Err(_) => {
                self.count(IkeEvent::DroppedMalformed);
                return;
            }
        };
        if h.exchange_type == ExchangeType::IkeSaInit && !h.response {
            if h.spi_r != 0 {
                self.count(IkeEvent::DroppedMalformed);
                return;
            }
            self.responder_init(now, local, remote, data, h);
            return;
        }
        // The original initiator sets the I flag: a message with it is
        // for an SA we respond to, found by its SPIr; one without it is
        // for an SA we initiated, found by its SPIi. The peer's SPI must
        // match too (unknown while our IKE_SA_INIT is unanswered).
        let ours = if h.initiator { h.spi_r } else { h.spi_i };
        let found = self.by_spi.get(&ours).copied().filter(|&i| {
            let s = &self.sas[i];
            s.initiator != h.initiator
                && (s.state == State::InitSent
                    || (if s.initiator { s.spi_r } else { s.spi_i })
                        == (if s.initiator { h.spi_r } else { h.spi_i }))
        });
        let Some(i) = found else {
            self.count(IkeEvent::DroppedUnknownSpi);
            return;
        };
        self.dirty.push(i);
        if h.response {
            self.handle_response(i, now, remote, data, h);
        } else {
            // Our address is the SA's (we never move; `local` may be the
            // socket's wildcard address), the port the request's.
            let here = SocketAddr::new(self.sas[i].local.ip(), local.port());
            self.answer_to = Some((i, here, remote));
            self.handle_request(i, now, here, remote, data, h);
            self.answer_to = None;
        }
    }

    fn handle_response(
        &mut self,
        i: usize,
        now: Duration,
        remote: SocketAddr,
        data: &[u8],
        h: Header,
    ) {
        let serial = self.sas[i].serial;
        let Some(pending) = &self.sas[i].pending else {
            self.count(IkeEvent::DroppedUnexpectedResponse);
            return;
        };
        if pending.id != h.message_id {
            self.count(IkeEvent::DroppedBadMessageId);
            return;
        }
        if h.exchange_type == ExchangeType::IkeSaInit {
            if self.sas[i].state != State::InitSent {
                self.count(IkeEvent::DroppedUnexpectedResponse);
                return;
            }
            let msg = match self.timed(Some(i), IkeOp::Decode, |_| Message::parse(data)) {
                Ok(m) => m,
                Err(_) => {
                    self.count(IkeEvent::DroppedMalformed);
                    return;
                }
            };
            self.sas[i].last_rx = now;
            if error_notify(&msg.payloads).is_none()
                && find_notify(&msg.payloads, NotifyType::Cookie).is_none()
            {
                self.sas[i].pending = None;
                self.sas[i].init_resp = data.to_vec();
            }
            self.sas[i].remote = remote;
            self.initiator_init_response(i, now, msg);
            return;
        }
        let Some(p) = self.open(i, data) else { return };
        self.sas[i].last_rx = now;
        self.peer_heard(i);
        let Some(pending) = self.sas[i].pending.take() else {
            return;
        };
        match pending.what {
            Req::Init => {}
            Req::Auth { spi_in } => self.initiator_auth_response(i, now, spi_in, p),
            Req::Child {
                spi_in,
                rekey_of,
                ni,
                ke,
                slot,
                set,
            } => self.child_response(i, now, (spi_in, slot, set), rekey_of, ni, ke, p),
            Req::IkeRekey { new_spi, ni, ke } => {
                self.ike_rekey_response(i, now, new_spi, ni, ke, p)
            }
            Req::Dpd => {}
            Req::DeleteChild { spi_in } => {
                self.remove_child(i, spi_in, Some(now));
            }
            Req::DeleteIke => {
                let replaced = self.sas[i].remove_at.is_some();
                let why = if replaced {
                    "replaced by rekeying"
                } else {
                    "deleted"
                };
                self.destroy(i, why.into(), !replaced);
                return;
            }
        }
        if self.sas.get(i).is_some_and(|s| s.serial == serial) {
            self.kick(i, now);
        }
    }

    /// Decrypts a message of SA `i`, counting failures. A fragment
    /// (RFC 7383) is kept until its message is complete: `None` until then.
    fn open(&mut self, i: usize, data: &[u8]) -> Option<Vec<Payload>> {
        if data.get(16) == Some(&u8::from(PayloadType::Skf)) {
            return self.open_fragment(i, data);
        }
        let r = self.timed(Some(i), IkeOp::Decrypt, |s| match &s.sas[i].sk {
            Some(sk) => sk.open(data),
            None => Err(SkError::NotEncrypted),
        });
        match r {
            Ok((_, p)) => Some(p),
            Err(SkError::Integrity) => {
                self.count(IkeEvent::DroppedIntegrity);
                None
            }
            Err(e) => {
                self.count(IkeEvent::DroppedMalformed);
                let c = self.sas[i].conn;
                self.log(Level::Debug, Some(c), format!("message dropped: {e}"));
                None
            }
        }
    }

    fn open_fragment(&mut self, i: usize, data: &[u8]) -> Option<Vec<Payload>> {
        let r = self.timed(Some(i), IkeOp::Decrypt, |s| match &s.sas[i].sk {
            Some(sk) if s.sas[i].fragmentation => sk.open_fragment(data),
            _ => Err(SkError::NotEncrypted),
        });
        let (h, f) = match r {
            Ok(x) => x,
            Err(SkError::Integrity) => {
                self.count(IkeEvent::DroppedIntegrity);
                return None;
            }
            Err(e) => {
                self.count(IkeEvent::DroppedMalformed);
                let c = self.sas[i].conn;
                self.log(Level::Debug, Some(c), format!("fragment dropped: {e}"));
                return None;
            }
        };
        self.count(IkeEvent::FragmentsIn);
        if usize::from(f.total) > MAX_FRAGMENTS {
            self.count(IkeEvent::DroppedTooManyFragments);
            return None;
        }
        let key = (h.message_id, h.response);
        let sa = &mut self.sas[i];
        let fresh = sa
            .reasm
            .as_ref()
            .is_none_or(|r| r.key != key || r.total != f.total);
        if fresh {
            sa.reasm = Some(Reassembly {
                key,
                total: f.total,
                first: PayloadType::NoNext,
                parts: BTreeMap::new(),
            });
        }
        let r = sa.reasm.as_mut()?;
        if f.number == 1 {
            r.first = f.first;
        }
        r.parts.entry(f.number).or_insert(f.data);
        if r.parts.len() < usize::from(r.total) {
            return None;
        }
        let r = sa.reasm.take()?;
        let body: Vec<u8> = r.parts.into_values().flatten().collect();
        match self.timed(Some(i), IkeOp::Decode, |_| {
            wire::parse_payload_chain(r.first, &body, true)
        }) {
            Ok(p) => {
                self.count(IkeEvent::FragmentedMessagesIn);
                Some(p)
            }
            Err(e) => {
                self.count(IkeEvent::DroppedMalformed);
                let c = self.sas[i].conn;
                self.log(
                    Level::Debug,
                    Some(c),
                    format!("reassembled message dropped: {e}"),
                );
                None
            }
        }
    }

    fn handle_request(
        &mut self,
        i: usize,
        now: Duration,
        local: SocketAddr,
        remote: SocketAddr,
        data: &[u8],
        h: Header,
    ) {
        let sa = &self.sas[i];
        if let Some((id, resp)) = &sa.last_resp {
            if *id == h.message_id {
                // A retransmitted request: the cached response again (§2.1).
                // A fragmented request is answered once per retransmission:
                // on its first fragment (RFC 7383 §2.6.1).
                let skf = data.get(16) == Some(&u8::from(PayloadType::Skf));
                if !skf || data.get(32..34) == Some(&[0, 1][..]) {
                    let resp = resp.clone();
                    self.count(IkeEvent::RetransmittedResponses);
                    self.transmit_answer(i, resp);
                }
                return;
            }
        }
        // A continued SA's snapshot may be an exchange or so behind the
        // peer: its first request may be past `next_in_id` (RFC 7296
        // §2.3 lets a responder take IDs beyond the one expected).
        let ahead = h.message_id.wrapping_sub(sa.next_in_id);
        if ahead != 0 && !(sa.resync_in && ahead < RESYNC_WINDOW) {
            self.count(IkeEvent::DroppedBadMessageId);
            return;
        }
        let Some(p) = self.open(i, data) else { return };
        self.sas[i].last_rx = now;
        if std::mem::take(&mut self.sas[i].resync_in) && ahead != 0 {
            self.count(IkeEvent::MessageIdResyncs);
            let ci = self.sas[i].conn;
            let expected = self.sas[i].next_in_id;
            self.log(
                Level::Info,
                Some(ci),
                format!(
                    "message IDs resynchronised: the peer's request {} \
                     (the snapshot this IKE SA was continued from expected {expected})",
                    h.message_id
                ),
            );
        }
        self.peer_heard(i);
        let update = self.sas[i].mobike
            && h.exchange_type == ExchangeType::Informational
            && find_notify(&p, NotifyType::UpdateSaAddresses).is_some();
        // §2.11: answer from where the request arrived to where it came
        // from (the peer floats to the NAT-T port after IKE_SA_INIT, and a
        // NAT may change its port, §2.23). With MOBIKE the SA moves only
        // when the peer says so (RFC 4555 §3.5): an other message from
        // elsewhere may be the peer testing a path.
        let sa = &mut self.sas[i];
        let moved = local.port() != sa.local.port() || remote != sa.remote;
        if update {
            if let Err(e) = self.mobike_update(i, local, remote, &p) {
                // §3.9: refused, the SA stays where it was; the answer
                // still goes where the request came from (§2.11).
                self.reply(i, h.exchange_type, h.message_id, vec![notify(e, vec![])]);
                return;
            }
        } else if moved && !sa.mobike && (sa.nat || local.port() == self.ports.nat_t) {
            sa.local.set_port(local.port());
            let was = std::mem::replace(&mut sa.remote, remote);
            // Past IKE_SA_INIT's float to port 4500: a NAT's new mapping.
            if sa.nat && sa.state == State::Established && was != remote {
                let ci = sa.conn;
                self.events.push_back(Event::PeerMoved {
                    conn: self.conns[ci].name.clone(),
                    remote,
                });
                self.log(
                    Level::Info,
                    Some(ci),
                    format!("the peer moved from {was} to {remote} (NAT): IKE and ESP go there"),
                );
            }
        }
        if let Some(t) = p.iter().find_map(|x| match x {
            Payload::Unknown {
                payload_type,
                critical: true,
                ..
            } => Some(*payload_type),
            _ => None,
        }) {
            self.reply(
                i,
                h.exchange_type,
                h.message_id,
                vec![notify(
                    NotifyType::UnsupportedCriticalPayload,
                    vec![u8::from(t)],
                )],
            );
            return;
        }
        match (h.exchange_type, self.sas[i].state) {
            (ExchangeType::IkeAuth, State::InitDone) => {
                self.responder_auth(i, now, h.message_id, p)
            }
            (ExchangeType::CreateChildSa, State::Established | State::Deleting) => {
                self.responder_create_child(i, now, h.message_id, p)
            }
            (
                ExchangeType::Informational,
                State::Established | State::Deleting | State::AuthSent,
            ) => self.responder_informational(i, now, h.message_id, p),
            _ => {
                self.count(IkeEvent::DroppedUnexpectedRequest);
                self.reply(
                    i,
                    h.exchange_type,
                    h.message_id,
                    vec![notify(NotifyType::InvalidSyntax, vec![])],
                );
            }
        }
    }

    // -----------------------------------------------------------------
    // CREATE_CHILD_SA
    // -----------------------------------------------------------------

    fn responder_create_child(&mut self, i: usize, now: Duration, id: u32, p: Vec<Payload>) {
        let ci = self.sas[i].conn;
        let Some(ni) = get_nonce(&p).map(|n| n.to_vec()) else {
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::InvalidSyntax, vec![])],
            );
            return;
        };
        // IKE SA rekey: an SA payload with an IKE proposal.
        if get_sa(&p).is_some_and(|s| s.iter().any(|x| x.protocol == protocol::IKE)) {
            self.responder_ike_rekey(i, now, id, &p, ni);
            return;
        }
        let rekey =
            find_notify(&p, NotifyType::RekeySa).and_then(|n| Some((n.protocol, spi4(&n.spi)?)));
        let rekey_of = rekey.map(|(_, spi)| spi);
        if let Some((old_proto, old_out)) = rekey {
            // The notify names the SPI the peer receives on (our outbound
            // SPI) and the child's protocol (ESP, or Q-ESP's 201).
            let Some(child) = self.sas[i]
                .children
                .iter()
                .find(|c| c.spi_out == old_out && protocol_id(c.protocol) == old_proto)
            else {
                self.reply(
                    i,
                    ExchangeType::CreateChildSa,
                    id,
                    vec![notify(NotifyType::ChildSaNotFound, vec![])],
                );
                return;
            };
            if child.state == ChildState::Deleting {
                self.reply(
                    i,
                    ExchangeType::CreateChildSa,
                    id,
                    vec![notify(NotifyType::TemporaryFailure, vec![])],
                );
                return;
            }
        }
        let Ok(nr) = self.new_nonce() else {
            self.rng_failed(Some(ci), "CREATE_CHILD_SA refused (TEMPORARY_FAILURE)");
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::TemporaryFailure, vec![])],
            );
            return;
        };
        let ke = get_ke(&p).map(|(g, d)| (g, d.to_vec()));
        let r = self.accept_child(
            i,
            now,
            &p,
            ChildExchange::CreateChildSa {
                ke: ke.as_ref().map(|(g, d)| (*g, &d[..])),
                rekey_of,
            },
            &ni,
            &nr,
        );
        match r {
            Ok(out) => {
                if let Some(old_out) = rekey_of {
                    if let Some(old) = self.sas[i]
                        .children
                        .iter_mut()
                        .find(|c| c.spi_out == old_out)
                    {
                        if old.state != ChildState::Rekeying {
                            old.state = ChildState::Rekeyed;
                        }
                        old.replaced = true;
                        old.rekey_at = None;
                    }
                }
                self.reply(i, ExchangeType::CreateChildSa, id, out);
            }
            Err(n) => {
                let data = if n == NotifyType::InvalidKePayload {
                    self.conns[ci]
                        .child
                        .proposals
                        .iter()
                        .find_map(|p| p.dh.first())
                        .map(|g| g.id().to_be_bytes().to_vec())
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
                self.reply(i, ExchangeType::CreateChildSa, id, vec![notify(n, data)]);
            }
        }
    }

    /// Sends a CREATE_CHILD_SA request: the rekey of our child whose
    /// inbound SPI is `rekey_of` (its selectors and slot kept, `set`
    /// ignored), or (`None`) a new child SA for the connection's selector
    /// set `set` (RFC 7296 §1.3.1), with PFS when the connection's ESP
    /// proposals have groups.
    /// `per_cpu`: one more per-CPU child (RFC 9611) of that set, into the
    /// lowest slot free in it; not sent when every slot is taken.
    fn start_child(
        &mut self,
        i: usize,
        now: Duration,
        rekey_of: Option<u32>,
        per_cpu: bool,
        set: u32,
    ) {
        let ci = self.sas[i].conn;
        let set = match rekey_of {
            Some(o) => self.sas[i]
                .children
                .iter()
                .find(|c| c.spi_in == o)
                .map_or(0, |c| self.set_of(ci, c)),
            None => set,
        };
        let Some((set_local, set_remote)) = self.conns[ci].child.set(set) else {
            return;
        };
        let (set_local, set_remote) = (set_local.to_vec(), set_remote.to_vec());
        let slot = match rekey_of {
            Some(o) => self.sas[i]
                .children
                .iter()
                .find(|c| c.spi_in == o)
                .map_or(0, |c| c.slot),
            None => match self.free_slot(ci, |c| self.set_of(ci, c) == set) {
                Some(k) => k,
                None if per_cpu => return,
                None => 0,
            },
        };
        if let Some(old_in) = rekey_of {
            let Some(old) = self.sas[i].children.iter_mut().find(|c| c.spi_in == old_in) else {
                return;
            };
            if old.state != ChildState::Installed {
                return;
            }
            old.state = ChildState::Rekeying;
        }
        let pfs: Vec<Group> = self.conns[ci]
            .child
            .proposals
            .iter()
            .flat_map(|p| p.dh.iter().copied())
            .collect();
        // The group the peer asked for with INVALID_KE_PAYLOAD, if we offer it.
        let group = self.sas[i]
            .pfs_group
            .filter(|g| pfs.contains(g))
            .or(pfs.first().copied());
        let ke = match group {
            Some(g) => self.new_ke(Some(i), g).map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        };
        let drawn = ke.and_then(|ke| {
            let spi_in = self.new_child_spi(ci, slot).map_err(|e| e.to_string())?;
            match self.new_nonce() {
                Ok(ni) => Ok((ke, spi_in, ni)),
                Err(e) => {
                    self.child_spis.remove(&spi_in);
                    Err(e.to_string())
                }
            }
        });
        let (ke, spi_in, ni) = match drawn {
            Ok(x) => x,
            Err(e) => {
                // Not sent: the child stays as it is and is rekeyed later
                // (a new child is left to the operator, or the peer).
                self.count(IkeEvent::RngFailures);
                let what = match rekey_of {
                    Some(old_in) => format!("child SA {old_in:08x}_i not rekeyed"),
                    None => "no new child SA".to_string(),
                };
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!("{what} ({e}): retrying in 10 s"),
                );
                if let Some(old) =
                    rekey_of.and_then(|o| self.sas[i].children.iter_mut().find(|c| c.spi_in == o))
                {
                    old.state = ChildState::Installed;
                    old.rekey_at = Some(now + RETRY_DELAY);
                }
                return;
            }
        };
        let old_protocol = rekey_of
            .and_then(|o| self.sas[i].children.iter().find(|c| c.spi_in == o))
            .map_or(Protocol::Esp, |c| c.protocol);
        let c = &self.conns[ci];
        let mut payloads = Vec::new();
        if let Some(old_in) = rekey_of {
            // The child's own protocol: 201 for a Q-ESP child.
            payloads.push(Payload::Notify(Notify {
                protocol: protocol_id(old_protocol),
                spi: old_in.to_be_bytes().to_vec(),
                notify_type: NotifyType::RekeySa,
                data: Vec::new(),
            }));
        }
        if c.child.mode == Mode::Transport {
            payloads.push(notify(NotifyType::UseTransportMode, vec![]));
        }
        // RFC 9611: a per-CPU child, or the first child of a selector set
        // when we keep per-resource children: a peer that keeps them too
        // answers with the notify (which tells us, if the IKE_AUTH answer
        // could not: its child was refused), one that does not ignores it
        // (an unknown status notify, RFC 7296 §3.10.1).
        if per_cpu || (rekey_of.is_none() && c.child.per_cpu_sas > 1) {
            payloads.push(notify(NotifyType::SaResourceInfo, vec![]));
        }
        let props = self.child_proposals(i, spi_in, ke.is_some());
        payloads.push(Payload::Sa(props));
        payloads.push(Payload::Nonce(ni.clone()));
        if let Some(k) = &ke {
            payloads.push(Payload::Ke {
                group: k.group().id(),
                data: k.public_value().to_vec(),
            });
        }
        // A rekey keeps the selectors agreed; a new child asks for ours.
        let old = rekey_of.and_then(|o| self.sas[i].children.iter().find(|c| c.spi_in == o));
        let (lts, rts) = match old {
            Some(o) => (o.local_ts.clone(), o.remote_ts.clone()),
            None => (set_local, set_remote),
        };
        payloads.push(Payload::TsI(lts));
        payloads.push(Payload::TsR(rts));
        self.send_request(
            i,
            now,
            ExchangeType::CreateChildSa,
            payloads,
            Req::Child {
                spi_in,
                rekey_of,
                ni,
                ke,
                slot,
                set,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn child_response(
        &mut self,
        i: usize,
        now: Duration,
        (spi_in, slot, set): (u32, u32, u32),
        rekey_of: Option<u32>,
        ni: Vec<u8>,
        ke: Option<KeyExchange>,
        p: Vec<Payload>,
    ) {
        let ci = self.sas[i].conn;
        if let Some(n) = find_notify(&p, NotifyType::InvalidKePayload) {
            self.child_spis.remove(&spi_in);
            let want = (n.data.len() == 2)
                .then(|| u16::from_be_bytes([n.data[0], n.data[1]]))
                .and_then(Group::from_id);
            let offered = want.filter(|g| {
                self.conns[ci]
                    .child
                    .proposals
                    .iter()
                    .any(|p| p.dh.contains(g))
            });
            self.count(IkeEvent::InvalidKeReceived);
            self.log(
                Level::Info,
                Some(ci),
                match offered {
                    Some(g) => format!(
                        "peer wants PFS group {} for the child SA: retrying",
                        g.name()
                    ),
                    None => format!(
                        "peer wants PFS group {want:?}, which we do not offer; retrying later"
                    ),
                },
            );
            if offered.is_some() {
                self.sas[i].pfs_group = offered;
                if rekey_of.is_none() {
                    self.sas[i].tasks.push_back(Task::CreateChild(set));
                }
            }
            if let Some(old) =
                rekey_of.and_then(|o| self.sas[i].children.iter_mut().find(|c| c.spi_in == o))
            {
                old.state = ChildState::Installed;
                old.rekey_at = Some(now + Duration::from_secs(1));
            }
            return;
        }
        let Some(nr) = get_nonce(&p).map(|n| n.to_vec()) else {
            let what = match rekey_of {
                Some(_) => "child rekey".to_string(),
                None => format!("new child SA{}", self.set_label(ci, set)),
            };
            self.count(IkeEvent::ChildFailed);
            let refused = error_notify(&p);
            // RFC 9611: the peer keeps no more per-CPU children; the ones
            // we have serve every worker.
            let full = refused == Some(NotifyType::TsMaxQueue);
            self.log(
                if full { Level::Info } else { Level::Warn },
                Some(ci),
                match refused {
                    Some(e) => format!("{what} refused: {}", notify_name(e)),
                    None => format!("{what}: the answer has no nonce"),
                },
            );
            self.child_spis.remove(&spi_in);
            // Q-ESP refused as a whole: at once again with ESP alone.
            let retry = refused.is_some_and(|e| self.qesp_refused(i, e));
            self.child_failed(i, now, rekey_of, set, retry);
            return;
        };
        if !self.finish_child(i, now, spi_in, &p, ke, &ni, &nr, rekey_of, (slot, set)) {
            // finish_child queued the retry if there is one.
            let retry = rekey_of.is_some_and(|o| self.sas[i].tasks.contains(&Task::RekeyChild(o)));
            self.child_failed(i, now, rekey_of, set, retry);
            return;
        }
        let Some(old_in) = rekey_of else {
            let ci = self.sas[i].conn;
            if self.conns[ci].child.per_cpu_sas > 1
                && find_notify(&p, NotifyType::SaResourceInfo).is_some()
            {
                // RFC 9611, learnt from a set's first child if the IKE_AUTH
                // answer did not say (its child was refused).
                self.sas[i].per_cpu_peer = true;
            }
            // The only child of its set (not a per-CPU one opened again
            // beside others): the set's per-CPU children follow.
            let live = self.sas[i]
                .children
                .iter()
                .filter(|c| c.live())
                .filter(|c| self.set_of(ci, c) == set)
                .count();
            if live == 1 {
                self.queue_per_cpu(i, set);
            }
            return;
        };
        // Collision (§2.8.1): the peer rekeyed the same child meanwhile. The
        // exchange with the lowest nonce made the redundant SA; its
        // initiator deletes it.
        let sa = &self.sas[i];
        let ours_new = sa.children.iter().find(|c| c.spi_in == spi_in);
        let peers_new = sa.children.iter().find(|c| {
            c.succeeds(old_in)
                && c.spi_in != spi_in
                && c.state == ChildState::Installed
                && c.nonces.0 != ni
                && c.pending_out.is_some()
        });
        if let (Some(a), Some(b)) = (ours_new, peers_new) {
            let min_ours = a.nonces.0.clone().min(a.nonces.1.clone());
            let min_peer = b.nonces.0.clone().min(b.nonces.1.clone());
            let b_in = b.spi_in;
            self.count(IkeEvent::RekeyCollisions);
            if min_ours < min_peer {
                self.log(
                    Level::Info,
                    Some(ci),
                    "simultaneous child rekey: ours lost, deleting our new SA".into(),
                );
                self.sas[i].tasks.push_back(Task::DeleteChild(spi_in));
                // The peer deletes the old SA.
                if let Some(old) = self.sas[i].children.iter_mut().find(|c| c.spi_in == old_in) {
                    old.state = ChildState::Rekeyed;
                    old.replaced = true;
                }
                // Our outbound goes on the peer's new SA.
                self.activate_outbound(i, b_in);
                return;
            }
            self.log(
                Level::Info,
                Some(ci),
                "simultaneous child rekey: ours won".into(),
            );
        }
        // The new child's outbound SA replaced the old one's in the data
        // plane (finish_child) if their selectors are the same; if the peer
        // narrowed them differently, the old one stays active until its
        // delete removes it.
        if let Some(old) = self.sas[i].children.iter_mut().find(|c| c.spi_in == old_in) {
            old.state = ChildState::Rekeyed;
            old.replaced = true;
        }
        self.sas[i].tasks.push_front(Task::DeleteChild(old_in));
    }

    /// Our CREATE_CHILD_SA (the rekey of `rekey_of`, or a new child)
    /// failed: a rekeyed child is back to installed and tried again in
    /// 10 s, or at once with `retry` (a new child of selector set `set`:
    /// queued again).
    fn child_failed(
        &mut self,
        i: usize,
        now: Duration,
        rekey_of: Option<u32>,
        set: u32,
        retry: bool,
    ) {
        match rekey_of {
            Some(o) => {
                if let Some(old) = self.sas[i].children.iter_mut().find(|c| c.spi_in == o) {
                    if old.state == ChildState::Rekeying {
                        old.state = ChildState::Installed;
                        old.rekey_at = (!retry).then(|| now + RETRY_DELAY);
                    }
                }
                if retry && !self.sas[i].tasks.contains(&Task::RekeyChild(o)) {
                    self.sas[i].tasks.push_back(Task::RekeyChild(o));
                }
            }
            None => {
                if retry && !self.sas[i].tasks.contains(&Task::CreateChild(set)) {
                    self.sas[i].tasks.push_back(Task::CreateChild(set));
                }
            }
        }
    }

    fn activate_outbound(&mut self, i: usize, spi_in: u32) {
        let Some(c) = self.sas[i].children.iter_mut().find(|c| c.spi_in == spi_in) else {
            return;
        };
        if let Some((out, _)) = c.pending_out.take() {
            let (slot, local_ts, remote_ts) = (c.slot, c.local_ts.clone(), c.remote_ts.clone());
            self.events.push_back(Event::InstallSa(out));
            let ci = self.sas[i].conn;
            self.outbound_replaced(ci, slot, (&local_ts, &remote_ts));
            if let Some(c) = self.sas[i].children.iter_mut().find(|c| c.spi_in == spi_in) {
                c.out_active = true;
            }
        }
    }

    /// A new outbound SA of connection `ci` in per-CPU slot `slot`, with
    /// selectors `ts`, replaced the one the data plane used there: no
    /// child of that slot and those selectors (of any of the connection's
    /// IKE SAs, e.g. one still being deleted) owns the slot's outbound SA
    /// any more. Children with other selectors keep theirs (the data plane
    /// replaces an outbound SA only by one with the same selectors).
    fn outbound_replaced(
        &mut self,
        ci: usize,
        slot: u32,
        (local_ts, remote_ts): (&[TrafficSelector], &[TrafficSelector]),
    ) {
        for &i in &self.by_conn[ci] {
            for c in &mut self.sas[i].children {
                if c.slot == slot && c.same_ts(local_ts, remote_ts) {
                    c.out_active = false;
                }
            }
            self.dirty.push(i);
        }
    }

    /// An authenticated message from the peer reached SA `i`: a continued
    /// SA is known to be alive.
    fn peer_heard(&mut self, i: usize) {
        if std::mem::take(&mut self.sas[i].continued) {
            let ci = self.sas[i].conn;
            self.log(
                Level::Info,
                Some(ci),
                "the peer answers on the IKE SA continued from the cluster's previous leader"
                    .into(),
            );
        }
    }

    // -----------------------------------------------------------------
    // IKE SA rekey (§2.18)
    // -----------------------------------------------------------------

    fn start_ike_rekey(&mut self, i: usize, now: Duration) {
        let ci = self.sas[i].conn;
        let Some(group) = self.sas[i].chosen.and_then(|c| c.dh) else {
            return;
        };
        let drawn = self.new_ke(Some(i), group).map_err(|e| e.to_string());
        let drawn = drawn.and_then(|ke| {
            let new_spi = self.new_ike_spi().map_err(|e| e.to_string())?;
            match self.new_nonce() {
                Ok(ni) => Ok((ke, new_spi, ni)),
                Err(e) => {
                    self.ike_spis.remove(&new_spi);
                    Err(e.to_string())
                }
            }
        });
        let (ke, new_spi, ni) = match drawn {
            Ok(x) => x,
            Err(e) => {
                self.count(IkeEvent::RngFailures);
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!("IKE SA not rekeyed ({e}): retrying in 10 s"),
                );
                self.sas[i].rekey_at = Some(now + RETRY_DELAY);
                return;
            }
        };
        let props: Vec<wire::Proposal> = self.conns[ci]
            .proposals
            .iter()
            .enumerate()
            .map(|(n, p)| {
                p.to_wire(
                    u8::try_from(n + 1).unwrap_or(255),
                    &new_spi.to_be_bytes(),
                    None,
                )
            })
            .collect();
        let payloads = vec![
            Payload::Sa(props),
            Payload::Nonce(ni.clone()),
            Payload::Ke {
                group: group.id(),
                data: ke.public_value().to_vec(),
            },
        ];
        self.send_request(
            i,
            now,
            ExchangeType::CreateChildSa,
            payloads,
            Req::IkeRekey { new_spi, ni, ke },
        );
    }

    fn responder_ike_rekey(
        &mut self,
        i: usize,
        now: Duration,
        id: u32,
        p: &[Payload],
        ni: Vec<u8>,
    ) {
        let ci = self.sas[i].conn;
        let closing = matches!(
            self.sas[i].pending.as_ref().map(|x| &x.what),
            Some(Req::DeleteIke)
        ) || self.sas[i].tasks.contains(&Task::DeleteIke);
        if closing || self.sas[i].crossed_by.is_some() {
            // RFC 7296 §2.8.2: an IKE SA we are closing (having rekeyed it
            // ourselves), or whose crossed rekeys wait for our answer, is
            // not rekeyed again. A peer whose rekey crossed our finished
            // one learns of it from the Delete of the old SA.
            self.log(
                Level::Info,
                Some(ci),
                "the peer's rekey of an IKE SA already replaced or being deleted refused (TEMPORARY_FAILURE)"
                    .into(),
            );
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::TemporaryFailure, vec![])],
            );
            return;
        }
        let (Some(offered), Some((kg, kd))) = (get_sa(p), get_ke(p)) else {
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::InvalidSyntax, vec![])],
            );
            return;
        };
        let Some((num, peer_spi, chosen)) =
            select(&self.conns[ci].proposals, offered, ProposalKind::Ike, true)
        else {
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::NoProposalChosen, vec![])],
            );
            return;
        };
        let Some(peer_spi) = <[u8; 8]>::try_from(&peer_spi[..])
            .ok()
            .map(u64::from_be_bytes)
        else {
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::InvalidSyntax, vec![])],
            );
            return;
        };
        let Some(g) = chosen.dh else { return };
        if kg != g.id() {
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(
                    NotifyType::InvalidKePayload,
                    g.id().to_be_bytes().to_vec(),
                )],
            );
            return;
        }
        let ke = self.new_ke(Some(i), g);
        let our_spi = self.new_ike_spi();
        let nr = self.new_nonce();
        let rng_failed = matches!(ke, Err(DhError::Random(..))) || our_spi.is_err() || nr.is_err();
        let (Ok(ke), Ok(our_spi), Ok(nr)) = (ke, our_spi, nr) else {
            if rng_failed {
                self.rng_failed(Some(ci), "IKE SA rekey refused (TEMPORARY_FAILURE)");
            }
            if let Ok(s) = our_spi {
                self.ike_spis.remove(&s);
            }
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::TemporaryFailure, vec![])],
            );
            return;
        };
        let Ok(g_ir) = self.timed(Some(i), IkeOp::Dh, |_| ke.agree(kd)) else {
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::InvalidSyntax, vec![])],
            );
            return;
        };
        let out = vec![
            Payload::Sa(vec![chosen.to_wire(
                ProposalKind::Ike,
                num,
                &our_spi.to_be_bytes(),
            )]),
            Payload::Nonce(nr.clone()),
            Payload::Ke {
                group: g.id(),
                data: ke.public_value().to_vec(),
            },
        ];
        // The peer initiated the rekey: it is the new SA's initiator. Keyed
        // before we answer: if that fails we refuse, and keep everything.
        let Some(j) = self.rekeyed_ike(i, now, false, peer_spi, our_spi, chosen, ni, nr, &g_ir)
        else {
            self.ike_spis.remove(&our_spi);
            self.log(
                Level::Warn,
                Some(ci),
                "IKE SA rekey refused: the new SA could not be keyed".into(),
            );
            self.reply(
                i,
                ExchangeType::CreateChildSa,
                id,
                vec![notify(NotifyType::TemporaryFailure, vec![])],
            );
            return;
        };
        self.reply(i, ExchangeType::CreateChildSa, id, out);
        if matches!(
            self.sas[i].pending.as_ref().map(|x| &x.what),
            Some(Req::IkeRekey { .. })
        ) {
            // §2.8.2: both sides rekey this SA at once. The children stay
            // where they are until the answer to ours says which new SA
            // the lowest nonce made redundant (see ike_rekey_response).
            self.sas[i].crossed_by = Some(our_spi);
            self.dirty.push(i);
            self.log(
                Level::Info,
                Some(ci),
                "simultaneous IKE SA rekey: the peer's crossed ours; the lowest nonce decides which new SA stays"
                    .into(),
            );
            return;
        }
        self.replace_ike(i, j, now);
    }

    fn ike_rekey_response(
        &mut self,
        i: usize,
        now: Duration,
        new_spi: u64,
        ni: Vec<u8>,
        ke: KeyExchange,
        p: Vec<Payload>,
    ) {
        let ci = self.sas[i].conn;
        let made = self.ike_rekey_answer(i, now, new_spi, ni, ke, &p);
        let crossed = self.take_crossed(i);
        // The SA that takes the children, and whether we initiated it.
        let (keep, ours) = match (made, crossed) {
            (Ok(k), None) => (k, true),
            (Err(why), None) => {
                // The old SA keeps its children and is rekeyed again later.
                self.log(Level::Warn, Some(ci), format!("{why}; retrying in 10 s"));
                self.sas[i].rekey_at = Some(now + RETRY_DELAY);
                return;
            }
            (Err(why), Some(j)) => {
                self.log(
                    Level::Info,
                    Some(ci),
                    format!("{why}; the peer's rekey, which crossed ours, stands"),
                );
                (j, false)
            }
            (Ok(k), Some(j)) => {
                // Both rekeys succeeded. The new SA whose exchange has the
                // lowest of the four nonces is redundant: the side that
                // initiated that exchange deletes it, and the other new SA
                // takes the children. The peer compares the same nonces
                // and agrees.
                self.count(IkeEvent::IkeRekeyCollisions);
                let lowest = |sa: &IkeSa| sa.ni.clone().min(sa.nr.clone());
                let ours_lost = lowest(&self.sas[k]) < lowest(&self.sas[j]);
                self.log(
                    Level::Info,
                    Some(ci),
                    if ours_lost {
                        "simultaneous IKE SA rekey: ours lost, deleting our new SA"
                    } else {
                        "simultaneous IKE SA rekey: ours won"
                    }
                    .into(),
                );
                let (keep, redundant) = if ours_lost { (j, k) } else { (k, j) };
                // Redundant, not failed: its deletion takes nothing down,
                // and it is removed after the grace period if that
                // deletion never completes.
                let r = &mut self.sas[redundant];
                r.remove_at = Some(now + OLD_IKE_SA_GRACE);
                r.tasks.clear();
                if ours_lost {
                    r.tasks.push_back(Task::DeleteIke);
                    self.kick(redundant, now);
                } else {
                    // The peer made it: the peer deletes it.
                    r.state = State::Deleting;
                    self.dirty.push(redundant);
                }
                (keep, !ours_lost)
            }
        };
        self.ike_rekeyed(i, keep, ours, now);
    }

    /// Our rekey of IKE SA `i` ended with SA `keep` taking the children;
    /// `ours`: we initiated `keep`, so we delete `i` (else the peer does).
    fn ike_rekeyed(&mut self, i: usize, keep: usize, ours: bool, now: Duration) {
        self.replace_ike(i, keep, now);
        self.sas[i].tasks.clear();
        if ours {
            self.sas[i].tasks.push_back(Task::DeleteIke);
        }
    }

    /// §2.8.2: the SA made by the peer's rekey of SA `i` that crossed ours
    /// (and clears the mark), if it is still there: the peer may have
    /// deleted it already, having found it redundant.
    fn take_crossed(&mut self, i: usize) -> Option<usize> {
        let j = self.crossing(i);
        self.sas[i].crossed_by.take()?;
        self.dirty.push(i);
        j
    }

    /// §2.8.2: the established SA made by the peer's rekey of SA `i` that
    /// crossed ours, if it is still there.
    fn crossing(&self, i: usize) -> Option<usize> {
        let ci = self.sas[i].conn;
        let j = *self.by_spi.get(&self.sas[i].crossed_by?)?;
        let s = self.sas.get(j)?;
        (j != i && s.conn == ci && s.state == State::Established).then_some(j)
    }

    /// The SA whose rekey the peer's rekey that made SA `j` crossed (the
    /// inverse of [`Ike::crossing`]), whatever its state.
    fn crossed(&self, j: usize) -> Option<usize> {
        let spi = self.sas[j].local_spi();
        self.by_conn[self.sas[j].conn]
            .iter()
            .copied()
            .find(|&o| o != j && self.sas[o].crossed_by == Some(spi))
    }

    /// The answer `p` to our rekey of IKE SA `i`: the new SA, keyed, or
    /// why there is none (then its reserved SPI is released).
    fn ike_rekey_answer(
        &mut self,
        i: usize,
        now: Duration,
        new_spi: u64,
        ni: Vec<u8>,
        ke: KeyExchange,
        p: &[Payload],
    ) -> Result<usize, String> {
        let ci = self.sas[i].conn;
        let answer = match get_sa(p) {
            Some([one]) => Some(one.clone()),
            _ => None,
        };
        let chosen = answer.as_ref().and_then(|a| {
            Chosen::from_answer(a, &self.conns[ci].proposals, ProposalKind::Ike, true)
        });
        let peer_spi = answer
            .as_ref()
            .and_then(|a| <[u8; 8]>::try_from(&a.spi[..]).ok())
            .map(u64::from_be_bytes);
        let made = match (chosen, peer_spi, get_nonce(p), get_ke(p)) {
            (Some(chosen), Some(peer_spi), Some(nr), Some((kg, kd))) => {
                if chosen.dh.map(|g| g.id()) != Some(kg) || ke.group().id() != kg {
                    Err("IKE SA rekey: the answer's KE group is not the one chosen".to_string())
                } else if let Ok(g_ir) = self.timed(Some(i), IkeOp::Dh, |_| ke.agree(kd)) {
                    let nr = nr.to_vec();
                    self.rekeyed_ike(i, now, true, new_spi, peer_spi, chosen, ni, nr, &g_ir)
                        .ok_or_else(|| "IKE SA rekey: the new SA could not be keyed".to_string())
                } else {
                    Err("IKE SA rekey: the answer's KE payload is invalid".to_string())
                }
            }
            _ => Err(format!(
                "IKE SA rekey refused or invalid{}",
                error_notify(p)
                    .map(|n| format!(" ({})", notify_name(n)))
                    .unwrap_or_default()
            )),
        };
        if made.is_err() {
            self.ike_spis.remove(&new_spi);
        }
        made
    }

    /// Creates and keys the IKE SA that is to replace SA `i`, without
    /// children yet (see [`Ike::replace_ike`]), and returns its index;
    /// `None` (and nothing changed) if it cannot be keyed.
    #[allow(clippy::too_many_arguments)]
    fn rekeyed_ike(
        &mut self,
        i: usize,
        now: Duration,
        we_initiated: bool,
        spi_i: u64,
        spi_r: u64,
        chosen: Chosen,
        ni: Vec<u8>,
        nr: Vec<u8>,
        g_ir: &[u8],
    ) -> Option<usize> {
        let old_prf = self.sas[i].chosen.and_then(|c| c.prf)?;
        let old_sk_d = self.sas[i].sk_d.clone();
        let ci = self.sas[i].conn;
        let old = &self.sas[i];
        let mut sa = IkeSa::new(
            ci,
            we_initiated,
            (spi_i, spi_r),
            State::Established,
            (old.local, old.remote),
            now,
        );
        sa.nat = old.nat;
        sa.chosen = Some(chosen);
        sa.ni = ni;
        sa.nr = nr;
        sa.group = chosen.dh.unwrap_or(old.group);
        sa.established_at = Some(now);
        sa.peer_id = old.peer_id.clone();
        sa.fragmentation = old.fragmentation;
        sa.mobike = old.mobike;
        sa.qesp_declined = old.qesp_declined;
        sa.per_cpu_peer = old.per_cpu_peer;
        sa.per_cpu_reopened = old.per_cpu_reopened.clone();
        let j = self.insert_sa(sa);
        if !self.install_ike_keys(j, g_ir, Some((old_prf, &old_sk_d))) {
            self.remove_sa(j);
            return None;
        }
        Some(j)
    }

    /// The keyed IKE SA `j` replaces SA `i`: the children and their
    /// pending tasks move to it, `i` waits for its deletion.
    fn replace_ike(&mut self, i: usize, j: usize, now: Duration) {
        let ci = self.sas[i].conn;
        let rekey_at = self.after(now, self.conns[ci].rekey_time, self.conns[ci].jitter);
        let old = &mut self.sas[i];
        let children = std::mem::take(&mut old.children);
        old.rekey_at = None;
        old.remove_at = Some(now + OLD_IKE_SA_GRACE);
        old.state = State::Deleting;
        // Child tasks move with the children.
        let moved: Vec<Task> = old
            .tasks
            .iter()
            .copied()
            .filter(|t| t.moves_with_children())
            .collect();
        old.tasks.retain(|t| !t.moves_with_children());
        let new = &mut self.sas[j];
        new.children = children;
        new.tasks.extend(moved);
        new.rekey_at = rekey_at;
        let (spi_i, spi_r) = (new.spi_i, new.spi_r);
        let algs = new.chosen.map(|c| c.name()).unwrap_or_default();
        self.count(IkeEvent::IkeRekeys);
        self.events.push_back(Event::IkeUp {
            conn: self.conns[ci].name.clone(),
            algorithms: algs.clone(),
        });
        self.log(
            Level::Info,
            Some(ci),
            format!("IKE SA rekeyed: {spi_i:016x}_i {spi_r:016x}_r ({algs})"),
        );
        self.kick(j, now);
    }

    // -----------------------------------------------------------------
    // INFORMATIONAL
    // -----------------------------------------------------------------

    /// RFC 4555 §3.5: the peer's UPDATE_SA_ADDRESSES (request `p`, which
    /// came from `remote` to `local`) moves the IKE SA and its child SAs
    /// there. NAT detection is done again on the new addresses; if its
    /// outcome changed, the child SAs are rekeyed so that their ESP is
    /// encapsulated (or not) as the new path needs. Err: the notify to
    /// refuse with (NO_NATS_ALLOWED, and the addresses were changed on the
    /// way), the SA unchanged.
    fn mobike_update(
        &mut self,
        i: usize,
        local: SocketAddr,
        remote: SocketAddr,
        p: &[Payload],
    ) -> Result<(), NotifyType> {
        let ci = self.sas[i].conn;
        if let Some(n) = find_notify(p, NotifyType::NoNatsAllowed) {
            if n.data != no_nats_data(remote, local) {
                self.count(IkeEvent::MobikeRefused);
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!(
                        "MOBIKE: the peer asked to move to {remote} with NO_NATS_ALLOWED, but \
                         its addresses were changed on the way: refused \
                         (UNEXPECTED_NAT_DETECTED), the SAs stay with {}",
                        self.sas[i].remote
                    ),
                );
                return Err(NotifyType::UnexpectedNatDetected);
            }
        }
        let (spi_i, spi_r) = (self.sas[i].spi_i, self.sas[i].spi_r);
        let src_ok = find_notify(p, NotifyType::NatDetectionSourceIp)
            .map(|n| n.data == nat_hash(spi_i, spi_r, remote));
        let dst_ok = find_notify(p, NotifyType::NatDetectionDestinationIp)
            .map(|n| n.data == nat_hash(spi_i, spi_r, local));
        let sa = &mut self.sas[i];
        // Without NAT detection payloads, the NAT state stays as it was.
        let nat = match (src_ok, dst_ok) {
            (None, None) => sa.nat,
            _ => src_ok == Some(false) || dst_ok == Some(false) || self.conns[ci].force_encap,
        };
        let was = std::mem::replace(&mut sa.remote, remote);
        sa.local = local;
        let nat_changed = std::mem::replace(&mut sa.nat, nat) != nat;
        self.count(IkeEvent::MobikeUpdates);
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "the peer moved from {was} to {remote} (MOBIKE){}: IKE and ESP go there",
                if nat { ", behind a NAT" } else { "" }
            ),
        );
        if was != remote {
            self.events.push_back(Event::PeerMoved {
                conn: self.conns[ci].name.clone(),
                remote,
            });
        }
        if nat_changed {
            // The installed SAs keep the encapsulation they were made with:
            // new ones, made on the new path, take the new one.
            let live: Vec<u32> = self.sas[i]
                .children
                .iter_mut()
                .filter(|c| c.state == ChildState::Installed)
                .map(|c| {
                    c.rekey_at = None;
                    c.spi_in
                })
                .collect();
            self.log(
                Level::Info,
                Some(ci),
                format!(
                    "MOBIKE: the new path {} a NAT: rekeying {} child SA(s) so that their ESP is \
                     {}",
                    if nat { "crosses" } else { "no longer crosses" },
                    live.len(),
                    if nat { "in UDP" } else { "no longer in UDP" }
                ),
            );
            // Started after the answer (the INFORMATIONAL handler kicks).
            for s in live {
                if !self.sas[i].tasks.contains(&Task::RekeyChild(s)) {
                    self.sas[i].tasks.push_back(Task::RekeyChild(s));
                }
            }
        }
        Ok(())
    }

    fn responder_informational(&mut self, i: usize, now: Duration, id: u32, p: Vec<Payload>) {
        let ci = self.sas[i].conn;
        let mut out = Vec::new();
        let mut delete_ike = false;
        // (Selector set, slot) of per-CPU children the peer deleted outside
        // a rekey.
        let mut closed: Vec<(u32, u32)> = Vec::new();
        for x in &p {
            match x {
                Payload::Delete(Delete::Ike) => delete_ike = true,
                Payload::Delete(Delete::Child {
                    protocol: proto,
                    spis,
                }) if matches!(*proto, protocol::ESP | protocol::QESP) => {
                    let mut ours = Vec::new();
                    for s in spis {
                        // The peer names the SPI it receives on (our
                        // outbound) and the child's protocol.
                        let Some(c) = self.sas[i]
                            .children
                            .iter()
                            .find(|c| c.spi_out == *s && protocol_id(c.protocol) == *proto)
                        else {
                            continue;
                        };
                        let (spi_in, slot, replaced) = (c.spi_in, c.slot, c.replaced);
                        let set = self.set_of(ci, c);
                        let we_deleting = c.state == ChildState::Deleting;
                        // A rekey responder switches to the new SA now.
                        let successor: Option<u32> = self.sas[i]
                            .children
                            .iter()
                            .find(|n| {
                                n.pending_out.is_some() && n.spi_in != spi_in && n.succeeds(spi_in)
                            })
                            .map(|n| n.spi_in);
                        if let Some(n) = successor {
                            self.activate_outbound(i, n);
                        }
                        if !we_deleting {
                            ours.push(spi_in);
                            if successor.is_none() && !replaced {
                                closed.push((set, slot));
                            }
                        }
                        self.remove_child(i, spi_in, Some(now));
                    }
                    if !ours.is_empty() {
                        out.push(Payload::Delete(Delete::Child {
                            protocol: *proto,
                            spis: ours,
                        }));
                    }
                }
                Payload::Notify(n) if n.notify_type == NotifyType::AuthenticationFailed => {
                    self.log(
                        Level::Warn,
                        Some(ci),
                        "peer says our authentication failed".into(),
                    );
                    delete_ike = true;
                }
                _ => {}
            }
        }
        if self.sas[i].mobike && !delete_ike {
            // RFC 4555 §3.5, §3.8: NAT detection is answered on the
            // addresses of this exchange (an address update's new ones; a
            // liveness check's, by which a peer behind a NAT finds that
            // its mapping changed and moves the SAs), and a COOKIE2 is
            // returned.
            if find_notify(&p, NotifyType::NatDetectionSourceIp).is_some() {
                let sa = &self.sas[i];
                let (spi_i, spi_r) = (sa.spi_i, sa.spi_r);
                let (local, remote) = match self.answer_to {
                    Some((j, l, r)) if j == i => (l, r),
                    _ => (sa.local, sa.remote),
                };
                let src = if self.conns[ci].force_encap {
                    // As in IKE_SA_INIT: a random hash, so the peer keeps
                    // seeing a NAT.
                    match rng::bytes(&mut *self.rng, 20) {
                        Ok(b) => b,
                        Err(_) => {
                            self.rng_failed(Some(ci), "address update not answered");
                            return;
                        }
                    }
                } else {
                    nat_hash(spi_i, spi_r, local)
                };
                out.push(notify(NotifyType::NatDetectionSourceIp, src));
                out.push(notify(
                    NotifyType::NatDetectionDestinationIp,
                    nat_hash(spi_i, spi_r, remote),
                ));
            }
            if let Some(n) = find_notify(&p, NotifyType::Cookie2) {
                out.push(notify(NotifyType::Cookie2, n.data.clone()));
            }
        }
        self.reply(
            i,
            ExchangeType::Informational,
            id,
            if delete_ike { Vec::new() } else { out },
        );
        if delete_ike {
            if let Some(j) = self.take_crossed(i) {
                // §2.8.2: the peer did not see our rekey cross its own,
                // which replaced this SA; ours is forgotten (its answer,
                // if one comes, finds no SA) and the peer's takes the
                // children.
                self.log(
                    Level::Info,
                    Some(ci),
                    "simultaneous IKE SA rekey: the peer deleted the old SA, its new SA stays"
                        .into(),
                );
                self.replace_ike(i, j, now);
            } else if self.sas[i].crossed_until.is_some_and(|t| now < t)
                && !self.sas[i].children.is_empty()
            {
                self.crossed_takeover_lost(i, now);
                return;
            }
            // A replaced SA, or the peer's redundant SA of a rekey
            // collision that we had not decided yet (the peer's Delete
            // overtook its answer), goes without taking anything down.
            let replaced = self.sas[i].children.is_empty()
                && (self.crossed(i).is_some()
                    || (self.sas[i].state == State::Deleting && self.sas[i].remove_at.is_some()));
            self.destroy(i, "deleted by peer".into(), !replaced);
        } else {
            self.reopen_per_cpu(i, now, &closed);
            self.kick(i, now);
        }
    }

    /// The peer deleted SA `i`, continued from a snapshot written during
    /// crossed IKE SA rekeys as the peer's new SA, soon after the takeover
    /// (`IkeSa::crossed_until`): the peer found the previous engine's new
    /// SA to be the one that stays (§2.8.2), and moved the children there.
    /// This engine never had that SA's keys (its exchange was still in
    /// flight), but the children are the same ESP SAs on both sides, so
    /// they are kept while a new IKE SA is negotiated
    /// ([`Ike::renegotiate_keeping_children`]). Before, the children went
    /// down with `i`, and the peer, still holding the other SA, found out
    /// only by its liveness checks.
    fn crossed_takeover_lost(&mut self, i: usize, now: Duration) {
        let ci = self.sas[i].conn;
        self.log(
            Level::Info,
            Some(ci),
            "the peer deleted the IKE SA continued from the cluster's previous leader: the \
             previous leader's own rekey, which crossed the peer's and cannot be finished \
             here, is the one the peer kept (RFC 7296 §2.8.2); negotiating a new IKE SA, \
             the child SAs stay until it replaces them"
                .into(),
        );
        self.renegotiate_keeping_children(i, now);
    }

    /// The peer rekeys our child `old_in` again, so it never completed an
    /// earlier rekey of it (a completed one ends with the peer's Delete of
    /// `old_in`; its answer was lost, or a cluster's new leader continued
    /// without it; a retransmitted request is answered from the cache and
    /// does not come here). The children those earlier rekeys made are
    /// dropped, so that none lingers until its rekey time. One still
    /// holding its outbound SA back never installs it; one whose switch
    /// deadline passed already carries our outbound traffic on an SA the
    /// peer does not have: then this returns true, and the caller sends on
    /// its new child at once.
    fn drop_abandoned_rekeys(&mut self, i: usize, old_in: u32) -> bool {
        let abandoned: Vec<(u32, bool)> = self.sas[i]
            .children
            .iter()
            .filter(|c| c.replaces == Some(old_in))
            .map(|c| (c.spi_in, c.out_active))
            .collect();
        let ci = self.sas[i].conn;
        let lost_out = abandoned.iter().any(|&(_, out)| out);
        for (spi, _) in abandoned {
            self.log(
                Level::Info,
                Some(ci),
                format!(
                    "the peer rekeys child SA {old_in:08x}_i again: its earlier rekey to \
                     {spi:08x}_i was never completed, dropping that one"
                ),
            );
            self.remove_child(i, spi, None);
        }
        lost_out
    }

    /// IKE SA `i` is of no more use, but its children may still be the
    /// peer's (a cluster's new leader continued a state the peer has moved
    /// on from): a new IKE SA is negotiated at once, and `i` holds the
    /// children in the data plane until [`OLD_IKE_SA_GRACE`], sending
    /// nothing more. The new IKE SA's INITIAL_CONTACT has the peer drop
    /// whatever it still holds, and its child SAs replace the held ones
    /// (make before break); if none comes, the held ones go at the end of
    /// the grace.
    fn renegotiate_keeping_children(&mut self, i: usize, now: Duration) {
        let ci = self.sas[i].conn;
        let sa = &mut self.sas[i];
        sa.state = State::Deleting;
        sa.crossed_until = None;
        sa.rekey_at = None;
        sa.remove_at = Some(now + OLD_IKE_SA_GRACE);
        sa.tasks.clear();
        // Nothing will answer a request of ours on it any more.
        if let Some(p) = sa.pending.take() {
            self.release_reserved(&p.what);
        }
        self.dirty.push(i);
        if self.start_init(now, ci, None, None).is_err() {
            self.restart_at.insert(ci, now + RESTART_DELAY);
        }
    }

    /// The peer deleted the per-CPU children of `slots` (RFC 9611) outside
    /// a rekey, on an IKE SA that keeps them: each is opened again with a
    /// CREATE_CHILD_SA of its own (into the lowest free slot of its
    /// selector set, which is one of these), unless one of the same set
    /// was opened again within [`PER_CPU_REOPEN_HOLDOFF`]. The peer may
    /// still refuse with TS_MAX_QUEUE, which leaves the slot closed as
    /// before.
    fn reopen_per_cpu(&mut self, i: usize, now: Duration, slots: &[(u32, u32)]) {
        let ci = self.sas[i].conn;
        let n = self.conns[ci].child.per_cpu_sas;
        if slots.is_empty()
            || n <= 1
            || !self.sas[i].per_cpu_peer
            || self.sas[i].state != State::Established
        {
            return;
        }
        let held = |sa: &IkeSa, set: u32| {
            sa.per_cpu_reopened
                .iter()
                .any(|&(k, t)| k == set && now < t + PER_CPU_REOPEN_HOLDOFF)
        };
        let list = |eng: &Self, which: &[&(u32, u32)]| {
            which
                .iter()
                .map(|&&(set, slot)| format!("{slot}{}", eng.set_label(ci, set)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (closed, reopen): (Vec<_>, Vec<_>) =
            slots.iter().partition(|&&(set, _)| held(&self.sas[i], set));
        if !closed.is_empty() {
            let msg = format!(
                "the peer deleted the per-CPU child SA of slot {} again within {} s: \
                 left closed until the IKE SA is established anew (the workers share the others)",
                list(self, &closed),
                PER_CPU_REOPEN_HOLDOFF.as_secs()
            );
            self.log(Level::Info, Some(ci), msg);
        }
        if reopen.is_empty() {
            return;
        }
        let msg = format!(
            "the peer deleted the per-CPU child SA of slot {}: opening it again",
            list(self, &reopen)
        );
        self.log(Level::Info, Some(ci), msg);
        let sa = &mut self.sas[i];
        for &&(set, _) in &reopen {
            sa.per_cpu_reopened.retain(|&(k, _)| k != set);
            sa.per_cpu_reopened.push((set, now));
            sa.tasks.push_back(Task::CreatePerCpu(set));
        }
    }

    /// Removes child `spi_in` of SA `i`. With `now` (a Delete exchange, the
    /// IKE SA stays), a child replaced by a rekey keeps its inbound SA for
    /// [`REKEYED_INBOUND_LINGER`] more; its SPI stays reserved until then.
    fn remove_child(&mut self, i: usize, spi_in: u32, now: Option<Duration>) {
        let ci = self.sas[i].conn;
        let Some(pos) = self.sas[i].children.iter().position(|c| c.spi_in == spi_in) else {
            return;
        };
        let c = self.sas[i].children.remove(pos);
        let name = self.conns[ci].name.clone();
        let inbound = Event::RemoveSa {
            conn: name.clone(),
            spi: c.spi_in,
            protocol: c.protocol,
            outbound: false,
        };
        match now {
            Some(now) if c.replaced => {
                self.lingering.push((now + REKEYED_INBOUND_LINGER, inbound));
            }
            _ => {
                self.events.push_back(inbound);
                self.child_spis.remove(&c.spi_in);
            }
        }
        if c.out_active {
            self.events.push_back(Event::RemoveSa {
                conn: name,
                spi: c.spi_out,
                protocol: c.protocol,
                outbound: true,
            });
        }
        self.log(
            Level::Info,
            Some(ci),
            format!("child SA {:08x}_i {:08x}_o deleted", c.spi_in, c.spi_out),
        );
    }

    /// Removes IKE SA `i` with its children; `down`: report the connection down.
    fn destroy(&mut self, i: usize, reason: String, down: bool) {
        let spis: Vec<u32> = self.sas[i].children.iter().map(|c| c.spi_in).collect();
        for s in spis {
            self.remove_child(i, s, None);
        }
        let sa = self.remove_sa(i);
        let ci = sa.conn;
        if down {
            self.events.push_back(Event::IkeDown {
                conn: self.conns[ci].name.clone(),
                reason: reason.clone(),
            });
        }
        self.log(
            Level::Info,
            Some(ci),
            format!(
                "IKE SA {:016x}_i {:016x}_r removed: {reason}",
                sa.spi_i, sa.spi_r
            ),
        );
    }

    /// An exchange we started failed before the SA was usable.
    fn fail(&mut self, i: usize, reason: String) {
        let ci = self.sas[i].conn;
        self.count(IkeEvent::IkeFailed);
        self.log(Level::Warn, Some(ci), reason.clone());
        self.destroy(i, reason, true);
    }

    // -----------------------------------------------------------------
    // Timers
    // -----------------------------------------------------------------

    /// When [`Ike::handle_timeout`] wants to be called next: the earliest
    /// deadline of any SA (kept ordered, so this is a lookup) or restart.
    pub fn poll_timeout(&self) -> Option<Duration> {
        #[cfg(test)]
        self.check_deadlines();
        let sa = self.deadlines.first().map(|(t, _)| *t);
        [
            sa,
            self.restart_at.values().min().copied(),
            self.lingering.iter().map(|(t, _)| *t).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Tests: every SA's filed deadline is what its state calls for (an
    /// SA changed without being rearmed would miss its timers).
    #[cfg(test)]
    fn check_deadlines(&self) {
        for (i, sa) in &self.sas {
            let want = sa.timer_table(self.conns[sa.conn].dpd_delay);
            assert_eq!(sa.timers, want, "SA {i}'s timers are stale");
            assert_eq!(sa.deadline, want.next(), "SA {i}'s deadline is stale");
            assert_eq!(
                sa.export_fp,
                snapshot::fingerprint(sa),
                "SA {i} changed what it exports without being rearmed"
            );
            if let Some(d) = sa.deadline {
                assert!(self.deadlines.contains(&(d, i)));
            }
        }
        assert_eq!(
            self.deadlines.len(),
            self.sas
                .iter()
                .filter(|(_, s)| s.deadline.is_some())
                .count()
        );
    }

    /// ESP (or AH) arrived on the child SAs with these inbound SPIs since
    /// the last call: the peer is alive (RFC 7296 §2.4 asks for a liveness
    /// check only when nothing protected came in), so each IKE SA owning
    /// one of them waits `dpd_delay` from `now` before its next check.
    pub fn traffic_received(&mut self, now: Duration, spis_in: &[u32]) {
        if spis_in.is_empty() {
            return;
        }
        let hit: Vec<usize> = self
            .sas
            .iter()
            .filter(|(_, sa)| sa.children.iter().any(|c| spis_in.contains(&c.spi_in)))
            .map(|(i, _)| i)
            .collect();
        for i in hit {
            let sa = &mut self.sas[i];
            sa.last_rx = sa.last_rx.max(now);
            self.rearm(i);
        }
    }

    /// Retransmissions, rekeys, expiries and liveness checks due at `now`;
    /// only the SAs with a due timer are visited.
    pub fn handle_timeout(&mut self, now: Duration) {
        let mut k = 0;
        while k < self.lingering.len() {
            if self.lingering[k].0 <= now {
                let (_, ev) = self.lingering.swap_remove(k);
                if let Event::RemoveSa { spi, .. } = &ev {
                    self.child_spis.remove(spi);
                }
                self.events.push_back(ev);
            } else {
                k += 1;
            }
        }
        let due: Vec<usize> = self
            .restart_at
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(c, _)| *c)
            .collect();
        for ci in due {
            self.restart_at.remove(&ci);
            if self.by_conn[ci].is_empty() {
                self.log(Level::Info, Some(ci), "restarting the connection".into());
                if self.start_init(now, ci, None, None).is_err() {
                    self.restart_at.insert(ci, now + RESTART_DELAY);
                }
            }
        }
        let due: Vec<(usize, u64)> = self
            .deadlines
            .range(..=(now, usize::MAX))
            .filter_map(|&(_, i)| self.sas.get(i).map(|s| (i, s.serial)))
            .collect();
        for (i, serial) in due {
            // Another SA's timer may have removed this one meanwhile.
            if self.sas.get(i).is_some_and(|s| s.serial == serial) {
                self.dirty.push(i);
                self.timeout_one(i, now);
            }
        }
        self.rearm_dirty();
    }

    /// Handles SA `i`'s due timers.
    fn timeout_one(&mut self, i: usize, now: Duration) {
        #[cfg(test)]
        {
            self.timer_visits += 1;
        }
        let timers = self.sas[i].timers;
        for timer in Timer::VALUES {
            if !timers.is_expired(timer, now) {
                continue;
            }
            match timer {
                Timer::HalfOpen => {
                    self.count(IkeEvent::HalfOpenExpired);
                    self.destroy(i, "half-open SA expired (no IKE_AUTH)".into(), false);
                    return;
                }
                Timer::Replaced => {
                    let why = if self.sas[i].children.is_empty() {
                        "replaced by rekeying"
                    } else {
                        // Held for a new IKE SA (`renegotiate_keeping_children`).
                        "replaced by a new IKE SA; its child SAs were held for it until now"
                    };
                    self.destroy(i, why.into(), false);
                    return;
                }
                Timer::Retransmit => {
                    if !self.retransmit(i, now) {
                        return;
                    }
                }
                Timer::Child => self.child_timers(i, now),
                Timer::Rekey => {
                    self.sas[i].rekey_at = None;
                    self.sas[i].tasks.push_back(Task::RekeyIke);
                }
                Timer::Dpd => {
                    if self.sas[i].pending.is_none() && !self.sas[i].tasks.contains(&Task::Dpd) {
                        self.sas[i].tasks.push_back(Task::Dpd);
                    }
                }
            }
        }
        if self.sas[i].state == State::Established {
            self.kick(i, now);
        }
    }

    /// Resends SA `i`'s outstanding request, or gives the peer up (false:
    /// the SA is gone).
    fn retransmit(&mut self, i: usize, now: Duration) -> bool {
        let ci = self.sas[i].conn;
        let r = self.conns[ci].retransmit;
        let Some(p) = &mut self.sas[i].pending else {
            return true;
        };
        if p.tries >= r.tries {
            if let Req::IkeRekey { new_spi, .. } = p.what {
                if let Some(j) = self.take_crossed(i) {
                    // §2.8.2: the peer's rekey of this SA, which crossed
                    // ours, was answered and stands; only ours went
                    // unanswered. The peer deletes this SA once its own
                    // rekey is done, so the peer is alive: its new SA
                    // takes the children.
                    self.sas[i].pending = None;
                    self.ike_spis.remove(&new_spi);
                    self.log(
                        Level::Info,
                        Some(ci),
                        format!(
                            "no answer to our IKE SA rekey after {} retransmissions; the \
                             peer's rekey, which crossed ours, stands",
                            r.tries
                        ),
                    );
                    self.ike_rekeyed(i, j, false, now);
                    return true;
                }
            }
            let was_deleting = matches!(
                self.sas[i].pending.as_ref().map(|p| &p.what),
                Some(Req::DeleteIke)
            );
            if was_deleting && self.sas[i].remove_at.is_some() {
                // A replaced or redundant SA, without children: its
                // successor's own exchanges (and DPD) say whether the peer
                // lives, so nothing goes down and no peer is declared dead.
                let reason = format!(
                    "replaced by rekeying (no answer to its Delete after {} retransmissions)",
                    r.tries
                );
                self.destroy(i, reason, false);
                return false;
            }
            self.count(IkeEvent::PeersDead);
            let continued = self.sas[i].continued;
            if continued && !was_deleting && !self.sas[i].children.is_empty() {
                // A stale state (the old leader did an exchange it did not
                // publish, e.g. a rekey of the IKE SA): the peer may well
                // still have these children under another IKE SA.
                self.log(
                    Level::Warn,
                    Some(ci),
                    format!(
                        "no answer after {} retransmissions: the IKE SA continued from the \
                         cluster's previous leader is stale or the peer dead; negotiating a \
                         new one, the child SAs stay until it replaces them",
                        r.tries
                    ),
                );
                self.renegotiate_keeping_children(i, now);
                return false;
            }
            let reason = if continued {
                format!(
                    "no answer after {} retransmissions: the IKE SA continued from the \
                     cluster's previous leader is stale or the peer dead; negotiating a new one",
                    r.tries
                )
            } else {
                format!("no answer after {} retransmissions: peer dead", r.tries)
            };
            // A continued SA that never got an answer stands for the
            // negotiation the new leader would otherwise have started:
            // start it now, whatever the DPD action.
            if (self.conns[ci].dpd_action == DpdAction::Restart || continued) && !was_deleting {
                self.restart_at.insert(ci, now + RESTART_DELAY);
            }
            self.log(Level::Warn, Some(ci), reason.clone());
            self.destroy(i, reason, true);
            return false;
        }
        p.tries += 1;
        p.next_at = now + r.wait(p.tries);
        let d = p.data.clone();
        self.count(IkeEvent::Retransmits);
        self.transmit(i, d);
        true
    }

    /// SA `i`'s child deadlines: held outbound SAs, hard expiry, rekeys.
    fn child_timers(&mut self, i: usize, now: Duration) {
        let ci = self.sas[i].conn;
        // Rekey responder's held outbound SA.
        let late: Vec<u32> = self.sas[i]
            .children
            .iter()
            .filter(|c| c.pending_out.as_ref().is_some_and(|p| now >= p.1))
            .map(|c| c.spi_in)
            .collect();
        for s in late {
            self.activate_outbound(i, s);
        }
        if self.sas[i].state != State::Established {
            return;
        }
        let expired: Vec<u32> = self.sas[i]
            .children
            .iter()
            .filter(|c| c.expire_at.is_some_and(|t| now >= t))
            .map(|c| c.spi_in)
            .collect();
        for s in expired {
            self.count(IkeEvent::ChildrenExpired);
            self.log(
                Level::Warn,
                Some(ci),
                format!("child SA {s:08x}_i reached its hard lifetime"),
            );
            if !self.sas[i].tasks.contains(&Task::DeleteChild(s)) {
                self.sas[i].tasks.push_back(Task::DeleteChild(s));
            }
            if let Some(c) = self.sas[i].children.iter_mut().find(|c| c.spi_in == s) {
                c.expire_at = None;
                c.rekey_at = None;
            }
        }
        let rekey: Vec<u32> = self.sas[i]
            .children
            .iter()
            .filter(|c| c.rekey_at.is_some_and(|t| now >= t))
            .map(|c| c.spi_in)
            .collect();
        for s in rekey {
            if let Some(c) = self.sas[i].children.iter_mut().find(|c| c.spi_in == s) {
                c.rekey_at = None;
            }
            self.sas[i].tasks.push_back(Task::RekeyChild(s));
        }
    }

    /// Starts the next queued exchange if none is outstanding (window of 1).
    fn kick(&mut self, i: usize, now: Duration) {
        self.dirty.push(i);
        while self.sas[i].pending.is_none()
            && matches!(self.sas[i].state, State::Established | State::Deleting)
        {
            let Some(t) = self.sas[i].tasks.pop_front() else {
                return;
            };
            match t {
                Task::RekeyChild(s) => self.start_child(i, now, Some(s), false, 0),
                Task::CreateChild(set) => {
                    if self.sas[i].state == State::Established {
                        self.start_child(i, now, None, false, set);
                    }
                }
                Task::CreatePerCpu(set) => {
                    if self.sas[i].state == State::Established {
                        self.start_child(i, now, None, true, set);
                    }
                }
                Task::RekeyIke => {
                    if self.sas[i].state == State::Established {
                        self.start_ike_rekey(i, now);
                    }
                }
                Task::Dpd => {
                    self.count(IkeEvent::DpdSent);
                    self.send_request(i, now, ExchangeType::Informational, Vec::new(), Req::Dpd);
                }
                Task::DeleteChild(s) => {
                    let Some(c) = self.sas[i].children.iter_mut().find(|c| c.spi_in == s) else {
                        continue;
                    };
                    c.state = ChildState::Deleting;
                    let payloads = vec![Payload::Delete(Delete::Child {
                        protocol: protocol_id(c.protocol),
                        spis: vec![s],
                    })];
                    self.send_request(
                        i,
                        now,
                        ExchangeType::Informational,
                        payloads,
                        Req::DeleteChild { spi_in: s },
                    );
                }
                Task::DeleteIke => {
                    self.sas[i].state = State::Deleting;
                    self.send_request(
                        i,
                        now,
                        ExchangeType::Informational,
                        vec![Payload::Delete(Delete::Ike)],
                        Req::DeleteIke,
                    );
                }
            }
        }
    }
}

fn verify_sig(
    pk: &super::sig::PublicKey,
    method: u8,
    data: &[u8],
    signed: &[u8],
) -> Result<(), String> {
    match method {
        auth_method::DIGITAL_SIGNATURE => pk
            .verify_auth(data, signed)
            .map(|_| ())
            .map_err(|e| format!("signature does not verify: {e}")),
        auth_method::RSA_SIG | auth_method::ECDSA_256 | auth_method::ECDSA_384 => pk
            .verify_legacy(method, data, signed)
            .map_err(|e| format!("signature does not verify: {e}")),
        auth_method::SHARED_KEY_MIC => {
            Err("peer used a pre-shared key, we expect a signature".into())
        }
        m => Err(format!("AUTH method {m} is not supported")),
    }
}

fn certreq(cas: &[Certificate]) -> Payload {
    let mut data = Vec::new();
    for c in cas {
        data.extend_from_slice(&c.spki_sha1());
    }
    Payload::CertReq {
        encoding: cert_encoding::X509_SIGNATURE,
        data,
    }
}

fn describe_proposal(p: &wire::Proposal) -> String {
    let parts: Vec<String> = p
        .transforms
        .iter()
        .map(|t| match t.key_length() {
            Some(k) => format!("{}:{}/{}", t.transform_type, t.id, k),
            None => format!("{}:{}", t.transform_type, t.id),
        })
        .collect();
    format!("#{} [{}]", p.number, parts.join(" "))
}

#[cfg(test)]
mod tests;
