//! Per-stage cost accounting: the clock side of [`espgate_core::cost`].
//!
//! [`Costs`] is the [`Probe`] the gateway and `espgate bench esp --costs`
//! hand to the core. Each mark reads the clock and charges the time since
//! the previous reading to the stage that just ended; the I/O stages
//! (receive, send) are charged by the caller around its system calls.
//! Seed 004 timed each step of ESP processing the same way, with the
//! CPU's cycle counter.
//!
//! The clock is the time-stamp counter (`rdtsc`) on x86_64 when the kernel
//! keeps time with it (`current_clocksource` is `tsc`: the kernel has found
//! it invariant and synchronised across CPUs), else [`Instant`]. A TSC
//! reading costs a fraction of `clock_gettime` (about 20 ns against 47 ns
//! on the 2-vCPU VM this was written on) and is taken several times per
//! packet. Cycles become nanoseconds with the ratio of the two clocks over
//! the whole accounting period, measured when a report is made, so no
//! calibration pause is needed when accounting is switched on. Every stage
//! includes the cost of one clock reading; [`CostsReport::clock_read_ns`]
//! says how much that is.
//!
//! The counts live in [`CostCells`]: the worker that owns them writes with
//! plain relaxed stores, and the control thread reads them at any time
//! through a [`CostsView`], which also switches accounting on and off and
//! resets it (keeping a baseline), never stopping the worker. With
//! accounting off the worker calls the core's unprobed entry points and
//! nothing here runs per packet.

use crate::table::{Column, Table};
pub use espgate_core::cost::Dir;
use espgate_core::cost::{Probe, Stage};
use espgate_core::stats::Counter;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the accountant reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockKind {
    /// The x86_64 time-stamp counter, scaled to nanoseconds.
    Tsc,
    /// `Instant` (`clock_gettime(CLOCK_MONOTONIC)`), in nanoseconds.
    Monotonic,
}

impl ClockKind {
    /// The TSC when the kernel uses it as its clock source, else monotonic.
    pub fn best() -> ClockKind {
        let tsc = cfg!(target_arch = "x86_64")
            && std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|s| s.trim() == "tsc");
        if tsc {
            ClockKind::Tsc
        } else {
            ClockKind::Monotonic
        }
    }

    /// `tsc` or `monotonic`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ClockKind::Tsc => "tsc",
            ClockKind::Monotonic => "monotonic",
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC exists on every x86_64 CPU and only reads the
    // time-stamp counter; it touches no memory.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn rdtsc() -> u64 {
    // Never chosen: `ClockKind::best` picks the TSC on x86_64 only.
    0
}

/// Shortest period over which TSC cycles are scaled to nanoseconds; a
/// report asked for sooner waits for the rest (at most this long).
const MIN_SCALE_PERIOD: Duration = Duration::from_millis(2);

/// A reading of both clocks at one moment: the start of an accounting
/// period.
#[derive(Debug, Clone, Copy)]
struct Epoch {
    at: Instant,
    tsc: u64,
}

