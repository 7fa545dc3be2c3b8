//! Lowering an agent's `model`: the repository, variants, formats, engines and GPU
//! constraints it may be served with.

use super::{DEFAULT_CONTEXT, GPU_KEYS, MODEL_KEYS, VARIANT_KEYS};
use crate::diag::{Code, Diagnostic};
use crate::ir::{
    ComputeCapability, EngineChoice, GpuConstraints, ModelRequirement, Precision, Preference, VariantPin, WeightFormat,
};
use crate::node::{Node, NodeKind};
use crate::read::{self, Cx};
use crate::source::Span;

/// Whether `s` is a Hugging Face repository id: `name` or `owner/name`, each
/// part of letters, digits, `-`, `_`, `.`, not starting or ending with `-`
/// or `.`, without `--` or `..`, at most 96 characters in all.
pub fn is_valid_repo_id(s: &str) -> bool {
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !p.starts_with(['-', '.'])
            && !p.ends_with(['-', '.'])
            && !p.contains("--")
            && !p.contains("..")
    };
    let mut parts = s.split('/');
    let ok = match (parts.next(), parts.next(), parts.next()) {
        (Some(a), None, None) => part_ok(a),
        (Some(a), Some(b), None) => part_ok(a) && part_ok(b),
        _ => false,
    };
    ok && s.len() <= 96
}

fn repo(cx: &mut Cx<'_>, node: &Node, what: &str) -> Option<String> {
    let text = read::string(cx, node, what)?;
    if is_valid_repo_id(&text) {
        return Some(text);
    }
    // A pasted hub URL holds the id as its first two path segments.
    let from_url = ["https://", "http://", ""]
        .iter()
        .flat_map(|scheme| ["huggingface.co/", "hf.co/"].map(|host| format!("{scheme}{host}")))
        .find_map(|prefix| text.strip_prefix(prefix.as_str()))
        .map(|rest| rest.split('/').take(2).collect::<Vec<_>>().join("/"))
        .filter(|id| is_valid_repo_id(id));
    let help = match from_url {
        Some(id) => format!("write the repository id, not its URL: `{id}`"),
        None => "write it as on the hub: `owner/name`, e.g. `Qwen/Qwen2.5-0.5B-Instruct`".to_owned(),
    };
    cx.push(
        Diagnostic::error(
            Code::BadValue,
            node.span,
            format!("`{text}` is not a Hugging Face repository id"),
        )
        .with_label("invalid repository id")
        .with_help(help),
    );
    None
}

