//! SmolLM2 as an embedding model: the real GGUF written again with
//! `llama.pooling_type` = 3 (last token), the way llama.cpp's converter marks a decoder
//! embedding model (Qwen3-Embedding, e5-mistral). llama.cpp then serves it with
//! `--embeddings`; the registry tells it an embedding model by that key.

use std::path::Path;

use candle_core::quantized::gguf_file::Value as GgufValue;

use super::{gguf_only_repo, with_key};
use crate::mock_hub::MockRepo;

/// The repository id of [`embedding_gguf_repo`].
pub const EMBEDDING_GGUF_REPO_ID: &str = "skein-test/SmolLM2-135M-Embedding-GGUF";

/// The width of its vectors (SmolLM2-135M's hidden size).
pub const EMBEDDING_WIDTH: usize = 576;

/// The GGUF-only repository of SmolLM2 marked as an embedding model pooling the last
/// token, the file written under `tmp` once.
pub fn embedding_gguf_repo(tmp: &Path) -> MockRepo {
    let path = with_key(
        &tmp.join("smollm2-embedding.gguf"),
        "llama.pooling_type",
        GgufValue::U32(3),
    );
    gguf_only_repo(
        EMBEDDING_GGUF_REPO_ID,
        &path,
        "SmolLM2-135M-Instruct GGUF as an embedding model",
    )
}
