//! `espgate bench parallel`: parallel crypto for ONE SA with in-order
//! delivery, measured against the serial loop on this machine.
//!
//! Seed 001's "future work": one big flow on one SA is limited by one core
//! doing its cryptography serially. The proposal measured here is the
//! classic one — spread the packets of that SA over `T` crypto threads and
//! put them back in order before they leave:
//!
//! - the **dispatcher** (the calling thread) copies each clear packet into
//!   a preallocated buffer as a TUN read would, stamps it with its dispatch
//!   number (inner IPv4 identification and the first payload bytes, so the
//!   check below can tell packets apart), and hands batches of `batch`
//!   packets round-robin to the crypto threads through bounded
//!   [`std::sync::mpsc::sync_channel`]s;
//! - each **crypto thread** owns a copy of the outbound SA (same SPI and
//!   keys) joined to one [`SharedSeq`], so every packet takes a distinct
//!   ESP sequence number with one atomic operation, whichever thread
//!   encrypts it (no AEAD nonce is ever reused), and sends the batch back;
//! - the **reorder stage** (on the dispatcher thread) puts finished batches
//!   in a reorder buffer indexed by batch number and delivers packets
//!   strictly in dispatch order; a delivered batch's buffers go back to
//!   the free list and are refilled. Nothing is allocated per packet.
//!
//! The number of batches in flight is fixed (the pool), so every queue is
//! bounded and no send ever blocks; the reorder buffer has one slot per
//! batch of the pool.
//!
//! Sequence numbers are taken when a thread encrypts, not when the
//! dispatcher reads, so on the wire (in dispatch order) they are not
//! monotonic: a packet can trail the highest number already sent by up to
//! about the number of packets in flight. The receiving peer's replay
//! window must cover that (`max_seq_lag`, measured in the check, says how
//! far it went).
//!
//! Measured in one run, repetitions interleaved and medians reported: the
//! plain serial loop (`mode` `serial`, `threads` 0: load, stamp,
//! encapsulate, deliver on one thread, as `bench esp` does plus the stamp)
//! and the threaded pipeline for every `threads` × `batch` asked, `threads`
//! 1 being the same code path with a single crypto thread (what the
//! hand-off alone costs, or gains by overlapping the copy with the
//! crypto). `speedup_vs_serial` = serial ns per packet / this row's.
//!
//! Each row also has the process's CPU time per packet (all threads, and
//! the crypto threads alone) and how many CPUs it kept busy, so that a
//! row can be read on a shared machine: a threaded row with `cpus` near
//! 1 did not get a second core, whatever its speed says.
//!
//! Before timing, every configuration is checked: a few thousand packets
//! are pushed through it and the in-order output is fed to a receiving SA;
//! every packet must decrypt to the clear packet stamped with its position
//! (so order, completeness and integrity are all checked) and all ESP
//! sequence numbers must be distinct. A configuration that fails is an
//! error, not a row.

use super::{clear_packet, measure, sa, Params, Samples, CHUNK};
use anyhow::{anyhow, bail, ensure, Context, Result};
use espgate_api::table::{Column, Table};
use espgate_core::sa::{classify, Classified, Classifier, Decapsulated, Sa, SharedSeq};
use espgate_core::wire::{esp, ipv4};
use espgate_core::PacketBuf;
use serde::Serialize;
use std::collections::HashSet;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

const USAGE: &str = "\
Rows: the plain serial loop (mode serial, threads 0) and the threaded pipeline for every
--threads x --batch (mode threads), per suite and size. speedup_vs_serial = serial ns per
packet / the row's, both medians of the same interleaved run. in_flight = packets the pool
holds; max_seq_lag = how far behind the highest ESP sequence number already delivered a
packet's number was, in the check before timing (the peer's replay window must exceed it).

--json prints one JSON list of rows: suite, size, mode, threads, batch, in_flight,
ns_per_packet, mpps, gbps, speedup_vs_serial, cpu_ns_per_packet (process CPU time of all
threads per packet), cpus (CPU time / wall time), crypto_cpu_ns_per_packet (the crypto threads'
CPU time per packet; null for serial), spread, max_seq_lag.";

/// The options of `espgate bench parallel`.
#[derive(clap::Args, Debug, Clone)]
#[command(after_long_help = USAGE)]
pub struct Args {
    /// Suites (strongSwan keywords), comma-separated [default: those of
    /// `bench esp`].
    #[arg(long, value_delimiter = ',')]
    pub suite: Vec<String>,
    /// Inner packet sizes in bytes, comma-separated [default: 64, 512,
    /// 1400, 8192].
    #[arg(long, value_delimiter = ',')]
    pub size: Vec<usize>,
    /// Crypto thread counts, comma-separated [default: 1, then powers of
    /// two up to the number of CPUs, and that number].
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Packets per hand-off, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32,128")]
    pub batch: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 0.1)]
    pub seconds: f64,
    /// Repetitions per measurement (interleaved; the median is reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// One JSON list of rows instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The receiving SA's replay window in the check. The pool never holds
