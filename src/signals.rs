//! The signals `skein agent` answers, as departures of its node: SIGUSR1 drains it (a
//! Slurm job's `--signal` warning before its time limit), SIGTERM and SIGINT make it
//! leave (a Slurm job's end or `scancel`, a service manager's stop, Ctrl-C). And the
//! ones `skein server` answers ([`StopSignals`]): SIGTERM and SIGINT stop it
//! gracefully.

use anyhow::Context;
use skein_agent::daemon::Departure;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// What the node's departures say about why: the Slurm job, when there is one.
#[derive(Debug, Clone, Default)]
pub struct Why {
    /// The Slurm job id.
    pub job: Option<String>,
    /// The job's end, Unix seconds, when known.
    pub end_unix_s: Option<i64>,
}

/// The agent's signal handlers.
pub struct Signals {
    term: Signal,
    int: Signal,
    usr1: Signal,
    why: Why,
}

impl Signals {
    /// Handlers for SIGTERM, SIGINT and SIGUSR1 (installed now: from here on they no
    /// longer end the process). Needs a tokio runtime.
    pub fn install(why: Why) -> anyhow::Result<Signals> {
        let handler =
            |kind: SignalKind, name: &str| signal(kind).with_context(|| format!("cannot install a handler for {name}"));
        Ok(Signals {
            term: handler(SignalKind::terminate(), "SIGTERM")?,
            int: handler(SignalKind::interrupt(), "SIGINT")?,
            usr1: handler(SignalKind::user_defined1(), "SIGUSR1")?,
            why,
        })
    }

    /// The next departure a signal asks for.
    pub async fn next(&mut self) -> Departure {
        tokio::select! {
            _ = self.term.recv() => departure(&self.why, Received::Term),
            _ = self.int.recv() => departure(&self.why, Received::Int),
            _ = self.usr1.recv() => departure(&self.why, Received::Usr1),
        }
    }
}

/// The signals that stop `skein server`: SIGTERM (a service manager's stop, `kill`) and
/// SIGINT (Ctrl-C).
pub struct StopSignals {
    term: Signal,
    int: Signal,
}

impl StopSignals {
    /// Handlers for SIGTERM and SIGINT, installed now (from here on they no longer end
    /// the process at once). Needs a tokio runtime.
    pub fn install() -> anyhow::Result<StopSignals> {
        let handler =
            |kind: SignalKind, name: &str| signal(kind).with_context(|| format!("cannot install a handler for {name}"));
        Ok(StopSignals {
            term: handler(SignalKind::terminate(), "SIGTERM")?,
            int: handler(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    /// Returns the name of the first of them to arrive.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// A signal the agent answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// SIGTERM.
    Term,
    /// SIGINT.
    Int,
    /// SIGUSR1.
    Usr1,
}

/// The departure signal `received` asks for, and why (pure).
pub fn departure(why: &Why, received: Received) -> Departure {
    let job = why.job.as_deref();
    match (received, job) {
        (Received::Usr1, _) => Departure::Drain {
            reason: match job {
                Some(job) => format!("slurm job {job} ends soon (SIGUSR1)"),
                None => "the agent was asked to drain (SIGUSR1)".to_owned(),
            },
            deadline_unix_ms: why.end_unix_s.and_then(|s| s.checked_mul(1000)),
        },
        (Received::Term, Some(job)) => Departure::Leave {
            reason: format!("slurm job {job} ended or was cancelled (SIGTERM)"),
        },
        (Received::Term, None) => Departure::Leave {
            reason: "the agent was stopped (SIGTERM)".to_owned(),
        },
        (Received::Int, _) => Departure::Leave {
            reason: "the agent was stopped (SIGINT)".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_signals_drain_then_leave() {
        let why = Why {
            job: Some("42".to_owned()),
            end_unix_s: Some(1_767_225_600),
        };
        assert_eq!(
            departure(&why, Received::Usr1),
            Departure::Drain {
                reason: "slurm job 42 ends soon (SIGUSR1)".to_owned(),
                deadline_unix_ms: Some(1_767_225_600_000),
            }
        );
        assert_eq!(
            departure(&why, Received::Term),
            Departure::Leave {
                reason: "slurm job 42 ended or was cancelled (SIGTERM)".to_owned()
            }
        );
        let plain = Why::default();
        assert_eq!(
            departure(&plain, Received::Int),
            Departure::Leave {
                reason: "the agent was stopped (SIGINT)".to_owned()
            }
        );
        assert!(matches!(
            departure(&plain, Received::Usr1),
            Departure::Drain {
                deadline_unix_ms: None,
                ..
            }
        ));
    }
}
