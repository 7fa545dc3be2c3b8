//! Runs of workflows: the stored record and its pure rules ([`record`]), the commands a
//! plan becomes ([`launch`]), the bring-up of replicas split across nodes ([`split`]), and
//! the executor that admits runs, starts their instances and drives their steps
//! ([`executor`]).

pub mod executor;
pub mod launch;
pub mod record;
pub mod split;

pub use executor::{ContextWanted, Executor, ExecutorConfig, Pin, ProvideError, SubmitError};
pub use record::{RunRecord, RunState, StepRecord, StepState};
