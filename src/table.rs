//! Plain-text tables for the CLI: columns padded to their widest cell.

use std::fmt::Write as _;

/// How a table is laid out.
pub struct Style {
    /// Text before every line.
    pub indent: &'static str,
    /// Spaces between columns.
    pub gap: usize,
    /// Columns whose data cells are right-aligned (figures); headers stay left-aligned.
    pub right_aligned: &'static [usize],
}

/// The header and the rows, one line each, trailing spaces trimmed.
pub fn render(style: &Style, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let gap = " ".repeat(style.gap);
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>, data: bool| {
        let mut text = String::from(style.indent);
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            let _ = if data && style.right_aligned.contains(&i) {
                write!(text, "{cell:>w$}{gap}")
            } else {
                write!(text, "{cell:<w$}{gap}")
            };
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied(), false);
    for row in rows {
        line(&mut row.iter().map(String::as_str), true);
    }
    out
}
