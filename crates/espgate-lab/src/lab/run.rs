//! Running experiments: the knobs of a run, the repetition loop with the
//! stopping rule, progress, Ctrl-C, and `results.json` written after every
//! point so an interrupted run keeps what it measured.

use super::catalog::{self, Entry};
use super::model::{Environment, ExperimentRecord, Point, Results, Status, SCHEMA};
use super::stats::{summarize, StopRule};
use crate::netlab;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The settings of one `espgate lab run`.
#[derive(Debug, Clone)]
pub struct Knobs {
    /// Tiny durations and one or two points per experiment.
    pub quick: bool,
    /// At most this many runs per point (at least min(4, N)); default
    /// seed 000's 4..12 (1 with `--quick`).
    pub runs: Option<usize>,
    /// Seconds per traffic run (default 2; 1 with `--quick`).
    pub time: Option<f64>,
    /// Points per sweep (default: each experiment's own choice).
    pub points: Option<usize>,
    /// The espgate binary the gateways run.
    pub exe: PathBuf,
}

impl Knobs {
    /// The stopping rule of this run.
    pub fn rule(&self) -> StopRule {
        match (self.runs, self.quick) {
            (Some(n), _) => StopRule {
                min: n.clamp(1, 4),
                max: n.max(1),
                width_pct: StopRule::SEED_000.width_pct,
            },
            (None, true) => StopRule::exactly(1),
            (None, false) => StopRule::SEED_000,
        }
    }

    /// Seconds of one traffic run.
    pub fn secs(&self) -> f64 {
        self.time.unwrap_or(if self.quick { 1.0 } else { 2.0 })
    }

    /// `n` of `all`, spread evenly and always with the first and the last
    /// (`--points` overrides `n`; `--quick` takes `quick_n`).
    pub fn pick<T: Clone>(&self, all: &[T], n: usize, quick_n: usize) -> Vec<T> {
        let n = self.points.unwrap_or(if self.quick { quick_n } else { n });
        spread(all, n)
    }
}

/// `n` elements of `all`, evenly spread, first and last included.
pub fn spread<T: Clone>(all: &[T], n: usize) -> Vec<T> {
    let n = n.clamp(1, all.len().max(1));
    if all.is_empty() {
        return Vec::new();
    }
    if n == 1 {
        return vec![all[all.len() - 1].clone()];
    }
    let mut idx: Vec<usize> = (0..n)
        .map(|i| (i * (all.len() - 1) + (n - 1) / 2) / (n - 1))
        .collect();
    idx.dedup();
    idx.into_iter().map(|i| all[i].clone()).collect()
}

/// What an experiment will do, for its time estimate.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plan {
    /// Topologies brought up (each a few seconds).
    pub rigs: usize,
    /// Points measured.
    pub points: usize,
    /// Seconds of one sample.
    pub sample_s: f64,
}

impl Plan {
    /// Expected seconds: rigs × 4 s, and per point the rule's minimum of
    /// runs (maximum when it is a fixed count) × (sample + 1 s).
    pub fn expected_s(&self, rule: &StopRule) -> f64 {
        let runs = if rule.width_pct == 0.0 {
            rule.max
        } else {
            rule.min.max(1) + 1
        };
        self.rigs as f64 * RIG_S + self.points as f64 * runs as f64 * (self.sample_s + 1.0)
    }
}

/// Seconds to build one rig (namespaces, gateways, first ping), measured
/// at about 1 s on the 2-vCPU machine; 2 s leaves room for slower ones.
const RIG_S: f64 = 2.0;

/// A running experiment's handle on the run.
pub struct Ctx<'a> {
    /// The run's settings.
    pub knobs: &'a Knobs,
    /// Prefix for namespace names (short: names are at most 15 bytes).
    pub prefix: String,
    results: &'a mut Results,
    rec: ExperimentRecord,
    out: &'a Path,
    bar: &'a ProgressBar,
    base: f64,
    started: Instant,
    /// Points the plan expects (for the time budget of `measure`).
    planned_points: usize,
    /// Points recorded by this experiment so far.
    recorded: usize,
}

