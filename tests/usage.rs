//! Usage accounting end to end, with the real server and CLI: two users in two groups
//! run workflows whose endpoint agent (a model on loopback that reports 4 prompt and 3
//! generated tokens an answer) answers their steps; `GET /v1/usage`, `skein usage`
//! (table and CSV) and `GET /metrics` count each call, its tokens and the runs' time,
//! a student sees only their own, and the accounts survive a kill -9.

use std::time::Duration;

use serde_json::{Value, json};
use skein_testkit::endpoint::WholeAnswer;
use skein_testkit::rest::{RestApi, Restartable};

const TOKEN: &str = "usage-test-admin-token";

/// A workflow of `steps` steps, each one call of the agent `writer` at `model`.
fn workflow(model: &str, steps: usize) -> String {
    let mut text = format!("name: w\nagents:\n  writer:\n    endpoint: {{ url: \"{model}\", model: m }}\nsteps:\n");
    for n in 0..steps {
        text.push_str(&format!("  - {{ id: s{n}, agent: writer, prompt: hello }}\n"));
    }
    text
}

/// The row of `report` whose fields are `at`.
fn row<'a>(report: &'a Value, at: &[(&str, &str)]) -> &'a Value {
    report["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| at.iter().all(|(k, v)| r[*k] == *v)))
        .unwrap_or_else(|| panic!("a row at {at:?} in {report:#}"))
}

fn calls(row: &Value) -> (u64, u64, u64) {
    (
        row["requests"].as_u64().unwrap_or(0),
        row["tokens_in"].as_u64().unwrap_or(0),
        row["tokens_out"].as_u64().unwrap_or(0),
    )
}

#[test]
fn calls_tokens_and_run_time_are_counted_by_user_group_model_and_agent_and_survive_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::start("hi there");
    let mut lab = Restartable::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_skein")),
        dir.path().join("data"),
        TOKEN,
        &["--endpoint-allow", "127.0.0.1/32"],
    );
    let ok = |lab: &Restartable, args: &[&str]| {
        let (ok, said) = lab.cli(args);
        assert!(ok, "skein {args:?}: {said}");
        said
    };
    ok(&lab, &["group", "set", "nlp"]);
    ok(&lab, &["group", "add", "nlp", "ada"]);
    // The token is the first line (a note on keeping it follows, on stderr).
    let created = ok(&lab, &["token", "create", "--user", "ada"]);
    let token = created.lines().next().unwrap_or_default().trim().to_owned();
    let port: u16 = lab.api.base.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
    let ada = RestApi::new(port, &token);

    let mine = ada.submit(&workflow(&model.url(), 2));
    let theirs = lab.api.submit(&workflow(&model.url(), 1));
    for (api, id) in [(&ada, &mine), (&lab.api, &theirs)] {
        let run = api.finished(id);
        assert_eq!(run["state"], "succeeded", "{run:#}");
    }

    let everyone = |api: &RestApi| {
        let (status, report) = api
            .call("/v1/usage?by=group,user,model,agent", None)
            .expect("the server answers");
        assert_eq!(status, 200, "{report:#}");
        report
    };
    let report = everyone(&lab.api);
    let agent_of = [("model", "m"), ("agent", "writer")];
    let ada_row = row(&report, &[&[("group", "nlp"), ("user", "ada")][..], &agent_of].concat());
    assert_eq!(calls(ada_row), (2, 8, 6), "{report:#}");
    let admin_row = row(
        &report,
        &[&[("group", "default"), ("user", "admin")][..], &agent_of].concat(),
    );
    assert_eq!(calls(admin_row), (1, 4, 3), "{report:#}");
    // Run time is counted without a model or agent.
    let ada_time = row(&report, &[("user", "ada"), ("model", ""), ("agent", "")]);
    assert!(ada_time["run_seconds"].as_f64().unwrap_or(0.0) > 0.0, "{report:#}");
    assert_eq!(calls(&report["total"]), (3, 12, 9), "{report:#}");

    // A student sees their own usage only, and cannot ask for another's.
    let own = everyone(&ada);
    assert!(
        own["rows"].as_array().unwrap().iter().all(|r| r["user"] == "ada"),
        "{own:#}"
    );
    assert_eq!(calls(&own["total"]), (2, 8, 6), "{own:#}");
    let (status, refused) = ada.call("/v1/usage?user=admin", None).unwrap();
    assert_eq!(status, 403, "{refused:#}");
    let (status, bad) = lab.api.call("/v1/usage?by=team", None).unwrap();
    assert_eq!(status, 400, "{bad:#}");
    assert!(bad.to_string().contains("`team` is not a dimension"), "{bad:#}");

    // The CLI: a table with a total, and CSV.
    let table = ok(&lab, &["usage", "--by", "user"]);
    let ada_line = table.lines().find(|l| l.starts_with("ada")).unwrap_or_default();
    assert_eq!(
        ada_line.split_whitespace().take(4).collect::<Vec<_>>(),
        ["ada", "2", "8", "6"],
        "{table}"
    );
    assert!(table.lines().any(|l| l.starts_with("total")), "{table}");
    let csv = ok(&lab, &["usage", "--by", "group,user", "--csv"]);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("group,user,requests,tokens_in,tokens_out,gib_hours,gpu_hours,run_seconds"),
        "{csv}"
    );
    assert!(
        lines.any(|l| l.starts_with("nlp,ada,2,8,6,0.000000,0.000000,")),
        "{csv}"
    );

    // Prometheus counters by group and user.
    let (_, metrics) = lab.api.text("/metrics").expect("the server answers");
    assert!(
        metrics.contains("skein_usage_tokens_total{group=\"nlp\",user=\"ada\",direction=\"out\"} 6"),
        "{metrics}"
    );
    assert!(
        metrics.contains("skein_usage_requests_total{group=\"default\",user=\"admin\"} 1"),
        "{metrics}"
    );

    // The ledger is written within its interval (10 s) of the admission passes (2 s);
    // a kill -9 after that loses nothing.
    std::thread::sleep(Duration::from_secs(15));
    lab.kill_and_restart();
    let after = everyone(&lab.api);
    assert_eq!(after["rows"], report["rows"], "{after:#}\nbefore: {report:#}");

    // Usage outside the window is not counted.
    let (_, future) = lab
        .api
        .call("/v1/usage?since=2099-01-01T00:00:00Z&until=2099-01-02T00:00:00Z", None)
        .unwrap();
    assert_eq!(future["rows"], json!([]), "{future:#}");
}

