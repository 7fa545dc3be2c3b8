//! The Skein node agent.
//!
//! An agent runs on every machine that lends hardware to Skein. It discovers the host
//! and its GPUs — real ones through NVML, or a simulated node of a fleet file — and
//! samples them; it streams inventory and telemetry to the orchestrator over gRPC
//! (through the `proto` types) and starts and stops inference engines on the GPUs it is
//! assigned. Simulated and real GPUs go through the same code after discovery: both
//! are a [`GpuSource`].
//!
//! # Layout
//!
//! - [`host`]: CPU, memory, load and operating-system discovery through `sysinfo`, and
//!   the network link speed from Linux sysfs, returned as a serializable
//!   [`HostInventory`]. Nothing in it fails: what the host does not report is `None`,
//!   with the reason listed in [`HostInventory::unavailable`].
//! - [`gpu`]: the GPU types ([`GpuInfo`] sent once, [`GpuSample`] per tick,
//!   [`ThrottleReasons`]), the [`GpuSource`] trait, and the NVML source
//!   ([`discover_nvml`] → [`NvmlSource`]), which loads `libnvidia-ml.so.1` at run
//!   time and returns `Ok(None)` on a machine without the driver; and
//!   [`GpuMemoryProbe`], the memory of given processes per GPU ([`NvmlMemoryProbe`]).
//! - [`daemon`]: the connection to the orchestrator: register, then one gRPC stream
//!   (telemetry up, pings and commands down), reconnecting with backoff.
//! - [`identity`]: the node's credential, made once and kept in the agent's state
//!   directory (mode 0600), presented on every registration and stream.
//! - [`engine`]: inference engines: the command lines of `llama-server`, `vllm serve`
//!   and the built-in `skein engine serve` from an instance's launch spec
//!   ([`engine::LaunchSpec::command`], pure), and the [`engine::Supervisor`] that runs
//!   instances (local processes or remote endpoints): readiness, measured memory,
//!   health probes, restarts with backoff, clean stops, captured logs.
//! - [`fleet`]: fleet files ([`load_fleet`] → [`Fleet`] → [`Fleet::node`]): the
//!   schema, the GPU model catalog ([`fleet::catalog`]) and diagnostics with
//!   file:line:column.
//! - [`telemetry`]: the models that drive simulated metrics (`ramp`, `square`,
//!   `spike`, `replay`, …) as pure functions of time.
//! - [`sim`]: [`SimulatedSource`], a fleet node as a [`GpuSource`]: modelled metrics
//!   plus the ones that follow from them (power from utilization, temperature from
//!   power, throttle reasons and clocks from both).
//! - [`slurm`]: an agent inside a Slurm job: the job and its GPUs from the
//!   environment ([`slurm::detect`], pure), which GPUs of a source they are
//!   ([`slurm::select`], pure; [`gpu::Allocated`] narrows the source to them), the
//!   `slurm.job` / `slurm.end` labels, and the job's time left from `squeue`.
//!
//! # Invariants
//!
//! The agent shares only the wire protocol with the orchestrator; it does not depend on
//! the orchestrator or the DSL. It uses the model registry for hub downloads (an
//! instance's weights) and the GPU catalog for simulated fleets. `telemetry`, `sim`, `slurm` (but for
//! its `squeue` call) and fleet checking are pure (no clock, no IO): a simulated reading is a function of the
//! fleet file and `t`, and only [`load_fleet`] reads files. Discovery reads the local
//! system and blocks briefly (files under `/proc` and `/sys` on Linux, NVML calls);
//! async callers run it, and GPU sampling, on a blocking thread. Nothing panics on
//! bad input or a failing driver call: a failing NVML field is `None`, logged once.
//! Engine processes run in their own process groups and never outlive the
//! [`engine::Supervisor`] that started them.

#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod daemon;
pub mod engine;
pub mod fleet;
pub mod gpu;
pub mod host;
pub mod identity;
mod pinned;
pub mod sim;
pub mod slurm;
pub mod telemetry;

pub use fleet::{Fleet, FleetError, load_fleet};
pub use gpu::{
    GpuInfo, GpuMemoryProbe, GpuSample, GpuSource, NvmlMemoryProbe, NvmlSource, PcieLink, SampleError, ThrottleReasons,
    discover_nvml,
};
pub use host::{HostInventory, HostLive, HostSampler};
pub use sim::SimulatedSource;
