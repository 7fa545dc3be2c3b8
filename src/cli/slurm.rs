//! `skein slurm submit`: agents as a Slurm job.

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// `skein slurm …`.
#[derive(Debug, Subcommand)]
pub enum SlurmCommand {
    /// Submit the sbatch script that starts one agent per node of a new allocation,
    /// joined to a server (`--print`: print it instead). Prints the job id and the
    /// job's state.
    ///
    /// Arguments after `--` go to each `skein agent` as they are
    /// (`-- --label zone=lab-b`). Exits 0 when submitted (or printed), 1 otherwise.
    Submit(SlurmSubmitArgs),
}

/// `skein slurm submit`.
#[derive(Debug, Args)]
pub struct SlurmSubmitArgs {
    /// The server's agent address as the compute nodes reach it: `http://HOST:7879`.
    #[arg(long, value_name = "URL")]
    pub join: String,
    /// The file holding the join token, readable on the compute nodes (a shared home or
    /// project directory) and by its owner only; default: the server's
    /// `<data dir>/join-token` on this machine.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The data directory whose `join-token` is the default token file.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Nodes to allocate: one agent runs on each.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub nodes: u32,
    /// GPUs per node (`--gpus-per-node` of sbatch; 0: none, CPU-only agents).
    #[arg(long, value_name = "G")]
    pub gpus_per_node: u32,
    /// The partition (queue).
    #[arg(long, value_name = "NAME")]
    pub partition: Option<String>,
    /// The time limit, in Slurm's form: `MINUTES`, `HOURS:MINUTES:SECONDS`,
    /// `DAYS-HOURS[:MINUTES[:SECONDS]]`; default: the partition's.
    #[arg(long, value_name = "T")]
    pub time: Option<String>,
    /// The account to charge.
    #[arg(long, value_name = "NAME")]
    pub account: Option<String>,
    /// The job's name.
    #[arg(long, value_name = "NAME", default_value = "skein-agents")]
    pub job_name: String,
    /// How long before the time limit the agents are warned (SIGUSR1) and their nodes
    /// drained, so their instances move elsewhere before the end.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub warn_before: String,
    /// Where the job's output goes (sbatch `--output`; `%j` is the job id).
    #[arg(long, value_name = "PATH", default_value = "skein-agents-%j.out")]
    pub output: String,
    /// More `#SBATCH` options, repeatable: `--sbatch=--constraint=a100`.
    #[arg(long = "sbatch", value_name = "OPTION", allow_hyphen_values = true)]
    pub sbatch: Vec<String>,
    /// The `skein` binary the nodes run (a path they can reach); default: this one.
    #[arg(long, value_name = "PATH")]
    pub skein: Option<PathBuf>,
    /// Print the script instead of submitting it.
    #[arg(long)]
    pub print: bool,
    /// Arguments for each `skein agent`, after `--`.
    #[arg(last = true, value_name = "AGENT ARGS")]
    pub agent_args: Vec<String>,
}