#[test]
fn a_user_at_their_tokens_a_minute_is_refused_with_when_it_frees() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::start("hi there");
    let lab = Restartable::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_skein")),
        dir.path().join("data"),
        TOKEN,
        &["--endpoint-allow", "127.0.0.1/32"],
    );
    let ok = |args: &[&str]| {
        let (ok, said) = lab.cli(args);
        assert!(ok, "skein {args:?}: {said}");
        said
    };
    let created = ok(&["token", "create", "--user", "ada"]);
    let token = created.lines().next().unwrap_or_default().trim().to_owned();
    ok(&["quota", "set", "--user", "ada", "--tokens-per-minute", "10"]);
    let port: u16 = lab.api.base.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap();
    let ada = RestApi::new(port, &token);
    // The agent serves until cancelled: a workflow without steps.
    let serving = workflow(&model.url(), 0);
    let run = ada.submit(&serving);
    ada.until(&run, "serving", |r| r["state"] == "running");
    let (status, session) = ada
        .call("/v1/sessions", Some(json!({"agent": "writer", "run": run})))
        .unwrap();
    assert_eq!(status, 201, "{session:#}");
    let path = format!("/v1/sessions/{}/messages", session["id"].as_str().unwrap());

    // Each answer is 4 + 3 tokens: in at 0 and at 7 (below 10), refused at 14.
    for turn in 0..2 {
        let (status, reply) = ada.call(&path, Some(json!({"content": "hello"}))).unwrap();
        assert_eq!(status, 200, "turn {turn}: {reply:#}");
    }
    let (status, refused) = ada.call(&path, Some(json!({"content": "hello"}))).unwrap();
    assert_eq!(status, 429, "{refused:#}");
    assert_eq!(refused["error"]["code"], "quota_exceeded", "{refused:#}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("user `ada` may use 10 tokens a minute on the OpenAI and Anthropic routes and in sessions: 14 tokens in use; it frees in ")
            && message.contains("skein quota set --user ada --tokens-per-minute N"),
        "{message}"
    );
    // The OpenAI route is held to the same limit.
    let (status, refused) = ada
        .call(
            "/v1/chat/completions",
            Some(json!({"model": "writer", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .unwrap();
    assert_eq!(
        (status, &refused["error"]["code"]),
        (429, &json!("quota_exceeded")),
        "{refused:#}"
    );

    // `skein quota show` says how much of the minute is used.
    let shown = ok(&["quota", "show", "--user", "ada"]);
    let line = shown.lines().find(|l| l.starts_with("user ada")).unwrap_or_default();
    assert!(line.split_whitespace().any(|c| c == "14/10"), "{shown}");
    // The refused requests are not counted as usage: two turns were.
    let (_, usage) = lab.api.call("/v1/usage?user=ada&by=", None).unwrap();
    assert_eq!(calls(&usage["total"]), (2, 8, 6), "{usage:#}");
}
