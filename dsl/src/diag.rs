//! Diagnostics: every problem found in a workflow file, with where and why.
//!
//! Front ends and checks push [`Diagnostic`]s into a [`Diagnostics`] list
//! instead of stopping at the first problem. Rendering (compiler-style, through
//! miette) and the machine-readable form live here too, so the binary only
//! prints.

use std::fmt;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource};
use serde::Serialize;

use crate::source::{SourceFile, Span};

/// What kind of problem a diagnostic reports. The kebab-case name is stable
/// and appears in rendered output (`dsl::unknown-key`) and in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs)]
pub enum Code {
    YamlSyntax,
    YamlLimit,
    UnsupportedYaml,
    DuplicateKey,
    UnknownKey,
    MissingKey,
    WrongType,
    BadValue,
    BadName,
    BadDuration,
    BadSize,
    ModelAndEndpoint,
    NoModelOrEndpoint,
    UndefinedAgent,
    UndefinedStep,
    UndefinedInput,
    DuplicateName,
    Cycle,
    NotUpstream,
    ExprSyntax,
    UnknownVariable,
    UnknownMetric,
    TemplateSyntax,
    ScriptError,
    ScriptLimit,
    EmptyWorkflow,
    CannotAct,
    CommandAndUrl,
    NoCommandOrUrl,
    BadToolRef,
    UndefinedToolServer,
    DuplicateTool,
    UnusedToolServer,
    BadSchema,
    UnknownField,
    JsonWithoutSchema,
    ForEachAndRepeat,
    ApprovalConflict,
    NoAgentOrApproval,
    UnknownTool,
    ToolServerUnreachable,
}

impl Code {
    /// The stable kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Code::YamlSyntax => "yaml-syntax",
            Code::YamlLimit => "yaml-limit",
            Code::UnsupportedYaml => "unsupported-yaml",
            Code::DuplicateKey => "duplicate-key",
            Code::UnknownKey => "unknown-key",
            Code::MissingKey => "missing-key",
            Code::WrongType => "wrong-type",
            Code::BadValue => "bad-value",
            Code::BadName => "bad-name",
            Code::BadDuration => "bad-duration",
            Code::BadSize => "bad-size",
            Code::ModelAndEndpoint => "model-and-endpoint",
            Code::NoModelOrEndpoint => "no-model-or-endpoint",
            Code::UndefinedAgent => "undefined-agent",
            Code::UndefinedStep => "undefined-step",
            Code::UndefinedInput => "undefined-input",
            Code::DuplicateName => "duplicate-name",
            Code::Cycle => "cycle",
            Code::NotUpstream => "not-upstream",
            Code::ExprSyntax => "expr-syntax",
            Code::UnknownVariable => "unknown-variable",
            Code::UnknownMetric => "unknown-metric",
            Code::TemplateSyntax => "template-syntax",
            Code::ScriptError => "script-error",
            Code::ScriptLimit => "script-limit",
            Code::EmptyWorkflow => "empty-workflow",
            Code::CannotAct => "cannot-act",
            Code::CommandAndUrl => "command-and-url",
            Code::NoCommandOrUrl => "no-command-or-url",
            Code::BadToolRef => "bad-tool-ref",
            Code::UndefinedToolServer => "undefined-tool-server",
            Code::DuplicateTool => "duplicate-tool",
            Code::UnusedToolServer => "unused-tool-server",
            Code::BadSchema => "bad-schema",
            Code::UnknownField => "unknown-field",
            Code::JsonWithoutSchema => "json-without-schema",
            Code::ForEachAndRepeat => "for-each-and-repeat",
            Code::ApprovalConflict => "approval-conflict",
            Code::NoAgentOrApproval => "no-agent-or-approval",
            Code::UnknownTool => "unknown-tool",
            Code::ToolServerUnreachable => "tool-server-unreachable",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dsl::{}", self.name())
    }
}

/// How bad a problem is. Only errors make a workflow invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something worth knowing that is not a problem (a check that could not be made).
    Note,
    /// The workflow is still valid.
    Warning,
    /// The workflow is invalid.
    Error,
}

