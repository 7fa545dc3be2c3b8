//! List inputs, `output_schema` with `.json` fields, `for_each` and approval
//! steps: the same IR from YAML and Rhai, the checks of each (and what they
//! leave alone), and the documented examples.

use skein_dsl::expr::{Bindings, Context, Evaluator, Value};
use skein_dsl::ir::{DEFAULT_MAX_PARALLEL, InputType, InputValue, OnTimeout};
use skein_dsl::{Code, RenderOptions, Severity};

const YAML: &str = r#"
name: act
inputs:
  topics: { type: list, default: [GPUs, "TPUs", 3, 1.5, true] }
  extra: list
agents:
  planner: { model: Qwen/Qwen2.5-0.5B-Instruct }
steps:
  - id: plan
    agent: planner
    prompt: "Pick topics from {{ inputs.topics }}."
    output_schema:
      type: object
      properties:
        topics: { type: array, items: { type: string }, maxItems: 5 }
        audience: { type: object, properties: { level: { type: integer } }, additionalProperties: false }
      required: [topics]
  - id: write
    agent: planner
    after: [plan]
    for_each: steps.plan.output.json.topics
    prompt: "Write about {{ item }} (topic {{ index + 1 }}) for level {{ steps.plan.output.json.audience.level }}."
    output_schema: { type: object, properties: { text: { type: string } } }
  - id: again
    agent: planner
    for_each: { over: "inputs.extra", max_parallel: 16 }
    prompt: "{{ item }}"
  - id: check
    after: [write]
    approval: "Publish {{ steps.write.output.json[0].text }} and {{ steps.write.output.json.len() }} more?"
  - id: sign
    after: [check]
    approval: { text: "Sign it? {{ steps.check.output }}", timeout: 2h, on_timeout: approve }
"#;

const RHAI: &str = r#"
workflow("act");
input("topics", #{ "type": "list", "default": ["GPUs", "TPUs", 3, 1.5, true] });
input("extra", "list");
agent("planner", #{ model: "Qwen/Qwen2.5-0.5B-Instruct" });
step("plan", #{
    agent: "planner",
    prompt: "Pick topics from {{ inputs.topics }}.",
    output_schema: #{
        "type": "object",
        properties: #{
            topics: #{ "type": "array", items: #{ "type": "string" }, maxItems: 5 },
            audience: #{ "type": "object", properties: #{ level: #{ "type": "integer" } }, additionalProperties: false },
        },
        required: ["topics"],
    },
});
step("write", #{
    agent: "planner",
    after: ["plan"],
    for_each: "steps.plan.output.json.topics",
    prompt: "Write about {{ item }} (topic {{ index + 1 }}) for level {{ steps.plan.output.json.audience.level }}.",
    output_schema: #{ "type": "object", properties: #{ text: #{ "type": "string" } } },
});
step("again", #{ agent: "planner", for_each: #{ over: "inputs.extra", max_parallel: 16 }, prompt: "{{ item }}" });
step("check", #{
    after: ["write"],
    approval: "Publish {{ steps.write.output.json[0].text }} and {{ steps.write.output.json.len() }} more?",
});
step("sign", #{
    after: ["check"],
    approval: #{ text: "Sign it? {{ steps.check.output }}", timeout: "2h", on_timeout: "approve" },
});
"#;

fn parse(name: &str, text: &str) -> skein_dsl::Parsed {
    skein_dsl::parse(name, text)
}

fn valid(name: &str, text: &str) -> skein_dsl::Parsed {
    let parsed = parse(name, text);
    assert!(
        parsed.is_valid() && parsed.diagnostics.is_empty(),
        "{name}:\n{}",
        parsed.render(RenderOptions::default())
    );
    parsed
}

/// The codes and severities of every diagnostic of `text` (YAML).
fn codes(text: &str) -> Vec<(Code, Severity)> {
    parse("t.yaml", text)
        .diagnostics
        .iter()
        .map(|d| (d.code, d.severity))
        .collect()
}

