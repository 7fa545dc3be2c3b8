//! The house checks itself: this crate holds only tests (`tests/tidy.rs`), which read
//! the workspace's sources and docs and fail when they drift apart — crate layouts, the
//! crate graph in `docs/ARCHITECTURE.md`, the names and paths that document mentions,
//! the GPU table of `docs/fleets.md`, file sizes and circles between modules. It is a
//! crate of its own so that `cargo test -p skein-tidy` runs in seconds without building
//! the rest of the workspace.
