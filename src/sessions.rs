//! `skein sessions` and `skein session create|show|chat|migrate|delete`: sessions
//! through the server's REST API.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::cli::common::{ListArgs, OutputFormat};
use crate::cli::sessions::{SessionChatArgs, SessionCreateArgs, SessionIdArgs, SessionMigrateArgs};
use crate::cli::{EXIT_FAILURE, EXIT_OK};
use crate::client::{ApiClient, refused_error};

#[derive(Deserialize)]
struct Binding {
    instance: String,
    node: String,
    #[serde(default)]
    gpus: Vec<u32>,
}

impl Binding {
    fn place(&self) -> String {
        match self.gpus.as_slice() {
            [] => format!("{} (CPU)", self.node),
            gpus => format!(
                "{}:{}",
                self.node,
                gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            ),
        }
    }
}

#[derive(Deserialize)]
struct Session {
    id: String,
    owner: String,
    agent: String,
    #[serde(default)]
    run: Option<String>,
    #[serde(default)]
    binding: Option<Binding>,
    messages: u64,
    #[serde(default)]
    migrations: u64,
    created_at: String,
    updated_at: String,
}

#[derive(Deserialize)]
struct Message {
    seq: u64,
    role: String,
    content: String,
    created_at: String,
    #[serde(default)]
    tool_calls: Vec<ToolCall>,
    #[serde(default)]
    tool_call_id: Option<String>,
}

/// A tool call of an assistant message.
#[derive(Deserialize)]
struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

/// The longest arguments of a tool call `session show` prints (characters).
const SHOWN_ARGUMENTS: usize = 120;

