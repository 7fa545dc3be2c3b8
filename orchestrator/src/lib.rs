//! The Skein orchestrator: it owns workflows, the live hardware graph, the
//! placement planner, the executor and durable sessions. Later parts arrive
//! module by module; each module is documented in `docs/ARCHITECTURE.md`.
//!
//! # Layout
//! - [`workflows`]: reading workflow files from disk into the IR (the file
//!   edge in front of the pure `skein-dsl` core).
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod workflows;
