//! `espgate lab list|run|report`: the command line of the lab.

use super::catalog::{self, Entry};
use super::model::Results;
use super::run::{self, human, Knobs};
use super::seeds::Seeds;
use anyhow::{Context, Result};
use espgate_api::table::{Column, Table};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
Examples:
  espgate lab list                          every experiment, with its expected time
  espgate lab run all --quick               everything, tiny durations (a few minutes)
  espgate lab run 000-link10-ip-vs-ipsec 004 --out lab-out
  espgate lab run all --runs 12 --time 10   closer to the papers' settings (hours)
  espgate lab report lab-out                re-render report.html/report.md from results.json

Experiment ids are those of the seed catalogue (000-… to 004-…); a prefix selects
every id that starts with it. Every experiment has its rig now; one listed with `no rig`
would wait for a rig not built yet: `all` and prefixes would leave it out, and naming it
alone would say why. Each point is repeated until its 95 % confidence interval
is at most 3 % of the mean wide, at least 4 and at most 12 times (seed 000's rule;
--runs N: at most N); past 4 runs, only while the experiment is within its expected
time, so the default `run all` keeps to its estimate (a point cut short says so in the
report). results.json is written after every point; Ctrl-C stops cleanly,
removes what the run made and keeps what was measured. Needs root, iproute2, ping,
iperf3 and (for 002-priority-congestion) nftables for the network experiments (the 004
ones, 002-analytic-overhead and 003-capacity-model|design-comparisons run in memory; seed
003's cluster experiments run up to 6 espgate nodes in namespaces with CPU cgroups).";

/// `espgate lab`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum LabCmd {
    /// The experiments: id, paper, what varies and what is measured, and
    /// the expected run time at the default and --quick settings.
    List,
    /// Runs experiments (ids, prefixes or `all`) and writes results.json,
    /// report.html and report.md.
    #[command(after_long_help = USAGE)]
    Run(RunArgs),
    /// Renders report.html and report.md from DIR/results.json.
    Report {
        /// The directory of a run.
        dir: PathBuf,
    },
    /// Two runs side by side: every point both measured (same experiment,
    /// series and x), with the ratio of the means, whether the ranges
    /// overlap, and the gateways' CPU.
    #[command(after_long_help = COMPARE_USAGE)]
    Compare {
        /// The earlier run: its directory or its results.json.
        before: PathBuf,
        /// The later run.
        after: PathBuf,
        /// Only these experiments (ids or prefixes).
        #[arg(value_name = "ID")]
        ids: Vec<String>,
    },
}

const COMPARE_USAGE: &str = "\
Example: the same experiment with an older build's gateways, then this build's
  espgate lab run 000-link1000 --gateway-binary /tmp/old/espgate --out lab-old
  espgate lab run 000-link1000 --out lab-new
  espgate lab compare lab-old lab-new

One run per side is one sample of each point: on a shared machine read a ratio
whose ranges overlap as no change, and repeat before drawing conclusions.";

/// Reads the results of a run from its directory or its results.json.
fn read_results(path: &std::path::Path) -> Result<Results> {
    anyhow::ensure!(
        path.exists(),
        "{}: no such directory or file (give a run's directory or its results.json)",
        path.display()
    );
    let file = if path.is_dir() {
        path.join("results.json")
    } else {
        path.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    Results::from_json(&text).with_context(|| format!("{}", file.display()))
}

/// The options of `espgate lab run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Experiment ids, prefixes (e.g. 000, 004-ike) or `all`.
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// Tiny durations and one or two points per experiment.
    #[arg(long)]
    pub quick: bool,
    /// At most N runs per point (at least min(4, N)).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: Option<u32>,
    /// Seconds per traffic run [default: 2; 1 with --quick].
    #[arg(long, value_name = "S")]
    pub time: Option<f64>,
    /// Points per sweep (message sizes, ...) [default: each experiment's].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub points: Option<u32>,
    /// Output directory [default: lab-YYYYmmdd-HHMMSS].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The espgate binary the gateways run [default: this one].
    #[arg(long, value_name = "PATH")]
    pub gateway_binary: Option<PathBuf>,
}

