//! The OpenAI wire format (shared with the orchestrator in `skein_proto::openai`) and
//! what the engine adds to it: the usage of one of its completions.

pub use skein_proto::openai::*;

use crate::engine::Completion;

/// The usage of a completion.
pub fn usage_of(completion: &Completion) -> Usage {
    Usage {
        prompt_tokens: completion.prompt_tokens,
        completion_tokens: completion.completion_tokens,
        total_tokens: completion.prompt_tokens + completion.completion_tokens,
    }
}