/// more than [`MAX_IN_FLIGHT`] packets, and the sequence numbers on the
/// wire trail by less than twice that.
const RX_WINDOW: u32 = 4096;
/// Largest pool, in packets.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Packets each crypto thread has in flight (queued, being encrypted, or
/// waiting for reordering), at least two batches.
const PER_THREAD: usize = 128;
/// How long the reorder stage waits for a batch before giving up.
const STALL: Duration = Duration::from_secs(30);
/// Packets pushed through each configuration by the check, at least.
const CHECK_PACKETS: usize = 3000;

/// What to measure.
#[derive(Debug, Clone)]
pub struct PParams {
    /// Suites, sizes, time and repetitions (the direction is outbound).
    pub base: Params,
    /// Crypto thread counts.
    pub threads: Vec<usize>,
    /// Packets per hand-off.
    pub batches: Vec<usize>,
}

/// Batches in flight per thread for a batch size: about [`PER_THREAD`]
/// packets, at least two batches (one being encrypted, one queued).
fn depth(batch: usize) -> usize {
    PER_THREAD.div_ceil(batch).max(2)
}

/// Packets the pool of `threads` × `batch` holds.
pub fn in_flight(threads: usize, batch: usize) -> usize {
    threads * depth(batch) * batch
}

fn default_threads() -> Vec<usize> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get().min(16));
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |t| Some(t * 2))
        .take_while(|t| *t <= cpus)
        .collect();
    if !v.contains(&cpus) {
        v.push(cpus);
    }
    v
}

impl PParams {
    /// Checks the options (suites, sizes, seconds and repeat as `bench esp`).
    pub fn new(
        suites: &[String],
        sizes: &[usize],
        threads: &[usize],
        batches: &[usize],
        seconds: f64,
        repeat: usize,
    ) -> Result<PParams> {
        let base = Params::new(suites, sizes, seconds, repeat, "out")?;
        let threads = if threads.is_empty() {
            default_threads()
        } else {
            threads.to_vec()
        };
        ensure!(!batches.is_empty(), "--batch: give at least one batch size");
        for &t in &threads {
            ensure!((1..=64).contains(&t), "--threads {t}: 1 to 64");
        }
        for &b in batches {
            ensure!((1..=256).contains(&b), "--batch {b}: 1 to 256");
            for &t in &threads {
                let n = in_flight(t, b);
                ensure!(
                    n <= MAX_IN_FLIGHT,
                    "--threads {t} with --batch {b}: {n} packets in flight, at most \
                     {MAX_IN_FLIGHT} (the receiving SA's replay window must cover them)"
                );
            }
        }
        Ok(PParams {
            base,
            threads,
            batches: batches.to_vec(),
        })
    }
}

/// One result row (`--json` prints a list of these).
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Suite keyword.
    pub suite: String,
    /// Inner packet size in bytes.
    pub size: usize,
    /// `serial` (the plain loop, no threads) or `threads`.
    pub mode: &'static str,
    /// Crypto threads (0 for the serial loop).
    pub threads: usize,
    /// Packets per hand-off (1 for the serial loop).
    pub batch: usize,
    /// Packets the pool holds (1 for the serial loop).
    pub in_flight: usize,
    /// Median time per packet delivered in order.
    pub ns_per_packet: f64,
    /// Million packets per second delivered in order.
    pub mpps: f64,
    /// Inner bytes per second delivered in order, in Gbit/s.
    pub gbps: f64,
    /// Serial ns per packet / this row's (1 for the serial row).
    pub speedup_vs_serial: f64,
    /// Median CPU time of the whole process (every thread, user and
    /// system) per packet delivered: what the packets cost, whatever
    /// else the machine was doing.
    pub cpu_ns_per_packet: f64,
    /// Median CPUs the process kept busy: CPU time / wall time.
    pub cpus: f64,
    /// Median CPU time of the crypto threads alone per packet (`None` for
    /// the serial loop): against the serial row's `cpu_ns_per_packet`, what
    /// the hand-off costs on the crypto side (queue operations, waiting,
    /// buffers written by another core); the rest of `cpu_ns_per_packet`
    /// is the dispatcher and reorder stage.
    pub crypto_cpu_ns_per_packet: Option<f64>,
    /// The spread of the repetitions: (max − min) / median.
    pub spread: f64,
    /// In the check before timing: the largest distance between a
    /// packet's ESP sequence number and the highest one delivered before
    /// it (0 when they are in order).
    pub max_seq_lag: u64,
}

