//! What people write, read one way everywhere in Skein: the one rule for offering a
//! name in place of a misspelt one, and memory sizes with a unit. The DSL, the agent's
//! fleet files, the GPU catalog and the model registry all use it, so a typo gets the
//! same help and `24GiB` means the same bytes wherever it is written.
//!
//! # Layout
//!
//! - [`suggest`]: "did you mean": [`likeness`] (Jaro-Winkler, ignoring case, at least
//!   [`LIKELY_TYPO`]) and [`closest`].
//! - [`size`]: [`parse_size`], a memory size with a unit (`24GiB`, `80 GB`) in bytes.
//! - [`cut`]: [`truncate_at_char`], text cut to a size in bytes at a character boundary.
//!
//! # Invariants
//!
//! Pure: no IO, no clock, no global state; nothing here panics on any input.

#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod cut;
pub mod size;
pub mod suggest;

pub use cut::truncate_at_char;
pub use size::parse_size;
pub use suggest::{LIKELY_TYPO, closest, likeness};
