//! The numbers the five seed papers print, with where each comes from
//! (`data/seeds.toml`, compiled in): the lab prints them beside ours.
//!
//! Every cell is kept as the text the paper printed (`409.600` stays
//! `409.600`); [`SeedTable::num`] reads it as a number. Figures whose data
//! the papers do not print have only words ([`SeedTable::words`]) and the
//! few numbers the text quotes about them: the lab never invents a number
//! read off a picture.

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use std::sync::OnceLock;

/// The value of the data file's `schema`.
pub const SCHEMA: &str = "espgate-seeds/1";

const DATA: &str = include_str!("../../data/seeds.toml");

/// One seed paper.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paper {
    /// `000` .. `004`.
    pub id: String,
    /// Authors as printed.
    pub authors: String,
    /// Title as printed.
    pub title: String,
    /// Where and when it appeared.
    pub venue: String,
    /// Year.
    pub year: u32,
    /// What it is about, in one line of our words.
    pub about: String,
}

/// What kind of data a table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A printed table of numbers.
    Table,
    /// A printed table of words.
    Qualitative,
    /// A figure without data: words, and the numbers the text quotes.
    FigureWords,
    /// Numbers from running text.
    Text,
    /// Test-bed and tool parameters.
    Settings,
    /// Formulas.
    Model,
    /// Packet-format data.
    Protocol,
    /// Numbers the paper quotes from other work.
    Cited,
}

impl Kind {
    /// A word for the report.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Table => "table",
            Kind::Qualitative => "table of words",
            Kind::FigureWords => "figure (no data printed)",
            Kind::Text => "numbers in the text",
            Kind::Settings => "settings",
            Kind::Model => "model",
            Kind::Protocol => "packet format",
            Kind::Cited => "cited from other work",
        }
    }
}

/// One table of a paper.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedTable {
    /// `<paper>-<source>`, e.g. `004-table-3`.
    pub id: String,
    /// The paper's id.
    pub paper: String,
    /// Where in the paper ("Table 3", "Figure 4 and §4.2").
    pub source: String,
    /// What kind of data.
    pub kind: Kind,
    /// The paper's caption (or a title of ours, for text numbers).
    pub caption: String,
    /// The experiments it belongs to.
    pub experiments: Vec<String>,
    /// Units of the numbers.
    #[serde(default)]
    pub units: String,
    /// What the paper says about it, in our words (for figures without
    /// data, all there is).
    #[serde(default)]
    pub words: String,
    /// Column names.
    pub columns: Vec<String>,
    /// Rows, a cell per column, as printed.
    pub rows: Vec<Vec<String>>,
}

/// A number the text states, read from a `text` or `figure-words` table
/// (columns `metric, relation, value, value_hi, unit, condition`).
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// What is measured.
    pub metric: String,
    /// `eq`, `approx`, `gt`, `lt`, `le` or `range`.
    pub relation: String,
    /// The value (the low end of a range).
    pub lo: f64,
    /// The high end of a range (= lo otherwise).
    pub hi: f64,
    /// Unit.
    pub unit: String,
    /// Under which conditions.
    pub condition: String,
}

impl Claim {
    /// The claim as words: "3–5 %", "more than 50 %", "about 2".
    pub fn amount(&self) -> String {
        let u = if self.unit.is_empty() || self.unit == "ratio" {
            String::new()
        } else if self.unit == "%" {
            " %".to_string()
        } else {
            format!(" {}", self.unit)
        };
        let n = |x: f64| {
            if x.fract() == 0.0 {
                format!("{x:.0}")
            } else {
                format!("{x}")
            }
        };
        match self.relation.as_str() {
            "range" => format!("{}–{}{u}", n(self.lo), n(self.hi)),
            "approx" => format!("about {}{u}", n(self.lo)),
            "gt" => format!("more than {}{u}", n(self.lo)),
            "lt" => format!("less than {}{u}", n(self.lo)),
            "le" => format!("up to {}{u}", n(self.lo)),
            _ => format!("{}{u}", n(self.lo)),
        }
    }
}

