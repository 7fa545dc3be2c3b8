//! The serving figures of model instances, measured where requests pass: every chat
//! request the orchestrator sends to an engine (a session's turn, an OpenAI-compatible
//! completion, a run's step) is counted while in flight and timed when it ends. Reflexes
//! read them as `agent.*` over the instances serving an agent ([`AgentReading`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::base::lock;

/// Answers whose latency counts towards `latency_p95_ms`.
pub const LATENCY_WINDOW: Duration = Duration::from_secs(30);
/// Answers whose tokens count towards `tokens_per_s`.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);
/// A session counts towards `sessions` this long after its last turn.
pub const SESSION_WINDOW: Duration = Duration::from_secs(300);
/// Answers kept per instance (the oldest go first beyond this).
const KEPT: usize = 4096;

#[derive(Default)]
struct Figures {
    in_flight: u32,
    /// `(when it ended, latency ms, tokens generated)`, oldest first.
    done: VecDeque<(Instant, f64, u64)>,
    /// Session → its last turn here.
    sessions: HashMap<String, Instant>,
}

/// The key an agent served by a remote endpoint counts its requests under, in place
/// of an instance's name: `run/agent` (no instance name holds a `/`).
pub fn endpoint_key(run: &str, agent: &str) -> String {
    format!("{run}/{agent}")
}

/// The key a request counts under: the instance it went to, else, for a remote
/// endpoint serving a run's agent (`endpoint_of`: run and agent), [`endpoint_key`];
/// `None` for a request counted nowhere (a model named alone on an endpoint).
pub fn counted_under(instance: Option<&str>, endpoint_of: Option<(&str, &str)>) -> Option<String> {
    match (instance, endpoint_of) {
        (Some(instance), _) => Some(instance.to_owned()),
        (None, Some((run, agent))) => Some(endpoint_key(run, agent)),
        (None, None) => None,
    }
}

/// An agent's serving figures (`agent.*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct AgentReading {
    /// Requests waiting for or in its instances.
    pub queue_depth: f64,
    /// 95th percentile of its answers' latency, milliseconds; `None` (absent) when
    /// nothing was answered in the window.
    pub latency_p95_ms: Option<f64>,
    /// Tokens generated per second.
    pub tokens_per_s: f64,
    /// Sessions bound to it.
    pub sessions: f64,
}

/// Figures of every instance (and endpoint agent, [`endpoint_key`]). Cheap to clone.
#[derive(Clone, Default)]
pub struct Load {
    figures: Arc<Mutex<HashMap<String, Figures>>>,
}

impl std::fmt::Debug for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Load").finish_non_exhaustive()
    }
}

/// A request in flight on an instance; counted until it is dropped. [`InFlight::done`]
/// records its latency and tokens.
#[must_use = "the request counts as in flight until this is dropped"]
pub struct InFlight {
    load: Load,
    instance: String,
    started: Instant,
}

impl InFlight {
    /// The request was answered with `tokens` generated.
    pub fn done(self, tokens: u64) {
        let now = Instant::now();
        let latency = now.duration_since(self.started).as_secs_f64() * 1000.0;
        let mut figures = lock(&self.load.figures);
        let entry = figures.entry(self.instance.clone()).or_default();
        if entry.done.len() == KEPT {
            entry.done.pop_front();
        }
        entry.done.push_back((now, latency, tokens));
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(entry) = lock(&self.load.figures).get_mut(&self.instance) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
        }
    }
}

impl Load {
    /// A request to `instance` begins (for `session`, if it is a session's turn).
    pub fn begin(&self, instance: &str, session: Option<&str>) -> InFlight {
        let now = Instant::now();
        let mut figures = lock(&self.figures);
        let entry = figures.entry(instance.to_owned()).or_default();
        entry.in_flight += 1;
        if let Some(session) = session {
            entry.sessions.insert(session.to_owned(), now);
            if entry.sessions.len() > KEPT {
                entry
                    .sessions
                    .retain(|_, last| now.duration_since(*last) < SESSION_WINDOW);
            }
        }
        InFlight {
            load: self.clone(),
            instance: instance.to_owned(),
            started: now,
        }
    }

    /// Forgets an instance that stopped.
    pub fn forget(&self, instance: &str) {
        lock(&self.figures).remove(instance);
    }

