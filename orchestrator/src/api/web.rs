//! The web page, served at `/` with its assets under `/web/`: the files of the
//! repository's `web/` folder, built into the binary so that a server needs nothing
//! beside it. The page carries no data; it asks for an API token and reads everything
//! through the API (`/v1/live` above all), so these routes need no token.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::Digest;

use super::error::ApiError;

/// One file of the page.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:literal) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!("../../../web/", $path)),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("activity.js", "text/javascript; charset=utf-8"),
    asset!("cards.js", "text/javascript; charset=utf-8"),
    asset!("dom.js", "text/javascript; charset=utf-8"),
    asset!("fleet.js", "text/javascript; charset=utf-8"),
    asset!("graph.js", "text/javascript; charset=utf-8"),
    asset!("layout.js", "text/javascript; charset=utf-8"),
    asset!("live.js", "text/javascript; charset=utf-8"),
    asset!("panels.js", "text/javascript; charset=utf-8"),
    asset!("runs.js", "text/javascript; charset=utf-8"),
    asset!("sse.js", "text/javascript; charset=utf-8"),
    asset!("state.js", "text/javascript; charset=utf-8"),
    asset!("usage.js", "text/javascript; charset=utf-8"),
    asset!("usageview.js", "text/javascript; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("vendor/d3.min.js", "text/javascript; charset=utf-8"),
    asset!("vendor/elk.bundled.js", "text/javascript; charset=utf-8"),
    asset!("vendor/LICENSES.txt", "text/plain; charset=utf-8"),
];

/// What the page may load and connect to: itself only (no inline scripts, no other
/// origins); styles set by the scripts are allowed.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Each asset's entity tag: the start of its SHA-256, computed once.
fn etags() -> &'static [String] {
    static ETAGS: OnceLock<Vec<String>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|asset| {
                let digest = sha2::Sha256::digest(asset.body);
                let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
                format!("\"{hex}\"")
            })
            .collect()
    })
}

fn serve(path: &str, request: &HeaderMap) -> Result<Response, ApiError> {
    let Some(index) = ASSETS.iter().position(|a| a.path == path) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no file `/web/{path}` in the web page"),
        ));
    };
    let asset = &ASSETS[index];
    let etag = &etags()[index];
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.body).into_response()
    };
    let headers = response.headers_mut();
    // Revalidated on every load: a new server's page replaces the old one at once.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    Ok(response)
}

/// `GET /`: the page.
pub(super) async fn index(request: HeaderMap) -> Result<Response, ApiError> {
    serve("index.html", &request)
}

/// `GET /favicon.ico`: the page's icon (an SVG), for browsers that ask for it there.
pub(super) async fn favicon(request: HeaderMap) -> Result<Response, ApiError> {
    serve("favicon.svg", &request)
}

/// `GET /web/{*path}`: its scripts (ES modules), styles and the vendored libraries' licences.
pub(super) async fn file(Path(path): Path<String>, request: HeaderMap) -> Result<Response, ApiError> {
    serve(&path, &request)
}

#[cfg(test)]
mod tests {
    use super::ASSETS;

    /// Every file of the page (`web/*`, `web/vendor/*` but its notes) is built in, so
    /// that a module the page imports is never a 404.
    #[test]
    fn every_file_of_the_page_is_served() {
        let web = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../web");
        let mut missing = Vec::new();
        for folder in ["", "vendor/"] {
            let Ok(entries) = std::fs::read_dir(web.join(folder)) else {
                panic!("no folder web/{folder}");
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let served =
                    [".js", ".css", ".html", ".svg"].iter().any(|e| name.ends_with(e)) || name == "LICENSES.txt";
                let path = format!("{folder}{name}");
                if served && !ASSETS.iter().any(|a| a.path == path) {
                    missing.push(path);
                }
            }
        }
        assert!(missing.is_empty(), "web files not served: {missing:?}");
    }
}
