//! `ModelConfig::from_gguf`: configs of GGUF-only models, checked against the tensors the
//! files hold. For every supported architecture, the parameter count of the config must
//! equal the elements of the file's tensors exactly.

mod support;

use skein_model_registry::config::MoeConfig;
use skein_model_registry::{Architecture, GgmlType, GgufHeader, ModelConfig, ModelShape, parameter_count};
use support::{Kv, gguf_prefix, llama_8b_gguf};

/// A GGUF header under construction; every tensor is F32, so that any shape is storable.
struct Gguf {
    kvs: Vec<(String, Kv)>,
    tensors: Vec<(String, Vec<u64>)>,
}

/// The sizes of a test model.
struct Dims {
    hidden: u64,
    layers: u64,
    heads: u32,
    kv_heads: u32,
    ffn: u64,
    vocab: u64,
}

const SMALL: Dims = Dims {
    hidden: 64,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    ffn: 96,
    vocab: 100,
};

impl Gguf {
    /// The keys llama.cpp writes for every architecture, and the token embedding.
    fn new(arch: &str, d: &Dims) -> Gguf {
        let kvs = vec![
            ("general.architecture".to_owned(), Kv::Str(arch.to_owned())),
            (format!("{arch}.block_count"), Kv::U32(d.layers as u32)),
            (format!("{arch}.context_length"), Kv::U32(256)),
            (format!("{arch}.embedding_length"), Kv::U32(d.hidden as u32)),
            (format!("{arch}.feed_forward_length"), Kv::U32(d.ffn as u32)),
            (format!("{arch}.attention.head_count"), Kv::U32(d.heads)),
            (format!("{arch}.attention.head_count_kv"), Kv::U32(d.kv_heads)),
        ];
        Gguf {
            kvs,
            tensors: vec![("token_embd.weight".to_owned(), vec![d.hidden, d.vocab])],
        }
    }

    fn kv(mut self, key: &str, value: Kv) -> Gguf {
        self.kvs.retain(|(k, _)| k != key);
        self.kvs.push((key.to_owned(), value));
        self
    }

    fn without(mut self, key: &str) -> Gguf {
        self.kvs.retain(|(k, _)| k != key);
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64]) -> Gguf {
        self.tensors.push((name.to_owned(), dims.to_vec()));
        self
    }

    /// The same tensors in every block, named after `blk.{i}.`.
    fn blocks(mut self, layers: u64, tensors: &[(&str, &[u64])]) -> Gguf {
        for block in 0..layers {
            for (name, dims) in tensors {
                self.tensors.push((format!("blk.{block}.{name}"), dims.to_vec()));
            }
        }
        self
    }

    fn header(self) -> GgufHeader {
        let (keys, values): (Vec<String>, Vec<Kv>) = self.kvs.into_iter().unzip();
        let kvs: Vec<(&str, Kv)> = keys.iter().map(String::as_str).zip(values).collect();
        let tensors: Vec<_> = self
            .tensors
            .into_iter()
            .map(|(name, dims)| (name, dims, GgmlType::F32))
            .collect();
        let (prefix, _) = gguf_prefix(&kvs, &tensors);
        GgufHeader::parse(&prefix).unwrap()
    }
}

/// A Llama-shaped model: RMSNorm, separate q/k/v, SwiGLU, untied unless the output is
/// left out.
fn llama(arch: &str, d: &Dims, with_output: bool) -> Gguf {
    let (h, kv, ffn) = (d.hidden, u64::from(d.kv_heads) * d.hidden / u64::from(d.heads), d.ffn);
    let gguf = Gguf::new(arch, d)
        .blocks(
            d.layers,
            &[
                ("attn_norm.weight", &[h]),
                ("attn_q.weight", &[h, h]),
                ("attn_k.weight", &[h, kv]),
                ("attn_v.weight", &[h, kv]),
                ("attn_output.weight", &[h, h]),
                ("ffn_norm.weight", &[h]),
                ("ffn_gate.weight", &[h, ffn]),
                ("ffn_up.weight", &[h, ffn]),
                ("ffn_down.weight", &[ffn, h]),
            ],
        )
        .tensor("output_norm.weight", &[h]);
    if with_output {
        gguf.tensor("output.weight", &[h, d.vocab])
    } else {
        gguf
    }
}

/// The config of `header`, asserting that it counts exactly the header's tensors.
fn exact(header: &GgufHeader) -> ModelConfig {
    let cfg = ModelConfig::from_gguf(header).unwrap();
    let elements: u64 = header.tensors().iter().map(|t| t.elements).sum();
    let shape = ModelShape::from_config(&cfg).unwrap();
    assert_eq!(shape.params.total(), elements, "{}", cfg.architecture);
    assert_eq!(parameter_count(&cfg).unwrap().total(), elements);
    cfg
}

fn error(header: &GgufHeader) -> String {
    ModelConfig::from_gguf(header).unwrap_err().to_string()
}

