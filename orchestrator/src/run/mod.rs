//! Runs of workflows: the record and its pure rules ([`record`]), how the store keeps
//! it ([`stored`]), the commands a
//! plan becomes ([`launch`]), the bring-up of replicas split across nodes ([`split`]), and
//! the executor that admits runs, starts their instances and drives their steps
//! ([`executor`]).

pub mod executor;
pub mod launch;
pub mod record;
pub mod split;
pub mod stored;

pub use executor::{ContextWanted, Executor, ExecutorConfig, Pin, ProvideError, SubmitError};
pub use record::{RunRecord, RunState, StepRecord, StepState};
