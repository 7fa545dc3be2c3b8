//! Reflexes: the runtime policies a workflow declares over live telemetry
//! (docs/reflexes.md).
//!
//! [`engine`] is the pure core: the workflows' reflexes with their conditions compiled
//! once, indexed by the GPUs, nodes and agents their scopes contain, so that a sample
//! re-evaluates only the reflexes that watch it; it holds each reflex's window (how long
//! its condition has held), cooldown and hysteresis, and answers with [`Decision`]s
//! (fire, release) carrying the values that made them. It does no IO and reads no
//! clock: time is passed in, so tests replay load patterns exactly.
//!
//! [`events`] is the durable log of what reflexes did, with the values that made them.

pub mod engine;
pub mod events;
pub mod runtime;

pub use engine::{AgentReading, Decision, DecisionKind, Engine, GpuKey, GpuReading, ReflexId};
pub use events::{ActionRecord, EventKind, EventRecord, Events, Outcome};
pub use runtime::Reflexes;
