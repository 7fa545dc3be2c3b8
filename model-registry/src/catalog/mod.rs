//! What Skein knows about one model before anything is downloaded: its shape and every
//! variant with its exact (or computed) weight bytes, and where each fits.
//!
//! [`ModelInfo`] is assembled at the hub edge
//! ([`HubClient::inspect`](crate::hub::HubClient::inspect)); everything here is pure:
//! the grouping of a repository's GGUF files into variants ([`gguf_variants`]), the
//! listing order, and the fit search over GPU sets ([`fit`]).

pub mod fit;

use serde::{Deserialize, Serialize};

use crate::estimate::{ModelShape, TpDegree, WeightGroups, WeightsOrigin};
use crate::repo::{CommitSha, RepoFile, RepoId};
use crate::{Architecture, Bytes, ModelTask, Quantization, WeightFormat};

pub use fit::{FitOptions, Placement, SetFit, VariantFit, fit_all, fit_variant};

/// Tensor-parallel degrees listed by `inspect`: up to a full 8-GPU node.
pub const MAX_LISTED_TP_DEGREE: u64 = 8;

/// Where a candidate variant comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantSource {
    /// A checkpoint in the repository asked about.
    ThisRepo,
    /// A repository that the hub lists as a quantized derivative of it
    /// (`base_model:quantized:<repo>`).
    QuantizedDerivative,
    /// A repository (or a file in one) the user pinned: a workflow's `variants` or
    /// `--variant` on the command line.
    Pinned,
}

/// Where the model's shape was read from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum ShapeSource {
    /// The repository's `config.json`.
    ConfigJson,
    /// The metadata of a GGUF file (a GGUF-only repository).
    Gguf {
        /// The file read.
        file: String,
    },
}

/// A model and its variants.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelInfo {
    /// The repository asked about.
    pub repo: RepoId,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub sha: CommitSha,
    /// Where the shape came from.
    pub shape_source: ShapeSource,
    /// The shape: layers, heads, widths, exact parameter counts.
    pub shape: ModelShape,
    /// Tensor-parallel degrees 1 to [`MAX_LISTED_TP_DEGREE`] for unquantized weights,
    /// each valid or with its reason.
    pub tp_degrees: Vec<TpDegree>,
    /// Every variant found, best precision first (see [`sort_variants`]).
    pub variants: Vec<Variant>,
    /// Variants found but not usable, with the reason.
    pub skipped: Vec<SkippedVariant>,
    /// Things the user should know (a derivative list that could not be fetched, …).
    pub notes: Vec<String>,
    /// What it is served for: text generation, or embeddings.
    pub task: ModelTask,
}

impl ModelInfo {
    /// The model's architecture.
    pub fn architecture(&self) -> Architecture {
        self.shape.architecture
    }

    /// Whether Skein's built-in engine can start `variant`: a GGUF file only of the
    /// `llama` architecture (candle's quantized Llama, with the tokenizer and chat
    /// template built from the file's metadata); other weights as the estimate decides.
    /// Never an embedding model: the built-in engine only generates.
    pub fn builtin_engine_loads(&self, variant: &Variant) -> bool {
        !self.task.is_embed() && (variant.format() != WeightFormat::Gguf || self.architecture() == Architecture::Llama)
    }
}

/// One way to run the model: a checkpoint in some format and precision.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Variant {
    /// How a workflow pins it: `owner/name` for a safetensors checkpoint,
    /// `owner/name:file.gguf` for a GGUF file (the first split of a split file).
    pub id: String,
    /// The repository holding it.
    pub repo: RepoId,
    /// The commit read.
    pub sha: CommitSha,
    /// The weight files (every shard or split), and a GGUF projector file if any.
    pub files: Vec<String>,
    /// The asked repository's own checkpoint, or a quantized derivative.
    pub source: VariantSource,
    /// Format, method, bits, group size.
    pub quantization: Quantization,
    /// Bytes of its files on the hub.
    pub size: Bytes,
    /// Bytes by tensor group: exact from headers, or computed.
    pub weights: WeightGroups,
    /// Tensor-parallel degrees 1 to [`MAX_LISTED_TP_DEGREE`] valid for these weights;
    /// empty for GGUF, which llama.cpp splits by layers.
    pub tp_degrees: Vec<u64>,
}

impl Variant {
    /// Whether its bytes come from its headers (exact) rather than computed.
    pub fn exact(&self) -> bool {
        matches!(self.weights.origin, WeightsOrigin::Header { .. })
    }

    /// Its format.
    pub fn format(&self) -> WeightFormat {
        self.quantization.format
    }
}

/// A variant that was found but cannot be planned on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedVariant {
    /// The repository (and file) as a pin would name it.
    pub id: String,
    /// Why.
    pub reason: String,
}

/// One GGUF variant: a file, or the splits of one (`…-00001-of-00003.gguf`), with the
/// repository's projector file for a multimodal model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufVariantFiles {
    /// The model file, or its splits in order.
    pub model: Vec<RepoFile>,
    /// The multimodal projector (`mmproj*.gguf`) of the repository, if any.
    pub mmproj: Option<RepoFile>,
}

