//! Text tables for everything the command line and the lab print: a
//! header and rows in aligned columns, laid out by comfy-table.
//!
//! The layout is the plain one scripts and people read: no borders, no
//! header rule, a gap of spaces between columns (two by default), an
//! optional indent, each column left- or right-aligned (its title too),
//! optionally at least some characters wide, and no trailing blanks.
//! Columns are as wide as their widest cell: nothing is wrapped or cut
//! to the terminal's width, since the output is often piped.
//!
//! ```
//! use espgate_api::table::{Column, Table};
//!
//! let mut t = Table::new([Column::left("STAGE"), Column::right("PACKETS")]).indent(2);
//! t.row(["cipher", "12"]);
//! t.row(["total", ""]);
//! assert_eq!(t.render(), "  STAGE   PACKETS\n  cipher       12\n  total\n");
//! ```

use comfy_table::{presets, CellAlignment, ColumnConstraint, ContentArrangement, Width};

/// How a column's cells and title are aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text starts at the column's left edge.
    Left,
    /// Text ends at the column's right edge (numbers).
    Right,
}

/// A column: its title, alignment and smallest width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    title: String,
    align: Align,
    min_width: usize,
}

impl Column {
    /// A left-aligned column titled `title`.
    pub fn left(title: impl Into<String>) -> Column {
        Column {
            title: title.into(),
            align: Align::Left,
            min_width: 0,
        }
    }

    /// A right-aligned column titled `title`.
    pub fn right(title: impl Into<String>) -> Column {
        Column {
            align: Align::Right,
            ..Column::left(title)
        }
    }

    /// The column is at least `width` characters wide, even when its
    /// title and cells are narrower (wider cells widen it as usual).
    pub fn min_width(mut self, width: usize) -> Column {
        self.min_width = width;
        self
    }
}

/// One row: cells for the first columns, then maybe a free text.
#[derive(Debug, Clone)]
struct Line {
    cells: Vec<String>,
    then: Option<String>,
}

/// A text table: columns, then rows added one by one, then
/// [`Table::render`].
#[derive(Debug, Clone)]
pub struct Table {
    columns: Vec<Column>,
    lines: Vec<Line>,
    indent: usize,
    gap: usize,
}

impl Table {
    /// A table with these columns, no indent and two spaces between
    /// columns.
    pub fn new(columns: impl IntoIterator<Item = Column>) -> Table {
        Table {
            columns: columns.into_iter().collect(),
            lines: Vec::new(),
            indent: 0,
            gap: 2,
        }
    }

    /// Every line starts with `spaces` spaces.
    pub fn indent(mut self, spaces: usize) -> Table {
        self.indent = spaces;
        self
    }

    /// `spaces` spaces between columns (at least one).
    pub fn gap(mut self, spaces: usize) -> Table {
        self.gap = spaces.max(1);
        self
    }

    /// Adds a row. It may have fewer cells than the table has columns
    /// (the others are blank), not more.
    pub fn row<I>(&mut self, cells: I) -> &mut Table
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.push(cells, None)
    }

    /// Adds a row whose first columns are `cells` and whose remaining
    /// columns are replaced by `text`, starting where the next column
    /// would: the text widens no column (a failure's reason in a row of
    /// numbers, say).
    pub fn row_then<I>(&mut self, cells: I, text: impl Into<String>) -> &mut Table
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.push(cells, Some(text.into()))
    }

    fn push<I>(&mut self, cells: I, then: Option<String>) -> &mut Table
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        assert!(
            cells.len() <= self.columns.len(),
            "a row of {} cells in a table of {} columns",
            cells.len(),
            self.columns.len()
        );
        self.lines.push(Line { cells, then });
        self
    }

    /// The table as text: the header, then the rows, each line ending in
    /// a newline and none in a blank.
    pub fn render(&self) -> String {
        let last = self.columns.len().saturating_sub(1);
        let mut t = comfy_table::Table::new();
        t.load_style(presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(self.columns.iter().map(|c| c.title.as_str()));
        for line in &self.lines {
            t.add_row(line.cells.iter().map(String::as_str));
        }
        let paddings: Vec<(u16, u16)> = (0..self.columns.len())
            .map(|i| {
                let left = if i == 0 { self.indent } else { 0 };
                let right = if i == last { 0 } else { self.gap };
                (narrow(left), narrow(right))
            })
            .collect();
        for ((col, spec), &padding) in t.column_iter_mut().zip(&self.columns).zip(&paddings) {
            col.set_padding(padding);
            col.set_cell_alignment(match spec.align {
                Align::Left => CellAlignment::Left,
                Align::Right => CellAlignment::Right,
            });
            if spec.min_width > 0 {
                // comfy-table counts the padding in a column's width.
                let (l, r) = padding;
                col.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(
                    narrow(spec.min_width).saturating_add(l + r),
                )));
            }
        }
        // The width of each column with its padding, for rows that end in
        // a free text: the blanks their missing cells leave at the end.
        let widths: Vec<usize> = t
            .column_max_content_widths()
            .iter()
            .zip(&self.columns)
            .zip(&paddings)
            .map(|((&content, spec), &(l, r))| {
                usize::from(content).max(spec.min_width) + usize::from(l + r)
            })
            .collect();
        let mut out = String::new();
        let texts = std::iter::once(None).chain(self.lines.iter().map(Some));
        for (rendered, line) in t.lines().zip(texts) {
            match line {
                Some(Line {
                    cells,
                    then: Some(text),
                }) => {
                    // Past the given cells, comfy-table fills each missing
                    // cell with as many spaces as its column is wide.
                    let mut blank: usize = widths[cells.len()..].iter().sum();
                    if cells.is_empty() {
                        // The indent stays.
                        blank = blank.saturating_sub(self.indent);
                    }
                    let keep = rendered.chars().count().saturating_sub(blank);
                    let mut s: String = rendered.chars().take(keep).collect();
                    if cells.len() == last + 1 {
                        // No column left: the text follows the gap.
                        s.extend(std::iter::repeat_n(' ', self.gap));
                    }
                    s.push_str(text);
                    out.push_str(s.trim_end());
                }
                _ => out.push_str(rendered.trim_end()),
            }
            out.push('\n');
        }
        out
    }
}

