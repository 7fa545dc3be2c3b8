//! The workflow IR: what every later stage (planner, executor, reflexes)
//! consumes. Produced only by `lower` after validation, so a value of
//! these types is always a valid workflow: names resolve, steps form a DAG,
//! expressions compile.
//!
//! The IR holds no source positions, so the same workflow written in YAML or
//! in Rhai yields equal values.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod durations;
mod tools;
use durations::{duration, opt_duration};
pub use tools::{InFlight, ToolChoice, ToolRef, ToolServer, ToolTransport};

/// A validated workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    /// Workflow name (a [`is_valid_name`] name).
    pub name: String,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Values supplied at submission, by name.
    pub inputs: BTreeMap<String, Input>,
    /// Agents by name.
    pub agents: BTreeMap<String, Agent>,
    /// Steps in declaration order (a topological order of `after` is
    /// available from [`Workflow::topological_order`]).
    pub steps: Vec<Step>,
    /// Runtime policies.
    pub reflexes: Vec<Reflex>,
    /// Scheduling preferences for the whole workflow.
    pub placement: Placement,
    /// Tool servers (Model Context Protocol) the agents may call, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_servers: BTreeMap<String, ToolServer>,
}

/// A declared input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Input {
    /// Value type.
    #[serde(rename = "type")]
    pub ty: InputType,
    /// Used when the submission gives no value; an input without a default
    /// is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<InputValue>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Types an input may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputType {
    /// Text.
    String,
    /// A whole number.
    Integer,
    /// A number.
    Number,
    /// `true` or `false`.
    Boolean,
    /// A list of strings, numbers or booleans (what a `for_each` runs over).
    List,
}

/// A typed input value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum InputValue {
    /// Boolean.
    Boolean(bool),
    /// Integer.
    Integer(i64),
    /// Number.
    Number(f64),
    /// Text.
    String(String),
    /// A list (of an input of type `list`).
    List(Vec<InputValue>),
}

/// An agent: a model the orchestrator places, or a remote endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Agent {
    /// What serves the agent.
    pub backend: Backend,
    /// System prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Sampling temperature for this agent's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Cap on generated tokens per request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The tools this agent may call (`server.tool`, or `server.*` for all of a
    /// server's tools). With any, its steps run an agent loop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolRef>,
    /// Most model calls in one step's agent loop (the last must answer without
    /// calling a tool); [`DEFAULT_MAX_TURNS`] when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// What the first model call of a step's agent loop must do with the tools; later
    /// calls choose freely (`auto`), as the loop's last must answer. `None`: `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

/// Model calls in one step's agent loop when the agent does not say.
pub const DEFAULT_MAX_TURNS: u32 = 10;

/// The most `max_turns` a workflow may give an agent.
pub const MAX_TURNS: u32 = 100;

/// What serves an agent. Exactly one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// A Hugging Face model placed on the fleet.
    Model(ModelRequirement),
    /// A remote OpenAI-compatible endpoint.
    Endpoint(Endpoint),
}

/// What an agent needs from a model; the planner picks the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequirement {
    /// Hugging Face repository (`owner/name`).
    pub repo: String,
    /// Branch, tag or commit; `None` means the default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Variant repositories (or files in them) to consider besides those
    /// discovered from the hub.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<VariantPin>,
    /// Weight formats the agent accepts.
    pub formats: Vec<WeightFormat>,
    /// Context length in tokens the agent needs.
    pub context: u32,
    /// Requests the agent must serve at once.
    pub concurrency: u32,
    /// Lowest precision tier accepted.
    pub min_precision: Precision,
    /// What to optimise when several variants fit.
    pub prefer: Preference,
    /// Which GPUs may serve this model.
    pub gpu: GpuConstraints,
    /// The engines that may serve it, without duplicates, in [`EngineChoice::ALL`]
    /// order; empty means any engine (the planner chooses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engines: Vec<EngineChoice>,
    /// A LoRA adapter of `repo` the agent is served with: a PEFT repository (vLLM), or a
    /// llama.cpp GGUF adapter (its `file`). Agents whose adapters share a base share one
    /// base instance serving all their adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<Box<VariantPin>>,
}

/// A pinned variant: a repository, optionally one file in it (a GGUF file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantPin {
    /// Hugging Face repository.
    pub repo: String,
    /// One file in it, e.g. `model-Q4_K_M.gguf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Branch, tag or commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Weight file formats Skein loads (never pickle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    /// `.safetensors`.
    Safetensors,
    /// `.gguf`.
    Gguf,
}

