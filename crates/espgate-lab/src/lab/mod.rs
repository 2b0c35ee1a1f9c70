//! `espgate lab`: the experiments of the seed papers, run on espgate, with
//! the papers' own numbers beside ours, in one report.
//!
//! - [`model`]: `results.json`, what a run measured;
//! - [`stats`]: means, confidence intervals and seed 000's stopping rule;
//! - [`experiment`]: what an experiment is (id, question, plots, findings);
//! - [`seeds`]: the numbers the papers print, with their sources;
//! - [`report`]: `report.html` (plots inline) and `report.md`;
//! - [`catalog`]: every experiment, one module per paper ([`p000`],
//!   [`p001`], [`p002`], [`p003`], [`p004`]);
//! - [`probe`]: a constant-rate UDP stream with one-way latency;
//! - [`rig`]: the namespace topology with the papers' knobs;
//! - [`cluster_rig`]: seed 003's flat cluster of n nodes on flooding
//!   bridges, with the lab as the cluster agent;
//! - [`trace`]: a synthetic trace with seed 003's traffic statistics;
//! - [`run`]: the repetition loop, progress, Ctrl-C, `results.json`;
//! - [`compare`]: two runs' common points side by side (`lab compare`).

pub mod catalog;
pub mod cli;
pub mod cluster_rig;
pub mod compare;
pub mod experiment;
pub mod model;
pub mod p000;
pub mod p001;
pub mod p002;
pub mod p003;
pub mod p004;
pub mod probe;
pub mod report;
pub mod rig;
pub mod run;
pub mod seeds;
pub mod stats;
pub mod trace;
