//! Hub settings from the environment, as the Python client reads them, with overrides.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The public hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// How long one hub call (an API request, a download, a range read) may take.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Retries of a hub request after a transient failure (no connection, a 5xx or 429
/// answer), with exponential backoff from 200 ms: `hf-hub`'s default.
pub const DEFAULT_MAX_RETRIES: usize = 5;

/// How long a cached `revision → commit` answer for a branch or tag is trusted before
/// the hub is asked again. A commit id never needs asking again. A day keeps repeated
/// plans offline and instant while still noticing new uploads; set it to zero to always
/// ask (the cache is still used when offline).
pub const DEFAULT_REF_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);

/// Files larger than this are downloaded in HTTP Range requests of this size, a few at a
/// time, as hf-hub and the Python client do: a CDN serving files of many gigabytes
/// expects ranges, and a dropped connection costs one range, not the whole file.
pub const DEFAULT_DOWNLOAD_CHUNK_BYTES: u64 = 64 << 20;

/// A hub access token. It is never printed: `Debug` shows `<redacted>` and there is no
/// `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct HubToken(String);

impl HubToken {
    /// Wraps a token; `None` when it is empty or blank (an unset variable written as
    /// `HF_TOKEN=`).
    pub fn new(token: impl Into<String>) -> Option<HubToken> {
        let token = token.into().trim().to_owned();
        (!token.is_empty()).then_some(HubToken(token))
    }

    /// The secret itself, for the `Authorization` header only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for HubToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HubToken(<redacted>)")
    }
}

/// Everything the hub client needs to know. Build it with
/// [`HubConfig::from_env`] (what the CLI does) and adjust fields, or through
/// [`HubClientBuilder`](super::HubClientBuilder).
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Base URL of the hub: `HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`].
    pub endpoint: String,
    /// Access token for gated and private repositories: `HF_TOKEN`, else the file at
    /// `HF_TOKEN_PATH`, else `$HF_HOME/token` (what `huggingface-cli login` writes); none
    /// when `HF_HUB_DISABLE_IMPLICIT_TOKEN` is set.
    pub token: Option<HubToken>,
    /// The Hugging Face cache: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else
    /// `$HF_HOME/hub`, where `HF_HOME` defaults to `$XDG_CACHE_HOME/huggingface`, else
    /// `~/.cache/huggingface`. Small files go where the Python client puts them; Skein's
    /// own metadata cache is in its `skein/` folder.
    pub cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE` (`1`, `ON`, `YES` or `TRUE`): answer from the cache only and never
    /// touch the network.
    pub offline: bool,
    /// Allow repositories whose only weights are pickle files (refused by default,
    /// since loading a pickle can run arbitrary code).
    pub allow_pickle: bool,
    /// Limit on each hub call, retries included.
    pub request_timeout: Duration,
    /// Retries of a request after a transient failure; see [`DEFAULT_MAX_RETRIES`].
    pub max_retries: usize,
    /// How long a cached branch or tag resolution is trusted; see [`DEFAULT_REF_MAX_AGE`].
    pub ref_max_age: Duration,
    /// Files larger than this are downloaded in Range requests of this size; see
    /// [`DEFAULT_DOWNLOAD_CHUNK_BYTES`]. Zero counts as one byte.
    pub download_chunk_bytes: u64,
}

impl HubConfig {
    /// Settings from the process environment.
    pub fn from_env() -> HubConfig {
        HubConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// Settings from an environment given as a lookup function, so that they can be
    /// computed (and tested) without touching the process environment. Reads the token
    /// file when no `HF_TOKEN` is given.
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> HubConfig {
        let var = |name: &str| env(name).filter(|value| !value.is_empty());
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let cache = var("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
                var("HOME")
                    .map(|home| Path::new(&home).join(".cache"))
                    .unwrap_or_else(|| PathBuf::from(".cache"))
            });
            cache.join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token = if var("HF_HUB_DISABLE_IMPLICIT_TOKEN").is_some_and(|value| is_true(&value)) {
            None
        } else {
            var("HF_TOKEN").and_then(HubToken::new).or_else(|| {
                let path = var("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| hf_home.join("token"));
                // A missing or unreadable token file means no token, as in the Python client.
                std::fs::read_to_string(path).ok().and_then(HubToken::new)
            })
        };
        HubConfig {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
            token,
            cache_dir,
            offline: var("HF_HUB_OFFLINE").is_some_and(|value| is_true(&value)),
            allow_pickle: false,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            ref_max_age: DEFAULT_REF_MAX_AGE,
            download_chunk_bytes: DEFAULT_DOWNLOAD_CHUNK_BYTES,
        }
    }
}

/// The Python client's truth values for boolean variables.
fn is_true(value: &str) -> bool {
    matches!(value.trim().to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> HubConfig {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        HubConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_follow_the_python_client() {
        let cfg = config(&[("HOME", "/home/ada")]);
        assert_eq!(cfg.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(cfg.cache_dir, Path::new("/home/ada/.cache/huggingface/hub"));
        assert!(!cfg.offline);
        assert!(!cfg.allow_pickle);

        let cfg = config(&[("HOME", "/home/ada"), ("XDG_CACHE_HOME", "/xdg")]);
        assert_eq!(cfg.cache_dir, Path::new("/xdg/huggingface/hub"));
        let cfg = config(&[("HF_HOME", "/hf"), ("XDG_CACHE_HOME", "/xdg")]);
        assert_eq!(cfg.cache_dir, Path::new("/hf/hub"));
        let cfg = config(&[
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/cache"),
            ("HUGGINGFACE_HUB_CACHE", "/old"),
        ]);
        assert_eq!(cfg.cache_dir, Path::new("/cache"));
        let cfg = config(&[("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/old")]);
        assert_eq!(cfg.cache_dir, Path::new("/old"));
        let cfg = config(&[("HF_ENDPOINT", "http://127.0.0.1:9")]);
        assert_eq!(cfg.endpoint, "http://127.0.0.1:9");
    }

    #[test]
    fn offline_takes_the_python_truth_values() {
        for yes in ["1", "ON", "yes", "True"] {
            assert!(config(&[("HF_HUB_OFFLINE", yes)]).offline, "{yes}");
        }
        for no in ["0", "", "off", "no", "false"] {
            assert!(!config(&[("HF_HUB_OFFLINE", no)]).offline, "{no}");
        }
    }

    #[test]
    fn tokens_come_from_the_variable_or_the_file_and_are_never_printed() {
        let home = tempfile::tempdir().unwrap();
        let hf_home = home.path().to_str().unwrap();
        assert!(config(&[("HF_HOME", hf_home)]).token.is_none());

        std::fs::write(home.path().join("token"), "hf_from_file\n").unwrap();
        let cfg = config(&[("HF_HOME", hf_home)]);
        assert_eq!(cfg.token.as_ref().map(HubToken::expose), Some("hf_from_file"));

        let cfg = config(&[("HF_HOME", hf_home), ("HF_TOKEN", "hf_secret_value")]);
        assert_eq!(cfg.token.as_ref().map(HubToken::expose), Some("hf_secret_value"));
        let printed = format!("{cfg:?}");
        assert!(!printed.contains("hf_secret_value"), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");

        let cfg = config(&[
            ("HF_HOME", hf_home),
            ("HF_TOKEN", "x"),
            ("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1"),
        ]);
        assert!(cfg.token.is_none());
    }
}
