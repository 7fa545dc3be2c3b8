//! The reflex event log: every decision of the engine (a reflex fired, was released, or
//! could not be evaluated), what it did and how that went, durable in sled before it is
//! announced, served at `GET /v1/events` and as a stream.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use serde::{Deserialize, Serialize};
use skein_dsl::ir::Action;
use tokio::sync::broadcast;

use crate::base::UnixMs;
use crate::store::{Db, StoreError, Tree};

/// Events a slow stream reader may fall behind by before it is told it missed some.
const STREAM_BUFFER: usize = 1024;

/// What happened to a reflex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Its condition held for its `for`: its actions were taken.
    Fire,
    /// Its release held for its cooldown: what it added may go.
    Release,
    /// Its condition could not be evaluated.
    Error,
}

/// How an action went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Done.
    Done,
    /// A dry run: recorded, not done.
    WouldDo,
    /// Nothing to do (the detail says why: at `max_replicas`, no clone to reroute to).
    Skipped,
    /// Tried, and failed (the detail says why).
    Failed,
}

/// One action of a firing and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionRecord {
    /// The action as the workflow declares it (`{"clone": {"count": 1}}`).
    #[schema(value_type = Object)]
    pub action: Action,
    /// How it went.
    pub outcome: Outcome,
    /// What was done (the new instance, the sessions moved), or why it failed.
    pub detail: String,
}

/// A reflex event as stored and served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventRecord {
    /// `e…`, ordered by time.
    pub id: String,
    /// When the engine decided (on the orchestrator's clock).
    pub at: UnixMs,
    /// When the GPU sample that decided it was taken, on its agent's clock (a decision
    /// on telemetry); `at` less this is the reaction time, transport included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_at: Option<UnixMs>,
    /// The run whose workflow declares the reflex.
    pub run: String,
    /// Who submitted that run.
    pub owner: String,
    /// The reflex's name.
    pub reflex: String,
    /// Fire, release or error.
    pub kind: EventKind,
    /// The metrics its condition reads, as they were.
    pub values: BTreeMap<String, f64>,
    /// The actions taken, in order, with their outcomes.
    pub actions: Vec<ActionRecord>,
    /// Why the condition could not be evaluated (errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Only recorded, nothing done.
    pub dry_run: bool,
}

/// The event log.
#[derive(Clone)]
pub struct Events {
    tree: Tree<EventRecord>,
    changes: broadcast::Sender<EventRecord>,
    ids: Arc<AtomicU64>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// The log in `db`.
    pub fn open(db: &Db) -> Result<Events, StoreError> {
        Ok(Events {
            tree: db.tree("reflex_events")?,
            changes: broadcast::channel(STREAM_BUFFER).0,
            ids: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Stores `event` under a new id (flushed before this returns), then announces it.
    pub async fn record(&self, mut event: EventRecord) -> Result<EventRecord, StoreError> {
        event.id = crate::base::new_id('e', &self.ids);
        self.tree.put(&event.id, &event).await?;
        let _ = self.changes.send(event.clone());
        Ok(event)
    }

    /// Up to `limit` events that `visible` admits, newest first, older than `before`
    /// (an event id); and whether more remain.
    pub fn page(
        &self,
        before: Option<&str>,
        limit: usize,
        visible: impl Fn(&EventRecord) -> bool,
    ) -> Result<(Vec<EventRecord>, bool), StoreError> {
        let mut events = Vec::new();
        for event in self.tree.newest_first(before) {
            let event = event?;
            if !visible(&event) {
                continue;
            }
            if events.len() == limit {
                return Ok((events, true));
            }
            events.push(event);
        }
        Ok((events, false))
    }

    /// Events as they are recorded.
    pub fn subscribe(&self) -> broadcast::Receiver<EventRecord> {
        self.changes.subscribe()
    }
}
