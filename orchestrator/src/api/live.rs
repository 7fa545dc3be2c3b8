//! The live feed of the web page, `GET /v1/live`: one server-sent event stream that
//! carries everything the page shows, so a browser holds one connection (HTTP/1.1 allows
//! six per origin) and never polls.
//!
//! It opens with the whole picture (`hello`, `graph`, `instances`, `runs`, `sessions`,
//! `reflexes`), then sends changes: `telemetry` (the latest sample of every GPU of the
//! nodes that reported since the last one), `node` (a node registered, connected,
//! disconnected or changed health: its whole view), `instances`, `runs` and `sessions`
//! (the list again after a change), and `reflex` (an event as it is recorded). Changes
//! are gathered and sent at most every [`FLUSH`], so a fleet of a thousand GPUs that all
//! report every second costs the page four small messages a second; reflex events go at
//! once. A reader that falls behind the graph's changes gets the whole `graph` again. A
//! list the server cannot read (a storage error) becomes an `error` event saying so.
//!
//! A user sees their own runs, sessions and reflex events (the admin: everyone's); the
//! graph and the instances are the fleet's.

use std::collections::BTreeSet;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::openapi::ServerSentEvent;
use super::runs::RunSummary;
use super::{ApiState, Principal};
use crate::graph::{GpuSample, GraphEvent, Health, HostSample, Millis, NodeId};
use crate::reflex::EventRecord;

/// How often gathered changes are sent.
pub const FLUSH: Duration = Duration::from_millis(250);

/// Runs in the `runs` list (newest first), reflex events in the opening `reflexes`
/// (newest first), sessions in the `sessions` list (oldest first).
pub const RUNS: usize = 100;
/// See [`RUNS`].
pub const REFLEX_EVENTS: usize = 100;
/// See [`RUNS`].
pub const SESSIONS: usize = crate::session::service::MAX_PAGE;

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(live))
}

/// Everything the web page shows, live: the whole picture first (`hello`, `graph`,
/// `instances`, `runs`, `sessions`, `reflexes`), then `telemetry`, `node`,
/// `instances`, `runs`, `sessions` and `reflex` events as things change (docs/web.md).
#[utoipa::path(get, operation_id = "live", path = "/v1/live", tag = "graph",
    responses((status = 200, description = "An endless event stream; each event's data is JSON", body = ServerSentEvent, content_type = "text/event-stream")))]
async fn live(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let feed = Feed::new(state, principal);
    let stream = futures::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok(event), feed))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// Who is watching, as the page shows it.
#[derive(Serialize)]
struct Hello<'a> {
    user: &'a str,
    admin: bool,
    sample_interval_ms: u64,
}

/// The latest state of one node's GPUs, in a `telemetry` event.
#[derive(Serialize)]
struct NodeTelemetry {
    node: NodeId,
    name: String,
    last_seen_ms: Option<Millis>,
    host: Option<HostSample>,
    gpus: Vec<GpuTelemetry>,
}

#[derive(Serialize)]
struct GpuTelemetry {
    index: u32,
    latest: Option<GpuSample>,
    health: Health,
    #[serde(skip_serializing_if = "Option::is_none")]
    drained: Option<String>,
}

/// The page's sessions: the first [`SESSIONS`], and whether there are more.
#[derive(Serialize)]
struct SessionList {
    data: Vec<crate::session::record::SessionRecord>,
    more: bool,
}

/// One reader's feed.
struct Feed {
    state: ApiState,
    principal: Principal,
    graph: broadcast::Receiver<GraphEvent>,
    reflexes: broadcast::Receiver<EventRecord>,
    instances: watch::Receiver<u64>,
    runs: watch::Receiver<(u64, String)>,
    sessions: watch::Receiver<u64>,
    tick: tokio::time::Interval,
    /// Events ready to go, oldest first.
    ready: VecDeque<Event>,
    /// Nodes that sent telemetry since the last flush.
    reported: BTreeSet<NodeId>,
    /// Nodes whose registration, connection or health changed since the last flush.
    changed: BTreeSet<NodeId>,
    whole_graph: bool,
    instances_changed: bool,
    runs_changed: bool,
    sessions_changed: bool,
}

/// An `error` event: what could not be read, and why (the page shows it; the stream
/// goes on, and the next change sends the list again).
fn failure(what: &str, error: &impl std::fmt::Display) -> Event {
    tracing::warn!(%error, "the live feed could not read the {what}");
    event(
        "error",
        &serde_json::json!({ "about": what, "message": format!("could not read the {what}: {error}") }),
    )
}

fn event(name: &str, data: &impl Serialize) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(data).unwrap_or_default())
}