#[test]
fn yaml_and_rhai_give_the_same_ir() {
    let yaml = valid("act.yaml", YAML).workflow.unwrap();
    let rhai = valid("act.rhai", RHAI).workflow.unwrap();
    assert_eq!(yaml, rhai);
    insta::assert_yaml_snapshot!("act_ir", yaml);

    let topics = &yaml.inputs["topics"];
    assert_eq!(topics.ty, InputType::List);
    assert_eq!(
        topics.default,
        Some(InputValue::List(vec![
            InputValue::String("GPUs".into()),
            InputValue::String("TPUs".into()),
            InputValue::Integer(3),
            InputValue::Number(1.5),
            InputValue::Boolean(true),
        ]))
    );
    assert_eq!(yaml.inputs["extra"].default, None);

    let plan = yaml.step("plan").unwrap();
    assert_eq!(plan.output_schema.as_ref().unwrap()["required"][0], "topics");
    let write = yaml.step("write").unwrap();
    let each = write.for_each.as_ref().unwrap();
    assert_eq!(each.over.source(), "steps.plan.output.json.topics");
    assert_eq!(each.max_parallel, DEFAULT_MAX_PARALLEL);
    assert_eq!(yaml.step("again").unwrap().for_each.as_ref().unwrap().max_parallel, 16);

    let check = yaml.step("check").unwrap();
    assert!(check.agent.is_empty());
    assert!(check.prompt.source.starts_with("Publish {{"));
    let approval = check.approval.as_ref().unwrap();
    assert_eq!((approval.timeout, approval.on_timeout), (None, OnTimeout::Reject));
    let sign = yaml.step("sign").unwrap().approval.as_ref().unwrap();
    assert_eq!(sign.timeout, Some(std::time::Duration::from_secs(7200)));
    assert_eq!(sign.on_timeout, OnTimeout::Approve);
}

/// A workflow with a `plan` step whose schema is `schema` and a `use` step after it
/// whose prompt is `prompt`.
fn reading(schema: &str, prompt: &str) -> String {
    format!(
        "name: t\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct }}\nsteps:\n  - {{ id: plan, agent: a, prompt: p{schema} }}\n  - {{ id: use, agent: a, after: [plan], prompt: \"{prompt}\" }}\n"
    )
}

#[test]
fn json_fields_are_checked_against_the_schema() {
    let schema = ", output_schema: { type: object, properties: { topics: { type: array, items: { type: object, properties: { name: { type: string } } } }, meta: { type: object } } }";
    let ok = [
        "{{ steps.plan.output.json.topics }}",
        "{{ steps.plan.output.json.topics[0].name }}",
        "{{ steps.plan.output.json[\\\"topics\\\"][1] }}",
        "{{ steps.plan.output.json.topics.len() }}",
        "{{ steps.plan.output.json.keys() }}",
        // `meta` lists no properties: anything below it is allowed.
        "{{ steps.plan.output.json.meta.anything.at.all }}",
        // An index by an expression is not followed.
        "{{ steps.plan.output.json.topics[inputs_len()].whatever }}",
    ];
    for prompt in ok {
        let text = reading(schema, prompt).replace("inputs_len()", "1 + 0");
        assert_eq!(codes(&text), [], "{prompt}");
    }
    for (prompt, field) in [
        ("{{ steps.plan.output.json.topic }}", "topic"),
        ("{{ steps.plan.output.json.topics[0].nam }}", "nam"),
        ("{{ steps.plan.output.json[\\\"topicz\\\"] }}", "topicz"),
        ("{{ steps.plan.output.json.topcs.len() }}", "topcs"),
    ] {
        let parsed = parse("t.yaml", &reading(schema, prompt));
        let d: Vec<_> = parsed.diagnostics.iter().collect();
        assert_eq!(d.len(), 1, "{prompt}: {d:?}");
        assert_eq!(d[0].code, Code::UnknownField, "{prompt}");
        assert!(
            d[0].message.contains(&format!("`{field}`")),
            "{prompt}: {}",
            d[0].message
        );
        assert_eq!(parsed.file.slice(d[0].span), field, "{prompt}");
    }
    // Open objects (other properties allowed, or combinations) are not checked.
    for open in [
        ", output_schema: { type: object, properties: { a: { type: string } }, additionalProperties: true }",
        ", output_schema: { type: object, properties: { a: { type: string } }, additionalProperties: { type: integer } }",
        ", output_schema: { type: object, properties: { a: { type: string } }, anyOf: [{ required: [a] }] }",
        ", output_schema: { $ref: \"#/$defs/x\", $defs: { x: { type: object } } }",
    ] {
        assert_eq!(codes(&reading(open, "{{ steps.plan.output.json.b }}")), [], "{open}");
    }
}

