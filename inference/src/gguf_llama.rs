//! A GGUF Llama on the CPU without candle's tensors: the weights in their file blocks
//! ([`QMatrix`]), the activations and the KV cache in plain F32 buffers that live as long
//! as the model, so a decoded token allocates nothing and crosses no thread barrier
//! except in the products large enough to be split ([`crate::quant`]).
//!
//! The arithmetic follows llama.cpp's CPU graph for the same file, so greedy tokens
//! agree with it: RMS norm summed in F64 then scaled and multiplied by the weight, RoPE
//! on adjacent pairs with the angle advanced by `base^(-2/d)` per pair, attention scaled
//! by `1/√d` with a max-subtracted softmax, SwiGLU, and every product through the
//! weights' own block type.

use std::fs::File;

use candle_core::Device;
use candle_core::quantized::{GgmlDType, gguf_file};

use crate::quant::{QMatrix, Scratch};

/// The model's dimensions, from the GGUF metadata.
#[derive(Debug, Clone)]
struct Config {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    rope_base: f32,
    eps: f32,
}

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    q: QMatrix,
    k: QMatrix,
    v: QMatrix,
    o: QMatrix,
    ffn_norm: Vec<f32>,
    gate: QMatrix,
    up: QMatrix,
    down: QMatrix,
    /// Keys and values of the positions seen so far, `kv_heads · head_dim` per position.
    keys: Vec<f32>,
    values: Vec<f32>,
}

/// Buffers of one forward pass, reused (grown to the longest input seen).
#[derive(Debug, Default)]
struct Buffers {
    x: Vec<f32>,
    normed: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    scores: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    logits: Vec<f32>,
    scratch: Scratch,
}

/// A loaded GGUF Llama with its KV cache.
#[derive(Debug)]
pub(crate) struct GgufLlama {
    config: Config,
    embedding: QMatrix,
    /// `None`: the output layer is the embedding (tied weights).
    output: Option<QMatrix>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// Positions in the KV cache.
    cached: usize,
    threads: usize,
    buffers: Buffers,
}

/// Reads tensor `name` as a matrix (a vector has one row).
fn matrix(content: &gguf_file::Content, file: &mut File, name: &str) -> Result<QMatrix, String> {
    let tensor = content
        .tensor(file, name, &Device::Cpu)
        .map_err(|e| format!("tensor `{name}`: {e}"))?;
    let dims = tensor.shape().dims().to_vec();
    let (rows, cols) = match dims.as_slice() {
        [cols] => (1, *cols),
        [rows, cols] => (*rows, *cols),
        _ => return Err(format!("tensor `{name}` has shape {dims:?}, not a matrix")),
    };
    let raw = match tensor.dtype() {
        GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => std::borrow::Cow::Borrowed(&[][..]),
        _ => tensor.data().map_err(|e| format!("tensor `{name}`: {e}"))?,
    };
    let floats = || {
        tensor
            .dequantize(&Device::Cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| format!("tensor `{name}`: {e}"))
    };
    QMatrix::new(tensor.dtype(), rows, cols, raw, floats).map_err(|e| format!("tensor `{name}`: {e}"))
}

/// Reads tensor `name` as a vector of `len` F32 values.
fn vector(content: &gguf_file::Content, file: &mut File, name: &str, len: usize) -> Result<Vec<f32>, String> {
    let m = matrix(content, file, name)?;
    if m.rows() * m.cols() != len {
        return Err(format!("tensor `{name}` has {} values, not {len}", m.rows() * m.cols()));
    }
    let mut out = vec![0f32; len];
    for row in 0..m.rows() {
        m.dequantize_row(row, &mut out[row * m.cols()..(row + 1) * m.cols()]);
    }
    Ok(out)
}

