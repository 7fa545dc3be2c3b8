//! `skein secret set|list|rm`: users' secrets (the keys of their endpoint agents),
//! through the server's REST API. A value is read from standard input (at a prompt
//! without echo on a terminal), never from the command line, where other local users
//! could read it in the process list and it would stay in the shell's history.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::cli::EXIT_OK;
use crate::cli::common::{ListArgs, OutputFormat};
use crate::cli::secrets::{SecretRmArgs, SecretSetArgs};
use crate::client::ApiClient;

#[derive(Deserialize)]
struct SecretRow {
    name: String,
    #[serde(default)]
    owner: Option<String>,
    shared: bool,
    updated_at: serde_json::Value,
}

fn path(name: &str, shared: bool) -> anyhow::Result<String> {
    if !skein_dsl::ir::is_valid_secret_name(name) {
        bail!(
            "secret name `{name}` is not allowed: use 1 to 64 letters, digits, `-`, `_` or `.`, starting with a letter or digit"
        );
    }
    Ok(if shared {
        format!("/v1/shared-secrets/{name}")
    } else {
        format!("/v1/secrets/{name}")
    })
}

/// The value: one line of standard input, read without echo on a terminal; the line
/// break at its end is not part of it.
fn read_value(name: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    let mut line = String::new();
    if stdin.is_terminal() {
        eprint!("value of secret `{name}` (not shown): ");
        std::io::stderr().flush().ok();
        let echo = EchoOff::new(&stdin);
        let read = stdin.lock().read_line(&mut line);
        drop(echo);
        eprintln!();
        read.context("cannot read the value")?;
    } else {
        stdin
            .lock()
            .read_line(&mut line)
            .context("cannot read the value from standard input")?;
    }
    let value = line.strip_suffix('\n').unwrap_or(&line);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.is_empty() {
        bail!("no value given; type it at the prompt, or pipe it: `printf %s \"$KEY\" | skein secret set {name}`");
    }
    Ok(value.to_owned())
}

/// The terminal's echo, off until dropped.
struct EchoOff {
    saved: Option<rustix::termios::Termios>,
}

impl EchoOff {
    fn new(stdin: &std::io::Stdin) -> EchoOff {
        use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
        let Ok(saved) = tcgetattr(stdin) else {
            return EchoOff { saved: None };
        };
        let mut quiet = saved.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        quiet.local_modes.insert(LocalModes::ECHONL);
        match tcsetattr(stdin, OptionalActions::Now, &quiet) {
            Ok(()) => EchoOff { saved: Some(saved) },
            Err(_) => EchoOff { saved: None },
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = rustix::termios::tcsetattr(std::io::stdin(), rustix::termios::OptionalActions::Now, saved);
        }
    }
}

/// `skein secret set NAME [--shared]`.
pub fn run_set(args: &SecretSetArgs) -> anyhow::Result<ExitCode> {
    let path = path(&args.name, args.shared)?;
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let value = read_value(&args.name)?;
    client.put(&path, &serde_json::json!({ "value": value }))?;
    let reference = if args.shared {
        format!("shared/{}", args.name)
    } else {
        args.name.clone()
    };
    eprintln!(
        "secret `{}` set; workflows name it as `api_key_secret: {reference}`",
        args.name
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein secret rm NAME [--shared]`.
pub fn run_rm(args: &SecretRmArgs) -> anyhow::Result<ExitCode> {
    let path = path(&args.name, args.shared)?;
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    client.delete(&path)?;
    eprintln!("secret `{}` removed", args.name);
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein secret list`.
pub fn run_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let secrets = serde_json::Value::Array(client.all_pages("/v1/secrets", "after")?);
    if args.output == OutputFormat::Json {
        println!("{secrets}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<SecretRow> =
        serde_json::from_value(secrets).context("the server's secrets are not what this skein expects")?;
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|s| {
            let (name, owner) = if s.shared {
                (format!("shared/{}", s.name), "(shared)".to_owned())
            } else {
                (s.name, s.owner.unwrap_or_default())
            };
            let updated = match s.updated_at {
                serde_json::Value::String(at) => at,
                other => other.to_string(),
            };
            vec![name, owner, updated]
        })
        .collect();
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[],
    };
    print!(
        "{}",
        crate::table::render(&style, &["SECRET", "OWNER", "UPDATED"], &rows)
    );
    Ok(ExitCode::from(EXIT_OK))
}
