//! Lists a page at a time: `{"data": [...], "next": cursor | null}` and the
//! `?limit=&after=` that asks for a page.

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::error::ApiError;

/// A page of a list: `{"data": [...], "next": cursor | null}`; `next` is the cursor
/// of the following page (`after=` for runs and sessions, `from=` for messages), null
/// on the last.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Listed<T, C> {
    /// The items.
    pub data: Vec<T>,
    /// The cursor of the next page.
    pub next: Option<C>,
}

impl<T> Listed<T, String> {
    /// A page: the first `limit` of `rest` (the items past the cursor, in list order),
    /// with `next` (the last item's `cursor`) when more remain.
    pub(crate) fn cut(mut rest: impl Iterator<Item = T>, limit: usize, cursor: impl Fn(&T) -> String) -> Self {
        let data: Vec<T> = rest.by_ref().take(limit).collect();
        let next = rest.next().and(data.last().map(cursor));
        Listed { data, next }
    }
}

/// `?limit=&after=` of a list by id.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Items per page: 1 to 1000, default 100.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` of the previous page.
    #[serde(default)]
    pub after: Option<String>,
}

impl PageQuery {
    /// The page size asked for (default 100), or 400 outside 1 to 1000.
    pub(crate) fn limit(&self) -> Result<usize, ApiError> {
        page_size(self.limit)
    }
}

/// A page size (default 100), or 400 outside 1 to [`MAX_PAGE`](crate::session::service::MAX_PAGE).
pub(crate) fn page_size(limit: Option<usize>) -> Result<usize, ApiError> {
    let max = crate::session::service::MAX_PAGE;
    match limit {
        None => Ok(100),
        Some(limit) if (1..=max).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`limit` is {limit}; ask for 1 to {max} items a page, and follow `next` for more"),
        )),
    }
}
