//! Skein's wire protocols: the gRPC service between agents and the orchestrator,
//! generated from `skein/agent/v1/agent.proto` at build time, and the OpenAI
//! chat-completions format engines and the orchestrator's compatible routes speak
//! ([`openai`]), the rules of node labels both sides check ([`labels`]), and the
//! certificate fingerprints clients pin ([`tls`]).
//!
//! The `.proto` file is the contract; read its comments for the meaning of each field.
//! Both sides depend on this crate and on nothing of each other.
//!
//! # Layout
//!
//! - [`agent`]: `skein.agent.v1`, the generated gRPC types and service.
//! - [`labels`]: the rules of node labels (keys, values, reserved prefixes).
//! - [`openai`]: the chat-completions wire format (requests, responses, stream chunks).
//! - [`tls`]: certificate fingerprints, their text form and the verifier that pins one.
//! - [`throttle`]: NVML's clocks-throttle-reason bits as `GpuSample.throttle_reasons`
//!   carries them.

#![allow(missing_docs)]

/// `skein.agent.v1`: registration, the telemetry stream and commands.
pub mod agent {
    /// Version 1.
    // A start command is much larger than a ping; the messages are rare, so boxing the
    // generated variants would buy nothing.
    #[allow(clippy::large_enum_variant)]
    pub mod v1 {
        tonic::include_proto!("skein.agent.v1");
    }
}

pub mod labels;
pub mod openai;
mod redact;
pub mod tls;

/// The metadata key that carries the join token (`Bearer <token>`).
pub const AUTHORIZATION: &str = "authorization";

/// What separates an engine's failure reason from its last log lines (one a line) in
/// an instance's `detail`: the agent writes `REASON; last log lines:\nLINE…`, the
/// orchestrator quotes the reason and the last line in a run's progress.
pub const LAST_LOG_LINES: &str = "; last log lines:";

/// NVML's clocks-throttle-reason bits, as `GpuSample.throttle_reasons` carries them
/// (`nvmlClocksEventReason*` in `nvml.h`).
pub mod throttle {
    /// Nothing runs on the GPU.
    pub const GPU_IDLE: u64 = 0x1;
    /// Clocks held by the applications-clocks setting.
    pub const APPLICATIONS_CLOCKS_SETTING: u64 = 0x2;
    /// The software power cap (the power limit) holds clocks down.
    pub const SW_POWER_CAP: u64 = 0x4;
    /// Hardware slowdown: temperature or power brake, by the hardware.
    pub const HW_SLOWDOWN: u64 = 0x8;
    /// Synchronised boost across GPUs.
    pub const SYNC_BOOST: u64 = 0x10;
    /// The driver slows clocks to keep the temperature down.
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    /// The hardware slows clocks: the GPU is too hot.
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
    /// The hardware power brake (an external signal) slows clocks.
    pub const HW_POWER_BRAKE_SLOWDOWN: u64 = 0x80;
    /// Clocks held by the display clock setting.
    pub const DISPLAY_CLOCK_SETTING: u64 = 0x100;

    /// Reasons that mean heat.
    pub const THERMAL: u64 = HW_SLOWDOWN | SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN;
    /// Reasons that mean power.
    pub const POWER: u64 = SW_POWER_CAP | HW_POWER_BRAKE_SLOWDOWN;

    /// The names of the bits set in `reasons`, NVML's spelling in snake case.
    pub fn names(reasons: u64) -> Vec<&'static str> {
        [
            (GPU_IDLE, "gpu_idle"),
            (APPLICATIONS_CLOCKS_SETTING, "applications_clocks_setting"),
            (SW_POWER_CAP, "sw_power_cap"),
            (HW_SLOWDOWN, "hw_slowdown"),
            (SYNC_BOOST, "sync_boost"),
            (SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
            (HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
            (HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
            (DISPLAY_CLOCK_SETTING, "display_clock_setting"),
        ]
        .into_iter()
        .filter(|(bit, _)| reasons & bit != 0)
        .map(|(_, name)| name)
        .collect()
    }
}