/// All papers and tables.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seeds {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The papers.
    #[serde(rename = "paper")]
    pub papers: Vec<Paper>,
    /// The tables, in paper order.
    #[serde(rename = "table")]
    pub tables: Vec<SeedTable>,
}

impl SeedTable {
    /// The cell at `row`, column `col` (by name).
    pub fn cell(&self, row: usize, col: &str) -> Option<&str> {
        let c = self.columns.iter().position(|n| n == col)?;
        self.rows.get(row)?.get(c).map(String::as_str)
    }

    /// The cell at `row`, `col` as a number (commas of thousands
    /// ignored); `None` when it is not one.
    pub fn num(&self, row: usize, col: &str) -> Option<f64> {
        self.cell(row, col)?.replace(',', "").trim().parse().ok()
    }

    /// The row whose first cell is `key`.
    pub fn row_by_key(&self, key: &str) -> Option<usize> {
        self.rows
            .iter()
            .position(|r| r.first().is_some_and(|c| c == key))
    }

    /// The claims of a `text` or `figure-words` table.
    pub fn claims(&self) -> Vec<Claim> {
        (0..self.rows.len())
            .filter_map(|i| {
                Some(Claim {
                    metric: self.cell(i, "metric")?.to_string(),
                    relation: self.cell(i, "relation")?.to_string(),
                    lo: self.num(i, "value")?,
                    hi: self.num(i, "value_hi")?,
                    unit: self.cell(i, "unit")?.to_string(),
                    condition: self.cell(i, "condition").unwrap_or("").to_string(),
                })
            })
            .collect()
    }

    /// The claim whose metric contains `needle`.
    pub fn claim(&self, needle: &str) -> Option<Claim> {
        self.claims()
            .into_iter()
            .find(|c| c.metric.contains(needle))
    }
}

impl Seeds {
    /// Parses and checks a seeds file.
    pub fn parse(text: &str) -> Result<Seeds> {
        let s: Seeds = toml::from_str(text).context("the seed figures")?;
        ensure!(
            s.schema == SCHEMA,
            "seed figures schema {:?}, expected {SCHEMA:?}",
            s.schema
        );
        for t in &s.tables {
            ensure!(
                s.papers.iter().any(|p| p.id == t.paper),
                "table {}: unknown paper {}",
                t.id,
                t.paper
            );
            for (i, r) in t.rows.iter().enumerate() {
                if r.len() != t.columns.len() {
                    bail!(
                        "table {} row {}: {} cells for {} columns",
                        t.id,
                        i + 1,
                        r.len(),
                        t.columns.len()
                    );
                }
            }
            ensure!(
                s.tables.iter().filter(|u| u.id == t.id).count() == 1,
                "table {} appears twice",
                t.id
            );
        }
        Ok(s)
    }

