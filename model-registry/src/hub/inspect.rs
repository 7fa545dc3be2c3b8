//! `inspect`: one model's shape and every variant, from the hub's metadata and headers.

use futures::{StreamExt, TryStreamExt};

use super::client::HubClient;
use super::headers::MAX_CONCURRENT_HEADER_READS;
use super::variants::{VariantPin, VariantSource};
use crate::catalog::{
    GgufVariantFiles, MAX_LISTED_TP_DEGREE, ModelInfo, ShapeSource, SkippedVariant, Variant, gguf_variants,
    sort_variants,
};
use crate::error::error_chain;
use crate::estimate::{ModelShape, WeightGroups, WeightsSource, tp_degrees};
use crate::repo::{RepoId, ResolvedRepo};
use crate::task::{POOLING_CONFIG, SENTENCE_TRANSFORMERS_FILES, TaskSignals};
use crate::{Bytes, Error, ModelConfig, ModelTask, Pooling, Quantization, WeightFormat};

/// Quantized derivatives `inspect` resolves by default, the most downloaded first.
pub const DEFAULT_DERIVATIVES: usize = 10;

const INCOMPLETE_SPLITS: &str = "some splits of this GGUF file are missing from the repository";

/// Derivatives resolved at once.
const CONCURRENT_DERIVATIVES: usize = 4;

/// What [`HubClient::inspect`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectOptions {
    /// Quantized derivatives to resolve and list; 0 lists only the repository's own.
    pub derivatives: usize,
    /// Whether to read the weight headers of derivatives too, making their figures
    /// exact instead of computed (a GGUF header is up to a few MiB, mostly vocabulary).
    pub derivative_headers: bool,
    /// Variants the user pinned, listed besides those discovered; their headers are
    /// always read.
    pub pins: Vec<VariantPin>,
}

impl Default for InspectOptions {
    fn default() -> Self {
        InspectOptions {
            derivatives: DEFAULT_DERIVATIVES,
            derivative_headers: false,
            pins: Vec::new(),
        }
    }
}

/// Errors that stop an inspection: the hub or the cache failed, not a variant.
fn is_fatal(error: &Error) -> bool {
    matches!(
        error,
        Error::Hub { .. }
            | Error::HubTimeout { .. }
            | Error::HubOffline { .. }
            | Error::HubClient { .. }
            | Error::HubCacheRead { .. }
    )
}