impl Epoch {
    fn now() -> Epoch {
        Epoch {
            at: Instant::now(),
            tsc: rdtsc(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Clock {
    kind: ClockKind,
    origin: Instant,
}

impl Clock {
    #[inline(always)]
    fn ticks(&self) -> u64 {
        match self.kind {
            ClockKind::Tsc => rdtsc(),
            ClockKind::Monotonic => self.origin.elapsed().as_nanos() as u64,
        }
    }

    /// Nanoseconds per tick over the period since `since`: for the TSC,
    /// the ratio of elapsed monotonic time to elapsed cycles.
    fn ns_per_tick(&self, since: Epoch) -> f64 {
        if self.kind == ClockKind::Monotonic {
            return 1.0;
        }
        // Bounded: MIN_SCALE_PERIOD at most.
        while since.at.elapsed() < MIN_SCALE_PERIOD {
            std::hint::spin_loop();
        }
        let cycles = rdtsc().wrapping_sub(since.tsc);
        let ns = since.at.elapsed().as_nanos() as f64;
        if cycles == 0 || cycles > u64::MAX / 2 {
            // The counter went backwards or did not move: not usable.
            return f64::NAN;
        }
        ns / cycles as f64
    }
}

/// Ticks and packets per (direction, stage).
type Grid = [[Counter; Stage::COUNT]; 2];

fn grid() -> Grid {
    std::array::from_fn(|_| std::array::from_fn(|_| Counter::default()))
}

/// The accumulated costs of one accountant: written by the one thread
/// whose [`Costs`] marks the stages, read by any thread ([`CostsView`])
/// without stopping it.
#[derive(Debug)]
pub struct CostCells {
    clock: Clock,
    /// What one clock reading costs, nanoseconds.
    read_ns: f64,
    /// Accounting is on: the worker probes its packets.
    on: AtomicBool,
    ticks: Grid,
    packets: Grid,
}

impl CostCells {
    /// Empty cells on `kind`, accounting off.
    pub fn new(kind: ClockKind) -> CostCells {
        let clock = Clock {
            kind,
            origin: Instant::now(),
        };
        // The cost of one reading, for the report (a few microseconds).
        const READS: u32 = 1000;
        let t = Instant::now();
        let mut x = 0u64;
        for _ in 0..READS {
            x = x.wrapping_add(std::hint::black_box(clock.ticks()));
        }
        std::hint::black_box(x);
        CostCells {
            clock,
            read_ns: t.elapsed().as_nanos() as f64 / f64::from(READS),
            on: AtomicBool::new(false),
            ticks: grid(),
            packets: grid(),
        }
    }

    /// Whether accounting is on (the worker checks it once per round).
    #[inline]
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The clock.
    pub fn clock(&self) -> ClockKind {
        self.clock.kind
    }

    fn snapshot(&self) -> ([[u64; Stage::COUNT]; 2], [[u64; Stage::COUNT]; 2]) {
        let read = |g: &Grid| -> [[u64; Stage::COUNT]; 2] {
            std::array::from_fn(|d| std::array::from_fn(|s| g[d][s].get()))
        };
        (read(&self.ticks), read(&self.packets))
    }
}

/// Time and packets per (direction, stage): the [`Probe`] a worker (or
/// `espgate bench esp --costs`) hands to the core. Each mark reads the
/// clock and charges the time since the previous reading to the stage that
/// just ended, into its [`CostCells`].
#[derive(Debug)]
pub struct Costs {
    cells: Arc<CostCells>,
    /// The period [`Costs::report`] covers.
    epoch: Epoch,
    /// Reading at the previous mark.
    last: u64,
    dir: Dir,
    /// Stages already counted for the current packet (bit per stage).
    seen: u16,
}

impl Default for Costs {
    fn default() -> Costs {
        Costs::new()
    }
}

const fn bit(s: Stage) -> u16 {
    1 << s.index()
}

impl Costs {
    /// A fresh accountant on the best clock ([`ClockKind::best`]), on.
    pub fn new() -> Costs {
        Costs::with_clock(ClockKind::best())
    }

    /// A fresh accountant on `kind`, on.
    pub fn with_clock(kind: ClockKind) -> Costs {
        let cells = Arc::new(CostCells::new(kind));
        cells.on.store(true, Ordering::Relaxed);
        Costs::over(cells)
    }

    /// The accountant writing into `cells` (shared with a [`CostsView`]).
    pub fn over(cells: Arc<CostCells>) -> Costs {
        Costs {
            epoch: Epoch::now(),
            cells,
            last: 0,
            dir: Dir::Outbound,
            seen: 0,
        }
    }

    /// Its cells.
    pub fn cells(&self) -> &Arc<CostCells> {
        &self.cells
    }

    /// The clock.
    pub fn clock(&self) -> ClockKind {
        self.cells.clock.kind
    }

    /// A clock reading, for [`Costs::received`] and [`Costs::sent`].
    #[inline]
    pub fn now(&self) -> u64 {
        self.cells.clock.ticks()
    }

    /// A packet of direction `dir` starts being processed: it counts as
    /// received, and the next mark is charged from now.
    #[inline]
    pub fn begin(&mut self, dir: Dir) {
        self.last = self.cells.clock.ticks();
        self.dir = dir;
        self.seen = bit(Stage::Receive);
        self.cells.packets[dir.index()][Stage::Receive.index()].incr();
    }

    /// A read that started at `start` (a [`Costs::now`] reading) has
    /// returned: its time is `dir`'s receive time. The packets it carried
    /// are counted by [`Costs::begin`] as they are processed (a GRO or TSO
    /// read carries several).
    #[inline]
    pub fn received(&mut self, start: u64, dir: Dir) {
        let d = self.cells.clock.ticks().saturating_sub(start);
        self.cells.ticks[dir.index()][Stage::Receive.index()].add(d);
    }

    /// A send or write of `packets` packets that started at `start` has
    /// returned: its time is `dir`'s send time.
    #[inline]
    pub fn sent(&mut self, start: u64, dir: Dir, packets: u64) {
        let d = self.cells.clock.ticks().saturating_sub(start);
        let (i, s) = (dir.index(), Stage::Send.index());
        self.cells.ticks[i][s].add(d);
        self.cells.packets[i][s].add(packets);
    }

    /// The costs accumulated since this accountant was made.
    pub fn report(&self) -> CostsReport {
        let zero = [[0; Stage::COUNT]; 2];
        report(&self.cells, self.epoch, (&zero, &zero))
    }
}

impl Probe for Costs {
    #[inline]
    fn mark(&mut self, stage: Stage) {
        let t = self.cells.clock.ticks();
        let i = self.dir.index();
        self.cells.ticks[i][stage.index()].add(t.saturating_sub(self.last));
        self.last = t;
        if self.seen & bit(stage) == 0 {
            self.seen |= bit(stage);
            self.cells.packets[i][stage.index()].incr();
        }
    }
}

/// The costs in `cells` since `epoch`, less `base` (ticks, packets).
fn report(
    cells: &CostCells,
    epoch: Epoch,
    base: (&[[u64; Stage::COUNT]; 2], &[[u64; Stage::COUNT]; 2]),
) -> CostsReport {
    let scale = cells.clock.ns_per_tick(epoch);
    let scale = if scale.is_finite() { scale } else { 0.0 };
    let (ticks, packets) = cells.snapshot();
    let dir = |d: Dir| {
        let i = d.index();
        let stages = d
            .stages()
            .iter()
            .map(|s| {
                let j = s.index();
                let packets = packets[i][j].saturating_sub(base.1[i][j]);
                let total_ns =
                    (ticks[i][j].saturating_sub(base.0[i][j]) as f64 * scale).round() as u64;
                let ns_per_packet = if packets == 0 {
                    0.0
                } else {
                    total_ns as f64 / packets as f64
                };
                (
                    s.as_str().to_string(),
                    StageCost {
                        packets,
                        total_ns,
                        ns_per_packet,
                    },
                )
            })
            .collect();
        DirCosts {
            packets: packets[i][Stage::Receive.index()]
                .saturating_sub(base.1[i][Stage::Receive.index()]),
            stages,
        }
    };
    CostsReport {
        clock: cells.clock.kind.as_str().to_string(),
        seconds: epoch.at.elapsed().as_secs_f64(),
        clock_read_ns: cells.read_ns,
        outbound: dir(Dir::Outbound),
        inbound: dir(Dir::Inbound),
    }
}

/// The control side of one worker's accountant: switches it on and off,
/// resets it, and reads its report, all without stopping the worker (a
/// reset keeps the counts as a baseline and reports what came since).
#[derive(Debug)]
pub struct CostsView {
    cells: Arc<CostCells>,
    epoch: Epoch,
    base: ([[u64; Stage::COUNT]; 2], [[u64; Stage::COUNT]; 2]),
}

impl CostsView {
    /// The view of `cells`; accounting on from the start if `on`.
    pub fn new(cells: Arc<CostCells>, on: bool) -> CostsView {
        let mut v = CostsView {
            base: cells.snapshot(),
            cells,
            epoch: Epoch::now(),
        };
        if on {
            v.switch_on();
        }
        v
    }

    /// Whether accounting is on.
    pub fn is_on(&self) -> bool {
        self.cells.is_on()
    }

    /// Starts a new period at zero and switches accounting on.
    pub fn switch_on(&mut self) {
        self.reset();
        self.cells.on.store(true, Ordering::Relaxed);
    }

    /// Switches accounting off (the counts are dropped).
    pub fn switch_off(&mut self) {
        self.cells.on.store(false, Ordering::Relaxed);
    }

    /// Zeroes the counts (the period starts again).
    pub fn reset(&mut self) {
        self.base = self.cells.snapshot();
        self.epoch = Epoch::now();
    }

    /// The costs of the period, when accounting is on.
    pub fn report(&self) -> Option<CostsReport> {
        self.is_on()
            .then(|| report(&self.cells, self.epoch, (&self.base.0, &self.base.1)))
    }
}

/// The costs of one stage in one direction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageCost {
    /// Packets that went through the stage (for send: the packets the
    /// send calls carried).
    pub packets: u64,
    /// Time spent in it.
    pub total_ns: u64,
    /// `total_ns / packets` (0 without packets).
    pub ns_per_packet: f64,
}

/// The costs of one direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirCosts {
    /// Packets processed (the receive stage's count).
    pub packets: u64,
    /// By stage name (`receive`, `lookup`, `replay`, `encap` or `decap`,
    /// `cipher`, `integrity`, `send`).
    pub stages: BTreeMap<String, StageCost>,
}

impl DirCosts {
    /// The stage called `s`, zero if absent.
    pub fn stage(&self, s: Stage) -> StageCost {
        self.stages.get(s.as_str()).copied().unwrap_or(StageCost {
            packets: 0,
            total_ns: 0,
            ns_per_packet: 0.0,
        })
    }

    /// Sum of the stages' `ns_per_packet`: the cost of a packet going
    /// through every stage.
    pub fn total_ns_per_packet(&self) -> f64 {
        // From +0.0: an empty f64 sum is -0.0, which prints as "-0".
        self.stages.values().fold(0.0, |t, s| t + s.ns_per_packet)
    }
}

/// `costs` in the status document (`espgate status --costs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostsReport {
    /// `tsc` or `monotonic`.
    pub clock: String,
    /// Seconds since accounting was switched on or reset.
    pub seconds: f64,
    /// What one clock reading costs; every stage's time includes one.
    pub clock_read_ns: f64,
    /// Clear packet in, ESP out.
    pub outbound: DirCosts,
    /// ESP in, clear packet out.
    pub inbound: DirCosts,
}

impl CostsReport {
    /// Adds another worker's costs: packets and time summed per stage,
    /// ns per packet recomputed; the period is the longer of the two.
    pub fn merge(&mut self, other: &CostsReport) {
        for d in Dir::ALL {
            let (mine, theirs) = match d {
                Dir::Outbound => (&mut self.outbound, &other.outbound),
                Dir::Inbound => (&mut self.inbound, &other.inbound),
            };
            mine.packets += theirs.packets;
            for (k, t) in &theirs.stages {
                let s = mine.stages.entry(k.clone()).or_insert(StageCost {
                    packets: 0,
                    total_ns: 0,
                    ns_per_packet: 0.0,
                });
                s.packets += t.packets;
                s.total_ns += t.total_ns;
                s.ns_per_packet = if s.packets == 0 {
                    0.0
                } else {
                    s.total_ns as f64 / s.packets as f64
                };
            }
        }
        self.seconds = self.seconds.max(other.seconds);
    }

