//! What users do with sessions: create one on a run's agent or on a model, send messages
//! (the reply comes from the instance the session is bound to, with the whole history),
//! list and read them, delete them, and move them to another GPU.
//!
//! Turns of one session are taken one at a time (a per-session async lock): a message
//! and its reply are written before the next message of that session is read. A
//! migration prepares the new instance while the session keeps serving on the old one,
//! then takes the lock only to switch the binding (one durable write): a turn in flight
//! finishes on the old instance first, and one whose instance died is retried, once,
//! on the session's next instance.

mod direct;
mod route;
mod turn;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skein_dsl::ir::{Agent, Backend};
use tokio::sync::mpsc;

use super::limits::{Admission, ChatLimits, Flight, LimitError, Permit};
use super::log::{CreateKey, Created, LogError, SessionLog};
use super::record::{self, Binding, Invalid, MessageRecord, NewMessage, SessionRecord};
use super::store::Page;
use crate::auth::Principal;
use crate::base::{lock, new_id, unix_ms};
use crate::engine_client::{Answer, CallError, Piece, Pieces, Route};
use crate::instances::{InstanceView, Instances};
use crate::run::{ContextWanted, Executor, Pin, ProvideError};
use crate::store::StoreError;

/// The most messages a page of messages holds.
pub const MAX_PAGE: usize = 1000;

/// Bytes of history per token of context assumed when choosing which messages fit the
/// model's context (English text averages about four; three leaves room).
pub const BYTES_PER_TOKEN: usize = 3;

/// How sessions behave.
#[derive(Debug, Clone)]
pub struct SessionsConfig {
    /// The longest a reply may take.
    pub reply_timeout: Duration,
    /// What one chat request and one user may ask at once.
    pub limits: ChatLimits,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            reply_timeout: Duration::from_secs(10 * 60),
            limits: ChatLimits::default(),
        }
    }
}

/// Why a session request failed; each maps to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No such session (or run) for this user.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be served as sent.
    #[error("{0}")]
    Invalid(String),
    /// No instance can serve the agent now.
    #[error("{0}")]
    Unavailable(String),
    /// The engine failed.
    #[error("{0}")]
    Engine(String),
    /// The store failed.
    #[error("the session store failed: {0}")]
    Store(String),
    /// The idempotency key was used with another request.
    #[error("{0}")]
    KeyReused(String),
    /// The store did not acknowledge in time or is overloaded: retry later.
    #[error("{0}")]
    StoreBusy(String),
    /// The request is over the size limits ([`ChatLimits`]).
    #[error("{0}")]
    TooLarge(String),
    /// The user has as many chat requests or streams as allowed: retry later.
    #[error("{0}")]
    Busy(String),
    /// The user or their group is at a quota (tokens a minute): retry later.
    #[error(transparent)]
    Quota(#[from] crate::sharing::quota::Refusal),
}

impl From<LimitError> for SessionError {
    fn from(e: LimitError) -> Self {
        match e {
            LimitError::TooLarge(message) => SessionError::TooLarge(message),
            LimitError::Busy(message) => SessionError::Busy(message),
        }
    }
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        if e.is_unavailable() {
            SessionError::StoreBusy(e.to_string())
        } else {
            SessionError::Store(e.to_string())
        }
    }
}

impl From<LogError> for SessionError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::NotFound(id) => SessionError::NotFound(format!("no session `{id}`; GET /v1/sessions lists them")),
            LogError::Store(e) if e.is_unavailable() => SessionError::StoreBusy(e.to_string()),
            e @ LogError::KeyReused { .. } => SessionError::KeyReused(e.to_string()),
            other => SessionError::Store(other.to_string()),
        }
    }
}

impl From<Invalid> for SessionError {
    fn from(e: Invalid) -> Self {
        SessionError::Invalid(e.to_string())
    }
}

/// What a new session talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An agent of a run (served by the run's instance while it lives).
    RunAgent {
        /// The run.
        run: String,
        /// The agent.
        agent: String,
    },
    /// A Hugging Face model of its own (`owner/name`).
    Model(String),
}

/// A session to create.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// What it talks to.
    pub target: Target,
    /// A system prompt instead of the agent's.
    pub system: Option<String>,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
}

