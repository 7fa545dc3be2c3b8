//! Every `vllm serve` command line Skein emits for the example workflows on the fleet
//! files (and Llama-3-70B in bf16 on eight RTX 4090s of four nodes, TP 2 × PP 4, and
//! Mistral-7B-Instruct-v0.3 with its `mistral` tool-call parser), parsed by the pinned
//! vLLM's own argument parser, with the memory each worker would get computed as that
//! vLLM computes it and checked against what the plan says the worker needs
//! (`tests/engines/vllm_check.py` says which vLLM code each step mirrors). The vLLM is
//! installed by `tests/engines/vllm.sh`; the test fails when it cannot be.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "support/launches.rs"]
mod launches;

use skein_agent::engine::EngineLaunch;
use skein_model_registry::catalog::ModelInfo;
use skein_orchestrator::plan::PlannedInstance;
use skein_proto::agent::v1 as pb;
use skein_testkit::models::{ReferenceModel, VariantSpec};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `mistralai/Mistral-7B-Instruct-v0.3` (its `config.json`'s keys the registry reads):
/// the Mistral family, whose tool calls vLLM reads with its `mistral` parser.
const MISTRAL_7B_INSTRUCT_V0_3: ReferenceModel = ReferenceModel {
    repo: "mistralai/Mistral-7B-Instruct-v0.3",
    config: r#"{
  "architectures": ["MistralForCausalLM"],
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 32768
}"#,
    variants: &[VariantSpec::Own],
};

/// The reference models, [`MISTRAL_7B_INSTRUCT_V0_3`], the LoRA tutors' Llama-3-8B and
/// the paper search's embedding model.
fn models() -> BTreeMap<String, ModelInfo> {
    let mut models = skein_testkit::models::reference_catalog();
    let mistral = MISTRAL_7B_INSTRUCT_V0_3.info();
    models.insert(mistral.repo.to_string(), mistral);
    // The base of the LoRA tutors (workflows/lora-tutors.yaml).
    let llama_8b = skein_testkit::adapters::llama_3_8b_info();
    models.insert(llama_8b.repo.to_string(), llama_8b);
    // The embedding model of workflows/paper-search.yaml.
    let e5 = skein_testkit::embeddings::e5_mistral_info();
    models.insert(e5.repo.to_string(), e5);
    models
}

/// One case for the checker: the command line, the model's KV shape and, per worker in
/// vLLM's rank order, what the plan reserved and says it needs.
fn case(
    name: &str,
    planned: &PlannedInstance,
    models: &BTreeMap<String, ModelInfo>,
    start: &pb::StartInstance,
) -> serde_json::Value {
    let (model, variant) = launches::model_of(planned, models);
    let mut spec = launches::spec(start, variant);
    // Over Ray the agent names the model by repository; alone by its local snapshot.
    if let EngineLaunch::Vllm(v) = &mut spec.engine {
        v.model = model.repo.to_string();
    }
    let command = spec.command().expect("a command");
    let EngineLaunch::Vllm(v) = &spec.engine else {
        panic!("{name}: not vLLM: {spec:?}")
    };
    // Rank r runs on the plan's r-th GPU: the reserved bytes and layers of its stage are
    // that device's.
    let tp = v.tensor_parallel as usize;
    let devices: Vec<_> = planned.devices.iter().filter(|d| d.gpu.is_some()).collect();
    assert_eq!(devices.len(), v.reserved.len(), "{name}: one rank per planned GPU");
    let workers: Vec<serde_json::Value> = v
        .reserved
        .iter()
        .zip(&v.total)
        .zip(&devices)
        .enumerate()
        .map(|(rank, ((&reserved, &total), d))| {
            let layers = v.layer_partition[rank / tp];
            assert_eq!(
                (reserved, layers),
                (d.reserved, layer_count(&d.layers)),
                "{name}: rank {rank} runs on {}'s GPU {:?} as planned",
                d.node,
                d.gpu
            );
            serde_json::json!({ "reserved": reserved, "total": total, "need": d.need })
        })
        .collect();
    let dtype_bytes = 2; // bf16/fp16 weights or activations for every vLLM variant here
    serde_json::json!({
        "name": name,
        "args": command.args,
        "env": command.env,
        "model": {
            "layers": model.shape.layers,
            "kv_heads": model.shape.kv_heads,
            "head_dim": model.shape.head_dim,
            "dtype_bytes": dtype_bytes,
        },
        "context": spec.context,
        "concurrency": spec.concurrency,
        "workers": workers,
        "adapters": start.adapters.iter().map(|a| a.name.clone()).collect::<Vec<_>>(),
        "runner": if start.embeddings.is_some() { "pooling" } else { "auto" },
    })
}

fn layer_count(range: &str) -> u64 {
    let (a, b) = range.split_once("..").expect("start..end");
    b.parse::<u64>().expect("end") - a.parse::<u64>().expect("start")
}

/// The vLLM cases of `workflow` on `fleet`.
fn cases_of(
    label: &str,
    workflow: &Path,
    fleet: &Path,
    models: &BTreeMap<String, ModelInfo>,
) -> Vec<serde_json::Value> {
    let Some((plan, graph)) = launches::plan_files(workflow, fleet, models) else {
        return Vec::new();
    };
    plan.instances
        .iter()
        .filter(|p| p.engine == "vllm")
        .map(|planned| {
            let name = format!("{label}.{}", planned.instance);
            let starts = launches::starts(&format!("r1-{}", planned.instance), planned, models, &graph);
            let serving = &starts.last().expect("a serving start").start;
            case(&name, planned, models, serving)
        })
        .collect()
}

