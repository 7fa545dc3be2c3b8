//! Decisions on approval steps, and on tool calls found in flight under
//! `in_flight: ask`: a person's approve or reject goes to the task that drives the run
//! (the only writer of its record), which records it, writes it, and answers with the
//! run as written.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::{Executor, RunError};
use crate::base::lock;
use crate::run::record::{DecideError, RunRecord, RunState};
use crate::store::StoreError;

/// A person's decision on what a step (or one of its `for_each` items) waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The step.
    pub step: String,
    /// The item of a `for_each` step whose tool call waits; `None` for the step itself.
    pub item: Option<u32>,
    /// Approved or rejected.
    pub approved: bool,
    /// Who decided.
    pub by: String,
    /// Why.
    pub comment: Option<String>,
}

/// A verdict, and where its outcome goes.
#[derive(Debug)]
pub(super) struct Decide {
    pub verdict: Verdict,
    pub reply: oneshot::Sender<Result<RunRecord, DecideError>>,
}

/// What a driven run listens to besides its engines: a cancellation or preemption, and
/// decisions.
#[derive(Debug, Clone)]
pub(super) struct Signals {
    pub cancel: watch::Sender<super::preempt::Halt>,
    pub decide: mpsc::Sender<Decide>,
}

/// Decisions that may wait for a run's task at once.
pub(super) const DECISIONS_QUEUED: usize = 16;

/// How long a decision waits for the run's task (busy placing its instances again).
const DECISION_WAIT: Duration = Duration::from_secs(10);

/// Why a decision was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum ApproveError {
    /// No such run.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The run is not being driven now, so nothing waits.
    #[error("run `{id}` is {state}; only a running run's steps wait for approval")]
    NotRunning {
        /// The run.
        id: String,
        /// Its state.
        state: RunState,
    },
    /// The step cannot take a decision.
    #[error(transparent)]
    Refused(#[from] DecideError),
    /// The run's task did not take the decision in time.
    #[error("run `{0}` is busy (placing its instances again); retry in a few seconds")]
    Busy(String),
}

impl From<StoreError> for ApproveError {
    fn from(e: StoreError) -> Self {
        ApproveError::Run(RunError::Store(e))
    }
}

impl Executor {
    /// Records `verdict` on what a step of run `id` waits for (an approval step, or a
    /// tool call in flight under `ask` on the step or on one of its items); answers with
    /// the run as written.
    ///
    /// Errors: the run does not exist or is not running, nothing waits there (or items
    /// wait and the verdict names none), or the run's task is busy.
    pub async fn decide(&self, id: &str, verdict: Verdict) -> Result<RunRecord, ApproveError> {
        let signals = lock(&self.inner.active).get(id).cloned();
        let Some(signals) = signals else {
            let run = self
                .inner
                .runs
                .get(id)?
                .ok_or_else(|| RunError::NotFound(id.to_owned()))?;
            return Err(ApproveError::NotRunning {
                id: id.to_owned(),
                state: run.state,
            });
        };
        let (reply, answer) = oneshot::channel();
        let decide = Decide { verdict, reply };
        let sent = tokio::time::timeout(DECISION_WAIT, signals.decide.send(decide)).await;
        if let Ok(Ok(())) = sent
            && let Ok(Ok(outcome)) = tokio::time::timeout(DECISION_WAIT, answer).await
        {
            return Ok(outcome?);
        }
        // The run's task ended meanwhile (the run did), or is busy.
        match self.inner.runs.get(id)? {
            Some(run) if run.state.is_final() => Err(ApproveError::NotRunning {
                id: id.to_owned(),
                state: run.state,
            }),
            _ => Err(ApproveError::Busy(id.to_owned())),
        }
    }
}
