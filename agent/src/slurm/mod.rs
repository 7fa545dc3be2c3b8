//! An agent inside a Slurm allocation (`srun skein agent …`): which job it runs in,
//! which GPUs the job was given, and the node labels that say so.
//!
//! Pure: the environment is passed in as a function ([`detect`]), the GPU source's
//! inventory as a slice ([`select`]); running Slurm's commands ([`output`], [`time_left`])
//! lives in `squeue.rs`.
//!
//! # How Slurm numbers GPUs, and how they are matched to NVML's
//!
//! Slurm names a job's GPUs by their *GRES index*: the position of the device in the
//! node's `gres.conf` (with `AutoDetect=nvml`, NVML's order, which is PCI bus order).
//! It puts them in `SLURM_JOB_GPUS` (the batch step) and `SLURM_STEP_GPUS` (an `srun`
//! step), always as node-wide indices, and sets `CUDA_VISIBLE_DEVICES` for the tasks:
//!
//! - **without device confinement** (no `ConstrainDevices=yes` in `cgroup.conf`) every
//!   process sees every GPU of the machine; `CUDA_VISIBLE_DEVICES` holds the same
//!   node-wide indices (`1,2`), and NVML lists all GPUs, numbered node-wide. The
//!   allocation is the NVML devices whose index is in the list.
//! - **with device confinement** the job's cgroup only lets it open its own
//!   `/dev/nvidiaN`; NVML and CUDA then list only those, numbered from 0, and Slurm
//!   sets `CUDA_VISIBLE_DEVICES=0,1` while `SLURM_JOB_GPUS` still says `1,2`. The
//!   allocation is every device NVML lists.
//!
//! The two cases are told apart by counting: when the source lists exactly as many
//! GPUs as Slurm allocated, they are the allocation (confinement, or a job that holds
//! the whole node); when it lists more, the allocation is the listed indices. A
//! `CUDA_VISIBLE_DEVICES` of UUIDs (`GPU-…`, set by sites that prefer them) is matched
//! by UUID, which is exact in both cases. A simulated node (`--simulate`) is filtered
//! the same way, its GPUs standing for NVML's.
//!
//! Either way, each GPU keeps its own device index for the engines it runs (a
//! `CUDA_VISIBLE_DEVICES` of that index works in both cases), while the orchestrator
//! sees the allocated GPUs numbered 0, 1, … ([`crate::gpu::Allocated`]).

mod squeue;

use std::collections::BTreeMap;

pub use squeue::{CommandError, output, time_left};

use crate::gpu::GpuInfo;

/// The label with the job id: `slurm.job=1234`.
pub const JOB_LABEL: &str = "slurm.job";
/// The label with the job's end, Unix seconds: `slurm.end=1767225600`.
pub const END_LABEL: &str = "slurm.end";

/// The Slurm job an agent runs in, from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmJob {
    /// `SLURM_JOB_ID`: digits (an array task's own id; `_` forms are not job ids).
    pub job_id: String,
    /// `SLURMD_NODENAME`: the Slurm name of this node, when set.
    pub node_name: Option<String>,
    /// `SLURM_JOB_NODELIST`: every node of the job, in Slurm's compressed form.
    pub nodelist: Option<String>,
    /// The GPUs allocated on this node.
    pub gpus: Allocation,
    /// `SLURM_JOB_END_TIME` (Unix seconds), which Slurm sets from 23.02 on; older
    /// versions leave it to `squeue` ([`time_left`]).
    pub end_unix_s: Option<i64>,
}

/// The GPUs Slurm allocated to this node's part of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocation {
    /// The job has no GPU on this node (no GPU variable is set).
    None,
    /// Node-wide GRES indices (see the module docs), and the variable they came from.
    Indices {
        /// The indices, in the order given.
        indices: Vec<u32>,
        /// `SLURM_STEP_GPUS`, `SLURM_JOB_GPUS` or `CUDA_VISIBLE_DEVICES`.
        from: &'static str,
    },
    /// GPU UUIDs from `CUDA_VISIBLE_DEVICES`.
    Uuids(Vec<String>),
    /// A count without identities (`SLURM_GPUS_ON_NODE`; a `gres.conf` without
    /// `File=` gives no indices and `CUDA_VISIBLE_DEVICES=NoDevFiles`).
    Count(usize),
}

