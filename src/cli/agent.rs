//! `skein agent`: joining a server, this machine's engines, and its pod.

use std::path::PathBuf;

use clap::Args;

/// `skein agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The server's agent address: `http://HOST:7879` (`https://` with TLS).
    #[arg(long, env = "SKEIN_JOIN", value_name = "URL")]
    pub join: String,
    /// The join token.
    #[arg(long, env = "SKEIN_JOIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A file holding the join token (the server's `<data dir>/join-token`).
    #[arg(long, value_name = "FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// This node's name; default: the hostname. With --simulate, the fleet node to be.
    #[arg(long, env = "SKEIN_NODE_NAME", value_name = "NAME")]
    pub node: Option<String>,
    /// Present the GPUs of a node of this fleet file instead of the real ones.
    #[arg(long, value_name = "FLEET.yaml")]
    pub simulate: Option<PathBuf>,
    /// A label for this node, repeatable: `--label zone=lab-a` (keys and values of letters,
    /// digits, `.`, `_`, `-`, `/`; in $SKEIN_NODE_LABELS, comma-separated). Added to a
    /// simulated node's `labels:`, replacing those of the same key.
    #[arg(
        long = "label",
        value_name = "KEY=VALUE",
        env = "SKEIN_NODE_LABELS",
        value_delimiter = ',',
        value_parser = skein_proto::labels::parse
    )]
    pub labels: Vec<(String, String)>,
    /// PEM CA certificate to trust for an `https://` server.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Trust only the `https://` server whose certificate has this SHA-256 fingerprint
    /// (`sha256:…`, printed by `skein server` at start and kept in its
    /// `<data dir>/tls/fingerprint`).
    #[arg(
        long,
        env = "SKEIN_SERVER_FINGERPRINT",
        value_name = "sha256:HEX",
        conflicts_with = "ca"
    )]
    pub server_fingerprint: Option<String>,
    /// Where engine logs go; default `<data dir>/logs`.
    #[arg(long, env = "SKEIN_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where the node's credential is kept (`<dir>/<node>.credential`, mode 0600), made
    /// on the first start: the node's identity, which must survive restarts for the
    /// agent to take its node name back; default `<data dir>/agent`.
    #[arg(long, env = "SKEIN_AGENT_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub engines: EngineArgs,
    /// Ignore Slurm: inside a Slurm job (`SLURM_JOB_ID` set) the agent otherwise
    /// registers only the job's GPUs, labels the node `slurm.job` and `slurm.end`, and
    /// names it by `SLURMD_NODENAME` (docs/deploy/slurm.md).
    #[arg(long)]
    pub no_slurm: bool,
    #[command(flatten)]
    pub pod: PodArgs,
}

/// The Kubernetes pod an agent runs in, as the DaemonSet passes it through the
/// downward API; each becomes a node label (see `crate::agent::kubernetes`).
#[derive(Debug, Args)]
pub struct PodArgs {
    /// The pod this agent runs in (`metadata.name`): labels the node
    /// `kubernetes.io/pod=NAME`.
    #[arg(long, env = "SKEIN_POD_NAME", value_name = "NAME")]
    pub pod_name: Option<String>,
    /// The pod's namespace (`metadata.namespace`): labels the node
    /// `kubernetes.io/namespace=NAME`.
    #[arg(long, env = "SKEIN_POD_NAMESPACE", value_name = "NAME")]
    pub pod_namespace: Option<String>,
}

/// Where an agent finds the engines it starts.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// llama.cpp's server program.
    #[arg(
        long,
        env = "SKEIN_LLAMA_SERVER",
        default_value = "llama-server",
        value_name = "PATH"
    )]
    pub llama_server: PathBuf,
    /// vLLM's program.
    #[arg(long, env = "SKEIN_VLLM", default_value = "vllm", value_name = "PATH")]
    pub vllm: PathBuf,
    /// Ray's program, for vLLM engines split across machines (the ranks on this node).
    #[arg(long, env = "SKEIN_RAY", default_value = "ray", value_name = "PATH")]
    pub ray: PathBuf,
    /// llama.cpp's RPC server, for GGUF models split across machines (one per GPU of
    /// this node that holds layers). Default: `ggml-rpc-server` on PATH (its name in
    /// current llama.cpp), else `rpc-server` (its name in older releases).
    #[arg(long, env = "SKEIN_RPC_SERVER", value_name = "PATH")]
    pub rpc_server: Option<PathBuf>,
    /// The address engines listen on and are reached at: this machine's address as the
    /// orchestrator (and, for a model split across nodes, the other nodes) see it; in
    /// Kubernetes, the pod's IP. Default: loopback when the server is on this machine,
    /// else this machine's address on the route to the server.
    #[arg(long, env = "SKEIN_ENGINE_HOST", value_name = "ADDR")]
    pub engine_host: Option<String>,
}
