//! A GPU source narrowed to some of its GPUs (those a Slurm job was allocated),
//! renumbered 0, 1, … for the orchestrator, which expects a node's GPUs without gaps.

use super::{GpuInfo, GpuSample, GpuSource, SampleError};

/// `inner` showing only some of its GPUs. GPU `i` of this source is GPU
/// `device_indices()[i]` of the inner one: the orchestrator names GPUs by their new
/// index, engines are started on their device index
/// ([`EngineHostConfig::devices`](crate::engine::host::EngineHostConfig::devices)).
pub struct Allocated {
    inner: Box<dyn GpuSource>,
    /// Positions of the kept GPUs in the inner source's inventory, ascending.
    keep: Vec<usize>,
    inventory: Vec<GpuInfo>,
    /// Why these GPUs, for [`describe`](GpuSource::describe): `Slurm job 1234`.
    why: String,
}

impl Allocated {
    /// The GPUs of `inner` at positions `keep` (ascending, as
    /// [`crate::slurm::select`] returns them); `why` says who chose them. Positions past
    /// the inventory are left out.
    pub fn new(inner: Box<dyn GpuSource>, keep: Vec<usize>, why: String) -> Allocated {
        let keep: Vec<usize> = keep.into_iter().filter(|&p| p < inner.inventory().len()).collect();
        let inventory = keep
            .iter()
            .zip(0u32..)
            .filter_map(|(&p, index)| inner.inventory().get(p).map(|gpu| GpuInfo { index, ..gpu.clone() }))
            .collect();
        Allocated {
            inner,
            keep,
            inventory,
            why,
        }
    }

    /// The device index (the inner source's, which CUDA uses too) of each GPU of this
    /// source, in its order.
    pub fn device_indices(&self) -> Vec<u32> {
        self.keep
            .iter()
            .filter_map(|&p| self.inner.inventory().get(p).map(|gpu| gpu.index))
            .collect()
    }
}

impl GpuSource for Allocated {
    fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    fn sample(&mut self, t: f64) -> Vec<Result<GpuSample, SampleError>> {
        let mut all: Vec<Option<Result<GpuSample, SampleError>>> = self.inner.sample(t).into_iter().map(Some).collect();
        self.keep
            .iter()
            .zip(0u32..)
            .filter_map(|(&p, index)| {
                all.get_mut(p)
                    .and_then(Option::take)
                    .map(|sample| sample.map(|s| GpuSample { index, ..s }))
            })
            .collect()
    }

    fn describe(&self) -> String {
        let devices: Vec<String> = self.device_indices().iter().map(u32::to_string).collect();
        let total = self.inner.inventory().len();
        format!(
            "{}; {} ({} of {total}) allocated by {}",
            self.inner.describe(),
            match devices.len() {
                0 => "no GPU".to_owned(),
                1 => format!("GPU {}", devices.join(",")),
                _ => format!("GPUs {}", devices.join(",")),
            },
            devices.len(),
            self.why
        )
    }

    fn set_own_pids(&mut self, pids: &[u32]) {
        self.inner.set_own_pids(pids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> Box<dyn GpuSource> {
        let text = "fleet: t\nnodes:\n  n:\n    gpus: { model: RTX4090-24GB, count: 4 }\n";
        let mut no_files = |_: &std::path::Path| -> std::io::Result<String> { Err(std::io::Error::other("no file")) };
        let fleet = crate::fleet::parse_fleet("test.yaml", text, std::path::Path::new(""), &mut no_files).unwrap();
        Box::new(fleet.node("n").unwrap())
    }

    #[test]
    fn kept_gpus_are_renumbered_and_sampled_in_order() {
        let inner = source();
        let uuids: Vec<String> = inner.inventory().iter().map(|g| g.uuid.clone()).collect();
        let mut allocated = Allocated::new(inner, vec![1, 3], "Slurm job 7".to_owned());
        let inventory = allocated.inventory();
        assert_eq!(inventory.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(inventory[0].uuid, uuids[1]);
        assert_eq!(inventory[1].uuid, uuids[3]);
        assert_eq!(allocated.device_indices(), vec![1, 3]);
        let samples = allocated.sample(0.0);
        assert_eq!(
            samples.iter().map(|s| s.as_ref().unwrap().index).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(
            allocated
                .describe()
                .ends_with("GPUs 1,3 (2 of 4) allocated by Slurm job 7"),
            "{}",
            allocated.describe()
        );
    }
}
