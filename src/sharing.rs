//! `skein group …`, `skein quota …` and `skein usage` through the server's REST API.

use std::process::ExitCode;

use anyhow::Context;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cli::EXIT_OK;
use crate::cli::common::{ListArgs, OutputFormat};
use crate::cli::sharing::{GroupAddArgs, GroupRmArgs, GroupSetArgs, LimitArgs, QuotaSetArgs, QuotaShowArgs, UsageArgs};
use crate::client::ApiClient;

#[derive(Deserialize, Default)]
struct Limits {
    gpu_gib: Option<f64>,
    gpus: Option<u32>,
    runs: Option<u32>,
    tokens_per_minute: Option<u64>,
    sessions: Option<u32>,
    gpu_hours: Option<f64>,
    gpu_hours_period_hours: Option<u32>,
}

#[derive(Deserialize)]
struct Holding {
    runs: u32,
    gpu_gib: f64,
    gpus: u32,
    limits: Limits,
    factor: f64,
    usage_gib_hours: f64,
    #[serde(default)]
    tokens_last_minute: u64,
    #[serde(default)]
    sessions: u32,
    #[serde(default)]
    gpu_hours: f64,
}

#[derive(Deserialize)]
struct GroupRow {
    name: String,
    shares: u32,
    members: Vec<String>,
    holding: Holding,
}

/// The change a `set` sends: shares, limits to set, limits to lift.
fn change(shares: Option<u32>, limits: &LimitArgs) -> Value {
    let mut set = serde_json::Map::new();
    if let Some(gib) = limits.gpu_gib {
        set.insert("gpu_gib".into(), json!(gib));
    }
    if let Some(gpus) = limits.gpus {
        set.insert("gpus".into(), json!(gpus));
    }
    if let Some(runs) = limits.runs {
        set.insert("runs".into(), json!(runs));
    }
    if let Some(tokens) = limits.tokens_per_minute {
        set.insert("tokens_per_minute".into(), json!(tokens));
    }
    if let Some(sessions) = limits.sessions {
        set.insert("sessions".into(), json!(sessions));
    }
    if let Some(gpu_hours) = limits.gpu_hours {
        set.insert("gpu_hours".into(), json!(gpu_hours));
    }
    if let Some(period) = limits.gpu_hours_period {
        set.insert("gpu_hours_period_hours".into(), json!(period));
    }
    let clear: Vec<&str> = limits.clear.iter().map(|l| l.api()).collect();
    let mut body = json!({ "limits": set, "clear": clear });
    if let Some(shares) = shares {
        body["shares"] = json!(shares);
    }
    body
}

/// `used / limit` of one limit, for the tables.
fn of<T: std::fmt::Display>(used: String, limit: Option<T>) -> String {
    match limit {
        Some(limit) => format!("{used}/{limit}"),
        None => used,
    }
}

fn holding_cells(h: &Holding) -> Vec<String> {
    vec![
        of(h.runs.to_string(), h.limits.runs),
        of(format!("{:.1}", h.gpu_gib), h.limits.gpu_gib),
        of(h.gpus.to_string(), h.limits.gpus),
        of(h.tokens_last_minute.to_string(), h.limits.tokens_per_minute),
        of(h.sessions.to_string(), h.limits.sessions),
        of(
            format!("{:.1}", h.gpu_hours),
            h.limits.gpu_hours.map(|limit| {
                let period = h.limits.gpu_hours_period_hours.unwrap_or(7 * 24);
                if period.is_multiple_of(24) {
                    format!("{limit} in {}d", period / 24)
                } else {
                    format!("{limit} in {period}h")
                }
            }),
        ),
        format!("{:.3}", h.factor),
        format!("{:.1}", h.usage_gib_hours),
    ]
}

const HOLDING: [&str; 8] = [
    "RUNS",
    "GPU GIB",
    "GPUS",
    "TOKENS/MIN",
    "SESSIONS",
    "GPU-H",
    "FACTOR",
    "USAGE GIB-H",
];

fn style() -> crate::table::Style {
    crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[],
    }
}

