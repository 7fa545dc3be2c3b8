//! Engines' command lines from hand-made launch specs shaped like the reference fleet's
//! plans (docs/placement.md's lab story): every kind of external engine and split, given
//! for real to the fake engine by the supervisor, which must start exactly the spec's
//! command; an engine's key in its environment only; and the errors of specs no engine
//! could run. The commands real plans produce are snapshot in the root package's
//! `tests/engine_commands.rs`, from the planner's own output.

mod common;

use std::path::PathBuf;

use skein_agent::engine::{
    CandleLaunch, EmbeddingsLaunch, EngineKey, EngineLaunch, LaunchSpec, LlamaCppLaunch, LlamaRpcLaunch, RayNodeLaunch,
    RemoteLaunch, VllmLaunch, memory_fraction,
};

const GIB: u64 = 1 << 30;
/// An A100 80GB as NVML reports it (81,920 MiB).
const A100: u64 = 81_920 << 20;
/// An RTX 4090 as NVML reports it (24,564 MiB).
const RTX4090: u64 = 24_564 << 20;

fn spec(instance: &str, gpus: &[u32], context: u64, concurrency: u64, engine: EngineLaunch) -> LaunchSpec {
    LaunchSpec {
        instance: instance.to_owned(),
        host: "127.0.0.1".to_owned(),
        port: 8101,
        gpus: gpus.to_vec(),
        context,
        concurrency,
        engine,
        api_key: None,
        adapters: Vec::new(),
        embeddings: None,
    }
}

fn vllm(model: &str, tp: u64, partition: &[u64], reserved: &[u64], total: &[u64]) -> VllmLaunch {
    VllmLaunch {
        program: PathBuf::from("vllm"),
        model: model.to_owned(),
        revision: Some("0123456789abcdef0123456789abcdef01234567".to_owned()),
        tensor_parallel: tp,
        layer_partition: partition.to_vec(),
        quantization: None,
        reserved: reserved.to_vec(),
        total: total.to_vec(),
        max_num_batched_tokens: 2048,
        enforce_eager: false,
        kv_cache_dtype: None,
        ray_address: None,
        hub_cache: None,
        kv_cache_bytes: None,
        tool_call_parser: None,
        max_loras: 0,
        max_lora_rank: 0,
    }
}

fn llama(model: &str, gpu_layers: Option<u64>, split: &[u64]) -> LlamaCppLaunch {
    LlamaCppLaunch {
        program: PathBuf::from("llama-server"),
        model: PathBuf::from(model),
        mmproj: None,
        gpu_layers,
        tensor_split: split.to_vec(),
        n_batch: 2048,
        n_ubatch: 512,
        flash_attention: true,
        rpc_servers: Vec::new(),
    }
}

fn coder_at_bf16_on_one_a100_spec() -> LaunchSpec {
    spec(
        "lab-research.coder",
        &[0],
        16_384,
        2,
        EngineLaunch::Vllm(vllm(
            "deepseek-ai/deepseek-coder-33b-instruct",
            1,
            &[62],
            &[76 * GIB],
            &[A100],
        )),
    )
}

fn writer_tensor_parallel_over_two_nvlinked_a100s_spec() -> LaunchSpec {
    spec(
        "lab-research.writer",
        &[1, 2],
        8192,
        1,
        EngineLaunch::Vllm(VllmLaunch {
            // Llama 3's tool calls, as the orchestrator asks for this family.
            tool_call_parser: Some("llama3_json".to_owned()),
            ..vllm(
                "meta-llama/Llama-3.1-70B-Instruct",
                2,
                &[80],
                &[74 * GIB, 75 * GIB],
                &[A100, A100],
            )
        }),
    )
}

