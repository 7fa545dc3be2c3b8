//! `Debug` for the messages that carry an engine's key (`StartInstance`,
//! `InstanceStatus`): every field as prost would print it, but the key only as whether
//! there is one, so that a message in a log or a panic never shows it.

use std::fmt;

use crate::agent::v1::{InstanceStatus, StartInstance, start_instance};

/// How a key shows in `Debug`: that there is one, never what it is.
fn key(text: &str) -> &'static str {
    if text.is_empty() { "\"\"" } else { "\"<redacted>\"" }
}

/// An optional key that is there: `Some("<redacted>")` (or `Some("")`).
fn key_some(text: &str) -> &'static str {
    if text.is_empty() {
        "Some(\"\")"
    } else {
        "Some(\"<redacted>\")"
    }
}

/// Writes `text` as is (a `Debug` field whose value is already formatted).
struct Raw(&'static str);

impl fmt::Debug for Raw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for StartInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StartInstance")
            .field("instance", &self.instance)
            .field("gpus", &self.gpus)
            .field("context", &self.context)
            .field("concurrency", &self.concurrency)
            .field("engine_api_key", &Raw(key(&self.engine_api_key)))
            .field("adapters", &self.adapters)
            .field("engine", &self.engine)
            .finish()
    }
}

/// The oneof of `StartInstance` loses its derived `Debug` with the message's.
impl fmt::Debug for start_instance::Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Candle(e) => f.debug_tuple("Candle").field(e).finish(),
            Self::LlamaCpp(e) => f.debug_tuple("LlamaCpp").field(e).finish(),
            Self::Vllm(e) => f.debug_tuple("Vllm").field(e).finish(),
            // A remote endpoint's key is a user's secret: hidden too.
            Self::Remote(e) => f
                .debug_tuple("Remote")
                .field(&format_args!(
                    "RemoteEngine {{ url: {:?}, model: {:?}, api_key: {} }}",
                    e.url,
                    e.model,
                    match e.api_key.as_deref() {
                        None => "None",
                        Some(key) => key_some(key),
                    }
                ))
                .finish(),
            Self::RayNode(e) => f.debug_tuple("RayNode").field(e).finish(),
            Self::LlamaRpc(e) => f.debug_tuple("LlamaRpc").field(e).finish(),
        }
    }
}

impl fmt::Debug for InstanceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstanceStatus")
            .field("instance", &self.instance)
            .field("state", &self.state)
            .field("detail", &self.detail)
            .field("base_url", &self.base_url)
            .field("unix_ms", &self.unix_ms)
            .field("downloaded", &self.downloaded)
            .field("download_total", &self.download_total)
            .field("host_rss", &self.host_rss)
            .field("gpu_memory", &self.gpu_memory)
            .field("restarts", &self.restarts)
            .field("engine_api_key", &Raw(key(&self.engine_api_key)))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_never_show_in_debug() {
        let secret = "5e3c0ffee5e3c0ffee5e3c0ffee5e3c0ffee5e3c0ffee5e3c0ffee5e3c0ffee";
        let start = StartInstance {
            instance: "r1-coder".to_owned(),
            engine_api_key: secret.to_owned(),
            ..StartInstance::default()
        };
        let remote = StartInstance {
            instance: "r1-coder".to_owned(),
            engine: Some(start_instance::Engine::Remote(crate::agent::v1::RemoteEngine {
                url: "https://api.example.org/v1".to_owned(),
                model: "m".to_owned(),
                api_key: Some(secret.to_owned()),
            })),
            ..StartInstance::default()
        };
        let status = InstanceStatus {
            instance: "r1-coder".to_owned(),
            engine_api_key: secret.to_owned(),
            ..InstanceStatus::default()
        };
        for shown in [format!("{start:?}"), format!("{status:#?}"), format!("{remote:?}")] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(shown.contains("r1-coder") && shown.contains("<redacted>"), "{shown}");
        }
        assert!(format!("{:?}", StartInstance::default()).contains("engine_api_key: \"\""));
    }
}
