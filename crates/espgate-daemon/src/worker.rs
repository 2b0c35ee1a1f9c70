//! A data-plane worker: one thread, one `poll(2)` loop over its TUN queue,
//! its outer sockets and the stop pipe, and its engine. Nothing else runs
//! here: the control socket, the metrics endpoint and IKE live on the
//! control thread, which reads this worker's counters without stopping it.
//!
//! Preallocated [`PacketBuf`]s carry every packet (a GSO batch of them
//! outbound, one inbound); nothing is allocated per packet. Drops are
//! counted by the engine; their log lines are formatted only when the
//! per-reason rate limiter lets one through.

use crate::netdev::{TunQueue, VirtioNetHdr, VNET_HDR_LEN};
use crate::ratelimit::{suppressed_note, RateLimiter};
use crate::sockets::{push_ipv6_outer, RawRx, RawTx, UdpOuter, UdpSock};
use crate::sys::{self, RecvBatch};
use anyhow::{Context, Result};
use espgate_api::costs::{CostCells, Costs, Dir};
use espgate_core::gateway::{Dropped, Engine, EngineEvent, Received};
use espgate_core::offload::{self, Coalescer, GsoInfo, GsoKind, Push, Segmenter};
use espgate_core::sa::SaEvent;
use espgate_core::stats::WorkerCounters;
use espgate_core::wire::{ip, proto, udp};
use espgate_core::{DropReason, PacketBuf};
use rustix::event::{PollFd, PollFlags, Timespec};
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest packet read from any descriptor (an IPv4/UDP datagram or a TUN
/// packet with the largest MTU).
pub const MAX_PACKET: usize = 65_535;
/// Timer period: SA lifetimes, rate-limited log summaries, keepalives.
const TICK: Duration = Duration::from_secs(1);
/// Most datagrams in one `UDP_SEGMENT` send (the kernel's limit is 64 on
/// older kernels).
const GSO_MAX: usize = 64;
/// Most bytes in one `UDP_SEGMENT` send (one UDP datagram's worth).
const GSO_BYTES: usize = 65_000;
/// Receive buffer for one (possibly GRO-coalesced) UDP read.
const GRO_BUF: usize = 65_535;

/// Datagrams read per `recvmmsg` call: 16 slots of 64 KiB (1 MiB per
/// worker for UDP) cut the system calls of a flood of small datagrams
/// from many senders (which GRO cannot coalesce) sixteenfold.
const RECV_SLOTS: usize = 16;
/// A connection's path MTU is asked of the kernel at most this often
/// ([`Round::learn_path_mtu`]).
const PATH_MTU_REASK: Duration = Duration::from_millis(100);
/// The longest a packet waits in a round for the rest of the round before
/// it leaves (sent, or written to the TUN). A round gathers up to `batch`
/// packets so that they leave in one system call; with a fast cipher the
/// whole round takes well under this, but with a slow one (3DES seals a
/// full-size packet in tens of microseconds) the first packets waited
/// milliseconds while the peer's gateway sat idle: on the lab's 1 Gbit/s
/// rig, rounds of 64 left the host 10 % idle, rounds of 16 or fewer 3-4 %.
/// The same holds if the worker loses its CPU in the middle of a round.
/// 500 µs did better with 3DES in one run, but the AES-GCM tunnel read
/// 4-11 % lower with it in three alternated sets, where 200 µs read level
/// with no hold (docs/PERFORMANCE.md).
const HOLD: Duration = Duration::from_micros(200);
/// Bytes sealed or opened between two looks at the clock for [`HOLD`]:
/// about one reading per five full-size packets, none in a round of small
/// ones, so a fast cipher pays next to nothing for the check.
const HOLD_LOOK_BYTES: usize = 8 << 10;

/// The outer sockets of one worker.
#[derive(Debug, Default)]
pub struct Sockets {
    /// ESP-in-UDP, when a connection uses it.
    pub udp: Option<Arc<UdpSock>>,
    /// Raw ESP/AH receivers (worker 0 only).
    pub raw_rx: Vec<RawRx>,
    /// Raw senders for IPv4 and IPv6.
    pub raw_tx4: Option<RawTx>,
    /// See `raw_tx4`.
    pub raw_tx6: Option<RawTx>,
}

/// An IKE message that arrived on the NAT-T socket (non-ESP marker
/// removed): our address, the sender, the message.
pub type IkeDatagram = (SocketAddr, SocketAddr, Vec<u8>);

/// A worker's engine, shared with the control thread.
///
/// parking_lot's mutex, not std's: a worker that is never idle (a flood
/// it cannot keep up with) unlocks at the end of each round and locks
/// again microseconds later, and with std's mutex a control thread
/// woken by that unlock found it taken again, round after round: `sa
/// add` or a cluster plan waited for seconds (a cluster node under a 3DES
/// flood did not answer its control socket at all). The worker now ends
/// each round with [`parking_lot::MutexGuard::unlock_fair`], which hands
/// the lock to a waiting thread, and costs no more than a plain unlock
/// when none waits.
pub type EngineLock = parking_lot::Mutex<Engine>;

/// Locks an engine.
pub fn lock(e: &EngineLock) -> parking_lot::MutexGuard<'_, Engine> {
    e.lock()
}

/// One data-plane worker; see the module documentation.
pub struct Worker<'a> {
    /// This worker's engine (locked by it for each round of packets, by
    /// the control thread only to change SAs).
    pub engine: &'a EngineLock,
    /// This worker's index.
    pub me: usize,
    /// This worker's TUN queue.
    pub tun: &'a TunQueue,
    /// The TUN device carries virtio-net headers.
    pub vnet: bool,
    /// UDP datagrams of one flow are coalesced into one TUN write (the
    /// kernel takes USO super-packets).
    pub udp_gro: bool,
    /// The TUN device's name, for messages.
    pub tun_name: &'a str,
    /// Outer side.
    pub sockets: &'a Sockets,
    /// Becomes readable (hang-up) when the worker must stop.
    pub stop: BorrowedFd<'a>,
    /// Set when this worker stops on an error; `on_fail` then tells the
    /// control thread.
    pub failed: &'a AtomicBool,
    /// Called once if the worker stops on an error.
    pub on_fail: &'a (dyn Fn() + Sync),
    /// When the daemon started (the core's clock is the time since).
    pub start: Instant,
    /// Packets per descriptor per round, and most datagrams per GSO send
    /// (`gateway.batch`).
    pub batch: usize,
    /// Send ESP-in-UDP in `UDP_SEGMENT` batches.
    pub gso: bool,
    /// The outer MTU (`gateway.mtu`, never less than the TUN's): each
    /// slot of the send batch is sized to hold one protected packet of it.
    pub mtu: usize,
    /// Per-stage cost accounting cells (on or off at run time).
    pub costs: Arc<CostCells>,
    /// Where IKE datagrams from the NAT-T socket go (when IKE runs).
    pub ike: Option<tokio::sync::mpsc::Sender<IkeDatagram>>,
    /// NAT keepalives: every connection's interval, zero for none (worker
    /// 0 sends them).
    pub keepalives: Vec<Duration>,
    /// The source address each connection's ESP-in-UDP names, by
    /// connection index: its `local` when the UDP socket is bound to the
    /// wildcard address, else `None` (the route's choice, or the bound
    /// address). See [`crate::sockets::udp_sources`].
    pub sources: &'a [Option<IpAddr>],
}

/// One run of a [`TxBatch`]: `len` slots from `first` (each slot's
/// successor in `TxBatch::next`, the last one `last`), all to one
/// destination, which leave as one message: ESP-in-UDP as one GSO send of
/// datagrams of `seg` bytes but the last, which may be shorter (then the
/// run is `closed`), to `dst` with `tos` from `src` (`None`: the route's
/// choice); raw ESP/AH (`raw`: connection and peer) one datagram each.
#[derive(Debug, Clone, Copy)]
struct Run {
    first: usize,
    last: usize,
    len: usize,
    dst: SocketAddr,
    src: Option<IpAddr>,
    tos: u8,
    seg: usize,
    bytes: usize,
    closed: bool,
    raw: Option<(usize, IpAddr)>,
}

impl Run {
    const EMPTY: Run = Run {
        first: 0,
        last: 0,
        len: 0,
        dst: SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
        src: None,
        tos: 0,
        seg: 0,
        bytes: 0,
        closed: false,
        raw: None,
    };
}

