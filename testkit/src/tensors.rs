//! The tensor tables of a model, from its parsed `config.json`: the safetensors
//! checkpoint `transformers`, AutoAWQ or AutoGPTQ would write ([`checkpoint_tensors`]),
//! and the GGUF file llama.cpp's converter and quantizer would write
//! ([`gguf_model`], [`gguf_mmproj`]). The header writers of the crate root turn them
//! into bytes.
//!
//! Supported: the dense, gated-MLP decoders (`llama`, `mistral`, `qwen2`) and
//! LLaVA-NeXT around one of them. Anything else panics: these are fixtures, and a
//! silently wrong table would make a test pass for the wrong reason.

use skein_model_registry::config::{Architecture, MlpKind, ModelConfig, TextConfig};
use skein_model_registry::{GgmlType, GgufFileType, SafetensorsDtype};

use crate::{Kv, Tensor};

/// A tensor of a GGUF file: name, `ne` (innermost dimension first), type.
pub type GgufTensor = (String, Vec<u64>, GgmlType);

/// A GGUF file's metadata and tensor table, for [`gguf_prefix`](crate::gguf_prefix)
/// or [`gguf_split_evenly`](crate::gguf_split_evenly).
pub type GgufTable = (Vec<(String, Kv)>, Vec<GgufTensor>);

/// How a safetensors checkpoint stores the language model's linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Every tensor in this dtype (`torch_dtype`).
    Dense(SafetensorsDtype),
    /// AutoAWQ's GEMM layout: per linear layer an I32 `qweight` `[in, out × bits / 32]`,
    /// I32 `qzeros` `[in / group, out × bits / 32]` and F16 `scales` `[in / group, out]`;
    /// everything else F16.
    Awq { bits: u64, group: u64 },
    /// AutoGPTQ's layout: I32 `qweight` `[in × bits / 32, out]`, I32 `qzeros`
    /// `[in / group, out × bits / 32]`, F16 `scales` `[in / group, out]` and I32 `g_idx`
    /// `[in]`; everything else F16.
    Gptq { bits: u64, group: u64 },
}

impl Storage {
    /// The dtype of everything but the quantized linear layers.
    fn plain(self) -> SafetensorsDtype {
        match self {
            Storage::Dense(dtype) => dtype,
            Storage::Awq { .. } | Storage::Gptq { .. } => SafetensorsDtype::F16,
        }
    }

    /// The tensors of one linear layer `name` (without `.weight`) of the language model.
    fn linear(self, name: &str, input: u64, output: u64) -> Vec<Tensor> {
        let i32 = SafetensorsDtype::I32;
        let f16 = SafetensorsDtype::F16;
        match self {
            Storage::Dense(dtype) => vec![(format!("{name}.weight"), dtype, vec![output, input])],
            Storage::Awq { bits, group } => {
                let (packed, groups) = (output * bits / 32, input.div_ceil(group));
                vec![
                    (format!("{name}.qweight"), i32, vec![input, packed]),
                    (format!("{name}.qzeros"), i32, vec![groups, packed]),
                    (format!("{name}.scales"), f16, vec![groups, output]),
                ]
            }
            Storage::Gptq { bits, group } => {
                let groups = input.div_ceil(group);
                vec![
                    (format!("{name}.qweight"), i32, vec![input * bits / 32, output]),
                    (format!("{name}.qzeros"), i32, vec![groups, output * bits / 32]),
                    (format!("{name}.scales"), f16, vec![groups, output]),
                    (format!("{name}.g_idx"), i32, vec![input]),
                ]
            }
        }
    }
}

/// Panics unless the language model is a dense decoder with separate q/k/v and a gated
/// MLP, the layout the tables below write.
fn check_supported(text: &TextConfig) {
    let dense = text.moe.is_none() && !text.fused_qkv && !text.fused_gate_up && text.mlp == MlpKind::Gated;
    assert!(
        dense
            && matches!(
                text.architecture,
                Architecture::Llama | Architecture::Mistral | Architecture::Qwen2
            ),
        "testkit writes tensor tables for dense llama, mistral and qwen2 decoders, not {}",
        text.architecture
    );
}

