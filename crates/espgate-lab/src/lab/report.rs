//! The lab's report: `report.html`, one self-contained page (inline style,
//! inline SVG plots, no scripts, nothing fetched), and `report.md`, the
//! same text and tables with a pointer to the HTML for each plot.
//!
//! For each experiment that ran: the paper's question and set-up beside
//! ours, our plots and points, the numbers the paper prints, and the
//! findings (the paper's, ours, whether they agree).

use super::experiment::{Experiment, Finding, PlotKind, PlotSpec, Verdict};
use super::model::{self, ExperimentRecord, Point, Results, Status};
use super::seeds::{SeedTable, Seeds};
use anyhow::Context;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

/// Renders the report of `results` for the experiments of `catalog` that
/// appear in `results.experiments` (in the order they ran), as one
/// self-contained HTML page.
pub fn html(results: &Results, catalog: &[Experiment], seeds: &Seeds) -> String {
    let doc = render(results, catalog, seeds);
    let mut out = String::with_capacity(doc.html.len() + STYLE.len() + 512);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str("<title>espgate lab report</title>\n<style>\n");
    out.push_str(STYLE);
    out.push_str("</style>\n</head>\n<body>\n<main>\n");
    out.push_str(&doc.html);
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

/// The same report as Markdown (GitHub-flavoured pipe tables); each plot
/// is a line pointing to `report.html`.
pub fn markdown(results: &Results, catalog: &[Experiment], seeds: &Seeds) -> String {
    render(results, catalog, seeds).md
}

/// One plot as an SVG document string; `None` when no point matches the
/// spec (unit, series prefix) or none of the matching ones can be drawn
/// (NaN or infinite values, x ≤ 0 on a logarithmic axis).
pub fn plot_svg(spec: &PlotSpec, points: &[&Point]) -> Option<String> {
    let pts: Vec<&Point> = points
        .iter()
        .copied()
        .filter(|p| p.unit == spec.unit && p.series.starts_with(spec.series_prefix))
        .filter(|p| p.mean.is_finite())
        .filter(|p| match spec.kind {
            PlotKind::Lines => p.x.is_finite() && (!spec.log_x || p.x > 0.0),
            // Categories: the name is x_label, or x itself.
            PlotKind::Bars | PlotKind::Stacked => p.x_label.is_some() || p.x.is_finite(),
        })
        .collect();
    if pts.is_empty() {
        return None;
    }
    let mut svg = String::new();
    let drawn = {
        let root = SVGBackend::with_string(&mut svg, (PLOT_W, PLOT_H)).into_drawing_area();
        let r = match spec.kind {
            PlotKind::Lines => draw_lines(&root, spec, &pts),
            PlotKind::Bars => draw_bars(&root, spec, &pts),
            PlotKind::Stacked => draw_stacked(&root, spec, &pts),
        };
        r.and_then(|()| root.present().map_err(Into::into))
            .map_err(|e| e.to_string())
    };
    if let Err(e) = drawn {
        // Never seen with the SVG backend; say so in the picture rather
        // than losing the section.
        svg = format!(
            "<svg width=\"{PLOT_W}\" height=\"60\" viewBox=\"0 0 {PLOT_W} 60\" \
             xmlns=\"http://www.w3.org/2000/svg\"><text x=\"10\" y=\"30\" \
             font-family=\"sans-serif\" font-size=\"13\">{}: the plot failed: {}</text></svg>\n",
            esc(spec.title),
            esc(&e)
        );
    }
    Some(svg)
}

/// Writes `DIR/report.html` and `DIR/report.md` (creating DIR); returns
/// their paths.
pub fn write(
    dir: &Path,
    results: &Results,
    catalog: &[Experiment],
    seeds: &Seeds,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let h = dir.join("report.html");
    let m = dir.join("report.md");
    std::fs::write(&h, html(results, catalog, seeds))
        .with_context(|| format!("writing {}", h.display()))?;
    std::fs::write(&m, markdown(results, catalog, seeds))
        .with_context(|| format!("writing {}", m.display()))?;
    Ok((h, m))
}

// ---------------------------------------------------------------------------
// The document: HTML and Markdown written side by side
// ---------------------------------------------------------------------------

const STYLE: &str = r#":root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --head: #f0f3f6; --zebra: #f8fafc; --accent: #0b5cad; }
* { box-sizing: border-box; }
body { margin: 0; background: #fff; color: var(--fg); font: 15px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif; }
main { max-width: 1000px; margin: 0 auto; padding: 28px 24px 64px; }
h1 { font-size: 1.9em; margin: 0 0 .2em; }
h2 { font-size: 1.4em; margin: 2.2em 0 .4em; padding-bottom: .25em; border-bottom: 2px solid var(--line); }
h3 { font-size: 1.08em; margin: 1.5em 0 .4em; }
h4 { font-size: 1em; margin: 1.2em 0 .2em; }
p { margin: .45em 0; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .9em; background: #f3f4f6; padding: .05em .3em; border-radius: 3px; }
.lead { color: var(--muted); margin-bottom: 1.5em; }
.ref { color: var(--muted); font-size: .95em; }
.meta { color: var(--muted); font-size: .9em; }
.muted { color: var(--muted); font-style: italic; }
section.experiment { margin-top: 3em; }
.table-wrap { overflow-x: auto; margin: .6em 0 1.1em; }
table { border-collapse: collapse; font-size: .9em; }
th, td { border: 1px solid var(--line); padding: 5px 9px; text-align: left; vertical-align: top; }
thead th { background: var(--head); font-weight: 600; white-space: nowrap; }
tbody tr:nth-child(even) { background: var(--zebra); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.kv th { background: var(--head); width: 12em; white-space: nowrap; }
table.setups td { width: 50%; }
table.setups ul { margin: .4em 0 0; padding-left: 1.2em; }
.two { display: grid; grid-template-columns: 1fr 1fr; gap: 0 28px; }
@media (max-width: 720px) { .two { grid-template-columns: 1fr; } }
figure { margin: 1em 0 1.4em; padding: 10px; border: 1px solid var(--line); border-radius: 6px; background: #fff; }
figure svg { display: block; max-width: 100%; height: auto; margin: 0 auto; }
figcaption { margin-top: .4em; color: var(--muted); font-size: .9em; text-align: center; }
.verdict { display: inline-block; padding: .05em .55em; border-radius: 999px; font-size: .85em; font-weight: 600; white-space: nowrap; border: 1px solid transparent; }
.v-agrees { background: #dafbe1; color: #116329; border-color: #aceebb; }
.v-partly { background: #fff1c2; color: #7a4d00; border-color: #f2d675; }
.v-differs { background: #ffe0e0; color: #a40e26; border-color: #ffb3b8; }
.v-not-measured { background: #eef0f2; color: #59636e; border-color: #d1d9e0; }
.status { margin: .8em 0; padding: .6em .9em; border-left: 4px solid; border-radius: 4px; }
.status-failed { background: #fff0f0; border-color: #cf222e; }
.status-interrupted { background: #fff8e1; border-color: #bf8700; }
.status pre { margin: .3em 0 0; white-space: pre-wrap; font: .88em/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.state-done { color: #116329; }
.state-failed { color: #a40e26; font-weight: 600; }
.state-interrupted { color: #7a4d00; font-weight: 600; }
footer { margin-top: 4em; padding-top: 1em; border-top: 1px solid var(--line); color: var(--muted); font-size: .85em; }
"#;

/// HTML text: `&<>"'` escaped.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Markdown text: the characters that would start markup or HTML
/// backslash-escaped.
fn md(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | '`' | '*' | '<' | '>' | '|' | '[' | ']') {
            o.push('\\');
        }
        o.push(c);
    }
    o
}

/// Markdown text for a table cell: one line.
fn md_cell(s: &str) -> String {
    md(&s.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// One cell of a table, as HTML and as Markdown.
struct Cell {
    html: String,
    md: String,
}

impl Cell {
    fn text(s: &str) -> Cell {
        Cell {
            html: esc(s),
            md: md_cell(s),
        }
    }

    fn rich(html: String, md: String) -> Cell {
        Cell { html, md }
    }
}

/// A table with a header row; `num` columns are right-aligned.
struct Table {
    class: &'static str,
    head: Vec<(String, bool)>,
    rows: Vec<Vec<Cell>>,
}

impl Table {
    fn new(class: &'static str, head: &[(&str, bool)]) -> Table {
        Table {
            class,
            head: head.iter().map(|(h, n)| (h.to_string(), *n)).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push(cells);
    }
}

/// The report being written, in both formats at once.
#[derive(Default)]
struct Doc {
    html: String,
    md: String,
}

impl Doc {
    fn heading(&mut self, level: u8, text: &str) {
        let _ = writeln!(self.html, "<h{level}>{}</h{level}>", esc(text));
        let _ = writeln!(
            self.md,
            "{} {}\n",
            "#".repeat(level as usize),
            md_cell(text)
        );
    }

    fn para(&mut self, class: &str, text: &str) {
        if text.trim().is_empty() {
            return;
        }
        self.para_rich(class, &esc(text), &md(text.trim()));
    }

    fn para_rich(&mut self, class: &str, html: &str, md: &str) {
        if class.is_empty() {
            let _ = writeln!(self.html, "<p>{html}</p>");
        } else {
            let _ = writeln!(self.html, "<p class=\"{class}\">{html}</p>");
        }
        let _ = writeln!(self.md, "{md}\n");
    }

    fn list(&mut self, items: &[String]) {
        if items.is_empty() {
            return;
        }
        self.html.push_str("<ul>\n");
        for i in items {
            let _ = writeln!(self.html, "<li>{}</li>", esc(i));
            let _ = writeln!(self.md, "- {}", md_cell(i));
        }
        self.html.push_str("</ul>\n");
        self.md.push('\n');
    }

    fn table(&mut self, t: &Table) {
        let h = &mut self.html;
        let _ = write!(h, "<div class=\"table-wrap\"><table");
        if !t.class.is_empty() {
            let _ = write!(h, " class=\"{}\"", t.class);
        }
        h.push_str(">\n<thead><tr>");
        for (name, num) in &t.head {
            let _ = write!(
                h,
                "<th{}>{}</th>",
                if *num { " class=\"num\"" } else { "" },
                esc(name)
            );
        }
        h.push_str("</tr></thead>\n<tbody>\n");
        for r in &t.rows {
            h.push_str("<tr>");
            for (i, c) in r.iter().enumerate() {
                let num = t.head.get(i).is_some_and(|(_, n)| *n);
                let _ = write!(
                    h,
                    "<td{}>{}</td>",
                    if num { " class=\"num\"" } else { "" },
                    c.html
                );
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</tbody>\n</table></div>\n");

        let m = &mut self.md;
        m.push('|');
        for (name, _) in &t.head {
            let _ = write!(m, " {} |", md_cell(name));
        }
        m.push_str("\n|");
        for (_, num) in &t.head {
            m.push_str(if *num { " ---: |" } else { " --- |" });
        }
        m.push('\n');
        for r in &t.rows {
            m.push('|');
            for i in 0..t.head.len() {
                let c = r.get(i).map(|c| c.md.as_str()).unwrap_or("");
                let _ = write!(m, " {c} |");
            }
            m.push('\n');
        }
        m.push('\n');
    }
}

/// An experiment of the catalogue with its record, ready to render.
struct Item<'a> {
    exp: &'a Experiment,
    rec: &'a ExperimentRecord,
    findings: Result<Vec<Finding>, String>,
}

fn render(results: &Results, catalog: &[Experiment], seeds: &Seeds) -> Doc {
    let mut seen: Vec<&str> = Vec::new();
    let mut items: Vec<Item> = Vec::new();
    let mut unknown: Vec<&str> = Vec::new();
    for rec in &results.experiments {
        if seen.contains(&rec.id.as_str()) {
            continue;
        }
        seen.push(&rec.id);
        match catalog.iter().find(|e| e.id == rec.id) {
            Some(exp) => items.push(Item {
                exp,
                rec,
                findings: findings_of(exp, results),
            }),
            None => unknown.push(&rec.id),
        }
    }

    let mut d = Doc::default();
    d.html.push_str("<header>\n");
    d.heading(1, "espgate lab report");
    let lead = format!(
        "{} experiment{} · {} points · started {} · {}",
        items.len(),
        if items.len() == 1 { "" } else { "s" },
        results.points.len(),
        utc(results.env.started_unix),
        if results.env.quick {
            "quick run"
        } else {
            "full run"
        }
    );
    d.para("lead", &lead);
    d.html.push_str("</header>\n");

    environment(&mut d, results);
    summary(&mut d, results, seeds, &items, &unknown);
    let mut fig = 0;
    for it in &items {
        section(&mut d, results, seeds, it, &mut fig);
    }

    d.html.push_str("<footer>\n");
    d.para(
        "",
        &format!(
            "Written by espgate {}. The paper's data are the numbers the papers print, as printed; \
             ours are means of the runs with the half width of their 95 % confidence interval.",
            or_dash(&results.env.espgate_version)
        ),
    );
    d.html.push_str("</footer>\n");
    d
}

/// The findings of `exp`; a panic in its function (say, on a missing
/// point) becomes an error line instead of losing the whole report.
fn findings_of(exp: &Experiment, results: &Results) -> Result<Vec<Finding>, String> {
    let f = exp.findings;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(results))).map_err(|e| {
        e.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| e.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_string())
    })
}

fn or_dash(s: &str) -> &str {
    if s.trim().is_empty() {
        "–"
    } else {
        s
    }
}

fn environment(d: &mut Doc, r: &Results) {
    let e = &r.env;
    d.html.push_str("<section id=\"environment\">\n");
    d.heading(2, "Environment");
    let code = |s: &str| {
        Cell::rich(
            format!("<code>{}</code>", esc(s)),
            format!("`{}`", s.replace('`', "'")),
        )
    };
    let rows: Vec<(&str, Cell)> = vec![
        ("kernel", Cell::text(or_dash(&e.kernel))),
        ("CPU", Cell::text(or_dash(&e.cpu_model))),
        ("cores", Cell::text(&e.cores.to_string())),
        ("espgate", Cell::text(or_dash(&e.espgate_version))),
        (
            "command",
            if e.command.trim().is_empty() {
                Cell::text("–")
            } else {
                code(&e.command)
            },
        ),
        ("started", Cell::text(&utc(e.started_unix))),
        ("elapsed", Cell::text(&duration(e.elapsed_s))),
        ("quick", Cell::text(if e.quick { "yes" } else { "no" })),
    ];
    kv_table(d, &rows);

    d.html.push_str("<div class=\"two\">\n<div>\n");
    d.heading(3, "Knobs");
    if e.knobs.is_empty() {
        d.para("muted", "No knobs recorded.");
    } else {
        let mut t = Table::new("", &[("knob", false), ("value", false)]);
        for (k, v) in &e.knobs {
            t.row(vec![Cell::text(k), Cell::text(v)]);
        }
        d.table(&t);
    }
    d.html.push_str("</div>\n<div>\n");
    d.heading(3, "Tools");
    if e.tools.is_empty() {
        d.para("muted", "No tools recorded.");
    } else {
        let mut t = Table::new("", &[("tool", false), ("version", false)]);
        for (k, v) in &e.tools {
            t.row(vec![Cell::text(k), Cell::text(v)]);
        }
        d.table(&t);
    }
    d.html.push_str("</div>\n</div>\n</section>\n");
}

/// A key/value table: keys as header cells in HTML; Markdown pipe tables
/// need a header row, an empty one.
fn kv_table(d: &mut Doc, rows: &[(&str, Cell)]) {
    d.html
        .push_str("<div class=\"table-wrap\"><table class=\"kv\">\n<tbody>\n");
    for (k, v) in rows {
        let _ = writeln!(d.html, "<tr><th>{}</th><td>{}</td></tr>", esc(k), v.html);
    }
    d.html.push_str("</tbody>\n</table></div>\n");
    d.md.push_str("| | |\n| --- | --- |\n");
    for (k, v) in rows {
        let _ = writeln!(d.md, "| **{}** | {} |", md_cell(k), v.md);
    }
    d.md.push('\n');
}

fn summary(d: &mut Doc, r: &Results, seeds: &Seeds, items: &[Item], unknown: &[&str]) {
    d.html.push_str("<section id=\"summary\">\n");
    d.heading(2, "Summary");
    if items.is_empty() {
        d.para("muted", "No experiment of this catalogue ran.");
    } else {
        let mut t = Table::new(
            "summary",
            &[
                ("experiment", false),
                ("title", false),
                ("paper", false),
                ("status", false),
                ("points", true),
                ("elapsed / expected", true),
                ("findings", false),
            ],
        );
        for it in items {
            let id = it.exp.id;
            let paper = match seeds.paper(it.exp.paper) {
                Some(p) => format!("{} ({})", p.id, p.year),
                None => it.exp.paper.to_string(),
            };
            let (state, class) = status_short(&it.rec.status);
            t.row(vec![
                Cell::rich(
                    format!("<a href=\"#{0}\">{0}</a>", esc(id)),
                    format!("[{}](#{})", md(id), id),
                ),
                Cell::text(it.exp.title),
                Cell::text(&paper),
                Cell::rich(
                    format!("<span class=\"{class}\">{}</span>", esc(&state)),
                    md_cell(&state),
                ),
                Cell::text(&r.points_of(id).count().to_string()),
                Cell::text(&format!(
                    "{} / {}",
                    duration(it.rec.elapsed_s),
                    duration(it.rec.expected_s)
                )),
                Cell::text(&verdict_counts(&it.findings)),
            ]);
        }
        d.table(&t);
    }
    if !unknown.is_empty() {
        d.para(
            "meta",
            &format!(
                "Unknown experiments (in the results, not in this espgate's catalogue; not shown): {}.",
                unknown.join(", ")
            ),
        );
    }
    d.html.push_str("</section>\n");
}

/// "done", "failed: <first line>", "interrupted", and a CSS class.
fn status_short(s: &Status) -> (String, &'static str) {
    match s {
        Status::Done => ("done".into(), "state-done"),
        Status::Failed { error } => {
            let first = error.lines().next().unwrap_or("").trim();
            let first = if first.chars().count() > 90 {
                format!("{}…", first.chars().take(89).collect::<String>())
            } else {
                first.to_string()
            };
            (format!("failed: {first}"), "state-failed")
        }
        Status::Interrupted => ("interrupted".into(), "state-interrupted"),
    }
}

/// "2 agree, 1 partly" for the summary.
fn verdict_counts(f: &Result<Vec<Finding>, String>) -> String {
    let f = match f {
        Ok(f) => f,
        Err(_) => return "could not be computed".into(),
    };
    let words = [
        (Verdict::Agrees, "agree"),
        (Verdict::Partly, "partly"),
        (Verdict::Differs, "differ"),
        (Verdict::NotMeasured, "not measured"),
    ];
    let parts: Vec<String> = words
        .iter()
        .filter_map(|(v, w)| {
            let n = f.iter().filter(|x| x.verdict == *v).count();
            (n > 0).then(|| format!("{n} {w}"))
        })
        .collect();
    if parts.is_empty() {
        "–".into()
    } else {
        parts.join(", ")
    }
}

fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Agrees => "v-agrees",
        Verdict::Partly => "v-partly",
        Verdict::Differs => "v-differs",
        Verdict::NotMeasured => "v-not-measured",
    }
}

fn section(d: &mut Doc, results: &Results, seeds: &Seeds, it: &Item, fig: &mut usize) {
    let exp = it.exp;
    let rec = it.rec;
    let _ = writeln!(
        d.html,
        "<section class=\"experiment\" id=\"{}\">",
        esc(exp.id)
    );
    // The anchor is the section's id in HTML, an empty link target in
    // Markdown.
    let _ = writeln!(d.md, "<a id=\"{}\"></a>\n", esc(exp.id));
    d.heading(2, &format!("{} — {}", exp.id, exp.title));
    match seeds.paper(exp.paper) {
        Some(p) => d.para_rich(
            "ref",
            &format!(
                "Paper {}: {}, <cite>{}</cite>, {}, {}.",
                esc(&p.id),
                esc(&p.authors),
                esc(&p.title),
                esc(&p.venue),
                p.year
            ),
            &format!(
                "Paper {}: {}, *{}*, {}, {}.",
                md(&p.id),
                md(&p.authors),
                md(&p.title),
                md(&p.venue),
                p.year
            ),
        ),
        None => d.para("ref", &format!("Paper {}.", exp.paper)),
    }

    match &rec.status {
        Status::Done => {}
        Status::Failed { error } => {
            let _ = writeln!(
                d.html,
                "<div class=\"status status-failed\"><b>Failed</b> after {}; the points measured before the error are kept.<pre>{}</pre></div>",
                duration(rec.elapsed_s),
                esc(error)
            );
            let _ = writeln!(
                d.md,
                "**Failed** after {}; the points measured before the error are kept:\n\n```text\n{}\n```\n",
                duration(rec.elapsed_s),
                error.replace("```", "'''")
            );
        }
        Status::Interrupted => {
            let _ = writeln!(
                d.html,
                "<div class=\"status status-interrupted\"><b>Interrupted</b> after {}; the points measured before are kept.</div>",
                duration(rec.elapsed_s)
            );
            let _ = writeln!(
                d.md,
                "**Interrupted** after {}; the points measured before are kept.\n",
                duration(rec.elapsed_s)
            );
        }
    }

    d.heading(3, "The paper's question");
    d.para("", exp.question);
    d.html.push_str("<div class=\"two\">\n<div>\n");
    d.heading(3, "What varies");
    d.para("", exp.varies);
    d.html.push_str("</div>\n<div>\n");
    d.heading(3, "What is measured");
    d.para("", exp.measures);
    d.html.push_str("</div>\n</div>\n");

    setups(d, exp, rec);

    let pts: Vec<&Point> = results.points_of(exp.id).collect();
    if !exp.plots.is_empty() {
        d.heading(3, "Plots");
        for spec in exp.plots {
            plot(d, spec, &pts, fig);
        }
    }

    d.heading(3, "Our measurements");
    points_table(d, &pts);

    d.heading(3, "The paper's data");
    if exp.seed_tables.is_empty() {
        d.para(
            "muted",
            "The catalogue names no data of the paper for this experiment.",
        );
    }
    for id in exp.seed_tables {
        match seeds.table(id) {
            Some(t) => seed_table(d, t),
            None => d.para("muted", &format!("seed table {id} missing")),
        }
    }

    d.heading(3, "Findings");
    match &it.findings {
        Err(e) => d.para("muted", &format!("The findings could not be computed: {e}")),
        Ok(f) if f.is_empty() => d.para("muted", "No findings."),
        Ok(f) => {
            let mut t = Table::new(
                "findings",
                &[("the paper", false), ("espgate", false), ("verdict", false)],
            );
            for x in f {
                let w = x.verdict.word();
                t.row(vec![
                    Cell::text(&x.paper),
                    Cell::text(&x.ours),
                    Cell::rich(
                        format!(
                            "<span class=\"verdict {}\">{}</span>",
                            verdict_class(x.verdict),
                            esc(w)
                        ),
                        w.to_string(),
                    ),
                ]);
            }
            d.table(&t);
        }
    }

    if !rec.notes.is_empty() {
        d.heading(3, "Notes");
        d.list(&rec.notes);
    }
    d.html.push_str("</section>\n");
}

fn setups(d: &mut Doc, exp: &Experiment, rec: &ExperimentRecord) {
    d.heading(3, "Set-ups");
    let mut ours = esc(exp.our_setup);
    if !rec.setup.is_empty() {
        ours.push_str("<ul>");
        for l in &rec.setup {
            let _ = write!(ours, "<li>{}</li>", esc(l));
        }
        ours.push_str("</ul>");
    }
    let _ = writeln!(
        d.html,
        "<div class=\"table-wrap\"><table class=\"setups\">\n<thead><tr><th>paper</th><th>espgate</th></tr></thead>\n\
         <tbody>\n<tr><td>{}</td><td>{ours}</td></tr>\n</tbody>\n</table></div>",
        esc(exp.paper_setup)
    );
    // Markdown cells hold one line: the run's set-up lines get rows of
    // their own.
    let _ = writeln!(
        d.md,
        "| paper | espgate |\n| --- | --- |\n| {} | {} |",
        md_cell(exp.paper_setup),
        md_cell(exp.our_setup)
    );
    for l in &rec.setup {
        let _ = writeln!(d.md, "| | • {} |", md_cell(l));
    }
    d.md.push('\n');
}

fn plot(d: &mut Doc, spec: &PlotSpec, pts: &[&Point], fig: &mut usize) {
    match plot_svg(spec, pts) {
        Some(svg) => {
            *fig += 1;
            let svg = svg.trim().replacen(
                "<svg ",
                &format!("<svg role=\"img\" aria-label=\"{}\" ", esc(spec.title)),
                1,
            );
            let how = match spec.kind {
                PlotKind::Lines | PlotKind::Bars => {
                    "; whiskers: 95 % confidence interval of the mean"
                }
                PlotKind::Stacked => "; stacked by category",
            };
            let unit = if spec.unit.is_empty() {
                String::new()
            } else {
                format!(" ({})", spec.unit)
            };
            let _ = writeln!(
                d.html,
                "<figure>\n{svg}\n<figcaption><b>Figure {}.</b> {}{}{}.</figcaption>\n</figure>",
                fig,
                esc(spec.title),
                esc(&unit),
                how
            );
            let _ = writeln!(
                d.md,
                "*Figure {}: {}{}* (plot in report.html)\n",
                fig,
                md(spec.title),
                md(&unit)
            );
        }
        None => {
            d.para(
                "muted",
                &format!("{}: no points measured for this plot.", spec.title),
            );
        }
    }
}

fn points_table(d: &mut Doc, pts: &[&Point]) {
    if pts.is_empty() {
        d.para("muted", "No points measured.");
        return;
    }
    let names = model::series_names(pts);
    let mut sorted: Vec<&Point> = pts.to_vec();
    sorted.sort_by(|a, b| {
        let ia = names.iter().position(|n| *n == a.series);
        let ib = names.iter().position(|n| *n == b.series);
        ia.cmp(&ib).then(a.x.total_cmp(&b.x))
    });
    let extras: BTreeSet<&str> = pts
        .iter()
        .flat_map(|p| p.extra.keys().map(String::as_str))
        .collect();
    let mut head: Vec<(&str, bool)> = vec![
        ("series", false),
        ("x", pts.iter().all(|p| p.x_label.is_none())),
        ("mean", true),
        ("±CI95", true),
        ("min", true),
        ("max", true),
        ("runs", true),
        ("unit", false),
    ];
    head.extend(extras.iter().map(|k| (*k, true)));
    let mut t = Table::new("points", &head);
    for p in sorted {
        let mut row = vec![
            Cell::text(&p.series),
            Cell::text(&x_name(p)),
            Cell::text(&num(p.mean)),
            Cell::text(&num(p.ci95.abs())),
            Cell::text(&num(p.min)),
            Cell::text(&num(p.max)),
            Cell::text(&p.runs.to_string()),
            Cell::text(&p.unit),
        ];
        for k in &extras {
            row.push(Cell::text(
                &p.extra.get(*k).map(|v| num(*v)).unwrap_or_default(),
            ));
        }
        t.row(row);
    }
    d.table(&t);
}

fn seed_table(d: &mut Doc, t: &SeedTable) {
    d.heading(4, &t.caption);
    let mut meta = format!("{} · {} · {}", t.source, t.kind.word(), t.id);
    if !t.units.is_empty() {
        let _ = write!(meta, " · units: {}", t.units);
    }
    d.para("meta", &meta);
    d.para("", &t.words);
    if t.rows.is_empty() || t.columns.is_empty() {
        d.para("muted", "The paper prints no numbers for it.");
        return;
    }
    let numeric: Vec<bool> = (0..t.columns.len())
        .map(|c| {
            t.rows.iter().all(|r| {
                r.get(c).is_some_and(|s| {
                    let s = s.replace(',', "");
                    let s = s.trim();
                    s.is_empty() || s == "–" || s == "-" || s.parse::<f64>().is_ok()
                })
            }) && t
                .rows
                .iter()
                .any(|r| r.get(c).is_some_and(|s| !s.trim().is_empty()))
        })
        .collect();
    let head: Vec<(&str, bool)> = t.columns.iter().map(String::as_str).zip(numeric).collect();
    let mut tab = Table::new("seed", &head);
    for r in &t.rows {
        tab.row(r.iter().map(|c| Cell::text(c)).collect());
    }
    d.table(&tab);
}

// ---------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------

/// A measured value: ≥ 100 without decimals, ≥ 10 with one, else three
/// significant digits; "–" when not finite.
pub(crate) fn num(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let a = v.abs();
    if a == 0.0 {
        return "0".into();
    }
    let decimals = if a >= 100.0 {
        0
    } else {
        (2 - a.log10().floor() as i32).clamp(0, 12) as usize
    };
    let s = format!("{v:.decimals$}");
    if s.trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        "0".into()
    } else {
        s
    }
}

/// An x value without needless decimals (64, 0.5, 1e-7).
fn x_num(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// The x of a point: its category name, else the number.
pub(crate) fn x_name(p: &Point) -> String {
    match &p.x_label {
        Some(l) => l.clone(),
        None => x_num(p.x),
    }
}

/// An axis tick: three significant digits at most, no trailing zeros.
fn tick(v: f64) -> String {
    if !v.is_finite() {
        return String::new();
    }
    let a = v.abs();
    if a < 1e-12 {
        return "0".into();
    }
    if a >= 1e7 {
        return format!("{v:.1e}");
    }
    let decimals = if a >= 100.0 {
        0
    } else {
        (2 - a.log10().floor() as i32).clamp(0, 12) as usize
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS UTC` (proleptic Gregorian).
fn utc(secs: u64) -> String {
    if secs == 0 {
        return "–".into();
    }
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Seconds as "12.3 s", "4 min 05 s", "1 h 02 min".
fn duration(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "–".into();
    }
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let t = s.round() as u64;
    if t < 3600 {
        format!("{} min {:02} s", t / 60, t % 60)
    } else {
        format!("{} h {:02} min", t / 3600, t % 3600 / 60)
    }
}

// ---------------------------------------------------------------------------
// Plots
// ---------------------------------------------------------------------------

const PLOT_W: u32 = 760;
const PLOT_H: u32 = 420;

/// Tableau 10, yellow moved last (least visible as a line).
const PALETTE: [RGBColor; 10] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(225, 87, 89),
    RGBColor(89, 161, 79),
    RGBColor(176, 122, 161),
    RGBColor(118, 183, 178),
    RGBColor(156, 117, 95),
    RGBColor(255, 157, 167),
    RGBColor(186, 176, 172),
    RGBColor(237, 201, 72),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Series 10..19, 30..39, ... reuse the colours: their lines are dashed
/// and their markers triangles.
fn second_round(i: usize) -> bool {
    (i / PALETTE.len()) % 2 == 1
}

const INK: RGBColor = RGBColor(40, 44, 52);
const GRID: RGBColor = RGBColor(226, 230, 235);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Draw = Result<(), Box<dyn std::error::Error>>;

/// Font sizes are given in plotters' units (the SVG gets size / 1.24).
fn font(size: f64) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", size).into_font()).color(&INK)
}

/// A numeric axis, linear or logarithmic, with the ticks we choose.
#[derive(Clone)]
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<f64>,
}

impl Axis {
    fn frac(&self, v: f64) -> f64 {
        let f = if self.log {
            let v = v.max(self.lo * 1e-3);
            (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        };
        if f.is_finite() {
            f
        } else {
            0.0
        }
    }

    /// A linear axis over lo..hi (hi > lo), ticks at round numbers.
    fn linear(lo: f64, hi: f64) -> Axis {
        Axis {
            lo,
            hi,
            log: false,
            ticks: nice_ticks(lo, hi, 6),
        }
    }

    /// The y axis for values within lo..hi: from 0 (or lo when negative)
    /// to hi × 1.08.
    fn values(lo: f64, hi: f64) -> Axis {
        let lo = if lo < 0.0 { lo * 1.08 } else { 0.0 };
        let mut hi = if hi > 0.0 { hi * 1.08 } else { 0.0 };
        if hi - lo <= f64::EPSILON * lo.abs().max(1.0) {
            hi = lo + 1.0;
        }
        Axis::linear(lo, hi)
    }

    /// The x axis of a line plot over the (finite, sorted, distinct) xs;
    /// positive when `log`.
    fn x(xs: &[f64], log: bool) -> Axis {
        let (min, max) = (xs[0], xs[xs.len() - 1]);
        let mut ax = if log {
            let (lo, hi) = if max / min < 1.0 + 1e-9 {
                (min / 2.0, max * 2.0)
            } else {
                let pad = (max / min).powf(0.04);
                (min / pad, max * pad)
            };
            Axis {
                lo,
                hi,
                log: true,
                ticks: log_ticks(lo, hi),
            }
        } else {
            let (lo, hi) = if max - min <= f64::EPSILON * max.abs().max(1.0) {
                let d = if min == 0.0 { 1.0 } else { min.abs() * 0.1 };
                (min - d, max + d)
            } else {
                let pad = (max - min) * 0.04;
                (min - pad, max + pad)
            };
            Axis::linear(lo, hi)
        };
        // The measured xs themselves when they are few and far enough
        // apart (message sizes 64, 256, 1024, ...).
        if xs.len() <= 12 {
            let fr: Vec<f64> = xs.iter().map(|&x| ax.frac(x)).collect();
            if fr.windows(2).all(|w| w[1] - w[0] >= 0.06) {
                ax.ticks = xs.to_vec();
            }
        }
        ax
    }

    /// A category axis: positions 0..n, no ticks (we write the names).
    fn categories(n: usize) -> Axis {
        Axis {
            lo: -0.5,
            hi: n.max(1) as f64 - 0.5,
            log: false,
            ticks: Vec::new(),
        }
    }
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = self.frac(*v).clamp(-1.0, 2.0);
        limit.0 + ((limit.1 - limit.0) as f64 * f).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.max_num_points() == 0 || hint.weight().allow_light_points() {
            // No light mesh lines: the bold ones are enough.
            return Vec::new();
        }
        self.ticks.clone()
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// Round ticks (1, 2, 5 × 10^k steps) within lo..hi, about `n` of them.
fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = hi - lo;
    if !(span.is_finite() && span > 0.0) {
        return Vec::new();
    }
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let step = mag
        * if norm < 1.5 {
            1.0
        } else if norm < 3.0 {
            2.0
        } else if norm < 7.0 {
            5.0
        } else {
            10.0
        };
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while v <= hi + step * 1e-9 && out.len() < 50 {
        // Avoid -0 and 0.30000000000000004.
        let r = (v / step).round() * step;
        out.push(if r.abs() < step * 1e-9 { 0.0 } else { r });
        v += step;
    }
    out
}

/// Ticks of a log axis: powers of ten, or 1-2-5 when fewer than two
/// powers fall within lo..hi.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return Vec::new();
    }
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let pow: Vec<f64> = (a..=b)
        .map(|k| 10f64.powi(k))
        .filter(|v| *v >= lo && *v <= hi)
        .collect();
    if pow.len() >= 2 {
        return pow;
    }
    (a..=b)
        .flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k)))
        .filter(|v| *v >= lo && *v <= hi)
        .collect()
}

/// Splits `text` into at most `lines` lines of at most `width` chars,
/// ending with "…" when cut.
fn wrap(text: &str, width: usize, lines: usize) -> Vec<String> {
    let width = width.max(3);
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut cut = false;
    for word in text.split_whitespace() {
        let mut word: String = word.to_string();
        loop {
            let need = if cur.is_empty() {
                0
            } else {
                cur.chars().count() + 1
            };
            let wl = word.chars().count();
            if need + wl <= width {
                if !cur.is_empty() {
                    cur.push(' ');
                }
                cur.push_str(&word);
                break;
            }
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            // A word longer than a line: split it.
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            out.push(head);
            if word.is_empty() {
                break;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    if out.len() > lines {
        out.truncate(lines);
        cut = true;
    }
    if cut {
        if let Some(last) = out.last_mut() {
            let mut s: String = last.chars().take(width - 1).collect();
            s.push('…');
            *last = s;
        }
    }
    out
}

/// How a legend entry is marked.
#[derive(Clone, Copy)]
enum Mark {
    Line,
    Box,
}

/// The width of the legend column for these names.
fn legend_width(names: &[String]) -> u32 {
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as u32;
    (longest * 15 / 2 + 46).clamp(120, 260)
}

/// The legend, in its own column right of the plot.
fn legend(area: &Area, entries: &[(String, RGBColor)], mark: Mark) -> Draw {
    let (w, h) = area.dim_in_pixel();
    let chars = (w as usize).saturating_sub(44) * 2 / 15;
    let row = 21;
    let max_rows = ((h as i32 - 40) / row).max(1) as usize;
    let shown = if entries.len() > max_rows {
        max_rows - 1
    } else {
        entries.len()
    };
    let style = font(15.0).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (name, c)) in entries.iter().take(shown).enumerate() {
        let y = 40 + i as i32 * row;
        match mark {
            Mark::Line => {
                if second_round(i) {
                    area.draw(&PathElement::new(vec![(6, y), (12, y)], c.stroke_width(2)))?;
                    area.draw(&PathElement::new(vec![(20, y), (26, y)], c.stroke_width(2)))?;
                    area.draw(&TriangleMarker::new((16, y), 5, c.filled()))?;
                } else {
                    area.draw(&PathElement::new(vec![(6, y), (26, y)], c.stroke_width(2)))?;
                    area.draw(&Circle::new((16, y), 4, c.filled()))?;
                }
            }
            Mark::Box => {
                area.draw(&Rectangle::new([(8, y - 6), (22, y + 6)], c.filled()))?;
            }
        }
        let text = wrap(name, chars, 1).pop().unwrap_or_default();
        area.draw(&Text::new(text, (32, y), style.clone()))?;
    }
    if shown < entries.len() {
        let y = 40 + shown as i32 * row;
        area.draw(&Text::new(
            format!("+{} more", entries.len() - shown),
            (32, y),
            style,
        ))?;
    }
    Ok(())
}

/// Category names under the bars at positions 0..n.
fn category_labels<F>(root: &Area, names: &[String], pixel_x: F, y: i32, width: i32) -> Draw
where
    F: Fn(usize) -> i32,
{
    let chars = ((width - 6).max(21) / 7) as usize;
    let size = if names.len() > 8 { 13.0 } else { 15.0 };
    let style = font(size).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, n) in names.iter().enumerate() {
        for (k, line) in wrap(n, chars, 2).into_iter().enumerate() {
            root.draw(&Text::new(
                line,
                (pixel_x(i), y + 6 + k as i32 * 14),
                style.clone(),
            ))?;
        }
    }
    Ok(())
}

/// The title, then the plot column and the legend column.
fn frame<'a>(
    root: &Area<'a>,
    spec: &PlotSpec,
    legend_names: &[String],
) -> Result<(Area<'a>, Area<'a>), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let body = root.titled(spec.title, font(21.0))?;
    let lw = legend_width(legend_names);
    Ok(body.split_horizontally(PLOT_W.saturating_sub(lw)))
}

/// The chart of a plot area with its mesh drawn: x numeric (ticks
/// labelled) or `categories` (no vertical grid; the caller writes the
/// category names), y values.
fn chart<'a, 'b>(
    plot: &'a Area<'b>,
    spec: &PlotSpec,
    xa: Axis,
    ya: Axis,
    categories: bool,
) -> Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<Axis, Axis>>, Box<dyn std::error::Error>> {
    let mut chart = ChartBuilder::on(plot)
        .margin(10)
        .margin_right(16)
        .x_label_area_size(if categories { 64 } else { 52 })
        .y_label_area_size(72)
        .build_cartesian_2d(xa, ya)?;
    let mut mesh = chart.configure_mesh();
    if categories {
        mesh.disable_x_mesh();
    } else {
        mesh.x_label_formatter(&|v| tick(*v));
    }
    mesh.x_desc(spec.x_label)
        .y_desc(spec.unit)
        .y_label_formatter(&|v| tick(*v))
        .label_style(font(15.0))
        .axis_desc_style(font(16.0))
        .bold_line_style(GRID)
        .axis_style(INK)
        .draw()?;
    Ok(chart)
}

fn draw_lines(root: &Area, spec: &PlotSpec, pts: &[&Point]) -> Draw {
    let names = model::series_names(pts);
    let mut xs: Vec<f64> = pts.iter().map(|p| p.x).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let ci_ok = |p: &Point| p.ci95.is_finite() && p.ci95 > 0.0;
    let lo = pts
        .iter()
        .map(|p| if ci_ok(p) { p.mean - p.ci95 } else { p.mean })
        .fold(f64::INFINITY, f64::min);
    let hi = pts
        .iter()
        .map(|p| if ci_ok(p) { p.mean + p.ci95 } else { p.mean })
        .fold(f64::NEG_INFINITY, f64::max);
    let xa = Axis::x(&xs, spec.log_x);
    let ya = Axis::values(lo, hi);

    let (plot, leg) = frame(root, spec, &names)?;
    let mut chart = chart(&plot, spec, xa, ya, false)?;

    let mut entries = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let c = color(i);
        let s = model::series(pts, name);
        let line = s.iter().map(|p| (p.x, p.mean));
        if second_round(i) {
            chart.draw_series(DashedLineSeries::new(line, 6, 5, c.stroke_width(2)))?;
        } else {
            chart.draw_series(LineSeries::new(line, c.stroke_width(2)))?;
        }
        let bars: Vec<&&Point> = s.iter().filter(|p| ci_ok(p)).collect();
        let whisker = c.stroke_width(1);
        chart.draw_series(bars.iter().map(|p| {
            PathElement::new(
                vec![(p.x, p.mean - p.ci95), (p.x, p.mean + p.ci95)],
                whisker,
            )
        }))?;
        for sign in [-1.0, 1.0] {
            chart.draw_series(bars.iter().map(|p| {
                EmptyElement::at((p.x, p.mean + sign * p.ci95))
                    + PathElement::new(vec![(-4, 0), (4, 0)], whisker)
            }))?;
        }
        if second_round(i) {
            chart.draw_series(
                s.iter()
                    .map(|p| TriangleMarker::new((p.x, p.mean), 5, c.filled())),
            )?;
        } else {
            chart.draw_series(s.iter().map(|p| Circle::new((p.x, p.mean), 4, c.filled())))?;
        }
        entries.push((name.clone(), c));
    }
    legend(&leg, &entries, Mark::Line)
}

/// The distinct categories of `pts` (x_label, else x), first-seen order.
fn categories(pts: &[&Point]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for p in pts {
        let n = x_name(p);
        if !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

fn draw_bars(root: &Area, spec: &PlotSpec, pts: &[&Point]) -> Draw {
    let names = model::series_names(pts);
    let groups = categories(pts);
    // The first point of each (group, series).
    let mut cell: HashMap<(usize, usize), &Point> = HashMap::new();
    for p in pts {
        let g = groups.iter().position(|n| *n == x_name(p)).unwrap_or(0);
        let s = names.iter().position(|n| *n == p.series).unwrap_or(0);
        cell.entry((g, s)).or_insert(p);
    }
    let ci_ok = |p: &Point| p.ci95.is_finite() && p.ci95 > 0.0;
    let lo = pts
        .iter()
        .map(|p| if ci_ok(p) { p.mean - p.ci95 } else { p.mean })
        .fold(0.0, f64::min);
    let hi = pts
        .iter()
        .map(|p| if ci_ok(p) { p.mean + p.ci95 } else { p.mean })
        .fold(0.0, f64::max);
    let ya = Axis::values(lo, hi);
    let y0 = ya.lo;

    let (plot, leg) = frame(root, spec, &names)?;
    let mut chart = chart(&plot, spec, Axis::categories(groups.len()), ya, true)?;

    let n = names.len().max(1) as f64;
    let bw = 0.8 / n;
    let pos = |g: usize, s: usize| g as f64 - 0.4 + bw * s as f64;
    let mut entries = Vec::new();
    for (s, name) in names.iter().enumerate() {
        let c = color(s);
        let mine: Vec<(usize, &Point)> = (0..groups.len())
            .filter_map(|g| cell.get(&(g, s)).map(|p| (g, *p)))
            .collect();
        chart.draw_series(mine.iter().map(|(g, p)| {
            let l = pos(*g, s) + bw * 0.06;
            let r = pos(*g, s) + bw * 0.94;
            Rectangle::new([(l, 0.0), (r, p.mean)], c.filled())
        }))?;
        let wh: Vec<(f64, &Point)> = mine
            .iter()
            .filter(|(_, p)| ci_ok(p))
            .map(|(g, p)| (pos(*g, s) + bw / 2.0, *p))
            .collect();
        let ink = INK.stroke_width(1);
        chart.draw_series(wh.iter().map(|(x, p)| {
            PathElement::new(vec![(*x, p.mean - p.ci95), (*x, p.mean + p.ci95)], ink)
        }))?;
        for sign in [-1.0, 1.0] {
            chart.draw_series(wh.iter().map(|(x, p)| {
                EmptyElement::at((*x, p.mean + sign * p.ci95))
                    + PathElement::new(vec![(-4, 0), (4, 0)], ink)
            }))?;
        }
        entries.push((name.clone(), c));
    }
    let x0 = chart.backend_coord(&(0.0, y0)).0;
    let x1 = chart.backend_coord(&(1.0, y0)).0;
    let base = chart.backend_coord(&(0.0, y0)).1;
    category_labels(
        root,
        &groups,
        |g| chart.backend_coord(&(g as f64, y0)).0,
        base,
        x1 - x0,
    )?;
    legend(&leg, &entries, Mark::Box)
}

fn draw_stacked(root: &Area, spec: &PlotSpec, pts: &[&Point]) -> Draw {
    let names = model::series_names(pts);
    let cats = categories(pts);
    // The first point of each (series, category); negative values are
    // not stacked.
    let mut cell: HashMap<(usize, usize), f64> = HashMap::new();
    for p in pts {
        let c = cats.iter().position(|n| *n == x_name(p)).unwrap_or(0);
        let s = names.iter().position(|n| *n == p.series).unwrap_or(0);
        cell.entry((s, c)).or_insert(p.mean.max(0.0));
    }
    let totals: Vec<f64> = (0..names.len())
        .map(|s| (0..cats.len()).filter_map(|c| cell.get(&(s, c))).sum())
        .collect();
    let top = totals.iter().copied().fold(0.0, f64::max);
    let ya = Axis::values(0.0, top);
    let y0 = ya.lo;

    let (plot, leg) = frame(root, spec, &cats)?;
    let mut chart = chart(&plot, spec, Axis::categories(names.len()), ya, true)?;

    let mut entries = Vec::new();
    for (c, cat) in cats.iter().enumerate() {
        let col = color(c);
        let segs: Vec<(usize, f64, f64)> = (0..names.len())
            .filter_map(|s| {
                let v = *cell.get(&(s, c))?;
                let below: f64 = (0..c).filter_map(|k| cell.get(&(s, k))).sum();
                (v > 0.0).then_some((s, below, below + v))
            })
            .collect();
        chart.draw_series(segs.iter().map(|(s, a, b)| {
            let x = *s as f64;
            Rectangle::new([(x - 0.32, *a), (x + 0.32, *b)], col.filled())
        }))?;
        // A thin white rule between segments.
        chart.draw_series(segs.iter().map(|(s, _, b)| {
            let x = *s as f64;
            PathElement::new(vec![(x - 0.32, *b), (x + 0.32, *b)], WHITE.stroke_width(1))
        }))?;
        entries.push((cat.clone(), col));
    }
    // The total above each bar.
    let style = font(14.0).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(
        totals
            .iter()
            .enumerate()
            .filter(|(_, t)| **t > 0.0)
            .map(|(s, t)| {
                EmptyElement::at((s as f64, *t)) + Text::new(num(*t), (0, -3), style.clone())
            }),
    )?;
    let x0 = chart.backend_coord(&(0.0, y0)).0;
    let x1 = chart.backend_coord(&(1.0, y0)).0;
    let base = chart.backend_coord(&(0.0, y0)).1;
    category_labels(
        root,
        &names,
        |s| chart.backend_coord(&(s as f64, y0)).0,
        base,
        x1 - x0,
    )?;
    legend(&leg, &entries, Mark::Box)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::model::{Environment, SCHEMA};
    use std::collections::BTreeMap;

    const SEEDS: &str = r#"
schema = "espgate-seeds/1"

[[paper]]
id = "000"
authors = "A. Author, B. Author"
title = "Testing IPsec <fast> & well"
venue = "TESTCONF 2009"
year = 2009
about = "A test paper."

[[table]]
id = "000-table-1"
paper = "000"
source = "Table 1"
kind = "table"
caption = "Throughput per transform"
experiments = ["000-test-lines"]
units = "Mbit/s"
columns = ["transform", "throughput"]
rows = [["none", "941.2"], ["esp", "409.600"]]

[[table]]
id = "000-figure-2"
paper = "000"
source = "Figure 2"
kind = "figure-words"
caption = "CPU load per message size"
experiments = ["000-test-lines"]
words = "The CPU load grows with smaller messages."
columns = ["metric", "relation", "value", "value_hi", "unit", "condition"]
rows = []
"#;

    fn point(
        exp: &str,
        series: &str,
        x: f64,
        label: Option<&str>,
        mean: f64,
        ci: f64,
        unit: &str,
    ) -> Point {
        Point {
            experiment: exp.into(),
            series: series.into(),
            x,
            x_label: label.map(Into::into),
            mean,
            ci95: ci,
            min: mean * 0.98,
            max: mean * 1.02,
            runs: 5,
            unit: unit.into(),
            samples: vec![mean; 5],
            extra: BTreeMap::new(),
        }
    }

    fn results() -> Results {
        let mut points = Vec::new();
        for (series, base) in [("tunnel", 900.0), ("transport", 918.0)] {
            for (x, f) in [(64.0, 0.2), (1024.0, 1.0), (8192.0, 1.05)] {
                let mut p = point("000-test-lines", series, x, None, base * f, 12.3, "Mbit/s");
                p.min = base * f - 20.0;
                p.max = base * f + 15.0;
                p.extra.insert("cpu.gwA.user".into(), 3.25);
                p.extra.insert("cpu.gwA.softirq".into(), 12.5);
                points.push(p);
            }
        }
        for (i, cat) in ["TCP", "UDP"].iter().enumerate() {
            points.push(point(
                "001-test-bars",
                "plain",
                i as f64,
                Some(cat),
                940.0,
                4.0,
                "Mbit/s",
            ));
            points.push(point(
                "001-test-bars",
                "aes<b>&gcm",
                i as f64,
                Some(cat),
                610.0,
                f64::INFINITY,
                "Mbit/s",
            ));
        }
        for (i, (cat, v)) in [("user", 5.0), ("system", 20.0), ("softirq", 41.5)]
            .iter()
            .enumerate()
        {
            points.push(point(
                "001-test-bars",
                "gwA",
                i as f64,
                Some(cat),
                *v,
                0.5,
                "%",
            ));
            points.push(point(
                "001-test-bars",
                "gwB",
                i as f64,
                Some(cat),
                v / 2.0,
                0.5,
                "%",
            ));
        }
        Results {
            schema: SCHEMA.into(),
            env: Environment {
                kernel: "6.8.0-test".into(),
                cpu_model: "Test CPU @ 3.0GHz".into(),
                cores: 2,
                espgate_version: "0.1.0 (abc1234)".into(),
                command: "espgate lab run --quick".into(),
                started_unix: 1_700_000_000,
                elapsed_s: 754.0,
                quick: true,
                knobs: BTreeMap::from([
                    ("runs".into(), "5".into()),
                    ("time".into(), "10 s".into()),
                ]),
                tools: BTreeMap::from([("iperf3".into(), "3.16".into())]),
            },
            experiments: vec![
                ExperimentRecord {
                    id: "000-test-lines".into(),
                    status: Status::Done,
                    setup: vec![
                        "two namespaces, veth MTU 1500".into(),
                        "iperf3 -t 10".into(),
                    ],
                    notes: vec!["run 3 of transport repeated".into()],
                    elapsed_s: 400.0,
                    expected_s: 380.0,
                },
                ExperimentRecord {
                    id: "001-test-bars".into(),
                    status: Status::Failed {
                        error: "iperf3 exited with status 1\ncaused by: connection refused".into(),
                    },
                    setup: vec![],
                    notes: vec![],
                    elapsed_s: 35.5,
                    expected_s: 120.0,
                },
                ExperimentRecord {
                    id: "999-gone".into(),
                    status: Status::Done,
                    setup: vec![],
                    notes: vec![],
                    elapsed_s: 1.0,
                    expected_s: 1.0,
                },
            ],
            points,
        }
    }

    fn lines_findings(r: &Results) -> Vec<Finding> {
        let pts: Vec<&Point> = r.points_of("000-test-lines").collect();
        let t = model::find(&pts, "tunnel", 1024.0).map(|p| p.mean);
        let u = model::find(&pts, "transport", 1024.0).map(|p| p.mean);
        let mut v = vec![match (t, u) {
            (Some(t), Some(u)) => {
                let d = (u - t) / t * 100.0;
                Finding {
                    paper: "Tunnel and transport mode perform alike (< 5 %).".into(),
                    ours: format!("tunnel vs transport differ by {d:.1} %"),
                    verdict: if d.abs() < 5.0 {
                        Verdict::Agrees
                    } else {
                        Verdict::Differs
                    },
                }
            }
            _ => Finding {
                paper: "Tunnel and transport mode perform alike (< 5 %).".into(),
                ours: "not measured".into(),
                verdict: Verdict::NotMeasured,
            },
        }];
        v.push(Finding {
            paper: "AH costs 10 %.".into(),
            ours: "espgate has no AH.".into(),
            verdict: Verdict::NotMeasured,
        });
        v
    }

    fn bars_findings(r: &Results) -> Vec<Finding> {
        let n = r.points_of("001-test-bars").count();
        vec![Finding {
            paper: "Encryption halves UDP throughput.".into(),
            ours: format!("{n} points, AES-GCM at 65 % of plain"),
            verdict: Verdict::Partly,
        }]
    }

    fn panicking_findings(_: &Results) -> Vec<Finding> {
        panic!("no point at x = 3")
    }

    const LINES_PLOTS: &[PlotSpec] = &[
        PlotSpec {
            title: "Throughput by message size",
            kind: PlotKind::Lines,
            unit: "Mbit/s",
            series_prefix: "",
            x_label: "message size (bytes)",
            log_x: true,
        },
        PlotSpec {
            title: "Latency by message size",
            kind: PlotKind::Lines,
            unit: "µs",
            series_prefix: "",
            x_label: "message size (bytes)",
            log_x: true,
        },
    ];

    const BARS_PLOTS: &[PlotSpec] = &[
        PlotSpec {
            title: "Throughput per protocol",
            kind: PlotKind::Bars,
            unit: "Mbit/s",
            series_prefix: "",
            x_label: "protocol",
            log_x: false,
        },
        PlotSpec {
            title: "CPU per gateway",
            kind: PlotKind::Stacked,
            unit: "%",
            series_prefix: "gw",
            x_label: "gateway",
            log_x: false,
        },
    ];

    fn catalog() -> Vec<Experiment> {
        vec![
            Experiment {
                id: "000-test-lines",
                paper: "000",
                title: "Tunnel vs transport",
                question: "Does tunnel mode cost more than transport mode?",
                paper_setup: "Two PCs, Linux 2.6, netperf.",
                our_setup: "Two gateways in namespaces, iperf3.",
                varies: "message size; mode",
                measures: "throughput (Mbit/s)",
                seed_tables: &["000-table-1", "000-figure-2"],
                plots: LINES_PLOTS,
                findings: lines_findings,
            },
            Experiment {
                id: "001-test-bars",
                paper: "001",
                title: "Protocols",
                question: "How do TCP and UDP fare?",
                paper_setup: "40 Gb/s link.",
                our_setup: "veth link.",
                varies: "protocol; cipher",
                measures: "throughput, CPU",
                seed_tables: &["000-table-9"],
                plots: BARS_PLOTS,
                findings: bars_findings,
            },
            Experiment {
                id: "002-not-run",
                paper: "000",
                title: "Never ran",
                question: "q",
                paper_setup: "p",
                our_setup: "o",
                varies: "v",
                measures: "m",
                seed_tables: &[],
                plots: &[],
                findings: panicking_findings,
            },
        ]
    }

    fn seeds() -> Seeds {
        Seeds::parse(SEEDS).unwrap()
    }

    #[test]
    fn html_has_everything_and_fetches_nothing() {
        let (r, c, s) = (results(), catalog(), seeds());
        let h = html(&r, &c, &s);
        // One inline SVG per plot spec with points: lines, bars, stacked.
        assert_eq!(h.matches("<svg").count(), 3, "{h}");
        assert_eq!(h.matches("</svg>").count(), 3);
        assert_eq!(h.matches("<figure>").count(), 3);
        assert!(h.contains("Latency by message size: no points measured for this plot."));
        // Anchors, in run order; the experiment that did not run is absent.
        let a = h.find("id=\"000-test-lines\"").expect("anchor 000");
        let b = h.find("id=\"001-test-bars\"").expect("anchor 001");
        assert!(a < b);
        assert!(!h.contains("002-not-run"));
        assert!(h.contains("href=\"#000-test-lines\""));
        // The paper's reference, escaped; a missing paper by its id.
        assert!(
            h.contains("<cite>Testing IPsec &lt;fast&gt; &amp; well</cite>, TESTCONF 2009, 2009.")
        );
        assert!(h.contains("Paper 001."));
        // Seed tables: cells as printed, words, an empty one, a missing one.
        assert!(h.contains("<td class=\"num\">409.600</td>"), "{h}");
        assert!(h.contains("Throughput per transform"));
        assert!(h.contains("The CPU load grows with smaller messages."));
        assert!(h.contains("The paper prints no numbers for it."));
        assert!(h.contains("seed table 000-table-9 missing"));
        // Findings computed from the points, with their verdicts.
        assert!(
            h.contains("<td>tunnel vs transport differ by 2.0 %</td>"),
            "{h}"
        );
        assert!(h.contains("<span class=\"verdict v-agrees\">agrees</span>"));
        assert!(h.contains("<span class=\"verdict v-not-measured\">not measured</span>"));
        assert!(h.contains("<span class=\"verdict v-partly\">partly</span>"));
        assert!(h.contains("<td>1 agree, 1 not measured</td>"));
        assert!(h.contains("<td>10 points, AES-GCM at 65 % of plain</td>"));
        // Status of the failed experiment, in the summary and its section.
        assert!(h.contains("failed: iperf3 exited with status 1</span>"));
        assert!(h.contains("caused by: connection refused"));
        assert!(h.contains("999-gone"));
        // Our points, with extras.
        assert!(
            h.contains("<th class=\"num\">cpu.gwA.softirq</th><th class=\"num\">cpu.gwA.user</th>")
        );
        assert!(h.contains(
            "<tr><td>tunnel</td><td class=\"num\">1024</td><td class=\"num\">900</td>\
             <td class=\"num\">12.3</td><td class=\"num\">880</td><td class=\"num\">915</td>\
             <td class=\"num\">5</td><td>Mbit/s</td><td class=\"num\">12.5</td><td class=\"num\">3.25</td></tr>"
        ), "{h}");
        assert!(h.contains("<td>UDP</td>"));
        // Environment.
        assert!(h.contains("2023-11-14 22:13:20 UTC"));
        assert!(h.contains("<code>espgate lab run --quick</code>"));
        assert!(h.contains("<td>3.16</td>"));
        assert!(h.contains("<li>iperf3 -t 10</li>"));
        assert!(h.contains("<li>run 3 of transport repeated</li>"));
        // Escaping: the series name never appears raw.
        assert!(!h.contains("aes<b>&gcm"));
        assert!(h.contains("aes&lt;b&gt;&amp;gcm"));
        // Self-contained: no scripts, no links, nothing fetched.
        let low = h.to_lowercase();
        for bad in [
            "src=\"http",
            "href=\"http",
            "src='http",
            "href='http",
            "url(",
            "@import",
            "<script",
            "<link",
            "<img",
            "<iframe",
        ] {
            assert!(!low.contains(bad), "{bad}");
        }
        assert!(h.starts_with("<!DOCTYPE html>") && h.trim_end().ends_with("</html>"));
    }

    #[test]
    fn markdown_has_the_same_tables() {
        let (r, c, s) = (results(), catalog(), seeds());
        let m = markdown(&r, &c, &s);
        assert!(m.starts_with("# espgate lab report\n"));
        assert!(m.contains("## 000-test-lines — Tunnel vs transport"));
        assert!(m.contains("<a id=\"001-test-bars\"></a>"));
        assert!(m.contains(
            "| series | x | mean | ±CI95 | min | max | runs | unit | cpu.gwA.softirq | cpu.gwA.user |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |\n"
        ), "{m}");
        assert!(
            m.contains("| tunnel | 1024 | 900 | 12.3 | 880 | 915 | 5 | Mbit/s | 12.5 | 3.25 |\n"),
            "{m}"
        );
        assert!(m.contains("| aes\\<b\\>&gcm | TCP | 610 | – |"), "{m}");
        assert!(m.contains("| esp | 409.600 |\n"));
        assert!(m.contains("| Tunnel and transport mode perform alike (< 5 %). | tunnel vs transport differ by 2.0 % | agrees |")
            || m.contains("| Tunnel and transport mode perform alike (\\< 5 %). | tunnel vs transport differ by 2.0 % | agrees |"), "{m}");
        assert_eq!(m.matches("(plot in report.html)").count(), 3);
        assert!(m.contains("no points measured for this plot"));
        assert!(m.contains("seed table 000-table-9 missing"));
        assert!(m.contains("| [000-test-lines](#000-test-lines) | Tunnel vs transport | 000 (2009) | done | 6 |"), "{m}");
        assert!(m.contains("| | • iperf3 -t 10 |"));
        assert!(m.contains("iperf3 exited with status 1"));
        assert!(!m.contains("<svg"));
        // Every table line has as many cells as its header.
        for block in m.split("\n\n") {
            let rows: Vec<&str> = block.lines().filter(|l| l.starts_with('|')).collect();
            if let Some(head) = rows.first() {
                let cells = |l: &str| l.replace("\\|", "").matches('|').count();
                assert!(rows.iter().all(|r| cells(r) == cells(head)), "{block}");
            }
        }
    }

    #[test]
    fn a_panicking_findings_function_does_not_lose_the_report() {
        let (mut r, c, s) = (results(), catalog(), seeds());
        r.experiments.push(ExperimentRecord {
            id: "002-not-run".into(),
            status: Status::Interrupted,
            setup: vec![],
            notes: vec![],
            elapsed_s: 2.0,
            expected_s: 60.0,
        });
        let h = html(&r, &c, &s);
        assert!(h.contains("The findings could not be computed: no point at x = 3"));
        assert!(h.contains("<b>Interrupted</b>"));
        assert!(h.contains("could not be computed</td>"));
    }

    fn spec(kind: PlotKind, unit: &'static str, prefix: &'static str, log_x: bool) -> PlotSpec {
        PlotSpec {
            title: "t",
            kind,
            unit,
            series_prefix: prefix,
            x_label: "x",
            log_x,
        }
    }

    #[test]
    fn plots_draw_what_matches_and_survive_odd_values() {
        let r = results();
        let lines: Vec<&Point> = r.points_of("000-test-lines").collect();
        let bars: Vec<&Point> = r.points_of("001-test-bars").collect();
        for kind in [PlotKind::Lines, PlotKind::Bars, PlotKind::Stacked] {
            assert!(plot_svg(&spec(kind, "µs", "", false), &lines).is_none());
            assert!(plot_svg(&spec(kind, "Mbit/s", "udp", false), &lines).is_none());
            assert!(plot_svg(&spec(kind, "Mbit/s", "", false), &[]).is_none());
        }
        let svg = plot_svg(&spec(PlotKind::Lines, "Mbit/s", "", true), &lines).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        assert!(
            svg.contains(">\ntunnel\n<") && svg.contains(">\ntransport\n<"),
            "legend: {svg}"
        );
        assert!(
            svg.contains(">\n1024\n<"),
            "x ticks at the measured sizes: {svg}"
        );
        let only = plot_svg(&spec(PlotKind::Lines, "Mbit/s", "tun", true), &lines).unwrap();
        assert!(!only.contains("transport"));
        let svg = plot_svg(&spec(PlotKind::Bars, "Mbit/s", "", false), &bars).unwrap();
        assert!(
            svg.contains("aes&lt;b&gt;&amp;gcm") && svg.contains(">\nUDP\n<"),
            "{svg}"
        );
        let svg = plot_svg(&spec(PlotKind::Stacked, "%", "gw", false), &bars).unwrap();
        assert!(
            svg.contains(">\nsoftirq\n<") && svg.contains(">\n66.5\n<"),
            "{svg}"
        );

        // Odd values: NaN, infinities, zeros, negatives, x ≤ 0 on a log axis,
        // a single point.
        let mut odd = Vec::new();
        for (x, mean, ci) in [
            (0.0, 5.0, 1.0),
            (-3.0, 2.0, 0.0),
            (10.0, f64::NAN, 1.0),
            (f64::INFINITY, 1.0, 1.0),
            (100.0, f64::INFINITY, 0.0),
            (1000.0, 0.0, f64::NAN),
            (1000.0, -4.0, f64::INFINITY),
        ] {
            odd.push(point("e", "s", x, None, mean, ci, "u"));
        }
        let odd_refs: Vec<&Point> = odd.iter().collect();
        for kind in [PlotKind::Lines, PlotKind::Bars, PlotKind::Stacked] {
            for log_x in [false, true] {
                let svg = plot_svg(&spec(kind, "u", "", log_x), &odd_refs).unwrap();
                assert!(
                    svg.contains("<svg") && !svg.contains("NaN") && !svg.contains("inf"),
                    "{svg}"
                );
            }
            for p in &odd {
                let _ = plot_svg(&spec(kind, "u", "", true), &[p]);
                let _ = plot_svg(&spec(kind, "u", "", false), &[p]);
            }
            let zeros: Vec<Point> = (0..3)
                .map(|i| point("e", "z", i as f64, None, 0.0, 0.0, "u"))
                .collect();
            let zr: Vec<&Point> = zeros.iter().collect();
            assert!(plot_svg(&spec(kind, "u", "", false), &zr)
                .unwrap()
                .contains("<svg"));
        }
        // Nothing drawable: x ≤ 0 only on a log axis, NaN only.
        let bad = [
            point("e", "s", 0.0, None, 1.0, 0.0, "u"),
            point("e", "s", 1.0, None, f64::NAN, 0.0, "u"),
        ];
        let br: Vec<&Point> = bad.iter().collect();
        assert!(plot_svg(&spec(PlotKind::Lines, "u", "", true), &br[..1]).is_none());
        assert!(plot_svg(&spec(PlotKind::Bars, "u", "", false), &br[1..]).is_none());
    }

    #[test]
    fn numbers_times_and_durations() {
        assert_eq!(num(1234.6), "1235");
        assert_eq!(num(409.6), "410");
        assert_eq!(num(12.345), "12.3");
        assert_eq!(num(3.25), "3.25");
        assert_eq!(num(0.012345), "0.0123");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(-2.5), "-2.50");
        assert_eq!(num(f64::INFINITY), "–");
        assert_eq!(num(f64::NAN), "–");
        assert_eq!(x_num(64.0), "64");
        assert_eq!(x_num(0.5), "0.5");
        assert_eq!(tick(0.30000000000000004), "0.3");
        assert_eq!(tick(1000.0), "1000");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(0), "–");
        assert_eq!(duration(12.34), "12.3 s");
        assert_eq!(duration(245.0), "4 min 05 s");
        assert_eq!(duration(3720.0), "1 h 02 min");
        assert_eq!(
            nice_ticks(0.0, 1080.0, 6),
            vec![0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]
        );
        assert_eq!(log_ticks(50.0, 20000.0), vec![100.0, 1000.0, 10000.0]);
        assert_eq!(wrap("esp aes128-sha1", 12, 2), vec!["esp", "aes128-sha1"]);
        assert_eq!(
            wrap("esp aes128-sha1 tunnel mode", 12, 2),
            vec!["esp", "aes128-sha1…"]
        );
        assert_eq!(esc("<b>&\"'"), "&lt;b&gt;&amp;&quot;&#39;");
    }

    #[test]
    fn write_puts_both_files_in_the_directory() {
        let dir = std::env::temp_dir().join(
            format!(
                "espgate-report-test-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            )
            .replace([' ', '{', '}', ':', ','], "_"),
        );
        let (r, c, s) = (results(), catalog(), seeds());
        let (h, m) = write(&dir.join("sub"), &r, &c, &s).unwrap();
        assert_eq!(h, dir.join("sub/report.html"));
        assert_eq!(m, dir.join("sub/report.md"));
        assert_eq!(std::fs::read_to_string(&h).unwrap(), html(&r, &c, &s));
        assert_eq!(std::fs::read_to_string(&m).unwrap(), markdown(&r, &c, &s));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `cargo test -p espgate-lab --lib lab::report -- --ignored` writes
    /// the fixture's report to /tmp/report-sample/ to look at.
    #[test]
    #[ignore]
    fn write_sample() {
        let (r, c, s) = (results(), catalog(), seeds());
        let (h, m) = write(Path::new("/tmp/report-sample"), &r, &c, &s).unwrap();
        eprintln!("{} {}", h.display(), m.display());
    }
}
