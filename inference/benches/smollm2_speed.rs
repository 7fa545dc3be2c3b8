//! Tokens per CPU-second of the built-in engine and of llama.cpp's `llama-server` on the
//! same file (SmolLM2-135M-Instruct Q4_1, from `tests/engines/smollm2.sh`), side by side
//! in one run on one machine: the same prompt ids, the same number of greedy tokens,
//! three runs each, medians reported.
//!
//! CPU time is the process's user + system time from `/proc` (the bench's own process
//! for the built-in engine, the server's for llama.cpp), so the figure does not depend on
//! how many cores each uses. The BF16 conversion and its F32 GGUF write-back are
//! measured too.
//!
//! `cargo bench -p skein-inference --bench smollm2_speed` (Linux; builds llama.cpp on
//! first use).

use std::path::Path;
use std::time::Instant;

use skein_inference::{Engine, TemplateMessage};
use skein_testkit::smollm2::{self, LlamaServer};

/// Tokens generated per run.
const TOKENS: usize = 64;
/// Runs per engine; the median is reported.
const RUNS: usize = 3;

/// User + system CPU seconds of process `pid` (`self` for this one).
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name's closing parenthesis; utime and stime are the
    // 14th and 15th fields of the whole line, the 12th and 13th after it.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // The clock tick is 100 Hz on every Linux this runs on.
    ticks / 100.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

struct Figures {
    per_cpu_second: f64,
    per_second: f64,
}

fn measure(mut run: impl FnMut() -> f64) -> Figures {
    let mut cpu = Vec::new();
    let mut wall = Vec::new();
    run(); // warm up: caches, page faults, the server's first request
    for _ in 0..RUNS {
        let started = Instant::now();
        let seconds = run();
        wall.push(TOKENS as f64 / started.elapsed().as_secs_f64());
        cpu.push(TOKENS as f64 / seconds);
    }
    Figures {
        per_cpu_second: median(cpu),
        per_second: median(wall),
    }
}

fn built_in(model: &Path, prompt: &[u32]) -> Figures {
    let mut engine = Engine::load(model, &candle_core::Device::Cpu).expect("load the model");
    measure(|| {
        let before = cpu_seconds("self");
        let tokens = engine.greedy(prompt, TOKENS).expect("generate");
        assert_eq!(tokens.len(), TOKENS);
        cpu_seconds("self") - before
    })
}

fn main() {
    let gguf = smollm2::gguf_path();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let engine = Engine::load(&gguf, &candle_core::Device::Cpu).expect("load the GGUF");
    let prompt = engine
        .render_prompt(&[TemplateMessage::new(
            "user",
            "Write a short story about a lighthouse keeper.",
        )])
        .expect("render the prompt");
    let prompt: Vec<u32> = engine
        .tokenizer()
        .encode(prompt, false)
        .expect("tokenize")
        .get_ids()
        .to_vec();
    drop(engine);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let server = runtime.block_on(LlamaServer::start(&gguf, threads));
    let pid = server.pid().to_string();
    let llama = measure(|| {
        let before = cpu_seconds(&pid);
        // Not stopping at end of sequence: exactly TOKENS tokens, as the built-in run.
        let answer = runtime.block_on(server.post(
            "/completion",
            &serde_json::json!({
                "prompt": prompt, "n_predict": TOKENS, "temperature": 0.0,
                "ignore_eos": true, "cache_prompt": false,
            }),
        ));
        assert_eq!(answer["tokens_predicted"], TOKENS);
        cpu_seconds(&pid) - before
    });
    drop(server);

    let gguf_figures = built_in(&gguf, &prompt);
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let bf16_figures = built_in(&smollm2::bf16_dir(tmp), &prompt);
    // The same GGUF forward pass on F32 weights: what the Q4_1 kernel gains over F32
    // products.
    let f32_figures = built_in(&smollm2::f32_gguf(tmp), &prompt);

    println!(
        "SmolLM2-135M-Instruct, prompt {} tokens + {TOKENS} generated, median of {RUNS}, {threads} threads",
        prompt.len()
    );
    println!("{:<34} {:>14} {:>10}", "engine", "tok/CPU-second", "tok/s");
    for (name, figures) in [
        ("llama.cpp llama-server, Q4_1 GGUF", &llama),
        ("built-in, Q4_1 GGUF", &gguf_figures),
        ("built-in (candle), BF16 safetensors", &bf16_figures),
        ("built-in, F32 GGUF", &f32_figures),
    ] {
        println!(
            "{name:<34} {:>14.1} {:>10.1}",
            figures.per_cpu_second, figures.per_second
        );
    }
    println!(
        "built-in / llama.cpp on the same GGUF: {:.2}x per CPU-second",
        gguf_figures.per_cpu_second / llama.per_cpu_second
    );
}
