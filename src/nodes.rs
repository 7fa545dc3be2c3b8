//! `skein node rm|reset NAME`: an admin frees a node's name, through the server's REST
//! API with the admin token.

use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;

use crate::cli::{EXIT_OK, NodeNameArgs};
use crate::client::{ApiClient, refused_error};

#[derive(Deserialize)]
struct Forgotten {
    name: String,
    #[serde(default)]
    node_id: Option<String>,
    identity_forgotten: bool,
}

/// `name` as one path segment: every byte but unreserved ones written `%XX` (a node
/// name may hold `/`, `?`, `#` or `%`).
pub fn path_segment(name: &str) -> String {
    let mut out = String::new();
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn parse(body: &str) -> anyhow::Result<Forgotten> {
    serde_json::from_str(body).context("the server's answer is not what this skein expects")
}

/// `skein node rm NAME`.
pub fn run_rm(args: &NodeNameArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let answer = parse(&client.delete(&format!("/v1/nodes/{}", path_segment(&args.name)))?)?;
    match answer.node_id {
        Some(id) => println!("removed node `{}` ({id})", answer.name),
        None => println!("node `{}` was not in the graph", answer.name),
    }
    if answer.identity_forgotten {
        println!(
            "its identity is forgotten: the next agent to register `{}` with a valid join token claims the name",
            answer.name
        );
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein node reset NAME`.
pub fn run_reset(args: &NodeNameArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let path = format!("/v1/nodes/{}/reset", path_segment(&args.name));
    let body = client
        .post(&path, &serde_json::json!({}))?
        .map_err(|r| refused_error(&r))?;
    let answer = parse(&body)?;
    if answer.identity_forgotten {
        println!(
            "forgot the identity of node `{}`: the next agent to register it with a valid join token claims the name",
            answer.name
        );
    } else {
        println!("node `{}` had no identity: its name is free already", answer.name);
    }
    Ok(ExitCode::from(EXIT_OK))
}