impl WeightFormat {
    /// Every format, in preference order.
    pub const ALL: [WeightFormat; 2] = [WeightFormat::Safetensors, WeightFormat::Gguf];
    /// The name used in workflows.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Safetensors => "safetensors",
            WeightFormat::Gguf => "gguf",
        }
    }
}

/// Precision tiers, lowest first, so `a >= b` means "at least as precise".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// About 2 bits per weight.
    Int2,
    /// About 3 bits per weight.
    Int3,
    /// About 4 bits per weight (AWQ, GPTQ-4, Q4_K, bitsandbytes nf4).
    Int4,
    /// About 5 bits per weight (Q5_K).
    Int5,
    /// About 6 bits per weight (Q6_K).
    Int6,
    /// 8-bit integer (GPTQ-8, Q8_0, bitsandbytes int8).
    Int8,
    /// 8-bit float.
    Fp8,
    /// 16-bit float, bf16 or fp16.
    Bf16,
    /// 32-bit float.
    Fp32,
}

impl Precision {
    /// Every tier, lowest first.
    pub const ALL: [Precision; 9] = [
        Precision::Int2,
        Precision::Int3,
        Precision::Int4,
        Precision::Int5,
        Precision::Int6,
        Precision::Int8,
        Precision::Fp8,
        Precision::Bf16,
        Precision::Fp32,
    ];

    /// The name used in workflows.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Int2 => "int2",
            Precision::Int3 => "int3",
            Precision::Int4 => "int4",
            Precision::Int5 => "int5",
            Precision::Int6 => "int6",
            Precision::Int8 => "int8",
            Precision::Fp8 => "fp8",
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
        }
    }

    /// Parse a workflow name; `fp16` is the same tier as `bf16`.
    pub fn parse(s: &str) -> Option<Precision> {
        if s.eq_ignore_ascii_case("fp16") || s.eq_ignore_ascii_case("f16") {
            return Some(Precision::Bf16);
        }
        Precision::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to optimise among variants that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preference {
    /// Highest precision that fits.
    Quality,
    /// Highest modelled tokens per second.
    Speed,
    /// Fewest GPUs, then quality.
    FewestGpus,
}

impl Preference {
    /// Every preference.
    pub const ALL: [Preference; 3] = [Preference::Quality, Preference::Speed, Preference::FewestGpus];
    /// The name used in workflows.
    pub fn name(self) -> &'static str {
        match self {
            Preference::Quality => "quality",
            Preference::Speed => "speed",
            Preference::FewestGpus => "fewest_gpus",
        }
    }
}

/// An inference engine a workflow may allow for a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EngineChoice {
    /// Skein's built-in engine (candle): the CPU, safetensors (16/32-bit) or GGUF.
    #[serde(rename = "builtin")]
    Builtin,
    /// `llama-server`: GGUF, on GPUs, host RAM or the CPU.
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// `vllm serve`: safetensors on GPUs.
    #[serde(rename = "vllm")]
    Vllm,
}

impl EngineChoice {
    /// Every engine.
    pub const ALL: [EngineChoice; 3] = [EngineChoice::Builtin, EngineChoice::LlamaCpp, EngineChoice::Vllm];
    /// The name used in workflows.
    pub fn name(self) -> &'static str {
        match self {
            EngineChoice::Builtin => "builtin",
            EngineChoice::LlamaCpp => "llama.cpp",
            EngineChoice::Vllm => "vllm",
        }
    }
    /// The name plans give the engine (`candle` for the built-in one).
    pub fn plan_name(self) -> &'static str {
        match self {
            EngineChoice::Builtin => "candle",
            other => other.name(),
        }
    }
    /// The engine of a workflow name, case-insensitively; `candle` (the plan's name of
    /// the built-in engine) and `llama-cpp`/`llamacpp` are accepted too.
    pub fn parse(text: &str) -> Option<EngineChoice> {
        match text.trim().to_ascii_lowercase().as_str() {
            "builtin" | "built-in" | "candle" => Some(EngineChoice::Builtin),
            "llama.cpp" | "llama-cpp" | "llamacpp" => Some(EngineChoice::LlamaCpp),
            "vllm" => Some(EngineChoice::Vllm),
            _ => None,
        }
    }
    /// Whether the engine loads weights of `format`.
    pub fn loads(self, format: WeightFormat) -> bool {
        match self {
            EngineChoice::Builtin => true,
            EngineChoice::LlamaCpp => format == WeightFormat::Gguf,
            EngineChoice::Vllm => format == WeightFormat::Safetensors,
        }
    }
}

