//! `tool_servers:` and an agent's `tools` and `max_turns`: the same IR from YAML and
//! Rhai, the in-flight policies as written, the spans the server's checks point at,
//! and the warning for a server no agent uses.

use skein_dsl::ir::{DEFAULT_MAX_TURNS, InFlight, ToolRef, ToolTransport};
use skein_dsl::{Code, RenderOptions, Severity};

const YAML: &str = r#"
name: tools
tool_servers:
  counter:
    command: [mcp-tools, --count-file, /tmp/count]
    in_flight: retry
  search:
    url: https://mcp.example.org/mcp
    api_key_secret: SEARCH_KEY
    in_flight: { count: retry, lookup: fail, send: ask, "*": retry }
  files:
    command: [mcp-files]
agents:
  worker:
    model: Qwen/Qwen2.5-0.5B-Instruct
    tools: [counter.count, search.*]
    max_turns: 8
  reader:
    model: Qwen/Qwen2.5-0.5B-Instruct
    tools: files.read
  plain: { model: Qwen/Qwen2.5-0.5B-Instruct }
steps:
  - { id: work, agent: worker, prompt: "Count to three." }
  - { id: read, agent: reader, prompt: "Read it.", after: [work] }
"#;

const RHAI: &str = r#"
workflow("tools");
tool_server("counter", #{ command: ["mcp-tools", "--count-file", "/tmp/count"], in_flight: "retry" });
tool_server("search", #{
    url: "https://mcp.example.org/mcp",
    api_key_secret: "SEARCH_KEY",
    in_flight: #{ count: "retry", lookup: "fail", send: "ask", "*": "retry" },
});
tool_server("files", #{ command: ["mcp-files"] });
agent("worker", #{ model: "Qwen/Qwen2.5-0.5B-Instruct", tools: ["counter.count", "search.*"], max_turns: 8 });
agent("reader", #{ model: "Qwen/Qwen2.5-0.5B-Instruct", tools: "files.read" });
agent("plain", #{ model: "Qwen/Qwen2.5-0.5B-Instruct" });
step("work", #{ agent: "worker", prompt: "Count to three." });
step("read", #{ agent: "reader", prompt: "Read it.", after: ["work"] });
"#;

fn valid(name: &str, text: &str) -> skein_dsl::Parsed {
    let parsed = skein_dsl::parse(name, text);
    assert!(
        parsed.is_valid() && parsed.diagnostics.is_empty(),
        "{name}:\n{}",
        parsed.render(RenderOptions::default())
    );
    parsed
}

#[test]
fn tools_are_read_from_yaml_and_rhai_alike() {
    let yaml = valid("tools.yaml", YAML);
    let rhai = valid("tools.rhai", RHAI);
    let (yaml_ir, rhai_ir) = (yaml.workflow.clone().unwrap(), rhai.workflow.unwrap());
    assert_eq!(yaml_ir, rhai_ir);
    insta::assert_yaml_snapshot!("tools_ir", yaml_ir);

    let worker = &yaml_ir.agents["worker"];
    assert_eq!(
        worker.tools,
        [
            ToolRef {
                server: "counter".into(),
                tool: Some("count".into())
            },
            ToolRef {
                server: "search".into(),
                tool: None
            },
        ]
    );
    assert_eq!(worker.max_turns, Some(8));
    assert_eq!(yaml_ir.agents["reader"].max_turns, None, "{DEFAULT_MAX_TURNS} applies");
    assert!(yaml_ir.agents["plain"].tools.is_empty());

    let counter = &yaml_ir.tool_servers["counter"];
    assert_eq!(counter.in_flight_of("count"), InFlight::Retry);
    let search = &yaml_ir.tool_servers["search"];
    assert_eq!(search.in_flight_of("lookup"), InFlight::Fail);
    assert_eq!(search.in_flight_of("send"), InFlight::Ask);
    assert_eq!(search.in_flight_of("anything"), InFlight::Retry);
    assert!(matches!(
        &search.transport,
        ToolTransport::Http { api_key_secret: Some(s), .. } if s == "SEARCH_KEY"
    ));
    // Not written: every tool fails when its call was in flight.
    assert_eq!(yaml_ir.tool_servers["files"].in_flight_of("read"), InFlight::Fail);

    // The server's checks (allowed programs, the egress policy) point at these.
    let at = |server: &str| {
        let span = yaml.tool_transports[server];
        &YAML[span.start..span.end]
    };
    assert_eq!(at("counter"), "[mcp-tools, --count-file, /tmp/count]");
    assert_eq!(at("search"), "https://mcp.example.org/mcp");
    assert_eq!(yaml.tool_transports.len(), 3);
}

#[test]
fn a_server_no_agent_uses_is_a_warning() {
    let text = "name: idle\ntool_servers:\n  spare: { url: \"http://127.0.0.1:9000/mcp\" }\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\n";
    let parsed = skein_dsl::parse("idle.yaml", text);
    assert!(parsed.is_valid(), "{}", parsed.render(RenderOptions::default()));
    let codes: Vec<(Code, Severity)> = parsed.diagnostics.iter().map(|d| (d.code, d.severity)).collect();
    assert_eq!(codes, [(Code::UnusedToolServer, Severity::Warning)]);
    insta::assert_snapshot!("unused_tool_server", parsed.render(RenderOptions::default()));
}

#[test]
fn max_turns_is_bounded() {
    for (turns, ok) in [("1", true), ("100", true), ("0", false), ("101", false), ("8.5", false)] {
        let text = format!(
            "name: t\ntool_servers:\n  s: {{ command: [p] }}\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct, tools: [s.x], max_turns: {turns} }}\n"
        );
        assert_eq!(skein_dsl::parse("t.yaml", &text).is_valid(), ok, "max_turns: {turns}");
    }
}

#[test]
fn malformed_tool_references_are_each_reported() {
    for bad in [
        "counter",
        "counter.",
        ".x",
        "a.b.c",
        "counter.to ol",
        "9x.y",
        "counter.**",
    ] {
        let text = format!(
            "name: t\ntool_servers:\n  counter: {{ command: [p] }}\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct, tools: [counter.*, \"{bad}\"] }}\n"
        );
        let parsed = skein_dsl::parse("t.yaml", &text);
        let codes: Vec<Code> = parsed.diagnostics.iter().map(|d| d.code).collect();
        assert_eq!(codes, [Code::BadToolRef], "{bad}");
    }
}

/// The first block of `lang` after the heading `## Tools` in docs/workflows.md.
fn documented(lang: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/workflows.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let section = doc.split_once("\n## Tools\n").expect("a Tools section").1;
    let block = section
        .split_once(&format!("```{lang}\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("a {lang} block in the Tools section"));
    block.0.to_owned()
}

#[test]
fn the_documented_examples_are_valid() {
    let yaml = valid("doc.yaml", &format!("name: doc\n{}", documented("yaml")));
    let search = &yaml.workflow.unwrap().tool_servers["search"];
    assert_eq!(search.default_in_flight, InFlight::Fail);
    let rhai = valid("doc.rhai", &format!("workflow(\"doc\");\n{}", documented("rhai")));
    let counter = &rhai.workflow.unwrap().tool_servers["counter"];
    assert_eq!(counter.in_flight_of("count"), InFlight::Retry);
    assert_eq!(counter.in_flight_of("other"), InFlight::Fail);
}

#[test]
fn ask_is_a_policy_for_every_tool_or_one() {
    let every = valid(
        "ask.yaml",
        "name: t\ntool_servers:\n  mail: { command: [mail-tools], in_flight: ask }\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct, tools: [mail.*] }\n",
    );
    let mail = &every.workflow.unwrap().tool_servers["mail"];
    assert_eq!(
        (mail.in_flight_of("send"), mail.default_in_flight),
        (InFlight::Ask, InFlight::Ask)
    );
    let one = valid(
        "ask.rhai",
        "workflow(\"t\");\ntool_server(\"mail\", #{ command: [\"mail-tools\"], in_flight: #{ send: \"ASK\" } });\nagent(\"a\", #{ model: \"Qwen/Qwen2.5-0.5B-Instruct\", tools: [\"mail.*\"] });\n",
    );
    let mail = &one.workflow.unwrap().tool_servers["mail"];
    assert_eq!(
        (mail.in_flight_of("send"), mail.in_flight_of("list")),
        (InFlight::Ask, InFlight::Fail)
    );
    // A misspelt policy lists the three.
    let bad = skein_dsl::parse(
        "bad.yaml",
        "name: t\ntool_servers:\n  mail: { command: [mail-tools], in_flight: [ask] }\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct, tools: [mail.*] }\n",
    );
    let messages: Vec<&str> = bad.diagnostics.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(
        messages,
        ["`in_flight` must be `retry`, `fail`, `ask` or a mapping, found a list"],
        "{}",
        bad.render(RenderOptions::default())
    );
}

#[test]
fn tool_choice_is_read_alike_and_checked_against_the_agents_tools() {
    use skein_dsl::ir::ToolChoice;
    let agent = |choice: &str, tools: &str, extra: &str| {
        format!(
            "name: t\ntool_servers:\n  s: {{ command: [p] }}\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct, tools: {tools}, tool_choice: {choice}{extra} }}\n"
        )
    };
    let chosen = |text: &str| valid("t.yaml", text).workflow.unwrap().agents["a"].tool_choice.clone();
    assert_eq!(chosen(&agent("required", "[s.x]", "")), Some(ToolChoice::Required));
    assert_eq!(
        chosen(&agent("AUTO", "[s.x]", ", max_turns: 1")),
        Some(ToolChoice::Auto)
    );
    let one = ToolChoice::Tool(ToolRef {
        server: "s".into(),
        tool: Some("y".into()),
    });
    assert_eq!(chosen(&agent("s.y", "[s.*]", "")), Some(one.clone()));
    let rhai = valid(
        "t.rhai",
        "workflow(\"t\");\ntool_server(\"s\", #{ command: [\"p\"] });\nagent(\"a\", #{ model: \"Qwen/Qwen2.5-0.5B-Instruct\", tools: [\"s.x\", \"s.y\"], tool_choice: \"s.y\" });\n",
    );
    assert_eq!(rhai.workflow.unwrap().agents["a"].tool_choice, Some(one));

    for (text, code, message) in [
        (
            agent("s.z", "[s.x]", ""),
            Code::BadValue,
            "`tool_choice` of agent `a` names `s.z`, which is not among its `tools`",
        ),
        (
            agent("s.*", "[s.*]", ""),
            Code::BadValue,
            "`tool_choice` of agent `a` names every tool of `s`",
        ),
        (
            agent("required", "[s.x]", ", max_turns: 1"),
            Code::BadValue,
            "agent `a` has `max_turns: 1`, so its only model call must answer and cannot call a tool",
        ),
        (
            agent("required", "[]", ""),
            Code::BadValue,
            "agent `a` sets `tool_choice` but lists no `tools`",
        ),
        (agent("s", "[s.x]", ""), Code::BadToolRef, "`s` names no tool"),
        (agent("[s.x]", "[s.x]", ""), Code::WrongType, ""),
    ] {
        let parsed = skein_dsl::parse("t.yaml", &text);
        let found: Vec<(Code, &str)> = parsed
            .diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .map(|d| (d.code, d.message.as_str()))
            .collect();
        assert_eq!(found.len(), 1, "{text}: {found:?}");
        assert_eq!(found[0].0, code, "{text}");
        assert!(found[0].1.contains(message), "{text}: {}", found[0].1);
    }
    insta::assert_snapshot!(
        "tool_choice_not_listed",
        skein_dsl::parse("t.yaml", &agent("s.z", "[s.x]", "")).render(RenderOptions::default())
    );
}