fn awq_writer_tensor_parallel_in_two_uneven_stages_spec() -> LaunchSpec {
    // TP 2 inside each pair of 4090s, 48 and 32 layers: the pair with more free memory
    // takes more layers; an 8-bit KV cache.
    let mut v = vllm(
        "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
        2,
        &[48, 32],
        &[22 * GIB, 22 * GIB, 15 * GIB, 15 * GIB],
        &[RTX4090; 4],
    );
    v.quantization = Some("awq".to_owned());
    v.kv_cache_dtype = Some("fp8".to_owned());
    v.enforce_eager = true;
    v.revision = None;
    // The 48-layer stage's cache: 2 × 4 KV heads per rank × 128 × 1 byte (fp8) per layer
    // and token, for 4 × 8192 tokens and vLLM's null block.
    v.kv_cache_bytes = Some(2 * 4 * 128 * 48 * (4 * 8192 + 16));
    spec("lab-research.writer", &[0, 1, 2, 3], 8192, 4, EngineLaunch::Vllm(v))
}

fn coder_at_4_bit_split_unevenly_over_busy_4090s_spec() -> LaunchSpec {
    // rtx-1 of lab-busy.yaml: one card has a 12 GiB notebook on it, so it takes fewer
    // layers.
    spec(
        "lab-research.coder",
        &[0, 1, 2, 3],
        16_384,
        2,
        EngineLaunch::LlamaCpp(llama(
            "/hf/models--TheBloke--deepseek-coder-33B-instruct-GGUF/snapshots/abc/deepseek-coder-33b-instruct.Q4_K_M.gguf",
            None,
            &[22, 22, 22, 10],
        )),
    )
}

// lab-research's writer as a plan of lab-busy.yaml once placed it (plans of the example
// fleets now: tests/engine_commands.rs at the root): Llama-3-70B GPTQ-Int8 over
// Ray, TP 2 × PP 3 (40/17/23 layers): stages 0 and 1 on rtx-2 (the head, with the
// serving engine), stage 2 on old-1's V100s (a worker). The pieces, then the engine.
const V100: u64 = 16_384 << 20;
const HF: &str = "/var/cache/skein/hf";

/// A Ray node; the server's node ID for the plan's `n`th node sorts in plan order.
fn ray(head: Option<&str>, n: u32) -> EngineLaunch {
    EngineLaunch::RayNode(RayNodeLaunch {
        program: PathBuf::from("ray"),
        head_address: head.map(str::to_owned),
        hub_cache: Some(PathBuf::from(HF)),
        node_id: Some(format!("{n:08x}{}", "5e".repeat(24))),
    })
}

fn writer_over_ray_specs() -> Vec<LaunchSpec> {
    let head = LaunchSpec {
        host: "10.0.0.12".to_owned(),
        port: 6379,
        ..spec("r1-writer.ray-head-0", &[1, 2, 3, 0], 8192, 1, ray(None, 0))
    };
    let worker = LaunchSpec {
        host: "10.0.0.21".to_owned(),
        port: 40123,
        ..spec(
            "r1-writer.ray-worker-1",
            &[0, 1],
            8192,
            1,
            ray(Some("10.0.0.12:6379"), 1),
        )
    };
    let mut v = vllm(
        "meta-llama/Meta-Llama-3-70B-Instruct-GPTQ-Int8",
        2,
        &[40, 17, 23],
        &[
            21_500 << 20,
            21_500 << 20,
            10_300 << 20,
            10_300 << 20,
            14_400 << 20,
            14_400 << 20,
        ],
        &[RTX4090, RTX4090, RTX4090, RTX4090, V100, V100],
    );
    v.quantization = Some("gptq".to_owned());
    // The 40-layer stage's cache: 2 × 4 KV heads per rank × 128 × 2 bytes per layer and
    // token, for 8192 tokens and vLLM's null block.
    v.kv_cache_bytes = Some(2 * 4 * 128 * 2 * 40 * (8192 + 16));
    v.ray_address = Some("10.0.0.12:6379".to_owned());
    v.hub_cache = Some(PathBuf::from(HF));
    let serving = LaunchSpec {
        host: "10.0.0.12".to_owned(),
        ..spec("r1-writer", &[1, 2, 3, 0], 8192, 1, EngineLaunch::Vllm(v))
    };
    vec![head, worker, serving]
}

