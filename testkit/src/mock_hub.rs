//! A Hugging Face Hub on loopback for tests: the API routes `hf-hub` calls, file
//! downloads with `ETag`/`X-Repo-Commit`, and HTTP Range reads of large virtual files
//! whose bodies are generated on the fly (a header, then zeros) and never held in memory.
//! It counts requests and body bytes served, so tests can assert what crossed the wire.
//! It can turn hostile for chosen files ([`MockHub::hostile`]): ETag and commit headers
//! that name paths outside a client's cache.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

/// The most a single response body may hold: header reads are a few MiB, so anything
/// near this is a test reading tensor data by mistake.
const MAX_RESPONSE_BYTES: u64 = 256 << 20;

/// Range reads of a large virtual file longer than this are transfers of its content, not
/// header reads (which are a few MiB at most): the ones [`MockHub::hold_large_downloads`]
/// holds.
const MAX_HEADER_READ_BYTES: u64 = 16 << 20;

/// A file's content: real bytes, or a header followed by zeros up to a declared size.
#[derive(Clone)]
pub enum Body {
    /// The whole file.
    Bytes(Arc<Vec<u8>>),
    /// `prefix`, then zeros, `len` bytes in all.
    Virtual { prefix: Arc<Vec<u8>>, len: u64 },
}

impl Body {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> u64 {
        match self {
            Body::Bytes(bytes) => bytes.len() as u64,
            Body::Virtual { len, .. } => *len,
        }
    }

    /// Bytes `start..end`, generated.
    fn slice(&self, start: u64, end: u64) -> Vec<u8> {
        let prefix: &[u8] = match self {
            Body::Bytes(bytes) => bytes,
            Body::Virtual { prefix, .. } => prefix,
        };
        let mut out = vec![0u8; (end - start) as usize];
        let from_prefix_end = end.min(prefix.len() as u64);
        if start < from_prefix_end {
            let n = (from_prefix_end - start) as usize;
            out[..n].copy_from_slice(&prefix[start as usize..from_prefix_end as usize]);
        }
        out
    }
}

/// A model repository.
#[derive(Clone)]
pub struct MockRepo {
    pub id: String,
    pub sha: String,
    pub files: BTreeMap<String, Body>,
    pub tags: Vec<String>,
    /// Listed under `base_model:quantized:<this>`.
    pub quantized_from: Option<String>,
}

impl MockRepo {
    pub fn new(id: &str) -> MockRepo {
        MockRepo {
            id: id.to_owned(),
            sha: hex40(id),
            files: BTreeMap::new(),
            tags: Vec::new(),
            quantized_from: None,
        }
    }

    pub fn file(mut self, path: &str, bytes: impl Into<Vec<u8>>) -> MockRepo {
        self.files.insert(path.to_owned(), Body::Bytes(Arc::new(bytes.into())));
        self
    }

    pub fn virtual_file(mut self, path: &str, prefix: Vec<u8>, len: u64) -> MockRepo {
        assert!(prefix.len() as u64 <= len);
        self.files.insert(
            path.to_owned(),
            Body::Virtual {
                prefix: Arc::new(prefix),
                len,
            },
        );
        self
    }

    pub fn tags(mut self, tags: &[&str]) -> MockRepo {
        self.tags = tags.iter().map(|t| (*t).to_owned()).collect();
        self
    }

    pub fn quantized_from(mut self, base: &str) -> MockRepo {
        self.quantized_from = Some(base.to_owned());
        self
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.values().map(Body::len).sum()
    }
}

#[derive(Default)]
struct HubState {
    repos: Mutex<BTreeMap<String, MockRepo>>,
    requests: AtomicU64,
    bytes_served: AtomicU64,
    log: Mutex<Vec<String>>,
    authorizations: Mutex<Vec<String>>,
    /// Whether transfers of large virtual files hang after their headers.
    hold_large: std::sync::atomic::AtomicBool,
    /// Files (by path in the repository) answered with hostile headers.
    hostile: Mutex<BTreeMap<String, Hostile>>,
    /// Files whose range answers carry a `Content-Range` one byte off the range sent.
    misreported_ranges: Mutex<std::collections::BTreeSet<String>>,
    /// Files, with how many of their next range answers break off halfway.
    broken_ranges: Mutex<BTreeMap<String, u32>>,
}

/// Headers of a hostile (or intercepted) hub, for a file's answers: values that a client
/// joining them into cache paths turns into paths outside its cache.
#[derive(Clone, Debug, Default)]
pub struct Hostile {
    /// The `ETag` sent (quotes included), instead of a digest.
    pub etag: Option<String>,
    /// The `X-Repo-Commit` sent, instead of the commit.
    pub commit: Option<String>,
}