    /// The costs of `d`.
    pub fn dir(&self, d: Dir) -> &DirCosts {
        match d {
            Dir::Outbound => &self.outbound,
            Dir::Inbound => &self.inbound,
        }
    }
}

/// `12.3µs`, `4.56ms`, `7.89s` for a number of nanoseconds.
fn human_ns(ns: u64) -> String {
    let v = ns as f64;
    if v < 1e3 {
        format!("{ns}ns")
    } else if v < 1e6 {
        format!("{:.1}µs", v / 1e3)
    } else if v < 1e9 {
        format!("{:.2}ms", v / 1e6)
    } else {
        format!("{:.2}s", v / 1e9)
    }
}

/// The text of `espgate status --costs`: per direction, each stage's
/// packets, total time, time per packet and share of a packet's cost.
pub fn render(r: &CostsReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cost accounting on for {:.1}s, clock {} (one reading {:.0} ns, included in every stage)",
        r.seconds, r.clock, r.clock_read_ns
    );
    for d in Dir::ALL {
        let c = r.dir(d);
        let _ = writeln!(out, "\n{}: {} packets", d.as_str(), c.packets);
        let total = c.total_ns_per_packet();
        let numbers = ["PACKETS", "TOTAL", "NS/PACKET", "SHARE"].map(Column::right);
        let mut t = Table::new(std::iter::once(Column::left("STAGE")).chain(numbers)).indent(2);
        for s in d.stages() {
            let sc = c.stage(*s);
            t.row([
                s.as_str().to_string(),
                sc.packets.to_string(),
                human_ns(sc.total_ns),
                format!("{:.0}", sc.ns_per_packet),
                share(sc.ns_per_packet, total),
            ]);
        }
        t.row([
            "total".into(),
            String::new(),
            String::new(),
            format!("{total:.0}"),
            if total > 0.0 {
                "100%".into()
            } else {
                "-".into()
            },
        ]);
        out.push_str(&t.render());
    }
    out.push_str(NOTES);
    out
}