impl Feed {
    fn new(state: ApiState, principal: Principal) -> Feed {
        let mut tick = tokio::time::interval(FLUSH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut feed = Feed {
            graph: state.events.subscribe(),
            reflexes: state.reflex_events.subscribe(),
            instances: state.instances.subscribe(),
            runs: state.executor.subscribe(),
            sessions: state.sessions.subscribe(),
            state,
            principal,
            tick,
            ready: VecDeque::new(),
            reported: BTreeSet::new(),
            changed: BTreeSet::new(),
            whole_graph: false,
            instances_changed: false,
            runs_changed: false,
            sessions_changed: false,
        };
        // Subscribed first, read second: a change made in between is sent twice, never
        // missed.
        let hello = Hello {
            user: &feed.principal.user,
            admin: feed.principal.admin,
            sample_interval_ms: feed.state.graph.config().sample_interval_ms,
        };
        feed.ready.push_back(event("hello", &hello));
        feed.ready.push_back(event("graph", &feed.state.graph.snapshot()));
        feed.ready.push_back(event("instances", &feed.state.instances.list()));
        feed.ready.push_back(feed.runs_event());
        feed.ready.push_back(feed.sessions_event());
        let principal = feed.principal.clone();
        let recent = feed
            .state
            .reflex_events
            .page(None, REFLEX_EVENTS, |e| principal.may_see(&e.owner));
        feed.ready.push_back(match recent {
            Ok((events, _)) => event("reflexes", &events),
            Err(e) => failure("reflex events", &e),
        });
        feed
    }

    /// The next event, or `None` when the server is stopping.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(event);
            }
            tokio::select! {
                received = self.graph.recv() => match received {
                    Ok(GraphEvent::Telemetry { node, .. }) => {
                        self.reported.insert(node);
                    }
                    Ok(GraphEvent::NodeRegistered { node, .. } | GraphEvent::NodeConnection { node, .. } | GraphEvent::Health { node, .. }) => {
                        self.changed.insert(node);
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => self.whole_graph = true,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                received = self.reflexes.recv() => match received {
                    Ok(record) if self.principal.may_see(&record.owner) => return Some(event("reflex", &record)),
                    Ok(_) => {}
                    // Missed events are in `GET /v1/events`; the page reads them again.
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        return Some(Event::default().event("lagged").data(format!("{{\"missed\":{missed}}}")));
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                changed = self.instances.changed() => {
                    changed.ok()?;
                    self.instances_changed = true;
                }
                changed = self.runs.changed() => {
                    changed.ok()?;
                    self.runs_changed = true;
                }
                changed = self.sessions.changed() => {
                    changed.ok()?;
                    self.sessions_changed = true;
                }
                _ = self.tick.tick() => self.flush(),
            }
        }
    }

    /// Turns the changes gathered since the last flush into events.
    fn flush(&mut self) {
        if self.whole_graph {
            self.whole_graph = false;
            self.reported.clear();
            self.changed.clear();
            self.ready.push_back(event("graph", &self.state.graph.snapshot()));
        }
        for id in std::mem::take(&mut self.changed) {
            self.reported.remove(&id);
            if let Some(node) = self.state.graph.node(&id) {
                self.ready.push_back(event("node", &node));
            }
        }
        if !self.reported.is_empty() {
            let nodes: Vec<NodeTelemetry> = std::mem::take(&mut self.reported)
                .iter()
                .filter_map(|id| self.state.graph.node(id))
                .map(|node| NodeTelemetry {
                    node: node.id.clone(),
                    name: node.inventory.name.clone(),
                    last_seen_ms: node.last_seen_ms,
                    host: node.host,
                    gpus: node
                        .gpus
                        .iter()
                        .map(|gpu| GpuTelemetry {
                            index: gpu.facts.index,
                            latest: gpu.latest,
                            health: gpu.health.clone(),
                            drained: gpu.drained.clone(),
                        })
                        .collect(),
                })
                .collect();
            self.ready.push_back(event("telemetry", &nodes));
        }
        if std::mem::take(&mut self.instances_changed) {
            self.ready.push_back(event("instances", &self.state.instances.list()));
        }
        if std::mem::take(&mut self.runs_changed) {
            self.ready.push_back(self.runs_event());
        }
        if std::mem::take(&mut self.sessions_changed) {
            self.ready.push_back(self.sessions_event());
        }
    }

    /// The newest [`RUNS`] runs the reader may see.
    fn runs_event(&self) -> Event {
        match self.state.executor.list() {
            Ok(runs) => {
                let runs: Vec<RunSummary> = runs
                    .iter()
                    .filter(|run| self.principal.may_see(&run.owner))
                    .take(RUNS)
                    .map(RunSummary::from)
                    .collect();
                event("runs", &runs)
            }
            Err(e) => failure("runs", &e),
        }
    }

    /// The reader's first [`SESSIONS`] sessions.
    fn sessions_event(&self) -> Event {
        match self.state.sessions.list(&self.principal, None, SESSIONS) {
            Ok(page) => event(
                "sessions",
                &SessionList {
                    more: page.next.is_some(),
                    data: page.sessions,
                },
            ),
            Err(e) => failure("sessions", &e),
        }
    }
}
