//! How an [`EngineCommand`] shows in logs and events: a shell line whose secrets are
//! redacted ([`shell_word`] quotes each word as a POSIX shell would need).

use std::fmt;

use super::command::{EngineCommand, REDACTED};

impl fmt::Display for EngineCommand {
    /// The command as a shell line: `VAR=value … program arg …`, with words that a shell
    /// would split or expand in single quotes, and secrets as `VAR=<redacted>`. For logs
    /// and events, not for a shell.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let program = self.program.display().to_string();
        let words = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_word(v)))
            .chain(self.secret_env.keys().map(|k| format!("{k}={REDACTED}")))
            .chain(std::iter::once(shell_word(&program)))
            .chain(self.args.iter().map(|a| shell_word(a)));
        for (i, word) in words.enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(&word)?;
        }
        Ok(())
    }
}

/// `word` as one POSIX shell word: unchanged when a shell would neither split nor expand
/// it, else in single quotes (an empty word too).
pub fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:,=+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}
