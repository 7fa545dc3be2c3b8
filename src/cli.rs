//! Command-line interface definition.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Success.
pub const EXIT_OK: u8 = 0;
/// The command ran and found a failure (e.g. an invalid workflow).
pub const EXIT_FAILURE: u8 = 1;
/// Bad usage or unreadable input.
pub const EXIT_USAGE: u8 = 2;

/// Skein: hardware-aware orchestration of multi-agent LLM workflows on mixed GPU fleets.
#[derive(Debug, Parser)]
#[command(name = "skein", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check workflow files (YAML or Rhai) and report every problem.
    ///
    /// Exits 0 when every file is valid, 1 when any has an error, 2 when a
    /// file cannot be read.
    Validate(ValidateArgs),
    /// Model variants and memory fit, from Hugging Face Hub metadata (no weights are
    /// downloaded).
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Plan a workflow: for each agent, the model variant, engine, GPUs and split, with
    /// the reasons; offline on a fleet file, or on a running orchestrator's live graph.
    ///
    /// Exits 0 when the workflow is admitted (every instance placed), 1 when it would
    /// be queued.
    Plan(PlanArgs),
    /// Run the orchestrator: the hardware graph, the service agents join (gRPC) and the
    /// REST API. Tokens are created in the data directory on first start.
    Server(ServerArgs),
    /// Show the nodes and GPUs of a running server, like nvidia-smi for the whole fleet.
    Nodes(NodesArgs),
    /// Free a node's name (admin): remove the node, or forget only its identity.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Run an agent: join a server and stream this machine's GPUs (NVML), or a
    /// simulated node of a fleet file.
    Agent(AgentArgs),
    /// Run everything on this machine: the server and a local agent, or one agent per
    /// node of a simulated fleet (`--fleet workflows/fleets/lab.yaml`).
    Up(UpArgs),
    /// Submit a workflow to a running server: it is planned, its instances started and
    /// its steps run. With --wait, follow it and print its outputs.
    ///
    /// Exits 0 when submitted (with --wait: when the run succeeded), 1 otherwise.
    Submit(SubmitArgs),
    /// List the runs of a server, newest first.
    Runs(ListArgs),
    /// Show or cancel one run.
    #[command(subcommand)]
    Run(RunCommand),
    /// List the model instances agents run: where, which engine, state, estimated and
    /// measured memory.
    Instances(InstancesArgs),
    /// The last lines an instance's engine wrote (stdout and stderr, across restarts),
    /// fetched from its agent.
    Logs(LogsArgs),
    /// The built-in inference engine (candle): serve one model over the OpenAI
    /// chat-completions API.
    #[command(subcommand)]
    Engine(EngineCommand),
    /// Make or revoke users' API tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// List the API tokens of a server (admin; never the tokens themselves).
    Tokens(ListArgs),
    /// Your secrets: the keys of your endpoint agents, named in workflows as
    /// `api_key_secret: NAME` (`--shared`: the admin's, named `shared/NAME`).
    #[command(subcommand)]
    Secret(SecretCommand),
    /// List your sessions (everyone's for the admin), oldest first.
    Sessions(ListArgs),
    /// What the reflexes of your runs did (everyone's for the admin), newest first.
    Events(EventsArgs),
    /// Start, show, chat in, move or delete a session.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Agents as Slurm jobs: generate and submit the batch script that joins a
    /// Slurm allocation's nodes to a server.
    #[command(subcommand)]
    Slurm(SlurmCommand),
}

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

/// `skein session …`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session with an agent of one of your runs, or with a model of its own.
    Create(SessionCreateArgs),
    /// A session: its owner, agent, where it runs, and its messages.
    Show(SessionIdArgs),
    /// Chat in a session: each line typed is a message, the reply streams back; an
    /// empty line or end of input ends. `--message` sends one and exits.
    Chat(SessionChatArgs),
    /// Move a session to another GPU (`NODE:GPU`), node (`NODE`), or wherever fits off
    /// its GPUs (`auto`).
    Migrate(SessionMigrateArgs),
    /// Delete a session and its messages.
    Delete(SessionIdArgs),
}

