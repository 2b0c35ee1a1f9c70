//! Sample statistics and the stopping rule of seed 000 (netperf's `-i
//! 12,4 -I 95,3`): repeat a measurement at least `min` and at most `max`
//! times, stopping as soon as the 95 % confidence interval of the mean is
//! no wider than `width` percent of the mean.

/// Two-sided 95 % quantiles of Student's t distribution, t(0.975, df), for
/// df = 1..=30 (standard tables); beyond 30 the normal quantile is close
/// enough (within 2 %) and [`t95`] interpolates to it.
const T95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// t(0.975, df); `df` 0 has no interval and gives infinity.
pub fn t95(df: usize) -> f64 {
    match df {
        0 => f64::INFINITY,
        1..=30 => T95[df - 1],
        // Cornish–Fisher expansion, two terms: within 1e-4 of the tables
        // from df = 31 on.
        _ => {
            let z: f64 = 1.959_964;
            let d = df as f64;
            z + (z.powi(3) + z) / (4.0 * d)
                + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * d * d)
        }
    }
}

/// Summary of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1 in the denominator; 0 for n < 2).
    pub sd: f64,
    /// Half width of the 95 % confidence interval of the mean (infinite
    /// for n < 2: one sample says nothing about its spread).
    pub ci95: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
}

/// Summarises `xs`; `None` when it is empty or holds a NaN or infinity.
pub fn summarize(xs: &[f64]) -> Option<Summary> {
    if xs.is_empty() || xs.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let n = xs.len();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let sd = if n < 2 {
        0.0
    } else {
        (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    };
    let ci95 = if n < 2 {
        f64::INFINITY
    } else {
        t95(n - 1) * sd / (n as f64).sqrt()
    };
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Summary {
        n,
        mean,
        sd,
        ci95,
        min,
        max,
    })
}

/// When to stop repeating a point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StopRule {
    /// Never fewer samples than this.
    pub min: usize,
    /// Never more samples than this.
    pub max: usize,
    /// Stop when the whole interval (2 × half width) is at most this
    /// percentage of |mean|.
    pub width_pct: f64,
}

impl StopRule {
    /// Seed 000's rule: 4 to 12 runs, a 95 % interval 3 % wide.
    pub const SEED_000: StopRule = StopRule {
        min: 4,
        max: 12,
        width_pct: 3.0,
    };

    /// A rule that takes exactly `n` samples.
    pub fn exactly(n: usize) -> StopRule {
        StopRule {
            min: n,
            max: n,
            width_pct: 0.0,
        }
    }

    /// True when the samples so far are enough.
    pub fn done(&self, xs: &[f64]) -> bool {
        if xs.len() >= self.max.max(1) {
            return true;
        }
        if xs.len() < self.min.max(2) {
            return false;
        }
        match summarize(xs) {
            // A mean of 0 with no spread (e.g. zero loss every time) is
            // as settled as it gets.
            Some(s) if s.sd == 0.0 => true,
            Some(s) => 2.0 * s.ci95 <= self.width_pct / 100.0 * s.mean.abs(),
            None => false,
        }
    }

    /// True when `xs` reached the width (not only the run limit).
    pub fn converged(&self, xs: &[f64]) -> bool {
        match summarize(xs) {
            Some(s) if s.n >= 2 => {
                s.sd == 0.0 || 2.0 * s.ci95 <= self.width_pct / 100.0 * s.mean.abs()
            }
            _ => false,
        }
    }
}

/// Relative difference (b − a) / a in percent; `None` when a is 0.
pub fn pct_change(a: f64, b: f64) -> Option<f64> {
    (a != 0.0 && a.is_finite() && b.is_finite()).then(|| (b - a) / a * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn summary_matches_a_hand_computation() {
        // mean 5, deviations -3 -1 1 3 -> ss 20, sd sqrt(20/3)
        let s = summarize(&[2.0, 4.0, 6.0, 8.0]).unwrap();
        assert_eq!(s.n, 4);
        assert!(close(s.mean, 5.0, 1e-12));
        assert!(close(s.sd, (20.0f64 / 3.0).sqrt(), 1e-12));
        // t(0.975, 3) = 3.182; sd / sqrt(4) = 1.2910 -> 4.108
        assert!(close(s.ci95, 3.182 * (20.0f64 / 3.0).sqrt() / 2.0, 1e-9));
        assert!(close(s.ci95, 4.108, 1e-3));
        assert_eq!((s.min, s.max), (2.0, 8.0));
    }

    #[test]
    fn one_sample_has_no_interval_and_bad_input_no_summary() {
        let s = summarize(&[7.0]).unwrap();
        assert_eq!((s.mean, s.sd), (7.0, 0.0));
        assert!(s.ci95.is_infinite());
        assert!(summarize(&[]).is_none());
        assert!(summarize(&[1.0, f64::NAN]).is_none());
        assert!(summarize(&[1.0, f64::INFINITY]).is_none());
    }

    #[test]
    fn t_quantiles_fall_towards_the_normal_one() {
        assert!(t95(0).is_infinite());
        assert_eq!(t95(1), 12.706);
        assert_eq!(t95(30), 2.042);
        let mut last = f64::INFINITY;
        for df in 1..200 {
            let t = t95(df);
            assert!(t < last, "df {df}: {t} !< {last}");
            assert!(t > 1.959);
            last = t;
        }
        // beyond the table the approximation joins it smoothly
        assert!(close(t95(31), 2.0395, 0.0005));
        assert!(close(t95(120), 1.9799, 0.0005));
    }

    #[test]
    fn the_rule_waits_for_min_stops_at_max_and_on_a_narrow_interval() {
        let r = StopRule::SEED_000;
        // identical samples: settled, but only after the minimum
        assert!(!r.done(&[100.0; 3]));
        assert!(r.done(&[100.0; 4]));
        // 1 % spread: 4 samples give a narrow enough interval
        let tight = [100.0, 101.0, 99.0, 100.0];
        let s = summarize(&tight).unwrap();
        assert!(2.0 * s.ci95 <= 3.0, "{s:?}");
        assert!(r.done(&tight));
        assert!(r.converged(&tight));
        // 20 % spread: not done before the maximum ...
        let mut wide = vec![80.0, 120.0, 90.0, 110.0];
        assert!(!r.done(&wide));
        while wide.len() < 11 {
            wide.push(if wide.len() % 2 == 0 { 80.0 } else { 120.0 });
            assert!(!r.done(&wide), "{}", wide.len());
        }
        wide.push(100.0);
        // ... and done at it, without having converged
        assert!(r.done(&wide));
        assert!(!r.converged(&wide));
    }

    #[test]
    fn exactly_n_takes_n() {
        let r = StopRule::exactly(1);
        assert!(!r.done(&[]));
        assert!(r.done(&[3.0]));
        let r = StopRule::exactly(3);
        assert!(!r.done(&[1.0, 50.0]));
        assert!(r.done(&[1.0, 50.0, 7.0]));
    }

    #[test]
    fn percent_change() {
        assert_eq!(pct_change(100.0, 97.0), Some(-3.0));
        assert_eq!(pct_change(0.0, 5.0), None);
    }
}
