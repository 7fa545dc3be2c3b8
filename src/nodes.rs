//! `skein nodes`: the nodes and GPUs of a running server's hardware graph, as a table
//! for people; and `skein node rm|reset NAME`: an admin frees a node's name. Both
//! through the server's REST API.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use skein_orchestrator::graph::HealthState;

use crate::cli::EXIT_OK;
use crate::cli::common::OutputFormat;
use crate::cli::nodes::{NodeNameArgs, NodesArgs};
use crate::client::{ApiClient, refused_error};
use crate::table::{Style, render};

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

/// What `skein nodes` reads from `GET /v1/graph`.
#[derive(Debug, Deserialize)]
struct Graph {
    nodes: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Node {
    inventory: Inventory,
    connected: bool,
    health: Health,
    /// Why the node is draining (its agent will leave), if it is.
    #[serde(default)]
    draining: Option<String>,
    gpus: Vec<Gpu>,
}

#[derive(Debug, Deserialize)]
struct Inventory {
    name: String,
    /// Absent from servers that predate labels.
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct Health {
    state: HealthState,
    reasons: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Gpu {
    facts: GpuFacts,
    latest: Option<Sample>,
    health: Health,
    /// Why nothing new is placed on it (a reflex's drain, or its node draining).
    #[serde(default)]
    drained: Option<String>,
}

#[derive(Debug, Deserialize)]
struct GpuFacts {
    index: u32,
    name: String,
    memory_total: u64,
}

#[derive(Debug, Deserialize)]
struct Sample {
    memory_used: u64,
    utilization_pct: Option<u32>,
    temperature_c: Option<i32>,
}

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// The table `skein nodes` prints: one row per GPU, one per GPU-less node; when any node
/// has labels, a last column with each node's (`zone=lab-a,rack=r1`) on its first row.
fn render_nodes(graph: &Graph) -> String {
    let labelled = graph.nodes.iter().any(|node| !node.inventory.labels.is_empty());
    let mut rows: Vec<Vec<String>> = Vec::new();
    for node in &graph.nodes {
        let first_row = rows.len();
        // Down and left say the agent is gone already.
        let node_health = if node.connected || node.health.state.is_unavailable() {
            node.health.state.to_string()
        } else {
            format!("{} (disconnected)", node.health.state)
        };
        if node.gpus.is_empty() {
            rows.push(vec![
                node.inventory.name.clone(),
                "-".to_owned(),
                "(no GPU)".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                match &node.draining {
                    Some(reason) => format!("{node_health}; draining: {reason}"),
                    None => node_health.clone(),
                },
            ]);
        }
        for gpu in &node.gpus {
            let (used, util, temp) = match &gpu.latest {
                Some(s) => (
                    gib(s.memory_used),
                    s.utilization_pct.map_or("-".to_owned(), |u| format!("{u}%")),
                    s.temperature_c.map_or("-".to_owned(), |t| format!("{t}°C")),
                ),
                None => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
            };
            let mut health = gpu.health.state.to_string();
            if let Some(reason) = gpu.health.reasons.first() {
                let _ = write!(health, ": {reason}");
            }
            // Drained (a reflex) or draining (its node will leave): nothing new goes
            // there, whatever its health.
            if let Some(reason) = &gpu.drained {
                let word = if node.draining.as_ref() == Some(reason) {
                    "draining"
                } else {
                    "drained"
                };
                health = if gpu.health.state == HealthState::Ok {
                    format!("{word}: {reason}")
                } else {
                    format!("{health}; {word}: {reason}")
                };
            }
            rows.push(vec![
                node.inventory.name.clone(),
                gpu.facts.index.to_string(),
                gpu.facts.name.clone(),
                format!("{used} / {}", gib(gpu.facts.memory_total)),
                util,
                temp,
                health,
            ]);
        }
        if labelled {
            let labels = node
                .inventory
                .labels
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect::<Vec<_>>()
                .join(",");
            for (i, row) in rows.iter_mut().enumerate().skip(first_row) {
                row.push(match (i == first_row, labels.is_empty()) {
                    (true, true) => "-".to_owned(),
                    (true, false) => labels.clone(),
                    (false, _) => String::new(),
                });
            }
        }
    }
    // Figures right-aligned under their headers, text left-aligned.
    let style = Style {
        indent: "",
        gap: 3,
        right_aligned: &[3, 4, 5],
    };
    let mut header = vec!["NODE", "GPU", "MODEL", "MEMORY (GiB)", "UTIL", "TEMP", "HEALTH"];
    if labelled {
        header.push("LABELS");
    }
    render(&style, &header, &rows)
}

/// `skein nodes`.
pub fn run_nodes(args: &NodesArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.server, &args.client)?;
    loop {
        let response = client.get("/v1/graph")?;
        match args.output {
            OutputFormat::Json => println!("{response}"),
            OutputFormat::Human => {
                let graph: Graph =
                    serde_json::from_str(&response).context("the server's graph is not what this skein expects")?;
                if args.watch {
                    // Clear the screen and go home, as `watch` does.
                    print!("\x1b[2J\x1b[H");
                }
                print!("{}", render_nodes(&graph));
                if graph.nodes.is_empty() {
                    println!("(no node has joined yet)");
                }
            }
        }
        if !args.watch {
            return Ok(ExitCode::from(EXIT_OK));
        }
        std::io::stdout().flush().ok();
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(nodes: serde_json::Value) -> Graph {
        serde_json::from_value(serde_json::json!({ "nodes": nodes })).unwrap()
    }

    fn node(name: &str, labels: serde_json::Value, gpus: u32) -> serde_json::Value {
        let gpus: Vec<serde_json::Value> = (0..gpus)
            .map(|index| {
                serde_json::json!({
                    "facts": { "index": index, "name": "NVIDIA GeForce RTX 4090", "memory_total": 24u64 << 30 },
                    "latest": null,
                    "health": { "state": "ok", "reasons": [] },
                })
            })
            .collect();
        let mut inventory = serde_json::json!({ "name": name });
        if !labels.is_null() {
            inventory["labels"] = labels;
        }
        serde_json::json!({
            "inventory": inventory,
            "connected": true,
            "health": { "state": "ok", "reasons": [] },
            "gpus": gpus,
        })
    }

    #[test]
    fn drained_and_draining_gpus_say_so_with_why() {
        let mut reflexed = node("gpu-b", serde_json::Value::Null, 2);
        reflexed["gpus"][1]["drained"] = serde_json::json!("reflex `failing-memory` of run r1");
        let mut leaving = node("slurm-7", serde_json::Value::Null, 1);
        leaving["draining"] = serde_json::json!("the Slurm job ends in 120 s");
        leaving["gpus"][0]["drained"] = serde_json::json!("the Slurm job ends in 120 s");
        let table = render_nodes(&graph(serde_json::json!([reflexed, leaving])));
        let rows: Vec<&str> = table.lines().collect();
        assert!(rows[1].trim_end().ends_with("ok"), "{table}");
        assert!(
            rows[2]
                .trim_end()
                .ends_with("drained: reflex `failing-memory` of run r1"),
            "{table}"
        );
        assert!(
            rows[3].trim_end().ends_with("draining: the Slurm job ends in 120 s"),
            "{table}"
        );
    }

    #[test]
    fn labels_show_on_each_nodes_first_row_only_when_some_node_has_them() {
        let table = render_nodes(&graph(serde_json::json!([
            node("a100-box", serde_json::json!({ "zone": "lab-a", "rack": "r1" }), 2),
            node("cpu-1", serde_json::json!({}), 0),
            // A server that predates labels sends none.
            node("old-1", serde_json::Value::Null, 1),
        ])));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with("HEALTH   LABELS"), "{table}");
        assert!(
            lines[1].starts_with("a100-box") && lines[1].ends_with("ok       rack=r1,zone=lab-a"),
            "{table}"
        );
        assert!(lines[2].starts_with("a100-box") && lines[2].ends_with("ok"), "{table}");
        assert!(
            lines[3].starts_with("cpu-1") && lines[3].ends_with("ok       -"),
            "{table}"
        );
        assert!(
            lines[4].starts_with("old-1") && lines[4].ends_with("ok       -"),
            "{table}"
        );

        let unlabelled = render_nodes(&graph(serde_json::json!([node("rtx-1", serde_json::Value::Null, 1)])));
        assert!(!unlabelled.contains("LABELS"), "{unlabelled}");
    }
}
