//! `inspect_adapter`: a LoRA adapter from its `adapter_config.json` and the header of its
//! weight file, read with HTTP Range requests like a model's headers.

use super::client::HubClient;
use crate::Error;
use crate::adapter::AdapterError;
use crate::adapter::{ADAPTER_CONFIG, ADAPTER_PICKLE, ADAPTER_SAFETENSORS, AdapterConfig, AdapterInfo};
use crate::repo::{RepoFile, RepoId, ResolvedRepo};

impl HubClient {
    /// The LoRA adapter `repo` at `revision`, without downloading its weights.
    ///
    /// Reads `adapter_config.json` (a small file, through the Hugging Face cache) and
    /// the header of `adapter_model.safetensors` by Range requests
    /// ([`safetensors_header`](Self::safetensors_header)); a repository without a
    /// safetensors adapter is read as a llama.cpp GGUF adapter through
    /// [`gguf_header`](Self::gguf_header) (the file whose name mentions `lora`, else the
    /// first `.gguf` by path), with its `adapter_config.json` when there is one. The
    /// tensors' ranks are checked against each other and against the config. Everything
    /// read is cached by commit, so a second call makes no request.
    ///
    /// Errors: those of [`resolve`](Self::resolve) and of the reads;
    /// [`AdapterError::HubAdapter`] naming the repository and file, with the cause:
    /// [`AdapterError::AdapterConfigJson`], [`AdapterError::AdapterConfigField`] or [`AdapterError::NotLora`]
    /// for the config, [`AdapterError::LoraTensorShape`], [`AdapterError::LoraTensorUnpaired`] or
    /// [`AdapterError::NoLoraTensors`] for the tensors, [`AdapterError::GgufNotAdapter`] for a GGUF that
    /// is no LoRA adapter; [`Error::HubHeader`] for a header its parser refuses (a
    /// hostile header length among them); [`AdapterError::AdapterConfigMissing`] for
    /// safetensors weights without a config; [`AdapterError::NoAdapterWeights`] for a
    /// repository with neither a safetensors nor a GGUF adapter.
    pub async fn inspect_adapter(&self, repo: &RepoId, revision: &str) -> Result<AdapterInfo, Error> {
        self.inspect_adapter_file(repo, revision, None).await
    }

    /// [`inspect_adapter`](Self::inspect_adapter), reading the GGUF adapter `file` when
    /// one is named (a repository of several GGUF adapters).
    ///
    /// Errors: those of `inspect_adapter`; [`Error::HubFileMissing`] when the
    /// repository has no such file.
    #[tracing::instrument(skip(self, repo), fields(repo = %repo))]
    pub async fn inspect_adapter_file(
        &self,
        repo: &RepoId,
        revision: &str,
        file: Option<&str>,
    ) -> Result<AdapterInfo, Error> {
        let resolved = self.resolve(repo, revision).await?;
        if let Some(file) = file
            && resolved.file(file).is_none()
        {
            return Err(Error::HubFileMissing {
                repo: resolved.repo.to_string(),
                sha: resolved.sha.to_string(),
                file: file.to_owned(),
            });
        }
        let pinned_gguf = file.filter(|f| f.to_ascii_lowercase().ends_with(".gguf"));
        let config = match self.fetch_small(&resolved, ADAPTER_CONFIG).await? {
            Some(json) => Some(
                AdapterConfig::from_json(&json).map_err(|source| adapter_error(&resolved, ADAPTER_CONFIG, source))?,
            ),
            None => None,
        };

        if pinned_gguf.is_none() && resolved.file(ADAPTER_SAFETENSORS).is_some() {
            let Some(config) = config else {
                return Err(AdapterError::AdapterConfigMissing {
                    repo: resolved.repo.to_string(),
                    sha: resolved.sha.to_string(),
                    weights: ADAPTER_SAFETENSORS.to_owned(),
                }
                .into());
            };
            let file = self.safetensors_header(&resolved, ADAPTER_SAFETENSORS).await?;
            return AdapterInfo::from_peft(&resolved, config, ADAPTER_SAFETENSORS, &file.header)
                .map_err(|source| adapter_error(&resolved, ADAPTER_SAFETENSORS, source));
        }

        let Some((chosen, others)) = gguf_adapter_file(&resolved, pinned_gguf) else {
            return Err(AdapterError::NoAdapterWeights {
                repo: resolved.repo.to_string(),
                sha: resolved.sha.to_string(),
                has_config: config.is_some(),
                pickle: resolved.file(ADAPTER_PICKLE).is_some(),
            }
            .into());
        };
        let path = chosen.path.clone();
        let file = self.gguf_header(&resolved, &path).await?;
        let mut info = AdapterInfo::from_gguf(&resolved, &path, &file.header, config)
            .map_err(|source| adapter_error(&resolved, &path, source))?;
        if !others.is_empty() {
            info.notes.push(format!(
                "read `{path}`; the repository has other GGUF files too ({})",
                others.join(", ")
            ));
        }
        Ok(info)
    }
}

/// The GGUF file to read as the adapter: `pinned`, else the first by path whose name
/// mentions `lora`, else the first by path; and the paths of the others.
fn gguf_adapter_file<'r>(resolved: &'r ResolvedRepo, pinned: Option<&str>) -> Option<(&'r RepoFile, Vec<&'r str>)> {
    let ggufs: Vec<&RepoFile> = resolved
        .files
        .iter()
        .filter(|file| file.path.to_ascii_lowercase().ends_with(".gguf"))
        .collect();
    let chosen = match pinned {
        Some(pinned) => ggufs.iter().find(|file| file.path == pinned).copied()?,
        None => ggufs
            .iter()
            .find(|file| file.path.to_ascii_lowercase().contains("lora"))
            .or_else(|| ggufs.first())
            .copied()?,
    };
    let others = ggufs
        .iter()
        .filter(|file| file.path != chosen.path)
        .map(|file| file.path.as_str())
        .collect();
    Some((chosen, others))
}

fn adapter_error(resolved: &ResolvedRepo, file: &str, source: Error) -> Error {
    AdapterError::HubAdapter {
        repo: resolved.repo.to_string(),
        file: file.to_owned(),
        source: Box::new(source),
    }
    .into()
}
