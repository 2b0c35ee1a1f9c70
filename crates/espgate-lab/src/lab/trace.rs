//! A synthetic traffic trace with the statistics seed 003 prints for its
//! campus backbone trace (§4.2): packet sizes with mean 1187.8 B and
//! standard deviation 524.6 B, sessions with mean 72,615.0 B and standard
//! deviation 460,311.3 B, 18,229 sessions. The trace itself is not
//! available (only its headers were kept, and not published), so
//! `003-real-traffic-dispatch` replays this one instead, labelled
//! synthetic. Everything here is pure and seeded: the same seed gives the
//! same trace.
//!
//! The shapes are ours (the paper gives two moments, not distributions):
//! - packet sizes: a share at the 1500-byte MTU and the rest uniform from
//!   40 bytes up, the share and the upper end solved so that the mean and
//!   the standard deviation are the paper's;
//! - session sizes: lognormal (heavy-tailed), drawn by stratified
//!   quantiles so that the sample, not only the distribution, has the
//!   paper's mean and standard deviation (a lognormal's sample deviation
//!   converges very slowly); a session is `round(bytes / mean packet)`
//!   packets, at least one;
//! - timing: sessions arrive as a Poisson process and each sends its
//!   packets evenly spaced at a rate proportional to the square root of
//!   its packet count (big sessions last longer *and* send faster), the
//!   arrival rate set so that [`CONCURRENT`] sessions are open on average.

/// Mean packet size of the paper's trace, bytes.
pub const PKT_MEAN: f64 = 1187.8;
/// Its standard deviation, bytes.
pub const PKT_SD: f64 = 524.623;
/// Mean session size, bytes.
pub const SESSION_MEAN: f64 = 72_615.0;
/// Its standard deviation, bytes.
pub const SESSION_SD: f64 = 460_311.287;
/// Sessions in the paper's trace.
pub const SESSIONS: usize = 18_229;
/// Smallest packet, bytes (an IPv4 TCP acknowledgement).
pub const PKT_MIN: u32 = 40;
/// Largest packet, bytes (the Ethernet MTU).
pub const PKT_MAX: u32 = 1500;
/// Sessions open at once on average (ours).
pub const CONCURRENT: f64 = 256.0;

/// SplitMix64: small, seeded, good enough to shuffle and sample.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }
}

/// The standard normal quantile function (Acklam's rational
/// approximation, relative error below 1.2e-9), for 0 < p < 1.
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Mean and (population) standard deviation.
pub fn moments(xs: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let (mut n, mut s, mut s2) = (0.0, 0.0, 0.0);
    for x in xs {
        n += 1.0;
        s += x;
        s2 += x * x;
    }
    if n == 0.0 {
        return (f64::NAN, f64::NAN);
    }
    let m = s / n;
    (m, (s2 / n - m * m).max(0.0).sqrt())
}

/// The packet-size mixture: `p` at [`PKT_MAX`], the rest uniform on the
/// integers [`PKT_MIN`]..=`hi`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeMix {
    /// Share of MTU-sized packets.
    pub p: f64,
    /// Upper end of the uniform part, bytes.
    pub hi: u32,
}

impl SizeMix {
    /// Mean and standard deviation of the mixture.
    pub fn moments(&self) -> (f64, f64) {
        let (a, b) = (f64::from(PKT_MIN), f64::from(self.hi));
        let k = b - a + 1.0;
        let um = (a + b) / 2.0;
        let uvar = (k * k - 1.0) / 12.0;
        let big = f64::from(PKT_MAX);
        let m = self.p * big + (1.0 - self.p) * um;
        let m2 = self.p * big * big + (1.0 - self.p) * (uvar + um * um);
        (m, (m2 - m * m).max(0.0).sqrt())
    }

    /// The mixture with mean `mean` whose deviation is nearest `sd`: for
    /// each upper end, the share that gives the mean; the upper end whose
    /// deviation is closest.
    pub fn solve(mean: f64, sd: f64) -> SizeMix {
        let mut best = SizeMix {
            p: 0.0,
            hi: PKT_MIN,
        };
        let mut err = f64::INFINITY;
        for hi in PKT_MIN..PKT_MAX {
            let um = (f64::from(PKT_MIN) + f64::from(hi)) / 2.0;
            let p = (mean - um) / (f64::from(PKT_MAX) - um);
            if !(0.0..=1.0).contains(&p) {
                continue;
            }
            let m = SizeMix { p, hi };
            let e = (m.moments().1 - sd).abs();
            if e < err {
                err = e;
                best = m;
            }
        }
        best
    }

