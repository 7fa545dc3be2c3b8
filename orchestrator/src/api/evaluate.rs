//! Workflow text sent to the API is read (a script run, its expressions
//! compiled) on the Rhai threads of [`skein_dsl::pool`], never on a runtime
//! worker, and only a few at a time per user: beyond
//! [`MAX_EVALUATIONS_PER_USER`] the request is answered 429.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use axum::http::StatusCode;
use skein_dsl::{Parsed, SourceKind};

use super::Principal;
use super::error::ApiError;

/// Workflows one user may have read at once through the API (plans, runs).
pub const MAX_EVALUATIONS_PER_USER: usize = 2;

/// Workflows being read now, by user. The pool these guard is process-wide,
/// so the count is too.
static IN_FLIGHT: LazyLock<Mutex<HashMap<String, usize>>> = LazyLock::new(Mutex::default);

/// One of a user's evaluation slots, given back when dropped.
struct Slot {
    user: String,
}

impl Slot {
    fn take(user: &str) -> Option<Slot> {
        let mut in_flight = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        let count = in_flight.entry(user.to_owned()).or_insert(0);
        if *count >= MAX_EVALUATIONS_PER_USER {
            return None;
        }
        *count += 1;
        Some(Slot { user: user.to_owned() })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut in_flight = IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = in_flight.get_mut(&self.user) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.user);
            }
        }
    }
}

/// Read `text` as a workflow in `kind` on the Rhai pool, for `principal`.
/// 429 when the user has [`MAX_EVALUATIONS_PER_USER`] being read already or
/// the pool's queue is full.
pub(crate) async fn parse(principal: &Principal, name: &str, text: &str, kind: SourceKind) -> Result<Parsed, ApiError> {
    let Some(slot) = Slot::take(&principal.user) else {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{MAX_EVALUATIONS_PER_USER} of your workflows are being evaluated already; send this one when one of them is answered"
            ),
        ));
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (name, text) = (name.to_owned(), text.to_owned());
    // The slot goes with the job: a client that hangs up does not free it
    // before the evaluation ends.
    skein_dsl::pool::try_submit(move || {
        let parsed = skein_dsl::parse_as(&name, &text, kind);
        drop(slot);
        let _ = tx.send(parsed);
    })
    .map_err(|e| ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()))?;
    rx.await
        .map_err(|_| ApiError::internal("the workflow's evaluation stopped without an answer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_counted_per_user_and_given_back() {
        let a: Vec<Slot> = (0..MAX_EVALUATIONS_PER_USER)
            .map(|_| Slot::take("slots-test-a").expect("a slot"))
            .collect();
        assert!(Slot::take("slots-test-a").is_none());
        assert!(Slot::take("slots-test-b").is_some());
        drop(a);
        assert!(Slot::take("slots-test-a").is_some());
    }
}