impl Hostile {
    /// A relative path from any folder of a cache up to the root (`../` many times) then
    /// down to `target`, absolute: joined to a cache path, it names `target` itself.
    pub fn escape_to(target: &std::path::Path) -> String {
        let relative = target.strip_prefix("/").unwrap_or(target);
        format!("{}{}", "../".repeat(48), relative.display())
    }

    /// An `ETag` of `"<escape to target>/etag"`.
    pub fn etag_to(target: &std::path::Path) -> Hostile {
        Hostile {
            etag: Some(format!("\"{}/etag\"", Hostile::escape_to(target))),
            commit: None,
        }
    }

    /// An `X-Repo-Commit` of `<escape to target>`: the pointer `snapshots/<commit>/<file>`
    /// becomes `target/<file>`.
    pub fn commit_to(target: &std::path::Path) -> Hostile {
        Hostile {
            etag: None,
            commit: Some(Hostile::escape_to(target)),
        }
    }
}

impl HubState {
    fn record(&self, method: &Method, uri: &Uri, headers: &HeaderMap) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let range = headers
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .map(|r| format!(" [{r}]"))
            .unwrap_or_default();
        self.log.lock().unwrap().push(format!("{method} {uri}{range}"));
        if let Some(auth) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            self.authorizations.lock().unwrap().push(auth.to_owned());
        }
    }

    fn repo(&self, owner: &str, name: &str) -> Option<MockRepo> {
        self.repos.lock().unwrap().get(&format!("{owner}/{name}")).cloned()
    }

    fn body(&self, status: StatusCode, headers: Vec<(header::HeaderName, String)>, body: Vec<u8>) -> Response {
        self.bytes_served.fetch_add(body.len() as u64, Ordering::SeqCst);
        let mut response = (status, body).into_response();
        for (name, value) in headers {
            response
                .headers_mut()
                .insert(name, HeaderValue::from_str(&value).unwrap());
        }
        response
    }

    fn json(&self, value: Value) -> Response {
        self.body(
            StatusCode::OK,
            vec![(header::CONTENT_TYPE, "application/json".to_owned())],
            serde_json::to_vec(&value).unwrap(),
        )
    }

    fn not_found(&self, code: &str, message: &str) -> Response {
        let mut response = self.body(
            StatusCode::NOT_FOUND,
            vec![(header::CONTENT_TYPE, "application/json".to_owned())],
            serde_json::to_vec(&json!({ "error": message })).unwrap(),
        );
        response
            .headers_mut()
            .insert("x-error-code", HeaderValue::from_str(code).unwrap());
        response
    }
}

/// The running mock; stops when dropped.
pub struct MockHub {
    pub url: String,
    state: Arc<HubState>,
    task: tokio::task::JoinHandle<()>,
    /// The runtime serving it, when started by [`MockHub::start_in_background`].
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockHub {
    /// Starts a hub on `127.0.0.1:0` serving `repos`.
    pub async fn start(repos: Vec<MockRepo>) -> MockHub {
        let state = Arc::new(HubState::default());
        for repo in repos {
            state.repos.lock().unwrap().insert(repo.id.clone(), repo);
        }
        let app = Router::new()
            .route("/api/models", get(list_models))
            .route("/api/models/{owner}/{name}", get(model_info))
            .route("/api/models/{owner}/{name}/revision/{rev}", get(model_info_at))
            .route("/api/models/{owner}/{name}/tree/{rev}", get(tree))
            .route("/{owner}/{name}/resolve/{rev}/{*file}", get(resolve))
            .fallback(fallback)
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        MockHub {
            url,
            state,
            task,
            runtime: None,
        }
    }

    /// Starts a hub on its own runtime, for synchronous tests (a CLI run in a child
    /// process, say). Call it outside any runtime.
    pub fn start_in_background(repos: Vec<MockRepo>) -> MockHub {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut hub = runtime.block_on(MockHub::start(repos));
        hub.runtime = Some(runtime);
        hub
    }

    /// From now on, a transfer of a large virtual file (more than a single response
    /// may hold: a model's weights), whole or in ranges longer than a header read,
    /// answers its headers and then sends nothing, like a hub that stalls: the download
    /// stays in progress for as long as the test runs, and no disk fills with zeros.
    /// Header reads are not held.
    pub fn hold_large_downloads(&self) {
        self.state.hold_large.store(true, Ordering::SeqCst);
    }

    /// From now on, range answers for `file` (its path in any repository) send the bytes
    /// asked for under a `Content-Range` that says they start one byte later, as a broken
    /// proxy could.
    pub fn misreport_ranges(&self, file: &str) {
        self.state.misreported_ranges.lock().unwrap().insert(file.to_owned());
    }

    /// From now on, answers for `file` (its path in any repository) carry `headers`.
    pub fn hostile(&self, file: &str, headers: Hostile) {
        self.state.hostile.lock().unwrap().insert(file.to_owned(), headers);
    }

    /// The next `count` range answers for `file` (its path in any repository) send half
    /// their bytes and then break the connection, as a network that drops does.
    pub fn break_ranges(&self, file: &str, count: u32) {
        self.state.broken_ranges.lock().unwrap().insert(file.to_owned(), count);
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Body bytes sent so far (JSON and file content).
    pub fn bytes_served(&self) -> u64 {
        self.state.bytes_served.load(Ordering::SeqCst)
    }

    /// `METHOD /path [range]` of every request so far.
    pub fn log(&self) -> Vec<String> {
        self.state.log.lock().unwrap().clone()
    }

    /// `Authorization` headers received.
    pub fn authorizations(&self) -> Vec<String> {
        self.state.authorizations.lock().unwrap().clone()
    }

    /// Points `command` (a `skein` process) at this hub with `cache` as its Hugging
    /// Face cache, and removes what else in the environment could change its answers
    /// (a token, offline mode, log filters, colours).
    pub fn environment<'c>(
        &self,
        command: &'c mut std::process::Command,
        cache: &std::path::Path,
    ) -> &'c mut std::process::Command {
        command
            .env("HF_ENDPOINT", &self.url)
            .env("HF_HOME", cache)
            .env("HF_HUB_CACHE", cache.join("hub"))
            .env_remove("HF_TOKEN")
            .env_remove("HF_TOKEN_PATH")
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
    }
}