impl GgufLlama {
    /// Loads a checked GGUF Llama (`crate::model::load_gguf` checked its metadata keys
    /// and tensors) from `file`. Errors are messages naming the tensor or key at fault.
    pub(crate) fn load(content: &gguf_file::Content, file: &mut File, threads: usize) -> Result<GgufLlama, String> {
        let number = |key: &str| -> Result<usize, String> {
            content
                .metadata
                .get(key)
                .and_then(|v| v.to_u32().ok())
                .map(|n| n as usize)
                .ok_or_else(|| format!("metadata key `{key}` is not an integer"))
        };
        let float = |key: &str| content.metadata.get(key).and_then(|v| v.to_f32().ok());
        let hidden = number("llama.embedding_length")?;
        let heads = number("llama.attention.head_count")?;
        let kv_heads = number("llama.attention.head_count_kv")?;
        let blocks = number("llama.block_count")?;
        let rope_dim = number("llama.rope.dimension_count")?;
        if heads == 0 || kv_heads == 0 || hidden % heads != 0 || heads % kv_heads != 0 {
            return Err(format!(
                "{heads} attention heads, {kv_heads} key-value heads and {hidden} features do not divide"
            ));
        }
        let head_dim = hidden / heads;
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(format!("RoPE over {rope_dim} of {head_dim} dimensions per head"));
        }
        let config = Config {
            hidden,
            heads,
            kv_heads,
            head_dim,
            rope_dim,
            rope_base: float("llama.rope.freq_base").unwrap_or(10_000.0),
            eps: float("llama.attention.layer_norm_rms_epsilon")
                .ok_or("metadata key `llama.attention.layer_norm_rms_epsilon` is not a number")?,
        };
        let kv_dim = kv_heads * head_dim;
        let expect = |m: QMatrix, name: &str, rows: usize, cols: usize| {
            if m.rows() == rows && m.cols() == cols {
                Ok(m)
            } else {
                Err(format!(
                    "tensor `{name}` is {}×{}, expected {rows}×{cols}",
                    m.rows(),
                    m.cols()
                ))
            }
        };
        let embedding = matrix(content, file, "token_embd.weight")?;
        if embedding.cols() != hidden {
            return Err(format!(
                "`token_embd.weight` has {} columns, not {hidden}",
                embedding.cols()
            ));
        }
        let output = if content.tensor_infos.contains_key("output.weight") {
            let name = "output.weight";
            Some(expect(matrix(content, file, name)?, name, embedding.rows(), hidden)?)
        } else {
            None
        };
        let output_norm = vector(content, file, "output_norm.weight", hidden)?;
        let mut layers = Vec::with_capacity(blocks);
        for layer in 0..blocks {
            let gate_name = format!("blk.{layer}.ffn_gate.weight");
            let gate = matrix(content, file, &gate_name)?;
            let ffn = gate.rows();
            let gate = expect(gate, &gate_name, ffn, hidden)?;
            let mut get = |name: &str, rows: usize, cols: usize| {
                let name = format!("blk.{layer}.{name}.weight");
                expect(matrix(content, file, &name)?, &name, rows, cols)
            };
            let q = get("attn_q", hidden, hidden)?;
            let k = get("attn_k", kv_dim, hidden)?;
            let v = get("attn_v", kv_dim, hidden)?;
            let o = get("attn_output", hidden, hidden)?;
            let up = get("ffn_up", ffn, hidden)?;
            let down = get("ffn_down", hidden, ffn)?;
            layers.push(Layer {
                attn_norm: vector(content, file, &format!("blk.{layer}.attn_norm.weight"), hidden)?,
                ffn_norm: vector(content, file, &format!("blk.{layer}.ffn_norm.weight"), hidden)?,
                q,
                k,
                v,
                o,
                gate,
                up,
                down,
                keys: Vec::new(),
                values: Vec::new(),
            });
        }
        Ok(GgufLlama {
            config,
            embedding,
            output,
            output_norm,
            layers,
            cached: 0,
            threads: threads.max(1),
            buffers: Buffers::default(),
        })
    }

    /// Forgets the previous sequence (keeps the buffers).
    pub(crate) fn clear_kv_cache(&mut self) {
        self.cached = 0;
        for layer in &mut self.layers {
            layer.keys.clear();
            layer.values.clear();
        }
    }

    /// The vocabulary's size.
    pub(crate) fn vocab_size(&self) -> usize {
        self.embedding.rows()
    }

    /// Runs `tokens` at positions `position..` and returns the logits of the token after
    /// the last. `position` must be the number of positions cached (0 after a reset).
    pub(crate) fn forward(&mut self, tokens: &[u32], position: usize) -> Result<&[f32], String> {
        if position != self.cached {
            return Err(format!("position {position}, but {} positions are cached", self.cached));
        }
        let vocab = self.vocab_size();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!("token {bad} is outside the vocabulary of {vocab}"));
        }
        let Config {
            hidden,
            heads,
            kv_heads,
            head_dim,
            rope_dim,
            rope_base,
            eps,
        } = self.config;
        let m = tokens.len();
        let kv_dim = kv_heads * head_dim;
        let ffn = self.layers.first().map_or(0, |l| l.gate.rows());
        let threads = self.threads;
        let b = &mut self.buffers;
        for (buffer, len) in [
            (&mut b.x, m * hidden),
            (&mut b.normed, m * hidden),
            (&mut b.q, m * hidden),
            (&mut b.k, m * kv_dim),
            (&mut b.v, m * kv_dim),
            (&mut b.attn, m * hidden),
            (&mut b.proj, m * hidden),
            (&mut b.gate, m * ffn),
            (&mut b.up, m * ffn),
            (&mut b.scores, position + m),
            (&mut b.cos, m * rope_dim / 2),
            (&mut b.sin, m * rope_dim / 2),
            (&mut b.logits, vocab),
        ] {
            buffer.resize(len, 0.0);
        }
        for (row, &token) in b.x.chunks_exact_mut(hidden).zip(tokens) {
            self.embedding.dequantize_row(token as usize, row);
        }
        // The rotation angles of each new position: pos · base^(-2i/d), the power
        // advanced by multiplication as ggml's RoPE cache does.
        let theta_scale = rope_base.powf(-2.0 / rope_dim as f32);
        for t in 0..m {
            let mut theta = (position + t) as f32;
            for i in 0..rope_dim / 2 {
                b.cos[t * rope_dim / 2 + i] = theta.cos();
                b.sin[t * rope_dim / 2 + i] = theta.sin();
                theta *= theta_scale;
            }
        }
        let scale = 1.0 / (head_dim as f32).sqrt();
        let group = heads / kv_heads;
        for layer in &mut self.layers {
            rms_norm(&b.x, &layer.attn_norm, eps, &mut b.normed);
            layer.q.matmul(&b.normed, m, &mut b.q, threads, &mut b.scratch);
            layer.k.matmul(&b.normed, m, &mut b.k, threads, &mut b.scratch);
            layer.v.matmul(&b.normed, m, &mut b.v, threads, &mut b.scratch);
            for t in 0..m {
                let (cos, sin) = (
                    &b.cos[t * rope_dim / 2..(t + 1) * rope_dim / 2],
                    &b.sin[t * rope_dim / 2..(t + 1) * rope_dim / 2],
                );
                for head in b.q[t * hidden..(t + 1) * hidden].chunks_exact_mut(head_dim) {
                    rope(head, cos, sin);
                }
                for head in b.k[t * kv_dim..(t + 1) * kv_dim].chunks_exact_mut(head_dim) {
                    rope(head, cos, sin);
                }
            }
            layer.keys.extend_from_slice(&b.k);
            layer.values.extend_from_slice(&b.v);
            for t in 0..m {
                // Causal: token t sees the cached positions and the new ones up to itself.
                let seen = position + t + 1;
                for h in 0..heads {
                    let kv = h / group;
                    let q = &b.q[t * hidden + h * head_dim..t * hidden + (h + 1) * head_dim];
                    let scores = &mut b.scores[..seen];
                    for (j, score) in scores.iter_mut().enumerate() {
                        let k = &layer.keys[j * kv_dim + kv * head_dim..j * kv_dim + (kv + 1) * head_dim];
                        *score = dot(q, k) * scale;
                    }
                    softmax(scores);
                    let out = &mut b.attn[t * hidden + h * head_dim..t * hidden + (h + 1) * head_dim];
                    out.fill(0.0);
                    for (j, &p) in scores.iter().enumerate() {
                        let v = &layer.values[j * kv_dim + kv * head_dim..j * kv_dim + (kv + 1) * head_dim];
                        for (o, &v) in out.iter_mut().zip(v) {
                            *o += p * v;
                        }
                    }
                }
            }
            layer.o.matmul(&b.attn, m, &mut b.proj, threads, &mut b.scratch);
            add(&mut b.x, &b.proj);
            rms_norm(&b.x, &layer.ffn_norm, eps, &mut b.normed);
            layer.gate.matmul(&b.normed, m, &mut b.gate, threads, &mut b.scratch);
            layer.up.matmul(&b.normed, m, &mut b.up, threads, &mut b.scratch);
            for (g, &u) in b.gate.iter_mut().zip(&b.up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
            layer.down.matmul(&b.gate, m, &mut b.proj, threads, &mut b.scratch);
            add(&mut b.x, &b.proj);
        }
        self.cached += m;
        let last = &b.x[(m - 1) * hidden..m * hidden];
        let normed = &mut b.normed[..hidden];
        rms_norm(last, &self.output_norm, eps, normed);
        let output = self.output.as_ref().unwrap_or(&self.embedding);
        output.matmul(normed, 1, &mut b.logits, threads, &mut b.scratch);
        Ok(&b.logits)
    }
}