#[test]
fn json_without_a_schema_is_a_warning() {
    let text = reading("", "{{ steps.plan.output.json.topics }}");
    let parsed = parse("t.yaml", &text);
    assert!(parsed.is_valid());
    let found: Vec<_> = parsed.diagnostics.iter().map(|d| (d.code, d.severity)).collect();
    assert_eq!(found, [(Code::JsonWithoutSchema, Severity::Warning)]);
    insta::assert_snapshot!("json_without_schema", parsed.render(RenderOptions::default()));
    // A for_each step's output is JSON whatever its items' answers are.
    let text = "name: t\ninputs: { l: list }\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\nsteps:\n  - { id: each, agent: a, for_each: inputs.l, prompt: \"{{ item }}\" }\n  - { id: use, agent: a, after: [each], prompt: \"{{ steps.each.output.json[0] }}\" }\n";
    assert_eq!(codes(text), []);
}

#[test]
fn item_and_index_belong_to_the_prompt_of_a_for_each_step() {
    let step = |extra: &str, prompt: &str| {
        format!(
            "name: t\ninputs: {{ l: list }}\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct }}\nsteps:\n  - {{ id: s, agent: a{extra}, prompt: \"{prompt}\" }}\n"
        )
    };
    assert_eq!(codes(&step(", for_each: inputs.l", "{{ item }} {{ index }}")), []);
    for (extra, prompt) in [
        ("", "{{ item }}"),
        ("", "{{ index }}"),
        (", for_each: inputs.l, when: \"item != ()\"", "x"),
        (", for_each: item", "x"),
    ] {
        let parsed = parse("t.yaml", &step(extra, prompt));
        let found: Vec<_> = parsed.diagnostics.iter().map(|d| d.code).collect();
        assert_eq!(found, [Code::UnknownVariable], "{extra} {prompt}");
        let d = parsed.diagnostics.iter().next().unwrap();
        assert!(
            d.message.contains("only in the prompt of a step with `for_each`"),
            "{}",
            d.message
        );
    }
}

#[test]
fn for_each_is_an_expression_with_a_bounded_parallelism() {
    let step = |for_each: &str| {
        format!(
            "name: t\ninputs: {{ l: list }}\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct }}\nsteps:\n  - {{ id: s, agent: a, for_each: {for_each}, prompt: \"{{{{ item }}}}\" }}\n"
        )
    };
    for (for_each, expected) in [
        ("inputs.l", vec![]),
        ("\"[1, 2, 3]\"", vec![]),
        ("{ over: inputs.l, max_parallel: 256 }", vec![]),
        ("{ over: inputs.l, max_parallel: 257 }", vec![Code::BadValue]),
        ("{ over: inputs.l, max_parallel: 1.5 }", vec![Code::WrongType]),
        ("{ max_parallel: 2 }", vec![Code::MissingKey]),
        ("{ over: inputs.l, each: 2 }", vec![Code::UnknownKey]),
        ("[a, b]", vec![Code::WrongType]),
        ("inputs.m", vec![Code::UndefinedInput]),
        ("\"inputs.l &&\"", vec![Code::ExprSyntax]),
        ("steps.s.output", vec![Code::NotUpstream]),
    ] {
        let found: Vec<Code> = codes(&step(for_each)).into_iter().map(|(c, _)| c).collect();
        assert_eq!(found, expected, "for_each: {for_each}");
    }
}

#[test]
fn approval_steps_take_no_agent_keys() {
    let step = |keys: &str| {
        format!("name: t\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct }}\nsteps:\n  - {{ id: s{keys} }}\n")
    };
    assert_eq!(codes(&step(", approval: \"OK?\", when: \"true\"")), []);
    for key in [
        "agent: a",
        "prompt: p",
        "for_each: \"[1]\"",
        "output_schema: { type: object }",
        "retries: 1",
        "timeout: 1m",
        "repeat: { back_to: s, until: \"true\", max: 2 }",
    ] {
        let found: Vec<Code> = codes(&step(&format!(", approval: \"OK?\", {key}")))
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        assert_eq!(found, [Code::ApprovalConflict], "{key}");
    }
    for (approval, expected) in [
        ("{ text: \"OK?\", timeout: 0s }", vec![Code::BadValue]),
        (
            "{ text: \"OK?\", timeout: 1h, on_timeout: maybe }",
            vec![Code::BadValue],
        ),
        ("{ timeout: 1h }", vec![Code::MissingKey]),
        ("[a]", vec![Code::WrongType]),
        ("\"{{ steps.nope.output }}\"", vec![Code::UndefinedStep]),
    ] {
        let found: Vec<Code> = codes(&step(&format!(", approval: {approval}")))
            .into_iter()
            .map(|(c, _)| c)
            .collect();
        assert_eq!(found, expected, "approval: {approval}");
    }
    // Neither: one error, unless a key misspells one of them.
    assert_eq!(
        codes(&step(", prompt: p")),
        [(Code::NoAgentOrApproval, Severity::Error)]
    );
    assert_eq!(
        codes(&step(", agnet: a, prompt: p")),
        [(Code::UnknownKey, Severity::Error)]
    );
}