/// The tensors of the checkpoint `config` describes, stored as `storage`, in the order
/// `transformers` saves them: embeddings, each layer, final norm, output projection
/// (absent when tied); then, for LLaVA-NeXT, the CLIP vision tower, the projector and
/// `image_newline` (never quantized). LLaVA-NeXT's language model sits under
/// `language_model.`.
pub fn checkpoint_tensors(config: &ModelConfig, storage: Storage) -> Vec<Tensor> {
    let t = &config.text;
    check_supported(t);
    let plain = storage.plain();
    let (h, ffn, vocab) = (t.hidden_size, t.intermediate_size, t.vocab_size);
    let q = t.num_attention_heads * t.head_dim;
    let kv = t.num_kv_heads * t.head_dim;
    let prefix = if config.vision.is_some() { "language_model." } else { "" };
    let mut tensors = vec![(format!("{prefix}model.embed_tokens.weight"), plain, vec![vocab, h])];
    for layer in 0..t.num_layers {
        let p = format!("{prefix}model.layers.{layer}");
        tensors.push((format!("{p}.input_layernorm.weight"), plain, vec![h]));
        for (name, output) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            tensors.extend(storage.linear(&format!("{p}.self_attn.{name}"), h, output));
            if t.biases.qkv {
                tensors.push((format!("{p}.self_attn.{name}.bias"), plain, vec![output]));
            }
        }
        tensors.extend(storage.linear(&format!("{p}.self_attn.o_proj"), q, h));
        if t.biases.attn_output {
            tensors.push((format!("{p}.self_attn.o_proj.bias"), plain, vec![h]));
        }
        tensors.push((format!("{p}.post_attention_layernorm.weight"), plain, vec![h]));
        tensors.extend(storage.linear(&format!("{p}.mlp.gate_proj"), h, ffn));
        tensors.extend(storage.linear(&format!("{p}.mlp.up_proj"), h, ffn));
        tensors.extend(storage.linear(&format!("{p}.mlp.down_proj"), ffn, h));
    }
    tensors.push((format!("{prefix}model.norm.weight"), plain, vec![h]));
    if !t.tie_word_embeddings {
        tensors.push((format!("{prefix}lm_head.weight"), plain, vec![vocab, h]));
    }
    tensors.extend(vision_tensors(config, plain));
    tensors
}

/// LLaVA-NeXT's CLIP tower, projector and `image_newline`, as `llava-hf` names them.
fn vision_tensors(config: &ModelConfig, dtype: SafetensorsDtype) -> Vec<Tensor> {
    let (Some(v), Some(projector)) = (config.vision, config.projector) else {
        return Vec::new();
    };
    let (h, i) = (v.hidden_size, v.intermediate_size);
    let side = v.image_size / v.patch_size;
    let tower = "vision_tower.vision_model";
    let weight_and_bias = |name: String, shape: Vec<u64>, bias: u64| {
        [
            (format!("{name}.weight"), dtype, shape),
            (format!("{name}.bias"), dtype, vec![bias]),
        ]
    };
    let mut tensors = vec![
        (format!("{tower}.embeddings.class_embedding"), dtype, vec![h]),
        (
            format!("{tower}.embeddings.patch_embedding.weight"),
            dtype,
            vec![h, v.num_channels, v.patch_size, v.patch_size],
        ),
        (
            format!("{tower}.embeddings.position_embedding.weight"),
            dtype,
            vec![side * side + 1, h],
        ),
    ];
    tensors.extend(weight_and_bias(format!("{tower}.pre_layrnorm"), vec![h], h));
    for layer in 0..v.num_layers {
        let p = format!("{tower}.encoder.layers.{layer}");
        for name in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            tensors.extend(weight_and_bias(format!("{p}.self_attn.{name}"), vec![h, h], h));
        }
        tensors.extend(weight_and_bias(format!("{p}.layer_norm1"), vec![h], h));
        tensors.extend(weight_and_bias(format!("{p}.mlp.fc1"), vec![i, h], i));
        tensors.extend(weight_and_bias(format!("{p}.mlp.fc2"), vec![h, i], h));
        tensors.extend(weight_and_bias(format!("{p}.layer_norm2"), vec![h], h));
    }
    tensors.extend(weight_and_bias(format!("{tower}.post_layernorm"), vec![h], h));
    let (input, output) = (projector.input_size, projector.output_size);
    for (name, shape) in [("linear_1", vec![output, input]), ("linear_2", vec![output, output])] {
        let name = format!("multi_modal_projector.{name}");
        tensors.push((format!("{name}.weight"), dtype, shape));
        if projector.bias {
            tensors.push((format!("{name}.bias"), dtype, vec![output]));
        }
    }
    tensors.push(("image_newline".to_owned(), dtype, vec![config.text.hidden_size]));
    tensors
}

/// The role of a GGUF matrix, for the quantizer's type choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    TokenEmbd,
    Output,
    V,
    Down,
    Other,
}

/// The model facts llama.cpp's `llama_tensor_get_type` looks at, for the file types
/// written here.
struct Mix {
    file_type: GgufFileType,
    layers: u64,
    tied: bool,
    /// llama.cpp's `LLM_TYPE_70B`: a Llama with 80 layers and grouped KV heads.
    llama_70b: bool,
}