/// Messages sent in one turn.
#[derive(Debug)]
pub struct Turn {
    /// The new messages: the user's and system ones, tool results, and assistant
    /// messages that call tools ([`record::check_turn`]).
    pub messages: Vec<NewMessage>,
    /// Request fields passed to the engine as given (`tools`, `tool_choice`,
    /// `parallel_tool_calls`, `response_format`), as [`Prompt::fields`].
    pub fields: serde_json::Map<String, serde_json::Value>,
    /// The client's idempotency key: a retried turn with the same key writes nothing
    /// again and answers with the first reply.
    pub idempotency_key: Option<String>,
    /// Where to send the reply's pieces (text and tool calls) as they are generated (a
    /// stream).
    pub tokens: Option<mpsc::Sender<Piece>>,
    /// Overrides of the agent's sampling and reply length for this turn.
    pub sampling: Sampling,
    /// Whether the agent answers; false only stores the messages (context a client
    /// adds without asking for a reply).
    pub reply: bool,
}

/// A completion's prompt as the engine takes it ([`Sessions::complete_prompt`]).
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    /// The messages, in OpenAI's form.
    pub messages: Vec<serde_json::Value>,
    /// Request fields passed to the engine as given (`tools`, `tool_choice`,
    /// `parallel_tool_calls`, `response_format`).
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// Sampling a client asks for, over the agent's.
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    /// Temperature (default: the agent's).
    pub temperature: Option<f64>,
    /// The most tokens to generate (default: the agent's).
    pub max_tokens: Option<u32>,
    /// Nucleus sampling, in (0, 1].
    pub top_p: Option<f64>,
    /// The engine's random seed.
    pub seed: Option<u64>,
    /// Strings that end the reply.
    pub stop: Vec<String>,
}

impl Sampling {
    /// The same bounds as a workflow's agents (temperature 0 to 2, at least one token),
    /// so a bad value is refused here with its name rather than by the engine.
    pub fn check(&self) -> Result<(), SessionError> {
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(SessionError::Invalid(format!(
                "`temperature` is {t}; give 0 (greedy) to 2"
            )));
        }
        if self.max_tokens == Some(0) {
            return Err(SessionError::Invalid(
                "`max_tokens` is 0; give at least 1, or leave it out for the agent's default".to_owned(),
            ));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(SessionError::Invalid(format!(
                "`top_p` is {p}; give more than 0, up to 1"
            )));
        }
        Ok(())
    }

    /// Writes the sampling fields of an engine request: these, else the agent's.
    fn write(&self, agent: &Agent, body: &mut serde_json::Value) {
        if let Some(t) = self.temperature.or(agent.temperature) {
            body["temperature"] = serde_json::json!(t);
        }
        if let Some(m) = self.max_tokens.or(agent.max_tokens) {
            body["max_tokens"] = serde_json::json!(m);
        }
        if let Some(p) = self.top_p {
            body["top_p"] = serde_json::json!(p);
        }
        if let Some(seed) = self.seed {
            body["seed"] = serde_json::json!(seed);
        }
        if !self.stop.is_empty() {
            body["stop"] = serde_json::json!(self.stop);
        }
    }
}

/// Refuses chat with an instance of an embedding model, saying where its requests go.
fn chat_only(view: &InstanceView) -> Result<(), SessionError> {
    match &view.placement {
        Some(placement) if placement.task.is_embed() => Err(SessionError::Invalid(format!(
            "{} is an embedding model: it answers POST /v1/embeddings, not chat; talk to an agent on a chat model",
            placement.model
        ))),
        _ => Ok(()),
    }
}

/// The route to a ready instance for the agent `definition` (its adapter selected).
fn instance_route(view: InstanceView, definition: &Agent) -> Result<Route, SessionError> {
    chat_only(&view)?;
    Route::for_agent(&view, Some(definition))
        .map_err(SessionError::Unavailable)?
        .ok_or_else(|| SessionError::Unavailable(format!("instance {} has no address yet", view.name)))
}

/// The answer to a turn.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The session after it.
    pub session: SessionRecord,
    /// The reply, as stored (without a reply: the turn's last message).
    pub message: MessageRecord,
    /// True when the idempotency key was seen before: nothing new was generated.
    pub replayed: bool,
}

/// Where to move a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveTo {
    /// Wherever the planner likes, off the session's current GPUs.
    Auto,
    /// Anywhere on this node.
    Node(String),
    /// This GPU of this node.
    Gpu {
        /// The node's name.
        node: String,
        /// The GPU's index.
        gpu: u32,
    },
    /// This ready instance (a reflex moving sessions between an agent's replicas).
    Instance(String),
}

