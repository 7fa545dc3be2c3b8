//! Memory an instance really used once loaded, recorded beside the plan's estimate.

use serde::Serialize;

use crate::base::lock;
use crate::store::Tree;

use super::{Entry, Instances};

/// Memory an instance really used once loaded, beside the plan's estimate: the record
/// `skein models measured` shows, one per variant, engine, GPU count, context and
/// concurrency (the latest wins).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Measurement {
    /// The variant.
    pub variant: String,
    /// The engine.
    pub engine: String,
    /// GPUs it ran on (0: the CPU).
    pub gpus: usize,
    /// Context tokens per sequence.
    pub context: u64,
    /// Sequences at once.
    pub concurrency: u64,
    /// Bytes the plan reserved (estimate and margin).
    pub estimated_bytes: u64,
    /// Bytes measured: the engine's GPU memory, or its resident host memory on the CPU.
    pub measured_bytes: u64,
    /// Where.
    pub node: String,
    /// When, RFC 3339.
    pub measured_at: String,
}

impl Instances {
    /// Records measured memory in `tree` from now on.
    pub fn record_measurements(&self, tree: Tree<Measurement>) {
        *lock(&self.measurements) = Some(tree);
    }

    /// Every measurement recorded.
    pub fn measurements(&self) -> Result<Vec<Measurement>, crate::store::StoreError> {
        match &*lock(&self.measurements) {
            Some(tree) => tree.all(),
            None => Ok(Vec::new()),
        }
    }

    /// The measurement an entry's report makes, if any (recorded by the caller once it
    /// holds no lock: [`Instances::record`]).
    pub(super) fn measured(entry: &Entry) -> Option<Measurement> {
        let start = entry.start.as_ref()?;
        let view = &entry.view;
        let gpu: u64 = view.measured_gpu.iter().map(|(_, b)| b).sum();
        let measured_bytes = if start.gpus.is_empty() {
            view.measured_host_rss.unwrap_or(0)
        } else {
            gpu
        };
        if measured_bytes == 0 {
            return None;
        }
        Some(Measurement {
            variant: view.variant.clone(),
            engine: view.engine.clone(),
            gpus: start.gpus.len(),
            context: start.context,
            concurrency: start.concurrency,
            estimated_bytes: view.estimated_bytes,
            measured_bytes,
            node: view.node_name.clone(),
            measured_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        })
    }

    /// Keeps a measurement (lazily: a lost one is measured again at the next start).
    pub(super) fn record(&self, record: &Measurement) {
        let Some(tree) = lock(&self.measurements).clone() else {
            return;
        };
        let key = format!(
            "{}|{}|{}|{}|{}",
            record.variant, record.engine, record.gpus, record.context, record.concurrency
        );
        if let Err(error) = tree.insert_lazily(&key, record) {
            tracing::warn!(%error, "a memory measurement was not recorded");
        }
    }
}
