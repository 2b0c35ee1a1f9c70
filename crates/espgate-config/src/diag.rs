//! Problems found in a configuration file and where they are: the
//! public [`Diagnostic`] and [`ConfigError`], and the `Validator` that
//! collects errors and warnings at an `At` (a key path, the span of the
//! value in the text, the connection's name) while the parts are checked.
//!
//! Positions come from the spans the single TOML parse records
//! ([`toml::Spanned`]); a problem with a key that is absent is placed at
//! the nearest table that is present.

use std::fmt;
use std::ops::Range;
use std::path::Path;
use toml::Spanned;

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// TOML key path such as `connection[1].esp.enc_in` (empty for the
    /// whole file).
    pub path: String,
    /// Name of the connection the path is in, when known.
    pub connection: Option<String>,
    /// 1-based line and column, when the position is known.
    pub position: Option<(usize, usize)>,
    /// What is wrong.
    pub message: String,
}

impl Diagnostic {
    /// `FILE:LINE:COLUMN: PATH (connection "NAME"): MESSAGE`, leaving out
    /// what is not known.
    pub fn render(&self, file: &str) -> String {
        let mut s = file.to_string();
        if let Some((l, c)) = self.position {
            s.push_str(&format!(":{l}:{c}"));
        }
        s.push_str(": ");
        if !self.path.is_empty() {
            s.push_str(&self.path);
            if let Some(n) = &self.connection {
                s.push_str(&format!(" (connection \"{n}\")"));
            }
            s.push_str(": ");
        }
        s.push_str(&self.message);
        s
    }
}

/// Why a configuration was refused: every problem found (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name used in messages.
    pub file: String,
    /// The problems, in file order where known.
    pub diagnostics: Vec<Diagnostic>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.diagnostics.len();
        if n > 1 {
            writeln!(f, "{n} errors in {}:", self.file)?;
        }
        for (i, d) in self.diagnostics.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            f.write_str(&d.render(&self.file))?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// One problem of the whole file (unreadable, not TOML, ...).
    pub(crate) fn whole_file(
        file: &str,
        position: Option<(usize, usize)>,
        message: String,
    ) -> Self {
        ConfigError {
            file: file.to_string(),
            diagnostics: vec![Diagnostic {
                path: String::new(),
                connection: None,
                position,
                message,
            }],
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let mut pos = pos.min(text.len());
    while !text.is_char_boundary(pos) {
        pos -= 1;
    }
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, text[line_start..pos].chars().count() + 1)
}

/// The span of an optional value of the file.
pub(crate) fn span<T>(v: &Option<Spanned<T>>) -> Option<Range<usize>> {
    v.as_ref().map(Spanned::span)
}

/// Where a problem is: the key path, the span of the value (or of the
/// nearest present table) and the connection the path is in.
#[derive(Debug, Clone, Default)]
pub(crate) struct At {
    path: String,
    span: Option<Range<usize>>,
    connection: Option<String>,
    /// Set when `span` is the table's header only because the schema keeps
    /// no span for this key (`cluster.etcd`, say): the key, which
    /// [`Validator::finish`] looks for among the table's lines, so that a
    /// key that is present is reported at its own line and only an absent
    /// one at the header.
    find_key: Option<String>,
}

impl At {
    /// The whole file.
    pub(crate) fn root() -> At {
        At::default()
    }

    /// Key `k` of this table, at `span` when the key is present; absent,
    /// the problem is placed at this table.
    pub(crate) fn key(&self, k: &str, span: Option<Range<usize>>) -> At {
        let mut path = self.path.clone();
        if !path.is_empty() {
            path.push('.');
        }
        let bare = !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if bare {
            path.push_str(k);
        } else {
            path.push_str(&format!("{k:?}"));
        }
        At {
            path,
            find_key: (span.is_none() && bare).then(|| k.to_string()),
            span: span.or_else(|| self.span.clone()),
            connection: self.connection.clone(),
        }
    }

