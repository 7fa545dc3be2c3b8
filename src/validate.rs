//! `skein validate FILE...`: check workflow files and report every problem.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use serde::Serialize;
use skein_dsl::diag::{self, JsonDiagnostic};
use skein_dsl::{RenderOptions, Workflow};
use skein_model_registry::error_chain;
use skein_orchestrator::workflows;

use crate::cli::common::OutputFormat;
use crate::cli::workflow::{ColorChoice, ValidateArgs};
use crate::cli::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE};

/// One file's result in `--output json`.
#[derive(Serialize)]
struct FileReport<'a> {
    file: String,
    valid: bool,
    /// Why the file could not be read at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    diagnostics: Vec<JsonDiagnostic>,
    /// Problems found past the listing limit and not listed.
    #[serde(skip_serializing_if = "is_zero")]
    not_listed: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    workflow: Option<&'a Workflow>,
}

#[derive(Serialize)]
struct Report<'a> {
    valid: bool,
    files: Vec<FileReport<'a>>,
}

pub fn run(args: &ValidateArgs) -> anyhow::Result<ExitCode> {
    let color = match args.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let opts = RenderOptions {
        color,
        ..RenderOptions::default()
    };
    let loaded: Vec<_> = args.files.iter().map(|p| (p, workflows::load(p))).collect();
    let unreadable = loaded.iter().any(|(_, r)| r.is_err());
    let invalid = loaded.iter().any(|(_, r)| r.as_ref().is_ok_and(|p| !p.is_valid()));

    match args.output {
        OutputFormat::Json => {
            let files = loaded
                .iter()
                .map(|(path, r)| match r {
                    Ok(p) => FileReport {
                        file: path.display().to_string(),
                        valid: p.is_valid(),
                        error: None,
                        diagnostics: diag::to_json(&p.diagnostics, &p.file),
                        not_listed: p.diagnostics.suppressed(),
                        workflow: if args.print_ir { p.workflow.as_ref() } else { None },
                    },
                    Err(e) => FileReport {
                        file: path.display().to_string(),
                        valid: false,
                        error: Some(error_chain(e)),
                        diagnostics: Vec::new(),
                        not_listed: 0,
                        workflow: None,
                    },
                })
                .collect();
            let report = Report {
                valid: !unreadable && !invalid,
                files,
            };
            let mut out = std::io::stdout().lock();
            serde_json::to_writer_pretty(&mut out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Human => {
            let mut err = std::io::stderr().lock();
            let mut out = std::io::stdout().lock();
            for (path, r) in &loaded {
                match r {
                    Err(e) => writeln!(err, "error: {}", error_chain(e))?,
                    Ok(p) => {
                        if !p.diagnostics.is_empty() {
                            write!(err, "{}", p.render(opts))?;
                        }
                        match &p.workflow {
                            Some(w) if p.is_valid() => {
                                writeln!(
                                    out,
                                    "ok {}: workflow `{}`, {} agent{}, {} step{}, {} reflex{}",
                                    path.display(),
                                    w.name,
                                    w.agents.len(),
                                    plural(w.agents.len(), "s"),
                                    w.steps.len(),
                                    plural(w.steps.len(), "s"),
                                    w.reflexes.len(),
                                    plural(w.reflexes.len(), "es"),
                                )?;
                                if args.print_ir {
                                    serde_json::to_writer_pretty(&mut out, w)?;
                                    writeln!(out)?;
                                }
                            }
                            _ => {
                                let n = p.diagnostics.error_count();
                                writeln!(err, "invalid {}: {n} error{}", path.display(), plural(n, "s"))?;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(ExitCode::from(if unreadable {
        EXIT_USAGE
    } else if invalid {
        EXIT_FAILURE
    } else {
        EXIT_OK
    }))
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn plural(n: usize, suffix: &'static str) -> &'static str {
    if n == 1 { "" } else { suffix }
}
