//! The Skein workflow language: YAML files and Rhai scripts → one validated
//! workflow IR, with compiler-style diagnostics.
//!
//! This crate is a pure core: it takes text and returns values. It reads no
//! files and opens no sockets; the caller supplies the text and prints the
//! diagnostics. Rhai runs on the threads of [`pool`], bounded by a deadline.
//!
//! # Layout
//! - [`source`]: source text, byte spans, line/column positions.
//! - [`diag`]: diagnostics, their codes, compiler-style and JSON rendering.
//! - [`node`]: the spanned document tree both front ends build.
//! - `yaml`: YAML text → tree (saphyr-parser events, our own limits).
//! - `script`: Rhai workflow script → tree (a small registered API).
//! - `read` and `lower`: tree → draft workflow, field by field.
//! - `check`: cross references, cycles, expressions → [`ir::Workflow`].
//! - [`expr`]: the sandboxed Rhai engine, expression compile and evaluation.
//! - `truth`: three-valued conditions over metrics that may have no data.
//! - `value`: [`expr::Value`] and [`expr::Bindings`], what expressions read and
//!   return, so that no caller needs Rhai's types.
//! - [`pool`]: the big-stack threads all Rhai work runs on (the one place
//!   this crate starts threads; with the evaluation deadline, the one place
//!   it reads a clock).
//! - [`template`]: `{{ expr }}` prompt templates.
//! - [`schema`]: a step's `output_schema` (JSON Schema) compiled, and the
//!   check of an answer against it (what the orchestrator runs on each answer).
//! - [`ir`]: the workflow IR every later stage consumes.
//!
//! # Example
//! ```
//! let parsed = skein_dsl::parse("hello.yaml", "name: hello\nagents:\n  helper: { model: Qwen/Qwen2.5-0.5B-Instruct }\n");
//! assert!(parsed.diagnostics.is_empty());
//! assert_eq!(parsed.workflow.unwrap().agents.len(), 1);
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod check;
pub mod diag;
pub mod expr;
pub mod ir;
mod lower;
pub mod node;
pub mod pool;
mod read;
pub mod schema;
mod script;
pub mod source;
pub mod template;
mod truth;
mod value;
mod yaml;

pub use diag::{Code, Diagnostic, Diagnostics, RenderOptions, Severity};
pub use ir::Workflow;
pub use lower::{FORMAT_VERSION, is_valid_repo_id};
pub use source::{SourceFile, SourceKind, Span};
pub use yaml::{MAX_DEPTH, MAX_NODES};

/// Largest workflow file accepted, in bytes.
pub const MAX_FILE_BYTES: usize = 1 << 20;

/// The result of reading one workflow file.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The file, for rendering diagnostics.
    pub file: SourceFile,
    /// The IR, when the file has no error.
    pub workflow: Option<Workflow>,
    /// Every problem found, errors and warnings.
    pub diagnostics: Diagnostics,
    /// Where each endpoint agent's `url` is written, by agent: for checks made
    /// outside the language (the server's endpoint policy) to point at it.
    pub endpoint_urls: std::collections::BTreeMap<String, Span>,
    /// Where each tool server's `command` or `url` is written, by server: for
    /// the server's checks of both (allowed programs, the egress policy).
    pub tool_transports: std::collections::BTreeMap<String, Span>,
    /// Each agent's `tools` entries with where each is written, by agent: for checks
    /// against what the servers declare (`skein validate --check-tools`).
    pub tool_refs: std::collections::BTreeMap<String, Vec<(ir::ToolRef, Span)>>,
}

impl Parsed {
    /// Whether the file is a valid workflow.
    pub fn is_valid(&self) -> bool {
        self.workflow.is_some() && !self.diagnostics.has_errors()
    }

    /// Compiler-style rendering of every diagnostic.
    pub fn render(&self, opts: RenderOptions) -> String {
        diag::render(&self.diagnostics, &self.file, opts)
    }
}

/// Read a workflow whose language is chosen by the file name's extension
/// (`.yaml`/`.yml` or `.rhai`; anything else is read as YAML).
pub fn parse(name: &str, text: &str) -> Parsed {
    let kind = SourceKind::from_name(name).unwrap_or(SourceKind::Yaml);
    parse_as(name, text, kind)
}

/// Read a workflow written in `kind`. The work (a script's run, the checks'
/// compilation of expressions) happens on a thread of [`pool`].
pub fn parse_as(name: &str, text: &str, kind: SourceKind) -> Parsed {
    let (owned_name, owned_text) = (name.to_owned(), text.to_owned());
    match pool::run(move || parse_here(&owned_name, &owned_text, kind)) {
        Ok(parsed) => parsed,
        Err(e) => {
            let mut diagnostics = Diagnostics::default();
            diagnostics.push(
                Diagnostic::error(
                    Code::ScriptLimit,
                    Span::point(0),
                    format!("the workflow was not read: {e}"),
                )
                .with_label("not read")
                .with_help("try again; if it persists, the server is overloaded"),
            );
            Parsed {
                file: SourceFile::new(name, text),
                workflow: None,
                diagnostics,
                endpoint_urls: Default::default(),
                tool_transports: Default::default(),
                tool_refs: Default::default(),
            }
        }
    }
}

/// [`parse_as`] on the calling thread (a pool thread).
fn parse_here(name: &str, text: &str, kind: SourceKind) -> Parsed {
    let file = SourceFile::new(name, text);
    let mut diagnostics = Diagnostics::default();
    if text.len() > MAX_FILE_BYTES {
        diagnostics.push(
            Diagnostic::error(
                Code::YamlLimit,
                Span::point(0),
                format!(
                    "the file is {} bytes; workflow files are at most {MAX_FILE_BYTES}",
                    text.len()
                ),
            )
            .with_label("file too large")
            .with_help("split it, or check that this is the workflow file you meant"),
        );
        return Parsed {
            file,
            workflow: None,
            diagnostics,
            endpoint_urls: Default::default(),
            tool_transports: Default::default(),
            tool_refs: Default::default(),
        };
    }
    let tree = match kind {
        SourceKind::Yaml => yaml::parse(&file, &mut diagnostics),
        SourceKind::Rhai => script::parse(&file, &mut diagnostics),
    };
    let mut endpoint_urls = std::collections::BTreeMap::new();
    let mut tool_transports = std::collections::BTreeMap::new();
    let mut tool_refs = std::collections::BTreeMap::new();
    let workflow = tree.and_then(|root| {
        let mut cx = read::Cx {
            file: &file,
            diags: &mut diagnostics,
            script: kind == SourceKind::Rhai,
            endpoint_urls: std::collections::BTreeMap::new(),
            tool_transports: std::collections::BTreeMap::new(),
        };
        let draft = lower::workflow(&mut cx, &root);
        endpoint_urls = std::mem::take(&mut cx.endpoint_urls);
        tool_transports = std::mem::take(&mut cx.tool_transports);
        tool_refs = draft.as_ref().map(|d| d.tool_refs.clone()).unwrap_or_default();
        check::check(&mut cx, draft?)
    });
    let workflow = workflow.filter(|_| !diagnostics.has_errors());
    Parsed {
        file,
        workflow,
        diagnostics,
        endpoint_urls,
        tool_transports,
        tool_refs,
    }
}