/// `skein session create`.
#[derive(Debug, Args)]
pub struct SessionCreateArgs {
    /// A Hugging Face model of its own (`owner/name`).
    #[arg(long, value_name = "REPO", conflicts_with_all = ["agent", "run"], required_unless_present = "agent")]
    pub model: Option<String>,
    /// An agent of a run (your newest run with that agent, unless `--run`).
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// The run whose agent it is.
    #[arg(long, value_name = "RUN", requires = "agent")]
    pub run: Option<String>,
    /// A system prompt instead of the agent's.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: the id, or the session as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// One session.
#[derive(Debug, Args)]
pub struct SessionIdArgs {
    /// The session's id (`skein sessions` lists them).
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a report, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein session chat`.
#[derive(Debug, Args)]
pub struct SessionChatArgs {
    /// The session's id.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Send this one message, print the reply, and exit.
    #[arg(long, short, value_name = "TEXT")]
    pub message: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein session migrate`.
#[derive(Debug, Args)]
pub struct SessionMigrateArgs {
    /// The session's id.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Where: `NODE:GPU` (e.g. `rtx-1:2`), `NODE`, or `auto`.
    #[arg(long, value_name = "NODE:GPU|NODE|auto")]
    pub to: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a line, or the move as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token for a user; it is printed once, keep it.
    Create(TokenCreateArgs),
    /// Revoke a token: it stops working at once.
    Revoke(TokenRevokeArgs),
    /// Join tokens, which let agents join the fleet (admin).
    #[command(subcommand)]
    Join(JoinTokenCommand),
}

/// `skein token join …`.
#[derive(Debug, Subcommand)]
pub enum JoinTokenCommand {
    /// Make a join token; it is printed once, keep it. Give it to agents as --token,
    /// --token-file or SKEIN_JOIN_TOKEN.
    Create(JoinTokenCreateArgs),
    /// List the join tokens (never the tokens themselves; not the server's bootstrap
    /// token).
    List(ListArgs),
    /// Revoke a join token: no agent claims a node name with it from now on (nodes
    /// that joined with it keep their identity).
    Revoke(TokenRevokeArgs),
}

/// `skein token join create`.
#[derive(Debug, Args)]
pub struct JoinTokenCreateArgs {
    /// How long it is accepted (`24h`, `30m`, `7days`); default: until revoked.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub expires: Option<std::time::Duration>,
    /// The one node name it may claim.
    #[arg(long, value_name = "NAME", conflicts_with = "name_prefix")]
    pub node: Option<String>,
    /// The prefix every node name it claims must have (`lab-a-`).
    #[arg(long, value_name = "PREFIX")]
    pub name_prefix: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: the token and how to use it, or its record as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein node …`.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Remove a node: it leaves the graph (its instances are placed again) and its
    /// identity is forgotten, so the next agent with a valid join token claims the name.
    /// Stop its agent (or revoke its join token) first, or it joins again.
    Rm(NodeNameArgs),
    /// Forget only a node's identity (it stays in the graph): the next agent to register
    /// the name with a valid join token claims it (a machine that lost its state
    /// directory, a replaced machine).
    Reset(NodeNameArgs),
}

/// `skein node rm|reset NAME`.
#[derive(Debug, Args)]
pub struct NodeNameArgs {
    /// The node's name (`skein nodes` lists them).
    #[arg(value_name = "NAME")]
    pub name: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein secret …`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Set (or replace) a secret. The value is read from standard input (a hidden
    /// prompt on a terminal), never from the command line, and never shown again.
    Set(SecretSetArgs),
    /// List the names of your secrets and the shared ones (everyone's for the admin).
    List(ListArgs),
    /// Remove a secret.
    Rm(SecretRmArgs),
}

/// `skein secret set`.
#[derive(Debug, Args)]
pub struct SecretSetArgs {
    /// The secret's name (letters, digits, `-`, `_`, `.`).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Publish it for every user's workflows, as `shared/NAME` (admin).
    #[arg(long)]
    pub shared: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein secret rm`.
#[derive(Debug, Args)]
pub struct SecretRmArgs {
    /// The secret's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Remove a shared secret (admin).
    #[arg(long)]
    pub shared: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein token create`.
#[derive(Debug, Args)]
pub struct TokenCreateArgs {
    /// The user the token acts for (lowercase letters, digits, `-`, `_`, `.`).
    #[arg(long, value_name = "NAME")]
    pub user: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: the token and how to use it, or its record as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein token revoke`.
#[derive(Debug, Args)]
pub struct TokenRevokeArgs {
    /// The token's id (`t-…`, `skein tokens` lists them; a join token's `j-…`, `skein
    /// token join list`).
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein logs`: an admin reads any instance's engine log; a user only that of an
/// instance that served their requests alone (a log can hold prompts).
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The instance (`skein instances` lists them).
    #[arg(value_name = "INSTANCE")]
    pub instance: String,
    /// How many lines.
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub tail: u32,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// The REST address the client commands reach without `--server`.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7878";

/// A running server's REST address and token.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// The server's REST address.
    #[arg(long, default_value = DEFAULT_SERVER, value_name = "URL")]
    pub server: String,
    /// How to reach the server.
    #[command(flatten)]
    pub client: ApiClientArgs,
}

/// `skein submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The workflow: `.yaml`, `.yml` or `.rhai`.
    #[arg(value_name = "WORKFLOW")]
    pub workflow: PathBuf,
    /// An input value, repeatable: `--input figure=fig1.png`.
    #[arg(long = "input", value_name = "KEY=VALUE")]
    pub inputs: Vec<String>,
    /// Follow the run until it ends, then print its outputs.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: progress and outputs, or the run as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein runs`, `skein tokens` and other lists: a server and an output format.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub list: ListArgs,
    /// Keep printing events as they happen.
    #[arg(long)]
    pub follow: bool,
}

/// `skein run …`.
#[derive(Debug, Subcommand)]
pub enum RunCommand {
    /// A run's state, its steps with their timestamps, and its outputs.
    Show(RunIdArgs),
    /// Cancel a run: queued, it never starts; running, its steps stop and its
    /// instances are stopped.
    Cancel(RunIdArgs),
}

/// One run.
#[derive(Debug, Args)]
pub struct RunIdArgs {
    /// The run's id (`skein runs` lists them).
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a report, or the run as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein instances`.
#[derive(Debug, Args)]
pub struct InstancesArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein engine …`.
#[derive(Debug, Subcommand)]
pub enum EngineCommand {
    /// Serve a model directory (Hugging Face snapshot) or GGUF file on
    /// `/v1/chat/completions`; `/health` is 503 until the model is loaded.
    ///
    /// Exits 1 when the model fails to load, 2 for bad arguments.
    Serve(EngineServeArgs),
}

/// `skein engine serve`.
#[derive(Debug, Args)]
pub struct EngineServeArgs {
    /// The model: a directory with config.json, tokenizer files and *.safetensors, or a
    /// .gguf file with the tokenizer files beside it.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// The name clients ask for in `model`.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    pub host: String,
    /// The port to listen on (0 picks a free one).
    #[arg(long, value_name = "PORT")]
    pub port: u16,
    /// The sampler's seed for requests without one.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the model runs: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda:N")]
    pub device: String,
    /// The key every `/v1` request must carry (`Authorization: Bearer KEY`); `/health`
    /// stays open. Give it through the environment, as the agent does: a command line
    /// is readable by every user of the machine. Unset: no key.
    #[arg(
        long = "api-key",
        env = "SKEIN_ENGINE_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<String>,
}

/// `skein plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The workflow: `.yaml`, `.yml` or `.rhai`.
    #[arg(value_name = "FILE")]
    pub workflow: PathBuf,
    /// Plan offline on a fleet file (`workflows/fleets/lab.yaml`); the models are read
    /// from the hub (HF_ENDPOINT, HF_TOKEN, HF_HOME as `skein models` reads them).
    #[arg(long, value_name = "FLEET.yaml", conflicts_with = "server")]
    pub fleet: Option<PathBuf>,
    /// Plan on a running orchestrator's live graph (`POST /v1/plans`).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// How to reach --server.
    #[command(flatten)]
    pub client: ApiClientArgs,
    /// Output format: a table, or the plan as JSON (the object the API returns).
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// Show why each choice was made, the best candidates not taken, and each device.
    #[arg(long)]
    pub explain: bool,
    /// Let this workflow preempt instances of lower-priority workflows.
    #[arg(long)]
    pub preempt: bool,
    /// Quantized derivatives to consider per model (the hub's most downloaded first).
    #[arg(long, default_value_t = skein_model_registry::hub::DEFAULT_DERIVATIVES, value_name = "N")]
    pub derivatives: usize,
    /// Read the weight headers of derivatives too (exact sizes).
    #[arg(long)]
    pub derivative_headers: bool,
    /// Use only the Hugging Face cache, as HF_HUB_OFFLINE=1 does.
    #[arg(long)]
    pub offline: bool,
}

/// The REST API token of a client command.
#[derive(Debug, Args)]
pub struct ApiClientArgs {
    /// Bearer token; default: `<data dir>/api-token` of a server on this machine.
    #[arg(long, env = "SKEIN_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The data directory whose api-token to read (and, for a server on this machine
    /// reached at `https://` on loopback, whose `tls/cert.pem` to trust).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Trust only the `https://` server whose certificate has this SHA-256 fingerprint
    /// (`sha256:…`, printed by the server at start).
    #[arg(long, env = "SKEIN_SERVER_FINGERPRINT", value_name = "sha256:HEX")]
    pub server_fingerprint: Option<String>,
    /// PEM CA certificate to trust for an `https://` server (default: the system's roots).
    #[arg(
        long = "ca",
        env = "SKEIN_CA",
        value_name = "FILE",
        conflicts_with = "server_fingerprint"
    )]
    pub tls_ca: Option<PathBuf>,
}

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
/// downward API; each becomes a node label (see `crate::kubernetes`).
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

/// `skein up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// A fleet file: run one simulated agent per node instead of this machine's agent.
    #[arg(long, value_name = "FLEET.yaml")]
    pub fleet: Option<PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub engines: EngineArgs,
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

/// `skein server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address of the REST API.
    #[arg(long, env = "SKEIN_LISTEN", default_value = crate::cluster::DEFAULT_API_ADDR, value_name = "IP:PORT")]
    pub listen: String,
    /// Address agents join (gRPC); default `0.0.0.0:7879` for `skein server`, and
    /// `127.0.0.1:7879` for `skein up`, which is one machine (give `0.0.0.0:7879` to let
    /// agents elsewhere join it).
    #[arg(long, env = "SKEIN_AGENT_LISTEN", value_name = "IP:PORT")]
    pub agent_listen: Option<String>,
    /// Join token agents must present; default: the one in `<data dir>/join-token`,
    /// created on first start.
    #[arg(long, env = "SKEIN_JOIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Bearer token of the REST API; default: `<data dir>/api-token`, created on first
    /// start.
    #[arg(long, env = "SKEIN_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Where Skein keeps its state; default `$SKEIN_DATA_DIR`, `$XDG_DATA_HOME/skein` or
    /// `~/.local/share/skein`.
    #[arg(long, env = "SKEIN_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// How often agents sample and send telemetry.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub sample_interval: String,
    /// PEM certificate chain: serve both doors over TLS with it (with --tls-key).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Which doors speak TLS: `auto`, every door that listens beyond loopback (and both
    /// with --tls-cert); `on`, both; `off`, neither (tokens travel in clear). Without
    /// --tls-cert a self-signed certificate is made on first start in
    /// `<data dir>/tls` and its fingerprint printed, for clients to pin.
    #[arg(long, env = "SKEIN_TLS", value_enum, default_value_t = TlsMode::Auto)]
    pub tls: TlsMode,
    /// How long a client has to send a request's headers (and a new connection its
    /// first byte) before it is closed.
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub header_timeout: String,
    /// How long a connection with no request in flight stays open (a stream of events
    /// is a request in flight).
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub idle_timeout: String,
    /// Connections each door (REST, agents) holds at most; default: as many as the
    /// open-file limit allows, both doors together at most three quarters of it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_connections: Option<u64>,
    /// Memory the database (runs, sessions, tokens) may cache, in MiB.
    #[arg(long, default_value_t = 64, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub db_cache_mib: u64,
    /// Chat requests (chat completions, session turns) one user may have in flight at
    /// once; more are answered 429 with Retry-After.
    #[arg(long, env = "SKEIN_CHAT_REQUESTS_PER_USER", default_value_t = 16, value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub chat_requests_per_user: u64,
    /// Chat streams (server-sent events) one user may have open at once; more are
    /// answered 429 with Retry-After.
    #[arg(long, env = "SKEIN_CHAT_STREAMS_PER_USER", default_value_t = 8, value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub chat_streams_per_user: u64,
    /// Messages one chat request may carry; more are answered 413 (OpenAI's own limit is
    /// 2048).
    #[arg(long, env = "SKEIN_CHAT_MAX_MESSAGES", default_value_t = 2048, value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub chat_max_messages: u64,
    /// Text one chat request may carry (every string of its body), in KiB; more is
    /// answered 413. At most 4096 (4 MiB, about a million tokens), which a request body
    /// of the server's 16 MiB holds even escaped.
    #[arg(long, env = "SKEIN_CHAT_MAX_TEXT_KIB", default_value_t = 4096, value_name = "KIB",
        value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub chat_max_text_kib: u64,
    /// Hosts and address blocks endpoint agents may reach past the built-in refusals
    /// (loopback, link-local, this server's own addresses), comma-separated:
    /// `10.0.0.0/8,api.example.org,*.lab.example`. The most specific rule decides.
    #[arg(long, env = "SKEIN_ENDPOINT_ALLOW", value_delimiter = ',', value_name = "HOST|CIDR")]
    pub endpoint_allow: Vec<skein_orchestrator::egress::Rule>,
    /// Hosts and address blocks endpoint agents may not reach, comma-separated
    /// (`0.0.0.0/0,::/0` with --endpoint-allow: only the allowed ones).
    #[arg(long, env = "SKEIN_ENDPOINT_DENY", value_delimiter = ',', value_name = "HOST|CIDR")]
    pub endpoint_deny: Vec<skein_orchestrator::egress::Rule>,
}

/// Which of the server's doors speak TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsMode {
    /// Every door that listens beyond loopback; both when a certificate is given.
    Auto,
    /// Both doors.
    On,
    /// Neither door.
    Off,
}