impl Allocation {
    /// How many GPUs were allocated.
    pub fn len(&self) -> usize {
        match self {
            Allocation::None => 0,
            Allocation::Indices { indices, .. } => indices.len(),
            Allocation::Uuids(uuids) => uuids.len(),
            Allocation::Count(count) => *count,
        }
    }

    /// Whether no GPU was allocated.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A Slurm variable or allocation the agent cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// A variable with a value of the wrong shape.
    #[error(
        "{name}=`{value}` is not {expected}; help: is this agent started by Slurm (srun or sbatch)? unset {name} or pass --no-slurm to ignore Slurm"
    )]
    BadVariable {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// The allocation names GPUs the source does not have.
    #[error(
        "Slurm allocated {allocated} to this job, but {source_name} lists {listed}; help: check that gres.conf matches the machine's GPUs (with AutoDetect=nvml it does), or pass --no-slurm to register every GPU"
    )]
    Mismatch {
        /// The allocation, as Slurm gave it (`GPUs 4,5 (SLURM_JOB_GPUS)`).
        allocated: String,
        /// What the source lists (`2 GPUs, indices 0-1`).
        listed: String,
        /// The source (`NVML`, `the simulated node`).
        source_name: String,
    },
    /// A time that is none of Slurm's forms.
    #[error(
        "`{0}` is not a Slurm time; write MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS or DAYS-HOURS[:MINUTES[:SECONDS]] (e.g. 30, 8:00:00, 2-00)"
    )]
    BadTime(String),
}

/// The Slurm job this process runs in, or `None` outside Slurm (no `SLURM_JOB_ID`).
///
/// `env` reads a variable (`|name| std::env::var(name).ok()`). The GPU variables are
/// read in the order `SLURM_STEP_GPUS` (an `srun` step: the step's own GPUs),
/// `SLURM_JOB_GPUS`, `CUDA_VISIBLE_DEVICES` (UUIDs are used first, being exact), then
/// `SLURM_GPUS_ON_NODE` (a count alone). Index lists may use ranges (`0-3,6`).
///
/// Errors: [`SlurmError::BadVariable`] for a value of the wrong shape.
pub fn detect(env: impl Fn(&str) -> Option<String>) -> Result<Option<SlurmJob>, SlurmError> {
    let get = |name: &str| env(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let Some(job_id) = get("SLURM_JOB_ID") else {
        return Ok(None);
    };
    if !job_id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SlurmError::BadVariable {
            name: "SLURM_JOB_ID",
            value: job_id,
            expected: "a job number",
        });
    }
    let cuda = get("CUDA_VISIBLE_DEVICES");
    let uuids: Option<Vec<String>> = cuda.as_deref().and_then(|text| {
        let items: Vec<String> = text.split(',').map(|s| s.trim().to_owned()).collect();
        items.iter().all(|s| s.starts_with("GPU-")).then_some(items)
    });
    let mut gpus = Allocation::None;
    if let Some(uuids) = uuids {
        gpus = Allocation::Uuids(uuids);
    } else {
        for name in ["SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"] {
            let Some(value) = get(name) else { continue };
            if value == "NoDevFiles" {
                continue;
            }
            let indices = parse_indices(&value).ok_or(SlurmError::BadVariable {
                name,
                value,
                expected: "a list of GPU indices (0,1 or 0-3)",
            })?;
            gpus = Allocation::Indices { indices, from: name };
            break;
        }
    }
    if gpus == Allocation::None
        && let Some(value) = get("SLURM_GPUS_ON_NODE")
    {
        let count = value.parse::<usize>().map_err(|_| SlurmError::BadVariable {
            name: "SLURM_GPUS_ON_NODE",
            value: value.clone(),
            expected: "a number of GPUs",
        })?;
        if count > 0 {
            gpus = Allocation::Count(count);
        }
    }
    let end_unix_s = match get("SLURM_JOB_END_TIME") {
        None => None,
        Some(value) => Some(value.parse::<i64>().map_err(|_| SlurmError::BadVariable {
            name: "SLURM_JOB_END_TIME",
            value: value.clone(),
            expected: "Unix seconds",
        })?)
        .filter(|&s| s > 0),
    };
    Ok(Some(SlurmJob {
        job_id,
        node_name: get("SLURMD_NODENAME"),
        nodelist: get("SLURM_JOB_NODELIST"),
        gpus,
        end_unix_s,
    }))
}

