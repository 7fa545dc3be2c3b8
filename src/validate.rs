//! `skein validate FILE...`: check workflow files and report every problem; with
//! `--check-tools`, also each agent's tools against what its tool servers declare.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use skein_dsl::diag::{self, JsonDiagnostic};
use skein_dsl::{Code, Diagnostic, Parsed, RenderOptions, Span, Workflow};
use skein_model_registry::error_chain;
use skein_orchestrator::tools::{self, ToolError};
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
    let mut loaded: Vec<_> = args.files.iter().map(|p| (p, workflows::load(p))).collect();
    if args.check_tools {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        for parsed in loaded.iter_mut().filter_map(|(_, r)| r.as_mut().ok()) {
            runtime.block_on(check_tools(parsed));
        }
    }
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

/// How long each tool server is given to start (or answer) and list its tools.
const TOOL_LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// Lists the tools of every tool server of a valid workflow (all at once, with no key)
/// and adds a diagnostic for each tool an agent names that its server does not declare
/// (`unknown-tool`, at the tool) and each server that could not be listed
/// (`tool-server-unreachable` at its `command` or `url`: a warning, or a note when it
/// answered 401).
async fn check_tools(parsed: &mut Parsed) {
    let Some(workflow) = parsed.workflow.as_ref().filter(|_| !parsed.diagnostics.has_errors()) else {
        return;
    };
    let mut listings = tokio::task::JoinSet::new();
    for (server, spec) in &workflow.tool_servers {
        let (server, transport) = (server.clone(), spec.transport.clone());
        listings.spawn(async move {
            let listed = tools::list_tools(&server, &transport, None, TOOL_LIST_TIMEOUT).await;
            (server, listed)
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = listings.join_next().await {
        if let Ok(result) = joined {
            results.push(result);
        }
    }
    results.sort_by(|a, b| a.0.cmp(&b.0));
    for (server, listed) in results {
        let at = parsed.tool_transports.get(&server).copied().unwrap_or(Span::point(0));
        match listed {
            Ok(declared) => {
                for (agent, refs) in &parsed.tool_refs {
                    for (r, span) in refs {
                        let Some(tool) = r.tool.as_deref().filter(|t| r.server == server && !declared.iter().any(|d| d == t)) else {
                            continue;
                        };
                        parsed.diagnostics.push(
                            Diagnostic::error(
                                Code::UnknownTool,
                                *span,
                                format!("agent `{agent}` lists `{server}.{tool}`, but tool server `{server}` declares no tool `{tool}`"),
                            )
                            .with_label(format!("not a tool of `{server}`"))
                            .with_related(at, format!("`{server}` is started (or reached) here"))
                            .with_help(unknown_tool_help(&server, tool, &declared)),
                        );
                    }
                }
            }
            Err(ToolError::NeedsKey { .. }) => parsed.diagnostics.push(
                Diagnostic::note(
                    Code::ToolServerUnreachable,
                    at,
                    format!("tool server `{server}`: could not list tools: needs its key"),
                )
                .with_label("answered 401")
                .with_help("`skein validate` sends no key; its tools are checked when a run connects with its `api_key_secret`"),
            ),
            Err(e) => parsed.diagnostics.push(
                Diagnostic::warning(
                    Code::ToolServerUnreachable,
                    at,
                    format!("could not list the tools of tool server `{server}`: {}", reason(&e)),
                )
                .with_label("could not list its tools")
                .with_help("check the command or URL (and that the server runs); its tools were not checked"),
            ),
        }
    }
}

/// The hint of `unknown-tool`: the closest declared tool, and every one.
fn unknown_tool_help(server: &str, tool: &str, declared: &[String]) -> String {
    if declared.is_empty() {
        return format!("tool server `{server}` declares no tools");
    }
    let listed: Vec<String> = declared.iter().map(|d| format!("`{d}`")).collect();
    let all = format!("tool server `{server}` declares {}", listed.join(", "));
    let hint = diag::did_you_mean(tool, declared.iter().map(String::as_str), "tools");
    if hint.starts_with("did you mean") {
        format!("{hint} {all}; or `{server}.*` for every one")
    } else {
        format!("{all}; or `{server}.*` for every one")
    }
}

/// Why a server could not be listed, without its name (the diagnostic says it).
fn reason(e: &ToolError) -> String {
    match e {
        ToolError::Unavailable { reason, .. } | ToolError::Denied { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn plural(n: usize, suffix: &'static str) -> &'static str {
    if n == 1 { "" } else { suffix }
}
