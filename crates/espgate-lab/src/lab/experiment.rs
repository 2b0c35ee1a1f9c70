//! What an experiment is, for the list, the runner and the report.

use super::model::Results;

/// One experiment of the catalogue.
#[derive(Clone, Copy)]
pub struct Experiment {
    /// The catalogue id, e.g. `000-link10-ip-vs-ipsec`.
    pub id: &'static str,
    /// The paper: `000`, `001`, `002`, `003` or `004` (see
    /// [`super::seeds::Seeds::paper`]).
    pub paper: &'static str,
    /// A short title.
    pub title: &'static str,
    /// The paper's question, in our words.
    pub question: &'static str,
    /// The paper's set-up, in our words.
    pub paper_setup: &'static str,
    /// Our set-up, in general terms (the run adds its exact settings to
    /// [`super::model::ExperimentRecord::setup`]).
    pub our_setup: &'static str,
    /// What varies (the x axis and the series).
    pub varies: &'static str,
    /// What is measured (the y axis).
    pub measures: &'static str,
    /// Ids of the seed tables (see [`super::seeds`]) to print beside ours.
    pub seed_tables: &'static [&'static str],
    /// The plots of the report's section.
    pub plots: &'static [PlotSpec],
    /// Computes the findings (paper's vs ours) from the results.
    pub findings: fn(&Results) -> Vec<Finding>,
}

/// A plot of an experiment's points.
#[derive(Debug, Clone, Copy)]
pub struct PlotSpec {
    /// The plot's title.
    pub title: &'static str,
    /// How the points are drawn.
    pub kind: PlotKind,
    /// Only points with this unit (e.g. `Mbit/s`); a plot has one y unit.
    pub unit: &'static str,
    /// Only series whose name starts with this prefix ("" = all).
    pub series_prefix: &'static str,
    /// The x axis' label.
    pub x_label: &'static str,
    /// A logarithmic x axis (message sizes).
    pub log_x: bool,
}

/// How a plot draws points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlotKind {
    /// y against a numeric x, a line per series, with the CI as error bars.
    Lines,
    /// Grouped bars: a group per x (category, `x_label`), a bar per series.
    Bars,
    /// Stacked bars: a bar per series, stacked by x (category): e.g. the
    /// CPU states (user, system, softirq) of each gateway.
    Stacked,
}

/// One finding: what the paper saw, what we saw, whether they agree.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The paper's finding, in our words, with its numbers.
    pub paper: String,
    /// Ours, stated from our numbers.
    pub ours: String,
    /// Whether they agree.
    pub verdict: Verdict,
}

/// Whether a finding of ours agrees with the paper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Ours shows the same thing.
    Agrees,
    /// Ours shows part of it, or the same direction with another size.
    Partly,
    /// Ours shows something else.
    Differs,
    /// The points needed were not measured (failed, interrupted, or a
    /// transform espgate does not have).
    NotMeasured,
}

impl Verdict {
    /// A word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Partly => "partly",
            Verdict::Differs => "differs",
            Verdict::NotMeasured => "not measured",
        }
    }
}