/// A finished move.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The session after it.
    pub session: SessionRecord,
    /// Where it was.
    pub from: Option<Binding>,
    /// Where it is.
    pub to: Binding,
    /// How long new turns could not start: the switch of the binding (written durably).
    pub downtime: Duration,
    /// How long the switch waited for a turn in flight to finish on the old instance.
    pub waited: Duration,
}

/// The sessions of a server. Cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

struct Inner {
    log: SessionLog,
    executor: Executor,
    instances: Arc<Instances>,
    config: SessionsConfig,
    /// One turn at a time per session.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Chat requests and streams in flight, per user.
    admission: Admission,
    ids: std::sync::atomic::AtomicU64,
}

/// The idempotency key under which the reply to the turn keyed `key` is stored (a
/// control character no client key may hold keeps the two apart).
fn reply_key(key: &str) -> String {
    format!("{key}\u{1f}reply")
}

/// The binding of a session to `view`.
fn binding_of(view: &InstanceView) -> Binding {
    Binding {
        instance: view.name.clone(),
        node: view.node_name.clone(),
        gpus: view.gpus.clone(),
        since: unix_ms(),
    }
}

impl Sessions {
    /// Sessions over `log`, served by instances the `executor` provides.
    pub fn new(log: SessionLog, executor: Executor, instances: Arc<Instances>, config: SessionsConfig) -> Sessions {
        Sessions {
            inner: Arc::new(Inner {
                log,
                executor,
                instances,
                config,
                turns: Mutex::default(),
                admission: Admission::default(),
                ids: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// A receiver that wakes after every change to any session (created, a message
    /// stored, moved, deleted).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.log.subscribe()
    }

    /// What one chat request and one user may ask at once.
    pub fn limits(&self) -> &ChatLimits {
        &self.inner.config.limits
    }

    /// Counts a chat request or stream of `principal` until the permit is dropped.
    ///
    /// Errors: [`SessionError::Busy`] when they have as many as [`ChatLimits`] allow;
    /// [`SessionError::Quota`] for a request when they or their group used their tokens
    /// of the minute.
    pub fn admit(&self, principal: &Principal, flight: Flight) -> Result<Permit, SessionError> {
        let limits = &self.inner.config.limits;
        let limit = match flight {
            Flight::Request => limits.max_requests_per_user,
            Flight::Stream => limits.max_streams_per_user,
        };
        if flight == Flight::Request {
            self.inner
                .executor
                .sharing()
                .check_tokens(&principal.user, crate::base::unix_ms())?;
        }
        Ok(self.inner.admission.admit(&principal.user, flight, limit)?)
    }

    fn turn_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = lock(&self.inner.turns);
        // Locks of sessions nobody waits on are dropped as new ones come.
        if turns.len() > 4096 {
            turns.retain(|_, l| Arc::strong_count(l) > 1);
        }
        Arc::clone(turns.entry(id.to_owned()).or_default())
    }

    /// Creates a session.
    ///
    /// Errors: [`SessionError::NotFound`] (the run), [`SessionError::Invalid`],
    /// [`SessionError::Quota`] (the sessions limit of the user or their group).
    pub async fn create(&self, principal: &Principal, new: NewSession) -> Result<SessionRecord, SessionError> {
        Ok(self.create_keyed(principal, new, None).await?.session)
    }

    /// [`Sessions::create`], once per idempotency `key` of the caller: a retry with the
    /// same key and request answers the session made the first time.
    ///
    /// Errors: as [`Sessions::create`]; a key used with another request is
    /// [`SessionError::KeyReused`].
    pub async fn create_keyed(
        &self,
        principal: &Principal,
        new: NewSession,
        key: Option<CreateKey>,
    ) -> Result<Created, SessionError> {
        if let Some(key) = &key {
            record::check_idempotency_key(&key.key)?;
        }
        record::check_metadata(&new.metadata)?;
        let (agent, run, mut definition, binding) = match &new.target {
            Target::RunAgent { run, agent } => {
                let definition = self.run_agent(principal, run, agent)?;
                let serving = self.inner.instances.pick(run, agent);
                (
                    agent.clone(),
                    Some(run.clone()),
                    definition,
                    serving.as_ref().map(binding_of),
                )
            }
            Target::Model(model) => (model.clone(), None, model_agent(model)?, None),
        };
        if let Some(system) = new.system {
            definition.system = Some(system);
        }
        let now = unix_ms();
        let session = SessionRecord {
            id: new_id('s', &self.inner.ids),
            owner: principal.user.clone(),
            agent,
            run,
            definition,
            binding,
            metadata: new.metadata,
            created_at: now,
            updated_at: now,
            messages: 0,
            migrations: 0,
        };
        // Counted against the sessions limits before it is written, and given back when
        // nothing new was made. A retry of a create already made is answered whatever
        // the limits (it makes nothing): the store is asked only when one is refused.
        let sharing = self.inner.executor.sharing();
        let reserved = match sharing.reserve_session(&principal.user) {
            Ok(()) => true,
            Err(refusal) => match &key {
                Some(key) if self.inner.log.store().created(&principal.user, &key.key)?.is_some() => false,
                _ => return Err(refusal.into()),
            },
        };
        let created = self.inner.log.create_keyed(session, key).await;
        if reserved && !created.as_ref().is_ok_and(|c| !c.replayed) {
            sharing.release_session(&principal.user);
        }
        Ok(created?)
    }

    /// The definition of `agent` in `run`, a run `principal` may see.
    fn run_agent(&self, principal: &Principal, run: &str, agent: &str) -> Result<Agent, SessionError> {
        let found = self
            .inner
            .executor
            .get(run)?
            .filter(|r| principal.may_see(&r.owner))
            .ok_or_else(|| SessionError::NotFound(format!("no run `{run}`; GET /v1/runs lists them")))?;
        found.workflow.agents.get(agent).cloned().ok_or_else(|| {
            SessionError::Invalid(format!(
                "run `{run}` has no agent `{agent}`; its agents: {}",
                found.workflow.agents.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })
    }

    /// The ready instance of the run for its agent that takes the next request, if
    /// there is one (among the agent's replicas, by their shares).
    fn run_instance(&self, run: &str, agent: &str) -> Option<InstanceView> {
        self.inner.instances.pick(run, agent)
    }

    /// What `name` (an OpenAI `model`) means to `principal`: an agent of their newest
    /// run that has one of that name, else a Hugging Face model of its own.
    ///
    /// Errors: [`SessionError::Invalid`] for a name that is neither.
    pub fn resolve(&self, principal: &Principal, name: &str) -> Result<Target, SessionError> {
        let newest = self
            .inner
            .executor
            .list()?
            .into_iter()
            .find(|r| principal.may_see(&r.owner) && r.workflow.agents.contains_key(name));
        match newest {
            Some(run) => Ok(Target::RunAgent {
                run: run.id,
                agent: name.to_owned(),
            }),
            None if name.contains('/') => Ok(Target::Model(name.to_owned())),
            None => Err(SessionError::NotFound(format!(
                "`{name}` is neither an agent of your runs nor a Hugging Face model (owner/name); GET /v1/models lists what is served"
            ))),
        }
    }

    /// A session of `principal` (another user's is "not found").
    ///
    /// Errors: [`SessionError::NotFound`].
    pub fn get(&self, principal: &Principal, id: &str) -> Result<SessionRecord, SessionError> {
        self.inner
            .log
            .store()
            .session(id)?
            .filter(|s| principal.may_see(&s.owner))
            .ok_or_else(|| SessionError::NotFound(format!("no session `{id}`; GET /v1/sessions lists them")))
    }

    /// A page of the principal's sessions (everyone's for the admin), oldest first.
    ///
    /// Errors: the store failed.
    pub fn list(&self, principal: &Principal, after: Option<&str>, limit: usize) -> Result<Page, SessionError> {
        let owner = (!principal.admin).then_some(principal.user.as_str());
        Ok(self
            .inner
            .log
            .store()
            .sessions(owner, after, limit.clamp(1, MAX_PAGE))?)
    }

    /// Messages of a session from sequence number `from`.
    ///
    /// Errors: [`SessionError::NotFound`].
    pub fn messages(
        &self,
        principal: &Principal,
        id: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<MessageRecord>, SessionError> {
        self.get(principal, id)?;
        Ok(self.inner.log.store().messages(id, from, limit.clamp(1, MAX_PAGE))?)
    }

    /// Deletes a session with its messages (after a turn in flight).
    ///
    /// Errors: [`SessionError::NotFound`].
    pub async fn delete(&self, principal: &Principal, id: &str) -> Result<(), SessionError> {
        let session = self.get(principal, id)?;
        let gate = self.turn_lock(id);
        let _turn = gate.lock().await;
        self.inner.log.delete(id).await?;
        lock(&self.inner.turns).remove(id);
        self.inner.executor.sharing().release_session(&session.owner);
        Ok(())
    }
}

/// An engine's chat request: `system` (the agent's prompt, when it goes first), then
/// `messages` (OpenAI's form), with `fields` as given and the sampling of `sampling`
/// over the `agent`'s. Requests with and without a session are made here alike.
fn engine_body(
    system: Option<&str>,
    messages: Vec<serde_json::Value>,
    fields: serde_json::Map<String, serde_json::Value>,
    sampling: &Sampling,
    agent: &Agent,
) -> serde_json::Value {
    let mut sent = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system {
        sent.push(serde_json::json!({"role": "system", "content": system}));
    }
    sent.extend(messages);
    let mut body = serde_json::Value::Object(fields);
    body["messages"] = serde_json::Value::Array(sent);
    sampling.write(agent, &mut body);
    body
}

/// The bytes of history a turn may send: the model's context less the reply's tokens, at
/// [`BYTES_PER_TOKEN`] (a remote endpoint's context is not known: 32k tokens).
pub fn history_budget(agent: &Agent, max_tokens: Option<u32>) -> usize {
    let context = match &agent.backend {
        Backend::Model(requirement) => requirement.context as usize,
        Backend::Endpoint(_) => 32_768,
    };
    let reply = max_tokens.or(agent.max_tokens).unwrap_or(0) as usize;
    context.saturating_sub(reply).saturating_mul(BYTES_PER_TOKEN)
}

/// A failed engine call as the client sees it: a refusal is the request's fault (400),
/// anything else the engine's (502).
fn engine_error(e: CallError) -> SessionError {
    match e {
        CallError::Refused(message) | CallError::Denied(message) => SessionError::Invalid(message),
        other => SessionError::Engine(other.to_string()),
    }
}

/// What context a session or request of `run` (none: a model named alone) asks of an
/// instance: its agent's, or any.
fn context_wanted(run: Option<&str>) -> ContextWanted {
    match run {
        Some(_) => ContextWanted::AtLeast,
        None => ContextWanted::Any,
    }
}

/// How many times a refused turn is sent again with half the history.
const HISTORY_SHRINKS: u32 = 3;

fn provide_error(e: ProvideError) -> SessionError {
    match e {
        ProvideError::Endpoint(_) => SessionError::Invalid(e.to_string()),
        ProvideError::NoSuchPlace(_) => SessionError::NotFound(e.to_string()),
        ProvideError::Unplaceable(_) => SessionError::Unavailable(e.to_string()),
        ProvideError::Failed(_) => SessionError::Engine(e.to_string()),
    }
}

/// The agent of a session on a model of its own: the model with the workflow
/// language's defaults (read through it, so a bad name gets its diagnostic).
pub fn model_agent(model: &str) -> Result<Agent, SessionError> {
    let quoted = serde_json::to_string(model).unwrap_or_default();
    let text =
        format!("name: session\nagents:\n  a: {{ model: {quoted} }}\nsteps:\n  - {{ id: s, agent: a, prompt: x }}\n");
    let parsed = skein_dsl::parse("session.yaml", &text);
    match parsed.workflow {
        Some(mut workflow) if !parsed.diagnostics.has_errors() => workflow
            .agents
            .remove("a")
            .ok_or_else(|| SessionError::Invalid(format!("`{model}` is not a model"))),
        _ => {
            let reason = parsed
                .diagnostics
                .iter()
                .map(|d| d.message.clone())
                .collect::<Vec<_>>()
                .join("; ");
            Err(SessionError::Invalid(format!(
                "`{model}` is not a Hugging Face model name ({reason}); write owner/name, e.g. Qwen/Qwen2.5-0.5B-Instruct"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_are_read_with_the_language_defaults() {
        let agent = model_agent("Qwen/Qwen2.5-0.5B-Instruct").unwrap();
        let Backend::Model(requirement) = agent.backend else {
            panic!("a model")
        };
        assert_eq!(requirement.repo, "Qwen/Qwen2.5-0.5B-Instruct");
        assert!(requirement.context > 0);
        let error = model_agent("not a model\n").unwrap_err().to_string();
        assert!(error.contains("owner/name"), "{error}");
    }
}
