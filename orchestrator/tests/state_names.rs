//! One name per state: for every state enum the API exposes, the name on the wire (serde)
//! is the name the server and the CLI print (`name()`, `Display`), and it reads back as
//! the same state. A retrying step was `retrying` on the wire but `retried` in its
//! `name()`, so `skein submit --wait` never recognised it.

use std::fmt::Display;

use serde::Serialize;
use serde::de::DeserializeOwned;
use skein_orchestrator::graph::HealthState;
use skein_orchestrator::instances::InstanceState;
use skein_orchestrator::run::{RunState, StepState};

/// Checks every state in `all` (which `ordinal` proves is every variant: its match is
/// exhaustive, so a new variant does not compile until it is numbered, and `all` must
/// then hold it).
fn one_name_each<T>(all: &[T], name: impl Fn(&T) -> &'static str, ordinal: impl Fn(&T) -> usize)
where
    T: Serialize + DeserializeOwned + Display + PartialEq + std::fmt::Debug,
{
    let mut ordinals: Vec<usize> = all.iter().map(&ordinal).collect();
    ordinals.sort_unstable();
    assert_eq!(
        ordinals,
        (0..all.len()).collect::<Vec<_>>(),
        "ALL lists each variant once"
    );
    for state in all {
        let wire = serde_json::to_value(state).unwrap();
        assert_eq!(wire, serde_json::Value::from(name(state)), "{state:?}: wire vs name()");
        assert_eq!(
            wire,
            serde_json::Value::from(state.to_string()),
            "{state:?}: wire vs Display"
        );
        let back: T = serde_json::from_value(wire).unwrap();
        assert_eq!(&back, state);
    }
}

#[test]
fn run_states_have_one_name() {
    one_name_each(
        &RunState::ALL,
        |s| s.name(),
        |s| match s {
            RunState::Queued => 0,
            RunState::Starting => 1,
            RunState::Running => 2,
            RunState::Succeeded => 3,
            RunState::Failed => 4,
            RunState::Cancelled => 5,
        },
    );
}

#[test]
fn step_states_have_one_name() {
    one_name_each(
        &StepState::ALL,
        |s| s.name(),
        |s| match s {
            StepState::Pending => 0,
            StepState::Queued => 1,
            StepState::Running => 2,
            StepState::Waiting => 3,
            StepState::Retrying => 4,
            StepState::Done => 5,
            StepState::Skipped => 6,
            StepState::Failed => 7,
            StepState::Cancelled => 8,
        },
    );
    assert_eq!(StepState::Retrying.name(), "retrying");
    assert_eq!(StepState::Waiting.name(), "waiting");
}

#[test]
fn instance_states_have_one_name() {
    one_name_each(
        &InstanceState::ALL,
        |s| s.name(),
        |s| match s {
            InstanceState::Requested => 0,
            InstanceState::Downloading => 1,
            InstanceState::Starting => 2,
            InstanceState::Loading => 3,
            InstanceState::Ready => 4,
            InstanceState::Unhealthy => 5,
            InstanceState::Restarting => 6,
            InstanceState::Failed => 7,
            InstanceState::Stopped => 8,
            InstanceState::Lost => 9,
        },
    );
}

#[test]
fn health_states_have_one_name() {
    one_name_each(
        &HealthState::ALL,
        |s| s.name(),
        |s| match s {
            HealthState::Ok => 0,
            HealthState::Degraded => 1,
            HealthState::Down => 2,
            HealthState::Left => 3,
        },
    );
}