    /// The figures of `instances` together, at `now`: requests in flight, the 95th
    /// percentile of the latency of answers in the last [`LATENCY_WINDOW`], tokens per
    /// second over the last [`RATE_WINDOW`], sessions with a turn in the last
    /// [`SESSION_WINDOW`]. An endpoint agent's requests count under
    /// [`endpoint_key`].
    pub fn reading<'a>(&self, instances: impl IntoIterator<Item = &'a str>, now: Instant) -> AgentReading {
        let figures = lock(&self.figures);
        let mut queue = 0u32;
        let mut latencies = Vec::new();
        let mut tokens = 0u64;
        let mut sessions = 0usize;
        for instance in instances {
            let Some(f) = figures.get(instance) else { continue };
            queue += f.in_flight;
            for &(at, latency, generated) in f.done.iter().rev() {
                let age = now.saturating_duration_since(at);
                if age > LATENCY_WINDOW {
                    break;
                }
                latencies.push(latency);
                if age <= RATE_WINDOW {
                    tokens += generated;
                }
            }
            sessions += f
                .sessions
                .values()
                .filter(|last| now.saturating_duration_since(**last) < SESSION_WINDOW)
                .count();
        }
        AgentReading {
            queue_depth: f64::from(queue),
            latency_p95_ms: percentile(&mut latencies, 0.95),
            tokens_per_s: tokens as f64 / RATE_WINDOW.as_secs_f64(),
            sessions: sessions as f64,
        }
    }
}

/// The `q` quantile of `values` (nearest rank), `None` when there are none.
fn percentile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_count_requests_in_flight_latency_tokens_and_sessions() {
        let load = Load::default();
        let before = Instant::now();
        let a = load.begin("i-a", Some("s1"));
        let b = load.begin("i-b", Some("s2"));
        let _c = load.begin("i-a", Some("s1"));
        let now = Instant::now();
        let reading = load.reading(["i-a", "i-b"], now);
        assert_eq!(reading.queue_depth, 3.0);
        assert_eq!(reading.sessions, 2.0);
        // Nothing answered yet: no latency, not a latency of 0.
        assert_eq!(reading.latency_p95_ms, None);
        std::thread::sleep(Duration::from_millis(20));
        a.done(50);
        b.done(30);
        let whole_ms = before.elapsed().as_secs_f64() * 1000.0;
        let reading = load.reading(["i-a", "i-b"], Instant::now());
        assert_eq!(reading.queue_depth, 1.0);
        assert_eq!(reading.tokens_per_s, 8.0);
        // Each answer took at least the 20 ms slept and at most the whole test so far,
        // in milliseconds: timed from its own begin.
        let p95 = reading.latency_p95_ms.expect("two answers in the window");
        assert!((20.0..=whole_ms).contains(&p95), "p95 {p95} ms, whole {whole_ms} ms");
        assert_eq!(load.reading(["i-b"], Instant::now()).queue_depth, 0.0);
        // Old answers leave the windows.
        let later = Instant::now() + LATENCY_WINDOW + Duration::from_secs(1);
        assert_eq!(load.reading(["i-a", "i-b"], later).tokens_per_s, 0.0);
    }

    /// An answer of `latency_ms` on `instance` that ended `at`, as [`InFlight::done`]
    /// records it (answers must come oldest first).
    fn answered(load: &Load, instance: &str, at: Instant, latency_ms: f64) {
        let mut figures = lock(&load.figures);
        figures
            .entry(instance.to_owned())
            .or_default()
            .done
            .push_back((at, latency_ms, 1));
    }

    #[test]
    fn the_p95_latency_is_over_the_answers_of_the_window_on_every_instance() {
        let load = Load::default();
        let start = Instant::now();
        let now = start + LATENCY_WINDOW + Duration::from_secs(1);
        // Outside the window at `now`; counted, it would make the p95 20 ms.
        answered(&load, "i-a", start, 1000.0);
        for ms in 1..=10 {
            answered(&load, "i-a", now, f64::from(ms));
            answered(&load, "i-b", now, f64::from(ms + 10));
        }
        // 1 to 20 ms: the 19th of 20 (nearest rank).
        assert_eq!(load.reading(["i-a", "i-b"], now).latency_p95_ms, Some(19.0));
        // 1 to 10 ms: the 10th of 10.
        assert_eq!(load.reading(["i-a"], now).latency_p95_ms, Some(10.0));
        // Later, every answer is out of the window: none, not 0.
        let later = now + LATENCY_WINDOW + Duration::from_secs(1);
        assert_eq!(load.reading(["i-a", "i-b"], later).latency_p95_ms, None);
    }

    #[test]
    fn the_percentile_is_the_nearest_rank() {
        let mut values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut values, 0.95), Some(95.0));
        assert_eq!(percentile(&mut [7.0], 0.95), Some(7.0));
        assert_eq!(percentile(&mut [], 0.95), None);
    }
}