/// Where [`TxBatch::place`] puts an ESP-in-UDP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// At the end of this run (its peer's newest).
    Join(usize),
    /// In a new run.
    New,
    /// In a new batch: its peer's newest run is complete, so the batch is
    /// sent first.
    SendFirst,
}

/// How many runs back a packet looks for its destination's run: bounds
/// the per-packet search when a round holds packets for many peers.
const RUN_LOOKBACK: usize = 16;

/// Outbound packets of one round waiting to leave: the packets stay in
/// their own buffers (no copy), `span` says where each one's payload lies
/// (the UDP payload, or the whole raw packet), and the packets for one
/// destination form [`Run`]s. A packet joins the newest run for its
/// destination (ESP in UDP: its peer's address and port; raw: its
/// connection and peer), if that run can take it, even when packets for
/// other peers came in between: so a round alternating between peers
/// still leaves as one GSO run per peer. Packets for one destination keep
/// their order (they join only its newest run), and so every SA's
/// sequence numbers leave in order; only packets for different peers
/// change places. The ESP-in-UDP runs leave together in one `sendmmsg`,
/// each its own GSO message; raw runs in one `sendmmsg` each.
struct TxBatch {
    bufs: Vec<PacketBuf>,
    span: [(usize, usize); GSO_MAX],
    /// The slot after each slot in its run.
    next: [usize; GSO_MAX],
    /// Slots in use.
    n: usize,
    runs: [Run; GSO_MAX],
    nruns: usize,
    /// False once the kernel refused a GSO send: one datagram per message.
    gso: bool,
    /// Most packets per batch, and so per GSO send (`gateway.batch`, at
    /// most [`GSO_MAX`]).
    max: usize,
}

impl TxBatch {
    /// A batch of up to `max` packets, each slot holding one protected
    /// packet of up to `mtu` bytes (head- and tailroom are the buffer's
    /// own) without growing.
    fn new(gso: bool, max: usize, mtu: usize) -> TxBatch {
        TxBatch {
            // Slots of one packet each, not of a 64 KiB TUN read (the
            // reads go to a buffer of their own, `tun_read` in
            // `run_inner`): a batch's sealed packets then lie in about
            // 130 KiB of memory instead of 4 MiB, which the kernel's copy
            // of them in the UDP send finds still in the cache.
            bufs: (0..GSO_MAX)
                .map(|_| PacketBuf::with_capacity(mtu))
                .collect(),
            span: [(0, 0); GSO_MAX],
            next: [0; GSO_MAX],
            n: 0,
            runs: [Run::EMPTY; GSO_MAX],
            nruns: 0,
            gso,
            max: max.clamp(1, GSO_MAX),
        }
    }

    /// The newest run (within [`RUN_LOOKBACK`]) for which `same` holds.
    fn newest(&self, same: impl Fn(&Run) -> bool) -> Option<usize> {
        (self.nruns.saturating_sub(RUN_LOOKBACK)..self.nruns)
            .rev()
            .find(|&i| same(&self.runs[i]))
    }

    /// Puts the next slot, whose payload is `span`, at the end of run `ri`,
    /// or of a new run made from `new` when `ri` is `None`; returns the
    /// run's index.
    fn append(&mut self, ri: Option<usize>, new: Run, span: (usize, usize)) -> usize {
        let slot = self.n;
        let ri = match ri {
            Some(i) => {
                let r = &mut self.runs[i];
                self.next[r.last] = slot;
                r.last = slot;
                r.len += 1;
                i
            }
            None => {
                self.runs[self.nruns] = Run {
                    first: slot,
                    last: slot,
                    len: 1,
                    ..new
                };
                self.nruns += 1;
                self.nruns - 1
            }
        };
        self.span[slot] = span;
        self.n += 1;
        ri
    }

    /// Where an ESP-in-UDP datagram of `len` bytes to `dst` from `src`
    /// with `tos` goes, from one look at its peer's newest run: into that
    /// run if it can take it (same TOS and source, not longer than the
    /// run's segments, GSO room); after sending the batch if that run is
    /// complete (a shorter datagram closed it, or it has no room), as
    /// before runs were gathered: a complete run leaves at once instead of
    /// waiting for the batch to fill, so the receiving gateway can start
    /// on it while this one seals the next (a TCP super-segment ends in a
    /// short segment), and one peer's traffic is sent exactly as before;
    /// else (no run for the peer, another TOS or source, no GSO) into a
    /// new run.
    fn place(&self, dst: SocketAddr, src: Option<IpAddr>, tos: u8, len: usize) -> Place {
        let Some(i) = self.newest(|r| r.raw.is_none() && r.dst == dst) else {
            return Place::New;
        };
        let r = &self.runs[i];
        if !self.gso {
            Place::New
        } else if r.closed || len > r.seg || r.bytes + len > GSO_BYTES {
            Place::SendFirst
        } else if r.src == src && r.tos == tos {
            Place::Join(i)
        } else {
            Place::New
        }
    }

    /// Adds the ESP-in-UDP datagram in the next slot, whose payload is
    /// `span`, to run `i` (`Place::Join(i)`) or to a new run (any other
    /// place: after `SendFirst` the caller has sent the batch). True when
    /// the batch is full.
    fn push_udp(
        &mut self,
        place: Place,
        dst: SocketAddr,
        src: Option<IpAddr>,
        tos: u8,
        span: (usize, usize),
    ) -> bool {
        let len = span.1 - span.0;
        let joins = match place {
            Place::Join(i) => Some(i),
            Place::New | Place::SendFirst => None,
        };
        let new = Run {
            dst,
            src,
            tos,
            seg: len,
            ..Run::EMPTY
        };
        let ri = self.append(joins, new, span);
        let r = &mut self.runs[ri];
        r.bytes += len;
        r.closed = len < r.seg;
        self.n >= self.max
    }

    /// Adds the raw ESP/AH packet of connection `ci` to `remote` in the
    /// next slot to the newest run for the same, else starts a run. True
    /// when the batch is full.
    fn push_raw(&mut self, ci: usize, remote: IpAddr) -> bool {
        let raw = Some((ci, remote));
        let joins = self.newest(|r| r.raw == raw);
        let span = (0, self.bufs[self.n].len());
        self.append(joins, Run { raw, ..Run::EMPTY }, span);
        self.n >= self.max
    }

    /// The payloads of run `r`'s packets, in order, into `out` (at least
    /// `r.len` long).
    fn iov<'b>(&'b self, r: &Run, out: &mut [io::IoSlice<'b>]) {
        let mut slot = r.first;
        for v in out.iter_mut().take(r.len) {
            let (s, e) = self.span[slot];
            *v = io::IoSlice::new(&self.bufs[slot].as_slice()[s..e]);
            slot = self.next[slot];
        }
    }
}

/// What a descriptor in the poll set is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Stop,
    Tun,
    Udp,
    Raw(usize),
}

/// The descriptors a worker polls, each with what it is: the loop asks
/// which sources are ready instead of counting slots by hand.
struct PollSet<'fd> {
    fds: Vec<PollFd<'fd>>,
    sources: Vec<Source>,
}

impl<'fd> PollSet<'fd> {
    fn new() -> PollSet<'fd> {
        PollSet {
            fds: Vec::new(),
            sources: Vec::new(),
        }
    }

    fn add(&mut self, fd: BorrowedFd<'fd>, source: Source) {
        self.fds.push(PollFd::from_borrowed_fd(fd, PollFlags::IN));
        self.sources.push(source);
    }

    /// Waits up to `timeout` for any descriptor; `EINTR` counts as
    /// "nothing ready".
    fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        for p in &mut self.fds {
            p.clear_revents();
        }
        // Past rustix's range (centuries): wait as long as it takes.
        let timeout = Timespec::try_from(timeout).ok();
        match rustix::event::poll(&mut self.fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether `source` is ready.
    fn ready(&self, source: Source) -> bool {
        self.sources
            .iter()
            .zip(&self.fds)
            .any(|(s, p)| *s == source && !p.revents().is_empty())
    }
}

/// When the output held in a round (packets sealed and not yet sent, or
/// opened and not yet written) started, and the bytes since the clock was
/// last read for [`HOLD`].
#[derive(Debug, Default, Clone, Copy)]
struct Hold {
    since: Duration,
    bytes: usize,
}

