//! The Skein orchestrator: it owns workflows, the live hardware graph, the
//! placement planner, the executor, durable sessions and the reflexes. Each module is
//! described in `docs/ARCHITECTURE.md`.
//!
//! # Layout
//! - [`base`]: the ground floor every module may import: Unix and monotonic time,
//!   ids, the poison-tolerant lock, secrets and SHA-256 in hex. It imports nothing of
//!   the crate.
//! - [`workflows`]: reading workflow files from disk into the IR (the file
//!   edge in front of the pure `skein-dsl` core).
//! - [`graph`]: the live hardware graph (nodes, GPUs, links, telemetry windows, health)
//!   and its immutable snapshots. No IO, no clock: callers pass the time.
//! - [`plan`]: the placement planner (pure): variant, engine, GPUs and split for every
//!   agent, with the reasons.
//! - [`catalogs`]: the hub edge in front of the planner: every model a workflow names.
//! - [`engine_client`]: one chat completion to an engine, whole or streamed.
//! - [`tools`]: tool servers over the Model Context Protocol (stdio programs the admin
//!   allowed, streamable HTTP under the egress policy): connect, list, call.
//! - [`egress`]: the admin's policy over where endpoint agents may connect, checked at
//!   submit and at every connection.
//! - [`secrets`]: users' secrets (endpoint keys), encrypted at rest, resolved for the
//!   owner of a run or session.
//! - [`agents`]: the gRPC service agents join (registration, the telemetry stream),
//!   feeding the graph.
//! - [`auth`]: users and their API tokens (stored hashed).
//! - [`join`]: who may join the fleet as which node: join tokens (bootstrap, expiring,
//!   revocable) and node identities (each name claimed by one agent's credential).
//! - [`idempotency`]: `Idempotency-Key` of the routes that create runs, sessions and
//!   tokens: stored with what they created, in the same write.
//! - [`load`]: the serving figures of model instances (requests in flight, latency,
//!   tokens per second, sessions), counted where requests pass; reflexes read them.
//! - [`instances`]: the model instances agents were asked to run, their commands down
//!   the agents' streams and the status that comes back.
//! - [`run`]: runs of workflows: the stored record and its pure rules, the commands a
//!   plan becomes, and the executor (admission, instances, steps, retries, resume).
//! - [`session`]: sessions (conversations with agents): the stored records, the
//!   [`session::SessionStore`] trait over sled, and the group-committing writer.
//! - [`reflex`]: the workflow's reflexes (`on … do …`) evaluated against the live graph
//!   within a second of each sample: the pure engine, the runtime that acts, and its
//!   events.
//! - [`sharing`]: groups (projects) and their members, quotas checked and reserved
//!   atomically, and fair-share admission over decayed GPU-memory usage (pure core in
//!   `sharing::fair` and `sharing::quota`).
//! - [`store`]: durable records in sled: one writer thread with group commit owns every
//!   write and the flush (a write is acknowledged once it is on disk).
//! - [`private`]: the data directory (0700) and the files in it (0600): make, write,
//!   tighten.
//! - [`api`]: the REST API over the graph, plans, runs and instances, and the
//!   Prometheus metrics.
//! - [`server`]: `skein server`: both doors and the sweep that marks silent nodes down.
//! - [`transport`]: the doors as connections: accept loops with caps, header-read and
//!   idle timeouts, early refusals (413/414/431), TLS and the server's certificate.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod agents;
pub mod api;
pub mod auth;
pub mod base;
pub mod catalogs;
pub mod egress;
pub mod engine_client;
pub mod graph;
pub mod idempotency;
pub mod instances;
pub mod join;
pub mod load;
pub mod plan;
pub mod private;
pub mod reflex;
pub mod run;
pub mod secrets;
pub mod server;
pub mod session;
pub mod sharing;
pub mod store;
pub mod tools;
pub mod transport;
pub mod workflows;