impl GgufVariantFiles {
    /// Bytes of the model files (the projector is counted by the estimate, not here).
    pub fn size(&self) -> u64 {
        self.model.iter().map(|f| f.size).fold(0, u64::saturating_add)
    }

    /// The first file's path, which names the variant.
    pub fn name(&self) -> &str {
        self.model.first().map_or("", |f| f.path.as_str())
    }
}

/// Groups a repository's GGUF files into variants: the splits of one model file become
/// one variant (in split order, and only when every split is present), projector files
/// (`mmproj` in the name) are attached to every variant instead of being variants, and
/// every other file is a variant of its own. Returns the variants and the names of
/// incomplete split sets. Pure.
pub fn gguf_variants(files: &[RepoFile]) -> (Vec<GgufVariantFiles>, Vec<String>) {
    let mmproj = files
        .iter()
        .filter(|f| file_name(&f.path).to_ascii_lowercase().contains("mmproj"))
        .min_by(|a, b| {
            mmproj_preference(a)
                .cmp(&mmproj_preference(b))
                .then(a.path.cmp(&b.path))
        })
        .cloned();
    let mut singles = Vec::new();
    let mut splits: std::collections::BTreeMap<(String, u32), Vec<(u32, RepoFile)>> = Default::default();
    for file in files {
        if file_name(&file.path).to_ascii_lowercase().contains("mmproj") {
            continue;
        }
        match split_of(&file.path) {
            Some((stem, index, count)) => splits.entry((stem, count)).or_default().push((index, file.clone())),
            None => singles.push(GgufVariantFiles {
                model: vec![file.clone()],
                mmproj: mmproj.clone(),
            }),
        }
    }
    let mut incomplete = Vec::new();
    for ((stem, count), mut parts) in splits {
        parts.sort_by_key(|(index, _)| *index);
        let complete = parts.len() == count as usize && parts.iter().zip(1..).all(|((index, _), want)| *index == want);
        if complete {
            singles.push(GgufVariantFiles {
                model: parts.into_iter().map(|(_, f)| f).collect(),
                mmproj: mmproj.clone(),
            });
        } else {
            incomplete.push(format!("{stem}-*-of-{count:05}.gguf"));
        }
    }
    singles.sort_by(|a, b| a.name().cmp(b.name()));
    (singles, incomplete)
}

/// f16 projectors first (what llama.cpp's converters write by default), then larger types.
fn mmproj_preference(file: &RepoFile) -> u8 {
    let name = file_name(&file.path).to_ascii_lowercase();
    if name.contains("f16") {
        0
    } else if name.contains("bf16") {
        1
    } else {
        2
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `(stem, index, count)` of a split name `stem-00001-of-00003.gguf`.
fn split_of(path: &str) -> Option<(String, u32, u32)> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (stem, index) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(index) || !digits(count) {
        return None;
    }
    let (index, count) = (index.parse().ok()?, count.parse().ok()?);
    (index >= 1 && index <= count).then(|| (stem.to_owned(), index, count))
}

/// Sorts variants best first: higher nominal precision, then more effective bits per
/// weight (a `Q4_K_M` before a `Q4_K_S`), then the asked repository before
/// derivatives, exact before computed, then by id. Planning picks from the front.
pub fn sort_variants(variants: &mut [Variant]) {
    variants.sort_by(|a, b| {
        b.quantization
            .nominal()
            .cmp(&a.quantization.nominal())
            .then(b.quantization.bits.total_cmp(&a.quantization.bits))
            .then(a.source.cmp(&b.source))
            .then(b.exact().cmp(&a.exact()))
            .then(a.id.cmp(&b.id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> RepoFile {
        RepoFile {
            path: path.to_owned(),
            size,
        }
    }

    #[test]
    fn gguf_files_group_into_variants() {
        let files = [
            file("model-Q8_0-00002-of-00002.gguf", 5),
            file("model-Q8_0-00001-of-00002.gguf", 7),
            file("model-Q4_K_M.gguf", 4),
            file("mmproj-model-f16.gguf", 1),
            file("big/model-Q6_K-00001-of-00003.gguf", 3),
            file("big/model-Q6_K-00003-of-00003.gguf", 3),
        ];
        let (variants, incomplete) = gguf_variants(&files);
        let names: Vec<Vec<&str>> = variants
            .iter()
            .map(|v| v.model.iter().map(|f| f.path.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            [
                vec!["model-Q4_K_M.gguf"],
                vec!["model-Q8_0-00001-of-00002.gguf", "model-Q8_0-00002-of-00002.gguf"],
            ]
        );
        assert_eq!(variants[1].size(), 12);
        assert!(
            variants
                .iter()
                .all(|v| v.mmproj.as_ref().map(|f| f.path.as_str()) == Some("mmproj-model-f16.gguf"))
        );
        assert_eq!(incomplete, ["big/model-Q6_K-*-of-00003.gguf"]);
    }

    #[test]
    fn split_names_need_five_digits_on_both_sides() {
        assert_eq!(split_of("a-00001-of-00002.gguf"), Some(("a".to_owned(), 1, 2)));
        assert_eq!(split_of("a-1-of-2.gguf"), None);
        assert_eq!(split_of("a-00003-of-00002.gguf"), None);
        assert_eq!(split_of("a.gguf"), None);
    }
}
