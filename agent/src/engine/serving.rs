//! The flags for what an engine serves besides its model's text generation: LoRA
//! adapters on the model ([`LaunchSpec::adapters`]) and embeddings instead of text
//! ([`LaunchSpec::embeddings`]), for llama.cpp and vLLM. Pure.

use super::command::{LaunchError, LaunchSpec, VllmLaunch};

/// The poolings llama.cpp's `--pooling` takes that give one vector per input.
const POOLINGS: [&str; 3] = ["mean", "cls", "last"];

impl LaunchSpec {
    /// llama-server's flags: `--lora-scaled` with every adapter, `--embeddings` (and
    /// `--pooling` when the model's is known) for an embedding model.
    pub(super) fn llama_cpp_serving(&self) -> Result<Vec<String>, LaunchError> {
        let mut args = Vec::new();
        if !self.adapters.is_empty() {
            // Loaded at start at scale 0, so a request that names none gets the base
            // model; a request sets every adapter's scale (`"lora": [{"id": N, "scale":
            // S}, …]`, N its place here). llama.cpp reads the list as a CSV row and
            // each entry as exactly `FNAME:SCALE`.
            let mut scaled = Vec::with_capacity(self.adapters.len());
            for adapter in &self.adapters {
                let path = adapter.path.display().to_string();
                if path.contains([',', ':', '"']) {
                    return Err(self.invalid(
                        "a LoRA adapter's path",
                        path,
                        "a path without `,`, `:` or `\"` (llama.cpp's --lora-scaled reads FNAME:SCALE,…)",
                    ));
                }
                scaled.push(format!("{path}:0"));
            }
            args.extend(["--lora-scaled".to_owned(), scaled.join(",")]);
        }
        if let Some(embeddings) = &self.embeddings {
            // Without `--pooling`, llama.cpp pools as the GGUF file states; a file that
            // states none gives no vector per input, so the plan passes the pooling
            // whenever the repository tells it.
            args.push("--embeddings".to_owned());
            if let Some(pooling) = &embeddings.pooling {
                if !POOLINGS.contains(&pooling.as_str()) {
                    return Err(self.invalid("--pooling", pooling, POOLINGS.join(", ")));
                }
                args.extend(["--pooling".to_owned(), pooling.clone()]);
            }
        }
        Ok(args)
    }

    /// `vllm serve`'s flags: `--enable-lora` with the slots and every adapter under its
    /// name, `--runner pooling` for an embedding model (vLLM reads the pooling from the
    /// repository's sentence-transformers files, and converts a `…ForCausalLM` into an
    /// embedding model itself: `--convert auto`).
    pub(super) fn vllm_serving(&self, v: &VllmLaunch) -> Result<Vec<String>, LaunchError> {
        let mut args = Vec::new();
        if !self.adapters.is_empty() {
            if v.max_loras == 0 || v.max_lora_rank == 0 {
                return Err(self.invalid(
                    "--max-loras and --max-lora-rank",
                    format!("{} and {}", v.max_loras, v.max_lora_rank),
                    "a slot count and rank for the adapters (both at least 1)",
                ));
            }
            // Each adapter under its name, from its downloaded directory; the slots as
            // the plan sized them (the adapters' host cache is vLLM's default, one per
            // slot).
            args.extend([
                "--enable-lora".to_owned(),
                "--max-loras".to_owned(),
                v.max_loras.to_string(),
                "--max-lora-rank".to_owned(),
                v.max_lora_rank.to_string(),
                "--lora-modules".to_owned(),
            ]);
            args.extend(self.adapters.iter().map(|a| format!("{}={}", a.name, a.path.display())));
        }
        if self.embeddings.is_some() {
            args.extend(["--runner".to_owned(), "pooling".to_owned()]);
        }
        Ok(args)
    }
}