#[test]
fn list_defaults_hold_scalars_only() {
    let input = |default: &str| {
        format!(
            "name: t\ninputs:\n  l: {{ type: list, default: {default} }}\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct }}\n"
        )
    };
    assert_eq!(codes(&input("[]")), []);
    assert_eq!(codes(&input("[\"1\", 1]")), []);
    for bad in ["a", "[[a]]", "[{ a: 1 }]", "[~]", "{ a: 1 }"] {
        let found: Vec<Code> = codes(&input(bad)).into_iter().map(|(c, _)| c).collect();
        assert_eq!(found, [Code::WrongType], "default: {bad}");
    }
    let long = format!("[{}]", vec!["x"; skein_dsl::ir::MAX_ITEMS + 1].join(", "));
    assert_eq!(codes(&input(&long)), [(Code::BadValue, Severity::Error)]);
}

/// The first block of `lang` after the heading `heading` in docs/workflows.md.
fn documented(heading: &str, lang: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/workflows.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let section = doc
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("a section {heading}"))
        .1;
    let block = section
        .split_once(&format!("```{lang}\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("a {lang} block in {heading}"));
    block.0.to_owned()
}

#[test]
fn the_documented_examples_are_valid() {
    let yaml = valid(
        "doc.yaml",
        &format!(
            "name: doc\n{}",
            documented("## Structured outputs, fan-out and approvals", "yaml")
        ),
    );
    let rhai = valid(
        "doc.rhai",
        &format!(
            "workflow(\"doc\");\n{}",
            documented("## Structured outputs, fan-out and approvals", "rhai")
        ),
    );
    assert_eq!(yaml.workflow, rhai.workflow);
    let wf = yaml.workflow.unwrap();
    assert!(wf.steps.iter().any(|s| s.for_each.is_some()));
    assert!(wf.steps.iter().any(|s| s.approval.is_some()));
    assert!(wf.steps.iter().any(|s| s.output_schema.is_some()));
    assert!(wf.inputs.values().any(|i| i.ty == InputType::List));
}

#[test]
fn json_reads_text_as_values() {
    let ev = Evaluator::default();
    let vars = Bindings::from([(
        "steps".to_owned(),
        Value::map([(
            "plan",
            Value::map([(
                "output",
                Value::from(" {\"topics\": [\"a\", \"b\"], \"n\": 2, \"x\": 1.5, \"ok\": true, \"none\": null} "),
            )]),
        )]),
    )]);
    let eval = |text: &str| ev.eval(&ev.compile(text, Context::Step).expect("compiles"), &vars);
    assert_eq!(
        eval("steps.plan.output.json.topics"),
        Ok(Value::List(vec![Value::from("a"), Value::from("b")]))
    );
    assert_eq!(eval("steps.plan.output.json.topics[1]"), Ok(Value::from("b")));
    assert_eq!(eval("steps.plan.output.json.n + 1"), Ok(Value::Int(3)));
    assert_eq!(eval("steps.plan.output.json.x"), Ok(Value::Float(1.5)));
    assert_eq!(eval("steps.plan.output.json.ok"), Ok(Value::Bool(true)));
    assert_eq!(eval("steps.plan.output.json.none"), Ok(Value::Unit));
    assert_eq!(eval("\"[1, [2]]\".json[1][0]"), Ok(Value::Int(2)));
    let e = eval("\"Sure! {\".json").expect_err("not JSON");
    assert!(e.message.contains("`.json`: the text is not JSON"), "{}", e.message);
    assert_eq!(e.kind, skein_dsl::expr::ExprErrorKind::Runtime);
    let deep = format!("\"{}{}\".json", "[".repeat(40), "]".repeat(40));
    let e = eval(&deep).expect_err("too deep");
    assert!(e.message.contains("too large"), "{}", e.message);
    let wide = format!("\"[{}0]\".json", "0,".repeat(20_000));
    assert!(eval(&wide).is_err());
}

#[test]
fn item_and_index_exist_only_in_the_item_context() {
    let ev = Evaluator::default();
    assert!(ev.compile("item + index", Context::Item).is_ok());
    let e = ev.compile("item", Context::Step).expect_err("no item here");
    assert_eq!(e.kind, skein_dsl::expr::ExprErrorKind::UndefinedVariable("item".into()));
}
