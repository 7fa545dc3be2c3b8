//! `GET /v1/usage`: what users and groups used, summed by the dimensions asked for, as
//! JSON or CSV (docs/sharing.md, "Usage"). The admin sees everyone's; others their own.

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::Params;
use super::{ApiState, Principal};
use crate::base::{UnixMs, unix_ms};
use crate::sharing::usage::{Counts, Dimension, Query, Row, csv};

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(usage))
}

/// How far back a query looks when it names no `since`.
const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Which usage, summed by what.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    /// From when: RFC 3339 (`2026-11-01T00:00:00Z`) or a duration before now (`7d`,
    /// `24h`); by default 7 days ago. Usage is kept by the hour: the hour it falls in
    /// counts whole.
    #[serde(default)]
    since: Option<String>,
    /// Until when, in the same forms; by default now.
    #[serde(default)]
    until: Option<String>,
    /// Only this user's (the admin only may name another user).
    #[serde(default)]
    user: Option<String>,
    /// Only this group's.
    #[serde(default)]
    group: Option<String>,
    /// Only this model's (the repository served, or an endpoint's model).
    #[serde(default)]
    model: Option<String>,
    /// Only this agent's.
    #[serde(default)]
    agent: Option<String>,
    /// What rows are summed by, comma-separated: `group`, `user`, `model`, `agent`,
    /// `day`, `hour`; by default `group,user`; empty for the total alone.
    #[serde(default)]
    by: Option<String>,
    /// `json` (the default) or `csv`.
    #[serde(default)]
    format: Option<String>,
}

/// Usage in a window, summed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct UsageReport {
    /// The window's start.
    #[schema(value_type = String, format = DateTime)]
    since: UnixMs,
    /// Its end.
    #[schema(value_type = String, format = DateTime)]
    until: UnixMs,
    /// What the rows are summed by.
    by: Vec<Dimension>,
    /// A row for each combination of the dimensions' values that used anything.
    rows: Vec<Row>,
    /// The sum of the rows.
    total: Counts,
}

/// What users and groups used: model calls, tokens in and out, GPU memory × time,
/// GPU-hours and run time, by the hour, summed by the dimensions asked for.
#[utoipa::path(get, operation_id = "get_usage", path = "/v1/usage", tag = "sharing", params(UsageQuery),
    responses(
        (status = 200, description = "The usage, as JSON (or CSV with `format=csv`)", content(
            (UsageReport = "application/json"),
            (String = "text/csv"),
        )),
        (status = 400, description = "A time, dimension or format that cannot be read", body = ErrorBody),
        (status = 403, description = "Another user's usage, asked by someone not the admin", body = ErrorBody),
    ))]
async fn usage(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(asked): Params<UsageQuery>,
) -> Result<Response, ApiError> {
    let bad = |message: String| ApiError::new(StatusCode::BAD_REQUEST, message);
    let now = unix_ms();
    let since = match asked.since.as_deref() {
        Some(text) => instant("since", text, now).map_err(bad)?,
        None => UnixMs(now.0 - DEFAULT_WINDOW.as_millis() as i64),
    };
    let until = match asked.until.as_deref() {
        Some(text) => instant("until", text, now).map_err(bad)?,
        None => now,
    };
    if until.0 < since.0 {
        return Err(bad(format!("`until` ({until}) is before `since` ({since})")));
    }
    let by = Dimension::parse_list(asked.by.as_deref().unwrap_or("group,user")).map_err(bad)?;
    let as_csv = match asked.format.as_deref() {
        None | Some("json") => false,
        Some("csv") => true,
        Some(other) => return Err(bad(format!("`format`: `{other}` is neither `json` nor `csv`"))),
    };
    // Others see only their own.
    let user = match asked.user {
        Some(user) if !principal.may_see(&user) => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "only the admin sees another user's usage",
            ));
        }
        Some(user) => Some(user),
        None if principal.admin => None,
        None => Some(principal.user.clone()),
    };
    let query = Query {
        since,
        until,
        user,
        group: asked.group,
        model: asked.model,
        agent: asked.agent,
        by,
    };
    let rows = state.executor.sharing().usage(&query).await?;
    if as_csv {
        let kind = [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (header::CONTENT_DISPOSITION, "attachment; filename=\"skein-usage.csv\""),
        ];
        return Ok((kind, csv(&rows, &query.by)).into_response());
    }
    let mut total = Counts::default();
    for row in &rows {
        total.add(&row.counts);
    }
    Ok(Json(UsageReport {
        since,
        until,
        by: query.by,
        rows,
        total,
    })
    .into_response())
}

/// The time `text` names for `what`: RFC 3339, `now`, or a duration before `now`.
fn instant(what: &str, text: &str, now: UnixMs) -> Result<UnixMs, String> {
    if text == "now" {
        return Ok(now);
    }
    if let Ok(time) = humantime::parse_rfc3339_weak(text) {
        return Ok(UnixMs::of(time));
    }
    match humantime::parse_duration(text) {
        Ok(ago) => Ok(UnixMs(
            now.0.saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX)),
        )),
        Err(_) => Err(format!(
            "`{what}`: `{text}` is neither a time (RFC 3339, as `2026-11-01T00:00:00Z`) nor a duration before now (as `7d` or `24h`)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_rfc3339_now_or_a_duration_ago() {
        let now = UnixMs(1_800_000_000_000);
        assert_eq!(instant("since", "now", now), Ok(now));
        assert_eq!(instant("since", "1h", now), Ok(UnixMs(now.0 - 3_600_000)));
        assert_eq!(
            instant("since", "2026-11-01T00:00:00Z", now),
            Ok(UnixMs(1_793_491_200_000))
        );
        let error = instant("until", "yesterday", now).unwrap_err();
        assert!(error.starts_with("`until`: `yesterday` is neither"), "{error}");
    }
}