#[test]
fn a_ray_node_id_that_ray_would_reject_is_refused_before_the_start() {
    for bad in ["", "00000000", &"G".repeat(56), &"AB".repeat(28), &"ab".repeat(29)] {
        let mut spec = writer_over_ray_specs().remove(0);
        let EngineLaunch::RayNode(r) = &mut spec.engine else {
            panic!("a Ray node: {spec:?}")
        };
        r.node_id = Some(bad.to_owned());
        let error = spec.command().expect_err("an invalid node ID").to_string();
        assert!(
            error.contains("Ray node ID") && error.contains("56 lowercase hex digits"),
            "{bad:?}: {error}"
        );
    }
}

// lab-research's coder as a plan of lab-busy.yaml once placed it: DeepSeek-Coder-33B
// Q4_K_M over llama.cpp RPC,
// layers 9/10/9/10 on rtx-1's four 4090s (the serving node) and 24 on rtx-2 gpu 3 (an
// RPC server): llama.cpp puts RPC devices first, so its share leads the split.
fn coder_over_rpc_specs() -> Vec<LaunchSpec> {
    let rpc = LaunchSpec {
        host: "10.0.0.12".to_owned(),
        port: 50052,
        ..spec(
            "r1-coder.rpc-server-1",
            &[3],
            16_384,
            2,
            EngineLaunch::LlamaRpc(LlamaRpcLaunch {
                program: PathBuf::from("rpc-server"),
                cache: true,
            }),
        )
    };
    let mut l = llama(
        "/hf/models--TheBloke--deepseek-coder-33B-instruct-GGUF/snapshots/abc/deepseek-coder-33b-instruct.Q4_K_M.gguf",
        None,
        &[24, 9, 10, 9, 10],
    );
    l.rpc_servers = vec!["10.0.0.12:50052".to_owned()];
    let serving = LaunchSpec {
        host: "10.0.0.11".to_owned(),
        ..spec("r1-coder", &[0, 1, 2, 3], 16_384, 2, EngineLaunch::LlamaCpp(l))
    };
    vec![rpc, serving]
}

fn vision_model_with_its_projector_and_host_offload_spec() -> LaunchSpec {
    let mut l = llama("/models/llava-v1.6-mistral-7b.Q8_0.gguf", Some(20), &[]);
    l.mmproj = Some(PathBuf::from("/models/mmproj-model-f16.gguf"));
    spec("lab-research.vision", &[3], 8192, 1, EngineLaunch::LlamaCpp(l))
}

fn gguf_on_the_cpu_spec() -> LaunchSpec {
    spec(
        "hello.assistant",
        &[],
        4096,
        1,
        EngineLaunch::LlamaCpp(llama("/models/qwen2.5-0.5b-instruct-q4_k_m.gguf", None, &[])),
    )
}

fn candle(model: &str) -> EngineLaunch {
    EngineLaunch::Candle(CandleLaunch {
        program: PathBuf::from("/usr/local/bin/skein"),
        model: PathBuf::from(model),
        seed: 42,
    })
}

#[test]
fn built_in_engine_on_the_first_of_its_gpus() {
    let s = spec(
        "lab-research.vision",
        &[3],
        8192,
        1,
        candle("/models/qwen2.5-7b-instruct-q4_k_m.gguf"),
    );
    let command = s.command().expect("a command");
    assert_eq!(
        command.to_string(),
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=3 /usr/local/bin/skein engine serve --model /models/qwen2.5-7b-instruct-q4_k_m.gguf \
         --name lab-research.vision --host 127.0.0.1 --port 8101 --seed 42 --device cuda:0"
    );
}

/// A key for the tests (the orchestrator makes 32 random bytes in hex).
const KEY: &str = "7e57c0de7e57c0de7e57c0de7e57c0de7e57c0de7e57c0de7e57c0de7e57c0de";