impl Mix {
    /// The type of a `role` matrix of `layer` whose rows hold `row` elements, as
    /// `llama-quantize` picks it (without an importance matrix) for `Q8_0`, `Q6_K`,
    /// `Q5_K_M` and `Q4_K_M`: the output projection (the token embedding when tied) in
    /// `Q6_K`, `attn_v` and `ffn_down` of the `use_more_bits` layers in `Q6_K` for the
    /// `_M` mixes, Llama-70B's other `attn_v` in `Q5_K`, and a type with smaller blocks
    /// where a row is not whole blocks.
    fn ggml_type(&self, role: Role, layer: u64, row: u64) -> GgmlType {
        use GgmlType as T;
        use GgufFileType as F;
        let default = match self.file_type {
            F::Q8_0 => T::Q8_0,
            F::Q6_K => T::Q6_K,
            F::Q5_K_M => T::Q5_K,
            F::Q4_K_M => T::Q4_K,
            other => panic!("testkit writes Q8_0, Q6_K, Q5_K_M and Q4_K_M GGUF files, not {other}"),
        };
        let mixed = matches!(self.file_type, F::Q5_K_M | F::Q4_K_M);
        let more = {
            let eighth = self.layers / 8;
            layer < eighth || layer >= 7 * self.layers / 8 || (layer - eighth) % 3 == 2
        };
        let chosen = match role {
            Role::Output | Role::TokenEmbd if role == Role::Output || self.tied => {
                if !row.is_multiple_of(default.elements_per_block()) {
                    T::Q8_0
                } else if default != T::Q8_0 {
                    T::Q6_K
                } else {
                    default
                }
            }
            Role::V if mixed && more => T::Q6_K,
            Role::V if self.llama_70b && default == T::Q4_K => T::Q5_K,
            Role::Down if mixed && more => T::Q6_K,
            _ => default,
        };
        fallback(chosen, row)
    }
}

/// llama.cpp's `convert_incompatible_tensor`: a type with smaller blocks for rows that
/// are not whole blocks of the chosen one, F16 as the last resort.
fn fallback(chosen: GgmlType, row: u64) -> GgmlType {
    use GgmlType as T;
    if row.is_multiple_of(chosen.elements_per_block()) {
        return chosen;
    }
    let smaller = match chosen {
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        _ => T::F16,
    };
    if row.is_multiple_of(smaller.elements_per_block()) {
        smaller
    } else {
        T::F16
    }
}

/// The `general.architecture` llama.cpp's converter writes for a language model:
/// Mistral (also inside LLaVA-NeXT) is converted as `llama`.
fn gguf_architecture(text: &TextConfig) -> &'static str {
    match text.architecture {
        Architecture::Qwen2 => "qwen2",
        _ => "llama",
    }
}

/// The metadata and tensor table of the language model `config` describes as a GGUF
/// file of `file_type` (`Q8_0`, `Q6_K`, `Q5_K_M` or `Q4_K_M`): matrices in the mix
/// `llama-quantize` gives them, norms and biases in F32. The metadata holds the
/// architecture, file type and dimensions, but no tokenizer, so the header stays a few
/// KiB (the registry sizes a derivative from its base model's config, not from the
/// vocabulary arrays).
pub fn gguf_model(config: &ModelConfig, file_type: GgufFileType) -> GgufTable {
    let t = &config.text;
    check_supported(t);
    let arch = gguf_architecture(t);
    let (h, ffn, vocab, layers) = (t.hidden_size, t.intermediate_size, t.vocab_size, t.num_layers);
    let q = t.num_attention_heads * t.head_dim;
    let kv = t.num_kv_heads * t.head_dim;
    let u32_of = |v: u64| Kv::U32(u32::try_from(v).expect("dimension fits u32"));
    let kvs = vec![
        ("general.architecture".to_owned(), Kv::Str(arch.to_owned())),
        ("general.name".to_owned(), Kv::Str("testkit reference model".to_owned())),
        ("general.file_type".to_owned(), Kv::U32(file_type.id())),
        (format!("{arch}.block_count"), u32_of(layers)),
        (format!("{arch}.context_length"), u32_of(t.max_position_embeddings)),
        (format!("{arch}.embedding_length"), u32_of(h)),
        (format!("{arch}.feed_forward_length"), u32_of(ffn)),
        (format!("{arch}.attention.head_count"), u32_of(t.num_attention_heads)),
        (format!("{arch}.attention.head_count_kv"), u32_of(t.num_kv_heads)),
        (format!("{arch}.vocab_size"), u32_of(vocab)),
    ];
    let mix = Mix {
        file_type,
        layers,
        tied: t.tie_word_embeddings,
        llama_70b: t.architecture == Architecture::Llama && layers == 80 && t.num_attention_heads > t.num_kv_heads,
    };
    let f32 = GgmlType::F32;
    let mut tensors = vec![(
        "token_embd.weight".to_owned(),
        vec![h, vocab],
        mix.ggml_type(Role::TokenEmbd, 0, h),
    )];
    for layer in 0..layers {
        let b = format!("blk.{layer}");
        let matrix = |name: &str, role: Role, input: u64, output: u64| {
            (
                format!("{b}.{name}.weight"),
                vec![input, output],
                mix.ggml_type(role, layer, input),
            )
        };
        tensors.push((format!("{b}.attn_norm.weight"), vec![h], f32));
        for (name, role, output) in [
            ("attn_q", Role::Other, q),
            ("attn_k", Role::Other, kv),
            ("attn_v", Role::V, kv),
        ] {
            tensors.push(matrix(name, role, h, output));
            if t.biases.qkv {
                tensors.push((format!("{b}.{name}.bias"), vec![output], f32));
            }
        }
        tensors.push(matrix("attn_output", Role::Other, q, h));
        if t.biases.attn_output {
            tensors.push((format!("{b}.attn_output.bias"), vec![h], f32));
        }
        tensors.push((format!("{b}.ffn_norm.weight"), vec![h], f32));
        tensors.push(matrix("ffn_gate", Role::Other, h, ffn));
        tensors.push(matrix("ffn_up", Role::Other, h, ffn));
        tensors.push(matrix("ffn_down", Role::Down, ffn, h));
    }
    tensors.push(("output_norm.weight".to_owned(), vec![h], f32));
    if !t.tie_word_embeddings {
        tensors.push((
            "output.weight".to_owned(),
            vec![h, vocab],
            mix.ggml_type(Role::Output, 0, h),
        ));
    }
    (kvs, tensors)
}