    /// Item `i` of this array, at `span`.
    pub(crate) fn index(&self, i: usize, span: Option<Range<usize>>) -> At {
        At {
            path: format!("{}[{i}]", self.path),
            find_key: if span.is_some() {
                None
            } else {
                self.find_key.clone()
            },
            span: span.or_else(|| self.span.clone()),
            connection: self.connection.clone(),
        }
    }

    /// The same place, said to be in connection `name`.
    pub(crate) fn in_connection(mut self, name: &str) -> At {
        self.connection = Some(name.to_string());
        self
    }
}

/// A problem found, before it is given its line and column.
struct Issue {
    at: At,
    message: String,
}

/// Collects the errors and warnings of one file while its parts are
/// checked, and knows where relative paths in it point.
pub(crate) struct Validator<'a> {
    /// Directory of the configuration file: relative paths start here.
    pub(crate) base_dir: &'a Path,
    errors: Vec<Issue>,
    warnings: Vec<Issue>,
    /// True once a key was given inline (the file itself is then secret).
    pub(crate) inline_keys: bool,
}

impl<'a> Validator<'a> {
    /// A validator for a file in `base_dir`.
    pub(crate) fn new(base_dir: &'a Path) -> Self {
        Validator {
            base_dir,
            errors: Vec::new(),
            warnings: Vec::new(),
            inline_keys: false,
        }
    }

    /// Records an error.
    pub(crate) fn err(&mut self, at: At, message: impl Into<String>) {
        self.errors.push(Issue {
            at,
            message: message.into(),
        });
    }

    /// Records a warning.
    pub(crate) fn warn(&mut self, at: At, message: impl Into<String>) {
        self.warnings.push(Issue {
            at,
            message: message.into(),
        });
    }

    /// `r`'s value, or `None` with its error recorded at `at`.
    pub(crate) fn check<T>(&mut self, at: At, r: Result<T, String>) -> Option<T> {
        r.map_err(|e| self.err(at, e)).ok()
    }

    /// Errors recorded so far: a part compares the count before and after
    /// its checks to know whether it found any.
    pub(crate) fn error_count(&self) -> usize {
        self.errors.len()
    }

    /// The errors and the warnings, each in file order where known (then
    /// in the order found), positions resolved against `text`.
    pub(crate) fn finish(self, text: &str) -> (Vec<Diagnostic>, Vec<Diagnostic>) {
        let render = |issues: Vec<Issue>| {
            let mut d: Vec<(usize, Diagnostic)> = issues
                .into_iter()
                .enumerate()
                .map(|(i, is)| {
                    (
                        i,
                        Diagnostic {
                            path: is.at.path,
                            connection: is.at.connection,
                            position: is.at.span.map(|s| {
                                let key = is.at.find_key.as_deref();
                                let at = key.and_then(|k| key_in_table(text, &s, k));
                                line_col(text, at.unwrap_or(s.start))
                            }),
                            message: is.message,
                        },
                    )
                })
                .collect();
            d.sort_by_key(|(i, d)| (d.position.unwrap_or((usize::MAX, 0)), *i));
            d.into_iter().map(|(_, d)| d).collect()
        };
        (render(self.errors), render(self.warnings))
    }
}

/// The offset of key `k`'s value among the lines of the table whose header
/// is at `header`, up to the next header: for a key the file has but the
/// schema keeps no span of. `None` for an inline table (its span is not a
/// header) and for a key that is absent.
fn key_in_table(text: &str, header: &Range<usize>, k: &str) -> Option<usize> {
    if !text.get(header.clone())?.starts_with('[') {
        return None;
    }
    let mut offset = header.end;
    for line in text.get(header.end..)?.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let t = line.trim_start();
        if t.starts_with('[') {
            break;
        }
        let Some(rest) = t.strip_prefix(k) else {
            continue;
        };
        let after_key = rest.trim_start();
        if let Some(value) = after_key.strip_prefix('=') {
            let value_start = line.len() - value.trim_start().len();
            return Some(start + value_start);
        }
    }
    None
}

/// `1 byte`, `2 bytes`.
pub(crate) fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
