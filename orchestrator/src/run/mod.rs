//! Runs of workflows: the stored record and its pure rules ([`record`]), the commands a
//! plan becomes ([`launch`]), and the executor that admits runs, starts their instances
//! and drives their steps ([`executor`]).

pub mod executor;
pub mod launch;
pub mod record;

pub use executor::{Executor, ExecutorConfig, Pin, ProvideError, SubmitError};
pub use record::{RunRecord, RunState, StepRecord, StepState};
