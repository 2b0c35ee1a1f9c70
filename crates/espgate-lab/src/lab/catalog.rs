//! The catalogue: every experiment `espgate lab` knows, with how to run it
//! and how to judge it. The experiments themselves live in one module per
//! paper ([`super::p000`], [`super::p001`], [`super::p002`],
//! [`super::p003`], [`super::p004`]); this module
//! holds what they share: the sweep over namespaces and the helpers that
//! turn points into findings.

use super::experiment::{Experiment, Finding, Verdict};
use super::model::{Point, Results};
use super::rig::{NetSpec, PathSpec, Rig, Traffic};
use super::run::{Ctx, Knobs, Plan};
use super::seeds::{Claim, Seeds};
use anyhow::Result;
use std::sync::OnceLock;

/// An experiment with its runner.
pub struct Entry {
    /// What it is.
    pub exp: Experiment,
    /// What it will do at these knobs (for the time estimate).
    pub plan: fn(&Knobs) -> Plan,
    /// Runs it.
    pub run: fn(&mut Ctx) -> Result<()>,
}

/// Every experiment, in catalogue order.
pub fn all() -> &'static [Entry] {
    static ALL: OnceLock<Vec<Entry>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut v = super::p000::entries();
        v.extend(super::p001::entries());
        v.extend(super::p002::entries());
        v.extend(super::p003::entries());
        v.extend(super::p004::entries());
        v
    })
}

/// Why experiment `id` cannot run on this espgate yet (a rig not built),
/// if it cannot: `lab list` marks it, `lab run` refuses it.
pub fn pending(id: &str) -> Option<&'static str> {
    super::p003::pending(id)
}

/// The experiments only, for the report.
pub fn experiments() -> Vec<&'static Experiment> {
    all().iter().map(|e| &e.exp).collect()
}

// ── sweeps over the namespace rig ───────────────────────────────────────

/// A series of a sweep: its name and what carries the traffic.
pub struct Series {
    /// Name in the plots and tables.
    pub name: String,
    /// The network under it.
    pub net: NetSpec,
    /// Plain routing or an espgate pair.
    pub path: PathSpec,
}

/// Brings each series up in turn and measures `traffic` at each message
/// size of `sizes` (the x axis), Mbit/s received. `tweak` may change the
/// rig after it is up (start a flood, ...).
pub fn sweep(
    ctx: &mut Ctx,
    series: &[Series],
    sizes: &[u32],
    traffic: Traffic,
    mut tweak: impl FnMut(&mut Rig) -> Result<()>,
) -> Result<()> {
    for s in series {
        let mut rig = Rig::up(&ctx.prefix, &s.net, &s.path, &ctx.knobs.exe)?;
        tweak(&mut rig)?;
        for line in rig.describe() {
            ctx.setup(format!("{}: {line}", s.name));
        }
        for &len in sizes {
            let t = Traffic {
                len,
                secs: traffic.secs,
                ..traffic
            };
            ctx.measure(&s.name, f64::from(len), None, "Mbit/s", || {
                let r = rig.iperf(&t)?;
                Ok((r.mbps, r.extra))
            })?;
        }
    }
    Ok(())
}

/// The plan of a [`sweep`]: `series` rigs, `series × sizes` points.
pub fn sweep_plan(k: &Knobs, series: usize, sizes: usize) -> Plan {
    Plan {
        rigs: series,
        points: series * sizes,
        sample_s: k.secs(),
    }
}

/// TCP, one direction, the run's duration.
pub fn tcp(k: &Knobs) -> Traffic {
    Traffic {
        udp: false,
        len: 1024,
        bidir: false,
        secs: k.secs(),
        udp_rate_bps: None,
    }
}

// ── judging ─────────────────────────────────────────────────────────────

/// The points of experiment `id`.
pub fn pts<'a>(r: &'a Results, id: &str) -> Vec<&'a Point> {
    r.points.iter().filter(|p| p.experiment == id).collect()
}

/// The mean of `series` at `x` among `p`.
pub fn at(p: &[&Point], series: &str, x: f64) -> Option<f64> {
    super::model::find(p, series, x).map(|p| p.mean)
}

/// The mean of `series` at its largest x.
pub fn at_max_x(p: &[&Point], series: &str) -> Option<(f64, f64)> {
    super::model::series(p, series)
        .last()
        .map(|p| (p.x, p.mean))
}

/// The claim of seed table `table` whose metric contains `needle`.
pub fn claim(table: &str, needle: &str) -> Option<Claim> {
    Seeds::get().table(table)?.claim(needle)
}

/// The words of seed table `table`.
pub fn words(table: &str) -> String {
    Seeds::get()
        .table(table)
        .map(|t| t.words.clone())
        .unwrap_or_default()
}

/// Judges a measured magnitude against the paper's claim.
///
/// - a range or a value ("3–5 %", "about 2"): agrees within the range
///   widened by half on each side (×0.5 .. ×1.5), partly within ×0.25 ..
///   ×2.5 with the same sign, differs otherwise;
/// - a bound ("more than 50 %", "up to 300 Mbps"): agrees on the right
///   side of it, partly within a factor 2 on the wrong side, differs
///   beyond.
pub fn judge(c: &Claim, ours: f64) -> Verdict {
    let same_sign = (ours > 0.0) == (c.lo > 0.0);
    match c.relation.as_str() {
        "gt" if ours >= c.lo => Verdict::Agrees,
        "gt" if same_sign && ours >= c.lo * 0.5 => Verdict::Partly,
        "lt" | "le" if ours <= c.lo => Verdict::Agrees,
        "lt" | "le" if ours <= c.lo * 2.0 => Verdict::Partly,
        "gt" | "lt" | "le" => Verdict::Differs,
        _ if ours >= c.lo * 0.5 && ours <= c.hi * 1.5 => Verdict::Agrees,
        _ if same_sign && ours >= c.lo * 0.25 && ours <= c.hi * 2.5 => Verdict::Partly,
        _ => Verdict::Differs,
    }
}

