//! Source text, byte spans and line/column positions.
//!
//! Every diagnostic points into a [`SourceFile`] with a byte [`Span`]. Lines
//! are 1-based; columns are 1-based and count characters, as editors do.

use serde::Serialize;

/// A half-open byte range `[start, end)` into a [`SourceFile`]'s text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// The span `[start, end)`.
    pub fn new(start: usize, end: usize) -> Self {
        Span {
            start,
            end: end.max(start),
        }
    }

    /// An empty span at `at`.
    pub fn point(at: usize) -> Self {
        Span { start: at, end: at }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the span covers no byte.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// A 1-based line and character column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct LineCol {
    /// Line, from 1.
    pub line: usize,
    /// Column in characters, from 1.
    pub column: usize,
}

/// The language a workflow file is written in, chosen by its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// `.yaml` / `.yml`.
    Yaml,
    /// `.rhai`.
    Rhai,
}

impl SourceKind {
    /// The kind for a file name, by extension; `None` when it is neither.
    pub fn from_name(name: &str) -> Option<Self> {
        let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
        match ext.as_deref() {
            Some("yaml" | "yml") => Some(SourceKind::Yaml),
            Some("rhai") => Some(SourceKind::Rhai),
            _ => None,
        }
    }
}

/// A named source text with a line index.
#[derive(Debug, Clone)]
pub struct SourceFile {
    name: String,
    text: String,
    /// Byte offset of the first byte of each line.
    line_starts: Vec<usize>,
    /// Byte offset of each character, kept only when the text is not ASCII
    /// (for ASCII text the two are equal), so that converting the YAML
    /// parser's character positions costs O(1) even on one-line files.
    char_offsets: Option<Vec<usize>>,
}

impl SourceFile {
    /// Index `text`, which is displayed as `name` in diagnostics.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        let text = text.into();
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        let char_offsets = (!text.is_ascii()).then(|| text.char_indices().map(|(i, _)| i).collect());
        SourceFile {
            name: name.into(),
            text,
            line_starts,
            char_offsets,
        }
    }

    /// The name shown in diagnostics (usually the path as given).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The whole text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text under `span`, clamped to the file and to character boundaries.
    pub fn slice(&self, span: Span) -> &str {
        let start = self.floor_char(span.start);
        let end = self.floor_char(span.end).max(start);
        &self.text[start..end]
    }

    /// Line and column of a byte offset (clamped to the file).
    pub fn line_col(&self, offset: usize) -> LineCol {
        let offset = self.floor_char(offset);
        let line = match self.line_starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let start = self.line_starts[line];
        LineCol {
            line: line + 1,
            column: self.text[start..offset].chars().count() + 1,
        }
    }

    /// Byte offset of a 1-based line and a 0-based character column, clamped
    /// to the end of that line (or of the file).
    pub fn offset_of(&self, line: usize, col0: usize) -> usize {
        let Some(&start) = self.line_starts.get(line.saturating_sub(1)) else {
            return self.text.len();
        };
        let rest = &self.text[start..];
        let line_len = rest.find('\n').unwrap_or(rest.len());
        rest[..line_len]
            .char_indices()
            .nth(col0)
            .map_or(start + line_len, |(i, _)| start + i)
    }

    /// Byte offset of the `index`-th character (character indices are what
    /// the YAML parser reports).
    pub fn offset_of_char(&self, index: usize) -> usize {
        match &self.char_offsets {
            None => index.min(self.text.len()),
            Some(offsets) => offsets.get(index).copied().unwrap_or(self.text.len()),
        }
    }

    fn floor_char(&self, mut offset: usize) -> usize {
        offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_characters() {
        let f = SourceFile::new("t", "ab\nçd: x\n");
        assert_eq!(f.line_col(0), LineCol { line: 1, column: 1 });
        assert_eq!(f.line_col(3), LineCol { line: 2, column: 1 });
        // 'd' follows a two-byte character.
        assert_eq!(f.line_col(5), LineCol { line: 2, column: 2 });
        assert_eq!(f.offset_of(2, 1), 5);
        assert_eq!(f.offset_of_char(4), 5);
        assert_eq!(f.offset_of(9, 0), f.text().len());
    }
}