/// `skein nodes`.
#[derive(Debug, Args)]
pub struct NodesArgs {
    /// The server's REST address.
    #[arg(long, default_value = "http://127.0.0.1:7878", value_name = "URL")]
    pub server: String,
    /// How to reach the server.
    #[command(flatten)]
    pub client: ApiClientArgs,
    /// Output format: a table, or the whole graph as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// Refresh every second until interrupted.
    #[arg(long)]
    pub watch: bool,
}

/// `skein models …`.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Show a model's shape and every variant: format, method, bits, size, valid
    /// tensor-parallel degrees.
    ///
    /// Reads `config.json` and the weight headers by HTTP range requests, never the
    /// weights, and caches them under the Hugging Face cache so a second run is offline.
    /// Honours HF_ENDPOINT, HF_TOKEN, HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE.
    Inspect(InspectArgs),
    /// Show, for each variant, which of the given GPU sets it fits and how, best first.
    ///
    /// Exits 0 when some variant fits some set, 1 when none does.
    Fit(FitArgs),
    /// Memory that instances on a running server really used once loaded, beside the
    /// plan's estimate for them.
    Measured(MeasuredArgs),
}

/// `skein models measured`.
#[derive(Debug, Args)]
pub struct MeasuredArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// Where and how much to read from the hub.
#[derive(Debug, Args)]
pub struct HubArgs {
    /// Quantized derivatives (the hub's `base_model:quantized:` list, most downloaded
    /// first) to list besides the repository's own variants; 0 for none.
    #[arg(long, default_value_t = skein_model_registry::hub::DEFAULT_DERIVATIVES, value_name = "N")]
    pub derivatives: usize,
    /// Read the weight headers of derivatives too, so their sizes are exact rather than
    /// computed (a GGUF header is up to a few MiB).
    #[arg(long)]
    pub derivative_headers: bool,
    /// A variant to list besides those discovered, repeatable: `owner/name`,
    /// `owner/name@REVISION`, or `owner/name:file.gguf` for one GGUF file. Its headers
    /// are read, so its figures are exact.
    #[arg(long = "variant", value_name = "REPO[@REV][:FILE]")]
    pub variants: Vec<String>,
    /// Accept repositories whose only weights are pickle files (`.bin`, `.pt`), which
    /// can run code when loaded.
    #[arg(long)]
    pub allow_pickle: bool,
    /// Use only the cache, as HF_HUB_OFFLINE=1 does.
    #[arg(long)]
    pub offline: bool,
}

