//! What `skein agent` does differently inside a Slurm job: only the job's GPUs, the
//! job's labels, and signals that say which job ends when. `crate::slurm` submits such
//! jobs; docs/deploy/slurm.md tells the whole story.

use std::time::{SystemTime, UNIX_EPOCH};

use skein_agent::GpuSource;
use skein_agent::gpu::Allocated;
use skein_agent::slurm::{self as job_env, SlurmJob};

use super::AgentParts;
use crate::signals::Why;

/// `parts` narrowed to what Slurm job `job` was allocated: only its GPUs (renumbered,
/// with their device indices kept for the engines) and the `slurm.job` and `slurm.end`
/// labels; and what the agent's signals should say about the job.
///
/// Errors: an allocation the GPU source cannot have (see [`job_env::select`]).
pub(crate) fn agent_in_job(parts: AgentParts, job: &SlurmJob) -> anyhow::Result<(AgentParts, Why)> {
    let AgentParts {
        source,
        node_name,
        host,
        live,
        mut labels,
        devices: _,
    } = parts;
    let source_name = if source.inventory().iter().any(|gpu| gpu.simulated) {
        "the simulated node"
    } else {
        "NVML"
    };
    let keep = job_env::select(source.inventory(), &job.gpus, source_name)?;
    let allocated = Allocated::new(source, keep, format!("Slurm job {}", job.job_id));
    let devices = allocated.device_indices();
    let end_unix_s = job.end_unix_s.or_else(|| match job_env::time_left(&job.job_id) {
        Ok(left) => left.and_then(|left| {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
            i64::try_from(now.saturating_add(left)).ok()
        }),
        Err(error) => {
            tracing::warn!(job = %job.job_id, %error, "the job's end is unknown: the node has no slurm.end label");
            None
        }
    });
    labels.extend(job_env::labels(job, end_unix_s));
    tracing::info!(
        job = %job.job_id,
        nodes = job.nodelist.as_deref().unwrap_or("?"),
        source = %allocated.describe(),
        end_unix_s,
        "running in a Slurm job"
    );
    let why = Why {
        job: Some(job.job_id.clone()),
        end_unix_s,
    };
    let parts = AgentParts {
        source: Box::new(allocated),
        node_name,
        host,
        live,
        labels,
        devices,
    };
    Ok((parts, why))
}