impl Hold {
    /// Notes `len` more bytes held at `now` (`first`: the output was empty
    /// before them); true when it is time to read the clock.
    #[inline]
    fn add(&mut self, first: bool, now: Duration, len: usize) -> bool {
        if first {
            self.since = now;
        }
        self.bytes += len;
        if self.bytes < HOLD_LOOK_BYTES {
            return false;
        }
        self.bytes = 0;
        true
    }
}

/// The packet handlers of one round, with the worker's engine locked.
struct Round<'a> {
    engine: &'a mut Engine,
    counters: &'a WorkerCounters,
    /// The cost accountant, when accounting is on for this round.
    costs: Option<&'a mut Costs>,
    limiter: &'a mut RateLimiter,
    w: &'a Worker<'a>,
    /// The time of the batch being processed: one clock reading per
    /// `recvmmsg` rather than one per datagram (and another per drop).
    clock: Option<Duration>,
    /// The sealed packets not yet sent ([`HOLD`]).
    out_hold: Hold,
    /// The opened packets coalesced and not yet written ([`HOLD`]).
    in_hold: Hold,
}

impl<'a> Worker<'a> {
    /// Runs until told to stop; on an error, sets `failed`, calls
    /// `on_fail` and returns it.
    pub fn run(&mut self) -> Result<()> {
        let r = self.run_inner();
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
            (self.on_fail)();
        }
        r
    }

    fn run_inner(&mut self) -> Result<()> {
        let (tun, sockets): (&'a TunQueue, &'a Sockets) = (self.tun, self.sockets);
        let mut polls = PollSet::new();
        polls.add(self.stop, Source::Stop);
        polls.add(tun.as_fd(), Source::Tun);
        if let Some(u) = &sockets.udp {
            polls.add(u.as_fd(), Source::Udp);
        }
        for (i, r) in sockets.raw_rx.iter().enumerate() {
            polls.add(r.as_fd(), Source::Raw(i));
        }
        let mut in_buf = PacketBuf::with_capacity(MAX_PACKET);
        // Batched receive buffers, allocated once: UDP slots hold a GRO
        // read of up to 64 KiB each; raw slots one packet each.
        let mut udp_rx = sockets
            .udp
            .as_ref()
            .map(|_| RecvBatch::new(RECV_SLOTS, GRO_BUF));
        let mut raw_rx =
            (!sockets.raw_rx.is_empty()).then(|| RecvBatch::new(RECV_SLOTS, MAX_PACKET));
        let mut tx = TxBatch::new(self.gso, self.batch, self.mtu);
        // Every TUN read, with its virtio-net header if any: a packet, or
        // a super-segment (TSO/USO) cut in place here. One buffer, so
        // that the reads land in memory still in the cache.
        let mut tun_read = PacketBuf::with_capacity(MAX_PACKET + VNET_HDR_LEN);
        // The TCP segments (UDP datagrams too, with USO) being coalesced
        // for the TUN.
        let mut co = Coalescer::with_udp(self.udp_gro);
        // When each connection last sent something (NAT keepalives).
        let mut last_tx = vec![Duration::ZERO; lock(self.engine).connections().len()];
        let mut costs = Costs::over(self.costs.clone());
        // Keys: every drop reason, and "ike".
        let mut limiter =
            RateLimiter::with_capacity(Duration::from_secs(1), DropReason::ALL.len() + 1);
        let counters = lock(self.engine).stats().clone();
        let counters = &counters.counters;
        let mut next_tick = Instant::now() + TICK;
        loop {
            polls
                .wait(next_tick.saturating_duration_since(Instant::now()))
                .context("poll")?;
            if polls.ready(Source::Stop) {
                return Ok(());
            }
            {
                let mut guard = lock(self.engine);
                let on = self.costs.is_on();
                let mut round = Round {
                    engine: &mut guard,
                    counters,
                    costs: on.then_some(&mut costs),
                    limiter: &mut limiter,
                    w: self,
                    clock: None,
                    out_hold: Hold::default(),
                    in_hold: Hold::default(),
                };
                // The packet handlers are the hot path: allocations in them
                // are counted (`hot_path_allocs`), and there should be none.
                let hot = crate::alloc_count::hot();
                if polls.ready(Source::Tun) {
                    round.on_tun(&mut tx, &mut last_tx, &mut tun_read)?;
                }
                if let (true, Some(rx)) = (polls.ready(Source::Udp), udp_rx.as_mut()) {
                    round.on_udp(rx, &mut in_buf, &mut co);
                }
                for (i, r) in self.sockets.raw_rx.iter().enumerate() {
                    if let (true, Some(rx)) = (polls.ready(Source::Raw(i)), raw_rx.as_mut()) {
                        round.on_raw(r, rx, &mut in_buf, &mut co);
                    }
                }
                drop(hot);
                // The control thread, if it waits, goes next (see
                // `EngineLock`).
                parking_lot::MutexGuard::unlock_fair(guard);
            }
            let now_i = Instant::now();
            if now_i >= next_tick {
                let now = self.start.elapsed();
                let mut guard = lock(self.engine);
                guard.tick(now);
                while let Some(ev) = guard.poll_event() {
                    log_event(&ev);
                }
                if self.me == 0 {
                    self.keepalives(&guard, &mut last_tx, counters);
                }
                drop(guard);
                for (key, n) in limiter.flush(now) {
                    tracing::warn!("{n} more {key} lines suppressed in the last second");
                }
                next_tick = now_i + TICK;
            }
        }
    }

    /// RFC 3948 §2.3: a one-byte 0xFF datagram to each ESP-in-UDP peer that
    /// has not been sent anything for its `nat_keepalive`, so that a NAT on
    /// the way keeps its mapping. The peer ignores it. It goes where the
    /// connection's ESP goes: the peer of its current SA
    /// ([`Engine::peer_udp`]).
    fn keepalives(&self, engine: &Engine, last_tx: &mut [Duration], counters: &WorkerCounters) {
        let Some(u) = &self.sockets.udp else { return };
        let now = self.start.elapsed();
        for (ci, every) in self.keepalives.iter().enumerate() {
            if every.is_zero() || ci >= last_tx.len() || now.saturating_sub(last_tx[ci]) < *every {
                continue;
            }
            let Some(dst) = engine.peer_udp(ci) else {
                continue;
            };
            last_tx[ci] = now;
            let src = self.sources.get(ci).copied().flatten();
            match u.send(&[0xff], dst, 0, src) {
                Ok(_) => counters.keepalives_sent.incr(),
                Err(e) => tracing::debug!("NAT keepalive to {dst}: {e}"),
            }
        }
    }
}

/// Writes a drop's log line (at most one per reason per second; allocating
/// here is fine): `no_policy` at info level, the others at warn.
fn write_drop(reason: DropReason, line: &str, suppressed: u64) {
    let note = suppressed_note(suppressed);
    match reason {
        DropReason::NoPolicy => tracing::info!("dropped ({}): {line}{note}", reason.as_str()),
        _ => tracing::warn!("dropped ({}): {line}{note}", reason.as_str()),
    }
}

/// Logs an SA's lifetime event.
fn log_event(ev: &EngineEvent) {
    let EngineEvent::Sa {
        conn,
        outbound,
        protocol,
        spi,
        event,
    } = ev;
    let what = format!(
        "connection \"{conn}\": {} {} SA {spi:#010x}",
        if *outbound { "outbound" } else { "inbound" },
        protocol.name().to_uppercase(),
    );
    match event {
        SaEvent::SoftExpired => tracing::warn!(
            "{what} reached its soft lifetime limit: a replacement is due (manual SAs are never \
             replaced automatically)"
        ),
        SaEvent::HardExpired => tracing::warn!(
            "{what} reached its hard lifetime limit and refuses all traffic until it is replaced"
        ),
        SaEvent::SeqExhausted => tracing::warn!(
            "{what} has used up its sequence numbers and refuses to send; configure new keys \
             (and esn = true)"
        ),
    }
}