#[test]
fn llama_3_8b_gguf_counts_its_tensors_exactly() {
    let (prefix, _) = llama_8b_gguf(128_256);
    let header = GgufHeader::parse(&prefix).unwrap();
    let cfg = exact(&header);
    assert_eq!(parameter_count(&cfg).unwrap().total(), 8_030_261_248);
    assert_eq!(cfg.architecture, Architecture::Llama);
    let t = &cfg.text;
    assert_eq!(
        (
            t.hidden_size,
            t.num_layers,
            t.num_attention_heads,
            t.num_kv_heads,
            t.head_dim
        ),
        (4096, 32, 32, 8, 128)
    );
    assert_eq!(
        (t.intermediate_size, t.vocab_size, t.max_position_embeddings),
        (14336, 128_256, 8192)
    );
    assert!(!t.tie_word_embeddings);
    assert_eq!((t.moe, t.sliding_window, t.rope_theta), (None, None, None));
    assert_eq!(
        (cfg.torch_dtype, cfg.transformers_version, cfg.quantization_config),
        (None, None, None)
    );
}

#[test]
fn no_output_tensor_means_tied_embeddings() {
    let cfg = exact(&llama("llama", &SMALL, false).header());
    assert!(cfg.text.tie_word_embeddings);
    let cfg = exact(&llama("llama", &SMALL, true).header());
    assert!(!cfg.text.tie_word_embeddings);
}

#[test]
fn llama_with_experts_is_mixtral() {
    let (h, ffn, experts) = (SMALL.hidden, SMALL.ffn, 4);
    let kv = 32;
    let header = Gguf::new("llama", &SMALL)
        .kv("llama.expert_count", Kv::U32(experts as u32))
        .kv("llama.expert_used_count", Kv::U32(2))
        .blocks(
            SMALL.layers,
            &[
                ("attn_norm.weight", &[h]),
                ("attn_q.weight", &[h, h]),
                ("attn_k.weight", &[h, kv]),
                ("attn_v.weight", &[h, kv]),
                ("attn_output.weight", &[h, h]),
                ("ffn_norm.weight", &[h]),
                ("ffn_gate_inp.weight", &[h, experts]),
                ("ffn_gate_exps.weight", &[h, ffn, experts]),
                ("ffn_up_exps.weight", &[h, ffn, experts]),
                ("ffn_down_exps.weight", &[ffn, h, experts]),
            ],
        )
        .tensor("output_norm.weight", &[h])
        .tensor("output.weight", &[h, SMALL.vocab])
        .header();
    let cfg = exact(&header);
    assert_eq!(cfg.architecture, Architecture::Mixtral);
    assert_eq!(
        cfg.text.moe,
        Some(MoeConfig {
            num_experts: 4,
            experts_per_token: 2
        })
    );

    let missing = Gguf::new("llama", &SMALL).kv("llama.expert_count", Kv::U32(4)).header();
    insta::assert_snapshot!(error(&missing), @"the GGUF header has no `llama.expert_used_count`; help: Skein needs it to size a model without a config.json");
}