/// Every engine that serves requests takes its key from its environment, under the name
/// it reads (vLLM `VLLM_API_KEY`, llama-server `LLAMA_API_KEY`, the built-in engine
/// `SKEIN_ENGINE_API_KEY`), never from its arguments, which every local user can read;
/// the key shows nowhere as text. The pieces of a split engine cannot check a key.
#[test]
fn an_engines_key_goes_into_its_environment_and_shows_nowhere() {
    let keyed = |spec: LaunchSpec| LaunchSpec {
        api_key: skein_agent::engine::EngineKey::new(KEY),
        ..spec
    };
    let serving = [
        (coder_at_bf16_on_one_a100_spec(), "VLLM_API_KEY"),
        (gguf_on_the_cpu_spec(), "LLAMA_API_KEY"),
        (
            spec("hello.assistant", &[], 4096, 1, candle("/hf/snapshots/abc")),
            "SKEIN_ENGINE_API_KEY",
        ),
    ];
    for (plain, variable) in serving {
        let command = keyed(plain.clone()).command().expect("a command");
        let without = plain.command().expect("a command");
        assert_eq!(command.args, without.args, "the key is not an argument");
        assert_eq!(command.env, without.env);
        assert_eq!(
            command.secret_env.get(variable).map(|k| k.expose()),
            Some(KEY),
            "{variable}"
        );
        let shown = format!(
            "{command} {command:?} {}",
            serde_json::to_string(&command).expect("JSON")
        );
        assert!(!shown.contains(KEY), "{shown}");
        assert!(
            command.to_string().contains(&format!("{variable}=<redacted> ")),
            "{command}"
        );
    }
    for piece in writer_over_ray_specs().into_iter().chain(coder_over_rpc_specs()) {
        if piece.is_piece() {
            let command = keyed(piece).command().expect("a command");
            assert!(command.secret_env.is_empty(), "{command}");
        }
    }
    insta::assert_yaml_snapshot!(keyed(coder_at_bf16_on_one_a100_spec()).command().expect("a command"));
}

#[test]
fn remote_endpoints_have_no_command_and_names_must_make_file_names() {
    let remote = |url: &str| {
        EngineLaunch::Remote(RemoteLaunch {
            url: url.to_owned(),
            model: "gpt-4o-mini".to_owned(),
            api_key: EngineKey::new("sk-openai"),
        })
    };
    let cases: Vec<(&str, LaunchSpec)> = vec![
        (
            "remote",
            spec("lab.cloud", &[], 4096, 1, remote("https://api.openai.com/v1")),
        ),
        (
            "remote without a scheme",
            spec("lab.cloud", &[], 4096, 1, remote("api.openai.com/v1")),
        ),
        (
            "remote with a bad name",
            spec("lab cloud", &[], 4096, 1, remote("https://api.openai.com/v1")),
        ),
        ("a path as name", spec("../etc", &[], 4096, 1, candle("/m"))),
        ("a hidden file as name", spec(".x", &[], 4096, 1, candle("/m"))),
    ];
    let report: Vec<String> = cases
        .iter()
        .map(|(what, s)| format!("{what}: {}", s.command().expect_err("no command")))
        .collect();
    insta::assert_yaml_snapshot!(report);
}

