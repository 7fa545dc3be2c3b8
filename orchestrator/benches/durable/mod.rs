//! What the durable-write benchmarks share: a session on a remote endpoint, one round's
//! figures, and the median round.
#![allow(dead_code)] // Each benchmark uses part of it.

use std::time::Duration;

use skein_orchestrator::session::SessionRecord;

/// One round: writes per second and the latency percentiles of one write.
pub struct Round {
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Whether the round stalled (no write completed for a while).
    pub stalled: bool,
}

impl Round {
    /// The figures of `latencies` (one per write) over `elapsed`.
    pub fn of(mut latencies: Vec<Duration>, elapsed: Duration, stalled: bool) -> Round {
        latencies.sort();
        let at = |q: f64| {
            latencies
                .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        Round {
            per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            stalled,
        }
    }
}

/// The round of median throughput.
pub fn median(mut rounds: Vec<Round>) -> Round {
    rounds.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
    rounds.swap_remove(rounds.len() / 2)
}

/// A session of the user `bench` on a remote endpoint, with no messages.
pub fn session(id: &str) -> SessionRecord {
    skein_orchestrator::session::fixture(id, "bench")
}