/// One problem, pointing at the text that causes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// What kind of problem.
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// One sentence: what is wrong.
    pub message: String,
    /// The offending text.
    pub span: Span,
    /// Short text shown under the offending text.
    pub label: String,
    /// How to fix it.
    pub help: Option<String>,
    /// Other places that explain the problem (the first definition of a
    /// duplicate, the other end of a cycle).
    pub related: Vec<(Span, String)>,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn error(code: Code, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            span,
            label: String::new(),
            help: None,
            related: Vec::new(),
        }
    }

    /// A warning at `span`.
    pub fn warning(code: Code, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, span, message)
        }
    }

    /// A note at `span`.
    pub fn note(code: Code, span: Span, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Note,
            ..Diagnostic::error(code, span, message)
        }
    }

    /// Set the text under the offending span.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// Set the hint.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Set the hint when there is one.
    pub fn with_help_opt(mut self, help: Option<String>) -> Self {
        if help.is_some() {
            self.help = help;
        }
        self
    }

    /// Add a secondary location.
    pub fn with_related(mut self, span: Span, label: impl Into<String>) -> Self {
        self.related.push((span, label.into()));
        self
    }
}

/// Most diagnostics kept for one file; past this, problems are only
/// counted (like a compiler, which stops listing after many errors).
pub const MAX_DIAGNOSTICS: usize = 200;

/// The diagnostics of one source file, in the order found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
    /// Problems found past [`MAX_DIAGNOSTICS`]; an error among them still
    /// makes the file invalid.
    suppressed: usize,
    suppressed_errors: usize,
}

impl Diagnostics {
    /// Record a problem.
    pub fn push(&mut self, d: Diagnostic) {
        // The same problem reached twice (e.g. through two references) is
        // reported once.
        if self.items.contains(&d) {
            return;
        }
        if self.items.len() >= MAX_DIAGNOSTICS {
            self.suppressed += 1;
            self.suppressed_errors += usize::from(d.severity == Severity::Error);
            return;
        }
        self.items.push(d);
    }

    /// Problems found but not kept, past [`MAX_DIAGNOSTICS`].
    pub fn suppressed(&self) -> usize {
        self.suppressed
    }

    /// Whether any error (not warning) was recorded.
    pub fn has_errors(&self) -> bool {
        self.suppressed_errors > 0 || self.items.iter().any(|d| d.severity == Severity::Error)
    }

    /// Number of errors.
    pub fn error_count(&self) -> usize {
        self.suppressed_errors + self.items.iter().filter(|d| d.severity == Severity::Error).count()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// All diagnostics, sorted by position (stable for equal positions).
    pub fn sorted(&self) -> Vec<&Diagnostic> {
        let mut v: Vec<&Diagnostic> = self.items.iter().collect();
        v.sort_by_key(|d| (d.span.start, d.span.end));
        v
    }

    /// Iterate in the order found.
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }

