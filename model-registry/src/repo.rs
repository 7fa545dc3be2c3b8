//! Repository ids, commits and file listings: the values the hub edge resolves and caches,
//! and that the catalog names.
//!
//! Everything here is pure: a [`ResolvedRepo`] is what one `resolve` learnt from the hub
//! (or from the cache), and [`WeightFiles`] sorts its files into the weight formats that
//! planning reads and the pickle files that it refuses.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Error, WeightFormat};

/// The longest repository id the hub accepts, in bytes (`REPO_ID_MAX_LEN` of the Python
/// client).
const MAX_REPO_ID_LEN: usize = 96;

/// A Hugging Face model repository id, `owner/name`, validated as the hub validates ids.
///
/// Validation matters beyond politeness: the id becomes URL path segments and a cache
/// folder name (`models--owner--name`), so `..`, `/` or `--` inside a part are refused.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RepoId {
    id: String,
    slash: usize,
}

impl RepoId {
    /// Parses `owner/name`.
    ///
    /// Errors: [`Error::InvalidRepoId`] naming what is wrong, for a single name without an
    /// owner (legacy ids such as `gpt2` now live under an owner), characters other than
    /// letters, digits, `-`, `_` and `.`, a part that starts or ends with `-` or `.`, or
    /// contains `--` or `..`, and ids longer than the hub allows.
    pub fn parse(id: &str) -> Result<RepoId, Error> {
        let invalid = |reason| Error::InvalidRepoId {
            found: id.to_owned(),
            reason,
        };
        if id.len() > MAX_REPO_ID_LEN {
            return Err(invalid("it is longer than the 96 characters the hub allows"));
        }
        let Some((owner, name)) = id.split_once('/') else {
            return Err(invalid("it has no owner"));
        };
        for part in [owner, name] {
            if part.is_empty() {
                return Err(invalid("the owner and the name must both be non-empty"));
            }
            if part.contains('/') {
                return Err(invalid("it has more than one `/`"));
            }
            if !part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            {
                return Err(invalid("only letters, digits, `-`, `_` and `.` are allowed"));
            }
            if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) || part.contains("--") || part.contains("..")
            {
                return Err(invalid(
                    "a part starts or ends with `-` or `.`, or contains `--` or `..`",
                ));
            }
        }
        Ok(RepoId {
            id: id.to_owned(),
            slash: owner.len(),
        })
    }

    /// The owner (user or organisation).
    pub fn owner(&self) -> &str {
        &self.id[..self.slash]
    }

    /// The repository name.
    pub fn name(&self) -> &str {
        &self.id[self.slash + 1..]
    }

    /// `owner/name`.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The folder name the Hugging Face cache uses for this model: `models--owner--name`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}--{}", self.owner(), self.name())
    }
}

impl fmt::Display for RepoId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.id)
    }
}

impl TryFrom<String> for RepoId {
    type Error = Error;
    fn try_from(id: String) -> Result<Self, Error> {
        RepoId::parse(&id)
    }
}

impl From<RepoId> for String {
    fn from(repo: RepoId) -> String {
        repo.id
    }
}

/// A git commit id: 40 lowercase hexadecimal digits. Everything cached is keyed by one,
/// because what a commit holds never changes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CommitSha(String);

impl CommitSha {
    /// Parses a full commit id; `None` unless it is exactly 40 lowercase hex digits.
    pub fn parse(sha: &str) -> Option<CommitSha> {
        let valid = sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| CommitSha(sha.to_owned()))
    }

    /// The 40 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CommitSha {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl TryFrom<String> for CommitSha {
    type Error = String;
    fn try_from(sha: String) -> Result<Self, String> {
        CommitSha::parse(&sha).ok_or_else(|| format!("`{sha}` is not a 40-hex commit id"))
    }
}

impl From<CommitSha> for String {
    fn from(sha: CommitSha) -> String {
        sha.0
    }
}