/// Which GPUs may serve a model. Empty lists mean "any".
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuConstraints {
    /// Accepted GPU models, matched case-insensitively as substrings of the
    /// device name (`A100`, `RTX 4090`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Accepted node names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Lowest CUDA compute capability accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_compute_capability: Option<ComputeCapability>,
    /// Smallest total memory per GPU accepted, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_memory_bytes: Option<u64>,
    /// Most GPUs one replica may span (overrides the workflow's
    /// `placement.max_gpus_per_agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
}

/// A CUDA compute capability such as 8.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
}

/// A remote OpenAI-compatible endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Base URL, `http` or `https`, e.g. `https://api.example.org/v1`.
    pub url: String,
    /// Model name sent in requests.
    pub model: String,
    /// The secret that holds the API key, stored with Skein by the user who runs
    /// the workflow (`skein secret set NAME`), or `shared/NAME` for one the admin
    /// published. The key itself never appears in a workflow, and a workflow never
    /// reads the server's environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<String>,
}

/// One step: a prompt sent to an agent (once, or once per item of a `for_each`),
/// or text a person approves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Unique step id.
    pub id: String,
    /// The agent that answers; empty for an approval step (a person answers).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent: String,
    /// The prompt, with `{{ expr }}` interpolations.
    pub prompt: Template,
    /// Steps that must finish first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// Run the step only when this holds (otherwise it is skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<Expr>,
    /// Loop back to an upstream step until a condition holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<Repeat>,
    /// Longest one attempt may take.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_duration")]
    pub timeout: Option<Duration>,
    /// Attempts after the first when the agent fails.
    pub retries: u32,
    /// The JSON Schema the answer must satisfy: the engine is asked for it
    /// (`response_format`), the answer is validated, and a non-conforming answer
    /// fails the attempt. Later steps read its fields as
    /// `steps.<id>.output.json.<field>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
    /// Run the step once per item of a list, in parallel up to a limit; its
    /// output is the JSON array of the items' answers, in the list's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<ForEach>,
    /// A step a person answers instead of an agent: the run waits until someone
    /// approves or rejects it. Its `prompt` is the text to approve, and its
    /// `agent` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
}

/// `for_each:` — one instance of the step per item of a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForEach {
    /// An expression whose value is the list (an input of type `list`, or an
    /// earlier step's JSON such as `steps.plan.output.json.topics`). The step's
    /// prompt reads the current item as `item` and its position as `index`
    /// (from 0).
    pub over: Expr,
    /// Most items whose attempts run at once.
    pub max_parallel: u32,
}

/// Items of a `for_each` that run at once when the workflow does not say.
pub const DEFAULT_MAX_PARALLEL: u32 = 4;

/// The most items one `for_each` may run at once.
pub const MAX_PARALLEL: u32 = 256;

/// The most items one `for_each` list may hold at run time.
pub const MAX_ITEMS: usize = 10_000;

/// `approval:` — a step that waits for a person.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// How long to wait; `None` waits until someone answers or the run is cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_duration")]
    pub timeout: Option<Duration>,
    /// What a timeout counts as.
    #[serde(default)]
    pub on_timeout: OnTimeout,
}

/// What an approval that nobody answered in time counts as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Rejected: the step fails, and the run with it.
    #[default]
    Reject,
    /// Approved: the run goes on.
    Approve,
}

/// `repeat:` — re-run from `back_to` through this step until `until` holds,
/// at most `max` times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repeat {
    /// An upstream step to go back to.
    pub back_to: String,
    /// Stop repeating when this holds.
    pub until: Expr,
    /// Most repetitions.
    pub max: u32,
}

/// A Rhai expression, checked to compile. Evaluated by [`crate::expr`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Expr(pub String);

impl Expr {
    /// The expression text.
    pub fn source(&self) -> &str {
        &self.0
    }
}

/// Text with `{{ expr }}` interpolations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// The template as written.
    pub source: String,
    /// Literal text and expressions, in order.
    pub parts: Vec<TemplatePart>,
}

/// A piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TemplatePart {
    /// Text copied as is.
    Text(String),
    /// An expression whose value is inserted.
    Expr(Expr),
}