/// Runs `espgate lab …`.
pub fn main(cmd: &LabCmd) -> Result<ExitCode> {
    match cmd {
        LabCmd::List => {
            print!("{}", list());
            Ok(ExitCode::SUCCESS)
        }
        LabCmd::Run(a) => run_cmd(a),
        LabCmd::Report { dir } => {
            let r = read_results(&dir.join("results.json"))?;
            let (h, m) = super::report::write(dir, &r, &exps(), Seeds::get())?;
            println!("{}\n{}", h.display(), m.display());
            Ok(ExitCode::SUCCESS)
        }
        LabCmd::Compare { before, after, ids } => {
            let (b, a) = (read_results(before)?, read_results(after)?);
            print!("{}", super::compare::compare(&b, &a, ids));
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `chosen` without the experiments that wait for a rig not built yet;
/// an error saying why when one of them was named by its exact id.
fn runnable<'a>(chosen: &[&'a Entry], ids: &[String]) -> Result<Vec<&'a Entry>> {
    let mut out = Vec::new();
    for e in chosen {
        match catalog::pending(e.exp.id) {
            Some(why) if ids.iter().any(|i| i == e.exp.id) => {
                anyhow::bail!("{}: {why}", e.exp.id)
            }
            Some(_) => eprintln!("espgate lab: leaving out {} (no rig yet)", e.exp.id),
            None => out.push(*e),
        }
    }
    anyhow::ensure!(
        !out.is_empty(),
        "nothing to run: every experiment named waits for a rig not built yet"
    );
    Ok(out)
}

fn exps() -> Vec<super::experiment::Experiment> {
    catalog::all().iter().map(|e| e.exp).collect()
}

/// The table of `espgate lab list`.
pub fn list() -> String {
    let knobs = |quick| Knobs {
        quick,
        runs: None,
        time: None,
        points: None,
        exe: PathBuf::new(),
    };
    let (d, q) = (knobs(false), knobs(true));
    let mut t = Table::new([
        Column::left("id"),
        Column::left("paper"),
        Column::left("varies"),
        Column::left("measures"),
        Column::right("default"),
        Column::right("--quick"),
    ]);
    let (mut td, mut tq) = (0.0, 0.0);
    let mut waiting = 0;
    for e in catalog::all() {
        let (ed, eq) = if catalog::pending(e.exp.id).is_some() {
            waiting += 1;
            ("no rig".to_string(), "no rig".to_string())
        } else {
            let ed = (e.plan)(&d).expected_s(&d.rule());
            let eq = (e.plan)(&q).expected_s(&q.rule());
            td += ed;
            tq += eq;
            (human(ed), human(eq))
        };
        t.row([
            e.exp.id.to_string(),
            e.exp.paper.to_string(),
            e.exp.varies.to_string(),
            e.exp.measures.to_string(),
            ed,
            eq,
        ]);
    }
    format!(
        "{}\n{} experiments ({waiting} wait for a rig not built yet: \"no rig\"); all: about {} \
         (default), {} (--quick). Papers: {}\n",
        t.render(),
        catalog::all().len(),
        human(td),
        human(tq),
        Seeds::get()
            .papers
            .iter()
            .filter(|p| ["000", "001", "003", "004"].contains(&p.id.as_str()))
            .map(|p| {
                if p.venue.contains(&p.year.to_string()) {
                    format!("{} = {} ({})", p.id, p.title, p.venue)
                } else {
                    format!("{} = {} ({}, {})", p.id, p.title, p.venue, p.year)
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    )
}

fn run_cmd(a: &RunArgs) -> Result<ExitCode> {
    let entries: Vec<&Entry> = runnable(&run::select(&a.ids)?, &a.ids)?;
    if let Some(t) = a.time {
        anyhow::ensure!(
            t.is_finite() && (1.0..=600.0).contains(&t),
            "--time {t}: 1 to 600 seconds"
        );
    }
    let exe = match &a.gateway_binary {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("locating the espgate binary")?,
    };
    let knobs = Knobs {
        quick: a.quick,
        runs: a.runs.map(|n| n as usize),
        time: a.time,
        points: a.points.map(|n| n as usize),
        exe,
    };
    let out = a.out.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from(format!("lab-{secs}"))
    });
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let r = run::run(&entries, &knobs, &out, &command)?;
    let (h, m) = super::report::write(&out, &r, &exps(), Seeds::get())?;
    let failed = r
        .experiments
        .iter()
        .filter(|e| !matches!(e.status, super::model::Status::Done))
        .count();
    eprintln!(
        "espgate lab: {} experiment(s) in {}, {} point(s); {} not done. Report: {} ({})",
        r.experiments.len(),
        human(r.env.elapsed_s),
        r.points.len(),
        failed,
        h.display(),
        m.display()
    );
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