pub(super) fn model_requirement(cx: &mut Cx<'_>, node: &Node, anchor: Span, agent: &str) -> Option<ModelRequirement> {
    // `model: owner/name` is short for `model: { repo: owner/name }`.
    if matches!(node.kind, NodeKind::Scalar(_)) && !node.is_null() {
        return repo(cx, node, "`model`").map(|repo| ModelRequirement {
            repo,
            revision: None,
            variants: Vec::new(),
            formats: WeightFormat::ALL.to_vec(),
            context: DEFAULT_CONTEXT,
            concurrency: 1,
            min_precision: Precision::Int4,
            prefer: Preference::Quality,
            gpu: GpuConstraints::default(),
            engines: Vec::new(),
            adapter: None,
        });
    }
    let what = format!("the model of agent `{agent}`");
    let mut m = read::map(cx, node, anchor, what, MODEL_KEYS)?;
    let repo = m.require(cx, "repo", "owner/name").and_then(|n| repo(cx, n, "`repo`"));
    let revision = m.get("revision").and_then(|n| read::string(cx, n, "`revision`"));
    let variants = m
        .get("variants")
        .map(|n| read::list(n).into_iter().filter_map(|v| variant(cx, v)).collect())
        .unwrap_or_default();
    let formats = match m.get("formats") {
        None => WeightFormat::ALL.to_vec(),
        Some(n) => {
            let names: Vec<&str> = WeightFormat::ALL.iter().map(|f| f.name()).collect();
            let mut v: Vec<WeightFormat> = read::list(n)
                .into_iter()
                .filter_map(|f| read::choice(cx, f, "weight format", &names).map(|i| WeightFormat::ALL[i]))
                .collect();
            v.sort();
            v.dedup();
            if v.is_empty() && read::list(n).is_empty() {
                cx.push(
                    Diagnostic::error(Code::BadValue, n.span, "`formats` is empty: no weights could be loaded")
                        .with_label("empty list")
                        .with_help("list `safetensors`, `gguf` or both, or remove `formats`"),
                );
            }
            v
        }
    };
    let context = m
        .get("context")
        .and_then(|n| read::count(cx, n, "`context`", 1))
        .unwrap_or(DEFAULT_CONTEXT);
    let concurrency = m
        .get("concurrency")
        .and_then(|n| read::count(cx, n, "`concurrency`", 1))
        .unwrap_or(1);
    let min_precision = match m.get("min_precision") {
        None => Precision::Int4,
        Some(n) => {
            let text = read::string(cx, n, "`min_precision`");
            match text.as_deref().map(|t| (t, Precision::parse(t.trim()))) {
                Some((_, Some(p))) => p,
                Some((t, None)) => {
                    let names: Vec<&str> = Precision::ALL.iter().rev().map(|p| p.name()).collect();
                    // The same number of bits first: `int16` means 16-bit
                    // weights (`bf16`), not the spelling-close `int6`.
                    let bits: String = t.chars().filter(char::is_ascii_digit).collect();
                    let same_bits = Precision::ALL.iter().map(|p| p.name()).find(|name| {
                        !bits.is_empty() && name.trim_start_matches(|c: char| c.is_ascii_alphabetic()) == bits
                    });
                    let help = match same_bits.or_else(|| skein_text::closest(t, names.iter().copied())) {
                        Some(s) => format!("did you mean `{s}`? (highest first: {})", names.join(" > ")),
                        None => format!("precisions, highest first: {}", names.join(" > ")),
                    };
                    cx.push(
                        Diagnostic::error(Code::BadValue, n.span, format!("`{t}` is not a precision"))
                            .with_label("unknown precision")
                            .with_help(help),
                    );
                    Precision::Int4
                }
                None => Precision::Int4,
            }
        }
    };
    let prefer = m
        .get("prefer")
        .and_then(|n| {
            let names: Vec<&str> = Preference::ALL.iter().map(|p| p.name()).collect();
            read::choice(cx, n, "preference", &names).map(|i| Preference::ALL[i])
        })
        .unwrap_or(Preference::Quality);
    let gpu = m
        .entry("gpu")
        .map(|e| gpu_constraints(cx, &e.value, e.key_span))
        .unwrap_or_default();
    let engines = m.get("engines").map(|n| engines(cx, n, &formats)).unwrap_or_default();
    let adapter = m
        .get("adapter")
        .and_then(|n| pin(cx, n, "an adapter", "owner/name-lora"))
        .map(Box::new);
    m.finish(cx);
    Some(ModelRequirement {
        repo: repo?,
        revision,
        variants,
        formats,
        context,
        concurrency,
        min_precision,
        prefer,
        gpu,
        engines,
        adapter,
    })
}

