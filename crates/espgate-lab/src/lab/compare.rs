//! `espgate lab compare BEFORE AFTER`: two runs of the same experiments
//! (typically `--gateway-binary OLD` and the current build, run one after
//! the other) side by side, point by point, with the ratio of their means.
//!
//! A point is matched by experiment, series and x. Besides the means, each
//! row says whether the two points' ranges (smallest to largest sample)
//! overlap, since one point of one run is often within the other's spread
//! on a shared machine, and the gateways' CPU (the `gw*.user` and
//! `gw*.system` side measurements, % of one CPU, summed) when the rig
//! measured it: a change that keeps the throughput but lowers the CPU is a
//! gain too. Points in one run only are counted, not hidden.

use super::model::{Point, Results};
use super::report::{num, x_name};
use espgate_api::table::{Column, Table};
use std::collections::BTreeMap;

/// The gateways' CPU of a point: the sum of its `gw*.user` and
/// `gw*.system` side measurements, or `None` when it has none.
fn gateway_cpu(p: &Point) -> Option<f64> {
    let mut sum = None;
    for (k, v) in &p.extra {
        if k.starts_with("gw") && (k.ends_with(".user") || k.ends_with(".system")) {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// The key a point is matched by.
fn key(p: &Point) -> (String, String, u64) {
    (p.experiment.clone(), p.series.clone(), p.x.to_bits())
}

/// One line about a run: where and with what it ran.
fn about(name: &str, r: &Results) -> String {
    let gateways = match r.env.tools.get("espgate (gateways)") {
        Some(g) => format!(", gateways {g}"),
        None => String::new(),
    };
    format!(
        "{name}: espgate {}{gateways} on {} ({} CPUs, kernel {}): {}",
        r.env.espgate_version, r.env.cpu_model, r.env.cores, r.env.kernel, r.env.command
    )
}

/// The comparison of `before` and `after` as text: a header naming both
/// runs, then per experiment (those whose id starts with one of `only`, or
/// all when `only` is empty) a table of the points both have, then the
/// count of points only one has.
pub fn compare(before: &Results, after: &Results, only: &[String]) -> String {
    let wanted = |id: &str| only.is_empty() || only.iter().any(|o| id.starts_with(o.as_str()));
    let old: BTreeMap<_, &Point> = before
        .points
        .iter()
        .filter(|p| wanted(&p.experiment))
        .map(|p| (key(p), p))
        .collect();
    let mut out = format!("{}\n{}\n", about("before", before), about("after", after));
    // Experiments in the order the later run made them.
    let mut ids: Vec<&str> = Vec::new();
    for p in &after.points {
        if wanted(&p.experiment) && !ids.contains(&p.experiment.as_str()) {
            ids.push(&p.experiment);
        }
    }
    let mut matched = 0;
    for id in ids {
        let mut t = Table::new([
            Column::left("series"),
            Column::right("x"),
            Column::left("unit"),
            Column::right("before"),
            Column::right("after"),
            Column::right("after/before"),
            Column::left("ranges"),
            Column::right("gw CPU % before"),
            Column::right("after"),
        ]);
        let mut rows = 0;
        for p in after.points.iter().filter(|p| p.experiment == id) {
            let Some(b) = old.get(&key(p)) else { continue };
            let ratio = if b.mean != 0.0 {
                num(p.mean / b.mean)
            } else {
                "–".into()
            };
            let ranges = if p.min <= b.max && b.min <= p.max {
                "overlap"
            } else {
                "apart"
            };
            let cpu = |q: &Point| gateway_cpu(q).map(num).unwrap_or_else(|| "–".into());
            t.row([
                p.series.clone(),
                x_name(p),
                p.unit.clone(),
                num(b.mean),
                num(p.mean),
                ratio,
                ranges.to_string(),
                cpu(b),
                cpu(p),
            ]);
            rows += 1;
        }
        matched += rows;
        if rows > 0 {
            out.push_str(&format!("\n## {id}\n{}", t.render()));
        }
    }
    let new: std::collections::BTreeSet<_> = after
        .points
        .iter()
        .filter(|p| wanted(&p.experiment))
        .map(key)
        .collect();
    let only_before = old.keys().filter(|k| !new.contains(*k)).count();
    let only_after = new.iter().filter(|k| !old.contains_key(*k)).count();
    out.push_str(&format!(
        "\n{matched} point(s) in both runs; {only_before} only before, {only_after} only after\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::super::model::{Environment, SCHEMA};
    use super::*;

    fn point(exp: &str, series: &str, x: f64, samples: &[f64], gw: Option<f64>) -> Point {
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        let mut extra = BTreeMap::new();
        if let Some(c) = gw {
            extra.insert("gwA.user".to_string(), c / 4.0);
            extra.insert("gwA.system".to_string(), c / 4.0);
            extra.insert("gwB.user".to_string(), c / 2.0);
        }
        extra.insert("cpu.idle".to_string(), 50.0);
        Point {
            experiment: exp.into(),
            series: series.into(),
            x,
            x_label: None,
            mean,
            ci95: 0.0,
            min: samples.iter().copied().fold(f64::INFINITY, f64::min),
            max: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            runs: samples.len(),
            unit: "Mbit/s".into(),
            samples: samples.to_vec(),
            extra,
        }
    }

    fn results(version: &str, points: Vec<Point>) -> Results {
        Results {
            schema: SCHEMA.into(),
            env: Environment {
                espgate_version: version.into(),
                command: format!("espgate lab run … ({version})"),
                ..Environment::default()
            },
            experiments: Vec::new(),
            points,
        }
    }

    /// The row of `series` at `x` in experiment `id`'s table, split into
    /// cells.
    fn row(text: &str, id: &str, series: &str, x: &str) -> Vec<String> {
        let table = text.split(&format!("## {id}\n")).nth(1).expect("the table");
        let line = table
            .lines()
            .find(|l| {
                l.starts_with(series) && l[series.len()..].split_whitespace().next() == Some(x)
            })
            .unwrap_or_else(|| panic!("no row {series} {x} in\n{text}"));
        line[series.len()..]
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    #[test]
    fn points_are_matched_by_experiment_series_and_x() {
        let before = results(
            "0.1.0 (old)",
            vec![
                point("000-a", "ESP", 64.0, &[100.0, 110.0], Some(80.0)),
                point("000-a", "ESP", 512.0, &[400.0, 420.0], Some(90.0)),
                point("000-a", "plain", 64.0, &[0.0], None),
                point("001-b", "ESP", 64.0, &[50.0], None),
                point("001-b", "gone", 1.0, &[1.0], None),
            ],
        );
        let after = results(
            "0.1.0 (new)",
            vec![
                point("000-a", "ESP", 512.0, &[500.0, 520.0], Some(80.0)),
                point("000-a", "ESP", 64.0, &[108.0, 112.0], Some(70.0)),
                point("000-a", "plain", 64.0, &[5.0], None),
                point("001-b", "ESP", 64.0, &[60.0], None),
                point("001-b", "new", 2.0, &[1.0], None),
            ],
        );
        let mut before = before;
        before.env.tools.insert(
            "espgate (gateways)".into(),
            "espgate 0.1.0 (/tmp/old/espgate)".into(),
        );
        let text = compare(&before, &after, &[]);
        assert!(
            text.starts_with(
                "before: espgate 0.1.0 (old), gateways espgate 0.1.0 (/tmp/old/espgate) on"
            ),
            "{text}"
        );
        assert!(text.contains("\nafter: espgate 0.1.0 (new)"), "{text}");
        // Means, ratio, ranges and the gateways' CPU (A's user + system +
        // B's user; not cpu.idle).
        assert_eq!(
            row(&text, "000-a", "ESP", "512"),
            ["512", "Mbit/s", "410", "510", "1.24", "apart", "90.0", "80.0"]
        );
        assert_eq!(
            row(&text, "000-a", "ESP", "64"),
            ["64", "Mbit/s", "105", "110", "1.05", "overlap", "80.0", "70.0"]
        );
        // A zero before has no ratio; no CPU measured shows a dash.
        assert_eq!(
            row(&text, "000-a", "plain", "64"),
            ["64", "Mbit/s", "0", "5.00", "–", "apart", "–", "–"]
        );
        assert!(text.ends_with("4 point(s) in both runs; 1 only before, 1 only after\n"));
        // Only the experiments asked for.
        let one = compare(&before, &after, &["001".to_string()]);
        assert!(
            !one.contains("## 000-a") && one.contains("## 001-b"),
            "{one}"
        );
        assert!(one.ends_with("1 point(s) in both runs; 1 only before, 1 only after\n"));
    }

    #[test]
    fn runs_without_common_points_say_so() {
        let before = results("old", vec![point("000-a", "ESP", 64.0, &[1.0], None)]);
        let after = results("new", vec![point("004-z", "ESP", 64.0, &[1.0], None)]);
        let text = compare(&before, &after, &[]);
        assert!(!text.contains("##"), "{text}");
        assert!(text.ends_with("0 point(s) in both runs; 1 only before, 1 only after\n"));
    }
}
