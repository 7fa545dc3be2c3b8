//! The GPU models a fleet file can name: the workspace's one catalog
//! (`skein-gpu-catalog`), shared with the model registry so a simulated fleet plans
//! exactly like the real one.

pub use skein_gpu_catalog::{CARDS, CardModel, DEFAULT_SLOWDOWN_C, GENERIC, Thermal, lookup, suggestions};
