//! The lab's results document (`results.json`): what a run measured, with
//! the environment it ran in, so runs can be compared and re-rendered
//! (`espgate lab report DIR`) without running anything again.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The value of [`Results::schema`] this code writes and reads.
pub const SCHEMA: &str = "espgate-lab-results/1";

/// One `results.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Results {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Where and how the run happened.
    pub env: Environment,
    /// One record per experiment asked for, in the order they ran.
    pub experiments: Vec<ExperimentRecord>,
    /// Every measured point, of every experiment.
    pub points: Vec<Point>,
}

/// The machine and the settings of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Environment {
    /// `uname -r`.
    pub kernel: String,
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Online CPUs.
    pub cores: usize,
    /// espgate's version (and git commit when known).
    pub espgate_version: String,
    /// The command line that produced the run.
    pub command: String,
    /// Unix time the run started.
    pub started_unix: u64,
    /// Seconds the whole run took.
    pub elapsed_s: f64,
    /// `--quick` was given.
    pub quick: bool,
    /// The run-wide knobs: runs, time per run, points, ...
    pub knobs: BTreeMap<String, String>,
    /// Versions of the other programs measured or used (iperf3, kernel
    /// forwarding, ...), printed beside their figures.
    pub tools: BTreeMap<String, String>,
}

/// What happened to one experiment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExperimentRecord {
    /// The catalogue id, e.g. `000-link10-ip-vs-ipsec`.
    pub id: String,
    /// How it ended.
    pub status: Status,
    /// Our set-up, one line each (topology, traffic, the knob mapping).
    pub setup: Vec<String>,
    /// Things the run noticed (a series not available, a run that failed
    /// and was repeated, ...).
    pub notes: Vec<String>,
    /// Seconds it took.
    pub elapsed_s: f64,
    /// Seconds it was expected to take at these settings.
    pub expected_s: f64,
}

/// How an experiment ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Status {
    /// Every point was measured.
    Done,
    /// It stopped with an error; the points before it are kept.
    Failed {
        /// The error, with its causes.
        error: String,
    },
    /// Ctrl-C stopped it; the points before it are kept.
    Interrupted,
}

/// One measured point: a series at one x, repeated `runs` times.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Point {
    /// The experiment id.
    pub experiment: String,
    /// The series (e.g. `plain`, `esp aes128-sha1 tunnel`).
    pub series: String,
    /// The x value (message size, number of workers, ...); for a category
    /// axis the index of the category and `x_label` its name.
    pub x: f64,
    /// The category name, when x is a category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x_label: Option<String>,
    /// Mean of the samples.
    pub mean: f64,
    /// Half width of the 95 % confidence interval of the mean (0 with one
    /// sample).
    pub ci95: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub runs: usize,
    /// Unit of the samples (`Mbit/s`, `µs`, `%`, ...).
    pub unit: String,
    /// The samples themselves.
    pub samples: Vec<f64>,
    /// Side measurements of the same runs, averaged: CPU states per
    /// gateway (`cpu.gwA.user`, ...), retransmits, loss.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, f64>,
}

impl Results {
    /// The points of experiment `id`, in measurement order.
    pub fn points_of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Point> + 'a {
        self.points.iter().filter(move |p| p.experiment == id)
    }

    /// The record of experiment `id`.
    pub fn record(&self, id: &str) -> Option<&ExperimentRecord> {
        self.experiments.iter().find(|e| e.id == id)
    }

    /// Reads a `results.json` text, refusing another schema.
    pub fn from_json(text: &str) -> anyhow::Result<Results> {
        let r: Results = serde_json::from_str(text)?;
        anyhow::ensure!(
            r.schema == SCHEMA,
            "results schema {:?}, this espgate reads {SCHEMA:?}",
            r.schema
        );
        Ok(r)
    }
}

/// The point of `series` at `x` among `points`.
pub fn find<'a>(points: &[&'a Point], series: &str, x: f64) -> Option<&'a Point> {
    points
        .iter()
        .copied()
        .find(|p| p.series == series && (p.x - x).abs() < 1e-9)
}

/// The points of `series` among `points`, sorted by x.
pub fn series<'a>(points: &[&'a Point], series: &str) -> Vec<&'a Point> {
    let mut v: Vec<&Point> = points
        .iter()
        .copied()
        .filter(|p| p.series == series)
        .collect();
    v.sort_by(|a, b| a.x.total_cmp(&b.x));
    v
}

/// The series names among `points`, in first-seen order.
pub fn series_names(points: &[&Point]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for p in points {
        if !v.contains(&p.series) {
            v.push(p.series.clone());
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_round_trip_and_refuse_another_schema() {
        let r = Results {
            schema: SCHEMA.into(),
            env: Environment::default(),
            experiments: vec![ExperimentRecord {
                id: "x".into(),
                status: Status::Failed {
                    error: "boom".into(),
                },
                setup: vec![],
                notes: vec![],
                elapsed_s: 1.0,
                expected_s: 2.0,
            }],
            points: vec![],
        };
        let j = serde_json::to_string(&r).unwrap();
        assert!(j.contains(r#""state":"failed""#), "{j}");
        assert_eq!(Results::from_json(&j).unwrap(), r);
        let other = j.replace(SCHEMA, "espgate-lab-results/0");
        assert!(Results::from_json(&other)
            .unwrap_err()
            .to_string()
            .contains("schema"));
    }
}