impl HubClient {
    /// The model `repo` at `revision`: its shape (from `config.json`, or from a GGUF
    /// file's metadata in a GGUF-only repository), its own checkpoints with bytes from
    /// their headers (exact), and up to [`InspectOptions::derivatives`] quantized
    /// derivatives classified from their file names or `config.json` (bytes computed,
    /// unless [`InspectOptions::derivative_headers`]). Variants that cannot be used are
    /// listed in [`ModelInfo::skipped`] with the reason; a derivative list that cannot be
    /// fetched is a note. Everything read is cached by commit, so a second call makes no
    /// request.
    ///
    /// Errors: those of resolving the repository, reading `config.json` or the headers
    /// of its own weights from the hub; [`Error::PickleOnly`]; [`Error::NoModelShape`];
    /// and the config's validation errors.
    #[tracing::instrument(skip(self, repo, options), fields(repo = %repo))]
    pub async fn inspect(&self, repo: &RepoId, revision: &str, options: &InspectOptions) -> Result<ModelInfo, Error> {
        let resolved = self.resolve(repo, revision).await?;
        let files = self.weight_files(&resolved)?;
        let (ggufs, incomplete) = gguf_variants(&files.gguf);
        let (config, shape_source, task) = self.model_config(&resolved, &ggufs).await?;
        let shape = ModelShape::from_config(&config)?;

        let mut variants = Vec::new();
        let mut skipped: Vec<SkippedVariant> = incomplete
            .into_iter()
            .map(|name| SkippedVariant {
                id: format!("{repo}:{name}"),
                reason: INCOMPLETE_SPLITS.to_owned(),
            })
            .collect();
        let mut notes = Vec::new();

        let own = self.repo_variants(&resolved, Some(&config), &shape, &ggufs, true, VariantSource::ThisRepo);
        for (id, outcome) in own.await {
            match outcome {
                Ok(variant) => variants.push(variant),
                Err(error) if is_fatal(&error) => return Err(error),
                Err(error) => skipped.push(skip(id, &error)),
            }
        }
        if files.safetensors.is_empty() && ggufs.is_empty() && !files.pickle.is_empty() {
            notes.push(
                "only pickle weights (.bin/.pt); they were allowed but are not listed as a variant: \
                 their tensors cannot be read without loading them"
                    .to_owned(),
            );
        }

        if options.derivatives > 0 {
            match self.quantized_derivatives(repo).await {
                Ok(derivatives) => {
                    let take = derivatives.len().min(options.derivatives);
                    if derivatives.len() > take {
                        notes.push(format!(
                            "{} more quantized derivatives on the hub are not listed (raise --derivatives)",
                            derivatives.len() - take
                        ));
                    }
                    let results: Vec<_> = futures::stream::iter(derivatives.into_iter().take(take))
                        .filter(|d| std::future::ready(!options.pins.iter().any(|p| p.repo == d.repo)))
                        .map(|d| {
                            let source = VariantSource::QuantizedDerivative;
                            self.other_repo(d.repo, None, &shape, options.derivative_headers, source)
                        })
                        .buffered(CONCURRENT_DERIVATIVES)
                        .collect()
                        .await;
                    for (found, lost) in results {
                        variants.extend(found);
                        skipped.extend(lost);
                    }
                }
                Err(error) => notes.push(format!("quantized derivatives not listed: {}", error_chain(&error))),
            }
        }

        for pin in &options.pins {
            let revision = pin.revision.clone();
            let (found, lost) = self
                .other_repo(pin.repo.clone(), revision, &shape, true, VariantSource::Pinned)
                .await;
            let matches = |id: &str| match &pin.file {
                Some(file) => {
                    id.strip_prefix(pin.repo.as_str())
                        .and_then(|rest| rest.strip_prefix(':'))
                        == Some(file)
                }
                None => true,
            };
            let before = variants.len();
            variants.extend(found.into_iter().filter(|v| matches(&v.id)));
            skipped.extend(lost.into_iter().filter(|s| matches(&s.id) || !s.id.contains(':')));
            if variants.len() == before && !skipped.iter().any(|s| s.id.starts_with(pin.repo.as_str())) {
                skipped.push(SkippedVariant {
                    id: match &pin.file {
                        Some(file) => format!("{}:{file}", pin.repo),
                        None => pin.repo.to_string(),
                    },
                    reason: "pinned, but the repository has no such weights (for a GGUF pin, name the file, or \
                             the first split of a split file)"
                        .to_owned(),
                });
            }
        }

        sort_variants(&mut variants);
        Ok(ModelInfo {
            repo: resolved.repo.clone(),
            revision: resolved.revision.clone(),
            sha: resolved.sha.clone(),
            shape_source,
            tp_degrees: tp_degrees(&shape, None, MAX_LISTED_TP_DEGREE),
            shape,
            variants,
            skipped,
            notes,
            task,
        })
    }

    /// `config.json`, or the metadata of the first GGUF variant's first file, and the
    /// task they and the repository's sentence-transformers files tell
    /// ([`ModelTask::detect`]).
    async fn model_config(
        &self,
        resolved: &ResolvedRepo,
        ggufs: &[GgufVariantFiles],
    ) -> Result<(ModelConfig, ShapeSource, ModelTask), Error> {
        let sentence_transformers = SENTENCE_TRANSFORMERS_FILES.iter().any(|f| resolved.file(f).is_some());
        // A pooling module that cannot be read or parsed leaves the engine its default.
        let pooling_config: Option<serde_json::Value> = match self.fetch_small(resolved, POOLING_CONFIG).await {
            Ok(bytes) => bytes.and_then(|b| serde_json::from_slice(&b).ok()),
            Err(error) if is_fatal(&error) => return Err(error),
            Err(_) => None,
        };
        let mut signals = TaskSignals {
            config: None,
            sentence_transformers,
            pooling_config: pooling_config.as_ref(),
            gguf_pooling: None,
        };
        if let Some(json) = self.fetch_small(resolved, "config.json").await? {
            let text = String::from_utf8_lossy(&json);
            let config = ModelConfig::from_json(&text)?;
            let value: Option<serde_json::Value> = serde_json::from_str(&text).ok();
            signals.config = value.as_ref();
            return Ok((config, ShapeSource::ConfigJson, ModelTask::detect(&signals)));
        }
        let first = ggufs
            .iter()
            .find_map(|g| g.model.first())
            .ok_or_else(|| Error::NoModelShape {
                repo: resolved.repo.to_string(),
            })?;
        let header = self.gguf_header(resolved, &first.path).await?;
        let config = ModelConfig::from_gguf(&header.header)?;
        signals.gguf_pooling = Pooling::of_gguf(&header.header);
        Ok((
            config,
            ShapeSource::Gguf {
                file: first.path.clone(),
            },
            ModelTask::detect(&signals),
        ))
    }