/// A runtime policy over live telemetry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reflex {
    /// Unique reflex name.
    pub name: String,
    /// Condition over metrics (`gpu.util > 0.8`).
    pub when: Expr,
    /// How long the condition must hold before acting.
    #[serde(rename = "for", with = "duration")]
    pub hold: Duration,
    /// When given, the reflex releases only once this holds (hysteresis);
    /// otherwise when `when` no longer holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Expr>,
    /// How `gpu.*` metrics combine over the scope's GPUs.
    pub aggregate: Aggregate,
    /// What the reflex watches and acts on.
    pub scope: Scope,
    /// Actions, in order.
    pub actions: Vec<Action>,
    /// Least time between two firings.
    #[serde(with = "duration")]
    pub cooldown: Duration,
    /// Most replicas the reflex may grow an instance to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<u32>,
    /// Only record what would happen.
    pub dry_run: bool,
}

/// How per-GPU metrics combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// The largest value.
    Max,
    /// The mean.
    Avg,
    /// The smallest value.
    Min,
}

/// What a reflex watches and acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The instances serving one agent of this workflow.
    Agent(String),
    /// One model instance, by name.
    Instance(String),
    /// Every GPU of a node.
    Node(String),
    /// Every node carrying a zone label.
    Zone(String),
}

/// A reflex action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Add replicas, placed by the planner.
    Clone {
        /// How many.
        count: u32,
    },
    /// Where new sessions and requests go.
    Reroute(Reroute),
    /// Shrink a replica's share, scaling in once the condition is released.
    Decay {
        /// Which replicas shrink.
        target: DecayTarget,
        /// Remaining share of traffic, in (0, 1].
        capacity: f64,
    },
    /// Move sessions away.
    Migrate {
        /// Which sessions.
        sessions: SessionCount,
        /// Where to.
        to: MigrateTarget,
    },
    /// Stop placing on the scope's GPUs and move work away.
    Drain,
    /// Record an event only.
    Notify {
        /// Text recorded with the event.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
}

/// Where traffic goes after a reroute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reroute {
    /// New sessions and requests go to the newest replicas.
    New,
    /// All traffic spreads over all replicas.
    All,
    /// Traffic split by weight per replica group (`original`, `clones`).
    Weights(BTreeMap<String, f64>),
}

/// Which replicas a decay shrinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecayTarget {
    /// The replicas that existed before the reflex fired.
    Original,
    /// The replicas the reflex added.
    Clones,
}

/// How many sessions a migrate moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionCount {
    /// Every session.
    All,
    /// At most this many.
    Count(u32),
}

/// Where migrated sessions go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigrateTarget {
    /// Wherever the planner chooses.
    Auto,
    /// One GPU.
    Gpu {
        /// Node name.
        node: String,
        /// GPU index on the node.
        gpu: u32,
    },
}

/// Workflow-wide scheduling preferences.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Placement {
    /// Higher runs first and may preempt lower.
    pub priority: i32,
    /// Most GPUs one replica of any agent may span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus_per_agent: Option<u32>,
}

impl Workflow {
    /// The step with this id.
    pub fn step(&self, id: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.id == id)
    }

    /// Step ids in an order where every step follows all of its `after`
    /// steps; ties keep declaration order. Validation guarantees there is no
    /// cycle.
    pub fn topological_order(&self) -> Vec<&str> {
        let mut done: Vec<&str> = Vec::with_capacity(self.steps.len());
        while done.len() < self.steps.len() {
            let before = done.len();
            for s in &self.steps {
                if !done.contains(&s.id.as_str()) && s.after.iter().all(|a| done.contains(&a.as_str())) {
                    done.push(&s.id);
                }
            }
            if done.len() == before {
                // Unreachable for a validated workflow; never loop forever.
                break;
            }
        }
        done
    }
}

/// Whether `s` is a valid agent, step, input or reflex name: ASCII letters,
/// digits, `-` and `_`, starting with a letter, at most 64 bytes.
pub fn is_valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Whether `s` is a tool name a workflow may write (in `server.tool`, and as a key of
/// `in_flight`): 1 to 128 ASCII letters, digits, `-` and `_`. A server may declare
/// other names at run time; `server.*` still gives an agent those.
pub fn is_valid_tool_name(s: &str) -> bool {
    (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// Whether `s` is a valid secret name: ASCII letters, digits, `-`, `_` and `.`,
/// starting with a letter or digit, at most 64 bytes.
pub fn is_valid_secret_name(s: &str) -> bool {
    s.len() <= 64
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether `s` names a secret from a workflow: `NAME` (the user's own) or
/// `shared/NAME` (one the admin published).
pub fn is_valid_secret_reference(s: &str) -> bool {
    is_valid_secret_name(s.strip_prefix("shared/").unwrap_or(s))
}