impl Ctx<'_> {
    /// The experiment's id.
    pub fn id(&self) -> &str {
        &self.rec.id
    }

    /// The points measured so far in this run.
    pub fn points(&self) -> &[Point] {
        &self.results.points
    }

    /// Adds a line to our set-up.
    pub fn setup(&mut self, line: impl Into<String>) {
        let l = line.into();
        if !self.rec.setup.contains(&l) {
            self.rec.setup.push(l);
        }
    }

    /// Adds a note.
    pub fn note(&mut self, line: impl Into<String>) {
        let l = line.into();
        if !self.bar.is_hidden() {
            self.bar.println(format!("  note: {l}"));
        } else {
            eprintln!("  note: {l}");
        }
        self.rec.notes.push(l);
    }

    /// Records a point measured elsewhere (e.g. a bench that repeats by
    /// itself): its samples are summarised here.
    pub fn record(
        &mut self,
        series: &str,
        x: f64,
        x_label: Option<&str>,
        unit: &str,
        samples: &[f64],
        extra: BTreeMap<String, f64>,
    ) -> Result<()> {
        let Some(s) = summarize(samples) else {
            bail!("{series} at {x}: no valid sample");
        };
        self.results.points.push(Point {
            experiment: self.rec.id.clone(),
            series: series.to_string(),
            x,
            x_label: x_label.map(str::to_string),
            mean: s.mean,
            ci95: if s.ci95.is_finite() { s.ci95 } else { 0.0 },
            min: s.min,
            max: s.max,
            runs: s.n,
            unit: unit.to_string(),
            samples: samples.to_vec(),
            extra,
        });
        self.recorded += 1;
        self.save()
    }

    /// Measures `series` at `x` by calling `f` until the run's stopping
    /// rule is met; records the point. `f` gives one sample and its side
    /// measurements (averaged into the point's `extra`).
    pub fn measure(
        &mut self,
        series: &str,
        x: f64,
        x_label: Option<&str>,
        unit: &str,
        mut f: impl FnMut() -> Result<(f64, BTreeMap<String, f64>)>,
    ) -> Result<()> {
        let rule = self.knobs.rule();
        let mut xs = Vec::new();
        let mut extra_sum: BTreeMap<String, f64> = BTreeMap::new();
        let at = x_label
            .map(str::to_string)
            .unwrap_or_else(|| format!("{x}"));
        let mut budget_cut = false;
        while !rule.done(&xs) {
            if xs.len() >= rule.min.max(1) && self.behind_schedule() {
                budget_cut = true;
                break;
            }
            netlab::check_interrupt()?;
            self.bar.set_message(format!(
                "{} · {series} · {at} · run {}",
                self.rec.id,
                xs.len() + 1
            ));
            self.tick();
            let (v, extra) = f().with_context(|| format!("{series} at {at}"))?;
            xs.push(v);
            for (k, e) in extra {
                *extra_sum.entry(k).or_default() += e;
            }
        }
        if !rule.converged(&xs) && xs.len() > 1 {
            let s = summarize(&xs).expect("finite samples");
            let why = if budget_cut {
                "the experiment's time budget; --runs or --time go deeper"
            } else {
                "the limit"
            };
            self.rec.notes.push(format!(
                "{series} at {at}: the 95 % interval is ±{:.1} % of the mean after {} runs ({why})",
                s.ci95 / s.mean.abs().max(f64::MIN_POSITIVE) * 100.0,
                xs.len()
            ));
        }
        let n = xs.len() as f64;
        let extra = extra_sum.into_iter().map(|(k, v)| (k, v / n)).collect();
        self.record(series, x, x_label, unit, &xs, extra)
    }

    /// True when the experiment has used more than its expected time's
    /// share for the points up to and including the current one. Past
    /// the rule's minimum runs, a point takes more runs only while it is
    /// on schedule, so a noisy point cannot stretch a default run past
    /// its estimate by the rule's 12/5 (the estimate counts min + 1 runs).
    fn behind_schedule(&self) -> bool {
        if self.planned_points == 0 {
            return false;
        }
        let share =
            (self.recorded + 1).min(self.planned_points) as f64 / self.planned_points as f64;
        self.started.elapsed().as_secs_f64() > self.rec.expected_s * share
    }

    fn tick(&self) {
        let pos = self.base
            + self
                .started
                .elapsed()
                .as_secs_f64()
                .min(self.rec.expected_s);
        self.bar.set_position(pos as u64);
    }

    fn save(&mut self) -> Result<()> {
        save(self.out, self.results, Some(&self.rec))
    }
}

