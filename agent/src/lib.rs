//! The Skein node agent.
//!
//! An agent runs on every machine that lends hardware to Skein. It will discover GPUs
//! (NVML, or a simulated fleet file), stream inventory and telemetry to the orchestrator
//! over gRPC, and start and stop inference engines on the GPUs it is assigned. Today it
//! holds the first piece: discovery of the host itself.
//!
//! # Layout
//!
//! - [`host`]: CPU, memory, load and operating-system discovery through `sysinfo`,
//!   returned as a serializable [`HostInventory`]. Nothing in it fails: what the host
//!   does not report is `None`, with the reason listed in
//!   [`HostInventory::unavailable`].
//!
//! # Invariants
//!
//! The agent shares only the wire protocol with the orchestrator; it does not depend on
//! the orchestrator, DSL or model-registry crates. Discovery reads the local system and
//! blocks briefly (files under `/proc` and `/sys` on Linux); async callers run it on a
//! blocking thread.

#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod host;

pub use host::HostInventory;
