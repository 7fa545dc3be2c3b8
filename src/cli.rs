//! Command-line interface definition.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Success.
pub const EXIT_OK: u8 = 0;
/// The command ran and found a failure (e.g. an invalid workflow).
pub const EXIT_FAILURE: u8 = 1;
/// Bad usage or unreadable input.
pub const EXIT_USAGE: u8 = 2;

/// Skein: hardware-aware orchestration of multi-agent LLM workflows on mixed GPU fleets.
#[derive(Debug, Parser)]
#[command(name = "skein", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check workflow files (YAML or Rhai) and report every problem.
    ///
    /// Exits 0 when every file is valid, 1 when any has an error, 2 when a
    /// file cannot be read.
    Validate(ValidateArgs),
}

/// `skein validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Workflow files: `.yaml`, `.yml` or `.rhai`.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// Also print the workflow IR of valid files, as JSON (inside the report with `--output json`).
    #[arg(long)]
    pub print_ir: bool,
    /// Colour: auto (when stderr is a terminal and NO_COLOR is unset), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Compiler-style diagnostics on stderr, a summary line per file.
    Human,
    /// One JSON document on stdout.
    Json,
}

/// When to use ANSI colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// When the output is a terminal and `NO_COLOR` is unset.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}