impl Message {
    /// The message as `session show` prints it: a head line (`[seq] role at time`, and
    /// the call a tool result answers), its text, then one line per tool call it makes
    /// (`calls name(arguments)  [id]`, the arguments on one line and cut).
    fn render(&self) -> String {
        let mut out = format!("[{}] {} at {}", self.seq, self.role, self.created_at);
        if let Some(id) = &self.tool_call_id {
            out.push_str(&format!(" (result of {id})"));
        }
        if !self.content.is_empty() {
            out.push('\n');
            out.push_str(&self.content);
        }
        for call in &self.tool_calls {
            out.push_str(&format!(
                "\ncalls {}({})  [{}]",
                call.name,
                crate::runs::one_line(&call.arguments, SHOWN_ARGUMENTS),
                call.id
            ));
        }
        out
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &str) -> anyhow::Result<T> {
    serde_json::from_str(body).context("the server's answer is not what this skein expects")
}

/// `skein sessions`.
pub fn run_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let raw = serde_json::Value::Array(client.all_pages("/v1/sessions", "after")?);
    if args.output == OutputFormat::Json {
        println!("{raw}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let sessions: Vec<Session> =
        serde_json::from_value(raw).context("the server's sessions are not what this skein expects")?;
    if sessions.is_empty() {
        println!("(no session yet; `skein session create --model REPO` starts one)");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<Vec<String>> = sessions
        .into_iter()
        .map(|s| {
            vec![
                s.id,
                s.owner,
                s.agent,
                s.binding.map_or_else(|| "-".to_owned(), |b| b.place()),
                s.messages.to_string(),
                s.updated_at,
            ]
        })
        .collect();
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[4],
    };
    print!(
        "{}",
        crate::table::render(
            &style,
            &["SESSION", "OWNER", "AGENT", "GPU", "MESSAGES", "UPDATED"],
            &rows
        )
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein session create`.
pub fn run_create(args: &SessionCreateArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let mut body = serde_json::json!({});
    for (key, value) in [
        ("model", &args.model),
        ("agent", &args.agent),
        ("run", &args.run),
        ("system", &args.system),
    ] {
        if let Some(value) = value {
            body[key] = serde_json::json!(value);
        }
    }
    let answer = client.post("/v1/sessions", &body)?.map_err(|r| refused_error(&r))?;
    if args.output == OutputFormat::Json {
        println!("{answer}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let session: Session = parse(&answer)?;
    println!("{}", session.id);
    eprintln!(
        "session {} with `{}`; `skein session chat {}` talks in it",
        session.id, session.agent, session.id
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein session show`.
pub fn run_show(args: &SessionIdArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.get(&format!("/v1/sessions/{}", args.id))?;
    let messages = client.all_pages(&format!("/v1/sessions/{}/messages", args.id), "from")?;
    if args.output == OutputFormat::Json {
        let mut session: serde_json::Value = parse(&body)?;
        session["history"] = serde_json::Value::Array(messages);
        println!("{session}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let session: Session = parse(&body)?;
    println!("session   {}", session.id);
    println!("owner     {}", session.owner);
    match &session.run {
        Some(run) => println!("agent     {} (run {run})", session.agent),
        None => println!("agent     {}", session.agent),
    }
    match &session.binding {
        Some(b) => println!(
            "served by {} on {} (moved {} times)",
            b.instance,
            b.place(),
            session.migrations
        ),
        None => println!("served by - (placed at the next message)"),
    }
    println!("created   {}", session.created_at);
    println!("updated   {}", session.updated_at);
    println!("messages  {}", session.messages);
    for message in messages {
        let message: Message = serde_json::from_value(message).context("a message is not what this skein expects")?;
        println!("\n{}", message.render());
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// One turn, the reply printed as it streams. Returns false when it failed.
fn turn(client: &ApiClient, id: &str, text: &str) -> anyhow::Result<bool> {
    let mut out = std::io::stdout();
    let mut failed = None;
    client.post_events(
        &format!("/v1/sessions/{id}/messages"),
        &serde_json::json!({ "content": text, "stream": true }),
        |name, data| {
            let value: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
            match name {
                "token" => {
                    let _ = write!(out, "{}", value["delta"].as_str().unwrap_or_default());
                    let _ = out.flush();
                }
                "error" => {
                    failed = Some(
                        value
                            .pointer("/error/message")
                            .and_then(|m| m.as_str())
                            .unwrap_or(data)
                            .to_owned(),
                    );
                }
                _ => {}
            }
            true
        },
    )?;
    let _ = writeln!(out);
    match failed {
        Some(message) => {
            eprintln!("error: {message}");
            Ok(false)
        }
        None => Ok(true),
    }
}

/// `skein session chat`.
pub fn run_chat(args: &SessionChatArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    // The session exists and is this user's before anything is typed.
    let session: Session = parse(&client.get(&format!("/v1/sessions/{}", args.id))?)?;
    if let Some(message) = &args.message {
        let ok = turn(&client, &session.id, message)?;
        return Ok(ExitCode::from(if ok { EXIT_OK } else { EXIT_FAILURE }));
    }
    eprintln!(
        "chatting with `{}` in session {} ({} messages so far); an empty line or Ctrl-D ends",
        session.agent, session.id, session.messages
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line.context("cannot read the terminal")?;
        if line.trim().is_empty() {
            break;
        }
        turn(&client, &session.id, &line)?;
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein session migrate`.
pub fn run_migrate(args: &SessionMigrateArgs) -> anyhow::Result<ExitCode> {
    let to = match args.to.rsplit_once(':') {
        _ if args.to == "auto" => serde_json::json!("auto"),
        None if !args.to.is_empty() => serde_json::json!({ "node": args.to }),
        None => bail!("--to is empty; write NODE:GPU, NODE or auto, e.g. --to rtx-1:2"),
        Some((node, gpu)) => {
            let gpu: u32 = gpu
                .parse()
                .with_context(|| format!("--to `{}`: `{gpu}` is not a GPU index; e.g. --to rtx-1:2", args.to))?;
            serde_json::json!({ "node": node, "gpu": gpu })
        }
    };
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client
        .post(
            &format!("/v1/sessions/{}/migrate", args.id),
            &serde_json::json!({ "to": to }),
        )?
        .map_err(|r| refused_error(&r))?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    #[derive(Deserialize)]
    struct Moved {
        from: Option<Binding>,
        to: Binding,
        downtime_ms: f64,
    }
    let moved: Moved = parse(&body)?;
    println!(
        "session {} moved from {} to {} ({}), {:.1} ms without service",
        args.id,
        moved.from.as_ref().map_or_else(|| "nowhere".to_owned(), Binding::place),
        moved.to.place(),
        moved.to.instance,
        moved.downtime_ms
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein session delete`.
pub fn run_delete(args: &SessionIdArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    client.delete(&format!("/v1/sessions/{}", args.id))?;
    println!("deleted session {}", args.id);
    Ok(ExitCode::from(EXIT_OK))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(message: serde_json::Value, expected: &str) {
        let message: Message = serde_json::from_value(message).unwrap();
        assert_eq!(message.render(), expected);
    }

    #[test]
    fn messages_show_their_text_tool_calls_and_results() {
        let at = "2026-01-01T00:00:00Z";
        check(
            serde_json::json!({"seq": 0, "role": "user", "content": "Paris?", "created_at": at}),
            &format!("[0] user at {at}\nParis?"),
        );
        // A call's arguments on one line, cut to SHOWN_ARGUMENTS characters.
        let long = format!("{{\"text\":\n  \"{}\"}}", "a".repeat(200));
        check(
            serde_json::json!({"seq": 1, "role": "assistant", "content": "", "created_at": at,
                "tool_calls": [{"id": "c1", "name": "weather", "arguments": "{\"text\":\"Paris\"}"},
                               {"id": "c2", "name": "echo", "arguments": long}]}),
            &format!(
                "[1] assistant at {at}\ncalls weather({{\"text\":\"Paris\"}})  [c1]\ncalls echo({{\"text\": \"{}…)  [c2]",
                "a".repeat(SHOWN_ARGUMENTS - 10)
            ),
        );
        check(
            serde_json::json!({"seq": 2, "role": "tool", "content": "sunny", "created_at": at, "tool_call_id": "c1"}),
            &format!("[2] tool at {at} (result of c1)\nsunny"),
        );
    }
}
