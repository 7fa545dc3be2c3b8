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

    /// The page this query asks for of `items` ordered by `id`: the first `limit`
    /// past `after`, with the last one's id as `next` when more remain.
    pub(crate) fn page_by_id<T>(
        &self,
        mut items: Vec<T>,
        id: impl Fn(&T) -> &str,
    ) -> Result<Listed<T, String>, ApiError> {
        let limit = self.limit()?;
        items.sort_by(|a, b| id(a).cmp(id(b)));
        let rest = items
            .into_iter()
            .filter(|item| self.after.as_deref().is_none_or(|after| id(item) > after));
        Ok(Listed::cut(rest, limit, |item| id(item).to_owned()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn query(limit: Option<usize>, after: Option<&str>) -> PageQuery {
        PageQuery {
            limit,
            after: after.map(str::to_owned),
        }
    }

    #[test]
    fn pages_by_id_follow_next_to_the_end() {
        let items = vec!["t-c", "t-a", "t-e", "t-b", "t-d"];
        let first = query(Some(2), None).page_by_id(items.clone(), |s| s).unwrap();
        assert_eq!((first.data, first.next.as_deref()), (vec!["t-a", "t-b"], Some("t-b")));
        let second = query(Some(2), Some("t-b")).page_by_id(items.clone(), |s| s).unwrap();
        assert_eq!((second.data, second.next.as_deref()), (vec!["t-c", "t-d"], Some("t-d")));
        let last = query(Some(2), Some("t-d")).page_by_id(items.clone(), |s| s).unwrap();
        assert_eq!((last.data, last.next), (vec!["t-e"], None));
        let error = query(Some(0), None).page_by_id(items, |s| s).unwrap_err();
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
    }
}
