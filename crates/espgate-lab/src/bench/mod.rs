//! `espgate bench crypto` and `espgate bench esp`: what one core does with
//! each suite, in memory, on this machine.
//!
//! - `crypto` times the suite's keyed transform alone ([`Transform::seal`]
//!   and [`Transform::open_from`], out of place as the gateway opens)
//!   over a body of the given size: aws-lc-rs's
//!   cipher and MAC plus the nonce, nothing of ESP. This is the ceiling.
//! - `esp` times the whole SA pipeline per packet — outbound
//!   [`Sa::encapsulate`] (copy the clear packet into the buffer as a TUN
//!   read would, outer header, ESP header, IV, padding, trailer, ICV) and
//!   inbound [`Sa::decapsulate_from`] (the packet's head copied into the
//!   buffer as the gateway copies a datagram's, replay check, ICV, the
//!   body decrypted from where it was received, padding and selector
//!   checks, replay window update) — and, in the same run, the
//!   raw seal (open, inbound) of the same suite and size (`ratio_to_raw`) and the same
//!   pipeline with `null` encryption and no integrity, the "skeleton" of
//!   seed 004's method: what is left when the cryptography costs nothing.
//!   `crypto_share` = 1 − skeleton time / suite time.
//! - `ceiling` (outbound) is the raw seal against the copy of the clear
//!   packet into the buffer followed by the raw seal, timed together in the
//!   same run: the `ratio_to_raw` an outbound pipeline would reach if ESP
//!   itself cost nothing, since that pipeline starts with the copy a TUN
//!   read makes and the raw seal does not. `no copy` (outbound, AEAD
//!   suites) is the raw seal against the pipeline sealing straight from
//!   the clear packet where it lies ([`Sa::encapsulate_from`]), as the
//!   gateway seals each segment of a TSO read: ESP's own work against the
//!   cipher, the copy left out. (Inbound has no such gap: the
//!   raw open, like the pipeline, decrypts out of place from the packet
//!   as received, [`Transform::open_from`].)
//!
//! Measurements of one row are interleaved repetition by repetition (raw,
//! skeleton, pipeline, raw, …) and the median of each is reported, so that
//! load from other processes hits all of them alike; ratios are what count
//! on a shared machine. Before timing, every suite is checked end to end
//! (the inbound pipeline must give back the clear packet), so a broken
//! suite cannot report a speed.
//!
//! `esp --costs` then runs each suite's pipeline once more with a
//! [`Costs`] probe (seed 004's per-operation timing) and reports the time
//! per packet of each stage: receive (here: copying the packet into the
//! buffer; inbound only its head, as the gateway does), lookup (outbound: flow and SPD lookup; inbound: classification
//! and SAD lookup), replay, encap/decap, cipher, integrity. That run goes
//! through an SPD and SADs as the gateway does, so its stages add up to a
//! little more than the pipeline row, and every stage includes one clock
//! reading; the timed rows above are measured with the probe off.

pub mod dos;
pub mod ike;
pub mod parallel;
pub mod relay;
pub mod scrape;
pub mod tunnel;

use espgate_api::costs::{self, Costs, Dir};
use espgate_api::table::{Column, Table};

/// Runs a bench that reports progress lines (shown on a terminal, never
/// with `--json`) and prints its rows as JSON or as `table`; true when the
/// table was printed (the caller adds its notes).
pub fn run_and_print<R: serde::Serialize>(
    json: bool,
    run: impl FnOnce(&dyn Fn(&str)) -> Result<Vec<R>>,
    table: impl FnOnce(&[R]) -> String,
) -> Result<bool> {
    let quiet = json || !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let progress = |s: &str| {
        if !quiet {
            eprint!("\r\x1b[K{s}");
        }
    };
    let rows = run(&progress)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(false);
    }
    if !quiet {
        eprint!("\r\x1b[K");
    }
    print!("{}", table(&rows));
    Ok(true)
}
use anyhow::{anyhow, bail, ensure, Result};
use espgate_core::cost::{NoProbe, Probe, Stage};
use espgate_core::crypto::{AuthCtx, Enc, GcmImpl, Suite, Transform};
use espgate_core::sa::{
    classify, Classified, Classifier, Decapsulated, Inbound, Protocol, Sa, SaConfig,
};
use espgate_core::sad::{InboundOutcome, SaId, Sad};
use espgate_core::selector::{Prefix, TrafficSelector};
use espgate_core::spd::{Action, Direction, Policy, Spd};
use espgate_core::wire::{flow, udp};
use espgate_core::PacketBuf;
use serde::Serialize;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Suites `bench esp` and `bench crypto` run when none is named.
pub const DEFAULT_SUITES: [&str; 7] = [
    "aes128gcm16",
    "aes256gcm16",
    "chacha20poly1305",
    "aes128gmac",
    "aes128-sha256",
    "aes256-sha1",
    "null-sha256",
];
/// Sizes (inner IPv4 packet bytes) run when none is given.
pub const DEFAULT_SIZES: [usize; 4] = [64, 512, 1400, 8192];
/// The skeleton suite's name: no encryption, no integrity. Not a suite a
/// user can configure (the parser refuses it); built by [`skeleton`].
pub const SKELETON: &str = "null";

/// The skeleton suite: ESP framing with `null` encryption and no ICV.
pub fn skeleton() -> Suite {
    Suite {
        enc: Some(Enc::Null),
        integ: None,
    }
}
/// Distinct ESP packets cycled through by the inbound measurement (each
/// pass gets a fresh receiving SA so the replay window stays on).
const RING: usize = 512;