async fn fallback(State(state): State<Arc<HubState>>, method: Method, uri: Uri, headers: HeaderMap) -> Response {
    state.record(&method, &uri, &headers);
    state.not_found("NotFound", &format!("mock hub has no route for {uri}"))
}

async fn list_models(
    State(state): State<Arc<HubState>>,
    Query(query): Query<BTreeMap<String, String>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    state.record(&method, &uri, &headers);
    let base = query
        .get("filter")
        .and_then(|f| f.strip_prefix("base_model:quantized:"))
        .map(str::to_owned);
    let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(1000);
    let listed: Vec<Value> = state
        .repos
        .lock()
        .unwrap()
        .values()
        .filter(|repo| base.is_some() && repo.quantized_from == base)
        .take(limit)
        .map(|repo| json!({ "_id": &repo.sha[..24], "id": repo.id, "modelId": repo.id, "tags": repo.tags }))
        .collect();
    state.json(Value::Array(listed))
}

fn info_json(repo: &MockRepo) -> Value {
    let siblings: Vec<Value> = repo.files.keys().map(|path| json!({ "rfilename": path })).collect();
    json!({
        "_id": &repo.sha[..24],
        "id": repo.id,
        "modelId": repo.id,
        "sha": repo.sha,
        "private": false,
        "tags": repo.tags,
        "siblings": siblings,
    })
}