impl Round<'_> {
    fn now(&self) -> Duration {
        self.clock.unwrap_or_else(|| self.w.start.elapsed())
    }

    /// Reads the clock (the round's time from here on); true when output
    /// held since `since` has waited [`HOLD`] and must leave now.
    fn held_too_long(&mut self, since: Duration) -> bool {
        let now = self.w.start.elapsed();
        self.clock = Some(now);
        if now.saturating_sub(since) < HOLD {
            return false;
        }
        self.counters.hold_flushes.incr();
        true
    }

    /// After a packet joined the batch (and did not fill it): sends the
    /// batch if its first packet has waited [`HOLD`].
    #[inline]
    fn hold_out(&mut self, tx: &mut TxBatch, now: Duration) {
        let len = tx.bufs[tx.n - 1].len();
        if self.out_hold.add(tx.n == 1, now, len) && self.held_too_long(self.out_hold.since) {
            self.flush(tx);
        }
    }

    /// A drop the engine reported: counted already; a log line when the
    /// rate limiter allows (formatted only then).
    fn report(&mut self, d: &Dropped) {
        if let Some(n) = self.allow(d.reason) {
            let _cold = crate::alloc_count::cold();
            let line = self.engine.describe(d).to_string();
            write_drop(d.reason, &line, n);
        }
    }

    /// Counts a drop of the I/O around the engine and logs it like
    /// [`Round::report`].
    fn io_drop(&mut self, reason: DropReason, msg: impl FnOnce(&mut String) -> std::fmt::Result) {
        self.counters.drops.count(reason);
        if let Some(n) = self.allow(reason) {
            let _cold = crate::alloc_count::cold();
            let mut line = String::new();
            let _ = msg(&mut line);
            write_drop(reason, &line, n);
        }
    }

    /// May a line about `reason` be written now? `Some(n)`: yes, `n` were
    /// suppressed since the last.
    fn allow(&mut self, reason: DropReason) -> Option<u64> {
        let now = self.now();
        self.limiter.check(reason.as_str(), now)
    }

    /// A clock reading for the cost accountant, when accounting is on.
    #[inline]
    fn cost_clock(&self) -> Option<u64> {
        self.costs.as_ref().map(|c| c.now())
    }

    #[inline]
    fn cost_received(&mut self, start: Option<u64>, dir: Dir) {
        if let (Some(c), Some(t)) = (self.costs.as_deref_mut(), start) {
            c.received(t, dir);
        }
    }

    #[inline]
    fn cost_sent(&mut self, start: Option<u64>, dir: Dir, packets: usize) {
        if let (Some(c), Some(t)) = (self.costs.as_deref_mut(), start) {
            c.sent(t, dir, packets as u64);
        }
    }

    /// Reads and protects up to `batch` packets from the TUN. ESP-in-UDP
    /// datagrams to one peer are gathered into GSO runs and leave in one
    /// send each; raw ESP/AH packets of one connection likewise leave in
    /// one `sendmmsg` (still one datagram each). On a vnet-header device one
    /// read may be a TCP/UDP super-segment (TSO/USO): it is cut into
    /// MTU-sized packets here, each protected and batched like a packet
    /// read alone. A read error other than "nothing waiting" means the
    /// device is gone (e.g. deleted by hand): the worker stops.
    fn on_tun(
        &mut self,
        tx: &mut TxBatch,
        last_tx: &mut [Duration],
        tun_read: &mut PacketBuf,
    ) -> Result<()> {
        let vnet = self.w.vnet;
        let room = MAX_PACKET + if vnet { VNET_HDR_LEN } else { 0 };
        let mut result = Ok(());
        for _ in 0..self.w.batch {
            let t = self.cost_clock();
            let n = match self.w.tun.read(tun_read.prepare(room)) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    result =
                        Err(e).with_context(|| format!("reading TUN device {}", self.w.tun_name));
                    break;
                }
            };
            tun_read.truncate(n);
            self.cost_received(t, Dir::Outbound);
            // One clock reading per read, as `on_udp` takes one per
            // `recvmmsg`: a super-segment's tens of segments share it (a
            // reading per packet was about 1 % of all CPU time in the TCP test).
            self.clock = Some(self.w.start.elapsed());
            if !vnet {
                self.protect(tx, last_tx, tun_read.as_mut_slice());
                continue;
            }
            let Some(h) = VirtioNetHdr::parse(tun_read.as_slice()) else {
                self.counters.tun_rx.incr();
                self.io_drop(DropReason::BadOffload, |f| {
                    write!(f, "TUN read of {n} bytes: shorter than a virtio-net header")
                });
                continue;
            };
            tun_read.trim_front(VNET_HDR_LEN);
            let Some(info) = gso_info(&h) else {
                self.counters.tun_rx.incr();
                self.io_drop(DropReason::BadOffload, |f| {
                    write!(f, "TUN read with an unknown GSO type {:#x}", h.gso_type)
                });
                continue;
            };
            if info.kind == GsoKind::None {
                if info.needs_csum {
                    let (at, off) = (usize::from(info.csum_start), usize::from(info.csum_offset));
                    if let Err(d) = offload::complete_checksum(tun_read.as_mut_slice(), at, off) {
                        self.counters.tun_rx.incr();
                        self.io_drop(d, |f| {
                            write!(f, "TUN packet with a partial checksum at {at}+{off}")
                        });
                        continue;
                    }
                }
                self.protect(tx, last_tx, tun_read.as_mut_slice());
                continue;
            }
            // A super-segment: cut in place where it was read, each
            // segment sealed from there into the batch's next slot.
            let mut segs = match Segmenter::new(tun_read.as_mut_slice(), &info) {
                Ok(s) => s,
                Err(d) => {
                    self.counters.tun_rx.incr();
                    let len = tun_read.len();
                    self.io_drop(d, |f| write!(f, "TUN super-segment of {len} bytes ({h:?})"));
                    continue;
                }
            };
            self.counters.tso_reads.incr();
            while let Some(r) = segs.next_in_place() {
                match r {
                    Ok(clear) => self.protect(tx, last_tx, clear),
                    Err(d) => {
                        self.counters.tun_rx.incr();
                        self.io_drop(d, |f| f.write_str("cutting a TUN super-segment"));
                        break;
                    }
                }
            }
        }
        self.flush(tx);
        self.clock = None;
        result
    }

    /// Protects the clear packet `clear` (a TUN read, or a segment of one
    /// cut in place) into the batch's next slot and adds it to the GSO
    /// run (raw ESP/AH: to the `sendmmsg` run).
    fn protect(&mut self, tx: &mut TxBatch, last_tx: &mut [Duration], clear: &mut [u8]) {
        let buf = &mut tx.bufs[tx.n];
        let now = self.now();
        let r = match self.costs.as_deref_mut() {
            None => self.engine.outbound_from(clear, buf, now),
            Some(c) => {
                c.begin(Dir::Outbound);
                self.engine.outbound_from_probed(clear, buf, now, c)
            }
        };
        let ci = match r {
            Ok(Some(ci)) => ci,
            Ok(None) => return,
            Err(d) => {
                self.report(&d);
                if d.reply {
                    // ICMP "too big" for the packet's sender.
                    let h = self.w.vnet.then(VirtioNetHdr::default);
                    self.write_tun(h.as_ref(), tx.bufs[tx.n].as_slice(), 1);
                }
                return;
            }
        };
        if let Some(t) = last_tx.get_mut(ci) {
            *t = now;
        }
        let Some(c) = self.engine.connections().nth(ci) else {
            return;
        };
        let (udp_conn, remote) = (c.udp, c.remote);
        if !udp_conn {
            if tx.push_raw(ci, remote) {
                self.flush(tx);
            } else {
                self.hold_out(tx, now);
            }
            return;
        }
        let Some(((start, end), tos, dst)) =
            udp_payload(tx.bufs[tx.n].as_slice()).filter(|_| self.w.sockets.udp.is_some())
        else {
            self.io_drop(DropReason::SendError, |f| {
                write!(f, "sending to {remote}: no UDP socket or bad outer packet")
            });
            return;
        };
        let src = self.w.sources.get(ci).copied().flatten();
        let place = tx.place(dst, src, tos, end - start);
        if place == Place::SendFirst {
            // Send what is gathered; this packet starts the next batch in
            // slot 0.
            let i = tx.n;
            self.flush(tx);
            tx.bufs.swap(0, i);
        }
        if tx.push_udp(place, dst, src, tos, (start, end)) {
            self.flush(tx);
        } else {
            self.hold_out(tx, now);
        }
    }

    /// Sends the batch, its runs in order: consecutive ESP-in-UDP runs in
    /// one `sendmmsg` (one GSO message each), each raw run in one
    /// `sendmmsg` of its own.
    fn flush(&mut self, tx: &mut TxBatch) {
        let (n, nruns) = (std::mem::take(&mut tx.n), std::mem::take(&mut tx.nruns));
        if n == 0 {
            return;
        }
        let t = self.cost_clock();
        let mut i = 0;
        while i < nruns {
            if let Some((ci, remote)) = tx.runs[i].raw {
                self.flush_raw(tx, i, ci, remote);
                i += 1;
                continue;
            }
            let j = (i..nruns)
                .find(|&k| tx.runs[k].raw.is_some())
                .unwrap_or(nruns);
            self.flush_udp(tx, i, j);
            i = j;
        }
        self.cost_sent(t, Dir::Outbound, n);
    }

    /// Sends the ESP-in-UDP runs `first..end` of the batch: one message
    /// each (a GSO send of its datagrams, or one datagram), as many per
    /// `sendmmsg` as the kernel takes. A message the kernel refuses is
    /// handled alone and the rest still go: at most one call per run plus
    /// the fallbacks below.
    fn flush_udp(&mut self, tx: &mut TxBatch, first: usize, end: usize) {
        let sockets = self.w.sockets;
        let Some(u) = &sockets.udp else { return };
        // The runs' payloads one run after another: message k's are
        // `iov[starts[k]..][..len]`.
        let mut iov = [io::IoSlice::new(&[]); GSO_MAX];
        let mut starts = [0usize; GSO_MAX];
        let mut used = 0;
        for (k, r) in tx.runs[first..end].iter().enumerate() {
            starts[k] = used;
            tx.iov(r, &mut iov[used..]);
            used += r.len;
        }
        let gso = tx.gso;
        let msg = |r: &Run, from: usize| sys::Msg {
            iov: &iov[from..from + r.len],
            dst: r.dst,
            tos: Some(r.tos),
            src: r.src,
            gso: (gso && r.len > 1).then_some(r.seg as u16),
        };
        let mut gso_off = false;
        if end - first == 1 {
            // One message (one peer, the common case): a plain `sendmsg`,
            // without the multi-message headers, whose set-up would cost
            // every small round (a TCP receiver's ACKs) for nothing.
            let one = [msg(&tx.runs[first], 0)];
            self.send_udp_msgs(u, &one, &mut gso_off);
        } else {
            let msgs: [sys::Msg<'_>; GSO_MAX] =
                std::array::from_fn(
                    |k| match tx.runs.get(first + k).filter(|_| first + k < end) {
                        Some(r) => msg(r, starts[k]),
                        None => msg(&Run::EMPTY, 0),
                    },
                );
            self.send_udp_msgs(u, &msgs[..end - first], &mut gso_off);
        }
        if gso_off {
            tx.gso = false;
        }
    }

    /// Sends `msgs`, as many per `sendmmsg` as the kernel takes (one alone
    /// with `sendmsg`). A message the kernel refuses is handled alone and
    /// the rest still go: at most one call per message plus the fallbacks
    /// of [`Round::refused`].
    fn send_udp_msgs(&mut self, u: &UdpSock, msgs: &[sys::Msg<'_>], gso_off: &mut bool) {
        let m = msgs.len();
        let mut at = 0;
        while at < m {
            let r = if m - at == 1 {
                u.send_msg(&msgs[at]).map(|_| 1)
            } else {
                u.send_msgs(&msgs[at..m])
            };
            match r {
                Ok(k) if k > 0 => {
                    if k > 1 {
                        self.counters.udp_batch_sends.incr();
                    }
                    for g in &msgs[at..at + k] {
                        self.counters.net_tx.add(g.iov.len() as u64);
                        if g.gso.is_some() {
                            self.counters.gso_sends.incr();
                        }
                    }
                    at += k;
                }
                // Not seen in practice; counted rather than retried, so
                // the loop stays bounded.
                Ok(_) => {
                    let (dst, count) = (msgs[at].dst, msgs[at].iov.len());
                    for _ in 0..count {
                        self.io_drop(DropReason::SendError, |f| {
                            write!(f, "sending to {dst}: the kernel took no datagram")
                        });
                    }
                    at += 1;
                }
                Err(e) => {
                    self.refused(gso_off, &msgs[at], e);
                    at += 1;
                }
            }
        }
    }

    /// The kernel refused message `g` with `e`. A GSO refusal for want of
    /// support turns GSO off for good (`gso_off`); one for this message only (e.g.
    /// segments larger than the path MTU with `fragment_inner = false`,
    /// which GSO cannot fragment) sends it a datagram at a time; any other
    /// error drops its datagrams, counted.
    fn refused(&mut self, gso_off: &mut bool, g: &sys::Msg<'_>, e: io::Error) {
        let dst = g.dst;
        let code = e.raw_os_error().unwrap_or(0);
        if g.gso.is_some() {
            if [libc::EIO, libc::ENOPROTOOPT, libc::EOPNOTSUPP].contains(&code) {
                if !*gso_off {
                    tracing::warn!(
                        "UDP GSO refused by the kernel ({e}); sending one datagram per message"
                    );
                }
                *gso_off = true;
            } else if [libc::EINVAL, libc::EMSGSIZE].contains(&code) {
                tracing::debug!("UDP GSO send refused ({e}); sending this run one by one");
            } else {
                return self.drop_all(g, &e);
            }
            let Some(u) = &self.w.sockets.udp else { return };
            for v in g.iov {
                match u.send(v, dst, g.tos.unwrap_or(0), g.src) {
                    Ok(_) => self.counters.net_tx.incr(),
                    Err(err) => self.io_drop(DropReason::SendError, |f| {
                        write!(f, "sending to {dst}: {err}")
                    }),
                }
            }
            return;
        }
        self.drop_all(g, &e);
    }

    /// Drops (counted) every datagram of message `g`, refused with `e`.
    fn drop_all(&mut self, g: &sys::Msg<'_>, e: &io::Error) {
        let dst = g.dst;
        for _ in 0..g.iov.len() {
            self.io_drop(DropReason::SendError, |f| {
                write!(f, "sending to {dst}: {e}")
            });
        }
    }

    /// Sends run `ri` of the batch, raw packets of connection `ci` to
    /// `remote`, as many per `sendmmsg` as the kernel takes. A packet it
    /// refuses is dropped and counted (and a refusal as too big asks for
    /// the path MTU), and the rest still go: at most one call per packet.
    fn flush_raw(&mut self, tx: &TxBatch, ri: usize, ci: usize, remote: IpAddr) {
        let sockets = self.w.sockets;
        let n = tx.runs[ri].len;
        let raw = if remote.is_ipv6() {
            &sockets.raw_tx6
        } else {
            &sockets.raw_tx4
        };
        let Some(raw) = raw else {
            for _ in 0..n {
                self.io_drop(DropReason::SendError, |f| {
                    write!(f, "sending to {remote}: no raw socket for this family")
                });
            }
            return;
        };
        let mut iov = [io::IoSlice::new(&[]); GSO_MAX];
        tx.iov(&tx.runs[ri], &mut iov);
        let mut at = 0;
        while at < n {
            match raw.send_each(&iov[at..n], remote) {
                Ok(k) if k > 0 => {
                    self.counters.net_tx.add(k as u64);
                    if k > 1 {
                        self.counters.raw_batch_sends.incr();
                    }
                    at += k;
                }
                // Not seen in practice; counted rather than retried, so
                // the loop stays bounded.
                Ok(_) => {
                    self.io_drop(DropReason::SendError, |f| {
                        write!(f, "sending to {remote}: the kernel took no packet")
                    });
                    at += 1;
                }
                Err(e) => {
                    self.io_drop(DropReason::SendError, |f| {
                        write!(f, "sending to {remote}: {e}")
                    });
                    if e.raw_os_error() == Some(libc::EMSGSIZE) {
                        self.learn_path_mtu(ci, remote);
                    }
                    at += 1;
                }
            }
        }
    }

    /// A send to `remote` was refused as larger than the path carries (raw
    /// ESP/AH keeps the inner packet's DF bit, so the kernel refuses what
    /// exceeds the path MTU it learnt from a router's ICMP): asks the
    /// kernel for that MTU and gives it to the engine, which from then on
    /// answers oversized clear packets with ICMP "too big" so that their
    /// senders shrink them (RFC 4301 §8.2.1). At most one question per
    /// [`PATH_MTU_REASK`] per connection.
    fn learn_path_mtu(&mut self, ci: usize, remote: IpAddr) {
        let now = self.now();
        if !self.engine.path_mtu_stale(ci, now, PATH_MTU_REASK) {
            return;
        }
        let _cold = crate::alloc_count::cold();
        match sys::path_mtu(remote) {
            Ok(mtu) => {
                let mtu = mtu.min(u32::from(u16::MAX)) as u16;
                if let Some(inner) = self.engine.note_path_mtu(ci, mtu, now) {
                    tracing::info!(
                        "path MTU to {remote} is {mtu}: clear packets above {inner} bytes that may \
                         not be fragmented are refused with ICMP \"too big\" to their sender"
                    );
                }
            }
            Err(e) => tracing::warn!("reading the path MTU to {remote}: {e}"),
        }
    }

    /// Hands a decrypted inner packet to the TUN. On a vnet-header device
    /// consecutive TCP segments of one flow are coalesced into one
    /// super-segment first (written by [`Round::flush_tun`] when the flow
    /// changes or the batch ends): one write, one pass up the kernel's
    /// stack for many segments.
    fn deliver(&mut self, pkt: &[u8], co: &mut Coalescer) {
        if !self.w.vnet {
            self.write_tun(None, pkt, 1);
            return;
        }
        let first = co.is_empty();
        match co.push(pkt) {
            Push::Absorbed => return self.hold_in(co, first, pkt.len()),
            Push::FlushFirst => {
                self.flush_tun(co);
                if co.push(pkt) == Push::Absorbed {
                    return self.hold_in(co, true, pkt.len());
                }
            }
            Push::Ineligible => self.flush_tun(co),
        }
        self.write_tun(Some(&VirtioNetHdr::default()), pkt, 1);
    }

    /// After a packet was coalesced: writes the super-segment if its first
    /// packet has waited [`HOLD`].
    #[inline]
    fn hold_in(&mut self, co: &mut Coalescer, first: bool, len: usize) {
        let now = self.now();
        if self.in_hold.add(first, now, len) && self.held_too_long(self.in_hold.since) {
            self.flush_tun(co);
        }
    }

    /// Writes the coalesced super-segment, if any.
    fn flush_tun(&mut self, co: &mut Coalescer) {
        let Some((pkt, info, segs)) = co.take() else {
            return;
        };
        let h = VirtioNetHdr {
            flags: if info.needs_csum {
                VirtioNetHdr::F_NEEDS_CSUM
            } else {
                0
            },
            gso_type: info.kind.to_virtio(),
            hdr_len: info.hdr_len,
            gso_size: info.gso_size,
            csum_start: info.csum_start,
            csum_offset: info.csum_offset,
        };
        if segs > 1 {
            self.counters.tun_gso_writes.incr();
        }
        self.write_tun(Some(&h), pkt, segs);
    }

    /// One TUN write of `pkt` (`segs` inner packets), after `vnet` on a
    /// vnet-header device.
    fn write_tun(&mut self, vnet: Option<&VirtioNetHdr>, pkt: &[u8], segs: usize) {
        let t = self.cost_clock();
        let tun = self.w.tun;
        let r = match vnet {
            Some(h) => {
                let h = h.to_bytes();
                tun.write_parts(&[io::IoSlice::new(&h), io::IoSlice::new(pkt)])
            }
            None => tun.write(pkt),
        };
        self.cost_sent(t, Dir::Inbound, segs);
        match r {
            Ok(_) => self.counters.tun_tx.add(segs as u64),
            Err(e) => {
                let name = self.w.tun_name;
                for _ in 0..segs {
                    self.io_drop(DropReason::TunWrite, |f| {
                        write!(f, "writing to {name}: {e}")
                    });
                }
            }
        }
    }

    /// Verifies and removes the IPsec layers of one received packet and
    /// delivers what is inside. `buf` holds the synthetic outer header (if
    /// any) and the head of `src`, the packet as received
    /// ([`PacketBuf::load_head`]); the engine decrypts the rest straight
    /// from `src` ([`Engine::inbound_from`]).
    fn receive(&mut self, buf: &mut PacketBuf, src: &[u8], from: IpAddr, co: &mut Coalescer) {
        let now = self.now();
        let r = match self.costs.as_deref_mut() {
            None => self.engine.inbound_from(buf, src, now, from),
            Some(c) => {
                c.begin(Dir::Inbound);
                self.engine.inbound_from_probed(buf, src, now, from, c)
            }
        };
        match r {
            Ok(Received::Packet) => self.deliver(buf.as_slice(), co),
            Ok(Received::Ike) => {
                // IKE on the NAT-T port when no connection uses IKE (with
                // IKE, `on_udp` hands such datagrams to the control thread
                // before they reach the engine): counted, ignored.
                if self.limiter.check("ike", now).is_some() {
                    let _cold = crate::alloc_count::cold();
                    tracing::info!(
                        "ignoring IKE packet from {from}: no connection of this gateway uses IKE"
                    );
                }
            }
            Ok(Received::Dummy | Received::Keepalive | Received::Observed) => {}
            Err(d) => self.report(&d),
        }
    }

    /// Receives up to `batch` datagrams from the UDP socket, many per
    /// `recvmmsg` call (a flood of junk from many senders costs one system
    /// call per [`RECV_SLOTS`] datagrams, not one each); with `UDP_GRO` one
    /// datagram read may hold many of one sender, cut at the segment size
    /// the kernel reports. Each one's head is copied into `buf` (which has
    /// the headroom for the synthetic outer header the core expects) and
    /// it is processed alone, its body decrypted from where it was read.
    fn on_udp(&mut self, rx: &mut RecvBatch, buf: &mut PacketBuf, co: &mut Coalescer) {
        let sockets = self.w.sockets;
        let Some(u) = &sockets.udp else { return };
        let listen = u.local;
        let unspecified = if listen.is_ipv6() {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        };
        let mut read = 0;
        let mut outer = UdpOuter::default();
        // Bounded: at most `batch` calls, fewer as datagrams arrive.
        for _ in 0..self.w.batch {
            if read >= self.w.batch {
                break;
            }
            let t = self.cost_clock();
            let got = match rx.recv(u.as_fd()) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors reported on the socket (port unreachable
                    // from a peer that is down) and the like.
                    tracing::debug!("UDP receive: {e}");
                    continue;
                }
            };
            self.cost_received(t, Dir::Inbound);
            self.clock = Some(self.w.start.elapsed());
            read += got;
            for i in 0..got {
                let Some((data, meta)) = rx.get(i) else {
                    // Longer than 64 KiB cannot be UDP: counted, dropped.
                    self.counters.net_rx.incr();
                    self.io_drop(DropReason::TooBig, |f| {
                        write!(f, "UDP datagram larger than the receive buffer")
                    });
                    continue;
                };
                let src = meta.src.unwrap_or(SocketAddr::new(unspecified, 0));
                let dst = SocketAddr::new(meta.dst.unwrap_or(listen.ip()), listen.port());
                let seg = meta.gro_size.map_or(data.len(), usize::from).max(1);
                if data.len() > seg {
                    self.counters.gro_reads.incr();
                }
                for d in data.chunks(seg) {
                    if self.w.ike.is_some() && d.len() > 4 && d[..4] == [0; 4] {
                        self.hand_to_ike(dst, src, &d[4..]);
                        continue;
                    }
                    buf.load_head(d);
                    if let Err(e) = outer.push(buf, src, dst, meta.tos.unwrap_or(0)) {
                        self.counters.net_rx.incr();
                        let len = d.len();
                        self.io_drop(e, |f| write!(f, "datagram from {src} ({len} bytes)"));
                        continue;
                    }
                    self.receive(buf, d, src.ip(), co);
                }
            }
        }
        self.clock = None;
        self.flush_tun(co);
    }

    /// IKE behind the non-ESP marker (RFC 3948 §2.2): to the IKE engine
    /// on the control thread (not the hot path; allocating is fine).
    fn hand_to_ike(&mut self, dst: SocketAddr, src: SocketAddr, msg: &[u8]) {
        self.counters.net_rx.incr();
        self.counters.ike.incr();
        let Some(q) = &self.w.ike else { return };
        let _cold = crate::alloc_count::cold();
        let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        if q.try_send((canon(dst), canon(src), msg.to_vec())).is_err() {
            let cap = q.max_capacity();
            self.io_drop(DropReason::IkeQueueFull, |f| {
                write!(
                    f,
                    "IKE message from {src}: {cap} already waiting for the IKE engine"
                )
            });
        }
    }

    /// Receives up to `batch` packets from a raw ESP/AH socket, many per
    /// `recvmmsg` call, like [`Round::on_udp`].
    fn on_raw(&mut self, r: &RawRx, rx: &mut RecvBatch, buf: &mut PacketBuf, co: &mut Coalescer) {
        let mut read = 0;
        for _ in 0..self.w.batch {
            if read >= self.w.batch {
                break;
            }
            let t = self.cost_clock();
            let got = match rx.recv(r.as_fd()) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("raw receive: {e}");
                    continue;
                }
            };
            self.cost_received(t, Dir::Inbound);
            self.clock = Some(self.w.start.elapsed());
            read += got;
            for i in 0..got {
                let Some((data, meta)) = rx.get(i) else {
                    self.counters.net_rx.incr();
                    self.io_drop(DropReason::TooBig, |f| {
                        write!(f, "raw packet larger than the receive buffer")
                    });
                    continue;
                };
                let n = data.len();
                buf.load_head(data);
                let from = meta
                    .src
                    .map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |s| s.ip());
                if r.v6 {
                    let v6 = |a: Option<IpAddr>| match a {
                        Some(IpAddr::V6(v)) => v,
                        _ => Ipv6Addr::UNSPECIFIED,
                    };
                    let dst = v6(meta.dst);
                    if let Err(d) =
                        push_ipv6_outer(buf, v6(Some(from)), dst, r.proto, meta.tos.unwrap_or(0))
                    {
                        self.counters.net_rx.incr();
                        self.io_drop(d, |f| write!(f, "packet from {from} ({n} bytes)"));
                        continue;
                    }
                }
                self.receive(buf, data, from, co);
            }
        }
        self.clock = None;
        self.flush_tun(co);
    }
}