/// comfy-table measures in u16; no table of ours comes near.
fn narrow(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_columns_two_spaces_apart_without_trailing_blanks() {
        let mut t = Table::new([Column::left("DIR"), Column::left("SPI"), Column::left("X")]);
        t.row(["in", "0x00001001", "a"]);
        t.row(["out", "0x2", ""]);
        assert_eq!(
            t.render(),
            "DIR  SPI         X\nin   0x00001001  a\nout  0x2\n"
        );
    }

    #[test]
    fn right_columns_indent_and_minimum_widths() {
        let mut t = Table::new([
            Column::left("op").min_width(5),
            Column::right("n").min_width(4),
            Column::right("share").min_width(6),
        ])
        .indent(2)
        .gap(1);
        t.row(["dh", "2", "50.0%"]);
        t.row(["verify", "12345", "100.0%"]);
        assert_eq!(
            t.render(),
            "  op         n  share\n  dh         2  50.0%\n  verify 12345 100.0%\n"
        );
    }

    #[test]
    fn a_wide_cell_widens_its_whole_column() {
        let mut t = Table::new([Column::left("a").min_width(3), Column::right("b")]).gap(1);
        t.row(["xy", "1"]);
        t.row(["longer", "2"]);
        assert_eq!(t.render(), "a      b\nxy     1\nlonger 2\n");
    }

    #[test]
    fn a_row_ending_in_text_widens_no_column() {
        let mut t = Table::new([
            Column::left("system"),
            Column::left("test").min_width(7),
            Column::right("median").min_width(10),
            Column::left("CPU"),
        ]);
        t.row(["plain", "tcp", "9000.0", "-"]);
        t.row_then(["wireguard-go", "tcp"], "failed: it did not come up");
        t.row_then(["x", "tcp", "1.0", "gwA 1%"], "and a note");
        t.row_then(Vec::<String>::new(), "all of it");
        let text = t.render();
        let mut indented = t.clone().indent(2);
        indented.row_then(Vec::<String>::new(), "indented");
        assert!(
            indented.render().ends_with("\n  indented\n"),
            "{}",
            indented.render()
        );
        assert_eq!(
            text,
            "\
system        test         median  CPU
plain         tcp          9000.0  -
wireguard-go  tcp      failed: it did not come up
x             tcp             1.0  gwA 1%  and a note
all of it
"
        );
    }

    #[test]
    fn cells_count_characters_not_bytes() {
        let mut t = Table::new([Column::left("t"), Column::right("wall µs")]).gap(1);
        t.row(["12.3µs", "1"]);
        assert_eq!(t.render(), "t      wall µs\n12.3µs       1\n");
    }

    #[test]
    fn nothing_is_cut_to_a_terminal_width() {
        let long = "x".repeat(500);
        let mut t = Table::new([Column::left("a"), Column::left("b")]);
        t.row([long.as_str(), "end"]);
        let text = t.render();
        assert_eq!(text.lines().count(), 2);
        assert!(text.ends_with(&format!("{long}  end\n")), "{text}");
    }

    #[test]
    fn empty_tables_are_their_header() {
        let t = Table::new([Column::left("a"), Column::right("bb")]);
        assert_eq!(t.render(), "a  bb\n");
    }

    #[test]
    #[should_panic(expected = "a row of 3 cells in a table of 2 columns")]
    fn rows_longer_than_the_header_are_a_bug() {
        Table::new([Column::left("a"), Column::left("b")]).row(["1", "2", "3"]);
    }
}