/// `0,1`, `0-3,6` → the indices, in order, without repeats; `None` when malformed.
fn parse_indices(text: &str) -> Option<Vec<u32>> {
    let mut indices: Vec<u32> = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let (from, to) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let i = part.parse::<u32>().ok()?;
                (i, i)
            }
        };
        // A GPU range longer than any machine's is a mistake, not a loop to run.
        if to < from || to - from > 1024 {
            return None;
        }
        for i in from..=to {
            if !indices.contains(&i) {
                indices.push(i);
            }
        }
    }
    Some(indices)
}

/// The positions in `inventory` (a GPU source's GPUs, in index order) of the GPUs
/// `allocation` names, ascending. See the module docs for the rules; `source_name`
/// names the source in errors.
///
/// Errors: [`SlurmError::Mismatch`] when the allocation names a GPU the source does
/// not list, or more GPUs than it lists.
pub fn select(inventory: &[GpuInfo], allocation: &Allocation, source_name: &str) -> Result<Vec<usize>, SlurmError> {
    let mismatch = || SlurmError::Mismatch {
        allocated: describe_allocation(allocation),
        listed: describe_inventory(inventory),
        source_name: source_name.to_owned(),
    };
    let all = || (0..inventory.len()).collect::<Vec<usize>>();
    match allocation {
        Allocation::None => Ok(Vec::new()),
        Allocation::Uuids(uuids) => {
            let mut positions = uuids
                .iter()
                .map(|uuid| inventory.iter().position(|gpu| &gpu.uuid == uuid).ok_or_else(mismatch))
                .collect::<Result<Vec<usize>, SlurmError>>()?;
            positions.sort_unstable();
            positions.dedup();
            Ok(positions)
        }
        Allocation::Count(count) if *count == inventory.len() => Ok(all()),
        Allocation::Count(_) => Err(mismatch()),
        Allocation::Indices { indices, .. } if indices.len() == inventory.len() => Ok(all()),
        Allocation::Indices { indices, .. } if indices.len() > inventory.len() => Err(mismatch()),
        Allocation::Indices { indices, .. } => {
            let mut positions = indices
                .iter()
                .map(|&i| inventory.iter().position(|gpu| gpu.index == i).ok_or_else(mismatch))
                .collect::<Result<Vec<usize>, SlurmError>>()?;
            positions.sort_unstable();
            Ok(positions)
        }
    }
}

fn describe_allocation(allocation: &Allocation) -> String {
    match allocation {
        Allocation::None => "no GPU".to_owned(),
        Allocation::Indices { indices, from } => {
            let list: Vec<String> = indices.iter().map(u32::to_string).collect();
            format!("GPUs {} ({from})", list.join(","))
        }
        Allocation::Uuids(uuids) => format!("GPUs {} (CUDA_VISIBLE_DEVICES)", uuids.join(",")),
        Allocation::Count(count) => format!("{count} GPUs (SLURM_GPUS_ON_NODE, without indices)"),
    }
}

fn describe_inventory(inventory: &[GpuInfo]) -> String {
    let list: Vec<String> = inventory.iter().map(|gpu| gpu.index.to_string()).collect();
    match inventory.len() {
        0 => "no GPU".to_owned(),
        1 => format!("1 GPU, index {}", list.join(",")),
        n => format!("{n} GPUs, indices {}", list.join(",")),
    }
}

/// The node labels of a job: [`JOB_LABEL`] with its id, and [`END_LABEL`] with its
/// end in Unix seconds when known.
pub fn labels(job: &SlurmJob, end_unix_s: Option<i64>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(JOB_LABEL.to_owned(), job.job_id.clone())]);
    if let Some(end) = end_unix_s.or(job.end_unix_s) {
        labels.insert(END_LABEL.to_owned(), end.to_string());
    }
    labels
}