/// CPU time consumed so far by every thread of this process
/// (`CLOCK_PROCESS_CPUTIME_ID`) or by the calling thread
/// (`CLOCK_THREAD_CPUTIME_ID`).
fn cpu_clock(clock: rustix::time::ClockId) -> Duration {
    let ts = rustix::time::clock_gettime(clock);
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

fn process_cpu() -> Duration {
    cpu_clock(rustix::time::ClockId::ProcessCPUTime)
}

/// The repetitions of one configuration: wall ns per packet (timed
/// chunks only, as `bench esp`), process CPU ns per packet, CPUs busy and
/// the crypto threads' CPU ns per packet (over the whole measurement,
/// warm-up included).
#[derive(Debug, Default, Clone)]
struct Series {
    wall: Samples,
    cpu: Samples,
    cpus: Samples,
    crypto_cpu: Samples,
}

impl Series {
    /// `crypto_cpu` returns the crypto threads' CPU time so far in ns
    /// (`None` for the serial loop, which has none).
    fn measure(
        &mut self,
        time: Duration,
        mut chunk: impl FnMut() -> Result<usize>,
        crypto_cpu: impl Fn() -> Option<u64>,
    ) -> Result<()> {
        let (cpu0, wall0, crypto0) = (process_cpu(), std::time::Instant::now(), crypto_cpu());
        let mut packets = 0usize;
        let ns = measure(time, || {
            let n = chunk()?;
            packets += n;
            Ok(n)
        })?;
        let (cpu, wall) = (process_cpu().saturating_sub(cpu0), wall0.elapsed());
        let packets = packets.max(1) as f64;
        self.wall.0.push(ns);
        self.cpu.0.push(cpu.as_nanos() as f64 / packets);
        self.cpus
            .0
            .push(cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9));
        if let (Some(a), Some(b)) = (crypto0, crypto_cpu()) {
            self.crypto_cpu.0.push(b.saturating_sub(a) as f64 / packets);
        }
        Ok(())
    }
}

/// Writes dispatch number `n` into the clear packet in `pkt`: its low 16
/// bits into the IPv4 identification (checksum updated), and up to 8 bytes
/// (little-endian) at the start of the UDP payload.
fn stamp(pkt: &mut [u8], n: u64) {
    pkt[4..6].copy_from_slice(&(n as u16).to_be_bytes());
    if let Ok(mut h) = ipv4::Ipv4::new_header_checked(&mut pkt[..]) {
        h.fill_checksum();
    }
    let room = pkt.len().saturating_sub(28).min(8);
    pkt[28..28 + room].copy_from_slice(&n.to_le_bytes()[..room]);
}

/// The clear packet `n` should decrypt to.
fn stamped(clear: &[u8], n: u64) -> Vec<u8> {
    let mut p = clear.to_vec();
    stamp(&mut p, n);
    p
}

/// Where delivered packets go: `(dispatch number, ESP packet)`.
trait Sink {
    fn deliver(&mut self, n: u64, pkt: &PacketBuf);
}

/// The timed runs' sink: the packet is looked at, not kept.
struct Discard;

impl Sink for Discard {
    #[inline]
    fn deliver(&mut self, n: u64, pkt: &PacketBuf) {
        black_box((n, pkt.len()));
    }
}

/// The check's sink: every packet kept, in delivery order.
#[derive(Default)]
struct Collect(Vec<(u64, Vec<u8>)>);

impl Sink for Collect {
    fn deliver(&mut self, n: u64, pkt: &PacketBuf) {
        self.0.push((n, pkt.as_slice().to_vec()));
    }
}

/// The plain loop: load, stamp, encapsulate, deliver, one packet at a time.
struct Serial {
    clear: Vec<u8>,
    tx: Sa,
    buf: PacketBuf,
    next: u64,
}

impl Serial {
    fn new(suite: espgate_core::crypto::Suite, size: usize) -> Result<Serial> {
        Ok(Serial {
            clear: clear_packet(size),
            tx: sa(suite, 1024)?,
            buf: PacketBuf::with_capacity(9216),
            next: 0,
        })
    }

    fn run(&mut self, n: usize, sink: &mut impl Sink) -> Result<usize> {
        for _ in 0..n {
            self.buf.load(&self.clear);
            stamp(self.buf.as_mut_slice(), self.next);
            self.tx
                .encapsulate(&mut self.buf, Duration::ZERO)
                .map_err(|d| anyhow!("serial outbound: {}", d.as_str()))?;
            sink.deliver(self.next, &self.buf);
            self.next += 1;
        }
        Ok(n)
    }
}

/// A batch of packets travelling dispatcher → crypto thread → reorder.
struct Batch {
    /// Batch number (dispatch order).
    seq: u64,
    /// Dispatch number of the first packet.
    first: u64,
    bufs: Vec<PacketBuf>,
    /// Why encapsulation failed, if it did.
    err: Option<&'static str>,
}