    /// The compiled-in seed figures.
    pub fn get() -> &'static Seeds {
        static S: OnceLock<Seeds> = OnceLock::new();
        S.get_or_init(|| Seeds::parse(DATA).expect("data/seeds.toml is checked by the tests"))
    }

    /// The table `id`.
    pub fn table(&self, id: &str) -> Option<&SeedTable> {
        self.tables.iter().find(|t| t.id == id)
    }

    /// The paper `id`.
    pub fn paper(&self, id: &str) -> Option<&Paper> {
        self.papers.iter().find(|p| p.id == id)
    }

    /// The tables that belong to experiment `id`.
    pub fn for_experiment<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a SeedTable> + 'a {
        self.tables
            .iter()
            .filter(move |t| t.experiments.iter().any(|e| e == id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table ids of `shared/lab/seed-figures.toml`, in its order.
    const IDS: [&str; 48] = [
        "000-table-1",
        "000-settings",
        "000-fig-1",
        "000-fig-2",
        "000-text-4.2-medium",
        "000-fig-3",
        "000-text-4.2-modes",
        "000-text-4.3-p4",
        "000-fig-4",
        "000-fig-5",
        "000-text-5-intro",
        "000-text-5.1",
        "000-text-5.2-napi",
        "000-text-5.2-jumbo",
        "000-fig-6",
        "001-settings",
        "001-fig-11",
        "001-fig-12-13",
        "001-fig-14-15",
        "001-fig-16-17",
        "001-fig-18",
        "001-fig-19-20",
        "001-fig-21-22",
        "001-fig-23-24",
        "001-text-cited",
        "002-settings",
        "002-qesp-header",
        "002-text-V",
        "002-table-I",
        "002-fig-9",
        "003-settings",
        "003-table-1-1",
        "003-table-3-1",
        "003-model",
        "003-table-4-1",
        "003-text-4.2-trace",
        "003-table-4-2",
        "003-table-5-1",
        "003-text-5",
        "004-settings",
        "004-table-1",
        "004-text-4.1-ike",
        "004-table-2",
        "004-fig-4",
        "004-fig-5",
        "004-table-3",
        "004-text-4.2-esp",
        "004-text-abstract",
    ];

    /// Every `toml:` reference of `shared/lab/experiments.md`, in its order.
    const CATALOGUE_REFS: [&str; 48] = [
        "000-settings",
        "000-table-1",
        "000-fig-1",
        "000-fig-2",
        "000-text-4.2-medium",
        "000-fig-3",
        "000-text-4.2-modes",
        "000-text-4.3-p4",
        "000-fig-4",
        "000-fig-5",
        "000-text-5.1",
        "000-text-5.2-napi",
        "000-text-5.2-jumbo",
        "000-fig-6",
        "000-text-5-intro",
        "001-settings",
        "001-fig-11",
        "001-fig-12-13",
        "001-fig-14-15",
        "001-fig-16-17",
        "001-fig-18",
        "001-fig-19-20",
        "001-fig-21-22",
        "001-fig-23-24",
        "001-text-cited",
        "002-settings",
        "002-qesp-header",
        "002-text-V",
        "002-table-I",
        "002-fig-9",
        "003-settings",
        "003-table-1-1",
        "003-table-3-1",
        "003-model",
        "003-table-4-1",
        "003-table-4-2",
        "003-text-4.2-trace",
        "003-table-5-1",
        "003-text-5",
        "004-settings",
        "004-table-1",
        "004-text-4.1-ike",
        "004-table-2",
        "004-fig-4",
        "004-fig-5",
        "004-table-3",
        "004-text-4.2-esp",
        "004-text-abstract",
    ];

    /// The experiments of papers 000, 001 and 004 in the catalogue.
    const EXPERIMENTS_000_001_004: [&str; 27] = [
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
        "004-ike-timing",
        "004-ike-psk-vs-sig",
        "004-ike-aggressive",
        "004-ike-noop",
        "004-esp-timing",
        "004-esp-cipher-compare",
        "004-esp-noop",
    ];

    /// The experiments of papers 002 and 003 in the catalogue.
    const EXPERIMENTS_002_003: [&str; 8] = [
        "002-analytic-overhead",
        "002-throughput-esp-vs-qesp",
        "002-priority-congestion",
        "003-design-comparisons",
        "003-capacity-model",
        "003-fixed-size-scaling",
        "003-real-traffic-dispatch",
        "003-commercial-comparison",
    ];

    /// (id, rows, columns) per table, from the shared file (its
    /// `as_printed` column dropped).
    const SHAPES: [(&str, usize, usize); 48] = [
        ("000-table-1", 5, 7),
        ("000-settings", 12, 3),
        ("000-fig-1", 1, 6),
        ("000-fig-2", 0, 6),
        ("000-text-4.2-medium", 2, 6),
        ("000-fig-3", 1, 6),
        ("000-text-4.2-modes", 1, 6),
        ("000-text-4.3-p4", 1, 6),
        ("000-fig-4", 3, 6),
        ("000-fig-5", 1, 6),
        ("000-text-5-intro", 2, 6),
        ("000-text-5.1", 2, 6),
        ("000-text-5.2-napi", 2, 6),
        ("000-text-5.2-jumbo", 5, 6),
        ("000-fig-6", 3, 6),
        ("001-settings", 10, 3),
        ("001-fig-11", 0, 6),
        ("001-fig-12-13", 5, 6),
        ("001-fig-14-15", 4, 6),
        ("001-fig-16-17", 1, 6),
        ("001-fig-18", 0, 6),
        ("001-fig-19-20", 3, 6),
        ("001-fig-21-22", 1, 6),
        ("001-fig-23-24", 0, 6),
        ("001-text-cited", 4, 6),
        ("002-settings", 4, 3),
        ("002-qesp-header", 6, 4),
        ("002-text-V", 7, 6),
        ("002-table-I", 7, 3),
        ("002-fig-9", 3, 6),
        ("003-settings", 15, 3),
        ("003-table-1-1", 5, 3),
        ("003-table-3-1", 5, 3),
        ("003-model", 14, 3),
        ("003-table-4-1", 6, 6),
        ("003-text-4.2-trace", 7, 6),
        ("003-table-4-2", 6, 5),
        ("003-table-5-1", 7, 5),
        ("003-text-5", 2, 6),
        ("004-settings", 16, 3),
        ("004-table-1", 16, 5),
        ("004-text-4.1-ike", 19, 6),
        ("004-table-2", 2, 4),
        ("004-fig-4", 3, 6),
        ("004-fig-5", 1, 6),
        ("004-table-3", 5, 3),
        ("004-text-4.2-esp", 3, 6),
        ("004-text-abstract", 3, 6),
    ];

    const CLAIM_COLUMNS: [&str; 6] = [
        "metric",
        "relation",
        "value",
        "value_hi",
        "unit",
        "condition",
    ];

    fn table(id: &str) -> &'static SeedTable {
        Seeds::get()
            .table(id)
            .unwrap_or_else(|| panic!("no table {id}"))
    }

    fn parse_err(text: &str) -> String {
        match Seeds::parse(text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn the_data_parses_with_five_papers_and_the_48_tables() {
        let s = Seeds::parse(DATA).unwrap();
        assert_eq!(s.schema, SCHEMA);
        let papers: Vec<&str> = s.papers.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(papers, ["000", "001", "002", "003", "004"]);
        for p in &s.papers {
            assert!(
                !p.authors.is_empty() && !p.title.is_empty() && !p.venue.is_empty(),
                "{}",
                p.id
            );
            assert!(!p.about.is_empty(), "{}", p.id);
            assert!((2003..=2018).contains(&p.year), "{}: {}", p.id, p.year);
        }
        let ids: Vec<&str> = s.tables.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, IDS);
        // the compiled-in copy is the same
        assert_eq!(Seeds::get().tables.len(), 48);
        assert_eq!(Seeds::get().paper("004").unwrap().year, 2005);
        assert!(Seeds::get().paper("005").is_none());
        assert!(Seeds::get().table("004-table-9").is_none());
    }

    #[test]
    fn every_table_is_filed_under_its_paper_and_described() {
        for t in &Seeds::get().tables {
            assert_eq!(t.id[..3], t.paper, "{}", t.id);
            assert!(!t.source.is_empty() && !t.caption.is_empty(), "{}", t.id);
            assert!(!t.words.is_empty(), "{}: no words", t.id);
            assert!(
                !t.units.is_empty() || t.rows.is_empty() || t.kind == Kind::Qualitative,
                "{}",
                t.id
            );
        }
    }

    #[test]
    fn the_catalogue_finds_its_tables_and_experiments() {
        let s = Seeds::get();
        for id in CATALOGUE_REFS {
            assert!(
                s.table(id).is_some(),
                "catalogue refers to {id}, which is missing"
            );
        }
        for e in EXPERIMENTS_000_001_004 {
            assert!(
                s.for_experiment(e).next().is_some(),
                "no table for experiment {e}"
            );
        }
        // both sweeps of Figures 12/13 share one table
        for e in ["001-cipher-sweep-tcp", "001-cipher-sweep-udp"] {
            assert!(s.for_experiment(e).any(|t| t.id == "001-fig-12-13"), "{e}");
        }
        let ike: Vec<&str> = s
            .for_experiment("004-ike-timing")
            .map(|t| t.id.as_str())
            .collect();
        assert_eq!(
            ike,
            [
                "004-settings",
                "004-table-1",
                "004-text-4.1-ike",
                "004-text-abstract"
            ]
        );
        assert_eq!(s.for_experiment("no-such-experiment").count(), 0);
        // no table names an experiment the catalogue does not have
        for t in &s.tables {
            for e in &t.experiments {
                let known = EXPERIMENTS_000_001_004.contains(&e.as_str())
                    || EXPERIMENTS_002_003.contains(&e.as_str());
                assert!(known, "{}: unknown experiment {e}", t.id);
                assert_eq!(e[..3], t.paper, "{}: experiment {e}", t.id);
            }
        }
        // the only table outside every experiment: what 001 cites
        let loose: Vec<&str> = s
            .tables
            .iter()
            .filter(|t| t.experiments.is_empty())
            .map(|t| t.id.as_str())
            .collect();
        assert_eq!(loose, ["001-text-cited"]);
    }

    #[test]
    fn every_table_has_the_rows_and_columns_of_the_shared_file() {
        let s = Seeds::get();
        assert_eq!(SHAPES.len(), s.tables.len());
        for (id, rows, cols) in SHAPES {
            let t = s.table(id).unwrap_or_else(|| panic!("no table {id}"));
            assert_eq!(
                (t.rows.len(), t.columns.len()),
                (rows, cols),
                "{id}: (rows, columns)"
            );
            for (i, r) in t.rows.iter().enumerate() {
                assert_eq!(r.len(), cols, "{id} row {}", i + 1);
            }
        }
    }

    #[test]
    fn each_kind_has_its_layout_and_its_numbers_read_as_numbers() {
        for t in &Seeds::get().tables {
            match t.kind {
                Kind::Text | Kind::FigureWords | Kind::Cited => {
                    assert_eq!(t.columns, CLAIM_COLUMNS, "{}", t.id);
                    // every row is a claim: value and value_hi are numbers
                    let claims = t.claims();
                    assert_eq!(
                        claims.len(),
                        t.rows.len(),
                        "{}: a value is not a number",
                        t.id
                    );
                    for c in claims {
                        let rels = ["eq", "approx", "gt", "lt", "le", "range"];
                        assert!(
                            rels.contains(&c.relation.as_str()),
                            "{}: {}",
                            t.id,
                            c.relation
                        );
                        if c.relation == "range" {
                            assert!(c.lo < c.hi, "{}: {}", t.id, c.metric);
                        } else {
                            assert_eq!(c.lo, c.hi, "{}: {}", t.id, c.metric);
                        }
                    }
                }
                Kind::Settings => {
                    assert_eq!(t.columns, ["parameter", "values", "unit"], "{}", t.id);
                    for r in &t.rows {
                        for v in r[1].split(", ") {
                            assert!(v.parse::<f64>().is_ok(), "{}: {:?} in {:?}", t.id, v, r[1]);
                        }
                    }
                }
                _ => assert!(!t.columns.iter().any(|c| c == "as_printed"), "{}", t.id),
            }
        }
        // numeric columns of the printed tables
        for (id, cols) in [
            ("002-table-I", &["packet_size", "esp_kbps", "qesp_kbps"][..]),
            (
                "003-table-4-2",
                &["nodes", "packet_rr_mbps", "session_sqf_mbps"][..],
            ),
            ("004-table-1", &["3des192_ms", "aes128_ms", "aes256_ms"][..]),
            ("004-table-2", &["3des192_ms", "aes128_ms", "aes256_ms"][..]),
            ("004-table-3", &["value_us"][..]),
        ] {
            let t = table(id);
            for c in cols {
                for i in 0..t.rows.len() {
                    assert!(
                        t.num(i, c).is_some(),
                        "{id} row {} {c}: {:?}",
                        i + 1,
                        t.cell(i, c)
                    );
                }
            }
        }
        let t = table("003-table-4-1");
        for c in &t.columns {
            assert!((0..6).all(|i| t.num(i, c).is_some()), "003-table-4-1 {c}");
        }
    }

    #[test]
    fn printed_values_are_kept_as_printed() {
        // Table I of 002: trailing zeros stay
        let t = table("002-table-I");
        let r = t.row_by_key("512").unwrap();
        assert_eq!(t.cell(r, "esp_kbps"), Some("409.600"));
        assert_eq!(t.num(r, "esp_kbps"), Some(409.6));
        assert_eq!(t.cell(r, "qesp_kbps"), Some("409.463"));
        assert_eq!(t.cell(0, "packet_size"), Some("64"));
        assert_eq!(t.cell(6, "esp_kbps"), Some("3275.435"));

        // Table 3 of 004, long format
        let t = table("004-table-3");
        assert_eq!(t.columns, ["variant", "cipher", "value_us"]);
        assert_eq!(t.rows[0], ["Full ESP", "3DES192", "345.69"]);
        assert_eq!(t.num(0, "value_us"), Some(345.69));
        let r = t.row_by_key("Native TCP/IP").unwrap();
        assert_eq!(t.num(r, "value_us"), Some(46.44));

        // Table 2 of 004
        let t = table("004-table-2");
        let r = t.row_by_key("Skeleton IKE").unwrap();
        assert_eq!(t.cell(r, "aes128_ms"), Some("141.16"));
        assert_eq!(t.num(r, "aes128_ms"), Some(141.16));
        assert_eq!(
            t.cell(t.row_by_key("Full IKE").unwrap(), "3des192_ms"),
            Some("373.82")
        );

        // Table 1 of 004: the printed total, not the sum of the rows
        let t = table("004-table-1");
        let total = t.row_by_key("").unwrap();
        assert_eq!(t.cell(total, "operation"), Some("Total"));
        assert_eq!(t.cell(total, "3des192_ms"), Some("117.59"));

        // Table 4-1 of 003
        let t = table("003-table-4-1");
        let r = t.row_by_key("6").unwrap();
        assert_eq!(t.cell(r, "esp_3des_md5_1446B_mbps"), Some("480.1"));
        assert_eq!(t.num(0, "esp_3des_md5_512B_mbps"), Some(47.2));
        assert_eq!(
            t.cell(t.row_by_key("4").unwrap(), "ah_md5_1446B_mbps"),
            Some("974.4")
        );

        // text numbers: thousands commas and trailing zeros as printed
        let t = table("003-text-4.2-trace");
        let c = t.claim("total bytes").unwrap();
        assert_eq!(c.lo, 1_328_780_468.0);
        assert_eq!(t.cell(0, "value"), Some("1,328,780,468"));
        let r = t
            .rows
            .iter()
            .position(|r| r[0] == "average session size")
            .unwrap();
        assert_eq!(t.cell(r, "value"), Some("72615.0"));
        let t = table("004-text-4.1-ike");
        assert_eq!(t.claim("D-H total").unwrap().lo, 35.5);
        assert!(t.rows.iter().any(|r| r[2] == "35.50"));

        // settings: the printed numbers, joined
        let t = table("000-settings");
        let r = t
            .row_by_key("tuned socket buffers min/default/max, send and receive")
            .unwrap();
        assert_eq!(t.cell(r, "values"), Some("87380, 4194304, 4194304"));
        assert_eq!(t.cell(r, "unit"), Some("bytes"));
        let t = table("001-settings");
        assert_eq!(t.cell(0, "values"), Some("3.60"));
    }

    #[test]
    fn claims_read_relation_range_and_unit() {
        let t = table("000-fig-4");
        assert_eq!(t.kind, Kind::FigureWords);
        assert_eq!(
            t.caption,
            "Figure 4: (X1,X2) IP and IPsec comparison - 1 Gbps link."
        );
        let c = t.claim("confidentiality").unwrap();
        assert_eq!((c.relation.as_str(), c.lo, c.hi), ("le", 300.0, 300.0));
        assert_eq!(c.unit, "Mbps");
        assert_eq!(c.amount(), "up to 300 Mbps");
        assert_eq!(
            t.claim("saturates").unwrap().amount(),
            "more than 256 bytes"
        );
        assert_eq!(t.claim("ratio").unwrap().amount(), "about 2");
        assert!(t.claim("no such metric").is_none());

        let c = table("000-text-4.2-modes")
            .claim("transport vs tunnel")
            .unwrap();
        assert_eq!((c.relation.as_str(), c.lo, c.hi), ("range", 3.0, 5.0));
        assert_eq!(c.amount(), "3–5 %");

        assert_eq!(
            table("000-text-4.3-p4").claims()[0].amount(),
            "more than 50 %"
        );
        assert_eq!(table("003-text-5").claims()[0].amount(), "less than 5 %");
        assert_eq!(
            table("004-fig-5").claims()[0].amount(),
            "about 2.5 times faster"
        );
        assert_eq!(table("000-fig-1").claims()[0].amount(), "3 %");
        assert!(table("000-fig-2").claims().is_empty());
    }

    const MINIMAL: &str = r#"
schema = "espgate-seeds/1"

[[paper]]
id = "000"
authors = "A"
title = "T"
venue = "V"
year = 2009
about = "x"

[[table]]
id = "000-a"
paper = "000"
source = "Table 1"
kind = "table"
caption = "C"
experiments = []
columns = ["k", "v"]
rows = [["a", "1"]]
"#;

    #[test]
    fn a_minimal_file_parses() {
        let s = Seeds::parse(MINIMAL).unwrap();
        assert_eq!(s.tables.len(), 1);
        assert_eq!(s.tables[0].num(0, "v"), Some(1.0));
        assert_eq!(s.tables[0].units, "");
        assert_eq!(s.tables[0].kind.word(), "table");
    }

    #[test]
    fn parse_rejects_bad_files() {
        let short = MINIMAL.replace(r#"[["a", "1"]]"#, r#"[["a", "1"], ["b"]]"#);
        assert!(parse_err(&short).contains("000-a row 2: 1 cells for 2 columns"));

        let long = MINIMAL.replace(r#"[["a", "1"]]"#, r#"[["a", "1", "2"]]"#);
        assert!(parse_err(&long).contains("3 cells for 2 columns"));

        let orphan = MINIMAL.replace(r#"paper = "000""#, r#"paper = "009""#);
        assert!(parse_err(&orphan).contains("unknown paper 009"));

        let twice = format!(
            "{MINIMAL}\n{}",
            &MINIMAL[MINIMAL.find("[[table]]").unwrap()..]
        );
        assert!(parse_err(&twice).contains("table 000-a appears twice"));

        let schema = MINIMAL.replace("espgate-seeds/1", "espgate-seeds/2");
        assert!(parse_err(&schema).contains("schema"));

        let shared = MINIMAL.replace("espgate-seeds/1", "espgate-seed-figures/1");
        assert!(parse_err(&shared).contains("schema"));

        // the shared file's fields and kinds are not ours
        let note = MINIMAL.replace(r#"caption = "C""#, "caption = \"C\"\nnote = \"n\"");
        parse_err(&note);
        let kind = MINIMAL.replace(r#"kind = "table""#, r#"kind = "chart""#);
        parse_err(&kind);
        let number = MINIMAL.replace(r#"["a", "1"]"#, r#"["a", 1]"#);
        parse_err(&number);
    }
}
