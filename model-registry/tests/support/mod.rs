//! The workspace's test doubles (`skein-testkit`), under the name these tests use.

pub use skein_testkit::*;

pub mod adapter;