    /// The variants of one repository: its safetensors checkpoint and each GGUF
    /// variant, each with its id and outcome, from headers or (with `headers` false)
    /// computed from the quantization its config or file name states.
    async fn repo_variants(
        &self,
        resolved: &ResolvedRepo,
        config: Option<&ModelConfig>,
        shape: &ModelShape,
        ggufs: &[GgufVariantFiles],
        headers: bool,
        source: VariantSource,
    ) -> Vec<(String, Result<Variant, Error>)> {
        let mut out = Vec::new();
        let files = resolved.weight_files();
        if let (false, Some(config)) = (files.safetensors.is_empty(), config) {
            let id = resolved.repo.to_string();
            let outcome = self.safetensors_variant(resolved, config, shape, headers, source).await;
            out.push((id, outcome));
        }
        let gguf: Vec<_> = futures::stream::iter(ggufs)
            .map(|group| async move {
                let id = format!("{}:{}", resolved.repo, group.name());
                (id, self.gguf_variant(resolved, shape, group, headers, source).await)
            })
            .buffered(MAX_CONCURRENT_HEADER_READS)
            .collect()
            .await;
        out.extend(gguf);
        out
    }

    async fn safetensors_variant(
        &self,
        resolved: &ResolvedRepo,
        config: &ModelConfig,
        shape: &ModelShape,
        headers: bool,
        source: VariantSource,
    ) -> Result<Variant, Error> {
        let files = resolved.weight_files();
        let stated = Quantization::from_config(config.quantization_config.as_ref(), config.torch_dtype.as_deref())?;
        let weights = if headers {
            let checkpoint = self
                .safetensors_checkpoint(resolved)
                .await?
                .ok_or_else(|| Error::NoModelShape {
                    repo: resolved.repo.to_string(),
                })?;
            let parsed: Vec<_> = checkpoint.files.iter().map(|f| f.header.clone()).collect();
            let mut groups = WeightGroups::resolve(shape, WeightsSource::Safetensors(&parsed))?;
            // The config's `quantization_config` knows group sizes the tensors only
            // imply; without one, the tensors' dtypes are the truth.
            if config.quantization_config.is_some() || groups.quantization.is_none() {
                groups.quantization = stated.or(groups.quantization);
            }
            groups
        } else {
            let quantization = stated.ok_or_else(|| Error::UnsupportedQuantization {
                found: "config.json states neither quantization_config nor torch_dtype".to_owned(),
            })?;
            WeightGroups::resolve(shape, WeightsSource::Computed(quantization))?
        };
        let quantization = weights.quantization.ok_or_else(|| Error::UnsupportedQuantization {
            found: "tensors of no known dtype".to_owned(),
        })?;
        let mut names: Vec<String> = files.safetensors.iter().map(|f| f.path.clone()).collect();
        names.extend(files.safetensors_index.iter().map(|f| f.path.clone()));
        Ok(variant(
            resolved,
            resolved.repo.to_string(),
            names,
            source,
            quantization,
            files.safetensors_bytes(),
            weights,
            shape,
        ))
    }

    async fn gguf_variant(
        &self,
        resolved: &ResolvedRepo,
        shape: &ModelShape,
        group: &GgufVariantFiles,
        headers: bool,
        source: VariantSource,
    ) -> Result<Variant, Error> {
        let named = Quantization::from_gguf_file_name(group.name());
        let weights = if headers {
            let model: Vec<_> = futures::stream::iter(&group.model)
                .map(|f| self.gguf_header(resolved, &f.path))
                .buffered(MAX_CONCURRENT_HEADER_READS)
                .map_ok(|f| f.header)
                .try_collect()
                .await?;
            if let Some(first) = model.first() {
                same_model(shape, first)?;
            }
            let mmproj = match (&group.mmproj, shape.vision) {
                (Some(file), Some(_)) => Some(self.gguf_header(resolved, &file.path).await?.header),
                _ => None,
            };
            let mut groups = WeightGroups::resolve(
                shape,
                WeightsSource::Gguf {
                    model: &model,
                    mmproj: mmproj.as_ref(),
                },
            )?;
            groups.quantization = groups.quantization.or(named);
            groups
        } else {
            let quantization = named.ok_or_else(|| Error::UnsupportedQuantization {
                found: format!("a GGUF file whose name `{}` states no type", group.name()),
            })?;
            WeightGroups::resolve(shape, WeightsSource::Computed(quantization))?
        };
        let quantization = weights.quantization.ok_or_else(|| Error::UnsupportedQuantization {
            found: format!("GGUF `{}` of no known file type", group.name()),
        })?;
        let mut names: Vec<String> = group.model.iter().map(|f| f.path.clone()).collect();
        if let (Some(file), Some(_)) = (&group.mmproj, shape.vision) {
            names.push(file.path.clone());
        }
        Ok(variant(
            resolved,
            format!("{}:{}", resolved.repo, group.name()),
            names,
            source,
            quantization,
            group.size(),
            weights,
            shape,
        ))
    }