/// Where the UDP payload of an outer IPv4/IPv6 UDP packet lies, its DS
/// byte, and where it goes: the destination address and port the engine
/// wrote from the SA, which for a peer behind a NAT is the port the NAT
/// chose (learnt by IKE, RFC 7296 §2.23), not the configured one.
fn udp_payload(pkt: &[u8]) -> Option<((usize, usize), u8, SocketAddr)> {
    let info = ip::parse(pkt).ok()?;
    if info.protocol != proto::UDP {
        return None;
    }
    let at = info.payload_offset + udp::HEADER_LEN;
    if !(at <= info.packet_len && info.packet_len <= pkt.len()) {
        return None;
    }
    let port = u16::from_be_bytes([pkt[info.payload_offset + 2], pkt[info.payload_offset + 3]]);
    Some((
        (at, info.packet_len),
        info.tos,
        SocketAddr::new(info.dst, port),
    ))
}

/// The core's view of a virtio-net header read from the TUN; `None` for a
/// GSO type the data plane does not handle (UFO; ECN-marked TSO is handled
/// like plain TSO: the CWR flag is in the TCP header it copies).
fn gso_info(h: &VirtioNetHdr) -> Option<GsoInfo> {
    Some(GsoInfo {
        kind: GsoKind::from_virtio(h.gso_type).ok()?,
        needs_csum: h.flags & VirtioNetHdr::F_NEEDS_CSUM != 0,
        hdr_len: h.hdr_len,
        gso_size: h.gso_size,
        csum_start: h.csum_start,
        csum_offset: h.csum_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Places and adds a datagram as `Round::protect` does, without the
    /// send a `SendFirst` asks for. True when the batch is full.
    fn push(tx: &mut TxBatch, dst: SocketAddr, tos: u8, span: (usize, usize)) -> bool {
        let place = tx.place(dst, None, tos, span.1 - span.0);
        tx.push_udp(place, dst, None, tos, span)
    }

    #[test]
    fn a_hold_reads_the_clock_once_per_few_kilobytes_and_starts_with_the_output() {
        let mut h = Hold::default();
        let t = |us| Duration::from_micros(us);
        // Full-size packets: a look at the clock every sixth one.
        let looks: Vec<bool> = (0..12).map(|i| h.add(i == 0, t(10 + i), 1400)).collect();
        assert_eq!(looks.iter().filter(|&&l| l).count(), 2, "{looks:?}");
        assert!(looks[5] && looks[11], "{looks:?}");
        // The output's start is its first packet's time, not a later one's.
        assert_eq!(h.since, t(10));
        assert!(!h.add(true, t(500), 64));
        assert_eq!(h.since, t(500));
        // A round of 64 small packets never reads the clock.
        let mut h = Hold::default();
        assert!((0..64).all(|i| !h.add(i == 0, t(0), 64)));
    }

    /// Would this datagram send the batch first?
    fn completes(tx: &TxBatch, dst: SocketAddr, len: usize) -> bool {
        tx.place(dst, None, 0, len) == Place::SendFirst
    }

    /// The slots of each run, in the order they leave.
    fn slots(tx: &TxBatch) -> Vec<Vec<usize>> {
        tx.runs[..tx.nruns]
            .iter()
            .map(|r| {
                let mut v = vec![r.first];
                while v.len() < r.len {
                    v.push(tx.next[*v.last().unwrap()]);
                }
                assert_eq!(*v.last().unwrap(), r.last);
                v
            })
            .collect()
    }

    /// The runs a batch forms: a peer's full-size datagrams join its newest
    /// run even with another peer's in between, until a shorter one closes
    /// it; another TOS or source starts a run, and a packet for a peer
    /// whose newest run cannot take it starts one after it (never joins an
    /// older one: one destination's packets keep their order); raw packets
    /// gather per connection and peer; without GSO every datagram is a
    /// message of its own.
    #[test]
    fn a_batch_gathers_each_peers_packets_and_keeps_their_order() {
        let (p, q) = (at("192.0.2.2:4500"), at("192.0.2.3:4500"));
        let mut tx = TxBatch::new(true, 12, 1500);
        let pushes = [
            (p, 0, 100),    // 0: run 0
            (q, 0, 100),    // 1: run 1
            (p, 0, 100),    // 2: run 0
            (q, 0, 100),    // 3: run 1
            (p, 0x2e, 100), // 4: run 2 (another TOS)
            (p, 0, 100),    // 5: run 3 (p's newest run has the other TOS)
            (q, 0, 60),     // 6: run 1, now closed
            (q, 0, 100),    // 7: run 4
            (p, 0, 100),    // 8: run 3
        ];
        for (k, &(dst, tos, len)) in pushes.iter().enumerate() {
            assert!(!push(&mut tx, dst, tos, (8, 8 + len)), "full at {k}");
        }
        assert_eq!(
            slots(&tx),
            [vec![0, 2], vec![1, 3, 6], vec![4], vec![5, 8], vec![7]]
        );
        let runs: Vec<_> = tx.runs[..tx.nruns]
            .iter()
            .map(|r| (r.dst, r.tos, r.seg, r.bytes, r.closed))
            .collect();
        assert_eq!(
            runs,
            [
                (p, 0, 100, 200, false),
                (q, 0, 100, 260, true),
                (p, 0x2e, 100, 100, false),
                (p, 0, 100, 200, false),
                (q, 0, 100, 100, false),
            ]
        );
        // q's newest run (4) is open, p's (3) too: nothing completes (the
        // batch is sent first only then); a longer datagram than p's
        // segments would complete p's.
        assert!(!completes(&tx, q, 100) && !completes(&tx, p, 100));
        assert!(completes(&tx, p, 101));
        let mut short = TxBatch::new(true, 8, 1500);
        push(&mut short, q, 0, (0, 100));
        assert!(!completes(&short, q, 100));
        push(&mut short, q, 0, (0, 50));
        assert!(completes(&short, q, 100), "a short datagram closed q's run");
        assert!(
            !completes(&short, p, 100),
            "another peer's run is no matter"
        );

        let (r1, r2) = ("192.0.2.9".parse().unwrap(), "192.0.2.8".parse().unwrap());
        assert!(!tx.push_raw(3, r1));
        assert!(!tx.push_raw(4, r2));
        assert!(tx.push_raw(3, r1), "the 12th slot fills it");
        assert_eq!(&slots(&tx)[5..], [vec![9, 11], vec![10]]);
        assert_eq!(tx.runs[5].raw, Some((3, r1)));

        // A peer whose run is further back than RUN_LOOKBACK runs starts
        // a new one (the search per packet stays bounded).
        let mut many = TxBatch::new(true, 64, 1500);
        let peer = |k: usize| at(&format!("192.0.2.{}:4500", 10 + k));
        for k in 0..RUN_LOOKBACK {
            push(&mut many, peer(k), 0, (0, 100));
        }
        push(&mut many, peer(0), 0, (0, 100));
        assert_eq!(many.nruns, RUN_LOOKBACK, "the 16th run back is found");
        push(&mut many, peer(RUN_LOOKBACK), 0, (0, 100));
        push(&mut many, peer(RUN_LOOKBACK + 1), 0, (0, 100));
        push(&mut many, peer(1), 0, (0, 100));
        assert_eq!(many.nruns, RUN_LOOKBACK + 3, "the 17th is not");

        let mut off = TxBatch::new(false, 64, 1500);
        for _ in 0..3 {
            push(&mut off, p, 0, (0, 100));
        }
        assert_eq!(off.nruns, 3, "without GSO every datagram is a message");
    }

    use proptest::prelude::*;

    /// A datagram in the property test below: ESP in UDP to peer `dst`
    /// with `tos` from `src`, `len` bytes; or raw, for connection `ci`.
    #[derive(Debug, Clone, Copy)]
    enum Out {
        Udp {
            dst: u8,
            tos: u8,
            src: bool,
            len: usize,
        },
        Raw {
            ci: usize,
        },
    }

    /// Runs `outs` through a batch the way the worker does (`place`, the
    /// batch sent first on `SendFirst` and when full, the rest at the
    /// end) and returns each sent batch's runs as the indices into `outs`
    /// of their datagrams, in the order they leave, each with its run.
    fn send_all(outs: &[Out], gso: bool, max: usize) -> Vec<Vec<(Run, Vec<usize>)>> {
        let dst = |d: u8| SocketAddr::new(IpAddr::V4([198, 51, 100, d].into()), 4500);
        let src = |s: bool| s.then(|| IpAddr::V4([203, 0, 113, 1].into()));
        let mut tx = TxBatch::new(gso, max, 1500);
        let mut ids = [usize::MAX; GSO_MAX];
        let mut sent = Vec::new();
        let mut send = |tx: &mut TxBatch, ids: &[usize; GSO_MAX]| {
            let runs = tx.runs[..tx.nruns].to_vec();
            let batch: Vec<_> = runs
                .into_iter()
                .zip(slots(tx))
                .map(|(r, s)| (r, s.iter().map(|&slot| ids[slot]).collect()))
                .collect();
            if !batch.is_empty() {
                sent.push(batch);
            }
            tx.n = 0;
            tx.nruns = 0;
        };
        for (k, o) in outs.iter().enumerate() {
            let full = match *o {
                Out::Udp {
                    dst: d,
                    tos,
                    src: s,
                    len,
                } => {
                    let place = tx.place(dst(d), src(s), tos, len);
                    if place == Place::SendFirst {
                        send(&mut tx, &ids);
                    }
                    ids[tx.n] = k;
                    tx.push_udp(place, dst(d), src(s), tos, (8, 8 + len))
                }
                Out::Raw { ci } => {
                    ids[tx.n] = k;
                    tx.push_raw(ci, IpAddr::V4([198, 51, 100, 200].into()))
                }
            };
            if full {
                send(&mut tx, &ids);
            }
        }
        send(&mut tx, &ids);
        sent
    }

    /// Mostly ESP-in-UDP datagrams, most of them full-size (a TCP
    /// super-segment's), to up to 20 peers; some raw packets.
    fn out() -> impl Strategy<Value = Out> {
        prop_oneof![
            8 => (0u8..20, 0u8..2, any::<bool>(), prop_oneof![3 => Just(1400usize), 1 => 1usize..1500])
                .prop_map(|(dst, tos, src, len)| Out::Udp { dst, tos, src, len }),
            1 => (0usize..2).prop_map(|ci| Out::Raw { ci }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever a round holds (up to 20 peers, two TOS values, two
        /// sources, raw packets, any lengths, with or without GSO, any
        /// batch size): every datagram leaves exactly once; each
        /// destination's datagrams leave in the order they came (so every
        /// SA's sequence numbers do); every run is a valid GSO send (one
        /// peer, TOS and source; equal segments but a shorter last one;
        /// within the batch size and the GSO byte limit); and one peer
        /// under one TOS makes one run per batch, as before runs were
        /// gathered.
        #[test]
        fn any_round_leaves_once_in_order_in_valid_runs(
            outs in proptest::collection::vec(out(), 1..300),
            peers in prop_oneof![1 => Just(1u8), 3 => 1u8..=20],
            gso in any::<bool>(),
            max in 1usize..=GSO_MAX,
        ) {
            // Fold the peers into `peers` of them; one peer also gets one
            // TOS and source, so that some rounds are one peer's traffic.
            let one = peers == 1;
            let outs: Vec<Out> = outs
                .into_iter()
                .map(|o| match o {
                    Out::Udp { dst, tos, src, len } => Out::Udp {
                        dst: dst % peers,
                        tos: if one { 0 } else { tos },
                        src: src && !one,
                        len,
                    },
                    raw => raw,
                })
                .collect();
            let sent = send_all(&outs, gso, max);
            let order: Vec<usize> = sent.iter().flatten().flat_map(|(_, ids)| ids.clone()).collect();
            let mut all = order.clone();
            all.sort_unstable();
            prop_assert_eq!(all, (0..outs.len()).collect::<Vec<_>>(), "each leaves once");
            // Per destination (a peer, or a raw connection), in order.
            let key = |o: &Out| match *o {
                Out::Udp { dst, .. } => u16::from(dst),
                Out::Raw { ci } => 1000 + ci as u16,
            };
            let mut last = std::collections::HashMap::new();
            for &k in &order {
                if let Some(&prev) = last.get(&key(&outs[k])) {
                    prop_assert!(prev < k, "datagram {} left after {}", prev, k);
                }
                last.insert(key(&outs[k]), k);
            }
            for batch in &sent {
                prop_assert!(batch.iter().map(|(r, _)| r.len).sum::<usize>() <= max);
                for (r, ids) in batch {
                    prop_assert_eq!(r.len, ids.len());
                    prop_assert!(!ids.is_empty());
                    match outs[ids[0]] {
                        Out::Raw { ci } => {
                            for &k in ids {
                                let same = matches!(outs[k], Out::Raw { ci: c } if c == ci);
                                prop_assert!(same, "one connection per raw run");
                            }
                        }
                        Out::Udp { dst, tos, src, .. } => {
                            prop_assert!(gso || ids.len() == 1, "no GSO: one datagram per message");
                            let lens: Vec<usize> = ids
                                .iter()
                                .map(|&k| match outs[k] {
                                    Out::Udp { dst: d, tos: t, src: s, len } => {
                                        assert_eq!((d, t, s), (dst, tos, src), "one peer, TOS, source");
                                        len
                                    }
                                    Out::Raw { .. } => panic!("a raw packet in a UDP run"),
                                })
                                .collect();
                            prop_assert_eq!(r.seg, lens[0]);
                            prop_assert!(lens[..lens.len() - 1].iter().all(|&l| l == r.seg));
                            prop_assert!(lens[lens.len() - 1] <= r.seg);
                            prop_assert_eq!(r.bytes, lens.iter().sum::<usize>());
                            prop_assert!(r.bytes <= GSO_BYTES);
                        }
                    }
                }
                // A batch of one peer's datagrams under one TOS and source
                // is one run, as before runs were gathered.
                let keys: std::collections::HashSet<_> = batch
                    .iter()
                    .flat_map(|(_, ids)| ids)
                    .map(|&k| match outs[k] {
                        Out::Udp { dst, tos, src, .. } => Some((dst, tos, src)),
                        Out::Raw { .. } => None,
                    })
                    .collect();
                if gso && keys.len() == 1 && !keys.contains(&None) {
                    prop_assert_eq!(batch.len(), 1, "one peer: one run per batch");
                }
            }
        }
    }
}