/// A finding for points that were not measured.
pub fn missing(paper: String, what: &str) -> Finding {
    Finding {
        paper,
        ours: format!("not measured ({what})"),
        verdict: Verdict::NotMeasured,
    }
}

/// Formats a number for a sentence: 3 significant digits at most.
pub fn n(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// (b − a) / a in percent, as a signed string ("+4.1 %", "−19 %").
pub fn pct(a: f64, b: f64) -> String {
    match super::stats::pct_change(a, b) {
        Some(p) if p >= 0.0 => format!("+{} %", n(p)),
        Some(p) => format!("−{} %", n(-p)),
        None => "n/a".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(rel: &str, lo: f64, hi: f64) -> Claim {
        Claim {
            metric: "m".into(),
            relation: rel.into(),
            lo,
            hi,
            unit: "%".into(),
            condition: String::new(),
        }
    }

    #[test]
    fn judging_ranges_bounds_and_signs() {
        assert_eq!(judge(&c("range", 3.0, 5.0), 4.0), Verdict::Agrees);
        assert_eq!(judge(&c("range", 3.0, 5.0), 1.6), Verdict::Agrees);
        assert_eq!(judge(&c("range", 3.0, 5.0), 9.0), Verdict::Partly);
        assert_eq!(judge(&c("range", 3.0, 5.0), 20.0), Verdict::Differs);
        assert_eq!(judge(&c("range", 3.0, 5.0), -2.0), Verdict::Differs);
        assert_eq!(judge(&c("gt", 50.0, 50.0), 60.0), Verdict::Agrees);
        assert_eq!(judge(&c("gt", 50.0, 50.0), 30.0), Verdict::Partly);
        assert_eq!(judge(&c("le", 300.0, 300.0), 250.0), Verdict::Agrees);
        assert_eq!(judge(&c("le", 300.0, 300.0), 500.0), Verdict::Partly);
        assert_eq!(judge(&c("le", 300.0, 300.0), 900.0), Verdict::Differs);
        assert_eq!(judge(&c("gt", 50.0, 50.0), 10.0), Verdict::Differs);
        assert_eq!(judge(&c("eq", 3.0, 3.0), 3.0), Verdict::Agrees);
        assert_eq!(judge(&c("approx", 2.0, 2.0), 1.2), Verdict::Agrees);
    }

    #[test]
    fn every_catalogue_id_is_listed_once_with_its_seed_tables() {
        let ids: Vec<&str> = all().iter().map(|e| e.exp.id).collect();
        for want in [
            "000-link10-ip-vs-ipsec",
            "000-link100-lowend",
            "000-link100-medium",
            "000-link100-highend",
            "000-link1000-p4",
            "000-link1000-xeon",
            "000-link1000-cpu",
            "000-tune-tcp",
            "000-tune-napi",
            "000-tune-napi-jumbo",
            "000-tune-mtu",
            "001-baseline-plain",
            "001-cipher-sweep-tcp",
            "001-cipher-sweep-udp",
            "001-nofrag-mss",
            "001-rekey-5s",
            "001-tune-tcp",
            "001-itr-cross-traffic",
            "001-socket-buffers",
            "001-buffers-nofrag",
            "001-parallel-crypto",
            "002-analytic-overhead",
            "002-throughput-esp-vs-qesp",
            "002-priority-congestion",
            "003-design-comparisons",
            "003-capacity-model",
            "003-fixed-size-scaling",
            "003-real-traffic-dispatch",
            "003-failover",
            "004-ike-timing",
            "004-ike-psk-vs-sig",
            "004-ike-aggressive",
            "004-ike-noop",
            "004-esp-timing",
            "004-esp-cipher-compare",
            "004-esp-noop",
        ] {
            assert_eq!(ids.iter().filter(|i| **i == want).count(), 1, "{want}");
        }
        assert_eq!(ids.len(), 36);
        let waiting: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|i| pending(i).is_some())
            .collect();
        assert!(waiting.is_empty(), "{waiting:?}");
        for e in all() {
            assert!(!e.exp.plots.is_empty(), "{}: no plot", e.exp.id);
            assert!(!e.exp.question.is_empty() && !e.exp.our_setup.is_empty());
            for t in e.exp.seed_tables {
                assert!(
                    Seeds::get().table(t).is_some(),
                    "{}: seed table {t}",
                    e.exp.id
                );
            }
        }
    }

    #[test]
    fn findings_of_empty_results_say_not_measured_and_never_panic() {
        let r = Results {
            schema: super::super::model::SCHEMA.into(),
            env: Default::default(),
            experiments: vec![],
            points: vec![],
        };
        for e in all() {
            let f = (e.exp.findings)(&r);
            assert!(!f.is_empty(), "{}: no finding", e.exp.id);
            for x in f {
                assert_eq!(x.verdict, Verdict::NotMeasured, "{}: {x:?}", e.exp.id);
                assert!(!x.paper.is_empty());
            }
        }
    }
}