#[test]
fn specs_no_engine_could_run_are_refused_with_the_reason() {
    let a100 = |reserved: u64| vllm("m/m", 1, &[32], &[reserved], &[A100]);
    let cases: Vec<(&str, LaunchSpec)> = vec![
        (
            "name with a space",
            spec("my coder", &[0], 4096, 1, EngineLaunch::Vllm(a100(GIB))),
        ),
        (
            "port 0",
            LaunchSpec {
                port: 0,
                ..spec("c", &[0], 4096, 1, EngineLaunch::Vllm(a100(GIB)))
            },
        ),
        ("no context", spec("c", &[0], 0, 1, EngineLaunch::Vllm(a100(GIB)))),
        (
            "more than the GPU",
            spec("c", &[0], 4096, 1, EngineLaunch::Vllm(a100(A100 + 1))),
        ),
        (
            "under a hundredth",
            spec("c", &[0], 4096, 1, EngineLaunch::Vllm(a100(1))),
        ),
        (
            "TP × PP ≠ GPUs",
            spec(
                "c",
                &[0, 1, 2],
                4096,
                1,
                EngineLaunch::Vllm(vllm("m/m", 2, &[16, 16], &[GIB; 3], &[A100; 3])),
            ),
        ),
        (
            "empty stage",
            spec(
                "c",
                &[0, 1],
                4096,
                1,
                EngineLaunch::Vllm(vllm("m/m", 1, &[32, 0], &[GIB; 2], &[A100; 2])),
            ),
        ),
        (
            "split for other GPUs",
            spec(
                "c",
                &[0, 1],
                4096,
                1,
                EngineLaunch::LlamaCpp(llama("/m.gguf", None, &[1, 1, 1])),
            ),
        ),
        (
            "all-zero split",
            spec(
                "c",
                &[0, 1],
                4096,
                1,
                EngineLaunch::LlamaCpp(llama("/m.gguf", None, &[0, 0])),
            ),
        ),
        ("ubatch over batch", {
            let mut l = llama("/m.gguf", None, &[]);
            l.n_ubatch = 4096;
            spec("c", &[0], 4096, 1, EngineLaunch::LlamaCpp(l))
        }),
        ("split without the RPC servers' shares", {
            let mut l = llama("/m.gguf", None, &[1, 1]);
            l.rpc_servers = vec!["10.0.0.2:50052".to_owned()];
            spec("c", &[0, 1], 4096, 1, EngineLaunch::LlamaCpp(l))
        }),
        (
            "an RPC server on two GPUs",
            spec(
                "c",
                &[0, 1],
                4096,
                1,
                EngineLaunch::LlamaRpc(LlamaRpcLaunch {
                    program: PathBuf::from("rpc-server"),
                    cache: false,
                }),
            ),
        ),
        ("KV cache over every reservation", {
            let mut v = vllm("m/m", 2, &[16, 16], &[GIB; 4], &[A100; 4]);
            v.kv_cache_bytes = Some(GIB);
            spec("c", &[0, 1, 2, 3], 4096, 1, EngineLaunch::Vllm(v))
        }),
        ("Ray ranks ≠ TP × PP", {
            let mut v = vllm("m/m", 2, &[16, 16], &[GIB; 2], &[A100; 2]);
            v.ray_address = Some("10.0.0.1:6379".to_owned());
            spec("c", &[0, 1], 4096, 1, EngineLaunch::Vllm(v))
        }),
        ("a pooling llama.cpp does not take", {
            let mut s = spec("c", &[0], 4096, 1, EngineLaunch::LlamaCpp(llama("/m.gguf", None, &[])));
            s.embeddings = Some(EmbeddingsLaunch {
                pooling: Some("rank".to_owned()),
            });
            s
        }),
    ];
    let report: Vec<String> = cases
        .iter()
        .map(|(what, s)| format!("{what}: {}", s.command().expect_err("refused")))
        .collect();
    insta::assert_yaml_snapshot!(report);
}

#[test]
fn memory_fraction_never_asks_for_more_than_reserved() {
    // 76 GiB of 80 GiB is 0.95 exactly; 76 GiB + 1 byte of 80 GiB still rounds down.
    assert_eq!(memory_fraction(&[76 * GIB], &[80 * GIB]), Some(0.95));
    assert_eq!(memory_fraction(&[76 * GIB + 1], &[80 * GIB]), Some(0.95));
    // The GPU with the least room relative to its size sets the fraction.
    assert_eq!(memory_fraction(&[72 * GIB, 40 * GIB], &[80 * GIB, 80 * GIB]), Some(0.5));
    assert_eq!(memory_fraction(&[0], &[80 * GIB]), None);
    assert_eq!(memory_fraction(&[81 * GIB], &[80 * GIB]), None);
}