    /// Number of diagnostics.
    pub fn len(&self) -> usize {
        self.items.len()
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

/// Options for [`render`].
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions {
    /// Use ANSI colours.
    pub color: bool,
    /// Use Unicode box drawing (otherwise ASCII).
    pub unicode: bool,
    /// Wrap width in columns.
    pub width: usize,
}

impl Default for RenderOptions {
    /// Plain, deterministic output: what snapshots and pipes want.
    fn default() -> Self {
        RenderOptions {
            color: false,
            unicode: true,
            width: 100,
        }
    }
}

/// Render diagnostics like a compiler: `file:line:col`, the source lines, the
/// offending text underlined, and the hint. Sorted by position.
pub fn render(diags: &Diagnostics, file: &SourceFile, opts: RenderOptions) -> String {
    let theme = match (opts.unicode, opts.color) {
        (true, true) => GraphicalTheme::unicode(),
        (true, false) => GraphicalTheme::unicode_nocolor(),
        (false, true) => GraphicalTheme::ascii(),
        (false, false) => GraphicalTheme::none(),
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(opts.width)
        .with_links(false)
        .with_context_lines(1);
    let source = NamedSource::new(file.name(), file.text().to_owned());
    let mut out = String::new();
    for d in diags.sorted() {
        let report = Report {
            diag: d,
            file,
            source: &source,
        };
        if touches_long_line(d, file) {
            // A source excerpt of a very long line is unreadable, and miette
            // cannot pad past 65535 columns: print the one-line form.
            out.push_str(&one_line(d, file));
            out.push('\n');
            if let Some(h) = &d.help {
                out.push_str(&format!("  help: {h}\n"));
            }
        } else if handler.render_report(&mut out, &report).is_err() {
            // Rendering into a String cannot fail for IO reasons; fall back
            // to the one-line form if miette rejects a span.
            out.push_str(&one_line(d, file));
            out.push('\n');
        }
        out.push('\n');
    }
    if diags.suppressed() > 0 {
        out.push_str(&format!(
            "… and {} more problem(s) not shown; fix the ones above first\n\n",
            diags.suppressed()
        ));
    }
    out
}

/// Lines longer than this (in bytes) are not shown as source excerpts.
const MAX_EXCERPT_LINE: usize = 1000;

fn touches_long_line(d: &Diagnostic, file: &SourceFile) -> bool {
    let text = file.text();
    let spans = std::iter::once(d.span).chain(d.related.iter().map(|(s, _)| *s));
    spans.into_iter().any(|s| {
        [s.start, s.end].into_iter().any(|at| {
            let before = file.slice(Span::new(0, at));
            let at = before.len();
            let start = before.rfind('\n').map_or(0, |i| i + 1);
            let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
            end - start > MAX_EXCERPT_LINE
        })
    })
}

/// `file:line:col: error[code]: message` — the grep-friendly one-line form.
pub fn one_line(d: &Diagnostic, file: &SourceFile) -> String {
    let lc = file.line_col(d.span.start);
    let sev = match d.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Note => "note",
    };
    format!(
        "{}:{}:{}: {sev}[{}]: {}",
        file.name(),
        lc.line,
        lc.column,
        d.code.name(),
        d.message
    )
}

/// A diagnostic in machine-readable form (`skein validate --output json`).
#[derive(Debug, Clone, Serialize)]
pub struct JsonDiagnostic {
    /// File name as given.
    pub file: String,
    /// Stable problem code.
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// What is wrong.
    pub message: String,
    /// 1-based start line.
    pub line: usize,
    /// 1-based start column, in characters.
    pub column: usize,
    /// 1-based end line.
    pub end_line: usize,
    /// 1-based end column (exclusive), in characters.
    pub end_column: usize,
    /// Byte range of the offending text.
    pub span: Span,
    /// Text under the offending span.
    pub label: String,
    /// How to fix it.
    pub help: Option<String>,
}

/// The machine-readable form of every diagnostic, sorted by position.
pub fn to_json(diags: &Diagnostics, file: &SourceFile) -> Vec<JsonDiagnostic> {
    diags
        .sorted()
        .into_iter()
        .map(|d| {
            let start = file.line_col(d.span.start);
            let end = file.line_col(d.span.end);
            JsonDiagnostic {
                file: file.name().to_owned(),
                code: d.code,
                severity: d.severity,
                message: d.message.clone(),
                line: start.line,
                column: start.column,
                end_line: end.line,
                end_column: end.column,
                span: d.span,
                label: d.label.clone(),
                help: d.help.clone(),
            }
        })
        .collect()
}

/// Adapter that lets miette render one of our diagnostics.
struct Report<'a> {
    diag: &'a Diagnostic,
    file: &'a SourceFile,
    source: &'a NamedSource<String>,
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&one_line(self.diag, self.file))
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diag.message)
    }
}

impl std::error::Error for Report<'_> {}

impl miette::Diagnostic for Report<'_> {
    fn code<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        Some(Box::new(self.diag.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diag.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
            Severity::Note => miette::Severity::Advice,
        })
    }

    fn help<'b>(&'b self) -> Option<Box<dyn fmt::Display + 'b>> {
        self.diag.help.as_ref().map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let text_len = self.file.text().len();
        let clamp = move |s: Span| {
            let start = s.start.min(text_len);
            let end = s.end.min(text_len).max(start);
            (start, end - start)
        };
        let label = |text: &str| (!text.is_empty()).then(|| text.to_owned());
        let primary = LabeledSpan::new_primary_with_span(label(&self.diag.label), clamp(self.diag.span));
        let related = self
            .diag
            .related
            .iter()
            .map(move |(s, t)| LabeledSpan::new_with_span(label(t), clamp(*s)));
        Some(Box::new(std::iter::once(primary).chain(related)))
    }
}

/// Help text: "did you mean `x`?" when a close candidate exists, otherwise the
/// list of what is allowed.
pub fn did_you_mean<'a>(wrong: &str, candidates: impl IntoIterator<Item = &'a str> + Clone, what: &str) -> String {
    match skein_text::closest(wrong, candidates.clone()) {
        Some(s) => format!("did you mean `{s}`?"),
        None => {
            let list: Vec<String> = candidates.into_iter().map(|c| format!("`{c}`")).collect();
            if list.is_empty() {
                format!("no {what} are defined here")
            } else {
                format!("expected one of the {what}: {}", list.join(", "))
            }
        }
    }
}