/// `engines:` — one engine or a list of them; each must be known, the list not empty,
/// and at least one of them must load one of the accepted `formats`.
fn engines(cx: &mut Cx<'_>, node: &Node, formats: &[WeightFormat]) -> Vec<EngineChoice> {
    let names: Vec<&str> = EngineChoice::ALL.iter().map(|e| e.name()).collect();
    let items = read::list(node);
    if items.is_empty() {
        cx.push(
            Diagnostic::error(
                Code::BadValue,
                node.span,
                "`engines` is empty: no engine could serve the model",
            )
            .with_label("empty list")
            .with_help(format!("list one or more of {}, or remove `engines`", names.join(", "))),
        );
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut bad = false;
    for item in items {
        let Some(text) = read::string(cx, item, "an engine") else {
            bad = true;
            continue;
        };
        match EngineChoice::parse(&text) {
            Some(e) => found.push(e),
            None => {
                bad = true;
                cx.push(
                    Diagnostic::error(Code::BadValue, item.span, format!("`{}` is not an engine", text.trim()))
                        .with_label("unknown engine")
                        .with_help(crate::diag::did_you_mean(&text, names.iter().copied(), "engines")),
                );
            }
        }
    }
    found.sort();
    found.dedup();
    // A misspelt engine already has its diagnostic; the formats are checked against
    // the engines that were read only when all were.
    if !bad && !formats.is_empty() && !found.iter().any(|e| formats.iter().any(|f| e.loads(*f))) {
        let listed: Vec<&str> = found.iter().map(|e| e.name()).collect();
        let accepted: Vec<&str> = formats.iter().map(|f| f.name()).collect();
        cx.push(
            Diagnostic::error(
                Code::BadValue,
                node.span,
                format!(
                    "no engine of `engines` loads an accepted format: {} cannot load {}",
                    listed.join(", "),
                    accepted.join(" or ")
                ),
            )
            .with_label("no engine can load the weights")
            .with_help("llama.cpp loads gguf, vllm loads safetensors, builtin loads both"),
        );
    }
    found
}

fn variant(cx: &mut Cx<'_>, node: &Node) -> Option<VariantPin> {
    pin(cx, node, "a variant", "owner/name-GGUF")
}

/// A repository, optionally one weight file in it and a revision: a variant, or an
/// adapter (`what`), written `owner/name` or `{ repo, file, revision }`.
fn pin(cx: &mut Cx<'_>, node: &Node, what: &str, example: &str) -> Option<VariantPin> {
    if matches!(node.kind, NodeKind::Scalar(_)) {
        return repo(cx, node, what).map(|repo| VariantPin {
            repo,
            file: None,
            revision: None,
        });
    }
    let mut m = read::map(cx, node, node.span, what, VARIANT_KEYS)?;
    let repo = m.require(cx, "repo", example).and_then(|n| repo(cx, n, "`repo`"));
    let file = m.get("file").and_then(|n| {
        let f = read::string(cx, n, "`file`")?;
        let lower = f.to_ascii_lowercase();
        if lower.ends_with(".gguf") || lower.ends_with(".safetensors") {
            Some(f)
        } else {
            cx.push(
                Diagnostic::error(
                    Code::BadValue,
                    n.span,
                    format!("`{f}` is not a safetensors or GGUF file"),
                )
                .with_label("unsupported weight file")
                .with_help("Skein loads only `.safetensors` and `.gguf` weights (never pickle `.bin`/`.pt`)"),
            );
            None
        }
    });
    let revision = m.get("revision").and_then(|n| read::string(cx, n, "`revision`"));
    m.finish(cx);
    Some(VariantPin {
        repo: repo?,
        file,
        revision,
    })
}

fn gpu_constraints(cx: &mut Cx<'_>, node: &Node, anchor: Span) -> GpuConstraints {
    let Some(mut m) = read::map(cx, node, anchor, "`gpu`", GPU_KEYS) else {
        return GpuConstraints::default();
    };
    let models = m
        .get("models")
        .map(|n| read::strings(cx, n, "a GPU model"))
        .unwrap_or_default();
    let nodes = m
        .get("nodes")
        .map(|n| read::strings(cx, n, "a node name"))
        .unwrap_or_default();
    let min_compute_capability = m.get("min_compute_capability").and_then(|n| {
        let text = read::string(cx, n, "`min_compute_capability`")?;
        let parsed = text
            .trim()
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse::<u8>().ok()?, b.parse::<u8>().ok()?)))
            .filter(|(major, _)| *major >= 1);
        if parsed.is_none() {
            cx.push(
                Diagnostic::error(
                    Code::BadValue,
                    n.span,
                    format!("`{text}` is not a CUDA compute capability"),
                )
                .with_label("expected MAJOR.MINOR")
                .with_help("write it like `8.0` (A100) or `8.9` (RTX 4090)"),
            );
        }
        parsed.map(|(major, minor)| ComputeCapability { major, minor })
    });
    let min_memory_bytes = m.get("min_memory").and_then(|n| read::size(cx, n, "`min_memory`"));
    let max_gpus = m.get("max_gpus").and_then(|n| read::count(cx, n, "`max_gpus`", 1));
    m.finish(cx);
    GpuConstraints {
        models: models.into_iter().map(|(s, _)| s).collect(),
        nodes: nodes.into_iter().map(|(s, _)| s).collect(),
        min_compute_capability,
        min_memory_bytes,
        max_gpus,
    }
}
