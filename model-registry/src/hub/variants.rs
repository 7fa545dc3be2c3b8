//! Variant discovery: the checkpoints a repository itself offers, and the quantized
//! derivatives the hub's model tree links to it.

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};

use super::cache::Stamped;
use super::client::{HubClient, is_unreachable};
pub use crate::catalog::VariantSource;
use crate::repo::{RepoId, ResolvedRepo};
use crate::{Error, WeightFormat};

/// At most this many quantized derivatives are listed, the most downloaded first.
/// Popular base models have hundreds; the long tail is rarely worth a plan.
pub const MAX_DERIVATIVES: usize = 100;

/// A variant the user names: a repository at a revision, optionally one GGUF file in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VariantPin {
    /// The repository.
    pub repo: RepoId,
    /// The revision; the default branch when `None`.
    pub revision: Option<String>,
    /// One file of it (a GGUF file, or the first split of one); every variant of the
    /// repository when `None`.
    pub file: Option<String>,
}

impl VariantPin {
    /// `owner/name[@revision][:file]`, as `--variant` takes it.
    ///
    /// Errors: [`Error::InvalidRepoId`] for the repository part.
    pub fn parse(text: &str) -> Result<VariantPin, Error> {
        let (head, file) = match text.split_once(':') {
            Some((head, file)) if !file.is_empty() => (head, Some(file.to_owned())),
            Some((head, _)) => (head, None),
            None => (text, None),
        };
        let (repo, revision) = match head.split_once('@') {
            Some((repo, revision)) if !revision.is_empty() => (repo, Some(revision.to_owned())),
            Some((repo, _)) => (repo, None),
            None => (head, None),
        };
        Ok(VariantPin {
            repo: RepoId::parse(repo)?,
            revision,
            file,
        })
    }
}

/// A variant to consider: a repository and, for GGUF, the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VariantCandidate {
    /// The repository holding it.
    pub repo: RepoId,
    /// The GGUF file; `None` for a repository's safetensors checkpoint, and for a
    /// derivative not resolved yet (resolve it and call [`repo_variants`] to list its files).
    pub file: Option<String>,
    /// Its format; `None` for a derivative whose hub tags name no weight format.
    pub format: Option<WeightFormat>,
    /// Bytes on the hub, when known from the file list.
    pub size: Option<u64>,
    /// Where it comes from.
    pub source: VariantSource,
}

/// A quantized derivative as the hub lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Derivative {
    /// Its repository.
    pub repo: RepoId,
    /// Its hub tags (`gguf`, `safetensors`, `4-bit`, `awq`, …).
    pub tags: Vec<String>,
}

impl Derivative {
    /// The weight format its tags name, GGUF first (GGUF repositories are also tagged
    /// with their base model's library).
    pub fn format(&self) -> Option<WeightFormat> {
        let tagged = |tag: &str| self.tags.iter().any(|t| t.eq_ignore_ascii_case(tag));
        if tagged("gguf") {
            Some(WeightFormat::Gguf)
        } else if tagged("safetensors") {
            Some(WeightFormat::Safetensors)
        } else {
            None
        }
    }
}

/// The variants a resolved repository itself offers: its safetensors checkpoint (if
/// any) and each GGUF file. Pickle-only repositories offer none. Pure.
pub fn repo_variants(resolved: &ResolvedRepo) -> Vec<VariantCandidate> {
    let weights = resolved.weight_files();
    let mut variants = Vec::new();
    if !weights.safetensors.is_empty() {
        variants.push(VariantCandidate {
            repo: resolved.repo.clone(),
            file: None,
            format: Some(WeightFormat::Safetensors),
            size: Some(weights.safetensors_bytes()),
            source: VariantSource::ThisRepo,
        });
    }
    variants.extend(weights.gguf.iter().map(|file| VariantCandidate {
        repo: resolved.repo.clone(),
        file: Some(file.path.clone()),
        format: Some(WeightFormat::Gguf),
        size: Some(file.size),
        source: VariantSource::ThisRepo,
    }));
    variants
}

impl HubClient {
    /// The repositories the hub lists as quantized derivatives of `repo`
    /// (`/api/models?filter=base_model:quantized:<repo>`), most downloaded first, at most
    /// [`MAX_DERIVATIVES`]. Cached like a branch resolution (see
    /// [`HubConfig::ref_max_age`](super::HubConfig::ref_max_age)), with the same fallback
    /// to an older answer when the hub is unreachable. Ids the hub returns that
    /// are not valid repository ids are skipped.
    ///
    /// Errors: [`Error::HubOffline`] when offline and never listed, and the errors of a
    /// hub call.
    #[tracing::instrument(skip(self, repo), fields(repo = %repo))]
    pub async fn quantized_derivatives(&self, repo: &RepoId) -> Result<Vec<Derivative>, Error> {
        let path = self.cache().derivatives_path(repo);
        let mut stale = None;
        if let Some(cached) = self.cache().read_json::<Stamped<Vec<Derivative>>>(&path).await {
            if self.config().offline || cached.is_fresh(self.config().ref_max_age) {
                return Ok(cached.value);
            }
            stale = Some(cached.value);
        }
        if self.config().offline {
            return Err(self.offline_miss(repo, "the list of quantized derivatives".to_owned()));
        }
        let listing = async {
            let stream = self
                .hf()
                .list_models()
                .filter(format!("base_model:quantized:{repo}"))
                .sort("downloads")
                .limit(MAX_DERIVATIVES)
                .send()?;
            stream.try_collect::<Vec<_>>().await
        };
        let models = match self
            .network(repo, || "list the quantized derivatives".to_owned(), listing)
            .await
        {
            Ok(models) => models,
            Err(error) if is_unreachable(&error) && stale.is_some() => {
                tracing::warn!(%error, "the hub is unreachable; using the cached list of derivatives");
                return stale.ok_or(error);
            }
            Err(error) => return Err(error),
        };
        let derivatives: Vec<Derivative> = models
            .into_iter()
            .filter_map(|model| match RepoId::parse(&model.id) {
                Ok(id) => Some(Derivative {
                    repo: id,
                    tags: model.tags.unwrap_or_default(),
                }),
                Err(error) => {
                    tracing::warn!(%error, "skipping a derivative the hub listed");
                    None
                }
            })
            .collect();
        self.cache().write_json(&path, &Stamped::now(&derivatives)).await;
        Ok(derivatives)
    }

    /// Every candidate variant: the repository's own ([`repo_variants`]), then its
    /// quantized derivatives, unresolved (their format from their tags).
    ///
    /// Errors: those of [`quantized_derivatives`](Self::quantized_derivatives).
    pub async fn discover_variants(&self, resolved: &ResolvedRepo) -> Result<Vec<VariantCandidate>, Error> {
        let mut variants = repo_variants(resolved);
        let derivatives = self.quantized_derivatives(&resolved.repo).await?;
        variants.extend(derivatives.into_iter().map(|derivative| VariantCandidate {
            format: derivative.format(),
            repo: derivative.repo,
            file: None,
            size: None,
            source: VariantSource::QuantizedDerivative,
        }));
        Ok(variants)
    }
}