/// The threaded pipeline: dispatcher and reorder stage on the caller's
/// thread, `threads` crypto threads.
struct Threaded {
    clear: Vec<u8>,
    batch: usize,
    to: Vec<SyncSender<Batch>>,
    done: Receiver<Batch>,
    free: Vec<Batch>,
    /// Finished batches waiting for their turn, at `seq % len`.
    reorder: Vec<Option<Batch>>,
    /// Next batch to dispatch / to deliver.
    next_batch: u64,
    next_deliver: u64,
    /// Dispatch number of the next packet.
    next_packet: u64,
    workers: Vec<JoinHandle<()>>,
    /// Each crypto thread's CPU time in ns, as of its last batch.
    cpu: Vec<Arc<AtomicU64>>,
}

/// A crypto thread: encapsulates each batch it is given and sends it
/// back; after each batch, publishes its own CPU time so far in `cpu`.
fn crypto_thread(mut sa: Sa, rx: Receiver<Batch>, done: SyncSender<Batch>, cpu: Arc<AtomicU64>) {
    while let Ok(mut b) = rx.recv() {
        for buf in &mut b.bufs {
            if let Err(d) = sa.encapsulate(buf, Duration::ZERO) {
                b.err = Some(d.as_str());
                break;
            }
        }
        let t = cpu_clock(rustix::time::ClockId::ThreadCPUTime);
        cpu.store(t.as_nanos() as u64, Ordering::Relaxed);
        if done.send(b).is_err() {
            return;
        }
    }
}