/// Each row of `x` divided by its root mean square (summed in F64, as ggml does), times
/// `weight`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (x, out) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
            *o = v * scale * w;
        }
    }
}

/// Rotates the first `2 · cos.len()` values of one head in adjacent pairs.
fn rope(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (pair, (&c, &s)) in head.chunks_exact_mut(2).zip(cos.iter().zip(sin)) {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut sums = [0f32; 8];
    let whole = a.len() / 8 * 8;
    for (a, b) in a[..whole].chunks_exact(8).zip(b[..whole].chunks_exact(8)) {
        for i in 0..8 {
            sums[i] += a[i] * b[i];
        }
    }
    sums.iter().sum::<f32>() + a[whole..].iter().zip(&b[whole..]).map(|(a, b)| a * b).sum::<f32>()
}

/// Softmax in place, the maximum subtracted first and the sum taken in F64.
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inverse = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inverse;
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (x, &y) in x.iter_mut().zip(y) {
        *x += y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_scales_rows_to_unit_root_mean_square() {
        let x = [3.0f32, 4.0, 0.0, 0.0, 1.0, 1.0];
        let mut out = [0f32; 6];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert_eq!(&out[..2], &[3.0 / rms, 8.0 / rms]);
        assert_eq!(&out[4..], &[1.0, 2.0]);
    }

    #[test]
    fn rope_rotates_adjacent_pairs() {
        let mut head = [1.0f32, 0.0, 0.0, 1.0, 5.0];
        rope(&mut head, &[0.0, 1.0], &[1.0, 0.0]);
        assert_eq!(head, [0.0, 1.0, 0.0, 1.0, 5.0]);
    }

    #[test]
    fn softmax_sums_to_one_without_overflow() {
        let mut x = [1000.0f32, 1000.0, f32::NEG_INFINITY];
        softmax(&mut x);
        assert_eq!(x, [0.5, 0.5, 0.0]);
    }
}