/// Every external-engine spec above, started for real by the supervisor with the fake
/// engine standing in for `vllm` and `llama-server`: the process gets exactly the
/// arguments and GPU environment of the spec's command, and serves under its name.
#[tokio::test]
async fn engine_processes_are_started_with_exactly_these_commands() {
    use std::time::Duration;

    use skein_agent::engine::{InstanceState, RestartPolicy, Supervisor, SupervisorConfig, free_port};

    let mut specs = vec![
        coder_at_bf16_on_one_a100_spec(),
        writer_tensor_parallel_over_two_nvlinked_a100s_spec(),
        awq_writer_tensor_parallel_in_two_uneven_stages_spec(),
        coder_at_4_bit_split_unevenly_over_busy_4090s_spec(),
        vision_model_with_its_projector_and_host_offload_spec(),
        gguf_on_the_cpu_spec(),
    ];
    specs.extend(writer_over_ray_specs());
    specs.extend(coder_over_rpc_specs());
    for (index, mut spec) in specs.into_iter().enumerate() {
        // Every node is this machine here.
        spec.host = "127.0.0.1".to_owned();
        spec.api_key = skein_agent::engine::EngineKey::new(KEY);
        let dir = tempfile::tempdir().expect("temp dir");
        let record = dir.path().join("record.json");
        let program = common::engine_program(
            dir.path(),
            &[("SKEIN_FAKE_ENGINE_RECORD", record.display().to_string())],
        );
        spec.port = free_port("127.0.0.1").expect("a free port");
        match &mut spec.engine {
            EngineLaunch::Vllm(v) => v.program = program,
            EngineLaunch::LlamaCpp(l) => l.program = program,
            EngineLaunch::RayNode(r) => r.program = program,
            EngineLaunch::LlamaRpc(r) => r.program = program,
            other => unreachable!("only external engines are listed: {other:?}"),
        }
        let expected = spec.command().expect("a command");
        let (supervisor, mut events) = Supervisor::new(SupervisorConfig {
            logs_dir: dir.path().join("logs"),
            readiness_timeout: Duration::from_secs(20),
            health_interval: Duration::from_millis(200),
            restart: RestartPolicy {
                max_restarts: 0,
                first_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_millis(100),
                reset_after: Duration::from_secs(60),
            },
            stop_grace: Duration::from_secs(3),
        });
        supervisor.start(spec.clone()).await.expect("started");
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(event) = events.recv().await {
                match event.state {
                    InstanceState::Ready { base_url, .. } => return base_url,
                    InstanceState::Failed { .. } => {
                        panic!("spec {index} failed: {:?}", supervisor.logs(&spec.instance, 20))
                    }
                    _ => {}
                }
            }
            unreachable!("the supervisor's events ended")
        })
        .await
        .expect("ready in time");
        if spec.is_piece() {
            // A piece is ready when its port opens, and says where it is.
            assert_eq!(ready, format!("127.0.0.1:{}", spec.port));
        } else {
            assert_eq!(ready, format!("http://127.0.0.1:{}/v1", spec.port));
        }

        let recorded: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&record).expect("record")).expect("JSON");
        assert_eq!(recorded["args"], serde_json::json!(expected.args), "spec {index}");
        let env: std::collections::BTreeMap<String, String> =
            serde_json::from_value(recorded["env"].clone()).expect("env");
        for (name, value) in &expected.env {
            assert_eq!(env.get(name), Some(value), "spec {index}: {name}");
        }
        // The key reached the engine through its environment, and it refuses requests
        // without it (the fake engine enforces the key it is given, as real ones do).
        for (name, key) in &expected.secret_env {
            assert_eq!(
                env.get(name).map(String::as_str),
                Some(key.expose()),
                "spec {index}: {name}"
            );
        }
        if !spec.is_piece() {
            assert_eq!(expected.secret_env.len(), 1, "spec {index}");
            let http = reqwest::Client::builder().no_proxy().build().expect("client");
            let models = format!("{ready}/models");
            let refused = http.get(&models).send().await.expect("an answer");
            assert_eq!(refused.status(), 401, "spec {index}: no key, no answer");
            let answered = http.get(&models).bearer_auth(KEY).send().await.expect("an answer");
            assert_eq!(answered.status(), 200, "spec {index}");
            let args = recorded["args"].to_string();
            assert!(!args.contains(KEY), "spec {index}: the key is not an argument: {args}");
        }
        supervisor.stop_all().await;
    }
}
