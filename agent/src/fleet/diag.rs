//! Problems found in a fleet file, each with its place, and their rendering.

use std::fmt;

/// One problem of a fleet file (or of a CSV file it replays), with where it is and
/// how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as the user named it (the fleet file, or a CSV next to it).
    pub file: String,
    /// 1-based line; 0 when the position is unknown.
    pub line: u64,
    /// 1-based column in characters; 0 when the position is unknown.
    pub column: u64,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: Option<String>,
    /// The text of the line, for the excerpt.
    pub source_line: Option<String>,
}

impl Diagnostic {
    /// A problem at `line:column` of `text` (the text of `file`).
    pub(crate) fn at(file: &str, text: &str, (line, column): (u64, u64), message: impl Into<String>) -> Self {
        let source_line = usize::try_from(line)
            .ok()
            .and_then(|line| line.checked_sub(1))
            .and_then(|line| text.lines().nth(line))
            .map(str::to_owned);
        Self {
            file: file.to_owned(),
            line,
            column,
            message: message.into(),
            help: None,
            source_line,
        }
    }

    /// The same problem with a hint.
    pub(crate) fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// `file:line:col: message` on one line, for logs and grep.
    pub fn one_line(&self) -> String {
        format!("{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

impl fmt::Display for Diagnostic {
    /// A compiler-style excerpt:
    ///
    /// ```text
    /// error: unknown GPU model `A100-80G`
    ///   --> lab.yaml:4:20
    ///    |
    ///  4 |     gpus: { model: A100-80G, count: 4 }
    ///    |                    ^
    ///    = help: did you mean `A100-80GB`?
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        let number = self.line.to_string();
        let pad = " ".repeat(number.len());
        write!(f, "{pad}--> {}:{}:{}", self.file, self.line, self.column)?;
        if let Some(source) = &self.source_line {
            // Tabs would shift the caret; show them as one space each, like the column.
            let source = source.replace('\t', " ");
            let caret_at = usize::try_from(self.column.saturating_sub(1)).unwrap_or(0);
            let before: String = source.chars().take(caret_at).map(|_| ' ').collect();
            write!(f, "\n{pad} |\n{number} | {source}\n{pad} | {before}^")?;
        }
        if let Some(help) = &self.help {
            write!(f, "\n{pad} = help: {help}")?;
        }
        Ok(())
    }
}

/// Every problem of one load, sorted by file and position; displayed one after
/// another with a blank line between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub(crate) fn sorted(mut list: Vec<Diagnostic>) -> Self {
        list.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
        list.dedup();
        Self(list)
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diagnostic) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n\n")?;
            }
            write!(f, "{diagnostic}")?;
        }
        if self.0.len() > 1 {
            write!(f, "\n\n{} problems in the fleet file", self.0.len())?;
        }
        Ok(())
    }
}