#[test]
fn every_supported_architecture_counts_its_tensors_exactly() {
    let (h, ffn) = (SMALL.hidden, SMALL.ffn);
    let kv = 32;

    // Qwen2: biases on q, k and v; tied (the small Qwen2 models are).
    let qwen2 = llama("qwen2", &SMALL, false)
        .blocks(
            SMALL.layers,
            &[("attn_q.bias", &[h]), ("attn_k.bias", &[kv]), ("attn_v.bias", &[kv])],
        )
        .header();
    let cfg = exact(&qwen2);
    assert_eq!(cfg.architecture, Architecture::Qwen2);
    assert!(cfg.text.tie_word_embeddings);

    // Gemma: heads wider than hidden / heads, from `key_length`; tied.
    let (q, kv_g) = (4 * 32, 32);
    let gemma = Gguf::new("gemma", &SMALL)
        .kv("gemma.attention.key_length", Kv::U32(32))
        .kv("gemma.attention.value_length", Kv::U32(32))
        .kv("gemma.attention.head_count_kv", Kv::U32(1))
        .blocks(
            SMALL.layers,
            &[
                ("attn_norm.weight", &[h]),
                ("attn_q.weight", &[h, q]),
                ("attn_k.weight", &[h, kv_g]),
                ("attn_v.weight", &[h, kv_g]),
                ("attn_output.weight", &[q, h]),
                ("ffn_norm.weight", &[h]),
                ("ffn_gate.weight", &[h, ffn]),
                ("ffn_up.weight", &[h, ffn]),
                ("ffn_down.weight", &[ffn, h]),
            ],
        )
        .tensor("output_norm.weight", &[h])
        .header();
    let cfg = exact(&gemma);
    assert_eq!((cfg.text.head_dim, cfg.text.num_kv_heads), (32, 1));

    // Phi-3: fused qkv and gate/up; a sliding window.
    let phi3 = Gguf::new("phi3", &SMALL)
        .kv("phi3.attention.sliding_window", Kv::U32(2047))
        .blocks(
            SMALL.layers,
            &[
                ("attn_norm.weight", &[h]),
                ("attn_qkv.weight", &[h, h + 2 * kv]),
                ("attn_output.weight", &[h, h]),
                ("ffn_norm.weight", &[h]),
                ("ffn_up.weight", &[h, 2 * ffn]),
                ("ffn_down.weight", &[ffn, h]),
            ],
        )
        .tensor("output_norm.weight", &[h])
        .tensor("output.weight", &[h, SMALL.vocab])
        .header();
    let cfg = exact(&phi3);
    assert_eq!(cfg.text.sliding_window, Some(2047));

    // Falcon-7B: multi-query, one LayerNorm per parallel block, no biases.
    let head = h / u64::from(SMALL.heads);
    let falcon_7b = Gguf::new("falcon", &SMALL)
        .kv("falcon.attention.head_count_kv", Kv::U32(1))
        .kv("falcon.feed_forward_length", Kv::U32(4 * h as u32))
        .blocks(
            SMALL.layers,
            &[
                ("attn_norm.weight", &[h]),
                ("attn_norm.bias", &[h]),
                ("attn_qkv.weight", &[h, h + 2 * head]),
                ("attn_output.weight", &[h, h]),
                ("ffn_up.weight", &[h, 4 * h]),
                ("ffn_down.weight", &[4 * h, h]),
            ],
        )
        .tensor("output_norm.weight", &[h])
        .tensor("output_norm.bias", &[h])
        .tensor("output.weight", &[h, SMALL.vocab])
        .header();
    let cfg = exact(&falcon_7b);
    assert_eq!((cfg.text.num_kv_heads, cfg.text.norms_per_layer), (1, 1));

    // Falcon-40B: grouped KV heads and two input norms per block (the new decoder).
    let falcon_40b = Gguf::new("falcon", &SMALL)
        .kv("falcon.feed_forward_length", Kv::U32(4 * h as u32))
        .blocks(
            SMALL.layers,
            &[
                ("attn_norm.weight", &[h]),
                ("attn_norm.bias", &[h]),
                ("attn_norm_2.weight", &[h]),
                ("attn_norm_2.bias", &[h]),
                ("attn_qkv.weight", &[h, h + 2 * kv]),
                ("attn_output.weight", &[h, h]),
                ("ffn_up.weight", &[h, 4 * h]),
                ("ffn_down.weight", &[4 * h, h]),
            ],
        )
        .tensor("output_norm.weight", &[h])
        .tensor("output_norm.bias", &[h])
        .header();
    let cfg = exact(&falcon_40b);
    assert_eq!((cfg.text.num_kv_heads, cfg.text.norms_per_layer), (2, 2));
    assert!(cfg.text.tie_word_embeddings);

    // GPT-2: learned positions, biases everywhere; llama.cpp's converter stores a copy of
    // the tied output matrix, which llama.cpp loads, so it counts.
    let gpt2 = Gguf::new("gpt2", &SMALL)
        .without("gpt2.attention.head_count_kv")
        .tensor("position_embd.weight", &[h, 256])
        .blocks(
            SMALL.layers,
            &[
                ("attn_norm.weight", &[h]),
                ("attn_norm.bias", &[h]),
                ("attn_qkv.weight", &[h, 3 * h]),
                ("attn_qkv.bias", &[3 * h]),
                ("attn_output.weight", &[h, h]),
                ("attn_output.bias", &[h]),
                ("ffn_norm.weight", &[h]),
                ("ffn_norm.bias", &[h]),
                ("ffn_up.weight", &[h, ffn]),
                ("ffn_up.bias", &[ffn]),
                ("ffn_down.weight", &[ffn, h]),
                ("ffn_down.bias", &[h]),
            ],
        )
        .tensor("output_norm.weight", &[h])
        .tensor("output_norm.bias", &[h])
        .tensor("output.weight", &[h, SMALL.vocab])
        .header();
    let cfg = exact(&gpt2);
    assert_eq!(cfg.text.num_kv_heads, 4);
}

#[test]
fn a_missing_key_is_named() {
    let header = llama("llama", &SMALL, true).without("llama.embedding_length").header();
    insta::assert_snapshot!(error(&header), @"the GGUF header has no `llama.embedding_length`; help: Skein needs it to size a model without a config.json");
}

#[test]
fn an_unsupported_architecture_lists_the_supported_ones() {
    let header = Gguf::new("bert", &SMALL).header();
    insta::assert_snapshot!(error(&header), @"the GGUF architecture `bert` (`general.architecture`) is not supported; Skein sizes GGUF files of architecture llama, qwen2, gemma, phi3, falcon, gpt2 (llama with experts as Mixtral)");
}

#[test]
fn per_layer_head_counts_are_refused() {
    let header = llama("llama", &SMALL, true)
        .kv("llama.attention.head_count_kv", Kv::I32Array(vec![2, 4]))
        .header();
    insta::assert_snapshot!(error(&header), @"`llama.attention.head_count_kv` in the GGUF header is an array of 2 values, one per layer; Skein cannot size models whose layers differ in shape");
}