    /// One packet size.
    pub fn sample(&self, rng: &mut Rng) -> u16 {
        if rng.f64() < self.p {
            PKT_MAX as u16
        } else {
            (PKT_MIN + rng.below(u64::from(self.hi - PKT_MIN + 1)) as u32) as u16
        }
    }
}

/// Coefficient of variation of the stratified lognormal sample of `n`
/// values with log-deviation `sigma` (scale-free).
fn strat_cv(n: usize, sigma: f64) -> f64 {
    let (m, s) = moments((0..n).map(|i| {
        let q = (i as f64 + 0.5) / n as f64;
        (sigma * normal_quantile(q)).exp()
    }));
    s / m
}

/// `n` session sizes (bytes, shuffled by `rng`) whose sample mean and
/// standard deviation are `mean` and `sd`: lognormal quantiles at
/// (i + ½)/n, the log-deviation solved by bisection for the coefficient
/// of variation sd/mean, then scaled to the mean. Each at least 1 byte.
pub fn session_sizes(n: usize, mean: f64, sd: f64, rng: &mut Rng) -> Vec<f64> {
    if n == 0 {
        return Vec::new();
    }
    let target = sd / mean;
    let (mut lo, mut hi) = (0.0f64, 12.0f64);
    for _ in 0..80 {
        let mid = (lo + hi) / 2.0;
        if strat_cv(n, mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let sigma = (lo + hi) / 2.0;
    let raw: Vec<f64> = (0..n)
        .map(|i| (sigma * normal_quantile((i as f64 + 0.5) / n as f64)).exp())
        .collect();
    let (m, _) = moments(raw.iter().copied());
    let mut v: Vec<f64> = raw.iter().map(|x| (x * mean / m).max(1.0)).collect();
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

/// One packet of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// The session (0-based; one UDP flow each in the replay).
    pub session: u32,
    /// IPv4 packet size, bytes.
    pub size: u16,
}

/// A synthetic trace: the packets in time order.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Packets in the order they are sent.
    pub packets: Vec<Packet>,
    /// Sessions.
    pub sessions: usize,
    /// The packet-size mixture used.
    pub mix: SizeMix,
}

impl Trace {
    /// The trace of `sessions` sessions from `seed`.
    pub fn synthesize(sessions: usize, seed: u64) -> Trace {
        let mut rng = Rng::new(seed);
        let mix = SizeMix::solve(PKT_MEAN, PKT_SD);
        let bytes = session_sizes(sessions, SESSION_MEAN, SESSION_SD, &mut rng);
        let counts: Vec<u64> = bytes
            .iter()
            .map(|b| ((b / PKT_MEAN).round() as u64).max(1))
            .collect();
        // Poisson arrivals at λ = CONCURRENT / E[duration], duration of a
        // session of k packets = k / √k = √k time units.
        let mean_dur = counts.iter().map(|k| (*k as f64).sqrt()).sum::<f64>() / sessions as f64;
        let lambda = CONCURRENT / mean_dur;
        let mut events: Vec<(f64, u32, u16)> =
            Vec::with_capacity(counts.iter().sum::<u64>() as usize);
        let mut t = 0.0;
        for (s, k) in counts.iter().enumerate() {
            t += -(1.0 - rng.f64()).ln() / lambda;
            let gap = 1.0 / (*k as f64).sqrt();
            // A random phase so that sessions do not send in lockstep.
            let phase = rng.f64() * gap;
            for j in 0..*k {
                events.push((t + phase + j as f64 * gap, s as u32, mix.sample(&mut rng)));
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        Trace {
            packets: events
                .into_iter()
                .map(|(_, session, size)| Packet { session, size })
                .collect(),
            sessions,
            mix,
        }
    }

    /// Bytes of every packet.
    pub fn bytes(&self) -> u64 {
        self.packets.iter().map(|p| u64::from(p.size)).sum()
    }

    /// Mean and standard deviation of the sessions' bytes.
    pub fn session_moments(&self) -> (f64, f64) {
        let mut per = vec![0.0f64; self.sessions];
        for p in &self.packets {
            per[p.session as usize] += f64::from(p.size);
        }
        moments(per)
    }

    /// Mean and standard deviation of the packet sizes.
    pub fn packet_moments(&self) -> (f64, f64) {
        moments(self.packets.iter().map(|p| f64::from(p.size)))
    }

    /// `len` packets from index `start`, wrapping at the end.
    pub fn window(&self, start: usize, len: usize) -> impl Iterator<Item = &Packet> + '_ {
        let n = self.packets.len();
        (0..len.min(n)).map(move |i| &self.packets[(start + i) % n])
    }

    /// Sessions open (first packet sent, last not yet) at packet `at`.
    pub fn open_at(&self, at: usize) -> usize {
        let mut first = vec![usize::MAX; self.sessions];
        let mut last = vec![0usize; self.sessions];
        for (i, p) in self.packets.iter().enumerate() {
            let s = p.session as usize;
            first[s] = first[s].min(i);
            last[s] = i;
        }
        (0..self.sessions)
            .filter(|s| first[*s] <= at && last[*s] >= at)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs()
    }

    #[test]
    fn the_quantile_function_is_the_normals() {
        assert!(normal_quantile(0.5).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959_963_985).abs() < 1e-7);
        assert!((normal_quantile(0.025) + 1.959_963_985).abs() < 1e-7);
        assert!((normal_quantile(0.001) + 3.090_232_306).abs() < 1e-6);
        assert!((normal_quantile(1e-6) + 4.753_424_309).abs() < 1e-5);
    }

    #[test]
    fn the_rng_is_seeded_and_uniform() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        let mut r = Rng::new(1);
        let (m, s) = moments((0..100_000).map(|_| r.f64()));
        assert!((m - 0.5).abs() < 0.01 && (s - (1.0f64 / 12.0).sqrt()).abs() < 0.01);
        assert!((0..1000).all(|_| r.below(6) < 6));
    }

    #[test]
    fn the_size_mixture_has_the_papers_moments() {
        let mix = SizeMix::solve(PKT_MEAN, PKT_SD);
        let (m, s) = mix.moments();
        assert!(rel(m, PKT_MEAN) < 1e-9, "{m}");
        assert!((s - PKT_SD).abs() < 1.0, "{s}");
        assert!(
            mix.p > 0.5 && mix.p < 1.0 && mix.hi > PKT_MIN && mix.hi < PKT_MAX,
            "{mix:?}"
        );
        let mut r = Rng::new(3);
        let xs: Vec<f64> = (0..200_000)
            .map(|_| f64::from(mix.sample(&mut r)))
            .collect();
        assert!(xs.iter().all(|x| (40.0..=1500.0).contains(x)));
        let (m, s) = moments(xs);
        assert!(rel(m, PKT_MEAN) < 0.01 && rel(s, PKT_SD) < 0.01, "{m} {s}");
    }

    #[test]
    fn session_sizes_have_the_papers_sample_moments_and_a_heavy_tail() {
        for n in [300, SESSIONS] {
            let v = session_sizes(n, SESSION_MEAN, SESSION_SD, &mut Rng::new(9));
            assert_eq!(v.len(), n);
            let (m, s) = moments(v.iter().copied());
            assert!(rel(m, SESSION_MEAN) < 0.01, "{n}: {m}");
            assert!(rel(s, SESSION_SD) < 0.01, "{n}: {s}");
            // Heavy tail: the median far below the mean, the top 1 % of
            // sessions hold a large part of the bytes.
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            assert!(sorted[n / 2] < SESSION_MEAN / 3.0, "{}", sorted[n / 2]);
            let top: f64 = sorted[n - n / 100..].iter().sum();
            assert!(top / (m * n as f64) > 0.3);
        }
    }

    #[test]
    fn a_trace_has_the_papers_statistics_and_every_packet_once() {
        let t = Trace::synthesize(2000, 42);
        let (pm, ps) = t.packet_moments();
        assert!(
            rel(pm, PKT_MEAN) < 0.02 && rel(ps, PKT_SD) < 0.02,
            "{pm} {ps}"
        );
        let (sm, ss) = t.session_moments();
        assert!(rel(sm, SESSION_MEAN) < 0.03, "{sm}");
        assert!(rel(ss, SESSION_SD) < 0.05, "{ss}");
        // Every session sends at least one packet; about 61 per session.
        let mut seen = vec![0u64; t.sessions];
        for p in &t.packets {
            seen[p.session as usize] += 1;
        }
        assert!(seen.iter().all(|k| *k >= 1));
        let per = t.packets.len() as f64 / t.sessions as f64;
        assert!((50.0..75.0).contains(&per), "{per}");
        // Many sessions are open at once past the start.
        let open = t.open_at(t.packets.len() / 4);
        assert!((100..600).contains(&open), "{open}");
        // Same seed, same trace; another seed, another.
        assert_eq!(Trace::synthesize(2000, 42).packets, t.packets);
        assert_ne!(Trace::synthesize(2000, 43).packets, t.packets);
        // Windows wrap.
        assert_eq!(t.window(t.packets.len() - 1, 2).count(), 2);
        assert_eq!(t.window(0, usize::MAX).count(), t.packets.len());
    }
}