/// One file of a repository at a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoFile {
    /// Path inside the repository (`model-00001-of-00030.safetensors`, `gguf/q4.gguf`).
    pub path: String,
    /// Size in bytes, as the hub lists it.
    pub size: u64,
}

/// What `resolve` learnt: the commit a revision points at and the files there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedRepo {
    /// The repository.
    pub repo: RepoId,
    /// The revision asked for (`main`, a tag, or a commit id).
    pub revision: String,
    /// The commit it resolved to.
    pub sha: CommitSha,
    /// Every file at that commit, sorted by path.
    pub files: Vec<RepoFile>,
}

impl ResolvedRepo {
    /// The file at `path`, if the repository has it.
    pub fn file(&self, path: &str) -> Option<&RepoFile> {
        self.files
            .binary_search_by(|file| file.path.as_str().cmp(path))
            .ok()
            .and_then(|index| self.files.get(index))
    }

    /// The weight files, sorted by format. Pure: no pickle policy is applied here (the hub
    /// client's `weight_files` applies it).
    pub fn weight_files(&self) -> WeightFiles {
        WeightFiles::from_files(&self.files)
    }

    /// Sorts the files and checks that every path stays inside the repository, so that
    /// paths can become URLs and cache paths. Used on what the hub and the cache return.
    #[cfg(feature = "hub")]
    pub(crate) fn normalized(mut self) -> Result<ResolvedRepo, String> {
        if let Some(bad) = self
            .files
            .iter()
            .find(|file| !crate::safetensors::is_repo_relative(&file.path))
        {
            return Err(format!(
                "the file list has `{}`, which is not a path inside the repository",
                bad.path
            ));
        }
        self.files.sort_by(|a, b| a.path.cmp(&b.path));
        self.files.dedup_by(|a, b| a.path == b.path);
        Ok(self)
    }
}

/// Name of the index of a sharded safetensors checkpoint.
pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";

/// Extensions of pickle-based weight files (PyTorch `.bin`/`.pt`/`.pth`, Lightning
/// `.ckpt`, raw `.pkl`). Loading them can run arbitrary code, so Skein never plans on them.
const PICKLE_EXTENSIONS: [&str; 5] = [".bin", ".pt", ".pth", ".ckpt", ".pkl"];

/// The weight files of a repository, by format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WeightFiles {
    /// The safetensors files of the main checkpoint (root folder): the `model*.safetensors`
    /// files when there are any (so a `consolidated.safetensors` duplicate in the original
    /// Mistral layout is not counted twice), otherwise every root `.safetensors` file.
    pub safetensors: Vec<RepoFile>,
    /// `model.safetensors.index.json`, when the checkpoint is sharded.
    pub safetensors_index: Option<RepoFile>,
    /// Every `.gguf` file, in any folder: each is a variant of its own.
    pub gguf: Vec<RepoFile>,
    /// Pickle weight files (`.bin`, `.pt`, `.pth`, `.ckpt`, `.pkl`).
    pub pickle: Vec<RepoFile>,
}

impl WeightFiles {
    /// Sorts `files` (any order) into formats.
    pub fn from_files(files: &[RepoFile]) -> WeightFiles {
        let mut weights = WeightFiles::default();
        let mut root_safetensors = Vec::new();
        for file in files {
            let path = file.path.as_str();
            let lower = path.to_ascii_lowercase();
            if lower.ends_with(".safetensors") {
                if !path.contains('/') {
                    root_safetensors.push(file.clone());
                }
            } else if path == SAFETENSORS_INDEX {
                weights.safetensors_index = Some(file.clone());
            } else if lower.ends_with(".gguf") {
                weights.gguf.push(file.clone());
            } else if PICKLE_EXTENSIONS.iter().any(|ext| lower.ends_with(ext)) && !is_training_state(&lower) {
                weights.pickle.push(file.clone());
            }
        }
        let model_files: Vec<RepoFile> = root_safetensors
            .iter()
            .filter(|file| file.path.starts_with("model"))
            .cloned()
            .collect();
        weights.safetensors = if model_files.is_empty() {
            root_safetensors
        } else {
            model_files
        };
        weights
    }