/// `skein group list`.
pub fn run_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.get("/v1/groups")?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let groups: Vec<GroupRow> =
        serde_json::from_str(&body).context("the server's groups are not what this skein expects")?;
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            let mut row = vec![g.name.clone(), g.shares.to_string()];
            row.extend(holding_cells(&g.holding));
            row.push(if g.members.is_empty() {
                "-".to_owned()
            } else {
                g.members.join(",")
            });
            row
        })
        .collect();
    let mut header = vec!["GROUP", "SHARES"];
    header.extend(HOLDING);
    header.push("MEMBERS");
    print!("{}", crate::table::render(&style(), &header, &rows));
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein group set NAME`.
pub fn run_set(args: &GroupSetArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    client.put(&format!("/v1/groups/{}", args.name), &change(args.shares, &args.limits))?;
    println!("group `{}` set", args.name);
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein group add GROUP USER`.
pub fn run_add(args: &GroupAddArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let mut body = json!({ "group": args.group });
    if let Some(shares) = args.shares {
        body["shares"] = json!(shares);
    }
    client.put(&format!("/v1/users/{}", args.user), &body)?;
    println!("user `{}` is in group `{}`", args.user, args.group);
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein group rm NAME`.
pub fn run_rm(args: &GroupRmArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    client.delete(&format!("/v1/groups/{}", args.name))?;
    println!("group `{}` removed", args.name);
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein quota show`.
pub fn run_show(args: &QuotaShowArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let path = match &args.user {
        Some(user) => format!("/v1/quota?user={user}"),
        None => "/v1/quota".to_owned(),
    };
    let body = client.get(&path)?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    #[derive(Deserialize)]
    struct Quota {
        user: String,
        group: String,
        mine: Holding,
        ours: Holding,
    }
    let quota: Quota = serde_json::from_str(&body).context("the server's quota is not what this skein expects")?;
    let mut rows = Vec::new();
    for (whose, holding) in [
        (format!("user {}", quota.user), &quota.mine),
        (format!("group {}", quota.group), &quota.ours),
    ] {
        let mut row = vec![whose];
        row.extend(holding_cells(holding));
        rows.push(row);
    }
    let mut header = vec!["WHOSE"];
    header.extend(HOLDING);
    print!("{}", crate::table::render(&style(), &header, &rows));
    println!(
        "(used/limit; GPU-H: GPU-hours in the limit's period (`used/limit in period`; the last 7 days when none is set); FACTOR is the fair-share factor: 1 used nothing of late, 0.5 used exactly its share)"
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein quota set --user NAME | --group NAME`.
pub fn run_quota_set(args: &QuotaSetArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let (path, whose) = match (&args.user, &args.group) {
        (Some(user), _) => (format!("/v1/users/{user}"), format!("user `{user}`")),
        (None, Some(group)) => (format!("/v1/groups/{group}"), format!("group `{group}`")),
        (None, None) => anyhow::bail!("name whose limits to set: --user NAME or --group NAME"),
    };
    client.put(&path, &change(None, &args.limits))?;
    println!("limits of {whose} set");
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein usage`.
pub fn run_usage(args: &UsageArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let mut url = reqwest::Url::parse("http://skein/v1/usage").context("the usage route")?;
    {
        let mut query = url.query_pairs_mut();
        query.append_pair("since", &args.since).append_pair("by", &args.by);
        for (name, value) in [
            ("until", &args.until),
            ("user", &args.user),
            ("group", &args.group),
            ("model", &args.model),
            ("agent", &args.agent),
        ] {
            if let Some(value) = value {
                query.append_pair(name, value);
            }
        }
        if args.csv {
            query.append_pair("format", "csv");
        }
    }
    let body = client.get(&format!("/v1/usage?{}", url.query().unwrap_or_default()))?;
    if args.csv || args.output == OutputFormat::Json {
        print!("{body}");
        if !body.ends_with('\n') {
            println!();
        }
        return Ok(ExitCode::from(EXIT_OK));
    }
    let report: Value = serde_json::from_str(&body).context("the server's usage is not what this skein expects")?;
    let by: Vec<String> = report["by"]
        .as_array()
        .map(|dims| dims.iter().filter_map(|d| d.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let cells = |row: &Value| -> Vec<String> {
        let float = |name: &str| row[name].as_f64().unwrap_or(0.0);
        vec![
            row["requests"].as_u64().unwrap_or(0).to_string(),
            row["tokens_in"].as_u64().unwrap_or(0).to_string(),
            row["tokens_out"].as_u64().unwrap_or(0).to_string(),
            format!("{:.2}", float("gib_hours")),
            format!("{:.2}", float("gpu_hours")),
            format!("{:.1}", float("run_seconds") / 3600.0),
        ]
    };
    let mut rows: Vec<Vec<String>> = Vec::new();
    for row in report["rows"].as_array().into_iter().flatten() {
        let mut line: Vec<String> = by
            .iter()
            .map(|d| match row[d.as_str()].as_str() {
                Some("") | None => "-".to_owned(),
                Some(value) => value.to_owned(),
            })
            .collect();
        line.extend(cells(row));
        rows.push(line);
    }
    if !by.is_empty() && rows.len() != 1 {
        let mut total = vec!["total".to_owned()];
        total.extend(std::iter::repeat_n(String::new(), by.len() - 1));
        total.extend(cells(&report["total"]));
        rows.push(total);
    }
    let mut header: Vec<String> = by.iter().map(|d| d.to_uppercase()).collect();
    header.extend(["REQUESTS", "TOKENS IN", "TOKENS OUT", "GIB-H", "GPU-H", "RUN H"].map(str::to_owned));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    println!(
        "usage from {} to {}",
        report["since"].as_str().unwrap_or("?"),
        report["until"].as_str().unwrap_or("?")
    );
    print!("{}", crate::table::render(&style(), &header, &rows));
    Ok(ExitCode::from(EXIT_OK))
}