    /// The variants of another repository (a derivative or a pin) of the model `shape`
    /// describes, and those skipped. A repository whose own config gives another
    /// parameter count is another model (a fine-tune listed as a quantization) and is
    /// skipped.
    async fn other_repo(
        &self,
        repo: RepoId,
        revision: Option<String>,
        shape: &ModelShape,
        headers: bool,
        source: VariantSource,
    ) -> (Vec<Variant>, Vec<SkippedVariant>) {
        let id = repo.to_string();
        let revision = revision.as_deref().unwrap_or(super::DEFAULT_REVISION);
        let resolved = match self.resolve(&repo, revision).await {
            Ok(resolved) => resolved,
            Err(error) => return (Vec::new(), vec![skip(id, &error)]),
        };
        let files = match self.weight_files(&resolved) {
            Ok(files) => files,
            Err(error) => return (Vec::new(), vec![skip(id, &error)]),
        };
        if files.safetensors.is_empty() && files.gguf.is_empty() {
            let reason = "it has no safetensors or GGUF weights".to_owned();
            return (Vec::new(), vec![SkippedVariant { id, reason }]);
        }
        let config = if files.safetensors.is_empty() {
            None
        } else {
            match self.fetch_small(&resolved, "config.json").await {
                Ok(Some(json)) => match ModelConfig::from_json(&String::from_utf8_lossy(&json)) {
                    Ok(config) => Some(config),
                    Err(error) => return (Vec::new(), vec![skip(id, &error)]),
                },
                Ok(None) => {
                    let reason = "its safetensors checkpoint has no config.json".to_owned();
                    return (Vec::new(), vec![SkippedVariant { id, reason }]);
                }
                Err(error) => return (Vec::new(), vec![skip(id, &error)]),
            }
        };
        if let Some(config) = &config {
            match ModelShape::from_config(config) {
                Ok(own) if own.params.total() == shape.params.total() => {}
                Ok(own) => {
                    let error = Error::OtherModel {
                        detail: format!(
                            "config.json counts {} parameters, not {}",
                            own.params.total(),
                            shape.params.total()
                        ),
                    };
                    return (Vec::new(), vec![skip(id, &error)]);
                }
                Err(error) => return (Vec::new(), vec![skip(id, &error)]),
            }
        }
        let (ggufs, incomplete) = gguf_variants(&files.gguf);
        let mut found = Vec::new();
        let mut lost: Vec<SkippedVariant> = incomplete
            .into_iter()
            .map(|name| SkippedVariant {
                id: format!("{}:{name}", resolved.repo),
                reason: INCOMPLETE_SPLITS.to_owned(),
            })
            .collect();
        for (id, outcome) in self
            .repo_variants(&resolved, config.as_ref(), shape, &ggufs, headers, source)
            .await
        {
            match outcome {
                Ok(variant) => found.push(variant),
                Err(error) => lost.push(skip(id, &error)),
            }
        }
        (found, lost)
    }
}

#[allow(clippy::too_many_arguments)]
fn variant(
    resolved: &ResolvedRepo,
    id: String,
    files: Vec<String>,
    source: VariantSource,
    quantization: Quantization,
    size: u64,
    weights: WeightGroups,
    shape: &ModelShape,
) -> Variant {
    Variant {
        id,
        repo: resolved.repo.clone(),
        sha: resolved.sha.clone(),
        files,
        source,
        quantization,
        size: Bytes::new(size),
        // llama.cpp, which runs GGUF files, splits by layers, not by tensors.
        tp_degrees: match quantization.format {
            WeightFormat::Gguf => Vec::new(),
            WeightFormat::Safetensors => tp_degrees(shape, Some(&quantization), MAX_LISTED_TP_DEGREE)
                .into_iter()
                .filter(|d| d.is_valid())
                .map(|d| d.degree)
                .collect(),
        },
        weights,
    }
}

/// Whether a GGUF header describes the model `shape` describes: its layer count and
/// width.
fn same_model(shape: &ModelShape, header: &crate::GgufHeader) -> Result<(), Error> {
    let differs = |what: &str, found: Option<u64>, expected: u64| match found {
        Some(found) if found != expected => Some(format!("{found} {what}, not {expected}")),
        _ => None,
    };
    let problems: Vec<String> = [
        differs("layers", header.block_count(), shape.layers),
        differs("hidden width", header.embedding_length(), shape.hidden),
    ]
    .into_iter()
    .flatten()
    .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::OtherModel {
            detail: problems.join(", "),
        })
    }
}

fn skip(id: String, error: &Error) -> SkippedVariant {
    SkippedVariant {
        id,
        reason: error_chain(error),
    }
}