/// What to measure and for how long.
#[derive(Debug, Clone)]
pub struct Params {
    /// Suites (strongSwan keywords).
    pub suites: Vec<Suite>,
    /// Inner packet sizes in bytes (IPv4 + UDP, 28..=9000).
    pub sizes: Vec<usize>,
    /// Time per measurement.
    pub time: Duration,
    /// Repetitions per measurement; the median is reported.
    pub repeat: usize,
    /// `bench esp`: outbound, inbound or both.
    pub outbound: bool,
    /// See `outbound`.
    pub inbound: bool,
    /// `bench esp --costs`: also time each stage, probe on (after the
    /// measurements with the probe off).
    pub costs: bool,
    /// `bench esp --proto`: ESP or Q-ESP (`docs/QESP.md`); the skeleton
    /// and the raw cipher rows are ESP's either way.
    pub protocol: Protocol,
}

impl Params {
    /// Parses suite names and checks sizes and counts.
    pub fn new(
        suites: &[String],
        sizes: &[usize],
        seconds: f64,
        repeat: usize,
        direction: &str,
    ) -> Result<Params> {
        let names: Vec<&str> = if suites.is_empty() {
            DEFAULT_SUITES.to_vec()
        } else {
            suites.iter().map(String::as_str).collect()
        };
        let suites = names
            .iter()
            .map(|n| {
                n.parse::<Suite>()
                    .map_err(|e| anyhow!("--suite {n}: {e}"))
                    .and_then(|s| {
                        ensure!(
                            s.enc.is_some(),
                            "--suite {n}: an AH (integrity-only) suite; bench measures ESP"
                        );
                        Ok(s)
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let sizes = if sizes.is_empty() {
            DEFAULT_SIZES.to_vec()
        } else {
            sizes.to_vec()
        };
        for &s in &sizes {
            ensure!(
                (28..=9000).contains(&s),
                "--size {s}: inner packets are IPv4/UDP of 28 to 9000 bytes"
            );
        }
        ensure!(
            seconds.is_finite() && (0.001..=60.0).contains(&seconds),
            "--seconds {seconds}: between 0.001 and 60"
        );
        ensure!((1..=99).contains(&repeat), "--repeat {repeat}: 1 to 99");
        let (outbound, inbound) = match direction {
            "out" | "outbound" => (true, false),
            "in" | "inbound" => (false, true),
            "both" => (true, true),
            d => bail!("--direction {d}: out, in or both"),
        };
        Ok(Params {
            suites,
            sizes,
            time: Duration::from_secs_f64(seconds),
            repeat,
            outbound,
            inbound,
            costs: false,
            protocol: Protocol::Esp,
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
    /// `outbound` / `inbound` (bench esp), `seal` / `open` (bench crypto).
    pub direction: &'static str,
    /// Median time per packet.
    pub ns_per_packet: f64,
    /// Million packets per second on one core.
    pub mpps: f64,
    /// Inner bytes per second, in Gbit/s.
    pub gbps: f64,
    /// Pipeline throughput / the raw transform's throughput (seal for
    /// outbound, open for inbound) of the same suite and size in the same
    /// run (bench esp only).
    pub ratio_to_raw: Option<f64>,
    /// Outbound (bench esp): raw seal / (copy the clear packet in + raw
    /// seal), timed in the same run: the best `ratio_to_raw` a pipeline
    /// that starts with the packet copy can reach. `None` elsewhere.
    pub ceiling: Option<f64>,
    /// Outbound (bench esp), where the SA can seal straight from the
    /// caller's packet ([`Sa::seals_from`]: AEAD, tunnel mode): raw seal /
    /// the pipeline sealing from the clear packet where it lies
    /// ([`Sa::encapsulate_from`]), timed in the same run. That is the path
    /// of a segment cut from a TSO read, whose bytes the TUN read already
    /// copied; it shows ESP's own work against the cipher without the
    /// copy. `None` elsewhere.
    pub no_copy: Option<f64>,
    /// Share of the pipeline's time that the cryptography takes, from the
    /// skeleton run (bench esp only; `None` for the skeleton itself).
    pub crypto_share: Option<f64>,
    /// The spread of the repetitions: (max − min) / median.
    pub spread: f64,
    /// `bench esp --costs`: ns per packet of each stage (`receive`,
    /// `lookup`, `replay`, `encap` or `decap`, `cipher`, `integrity`),
    /// from a separate run with the probe on. AEAD suites report their
    /// one operation as `cipher` and `integrity` 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stages: Option<BTreeMap<String, f64>>,
    /// AES-GCM rows: the library that ran the cipher, `aws-lc` or `ring`
    /// ([`espgate_core::crypto::GcmImpl`]); absent for other suites
    /// (always aws-lc).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<&'static str>,
}

fn row(suite: &str, size: usize, direction: &'static str, s: &Samples) -> Row {
    let ns = s.median();
    Row {
        suite: suite.to_string(),
        size,
        direction,
        ns_per_packet: ns,
        mpps: 1e3 / ns,
        gbps: size as f64 * 8.0 / ns,
        ratio_to_raw: None,
        ceiling: None,
        no_copy: None,
        crypto_share: None,
        spread: s.spread(),
        stages: None,
        library: None,
    }
}

/// Nanoseconds per packet of each repetition.
#[derive(Debug, Default, Clone)]
struct Samples(Vec<f64>);

impl Samples {
    fn median(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    fn spread(&self) -> f64 {
        let min = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.0.iter().copied().fold(0.0, f64::max);
        (max - min) / self.median()
    }
}

/// Runs `chunk` (which processes `n` packets and returns `n`) until `time`
/// has passed, after a short warm-up; returns ns per packet. Only the
/// chunks are timed, not what runs between them. (Also the lab's timer
/// for seed 003's per-packet costs.)
pub fn measure(time: Duration, mut chunk: impl FnMut() -> Result<usize>) -> Result<f64> {
    let warm = Instant::now();
    while warm.elapsed() < time / 10 {
        chunk()?;
    }
    let (mut spent, mut packets) = (Duration::ZERO, 0usize);
    // Bounded: at least one chunk, at most until `time` is spent.
    while spent < time || packets == 0 {
        let t = Instant::now();
        let n = chunk()?;
        spent += t.elapsed();
        packets += n;
    }
    Ok(spent.as_nanos() as f64 / packets as f64)
}

/// An IPv4/UDP packet of `total` bytes (28..=9000), 10.1.0.1 → 10.2.0.1.
pub fn clear_packet(total: usize) -> Vec<u8> {
    udp::ipv4_packet(
        Ipv4Addr::new(10, 1, 0, 1),
        Ipv4Addr::new(10, 2, 0, 1),
        total,
    )
    .expect("Params checks the size")
}

fn key(n: usize, fill: u8) -> Vec<u8> {
    (0..n).map(|i| fill ^ i as u8).collect()
}

fn sa(suite: Suite, window: u32) -> Result<Sa> {
    sa_of(Protocol::Esp, suite, window)
}

fn sa_of(protocol: Protocol, suite: Suite, window: u32) -> Result<Sa> {
    sa_with(protocol, suite, window, |_| {})
}

/// The bench's SA (fixed keys, tunnel 192.0.2.1 → 192.0.2.2, ESN,
/// legacy suites allowed in memory) with `tweak` applied to its
/// configuration first (seed 003's lab sets the cluster IV source).
pub fn sa_with(
    protocol: Protocol,
    suite: Suite,
    window: u32,
    tweak: impl FnOnce(&mut SaConfig),
) -> Result<Sa> {
    let mut c = SaConfig::new(
        0x1000,
        protocol,
        suite,
        &key(suite.enc_key_len(), 0x5a),
        &key(suite.integ_key_len(), 0xa5),
    );
    c.tunnel_src = Some("192.0.2.1".parse()?);
    c.tunnel_dst = Some("192.0.2.2".parse()?);
    c.esn = true;
    c.replay_window = window;
    // In memory with fixed keys, never on a wire: the skeleton (null
    // without integrity) and the legacy suites old papers measured (3DES,
    // DES, MD5) are allowed here, as `allow_insecure` allows them in a
    // configuration.
    c.allow_insecure = true;
    tweak(&mut c);
    Sa::new(c, Duration::ZERO).map_err(|e| anyhow!("{suite}: {e}"))
}

/// The outbound and inbound pipelines of one suite and size.
struct Pipeline {
    clear: Vec<u8>,
    tx: Sa,
    buf: PacketBuf,
    /// Consecutive ESP packets for the inbound side, with their classification.
    ring: Vec<(Vec<u8>, Inbound)>,
    rx: Sa,
    suite: Suite,
    protocol: Protocol,
}

/// Raw ESP and AH, ESP-in-UDP on 4500, and Q-ESP on its default number.
const CLASSIFIER: Classifier =
    Classifier::NAT_T.qesp(espgate_core::wire::qesp::DEFAULT_IP_PROTOCOL);

impl Pipeline {
    fn new(protocol: Protocol, suite: Suite, size: usize, inbound: bool) -> Result<Pipeline> {
        let clear = clear_packet(size);
        let sa = |suite, window| sa_of(protocol, suite, window);
        let mut tx = sa(suite, 1024)?;
        let mut buf = PacketBuf::with_capacity(9216);
        let mut ring = Vec::new();
        let n = if inbound { RING } else { 1 };
        for _ in 0..n {
            buf.load(&clear);
            tx.encapsulate(&mut buf, Duration::ZERO)
                .map_err(|d| anyhow!("{suite} outbound, {size} B: {}", d.as_str()))?;
            let wire = buf.as_slice().to_vec();
            let Ok(Classified::Ipsec(inb)) = classify(&wire, &CLASSIFIER) else {
                bail!("{suite}: the ESP packet does not classify as ESP");
            };
            ring.push((wire, inb));
        }
        // The proof that this suite works before it is timed.
        let mut rx = sa(suite, 1024)?;
        let (wire, inb) = &ring[0];
        buf.load(wire);
        match rx.decapsulate(&mut buf, inb, Duration::ZERO) {
            Ok(Decapsulated::Packet) if buf.as_slice() == clear.as_slice() => {}
            Ok(_) => bail!("{suite}, {size} B: the inbound pipeline did not return the packet"),
            Err(d) => bail!("{suite}, {size} B: inbound failed: {}", d.as_str()),
        }
        Ok(Pipeline {
            clear,
            tx: sa(suite, 1024)?,
            buf,
            ring,
            rx: sa(suite, 1024)?,
            suite,
            protocol,
        })
    }

    fn outbound(&mut self, n: usize) -> Result<usize> {
        for _ in 0..n {
            self.buf.load(&self.clear);
            self.tx
                .encapsulate(&mut self.buf, Duration::ZERO)
                .map_err(|d| anyhow!("{} outbound: {}", self.suite, d.as_str()))?;
            black_box(self.buf.len());
        }
        self.renew_worn_tx()?;
        Ok(n)
    }

    /// [`Pipeline::outbound`] sealing from the clear packet where it lies
    /// (no copy into the buffer), as the gateway seals a TSO segment. The
    /// caller times it only where [`Sa::seals_from`] holds; elsewhere
    /// `encapsulate_from` would copy, and the figure would mean nothing.
    fn outbound_from(&mut self, n: usize) -> Result<usize> {
        for _ in 0..n {
            self.tx
                .encapsulate_from(&self.clear, &mut self.buf, Duration::ZERO)
                .map_err(|d| anyhow!("{} outbound: {}", self.suite, d.as_str()))?;
            black_box(self.buf.len());
        }
        self.renew_worn_tx()?;
        Ok(n)
    }

    /// The SA's 64-bit counter would take centuries to run out here, but a
    /// long run must never wrap: past half of it, start over with a fresh
    /// SA (outside the timed loop's packets).
    fn renew_worn_tx(&mut self) -> Result<()> {
        if self.tx.next_seq() > u64::MAX / 2 {
            self.tx = sa_of(self.protocol, self.suite, 1024)?;
        }
        Ok(())
    }

    /// One pass over the ring, timed by the caller; a fresh receiving SA
    /// (outside the timing) makes the next pass legal for the window.
    fn inbound(&mut self) -> Result<usize> {
        for (wire, inb) in &self.ring {
            // As the gateway receives: the head copied in, the body
            // decrypted from where it was read.
            self.buf.load_head(wire);
            self.rx
                .decapsulate_from(&mut self.buf, wire, inb, Duration::ZERO)
                .map_err(|d| anyhow!("{} inbound: {}", self.suite, d.as_str()))?;
            black_box(self.buf.len());
        }
        Ok(self.ring.len())
    }

    fn reset_rx(&mut self) -> Result<()> {
        self.rx = sa_of(self.protocol, self.suite, 1024)?;
        Ok(())
    }
}

/// The pipeline as the gateway runs it, for `--costs`: an SPD lookup
/// and the SAD on the way out, classification and the SAD on the way in,
/// each packet marked on a [`Costs`] probe.
struct Probed {
    clear: Vec<u8>,
    spd: Spd,
    tx: Sad,
    rx: Sad,
    rx_id: SaId,
    /// Consecutive ESP packets for the inbound side.
    ring: Vec<Vec<u8>>,
    buf: PacketBuf,
    applied: Vec<SaId>,
    suite: Suite,
    protocol: Protocol,
}

impl Probed {
    fn new(protocol: Protocol, suite: Suite, size: usize) -> Result<Probed> {
        let clear = clear_packet(size);
        let sa = |suite, window| sa_of(protocol, suite, window);
        let mut gen = sa(suite, 1024)?;
        let mut buf = PacketBuf::with_capacity(9216);
        let mut ring = Vec::with_capacity(RING);
        for _ in 0..RING {
            buf.load(&clear);
            gen.encapsulate(&mut buf, Duration::ZERO)
                .map_err(|d| anyhow!("{suite} outbound, {size} B: {}", d.as_str()))?;
            ring.push(buf.as_slice().to_vec());
        }
        let mut tx = Sad::new();
        let tx_id = tx.insert(sa(suite, 1024)?).map_err(|e| anyhow!(e))?;
        let mut spd = Spd::new();
        let prefix = |a: [u8; 4]| Prefix::new(Ipv4Addr::from(a).into(), 16);
        let (Some(local), Some(remote)) = (prefix([10, 1, 0, 0]), prefix([10, 2, 0, 0])) else {
            bail!("bad bench prefixes");
        };
        spd.push(Policy {
            selector: TrafficSelector::between(local, remote),
            action: Action::Protect(vec![tx_id]),
        });
        let mut rx = Sad::new();
        let rx_id = rx.insert(sa(suite, 1024)?).map_err(|e| anyhow!(e))?;
        Ok(Probed {
            clear,
            spd,
            tx,
            rx,
            rx_id,
            ring,
            buf,
            applied: Vec::with_capacity(espgate_core::sad::MAX_LAYERS),
            suite,
            protocol,
        })
    }

    fn outbound(&mut self, n: usize, c: &mut Costs) -> Result<()> {
        for _ in 0..n {
            c.begin(Dir::Outbound);
            self.buf.load(&self.clear);
            c.mark(Stage::Receive);
            let f = flow::of_packet(self.buf.as_slice())
                .map_err(|d| anyhow!("{}: flow: {}", self.suite, d.as_str()))?;
            let Some((
                _,
                Policy {
                    action: Action::Protect(ids),
                    ..
                },
            )) = self.spd.lookup(&f, Direction::Outbound)
            else {
                bail!("{}: no PROTECT policy for the bench packet", self.suite);
            };
            c.mark(Stage::Lookup);
            self.tx
                .encapsulate_probed(ids, &mut self.buf, Duration::ZERO, c)
                .map_err(|d| anyhow!("{} outbound: {}", self.suite, d.as_str()))?;
            black_box(self.buf.len());
        }
        Ok(())
    }

    /// One pass over the ring; a fresh receiving SA (not marked) makes the
    /// next pass legal for the replay window.
    fn inbound(&mut self, c: &mut Costs) -> Result<()> {
        for wire in &self.ring {
            c.begin(Dir::Inbound);
            self.buf.load_head(wire);
            c.mark(Stage::Receive);
            match self.rx.decapsulate_from_probed(
                &mut self.buf,
                wire,
                &CLASSIFIER,
                Duration::ZERO,
                &mut self.applied,
                c,
            ) {
                Ok(InboundOutcome::Packet) => {}
                Ok(o) => bail!("{} inbound: {o:?}", self.suite),
                Err(e) => bail!("{} inbound: {}", self.suite, e.reason.as_str()),
            }
            black_box(self.buf.len());
        }
        self.rx.remove(self.rx_id);
        self.rx_id = self
            .rx
            .insert(sa_of(self.protocol, self.suite, 1024)?)
            .map_err(|e| anyhow!(e))?;
        Ok(())
    }

    /// Runs one direction for `time` (after a warm-up whose marks are
    /// discarded) and returns each stage's ns per packet.
    fn stages(&mut self, dir: Dir, time: Duration) -> Result<BTreeMap<String, f64>> {
        let mut run = |c: &mut Costs, time: Duration| -> Result<()> {
            let t = Instant::now();
            // Bounded: until `time` has passed, at least one chunk.
            loop {
                match dir {
                    Dir::Outbound => self.outbound(CHUNK, c)?,
                    Dir::Inbound => self.inbound(c)?,
                }
                if t.elapsed() >= time {
                    return Ok(());
                }
            }
        };
        run(&mut Costs::new(), time / 10)?;
        let mut c = Costs::new();
        run(&mut c, time)?;
        let r = c.report();
        Ok(dir
            .stages()
            .iter()
            .filter(|s| **s != Stage::Send)
            .map(|s| (s.as_str().to_string(), r.dir(dir).stage(*s).ns_per_packet))
            .collect())
    }
}

/// The suite's transform alone over `size` bytes of body.
struct Raw {
    t: Transform,
    /// `[8-byte ESP header | IV | body | ICV]`.
    pkt: Vec<u8>,
    sealed: Vec<u8>,
    hdr: usize,
    /// The clear packet of this size, for [`Raw::copy_seal_n`].
    clear: Vec<u8>,
}

impl Raw {
    fn new(suite: Suite, size: usize) -> Result<Raw> {
        let mut t = Transform::new(
            suite,
            &key(suite.enc_key_len(), 0x5a),
            &key(suite.integ_key_len(), 0xa5),
        )
        .map_err(|e| anyhow!("{suite}: {e}"))?;
        let block = t.block_len().max(1);
        let body = size.div_ceil(block) * block;
        let hdr = 8;
        let mut pkt = vec![0u8; hdr + t.iv_len() + body + t.icv_len()];
        t.fill_iv(&mut pkt[hdr..hdr + t.iv_len()], 1)
            .map_err(|d| anyhow!("{suite}: IV: {}", d.as_str()))?;
        let mut r = Raw {
            t,
            sealed: Vec::new(),
            pkt,
            hdr,
            clear: clear_packet(size),
        };
        r.seal()?;
        r.sealed = r.pkt.clone();
        let mut check = r.sealed.clone();
        r.t.open(&mut check, hdr, &Self::auth())
            .map_err(|d| anyhow!("{suite}: raw open failed: {}", d.as_str()))?;
        Ok(r)
    }

    fn auth() -> AuthCtx<'static> {
        AuthCtx {
            aad: &[0u8; 8],
            mac_prefix: &[],
            mac_suffix: &[],
        }
    }

    fn seal(&mut self) -> Result<()> {
        self.t
            .seal(&mut self.pkt, self.hdr, &Self::auth())
            .map_err(|d| anyhow!("seal: {}", d.as_str()))
    }

    fn seal_n(&mut self, n: usize) -> Result<usize> {
        for _ in 0..n {
            self.seal()?;
            black_box(&self.pkt);
        }
        Ok(n)
    }

    /// Copies the clear packet into the body, as the outbound pipeline's
    /// first step does, and seals it: the pipeline's cost if ESP itself
    /// cost nothing.
    fn copy_seal_n(&mut self, n: usize) -> Result<usize> {
        let at = self.hdr + self.t.iv_len();
        for _ in 0..n {
            self.pkt[at..at + self.clear.len()].copy_from_slice(&self.clear);
            self.seal()?;
            black_box(&self.pkt);
        }
        Ok(n)
    }

    /// Opens the sealed packet out of place ([`Transform::open_from`]):
    /// its header and IV copied in, the body decrypted from where it lies
    /// (a suite without an out-of-place open copies the rest in and opens
    /// in place), as the gateway opens a datagram it received.
    fn open_n(&mut self, n: usize) -> Result<usize> {
        let at = self.hdr + self.t.iv_len();
        for _ in 0..n {
            self.pkt[..at].copy_from_slice(&self.sealed[..at]);
            self.t
                .open_from(
                    &self.sealed,
                    &mut self.pkt,
                    self.hdr,
                    &Self::auth(),
                    &mut NoProbe,
                )
                .map_err(|d| anyhow!("open: {}", d.as_str()))?;
            black_box(&self.pkt);
        }
        Ok(n)
    }
}

const CHUNK: usize = 256;

/// `espgate bench crypto`.
pub fn crypto(p: &Params, mut progress: impl FnMut(&str)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &suite in &p.suites {
        for &size in &p.sizes {
            progress(&format!("crypto {suite} {size} B"));
            let mut raw = Raw::new(suite, size)?;
            let library = raw.t.gcm_impl().map(GcmImpl::name);
            let (mut seal, mut open) = (Samples::default(), Samples::default());
            for _ in 0..p.repeat {
                seal.0.push(measure(p.time, || raw.seal_n(CHUNK))?);
                open.0.push(measure(p.time, || raw.open_n(CHUNK))?);
            }
            for (dir, s) in [("seal", &seal), ("open", &open)] {
                let mut r = row(&suite.name(), size, dir, s);
                r.library = library;
                rows.push(r);
            }
        }
    }
    Ok(rows)
}

/// `espgate bench esp`.
pub fn esp(p: &Params, mut progress: impl FnMut(&str)) -> Result<Vec<Row>> {
    let skeleton = skeleton();
    let mut rows = Vec::new();
    for &size in &p.sizes {
        let mut skel = Pipeline::new(Protocol::Esp, skeleton, size, p.inbound)?;
        for &suite in &p.suites {
            progress(&format!("esp {suite} {size} B"));
            let mut pipe = Pipeline::new(p.protocol, suite, size, p.inbound)?;
            let mut raw = Raw::new(suite, size)?;
            let library = raw.t.gcm_impl().map(GcmImpl::name);
            let mut s = [(); 8].map(|_| Samples::default());
            let [seal_s, copy_seal_s, open_s, out_s, from_s, in_s, skel_out, skel_in] = &mut s;
            for _ in 0..p.repeat {
                if p.outbound {
                    seal_s.0.push(measure(p.time, || raw.seal_n(CHUNK))?);
                    copy_seal_s
                        .0
                        .push(measure(p.time, || raw.copy_seal_n(CHUNK))?);
                    skel_out.0.push(measure(p.time, || skel.outbound(CHUNK))?);
                    out_s.0.push(measure(p.time, || pipe.outbound(CHUNK))?);
                    if pipe.tx.seals_from() {
                        from_s
                            .0
                            .push(measure(p.time, || pipe.outbound_from(CHUNK))?);
                    }
                }
                if p.inbound {
                    open_s.0.push(measure(p.time, || raw.open_n(CHUNK))?);
                    skel_in.0.push(measure(p.time, || {
                        let n = skel.inbound();
                        skel.reset_rx()?;
                        n
                    })?);
                    in_s.0.push(measure(p.time, || {
                        let n = pipe.inbound();
                        pipe.reset_rx()?;
                        n
                    })?);
                }
            }
            // Once more with the probe on, after the measurements above.
            let mut probed = if p.costs {
                progress(&format!("esp {suite} {size} B: per-stage costs"));
                Some(Probed::new(p.protocol, suite, size)?)
            } else {
                None
            };
            let probe_time = p.time * p.repeat as u32;
            let mut add = |dir: Dir,
                           s: &Samples,
                           sk: &Samples,
                           raw: &Samples,
                           ceiling: Option<f64>,
                           no_copy: Option<f64>|
             -> Result<()> {
                let name = match p.protocol {
                    Protocol::Qesp => format!("qesp {suite}"),
                    _ => suite.name(),
                };
                let mut r = row(&name, size, dir.as_str(), s);
                r.ratio_to_raw = Some(raw.median() / r.ns_per_packet);
                r.ceiling = ceiling;
                r.no_copy = no_copy;
                r.library = library;
                r.crypto_share = Some((1.0 - sk.median() / r.ns_per_packet).max(0.0));
                if let Some(pr) = probed.as_mut() {
                    r.stages = Some(pr.stages(dir, probe_time)?);
                }
                rows.push(r);
                Ok(())
            };
            if p.outbound {
                let ceiling = seal_s.median() / copy_seal_s.median();
                let no_copy = (!from_s.0.is_empty()).then(|| seal_s.median() / from_s.median());
                add(
                    Dir::Outbound,
                    out_s,
                    skel_out,
                    seal_s,
                    Some(ceiling),
                    no_copy,
                )?;
            }
            if p.inbound {
                add(Dir::Inbound, in_s, skel_in, open_s, None, None)?;
            }
            if suite == *p.suites.last().expect("at least one suite") {
                // The skeleton's own rows, once per size.
                if p.outbound {
                    rows.push(row(SKELETON, size, "outbound", skel_out));
                }
                if p.inbound {
                    rows.push(row(SKELETON, size, "inbound", skel_in));
                }
            }
        }
    }
    Ok(rows)
}

/// The rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut t = Table::new([
        Column::left("suite").min_width(18),
        Column::right("size").min_width(6),
        Column::left("direction").min_width(9),
        Column::right("ns/packet").min_width(10),
        Column::right("Mpps").min_width(8),
        Column::right("Gbit/s").min_width(8),
        Column::right("vs raw").min_width(8),
        Column::right("ceiling").min_width(8),
        Column::right("no copy").min_width(8),
        Column::right("crypto").min_width(7),
        Column::right("spread").min_width(7),
    ])
    .gap(1);
    let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
    for r in rows {
        t.row([
            r.suite.clone(),
            r.size.to_string(),
            r.direction.to_string(),
            format!("{:.0}", r.ns_per_packet),
            format!("{:.2}", r.mpps),
            format!("{:.2}", r.gbps),
            pct(r.ratio_to_raw),
            pct(r.ceiling),
            pct(r.no_copy),
            pct(r.crypto_share),
            pct(Some(r.spread)),
        ]);
    }
    t.render()
}

/// The `--costs` table: per suite, size and direction, each stage's ns
/// per packet and its share of the probed total, then the total with the
/// probe on and the pipeline's time with it off. Rows without stages are
/// left out.
pub fn costs_table(rows: &[Row]) -> String {
    let cols: [(&str, &[Stage]); 6] = [
        ("receive", &[Stage::Receive]),
        ("lookup", &[Stage::Lookup]),
        ("replay", &[Stage::Replay]),
        ("en/decap", &[Stage::Encap, Stage::Decap]),
        ("cipher", &[Stage::Cipher]),
        ("integrity", &[Stage::Integrity]),
    ];
    let mut columns = vec![
        Column::left("suite").min_width(18),
        Column::right("size").min_width(6),
        Column::left("direction").min_width(9),
    ];
    columns.extend(
        cols.iter()
            .map(|(name, _)| Column::right(*name).min_width(10)),
    );
    columns.push(Column::right("total").min_width(7));
    columns.push(Column::right("probe off").min_width(9));
    let mut t = Table::new(columns).gap(1);
    for r in rows {
        let Some(st) = &r.stages else { continue };
        let total: f64 = st.values().sum();
        let mut cells = vec![r.suite.clone(), r.size.to_string(), r.direction.to_string()];
        for (_, stages) in cols {
            let v = stages.iter().find_map(|s| st.get(s.as_str()));
            cells.push(match v {
                Some(v) => format!("{v:.0} {:>3}", costs::share(*v, total)),
                None => "-".into(),
            });
        }
        cells.push(format!("{total:.0}"));
        cells.push(format!("{:.0}", r.ns_per_packet));
        t.row(cells);
    }
    t.render()
}

/// What the `--costs` table's columns are (printed under it).
pub const COSTS_NOTES: &str = "per-stage costs: ns per packet (share of the total) from one more \
run with the probe on; receive = copying the packet into the buffer (no system call here), \
lookup = flow + SPD lookup (outbound) or classification + SAD lookup (inbound), replay = \
sequence number (outbound) or window check + update (inbound); every stage includes one clock \
reading. AEAD suites (GCM, GMAC, ChaCha20-Poly1305) encrypt and authenticate in one operation, \
counted as cipher: their integrity is 0. probe off: the pipeline row above.";

#[cfg(test)]
mod tests {
    use super::*;

    fn params(suites: &[&str], sizes: &[usize], dir: &str) -> Params {
        let s: Vec<String> = suites.iter().map(|s| s.to_string()).collect();
        Params::new(&s, sizes, 0.002, 1, dir).unwrap()
    }

    #[test]
    fn every_default_suite_and_the_skeleton_round_trip() {
        let suites = DEFAULT_SUITES.iter().map(|s| s.parse().unwrap());
        for s in suites.chain([skeleton()]) {
            for size in [28, 64, 1400] {
                Pipeline::new(Protocol::Esp, s, size, true).unwrap();
                Raw::new(s, size).unwrap();
            }
        }
        assert_eq!(skeleton().name(), SKELETON);
    }

    #[test]
    fn esp_rows_have_the_documented_fields_and_consistent_units() {
        let rows = esp(
            &params(&["aes128gcm16", "aes128-sha256"], &[64, 512], "both"),
            |_| {},
        )
        .unwrap();
        // 2 suites × 2 sizes × 2 directions + skeleton 2 sizes × 2 directions.
        assert_eq!(rows.len(), 12);
        for r in &rows {
            assert!(
                r.ns_per_packet > 0.0 && r.ns_per_packet.is_finite(),
                "{r:?}"
            );
            assert!((r.mpps * r.ns_per_packet - 1e3).abs() < 1e-6);
            assert!((r.gbps - r.size as f64 * 8.0 / r.ns_per_packet).abs() < 1e-9);
            if r.suite == SKELETON {
                assert!(r.ratio_to_raw.is_none() && r.crypto_share.is_none());
            } else {
                assert!(r.ratio_to_raw.unwrap() > 0.0);
                assert!((0.0..=1.0).contains(&r.crypto_share.unwrap()));
            }
            // Outbound suite rows carry the ceiling (a ratio of two times;
            // its size is for benchmarks, not for a test to judge).
            match (r.suite.as_str(), r.direction) {
                (SKELETON, _) | (_, "inbound") => assert!(r.ceiling.is_none(), "{r:?}"),
                _ => assert!(r.ceiling.is_some_and(|c| c > 0.0 && c.is_finite()), "{r:?}"),
            }
            // `no copy`: outbound rows of suites that seal from the
            // caller's packet (AEAD), and only those.
            // (ring's AES-GCM has no out-of-place seal: see GcmImpl.)
            let seals_from = r.suite == "aes128gcm16"
                && r.direction == "outbound"
                && GcmImpl::current() == GcmImpl::AwsLc;
            assert_eq!(
                r.library,
                (r.suite == "aes128gcm16").then(|| GcmImpl::current().name()),
                "{r:?}"
            );
            assert_eq!(r.no_copy.is_some(), seals_from, "{r:?}");
            assert!(r.no_copy.is_none_or(|c| c > 0.0 && c.is_finite()), "{r:?}");
        }
        let v = serde_json::to_value(&rows).unwrap();
        for k in [
            "suite",
            "size",
            "direction",
            "mpps",
            "gbps",
            "ratio_to_raw",
            "ceiling",
            "no_copy",
        ] {
            assert!(v[0].get(k).is_some(), "{k} missing in {}", v[0]);
        }
        assert!(table(&rows).lines().count() == 13);
    }

    #[test]
    fn qesp_rows_measure_the_qesp_pipeline() {
        let mut p = params(&["aes128gcm16", "aes128-sha1"], &[200], "both");
        p.protocol = Protocol::Qesp;
        p.costs = true;
        let rows = esp(&p, |_| {}).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.suite.as_str()).collect();
        assert!(names.contains(&"qesp aes128gcm16") && names.contains(&"qesp aes128-sha1"));
        assert!(rows
            .iter()
            .filter(|r| r.suite.starts_with("qesp"))
            .all(|r| r.stages.is_some() && r.ns_per_packet > 0.0));
        // Q-ESP's rules hold in the bench too: no NULL encryption.
        let mut p = params(&["null-sha256"], &[200], "out");
        p.protocol = Protocol::Qesp;
        let e = esp(&p, |_| {}).unwrap_err().to_string();
        assert!(e.contains("requires encryption"), "{e}");
    }

    #[test]
    fn costs_give_each_row_its_stages() {
        let mut p = params(&["aes128gcm16", "aes128-sha256"], &[64], "both");
        let rows = esp(&p, |_| {}).unwrap();
        assert!(rows.iter().all(|r| r.stages.is_none()));
        assert!(!serde_json::to_string(&rows).unwrap().contains("stages"));
        p.costs = true;
        let rows = esp(&p, |_| {}).unwrap();
        for r in &rows {
            let Some(st) = &r.stages else {
                assert_eq!(r.suite, SKELETON, "{r:?}");
                continue;
            };
            let mut keys: Vec<&str> = st.keys().map(String::as_str).collect();
            keys.sort();
            let framing = if r.direction == "outbound" {
                "encap"
            } else {
                "decap"
            };
            let mut want = vec![
                "cipher",
                framing,
                "integrity",
                "lookup",
                "receive",
                "replay",
            ];
            want.sort();
            assert_eq!(keys, want, "{r:?}");
            // Every stage that runs took time; AEAD has no integrity of its own.
            for (k, v) in st {
                let aead_integrity = r.suite == "aes128gcm16" && k == "integrity";
                assert_eq!(
                    *v == 0.0,
                    aead_integrity,
                    "{} {} {k}: {v}",
                    r.suite,
                    r.direction
                );
            }
        }
        let text = costs_table(&rows);
        assert_eq!(text.lines().count(), 1 + 4, "{text}");
        assert!(
            text.lines().nth(1).unwrap().starts_with("aes128gcm16"),
            "{text}"
        );
        let v = serde_json::to_value(&rows).unwrap();
        assert!(v[0]["stages"]["cipher"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn table_texts_are_pinned() {
        let r = |suite: &str, size: usize, direction: &'static str, ns: f64| Row {
            suite: suite.into(),
            size,
            direction,
            ns_per_packet: ns,
            mpps: 1e3 / ns,
            gbps: size as f64 * 8.0 / ns,
            ratio_to_raw: None,
            ceiling: None,
            no_copy: None,
            crypto_share: None,
            spread: 0.012,
            stages: None,
            library: None,
        };
        let mut gcm = r("aes128gcm16", 1400, "outbound", 565.4);
        gcm.ratio_to_raw = Some(0.87);
        gcm.ceiling = Some(0.894);
        gcm.no_copy = Some(0.913);
        gcm.crypto_share = Some(0.881);
        gcm.stages = Some(
            [
                ("receive", 15.2),
                ("lookup", 44.0),
                ("replay", 34.0),
                ("encap", 83.0),
                ("cipher", 171.0),
                ("integrity", 0.0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        );
        let rows = [gcm, r(SKELETON, 64, "inbound", 54.0)];
        let want = "\
suite                size direction  ns/packet     Mpps   Gbit/s   vs raw  ceiling  no copy  crypto  spread
aes128gcm16          1400 outbound         565     1.77    19.81      87%      89%      91%     88%      1%
null                   64 inbound           54    18.52     9.48        -        -        -       -      1%
";
        let text = table(&rows);
        assert_eq!(text, want, "\n{text}");
        let want = "\
suite                size direction    receive     lookup     replay   en/decap     cipher  integrity   total probe off
aes128gcm16          1400 outbound      15  4%     44 13%     34 10%     83 24%    171 49%      0  0%     347       565
";
        let text = costs_table(&rows);
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn only_the_asked_direction_is_measured() {
        let rows = esp(&params(&["chacha20poly1305"], &[100], "in"), |_| {}).unwrap();
        assert!(rows.iter().all(|r| r.direction == "inbound"), "{rows:?}");
        let rows = crypto(&params(&["aes256gcm16"], &[100], "both"), |_| {}).unwrap();
        let dirs: Vec<_> = rows.iter().map(|r| r.direction).collect();
        assert_eq!(dirs, ["seal", "open"]);
    }

    #[test]
    fn bad_parameters_are_refused_with_the_option_named() {
        let e = |s: &[&str], sz: &[usize], secs: f64, rep: usize, dir: &str| {
            let s: Vec<String> = s.iter().map(|s| s.to_string()).collect();
            Params::new(&s, sz, secs, rep, dir).unwrap_err().to_string()
        };
        assert!(e(&["aes999"], &[], 1.0, 1, "both").contains("--suite aes999"));
        assert!(e(&["sha256"], &[], 1.0, 1, "both").contains("AH"));
        assert!(e(&[], &[10], 1.0, 1, "both").contains("--size 10"));
        assert!(e(&[], &[64], 0.0, 1, "both").contains("--seconds"));
        assert!(e(&[], &[64], 1.0, 0, "both").contains("--repeat"));
        assert!(e(&[], &[64], 1.0, 1, "up").contains("--direction up"));
    }

    #[test]
    fn the_median_and_spread_of_samples() {
        let s = Samples(vec![3.0, 1.0, 2.0]);
        assert_eq!(s.median(), 2.0);
        assert_eq!(s.spread(), 1.0);
        assert_eq!(Samples(vec![1.0, 3.0]).median(), 2.0);
    }
}