impl Threaded {
    fn new(
        suite: espgate_core::crypto::Suite,
        size: usize,
        threads: usize,
        batch: usize,
    ) -> Result<Threaded> {
        ensure!(threads >= 1 && batch >= 1, "at least one thread and packet");
        let depth = depth(batch);
        let slots = threads * depth;
        let clear = clear_packet(size);
        let (done_tx, done) = sync_channel(slots);
        let mut first = sa(suite, 1024)?;
        let shared: Arc<SharedSeq> = first.share_seq();
        let mut sas = vec![first];
        for _ in 1..threads {
            let mut s = sa(suite, 1024)?;
            s.join_seq(shared.clone());
            sas.push(s);
        }
        let (mut to, mut workers, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
        for (i, s) in sas.into_iter().enumerate() {
            // Round-robin dispatch and a pool of `slots` consecutive
            // batches: a thread never has more than `depth` at once.
            let (tx, rx) = sync_channel(depth);
            let done = done_tx.clone();
            let c = Arc::new(AtomicU64::new(0));
            let c2 = c.clone();
            let h = std::thread::Builder::new()
                .name(format!("espgate-crypto{i}"))
                .spawn(move || crypto_thread(s, rx, done, c2))
                .context("spawning a crypto thread")?;
            cpu.push(c);
            to.push(tx);
            workers.push(h);
        }
        let free = (0..slots)
            .map(|_| Batch {
                seq: 0,
                first: 0,
                bufs: (0..batch)
                    .map(|_| PacketBuf::with_capacity(size.max(1500)))
                    .collect(),
                err: None,
            })
            .collect();
        Ok(Threaded {
            clear,
            batch,
            to,
            done,
            free,
            reorder: (0..slots).map(|_| None).collect(),
            next_batch: 0,
            next_deliver: 0,
            next_packet: 0,
            workers,
            cpu,
        })
    }

    /// Fills every free batch with the next packets and hands it to its
    /// thread (never blocks: a thread's queue holds its whole share).
    fn dispatch(&mut self) -> Result<()> {
        while let Some(mut b) = self.free.pop() {
            b.seq = self.next_batch;
            b.first = self.next_packet;
            b.err = None;
            for buf in &mut b.bufs {
                buf.load(&self.clear);
                stamp(buf.as_mut_slice(), self.next_packet);
                self.next_packet += 1;
            }
            let t = (self.next_batch % self.to.len() as u64) as usize;
            self.to[t]
                .send(b)
                .map_err(|_| anyhow!("crypto thread {t} has stopped"))?;
            self.next_batch += 1;
        }
        Ok(())
    }

    fn park(&mut self, b: Batch) -> Result<()> {
        let i = (b.seq % self.reorder.len() as u64) as usize;
        ensure!(
            self.reorder[i].is_none(),
            "reorder slot {i} taken twice (batch {})",
            b.seq
        );
        self.reorder[i] = Some(b);
        Ok(())
    }

    /// Waits for one finished batch, takes whatever else is finished, and
    /// delivers what is now in order; returns the packets delivered.
    fn collect(&mut self, sink: &mut impl Sink) -> Result<usize> {
        // Bounded: a batch takes microseconds; a thread that never answers
        // is an error, not a hang.
        let b = self.done.recv_timeout(STALL).map_err(|e| match e {
            RecvTimeoutError::Timeout => anyhow!("no crypto thread answered for {STALL:?}"),
            RecvTimeoutError::Disconnected => anyhow!("every crypto thread has stopped"),
        })?;
        self.park(b)?;
        while let Ok(b) = self.done.try_recv() {
            self.park(b)?;
        }
        let mut n = 0;
        loop {
            let i = (self.next_deliver % self.reorder.len() as u64) as usize;
            let Some(b) = self.reorder[i].take() else {
                return Ok(n);
            };
            if let Some(e) = b.err {
                bail!("outbound, batch {}: {e}", b.seq);
            }
            for (k, buf) in b.bufs.iter().enumerate() {
                sink.deliver(b.first + k as u64, buf);
            }
            n += b.bufs.len();
            self.next_deliver += 1;
            self.free.push(b);
        }
    }

    /// Delivers at least `batches` batches in order, keeping the pool full
    /// (packets stay in flight between calls); returns the packets delivered.
    fn run(&mut self, batches: u64, sink: &mut impl Sink) -> Result<usize> {
        let target = self.next_deliver + batches;
        let mut n = 0;
        // Bounded: each turn delivers or waits for a batch of the pool.
        while self.next_deliver < target {
            self.dispatch()?;
            n += self.collect(sink)?;
        }
        Ok(n)
    }

    /// Delivers everything in flight without dispatching more.
    fn drain(&mut self, sink: &mut impl Sink) -> Result<usize> {
        let mut n = 0;
        while self.next_deliver < self.next_batch {
            n += self.collect(sink)?;
        }
        Ok(n)
    }

    fn chunk(&self) -> u64 {
        CHUNK.div_ceil(self.batch) as u64
    }
}

impl std::ops::Drop for Threaded {
    fn drop(&mut self) {
        // Closing the queues stops the threads once they are empty.
        self.to.clear();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// The check's verdict on an in-order output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Checked {
    packets: usize,
    max_seq_lag: u64,
}

/// Feeds `out` to a fresh receiving SA: packet `i` must carry dispatch
/// number `i` and decrypt to the clear packet stamped `i`, and all ESP
/// sequence numbers must be distinct.
fn verify(
    suite: espgate_core::crypto::Suite,
    size: usize,
    out: &[(u64, Vec<u8>)],
) -> Result<Checked> {
    ensure!(!out.is_empty(), "{suite} {size} B: nothing was delivered");
    let clear = clear_packet(size);
    let mut rx = sa(suite, RX_WINDOW)?;
    let mut buf = PacketBuf::with_capacity(9216);
    let mut seen = HashSet::with_capacity(out.len());
    let (mut top, mut lag) = (0u64, 0u64);
    for (i, (n, wire)) in out.iter().enumerate() {
        let i = i as u64;
        ensure!(
            *n == i,
            "{suite} {size} B: packet {i} delivered as number {n}"
        );
        let Ok(Classified::Ipsec(inb)) = classify(wire, &Classifier::NAT_T) else {
            bail!("{suite} {size} B: packet {i} does not classify as ESP");
        };
        let hdr = wire
            .get(inb.offset..inb.end)
            .ok_or_else(|| anyhow!("{suite} {size} B: packet {i}: bad length"))?;
        let seq = u64::from(
            esp::Esp::new_checked(hdr)
                .map_err(|d| anyhow!("{suite} {size} B: packet {i}: {}", d.as_str()))?
                .seq(),
        );
        ensure!(
            seen.insert(seq),
            "{suite} {size} B: sequence number {seq} used twice (packet {i})"
        );
        top = top.max(seq);
        lag = lag.max(top - seq);
        buf.load(wire);
        match rx.decapsulate(&mut buf, &inb, Duration::ZERO) {
            Ok(Decapsulated::Packet) => {}
            Ok(Decapsulated::Dummy) => bail!("{suite} {size} B: packet {i} is a dummy"),
            Err(d) => bail!("{suite} {size} B: packet {i} (seq {seq}): {}", d.as_str()),
        }
        ensure!(
            buf.as_slice() == stamped(&clear, i).as_slice(),
            "{suite} {size} B: packet {i} does not decrypt to clear packet {i} (out of order?)"
        );
    }
    Ok(Checked {
        packets: out.len(),
        max_seq_lag: lag,
    })
}

fn check_serial(
    s: &mut Serial,
    suite: espgate_core::crypto::Suite,
    size: usize,
) -> Result<Checked> {
    let mut c = Collect::default();
    s.run(CHECK_PACKETS, &mut c)?;
    verify(suite, size, &c.0)
}

fn check_threaded(
    t: &mut Threaded,
    suite: espgate_core::crypto::Suite,
    size: usize,
    packets: usize,
) -> Result<Checked> {
    let mut c = Collect::default();
    t.run(packets.div_ceil(t.batch) as u64, &mut c)?;
    t.drain(&mut c)?;
    ensure!(
        c.0.len() as u64 == t.next_packet,
        "{suite} {size} B: {} packets dispatched, {} delivered",
        t.next_packet,
        c.0.len()
    );
    verify(suite, size, &c.0)
}

/// `espgate bench parallel`.
pub fn run(p: &PParams, mut progress: impl FnMut(&str)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let configs: Vec<(usize, usize)> = p
        .threads
        .iter()
        .flat_map(|&t| p.batches.iter().map(move |&b| (t, b)))
        .collect();
    for &suite in &p.base.suites {
        for &size in &p.base.sizes {
            progress(&format!("parallel {suite} {size} B: check"));
            let mut serial = Serial::new(suite, size)?;
            let serial_lag = check_serial(&mut serial, suite, size)?.max_seq_lag;
            ensure!(
                serial_lag == 0,
                "{suite} {size} B: the serial loop reordered"
            );
            let mut piped = Vec::new();
            for &(t, b) in &configs {
                let mut th = Threaded::new(suite, size, t, b)?;
                let c = check_threaded(&mut th, suite, size, CHECK_PACKETS)
                    .with_context(|| format!("{t} threads, batch {b}"))?;
                piped.push((th, c.max_seq_lag, Series::default()));
            }
            let mut serial_s = Series::default();
            for r in 0..p.base.repeat {
                progress(&format!(
                    "parallel {suite} {size} B: repetition {}/{}",
                    r + 1,
                    p.base.repeat
                ));
                serial_s.measure(p.base.time, || serial.run(CHUNK, &mut Discard), || None)?;
                for (th, _, s) in &mut piped {
                    let chunk = th.chunk();
                    let cpu = th.cpu.clone();
                    let crypto_cpu = || Some(cpu.iter().map(|c| c.load(Ordering::Relaxed)).sum());
                    s.measure(p.base.time, || th.run(chunk, &mut Discard), crypto_cpu)?;
                    th.drain(&mut Discard)?;
                }
            }
            let base = serial_s.wall.median();
            let row = |mode, threads, batch, in_flight, s: &Series, lag| {
                let ns = s.wall.median();
                Row {
                    suite: suite.name(),
                    size,
                    mode,
                    threads,
                    batch,
                    in_flight,
                    ns_per_packet: ns,
                    mpps: 1e3 / ns,
                    gbps: size as f64 * 8.0 / ns,
                    speedup_vs_serial: base / ns,
                    cpu_ns_per_packet: s.cpu.median(),
                    cpus: s.cpus.median(),
                    crypto_cpu_ns_per_packet: (!s.crypto_cpu.0.is_empty())
                        .then(|| s.crypto_cpu.median()),
                    spread: s.wall.spread(),
                    max_seq_lag: lag,
                }
            };
            rows.push(row("serial", 0, 1, 1, &serial_s, serial_lag));
            for ((t, b), (_, lag, s)) in configs.iter().zip(&piped) {
                rows.push(row("threads", *t, *b, in_flight(*t, *b), s, *lag));
            }
            // Dropping `piped` stops and joins its threads.
        }
    }
    Ok(rows)
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut t = Table::new([
        Column::left("suite").min_width(18),
        Column::right("size").min_width(6),
        Column::left("mode").min_width(7),
        Column::right("threads").min_width(7),
        Column::right("batch").min_width(5),
        Column::right("in-flight").min_width(9),
        Column::right("ns/packet").min_width(9),
        Column::right("Mpps").min_width(7),
        Column::right("Gbit/s").min_width(7),
        Column::right("vs serial").min_width(9),
        Column::right("spread").min_width(7),
        Column::right("CPU ns").min_width(7),
        Column::right("CPUs").min_width(5),
        Column::right("crypto").min_width(7),
        Column::right("seq lag").min_width(7),
    ])
    .gap(1);
    for r in rows {
        t.row([
            r.suite.clone(),
            r.size.to_string(),
            r.mode.to_string(),
            r.threads.to_string(),
            r.batch.to_string(),
            r.in_flight.to_string(),
            format!("{:.0}", r.ns_per_packet),
            format!("{:.2}", r.mpps),
            format!("{:.2}", r.gbps),
            format!("{:.2}x", r.speedup_vs_serial),
            format!("{:.0}%", r.spread * 100.0),
            format!("{:.0}", r.cpu_ns_per_packet),
            format!("{:.2}", r.cpus),
            r.crypto_cpu_ns_per_packet
                .map_or("-".to_string(), |v| format!("{v:.0}")),
            r.max_seq_lag.to_string(),
        ]);
    }
    t.render()
}

/// `espgate bench parallel` from its options: prints the table (or JSON).
pub fn main(args: &Args) -> Result<ExitCode> {
    let p = PParams::new(
        &args.suite,
        &args.size,
        &args.threads,
        &args.batch,
        args.seconds,
        args.repeat,
    )?;
    if super::run_and_print(args.json, |progress| run(&p, progress), table)? {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!(
            "{cpus} CPUs. Packets delivered in dispatch order, every configuration checked \
             (decrypts to the right packet in order, distinct sequence numbers) before timing. \
             serial: one thread, no hand-off; threads: the calling thread dispatches and \
             reorders, plus that many crypto threads. vs serial: serial ns/packet / the row's. \
             CPU ns: process CPU time (all threads) per packet; CPUs: CPU time / wall time; \
             crypto: CPU ns per packet of the crypto threads alone. \
             seq lag: how far ESP sequence numbers trailed on the wire in the check."
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use espgate_core::crypto::Suite;

    fn suite(s: &str) -> Suite {
        s.parse().unwrap()
    }

    #[test]
    fn table_text_is_pinned() {
        let r = |mode: &'static str, threads: usize, batch: usize, ns: f64| Row {
            suite: "chacha20poly1305".into(),
            size: 1400,
            mode,
            threads,
            batch,
            in_flight: threads * batch,
            ns_per_packet: ns,
            mpps: 1e3 / ns,
            gbps: 1400.0 * 8.0 / ns,
            speedup_vs_serial: 829.0 / ns,
            cpu_ns_per_packet: ns * 1.5,
            cpus: 1.81,
            crypto_cpu_ns_per_packet: (threads > 0).then_some(700.4),
            spread: 0.034,
            max_seq_lag: threads as u64 * 3,
        };
        let rows = [r("serial", 0, 1, 829.0), r("threads", 2, 128, 592.1)];
        let want = "\
suite                size mode    threads batch in-flight ns/packet    Mpps  Gbit/s vs serial  spread  CPU ns  CPUs  crypto seq lag
chacha20poly1305     1400 serial        0     1         0       829    1.21   13.51     1.00x      3%    1244  1.81       -       0
chacha20poly1305     1400 threads       2   128       256       592    1.69   18.92     1.40x      3%     888  1.81     700       6
";
        let text = table(&rows);
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn threaded_output_is_in_order_complete_and_decryptable() {
        for name in ["aes128gcm16", "aes128-sha256"] {
            let s = suite(name);
            for threads in 1..=4 {
                for (size, batch) in [(28, 1), (64, 3), (100, 8)] {
                    let mut t = Threaded::new(s, size, threads, batch).unwrap();
                    // More packets than the pool holds, so buffers are recycled.
                    let n = 3 * in_flight(threads, batch) + 5;
                    let c = check_threaded(&mut t, s, size, n).unwrap();
                    assert!(c.packets >= n, "{name} T={threads}: {c:?}");
                    assert_eq!(c.packets as u64, t.next_packet);
                    assert!(
                        c.max_seq_lag < 2 * in_flight(threads, batch) as u64,
                        "{name} T={threads} batch {batch}: {c:?}"
                    );
                    // Keeps working after the check, as the timed runs do.
                    let d = t.run(3, &mut Discard).unwrap() + t.drain(&mut Discard).unwrap();
                    assert!(d >= 3 * batch);
                }
            }
        }
    }

    #[test]
    fn one_thread_keeps_sequence_numbers_in_order() {
        let s = suite("chacha20poly1305");
        let mut t = Threaded::new(s, 64, 1, 4).unwrap();
        let c = check_threaded(&mut t, s, 64, 500).unwrap();
        assert_eq!(c.max_seq_lag, 0);
        let mut serial = Serial::new(s, 64).unwrap();
        let c = check_serial(&mut serial, s, 64).unwrap();
        assert_eq!(
            c,
            Checked {
                packets: CHECK_PACKETS,
                max_seq_lag: 0
            }
        );
    }

    fn output(size: usize, n: usize) -> (Suite, Vec<(u64, Vec<u8>)>) {
        let s = suite("aes128gcm16");
        let mut serial = Serial::new(s, size).unwrap();
        let mut c = Collect::default();
        serial.run(n, &mut c).unwrap();
        (s, c.0)
    }

    #[test]
    fn the_check_catches_reordering_loss_duplicates_and_corruption() {
        for size in [28, 64] {
            let (s, good) = output(size, 10);
            assert_eq!(verify(s, size, &good).unwrap().packets, 10);

            // Two packets swapped, their dispatch numbers relabelled so
            // only the content can tell.
            let mut swapped = good.clone();
            swapped.swap(3, 4);
            swapped[3].0 = 3;
            swapped[4].0 = 4;
            let e = verify(s, size, &swapped).unwrap_err().to_string();
            assert!(e.contains("does not decrypt to clear packet 3"), "{e}");

            let mut lost = good.clone();
            lost.remove(5);
            assert!(verify(s, size, &lost)
                .unwrap_err()
                .to_string()
                .contains("delivered as number 6"));

            let mut dup = good.clone();
            dup[6] = (6, good[5].1.clone());
            let e = verify(s, size, &dup).unwrap_err().to_string();
            assert!(e.contains("used twice"), "{e}");

            let mut bad = good.clone();
            let last = bad[2].1.len() - 1;
            bad[2].1[last] ^= 1;
            assert!(verify(s, size, &bad).is_err());

            assert!(verify(s, size, &[]).is_err());
        }
    }

    #[test]
    fn stamps_differ_and_keep_the_header_valid() {
        let clear = clear_packet(64);
        let (a, b) = (stamped(&clear, 1), stamped(&clear, 2));
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        for p in [&a, &b] {
            assert!(ipv4::Ipv4::new_checked(&p[..]).unwrap().checksum_ok());
        }
        assert_eq!(&a[28..36], &1u64.to_le_bytes());
        let small = stamped(&clear_packet(28), 7);
        assert_eq!(ipv4::Ipv4::new_checked(&small[..]).unwrap().ident(), 7);
    }

    #[test]
    fn rows_for_every_configuration_with_consistent_units() {
        let p = PParams::new(
            &["aes128gcm16".into()],
            &[64, 200],
            &[1, 2, 3],
            &[1, 16],
            0.002,
            1,
        )
        .unwrap();
        let rows = run(&p, |_| {}).unwrap();
        assert_eq!(rows.len(), 2 * (1 + 3 * 2));
        for size in [64, 200] {
            let serial: Vec<_> = rows
                .iter()
                .filter(|r| r.size == size && r.mode == "serial")
                .collect();
            assert_eq!(serial.len(), 1);
            assert_eq!(serial[0].threads, 0);
            assert_eq!(serial[0].speedup_vs_serial, 1.0);
            for t in 1..=3 {
                for b in [1, 16] {
                    let r = rows
                        .iter()
                        .find(|r| r.size == size && r.threads == t && r.batch == b)
                        .unwrap_or_else(|| panic!("no row {size} {t} {b}"));
                    assert_eq!(r.mode, "threads");
                    assert_eq!(r.in_flight, in_flight(t, b));
                    let want = serial[0].ns_per_packet / r.ns_per_packet;
                    assert!((r.speedup_vs_serial - want).abs() < 1e-9);
                }
            }
        }
        for r in &rows {
            assert!(
                r.ns_per_packet > 0.0 && r.ns_per_packet.is_finite(),
                "{r:?}"
            );
            assert!((r.mpps * r.ns_per_packet - 1e3).abs() < 1e-6);
            assert!((r.gbps - r.size as f64 * 8.0 / r.ns_per_packet).abs() < 1e-9);
            assert!(
                r.cpu_ns_per_packet > 0.0 && r.cpu_ns_per_packet.is_finite(),
                "{r:?}"
            );
            // The caller's thread plus at most three crypto threads.
            assert!(r.cpus > 0.0 && r.cpus < 4.5, "{r:?}");
            match r.mode {
                "serial" => assert!(r.crypto_cpu_ns_per_packet.is_none()),
                _ => {
                    let c = r.crypto_cpu_ns_per_packet.unwrap();
                    // The crypto threads are part of the process.
                    assert!(c > 0.0 && c <= r.cpu_ns_per_packet * 1.05 + 100.0, "{r:?}");
                }
            }
        }
        let v = serde_json::to_value(&rows).unwrap();
        for k in [
            "cpu_ns_per_packet",
            "cpus",
            "suite",
            "size",
            "threads",
            "mpps",
            "gbps",
            "speedup_vs_serial",
            "max_seq_lag",
        ] {
            assert!(v[0].get(k).is_some(), "{k} missing in {}", v[0]);
        }
        assert_eq!(table(&rows).lines().count(), 1 + rows.len());
    }

    #[test]
    fn bad_parameters_are_refused_with_the_option_named() {
        let e = |t: &[usize], b: &[usize]| {
            PParams::new(&[], &[64], t, b, 0.1, 1)
                .unwrap_err()
                .to_string()
        };
        assert!(e(&[0], &[1]).contains("--threads 0"));
        assert!(e(&[1], &[0]).contains("--batch 0"));
        assert!(e(&[1], &[]).contains("--batch"));
        assert!(e(&[64], &[32]).contains("in flight"));
        assert!(PParams::new(&["rot13".into()], &[], &[1], &[1], 0.1, 1).is_err());
        let p = PParams::new(&[], &[], &[], &[1], 0.1, 1).unwrap();
        assert_eq!(p.threads[0], 1);
        assert!(p.threads.windows(2).all(|w| w[0] < w[1]));
    }
}