/// Seconds of a time in Slurm's forms — `MINUTES`, `MINUTES:SECONDS`,
/// `HOURS:MINUTES:SECONDS`, `DAYS-HOURS`, `DAYS-HOURS:MINUTES`,
/// `DAYS-HOURS:MINUTES:SECONDS` — as `sbatch --time` takes and `squeue -o %L` (the time
/// left) prints them; `None` for no limit (`UNLIMITED`, `INFINITE`, `NOT_SET`).
///
/// Errors: [`SlurmError::BadTime`] for anything else.
pub fn parse_time(text: &str) -> Result<Option<u64>, SlurmError> {
    let text = text.trim();
    if matches!(text.to_ascii_uppercase().as_str(), "UNLIMITED" | "INFINITE" | "NOT_SET") {
        return Ok(None);
    }
    let bad = || SlurmError::BadTime(text.to_owned());
    let number = |s: &str| {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<u64>().map_err(|_| bad())
    };
    let parts = |s: &str| s.split(':').map(number).collect::<Result<Vec<u64>, SlurmError>>();
    let seconds = match text.split_once('-') {
        Some((days, clock)) => {
            let days = number(days)?;
            let clock = match parts(clock)?.as_slice() {
                [h] => h * 3600,
                [h, m] => h * 3600 + m * 60,
                [h, m, s] => h * 3600 + m * 60 + s,
                _ => return Err(bad()),
            };
            days * 86_400 + clock
        }
        None => match parts(text)?.as_slice() {
            [m] => m * 60,
            [m, s] => m * 60 + s,
            [h, m, s] => h * 3600 + m * 60 + s,
            _ => return Err(bad()),
        },
    };
    Ok(Some(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| vars.get(name).cloned()
    }

    fn gpus(count: u32) -> Vec<GpuInfo> {
        (0..count)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-0000000{index}-0000-0000-0000-000000000000"),
                name: "NVIDIA GeForce RTX 4090".to_owned(),
                memory_total: 24 << 30,
                compute_capability: None,
                power_limit_mw: None,
                pcie: None,
                pci_bus_id: None,
                nvlink_peers: Vec::new(),
                mig_enabled: None,
                simulated: true,
            })
            .collect()
    }

    fn indices(list: &[u32], from: &'static str) -> Allocation {
        Allocation::Indices {
            indices: list.to_vec(),
            from,
        }
    }

    #[test]
    fn outside_slurm_there_is_no_job() {
        assert_eq!(detect(env(&[("CUDA_VISIBLE_DEVICES", "0")])), Ok(None));
    }

    #[test]
    fn a_batch_step_reads_the_jobs_gpus_and_an_srun_step_its_own() {
        let batch = detect(env(&[
            ("SLURM_JOB_ID", "1234"),
            ("SLURM_JOB_GPUS", "1,2"),
            ("CUDA_VISIBLE_DEVICES", "1,2"),
            ("SLURMD_NODENAME", "gpu-07"),
            ("SLURM_JOB_NODELIST", "gpu-[07-08]"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            batch,
            SlurmJob {
                job_id: "1234".to_owned(),
                node_name: Some("gpu-07".to_owned()),
                nodelist: Some("gpu-[07-08]".to_owned()),
                gpus: indices(&[1, 2], "SLURM_JOB_GPUS"),
                end_unix_s: None,
            }
        );
        // With device confinement CUDA_VISIBLE_DEVICES is renumbered; the node-wide
        // indices still come from Slurm's own variables.
        let step = detect(env(&[
            ("SLURM_JOB_ID", "1234"),
            ("SLURM_JOB_GPUS", "0-3"),
            ("SLURM_STEP_GPUS", "2,3"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("SLURM_JOB_END_TIME", "1767225600"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(step.gpus, indices(&[2, 3], "SLURM_STEP_GPUS"));
        assert_eq!(step.end_unix_s, Some(1_767_225_600));
    }

    #[test]
    fn uuids_count_and_no_gpu() {
        let uuid = "GPU-00000001-0000-0000-0000-000000000000";
        let job = detect(env(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_GPUS", "1"),
            ("CUDA_VISIBLE_DEVICES", uuid),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(job.gpus, Allocation::Uuids(vec![uuid.to_owned()]));
        let count = detect(env(&[
            ("SLURM_JOB_ID", "7"),
            ("CUDA_VISIBLE_DEVICES", "NoDevFiles"),
            ("SLURM_GPUS_ON_NODE", "2"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(count.gpus, Allocation::Count(2));
        let none = detect(env(&[("SLURM_JOB_ID", "7")])).unwrap().unwrap();
        assert_eq!(none.gpus, Allocation::None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let error = detect(env(&[("SLURM_JOB_ID", "12"), ("SLURM_JOB_GPUS", "0,x")])).unwrap_err();
        assert_eq!(
            error.to_string(),
            "SLURM_JOB_GPUS=`0,x` is not a list of GPU indices (0,1 or 0-3); help: is this agent started by Slurm \
             (srun or sbatch)? unset SLURM_JOB_GPUS or pass --no-slurm to ignore Slurm"
        );
        assert!(matches!(
            detect(env(&[("SLURM_JOB_ID", "12_3")])),
            Err(SlurmError::BadVariable {
                name: "SLURM_JOB_ID",
                ..
            })
        ));
        assert!(detect(env(&[("SLURM_JOB_ID", "1"), ("SLURM_JOB_GPUS", "3-1")])).is_err());
        assert!(detect(env(&[("SLURM_JOB_ID", "1"), ("SLURM_JOB_END_TIME", "soon")])).is_err());
    }

    #[test]
    fn unconfined_jobs_keep_the_listed_indices_and_confined_ones_everything() {
        let four = gpus(4);
        // Without confinement NVML lists the whole machine.
        assert_eq!(
            select(&four, &indices(&[1, 2], "SLURM_JOB_GPUS"), "NVML"),
            Ok(vec![1, 2])
        );
        assert_eq!(
            select(&four, &indices(&[3, 0], "SLURM_JOB_GPUS"), "NVML"),
            Ok(vec![0, 3])
        );
        // With confinement NVML lists only the job's two, renumbered from 0.
        let two = gpus(2);
        assert_eq!(
            select(&two, &indices(&[1, 2], "SLURM_JOB_GPUS"), "NVML"),
            Ok(vec![0, 1])
        );
        assert_eq!(select(&two, &Allocation::Count(2), "NVML"), Ok(vec![0, 1]));
        assert_eq!(
            select(&four, &Allocation::Uuids(vec![four[3].uuid.clone()]), "NVML"),
            Ok(vec![3])
        );
        assert_eq!(select(&four, &Allocation::None, "NVML"), Ok(vec![]));
    }

    #[test]
    fn allocations_the_source_cannot_have_are_refused() {
        let two = gpus(2);
        let error = select(&two, &indices(&[0, 1, 2], "SLURM_JOB_GPUS"), "NVML").unwrap_err();
        assert_eq!(
            error.to_string(),
            "Slurm allocated GPUs 0,1,2 (SLURM_JOB_GPUS) to this job, but NVML lists 2 GPUs, indices 0,1; \
             help: check that gres.conf matches the machine's GPUs (with AutoDetect=nvml it does), or pass \
             --no-slurm to register every GPU"
        );
        assert!(select(&gpus(4), &indices(&[7], "SLURM_JOB_GPUS"), "NVML").is_err());
        assert!(select(&gpus(4), &Allocation::Count(2), "NVML").is_err());
        assert!(select(&two, &Allocation::Uuids(vec!["GPU-nope".to_owned()]), "NVML").is_err());
    }

    #[test]
    fn labels_carry_the_job_and_its_end() {
        let job = detect(env(&[("SLURM_JOB_ID", "1234")])).unwrap().unwrap();
        let labels = labels(&job, Some(1_767_225_600));
        assert_eq!(labels.get(JOB_LABEL).map(String::as_str), Some("1234"));
        assert_eq!(labels.get(END_LABEL).map(String::as_str), Some("1767225600"));
        assert_eq!(skein_proto::labels::check_all(&labels), Ok(()));
        assert!(!super::labels(&job, None).contains_key(END_LABEL));
    }

    #[test]
    fn times_in_slurms_forms() {
        // squeue's time left.
        assert_eq!(parse_time("9:57"), Ok(Some(597)));
        assert_eq!(parse_time("1:00:05"), Ok(Some(3605)));
        assert_eq!(parse_time("2-03:04:05"), Ok(Some(2 * 86_400 + 3 * 3600 + 4 * 60 + 5)));
        assert_eq!(parse_time("NOT_SET\n"), Ok(None));
        // sbatch's time limits.
        assert_eq!(parse_time("30"), Ok(Some(1800)));
        assert_eq!(parse_time("2-00"), Ok(Some(172_800)));
        assert_eq!(parse_time("1-02:30"), Ok(Some(95_400)));
        assert_eq!(parse_time("UNLIMITED"), Ok(None));
        for bad in ["", "INVALID", "8h", "1:2:3:4", "-5", "1-", "a-1", "1-2:3:4:5"] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }
}
