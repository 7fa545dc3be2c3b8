//! `skein events`: what the workflows' reflexes did, newest first, or as it happens.

use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;

use crate::cli::EXIT_OK;
use crate::cli::common::OutputFormat;
use crate::cli::runs::EventsArgs;
use crate::client::ApiClient;

#[derive(Deserialize)]
struct Event {
    at: String,
    run: String,
    reflex: String,
    kind: String,
    #[serde(default)]
    values: std::collections::BTreeMap<String, f64>,
    #[serde(default)]
    actions: Vec<Action>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Deserialize)]
struct Action {
    action: serde_json::Value,
    outcome: String,
    detail: String,
}

impl Event {
    /// The table row: time, run, reflex, what happened, the values, the actions.
    fn row(&self) -> Vec<String> {
        let kind = if self.dry_run {
            format!("{} (dry run)", self.kind)
        } else {
            self.kind.clone()
        };
        let values = self
            .values
            .iter()
            .map(|(k, v)| format!("{k}={}", figure(*v)))
            .collect::<Vec<_>>()
            .join(" ");
        let mut actions: Vec<String> = self
            .actions
            .iter()
            .map(|a| {
                let name = a
                    .action
                    .as_object()
                    .and_then(|o| o.keys().next().cloned())
                    .or_else(|| a.action.as_str().map(str::to_owned))
                    .unwrap_or_default();
                format!("{name}: {} ({})", a.outcome, a.detail)
            })
            .collect();
        if let Some(error) = &self.error {
            actions.push(error.clone());
        }
        vec![
            self.at.clone(),
            self.run.clone(),
            self.reflex.clone(),
            kind,
            values,
            actions.join("; "),
        ]
    }
}

const HEADER: [&str; 6] = ["TIME", "RUN", "REFLEX", "EVENT", "VALUES", "ACTIONS"];

/// `skein events`.
pub fn run(args: &EventsArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.list.remote.server, &args.list.remote.client)?;
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[],
    };
    if args.follow {
        client.follow("/v1/events/stream", |name, data| {
            if name == "reflex" {
                if args.list.output == OutputFormat::Json {
                    println!("{data}");
                } else if let Ok(event) = serde_json::from_str::<Event>(data) {
                    println!("{}", event.row().join("   "));
                }
            }
            true
        })?;
        return Ok(ExitCode::from(EXIT_OK));
    }
    let events = serde_json::Value::Array(client.all_pages("/v1/events", "after")?);
    if args.list.output == OutputFormat::Json {
        println!("{events}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let events: Vec<Event> =
        serde_json::from_value(events).context("the server's events are not what this skein expects")?;
    if events.is_empty() {
        println!("(no reflex has fired yet)");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<Vec<String>> = events.iter().map(Event::row).collect();
    print!("{}", crate::table::render(&style, &HEADER, &rows));
    Ok(ExitCode::from(EXIT_OK))
}

/// A metric's value for people: at most three decimals, without trailing zeros
/// (`0.97`, not `0.969999999996894`; `92`, not `92.000`).
fn figure(value: f64) -> String {
    let text = format!("{value:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" { "0".to_owned() } else { text.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::figure;

    #[test]
    fn figures_are_short() {
        assert_eq!(figure(0.969_999_999_996_894), "0.97");
        assert_eq!(figure(92.0), "92");
        assert_eq!(figure(9.950_248_756_218_905), "9.95");
        assert_eq!(figure(-0.0001), "0");
        assert_eq!(figure(25.876_424), "25.876");
    }
}