    /// The formats present.
    pub fn formats(&self) -> Vec<WeightFormat> {
        let mut formats = Vec::new();
        if !self.safetensors.is_empty() {
            formats.push(WeightFormat::Safetensors);
        }
        if !self.gguf.is_empty() {
            formats.push(WeightFormat::Gguf);
        }
        formats
    }

    /// True when the only weights are pickle files.
    pub fn pickle_only(&self) -> bool {
        self.safetensors.is_empty() && self.gguf.is_empty() && !self.pickle.is_empty()
    }

    /// Total bytes of the main safetensors checkpoint, as the hub lists the files.
    pub fn safetensors_bytes(&self) -> u64 {
        self.safetensors
            .iter()
            .map(|file| file.size)
            .fold(0, u64::saturating_add)
    }
}

/// Files saved by trainers next to the weights, which are pickles but not weights
/// (`training_args.bin`, optimizer and scheduler states).
fn is_training_state(lower_path: &str) -> bool {
    let name = lower_path.rsplit('/').next().unwrap_or(lower_path);
    matches!(
        name,
        "training_args.bin" | "optimizer.pt" | "scheduler.pt" | "rng_state.pth" | "optimizer.bin" | "scheduler.bin"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_validated_like_the_hub() {
        let repo = RepoId::parse("meta-llama/Meta-Llama-3-8B").unwrap();
        assert_eq!((repo.owner(), repo.name()), ("meta-llama", "Meta-Llama-3-8B"));
        assert_eq!(repo.cache_folder(), "models--meta-llama--Meta-Llama-3-8B");
        for bad in [
            "gpt2", "a/b/c", "/x", "x/", "a/b c", "a/..", "a/-x", "a--b/c", "a/b.", "a/b?c",
        ] {
            let err = RepoId::parse(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidRepoId { .. }), "{bad}: {err}");
        }
        assert_eq!(
            RepoId::parse("gpt2").unwrap_err().to_string(),
            "`gpt2` is not a Hugging Face repository id: it has no owner; help: write it as `owner/name`, \
             for example `meta-llama/Meta-Llama-3-8B`"
        );
    }

    #[test]
    fn commit_ids_are_40_lowercase_hex() {
        assert!(CommitSha::parse(&"a".repeat(40)).is_some());
        assert!(CommitSha::parse(&"A".repeat(40)).is_none());
        assert!(CommitSha::parse(&"a".repeat(39)).is_none());
        assert!(CommitSha::parse("main").is_none());
    }

    fn files(paths: &[&str]) -> Vec<RepoFile> {
        paths
            .iter()
            .map(|path| RepoFile {
                path: (*path).to_owned(),
                size: 10,
            })
            .collect()
    }

    #[test]
    fn weight_files_pick_the_main_checkpoint_and_spot_pickles() {
        let weights = WeightFiles::from_files(&files(&[
            "config.json",
            "consolidated.safetensors",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "original/consolidated.00.pth",
            "training_args.bin",
            "gguf/model-Q4_K_M.gguf",
        ]));
        let names: Vec<&str> = weights.safetensors.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            names,
            ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        );
        assert!(weights.safetensors_index.is_some());
        assert_eq!(weights.gguf.len(), 1);
        assert_eq!(weights.pickle.len(), 1, "training_args.bin is not a weight file");
        assert!(!weights.pickle_only());
        assert_eq!(weights.formats(), [WeightFormat::Safetensors, WeightFormat::Gguf]);

        let pickles = WeightFiles::from_files(&files(&["config.json", "pytorch_model.bin"]));
        assert!(pickles.pickle_only());
        assert!(pickles.formats().is_empty());
    }
}