async fn model_info(
    State(state): State<Arc<HubState>>,
    Path((owner, name)): Path<(String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    state.record(&method, &uri, &headers);
    match state.repo(&owner, &name) {
        Some(repo) => state.json(info_json(&repo)),
        None => state.not_found("RepoNotFound", "Repository not found"),
    }
}

async fn model_info_at(
    State(state): State<Arc<HubState>>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    state.record(&method, &uri, &headers);
    match state.repo(&owner, &name) {
        Some(repo) if rev == "main" || rev == repo.sha => state.json(info_json(&repo)),
        Some(_) => state.not_found("RevisionNotFound", "Invalid rev id"),
        None => state.not_found("RepoNotFound", "Repository not found"),
    }
}

async fn tree(
    State(state): State<Arc<HubState>>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    state.record(&method, &uri, &headers);
    match state.repo(&owner, &name) {
        Some(repo) if rev == "main" || rev == repo.sha => {
            let entries: Vec<Value> = repo
                .files
                .iter()
                .map(|(path, body)| json!({ "type": "file", "oid": hex40(path), "size": body.len(), "path": path }))
                .collect();
            state.json(Value::Array(entries))
        }
        Some(_) => state.not_found("RevisionNotFound", "Invalid rev id"),
        None => state.not_found("RepoNotFound", "Repository not found"),
    }
}

async fn resolve(
    State(state): State<Arc<HubState>>,
    Path((owner, name, rev, file)): Path<(String, String, String, String)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    state.record(&method, &uri, &headers);
    let Some(repo) = state.repo(&owner, &name) else {
        return state.not_found("RepoNotFound", "Repository not found");
    };
    if rev != "main" && rev != repo.sha {
        return state.not_found("RevisionNotFound", "Invalid rev id");
    }
    let Some(body) = repo.files.get(&file) else {
        return state.not_found("EntryNotFound", "Entry not found");
    };
    let total = body.len();
    // No X-Xet-Hash: that would send hf-hub down the Xet transfer path.
    let hostile = state.hostile.lock().unwrap().get(&file).cloned().unwrap_or_default();
    let etag = hostile
        .etag
        .unwrap_or_else(|| format!("\"{}\"", hex40(&format!("{}/{file}", repo.id))));
    let mut meta = vec![
        (header::ETAG, etag),
        (
            header::HeaderName::from_static("x-repo-commit"),
            hostile.commit.unwrap_or_else(|| repo.sha.clone()),
        ),
        (header::ACCEPT_RANGES, "bytes".to_owned()),
    ];
    if method == Method::HEAD {
        meta.push((header::HeaderName::from_static("x-linked-size"), total.to_string()));
        meta.push((header::CONTENT_LENGTH, total.to_string()));
        return state.body(StatusCode::OK, meta, Vec::new());
    }
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok());
    let span = range.and_then(|r| parse_range(r, total));
    let requested = span.map_or(total, |(start, end)| end - start);
    let transfer = total > MAX_RESPONSE_BYTES && requested > MAX_HEADER_READ_BYTES;
    if transfer && state.hold_large.load(Ordering::SeqCst) {
        let mut response = Response::new(axum::body::Body::from_stream(futures::stream::pending::<
            Result<Vec<u8>, std::io::Error>,
        >()));
        if let Some((start, end)) = span {
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
            meta.push((header::CONTENT_RANGE, format!("bytes {start}-{}/{total}", end - 1)));
        }
        for (name, value) in meta {
            response
                .headers_mut()
                .insert(name, HeaderValue::from_str(&value).unwrap());
        }
        response.headers_mut().insert(
            header::CONTENT_LENGTH,
            HeaderValue::from_str(&requested.to_string()).unwrap(),
        );
        return response;
    }
    let Some(range) = range else {
        if total > MAX_RESPONSE_BYTES {
            return state.body(
                StatusCode::INTERNAL_SERVER_ERROR,
                Vec::new(),
                b"mock hub refuses to send a whole large virtual file".to_vec(),
            );
        }
        return state.body(StatusCode::OK, meta, body.slice(0, total));
    };
    let Some((start, end)) = parse_range(range, total) else {
        meta.push((header::CONTENT_RANGE, format!("bytes */{total}")));
        return state.body(StatusCode::RANGE_NOT_SATISFIABLE, meta, Vec::new());
    };
    if end - start > MAX_RESPONSE_BYTES {
        return state.body(
            StatusCode::INTERNAL_SERVER_ERROR,
            Vec::new(),
            b"mock hub refuses a range this large".to_vec(),
        );
    }
    let shift = u64::from(state.misreported_ranges.lock().unwrap().contains(&file));
    meta.push((
        header::CONTENT_RANGE,
        format!("bytes {}-{}/{total}", start + shift, end - 1 + shift),
    ));
    let broken = match state.broken_ranges.lock().unwrap().get_mut(&file) {
        Some(left) if *left > 0 => {
            *left -= 1;
            true
        }
        _ => false,
    };
    if broken {
        let mut half = body.slice(start, end);
        half.truncate(half.len() / 2);
        state.bytes_served.fetch_add(half.len() as u64, Ordering::SeqCst);
        let parts: Vec<Result<Vec<u8>, std::io::Error>> =
            vec![Ok(half), Err(std::io::Error::other("mock hub breaks the connection"))];
        let mut response = Response::new(axum::body::Body::from_stream(futures::stream::iter(parts)));
        *response.status_mut() = StatusCode::PARTIAL_CONTENT;
        meta.push((header::CONTENT_LENGTH, (end - start).to_string()));
        for (name, value) in meta {
            response
                .headers_mut()
                .insert(name, HeaderValue::from_str(&value).unwrap());
        }
        return response;
    }
    state.body(StatusCode::PARTIAL_CONTENT, meta, body.slice(start, end))
}

/// `bytes=a-b`, `bytes=a-` or `bytes=-n` as a half-open range within `total`.
fn parse_range(range: &str, total: u64) -> Option<(u64, u64)> {
    let spec = range.strip_prefix("bytes=")?;
    let (first, last) = spec.split_once('-')?;
    let (start, end) = if first.is_empty() {
        let n: u64 = last.parse().ok()?;
        (total.saturating_sub(n), total)
    } else {
        let start: u64 = first.parse().ok()?;
        let end = if last.is_empty() {
            total
        } else {
            last.parse::<u64>().ok()?.saturating_add(1).min(total)
        };
        (start, end)
    };
    (start < end).then_some((start, end))
}

/// A deterministic 40-hex id (FNV-1a, widened) for commits, ETags and oids.
pub fn hex40(seed: &str) -> String {
    let mut out = String::new();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for round in 0u8..3 {
        for byte in seed.bytes().chain([round]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        out.push_str(&format!("{hash:016x}"));
    }
    out.truncate(40);
    out
}
