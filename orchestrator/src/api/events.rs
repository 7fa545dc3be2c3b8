//! Reflex events over REST: `GET /v1/events?limit=&after=` (newest first, a page at a
//! time) and `GET /v1/events/stream` (server-sent events `reflex`, each event as it is
//! recorded). A user sees the events of their own runs; the admin sees all.

use std::convert::Infallible;

use axum::Json;
use axum::extract::{Extension, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use tokio::sync::broadcast;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::Params;
use super::openapi::ServerSentEvent;
use super::paging::{Listed, PageQuery};
use super::{ApiState, Principal};
use crate::reflex::EventRecord;

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(list)).routes(routes!(stream))
}

/// What reflexes did (fired, released, failed to evaluate), with the values that made
/// them and each action's outcome, newest first, a page at a time.
#[utoipa::path(get, operation_id = "list_events", path = "/v1/events", tag = "reflexes", params(PageQuery),
    responses(
        (status = 200, description = "A page of events", body = Listed<EventRecord, String>),
        (status = 400, description = "A bad query", body = ErrorBody),
    ))]
async fn list(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(query): Params<PageQuery>,
) -> Result<Json<Listed<EventRecord, String>>, ApiError> {
    let limit = query.limit()?;
    let (data, more) = state
        .reflex_events
        .page(query.after.as_deref(), limit, |event| principal.may_see(&event.owner))
        .map_err(ApiError::internal)?;
    let next = if more {
        data.last().map(|event| event.id.clone())
    } else {
        None
    };
    Ok(Json(Listed { data, next }))
}

/// Reflex events as they are recorded: `event: reflex` with the event as data (and
/// `lagged` with the number missed when the reader falls behind), without end.
#[utoipa::path(get, operation_id = "stream_events", path = "/v1/events/stream", tag = "reflexes",
    responses((status = 200, description = "An endless event stream", body = ServerSentEvent, content_type = "text/event-stream")))]
async fn stream(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receiver = state.reflex_events.subscribe();
    let events = futures::stream::unfold((receiver, principal), |(mut receiver, principal)| async move {
        loop {
            let event = match receiver.recv().await {
                Ok(event) if principal.may_see(&event.owner) => Event::default()
                    .event("reflex")
                    .data(serde_json::to_string(&event).unwrap_or_default()),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(missed)) => Event::default()
                    .event("lagged")
                    .data(format!("{{\"missed\":{missed}}}")),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            return Some((Ok(event), (receiver, principal)));
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
