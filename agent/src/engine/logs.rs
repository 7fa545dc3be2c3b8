//! An instance's log: every line its engine prints on stdout or stderr, appended to
//! `LOGS_DIR/INSTANCE.log` across restarts (a marker line opens each start) and kept in
//! a bounded in-memory ring, so recent lines are readable without touching the disk,
//! also after the instance stopped.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use tokio::fs::{File, OpenOptions};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tracing::warn;

/// Lines kept in memory per instance; older ones are only in the file.
pub const LOG_RING_LINES: usize = 2_000;

/// The log of one instance, shared by its output readers and the supervisor's callers.
#[derive(Debug)]
pub(crate) struct InstanceLog {
    path: PathBuf,
    ring: Mutex<Ring>,
    /// Appends go through one handle so lines from stdout and stderr do not interleave
    /// mid-line; `None` when the file cannot be opened (the ring still works).
    file: tokio::sync::Mutex<Option<File>>,
}

#[derive(Debug, Default)]
struct Ring {
    lines: VecDeque<String>,
    /// Lines pushed since the log was created (the ring's position in the whole log).
    pushed: u64,
}

/// A point in the log: where the current start began, to show only its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogMark(u64);

impl InstanceLog {
    /// The log at `path` (created or appended to when the first line comes).
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            ring: Mutex::new(Ring::default()),
            file: tokio::sync::Mutex::new(None),
        }
    }

    /// The file the lines are appended to.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the file for appending, creating it and its directory.
    pub(crate) async fn open(&self) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let file = OpenOptions::new().create(true).append(true).open(&self.path).await?;
        *self.file.lock().await = Some(file);
        Ok(())
    }

    /// Appends a marker line that opens a start, and returns the mark after it.
    pub(crate) async fn start_marker(&self, line: String) -> LogMark {
        self.push(line).await;
        self.mark()
    }

    /// The position after the last line.
    pub(crate) fn mark(&self) -> LogMark {
        LogMark(self.ring.lock().unwrap_or_else(PoisonError::into_inner).pushed)
    }

    /// Appends one line to the ring and the file.
    pub(crate) async fn push(&self, line: String) {
        let mut bytes = line.clone().into_bytes();
        bytes.push(b'\n');
        {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            if ring.lines.len() == LOG_RING_LINES {
                ring.lines.pop_front();
            }
            ring.lines.push_back(line);
            ring.pushed += 1;
        }
        let mut file = self.file.lock().await;
        if let Some(f) = file.as_mut() {
            // tokio's file writes complete in the background: flush so the line is in
            // the file when `push` returns.
            let written = match f.write_all(&bytes).await {
                Ok(()) => f.flush().await,
                Err(e) => Err(e),
            };
            if let Err(error) = written {
                warn!(path = %self.path.display(), %error, "engine log not writable; keeping lines in memory only");
                *file = None;
            }
        }
    }

    /// The last `n` lines (fewer when the ring holds fewer).
    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        ring.lines
            .iter()
            .skip(ring.lines.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// The last `n` lines after `mark` (this start's lines, without its marker).
    pub(crate) fn tail_since(&self, mark: LogMark, n: usize) -> Vec<String> {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        let since = usize::try_from(ring.pushed.saturating_sub(mark.0)).unwrap_or(usize::MAX);
        let n = n.min(since);
        ring.lines
            .iter()
            .skip(ring.lines.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// Reads `output` line by line into the log until it closes. Bytes that are not
    /// UTF-8 are replaced; carriage returns (progress bars) end a line too.
    pub(crate) async fn capture(&self, output: impl AsyncRead + Unpin) {
        let mut reader = BufReader::new(output);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf).await {
                Ok(0) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&buf);
                    for line in text.trim_end_matches(['\n', '\r']).split('\r') {
                        self.push(line.to_owned()).await;
                    }
                }
                Err(error) => {
                    warn!(path = %self.path.display(), %error, "engine output unreadable; capture stopped");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ring_keeps_the_last_lines_and_marks_a_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = InstanceLog::new(dir.path().join("x.log"));
        log.open().await.expect("open");
        for i in 0..LOG_RING_LINES + 5 {
            log.push(format!("line {i}")).await;
        }
        assert_eq!(
            log.tail(2),
            [
                format!("line {}", LOG_RING_LINES + 3),
                format!("line {}", LOG_RING_LINES + 4)
            ]
        );
        let mark = log.start_marker("== start 2".to_owned()).await;
        assert!(log.tail_since(mark, 5).is_empty());
        log.capture(&b"first\r\nsecond\rthird\n\xffend"[..]).await;
        assert_eq!(log.tail_since(mark, 10), ["first", "second", "third", "\u{fffd}end"]);
        let file = std::fs::read_to_string(log.path()).expect("the file");
        assert!(file.starts_with("line 0\n") && file.ends_with("== start 2\nfirst\nsecond\nthird\n\u{fffd}end\n"));
    }
}