/// `skein models inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The model: `owner/name`, or `owner/name@REVISION` (branch, tag or commit).
    #[arg(value_name = "REPO[@REV]")]
    pub model: String,
    /// Output format: a report, or one JSON document.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub hub: HubArgs,
}

/// `skein models fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// The model: `owner/name`, or `owner/name@REVISION`.
    #[arg(value_name = "REPO[@REV]")]
    pub model: String,
    /// A GPU set to check, repeatable: `A100-80GB`, `RTX4090-24GB:2` (two of them),
    /// `A100-80GB+RTX4090-24GB` (a mix, split by layers), or a size such as `48GiB`.
    #[arg(long = "gpu", required = true, value_name = "SET")]
    pub gpus: Vec<String>,
    /// Context tokens per sequence (prompt and generation).
    #[arg(long, default_value_t = 8192)]
    pub context: u64,
    /// Sequences served at once, each with the full context.
    #[arg(long, default_value_t = 1)]
    pub concurrency: u64,
    /// KV-cache element type; `auto` is the engine's default (16-bit).
    #[arg(long, value_enum, default_value_t = KvCacheType::Auto)]
    pub kv_cache: KvCacheType,
    /// Also list the variants that fit no set.
    #[arg(long)]
    pub all: bool,
    /// Output format: a report, or one JSON document.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub hub: HubArgs,
}

/// KV-cache element types on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvCacheType {
    /// The engine's default.
    Auto,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit float (vLLM).
    Fp8,
    /// ggml q8_0 blocks (llama.cpp).
    #[value(name = "q8_0")]
    Q8_0,
    /// ggml q4_0 blocks (llama.cpp).
    #[value(name = "q4_0")]
    Q4_0,
}

/// `skein validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Workflow files: `.yaml`, `.yml` or `.rhai`.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// Also print the workflow IR of valid files, as JSON (inside the report with `--output json`).
    #[arg(long)]
    pub print_ir: bool,
    /// Colour: auto (when stderr is a terminal and NO_COLOR is unset), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Compiler-style diagnostics on stderr, a summary line per file.
    Human,
    /// One JSON document on stdout.
    Json,
}

/// When to use ANSI colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// When the output is a terminal and `NO_COLOR` is unset.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}