/// What the tables' numbers mean (printed under them).
pub const NOTES: &str =
    "\nreceive and send are the system calls (TUN read/write, socket receive/send); a \
call carrying a GRO/GSO batch is shared by its packets. outbound replay = taking the sequence \
number. AEAD suites (GCM, ChaCha20-Poly1305, GMAC) do encryption and authentication in one \
operation, counted as cipher: their integrity is 0.\n";

/// `part` as a percentage of `whole` (`-` when `whole` is 0).
pub fn share(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.0}%", part / whole * 100.0)
    } else {
        "-".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks a packet of each direction through the stages the core and
    /// the data plane would, with some work between the readings.
    fn one_of_each(c: &mut Costs) {
        let work = || std::hint::black_box((0..200u64).sum::<u64>());
        let t = c.now();
        work();
        c.received(t, Dir::Outbound);
        c.begin(Dir::Outbound);
        for s in [
            Stage::Lookup,
            Stage::Replay,
            Stage::Encap,
            Stage::Cipher,
            Stage::Encap,
        ] {
            work();
            c.mark(s);
        }
        let t = c.now();
        work();
        c.sent(t, Dir::Outbound, 1);
        c.begin(Dir::Inbound);
        for s in [Stage::Lookup, Stage::Replay] {
            c.mark(s);
        }
    }

    #[test]
    fn packets_count_once_per_stage_and_only_where_they_went() {
        for kind in [ClockKind::Monotonic, ClockKind::best()] {
            let mut c = Costs::with_clock(kind);
            for _ in 0..3 {
                one_of_each(&mut c);
            }
            let r = c.report();
            assert_eq!(r.clock, kind.as_str());
            let out = &r.outbound;
            assert_eq!(out.packets, 3);
            for s in [
                Stage::Receive,
                Stage::Lookup,
                Stage::Replay,
                Stage::Encap,
                Stage::Cipher,
                Stage::Send,
            ] {
                // Encap is marked twice per packet but counted once.
                assert_eq!(out.stage(s).packets, 3, "{s:?}");
            }
            assert_eq!(out.stage(Stage::Integrity).packets, 0);
            assert_eq!(out.stage(Stage::Integrity).total_ns, 0);
            assert!(!out.stages.contains_key("decap"));
            // The inbound packets stopped after the replay check.
            let inb = &r.inbound;
            assert_eq!(inb.packets, 3);
            assert_eq!(inb.stage(Stage::Replay).packets, 3);
            assert_eq!(inb.stage(Stage::Integrity).packets, 0);
            assert_eq!(inb.stage(Stage::Decap).packets, 0);
            assert!(!inb.stages.contains_key("encap"));
            assert_eq!(
                inb.stages.keys().cloned().collect::<Vec<_>>(),
                [
                    "cipher",
                    "decap",
                    "integrity",
                    "lookup",
                    "receive",
                    "replay",
                    "send"
                ]
            );
            for sc in out.stages.values().chain(inb.stages.values()) {
                if sc.packets > 0 {
                    assert!(
                        (sc.ns_per_packet - sc.total_ns as f64 / sc.packets as f64).abs() < 1e-9
                    );
                }
            }
            // Time was charged where work was done (no timing bounds).
            assert!(out.stage(Stage::Cipher).total_ns > 0, "{r:?}");
            assert!(out.stage(Stage::Receive).total_ns > 0, "{r:?}");
            assert!(r.clock_read_ns > 0.0);
        }
    }

    #[test]
    fn reset_zeroes_and_keeps_the_clock() {
        let cells = Arc::new(CostCells::new(ClockKind::Monotonic));
        let mut view = CostsView::new(cells.clone(), true);
        let mut c = Costs::over(cells);
        one_of_each(&mut c);
        assert_eq!(view.report().unwrap().outbound.packets, 1);
        view.reset();
        assert_eq!(c.clock(), ClockKind::Monotonic);
        let r = view.report().unwrap();
        assert_eq!(r.clock, "monotonic");
        for d in Dir::ALL {
            assert_eq!(r.dir(d).packets, 0);
            assert!(r.dir(d).stages.values().all(|s| s.total_ns == 0));
        }
        // Counts after the reset are reported.
        one_of_each(&mut c);
        assert_eq!(view.report().unwrap().inbound.packets, 1);
    }

    #[test]
    fn the_view_switches_and_reads_while_the_worker_writes() {
        let cells = Arc::new(CostCells::new(ClockKind::best()));
        let mut view = CostsView::new(cells.clone(), false);
        assert!(!view.is_on() && view.report().is_none());
        view.switch_on();
        assert!(cells.is_on());
        let worker = std::thread::spawn(move || {
            let mut c = Costs::over(cells);
            for _ in 0..1000 {
                one_of_each(&mut c);
            }
        });
        // A read while the worker runs sees a consistent prefix.
        let mid = view.report().unwrap();
        assert!(mid.outbound.packets <= 1000);
        worker.join().unwrap();
        let r = view.report().unwrap();
        assert_eq!(r.outbound.packets, 1000);
        assert_eq!(r.outbound.stage(Stage::Cipher).packets, 1000);
        view.switch_off();
        assert!(view.report().is_none());
        // On again: a new period from zero.
        view.switch_on();
        assert_eq!(view.report().unwrap().outbound.packets, 0);
    }

    #[test]
    fn report_round_trips_and_renders() {
        let mut c = Costs::with_clock(ClockKind::Monotonic);
        one_of_each(&mut c);
        let r = c.report();
        let j = serde_json::to_value(&r).unwrap();
        assert!(j["outbound"]["stages"]["cipher"]["ns_per_packet"].is_number());
        assert_eq!(j["inbound"]["stages"]["decap"]["packets"], 0);
        let back: CostsReport = serde_json::from_value(j).unwrap();
        for d in Dir::ALL {
            assert_eq!(back.dir(d).packets, r.dir(d).packets);
            for (k, v) in &r.dir(d).stages {
                let w = back.dir(d).stages[k];
                assert_eq!((w.packets, w.total_ns), (v.packets, v.total_ns), "{k}");
                assert!((w.ns_per_packet - v.ns_per_packet).abs() <= 1e-6 * v.ns_per_packet);
            }
        }
        let text = render(&r);
        assert!(text.contains("outbound: 1 packets\n"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with("outbound"))
            .unwrap();
        assert!(lines[at + 1].trim_start().starts_with("STAGE"), "{text}");
        let stages: Vec<&str> = lines[at + 2..at + 9]
            .iter()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(
            stages,
            [
                "receive",
                "lookup",
                "replay",
                "encap",
                "cipher",
                "integrity",
                "send"
            ]
        );
        assert!(lines[at + 9].trim_start().starts_with("total"), "{text}");
        assert!(lines[at + 9].ends_with("100%"), "{text}");
        assert!(text.contains("integrity is 0"), "{text}");
    }

    #[test]
    fn render_text_is_pinned() {
        let stage = |packets: u64, total_ns: u64| StageCost {
            packets,
            total_ns,
            ns_per_packet: if packets == 0 {
                0.0
            } else {
                total_ns as f64 / packets as f64
            },
        };
        let outbound = DirCosts {
            packets: 1200,
            stages: [
                ("receive", stage(1200, 96_000)),
                ("lookup", stage(1200, 48_000)),
                ("replay", stage(1200, 30_000)),
                ("encap", stage(1200, 120_000)),
                ("cipher", stage(1200, 1_234_567)),
                ("integrity", stage(0, 0)),
                ("send", stage(1200, 2_400_000_000)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        };
        let r = CostsReport {
            clock: "tsc".into(),
            seconds: 12.34,
            clock_read_ns: 7.4,
            outbound,
            inbound: DirCosts {
                packets: 0,
                stages: Dir::Inbound
                    .stages()
                    .iter()
                    .map(|s| (s.as_str().to_string(), stage(0, 0)))
                    .collect(),
            },
        };
        let want = "\
cost accounting on for 12.3s, clock tsc (one reading 7 ns, included in every stage)

outbound: 1200 packets
  STAGE      PACKETS    TOTAL  NS/PACKET  SHARE
  receive       1200   96.0µs         80     0%
  lookup        1200   48.0µs         40     0%
  replay        1200   30.0µs         25     0%
  encap         1200  120.0µs        100     0%
  cipher        1200   1.23ms       1029     0%
  integrity        0      0ns          0     0%
  send          1200    2.40s    2000000   100%
  total                          2001274   100%

inbound: 0 packets
  STAGE      PACKETS  TOTAL  NS/PACKET  SHARE
  receive          0    0ns          0      -
  lookup           0    0ns          0      -
  replay           0    0ns          0      -
  integrity        0    0ns          0      -
  cipher           0    0ns          0      -
  decap            0    0ns          0      -
  send             0    0ns          0      -
  total                              0      -

receive and send are the system calls (TUN read/write, socket receive/send); a call carrying a GRO/GSO batch is shared by its packets. outbound replay = taking the sequence number. AEAD suites (GCM, ChaCha20-Poly1305, GMAC) do encryption and authentication in one operation, counted as cipher: their integrity is 0.
";
        let text = render(&r);
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn a_direction_without_stages_totals_zero_not_minus_zero() {
        let empty = DirCosts {
            packets: 0,
            stages: BTreeMap::new(),
        };
        assert_eq!(format!("{:.0}", empty.total_ns_per_packet()), "0");
    }

    #[test]
    fn units_and_shares() {
        assert_eq!(human_ns(999), "999ns");
        assert_eq!(human_ns(12_345), "12.3µs");
        assert_eq!(human_ns(4_560_000), "4.56ms");
        assert_eq!(human_ns(7_890_000_000), "7.89s");
        assert_eq!(share(1.0, 4.0), "25%");
        assert_eq!(share(1.0, 0.0), "-");
    }
}