/// A one-step workflow whose agent runs `model` (a workflow's `model:` mapping) on four
/// nodes of two RTX 4090s each, written in `dir`.
fn on_4090s(dir: &Path, name: &str, model: &str) -> (PathBuf, PathBuf) {
    let fleet = dir.join("rtx8.yaml");
    std::fs::write(
        &fleet,
        (1..=4).fold("fleet: rtx8\nnodes:\n".to_owned(), |mut f, n| {
            f.push_str(&format!(
                "  rtx-{n}:\n    gpus: {{ model: RTX4090-24GB, count: 2 }}\n    host: {{ cpu_cores: 32, memory: 256GiB, network: 100Gbps }}\n"
            ));
            f
        }),
    )
    .expect("write the fleet");
    let workflow = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &workflow,
        format!("name: {name}\nagents:\n  {name}:\n    model: {model}\nsteps:\n  - {{ id: write, agent: {name}, prompt: \"Write.\" }}\n"),
    )
    .expect("write the workflow");
    (workflow, fleet)
}

#[test]
fn every_vllm_command_line_parses_and_gives_each_worker_what_its_plan_needs() {
    let models = models();
    let mut cases = Vec::new();
    let mut workflows: Vec<PathBuf> = std::fs::read_dir(root().join("workflows"))
        .expect("workflows/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "rhai"))
        .collect();
    workflows.sort();
    let mut fleets: Vec<PathBuf> = std::fs::read_dir(root().join("workflows/fleets"))
        .expect("workflows/fleets/")
        .map(|e| e.expect("an entry").path())
        .collect();
    fleets.sort();
    for workflow in &workflows {
        for fleet in &fleets {
            let label = format!(
                "{}@{}",
                workflow.file_name().unwrap_or_default().to_string_lossy(),
                fleet.file_stem().unwrap_or_default().to_string_lossy()
            );
            cases.extend(cases_of(&label, workflow, fleet, &models));
        }
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (workflow, fleet) = on_4090s(
        dir.path(),
        "writer",
        "{ repo: meta-llama/Meta-Llama-3-70B-Instruct, context: 8192, min_precision: bf16, formats: [safetensors] }",
    );
    let big = cases_of("llama-70b-bf16@rtx8", &workflow, &fleet, &models);
    assert_eq!(big.len(), 1, "Llama-3-70B bf16 is placed on the eight 4090s");
    let args = big[0]["args"].to_string();
    assert!(
        args.contains("\"--tensor-parallel-size\",\"2\"") && args.contains("\"--pipeline-parallel-size\",\"4\""),
        "TP 2 × PP 4: {args}"
    );
    // Llama 3 is served with its family's tool calls, which the pinned vLLM knows.
    assert!(
        args.contains("\"--enable-auto-tool-choice\",\"--tool-call-parser\",\"llama3_json\""),
        "tool calls: {args}"
    );
    cases.extend(big);
    // Mistral is served with its family's tool calls: the `mistral` parser, which needs
    // `mistral_common` in the server's environment.
    let (workflow, fleet) = on_4090s(
        dir.path(),
        "coder",
        "{ repo: mistralai/Mistral-7B-Instruct-v0.3, context: 8192, min_precision: bf16, formats: [safetensors] }",
    );
    let mistral = cases_of("mistral-7b-bf16@rtx8", &workflow, &fleet, &models);
    assert_eq!(mistral.len(), 1, "Mistral-7B bf16 is placed on a 4090");
    let args = mistral[0]["args"].to_string();
    assert!(
        args.contains("\"--enable-auto-tool-choice\",\"--tool-call-parser\",\"mistral\""),
        "tool calls: {args}"
    );
    cases.extend(mistral);
    // The LoRA tutors' base serves the five adapters from one vLLM engine.
    let tutors = cases
        .iter()
        .find(|c| c["name"].as_str().is_some_and(|n| n.starts_with("lora-tutors.yaml@")))
        .expect("the LoRA tutors are planned on vLLM");
    assert_eq!(tutors["adapters"].as_array().map(Vec::len), Some(5), "{tutors:#}");
    assert!(
        tutors["args"]
            .to_string()
            .contains("\"--enable-lora\",\"--max-loras\",\"5\",\"--max-lora-rank\",\"16\""),
        "{tutors:#}"
    );
    // The reference fleet's split writer (over Ray) is among them.
    assert!(
        cases.iter().any(|c| c["args"].to_string().contains("ray")),
        "a vLLM replica split over Ray is checked"
    );
    assert!(cases.len() >= 4, "{} vLLM command lines", cases.len());
    let file = dir.path().join("cases.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&cases).expect("JSON")).expect("write the cases");
    let out = Command::new(skein_testkit::tools::vllm_python())
        .arg(root().join("tests/engines/vllm_check.py"))
        .arg(&file)
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("VLLM_LOGGING_LEVEL", "WARNING")
        .output()
        .expect("the venv's python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "vLLM 0.33.0 refuses Skein's command lines or starves a worker:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