/// Writes `results.json` into `out` (with `current` as it stands).
fn save(out: &Path, results: &Results, current: Option<&ExperimentRecord>) -> Result<()> {
    let mut r = results.clone();
    if let Some(c) = current {
        r.experiments.push(c.clone());
    }
    let path = out.join("results.json");
    let tmp = out.join(".results.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(&r)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// The environment of this machine.
pub fn environment(command: &str, knobs: &Knobs) -> Environment {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let tool = |cmd: &[&str]| -> String {
        std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .output()
            .ok()
            .map(|o| {
                let s = String::from_utf8_lossy(&o.stdout).to_string();
                s.lines().next().unwrap_or("").trim().to_string()
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "not found".into())
    };
    let mut k = BTreeMap::new();
    let rule = knobs.rule();
    k.insert(
        "runs per point".into(),
        if rule.min == rule.max {
            format!("{}", rule.max)
        } else {
            format!(
                "{}..{} (stop when the 95 % CI is ≤ {} % wide)",
                rule.min, rule.max, rule.width_pct
            )
        },
    );
    k.insert(
        "seconds per traffic run".into(),
        format!("{}", knobs.secs()),
    );
    if let Some(p) = knobs.points {
        k.insert("points per sweep".into(), p.to_string());
    }
    let mut tools = BTreeMap::new();
    tools.insert("iperf3".into(), tool(&["iperf3", "--version"]));
    tools.insert("iproute2".into(), tool(&["ip", "-V"]));
    // Gateways run by another build (`--gateway-binary`, a before/after):
    // its version and path, since `espgate_version` is this lab's.
    let same = |a: &Path, b: &Path| a.canonicalize().ok() == b.canonicalize().ok();
    let this = std::env::current_exe().unwrap_or_default();
    if !knobs.exe.as_os_str().is_empty() && !same(&knobs.exe, &this) {
        let exe = knobs.exe.to_string_lossy();
        tools.insert(
            "espgate (gateways)".into(),
            format!("{} ({exe})", tool(&[&exe, "--version"])),
        );
    }
    Environment {
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        cpu_model,
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        espgate_version: crate::version(),
        command: command.to_string(),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        elapsed_s: 0.0,
        quick: knobs.quick,
        knobs: k,
        tools,
    }
}

/// Resolves `ids` (`all`, exact ids, or prefixes such as `000` or
/// `004-ike`) to catalogue entries, in catalogue order.
pub fn select(ids: &[String]) -> Result<Vec<&'static Entry>> {
    let all = catalog::all();
    if ids.is_empty() {
        bail!("name experiments to run (see `espgate lab list`), or `all`");
    }
    let mut chosen: Vec<&Entry> = Vec::new();
    for id in ids {
        let m: Vec<&Entry> = if id == "all" {
            all.iter().collect()
        } else if let Some(e) = all.iter().find(|e| e.exp.id == id) {
            vec![e]
        } else {
            all.iter()
                .filter(|e| e.exp.id == id || e.exp.id.starts_with(id.as_str()))
                .collect()
        };
        if m.is_empty() {
            bail!("no experiment {id:?} (see `espgate lab list`)");
        }
        for e in m {
            if !chosen.iter().any(|c| c.exp.id == e.exp.id) {
                chosen.push(e);
            }
        }
    }
    chosen.sort_by_key(|e| all.iter().position(|a| a.exp.id == e.exp.id));
    Ok(chosen)
}

/// Runs `entries` with `knobs`, writing `results.json` and the report
/// into `out`. Returns the results; an error only when nothing could run
/// (no root, no output directory). Experiments that fail are recorded as
/// failed and the run goes on; Ctrl-C ends it, keeping what was measured.
pub fn run(entries: &[&Entry], knobs: &Knobs, out: &Path, command: &str) -> Result<Results> {
    netlab::require_root("espgate lab run")?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    netlab::install_signal_handlers();
    let rule = knobs.rule();
    let expected: Vec<f64> = entries
        .iter()
        .map(|e| (e.plan)(knobs).expected_s(&rule))
        .collect();
    let total: f64 = expected.iter().sum();
    eprintln!(
        "espgate lab: {} experiment(s), expected {} (results in {})",
        entries.len(),
        human(total),
        out.display()
    );
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let bar = if tty {
        let b = ProgressBar::new(total.max(1.0) as u64);
        b.set_style(
            ProgressStyle::with_template("{bar:30} {percent:>3}% ETA {eta:>4} {wide_msg}")
                .expect("a valid template"),
        );
        b.enable_steady_tick(Duration::from_millis(500));
        b
    } else {
        ProgressBar::hidden()
    };
    let mut results = Results {
        schema: SCHEMA.into(),
        env: environment(command, knobs),
        experiments: Vec::new(),
        points: Vec::new(),
    };
    let t0 = Instant::now();
    let mut base = 0.0;
    for (i, (e, exp_s)) in entries.iter().zip(&expected).enumerate() {
        let line = format!(
            "[{}/{}] {} — {} (expected {})",
            i + 1,
            entries.len(),
            e.exp.id,
            e.exp.title,
            human(*exp_s)
        );
        if tty {
            bar.println(line);
        } else {
            eprintln!("{line}");
        }
        let started = Instant::now();
        let rec = ExperimentRecord {
            id: e.exp.id.to_string(),
            status: Status::Done,
            setup: Vec::new(),
            notes: Vec::new(),
            elapsed_s: 0.0,
            expected_s: *exp_s,
        };
        let mut ctx = Ctx {
            knobs,
            prefix: format!("lab{}", std::process::id() % 100_000),
            results: &mut results,
            rec,
            out,
            bar: &bar,
            base,
            started,
            planned_points: (e.plan)(knobs).points,
            recorded: 0,
        };
        let r = (e.run)(&mut ctx);
        let mut rec = ctx.rec;
        rec.elapsed_s = started.elapsed().as_secs_f64();
        let interrupted = netlab::interrupted();
        rec.status = match r {
            Ok(()) => Status::Done,
            Err(_) if interrupted => Status::Interrupted,
            Err(err) => Status::Failed {
                error: format!("{err:#}"),
            },
        };
        let done = match &rec.status {
            Status::Done => format!("  done in {}", human(rec.elapsed_s)),
            Status::Interrupted => "  interrupted".to_string(),
            Status::Failed { error } => format!("  FAILED: {error}"),
        };
        if tty {
            bar.println(done);
        } else {
            eprintln!("{done}");
        }
        results.experiments.push(rec);
        results.env.elapsed_s = t0.elapsed().as_secs_f64();
        save(out, &results, None)?;
        base += exp_s;
        bar.set_position(base as u64);
        if interrupted {
            break;
        }
    }
    bar.finish_and_clear();
    results.env.elapsed_s = t0.elapsed().as_secs_f64();
    save(out, &results, None)?;
    Ok(results)
}

/// Seconds as "1 h 02 min", "3 min 05 s" or "12 s".
pub fn human(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{} h {:02} min", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs() -> Knobs {
        Knobs {
            quick: false,
            runs: None,
            time: None,
            points: None,
            exe: PathBuf::from("espgate"),
        }
    }

    #[test]
    fn the_gateways_build_is_recorded_when_it_is_not_this_one() {
        let this = std::env::current_exe().unwrap();
        let env = environment(
            "lab",
            &Knobs {
                exe: this,
                ..knobs()
            },
        );
        assert!(!env.tools.contains_key("espgate (gateways)"), "{env:?}");
        let other = Knobs {
            exe: "/bin/true".into(),
            ..knobs()
        };
        let env = environment("lab", &other);
        let g = &env.tools["espgate (gateways)"];
        assert!(
            g.starts_with("true (GNU coreutils)") && g.ends_with(" (/bin/true)"),
            "{g}"
        );
    }

    #[test]
    fn spread_keeps_the_ends_and_is_even() {
        let all = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768];
        assert_eq!(spread(&all, 1), vec![32768]);
        assert_eq!(spread(&all, 2), vec![64, 32768]);
        assert_eq!(spread(&all, 4), vec![64, 512, 4096, 32768]);
        assert_eq!(spread(&all, 10), all.to_vec());
        assert_eq!(spread(&all, 50), all.to_vec());
        assert!(spread::<u32>(&[], 3).is_empty());
    }

    #[test]
    fn knobs_choose_the_rule_and_points() {
        let mut k = knobs();
        assert_eq!(k.rule(), StopRule::SEED_000);
        assert_eq!(k.secs(), 2.0);
        assert_eq!(k.pick(&[1, 2, 3, 4, 5], 3, 1), vec![1, 3, 5]);
        k.quick = true;
        assert_eq!(k.rule(), StopRule::exactly(1));
        assert_eq!(k.secs(), 1.0);
        assert_eq!(k.pick(&[1, 2, 3, 4, 5], 3, 1), vec![5]);
        k.runs = Some(2);
        assert_eq!((k.rule().min, k.rule().max), (2, 2));
        k.runs = Some(20);
        assert_eq!((k.rule().min, k.rule().max), (4, 20));
        k.points = Some(2);
        assert_eq!(k.pick(&[1, 2, 3, 4, 5], 3, 1), vec![1, 5]);
    }

    #[test]
    fn plans_estimate_time() {
        let p = Plan {
            rigs: 2,
            points: 10,
            sample_s: 3.0,
        };
        // 2 × 2 s + 10 points × 5 runs × 4 s
        assert_eq!(p.expected_s(&StopRule::SEED_000), 204.0);
        assert_eq!(p.expected_s(&StopRule::exactly(1)), 44.0);
    }

    /// Runs `measure` once on noisy samples (they never converge) with
    /// `expected_s` as the experiment's budget; the runs it took.
    fn runs_taken(expected_s: f64) -> (usize, Vec<String>) {
        let k = knobs();
        let dir = std::env::temp_dir().join(format!(
            "espgate-lab-budget-{}-{}",
            std::process::id(),
            expected_s
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut results = Results {
            schema: SCHEMA.into(),
            env: Environment::default(),
            experiments: Vec::new(),
            points: Vec::new(),
        };
        let bar = ProgressBar::hidden();
        let mut ctx = Ctx {
            knobs: &k,
            prefix: "t".into(),
            results: &mut results,
            rec: ExperimentRecord {
                id: "x".into(),
                status: Status::Done,
                setup: Vec::new(),
                notes: Vec::new(),
                elapsed_s: 0.0,
                expected_s,
            },
            out: &dir,
            bar: &bar,
            base: 0.0,
            started: Instant::now(),
            planned_points: 2,
            recorded: 0,
        };
        let mut i = 0u32;
        ctx.measure("s", 1.0, None, "u", || {
            i += 1;
            std::thread::sleep(Duration::from_millis(5));
            Ok((
                if i.is_multiple_of(2) { 1.0 } else { 10.0 },
                BTreeMap::new(),
            ))
        })
        .unwrap();
        let notes = ctx.rec.notes.clone();
        let n = results.points[0].runs;
        std::fs::remove_dir_all(&dir).unwrap();
        (n, notes)
    }

    #[test]
    fn a_point_behind_schedule_stops_at_the_minimum_runs() {
        // On schedule: the rule's limit (12), the note says so.
        let (n, notes) = runs_taken(3600.0);
        assert_eq!(n, StopRule::SEED_000.max);
        assert!(notes[0].contains("(the limit)"), "{notes:?}");
        // Budget used up: the minimum (4), and the note names the budget.
        let (n, notes) = runs_taken(0.0);
        assert_eq!(n, StopRule::SEED_000.min);
        assert!(notes[0].contains("time budget"), "{notes:?}");
    }

    #[test]
    fn selection_by_id_prefix_and_all() {
        let n = catalog::all().len();
        assert_eq!(select(&["all".into()]).unwrap().len(), n);
        let exact = select(&["000-link10-ip-vs-ipsec".into()]).unwrap();
        assert_eq!(exact.len(), 1);
        let some = select(&["004".into()]).unwrap();
        assert!(!some.is_empty() && some.iter().all(|e| e.exp.id.starts_with("004")));
        let one = select(&["004-esp-noop".into(), "004-esp-noop".into()]).unwrap();
        assert_eq!(one.len(), 1);
        assert!(select(&["nope".into()]).is_err());
        assert!(select(&[]).is_err());
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(12.4), "12 s");
        assert_eq!(human(185.0), "3 min 05 s");
        assert_eq!(human(3720.0), "1 h 02 min");
    }
}