/// The multimodal projector file (`mmproj-…-f16.gguf`) of a LLaVA-NeXT model, as
/// llama.cpp's LLaVA converter writes it: the CLIP tower (`v.`), the projector (`mm.0`,
/// `mm.2`) and `model.image_newline`, matrices in F16 and norms and biases in F32.
/// `None` for a model without a vision tower.
pub fn gguf_mmproj(config: &ModelConfig) -> Option<GgufTable> {
    let (v, projector) = (config.vision?, config.projector?);
    let (h, i) = (v.hidden_size, v.intermediate_size);
    let side = v.image_size / v.patch_size;
    let (f16, f32) = (GgmlType::F16, GgmlType::F32);
    let u32_of = |v: u64| Kv::U32(u32::try_from(v).expect("dimension fits u32"));
    let kvs = vec![
        ("general.architecture".to_owned(), Kv::Str("clip".to_owned())),
        ("general.file_type".to_owned(), Kv::U32(GgufFileType::F16.id())),
        ("clip.projector_type".to_owned(), Kv::Str("mlp".to_owned())),
        ("clip.vision.image_size".to_owned(), u32_of(v.image_size)),
        ("clip.vision.patch_size".to_owned(), u32_of(v.patch_size)),
        ("clip.vision.embedding_length".to_owned(), u32_of(h)),
        ("clip.vision.feed_forward_length".to_owned(), u32_of(i)),
        ("clip.vision.block_count".to_owned(), u32_of(v.num_layers)),
        (
            "clip.vision.attention.head_count".to_owned(),
            u32_of(v.num_attention_heads),
        ),
    ];
    let linear = |name: String, input: u64, output: u64| {
        [
            (format!("{name}.weight"), vec![input, output], f16),
            (format!("{name}.bias"), vec![output], f32),
        ]
    };
    let norm = |name: String| {
        [
            (format!("{name}.weight"), vec![h], f32),
            (format!("{name}.bias"), vec![h], f32),
        ]
    };
    let mut tensors = vec![
        ("v.class_embd".to_owned(), vec![h], f32),
        (
            "v.patch_embd.weight".to_owned(),
            vec![v.patch_size, v.patch_size, v.num_channels, h],
            f16,
        ),
        ("v.position_embd.weight".to_owned(), vec![h, side * side + 1], f16),
    ];
    tensors.extend(norm("v.pre_ln".to_owned()));
    for layer in 0..v.num_layers {
        let b = format!("v.blk.{layer}");
        for name in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            tensors.extend(linear(format!("{b}.{name}"), h, h));
        }
        tensors.extend(norm(format!("{b}.ln1")));
        tensors.extend(linear(format!("{b}.ffn_up"), h, i));
        tensors.extend(linear(format!("{b}.ffn_down"), i, h));
        tensors.extend(norm(format!("{b}.ln2")));
    }
    tensors.extend(norm("v.post_ln".to_owned()));
    let (input, output) = (projector.input_size, projector.output_size);
    for (name, input) in [("mm.0", input), ("mm.2", output)] {
        let [weight, bias] = linear(name.to_owned(), input, output);
        tensors.push(weight);
        if projector.bias {
            tensors.push(bias);
        }
    }
    tensors.push(("model.image_newline".to_owned(), vec![output], f32));
    Some((kvs, tensors))
}
