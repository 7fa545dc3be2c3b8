//! What the server tests share: a real server (gRPC and REST on loopback, sled in a
//! temporary directory) over the mock hub, and a REST client with the admin token.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use skein_orchestrator::agents::Secret;
use skein_orchestrator::graph::GraphConfig;
use skein_orchestrator::run::ExecutorConfig;
use skein_orchestrator::run::record::RetryPolicy;
use skein_orchestrator::server::{RunningServer, ServerConfig};
use skein_testkit::mock_hub::MockHub;

pub const TOKEN: &str = "join-secret";
pub const API: &str = "api-secret";
pub const PATIENCE: Duration = Duration::from_secs(30);

pub struct Setup {
    pub server: RunningServer,
    pub _hub: MockHub,
    pub _dirs: (tempfile::TempDir, tempfile::TempDir),
    pub http: reqwest::Client,
}

pub async fn setup(executor: ExecutorConfig, db: Option<&std::path::Path>) -> Setup {
    let hub = MockHub::start(skein_testkit::models::reference_hub_repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let client = skein_model_registry::hub::HubClientBuilder::from_config(
        skein_model_registry::hub::HubConfig::from_lookup(|_| None),
    )
    .endpoint(hub.url.clone())
    .cache_dir(cache.path())
    .build()
    .unwrap();
    let server = skein_orchestrator::server::start(ServerConfig {
        api_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        grpc_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        join_token: Secret::new(TOKEN).unwrap(),
        api_token: Secret::new(API).unwrap(),
        graph: GraphConfig {
            sample_interval_ms: 100,
            ..GraphConfig::default()
        },
        tls: None,
        transport: Default::default(),
        hub: client,
        db_dir: Some(db.map_or_else(|| data.path().join("db"), std::path::Path::to_owned)),
        db_cache_bytes: skein_orchestrator::store::CACHE_BYTES,
        executor,
        // The tests' mock endpoints listen on loopback.
        endpoints: skein_orchestrator::egress::EgressRules {
            allow: vec!["127.0.0.1".parse().unwrap()],
            deny: Vec::new(),
        },
        secrets_key: None,
        chat_limits: skein_orchestrator::session::ChatLimits::default(),
    })
    .await
    .unwrap();
    Setup {
        server,
        _hub: hub,
        _dirs: (cache, data),
        http: reqwest::Client::new(),
    }
}

/// The runtime benchmarks run the server on: two workers, as the machine has two cores.
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn quick() -> ExecutorConfig {
    ExecutorConfig {
        retry: RetryPolicy {
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
        },
        admission_interval: Duration::from_millis(100),
        ready_timeout: Duration::from_secs(20),
        ..ExecutorConfig::default()
    }
}

impl Setup {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.api_addr)
    }

    pub async fn submit(&self, workflow: &str, inputs: Value) -> reqwest::Response {
        self.http
            .post(self.url("/v1/runs"))
            .bearer_auth(API)
            .json(&json!({"workflow": workflow, "name": "w.yaml", "inputs": inputs}))
            .send()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> Value {
        let response = self.http.get(self.url(path)).bearer_auth(API).send().await.unwrap();
        assert!(response.status().is_success(), "{path}: {}", response.status());
        response.json().await.unwrap()
    }

    pub async fn wait_run(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let run = self.get(&format!("/v1/runs/{id}")).await;
            if done(&run) {
                return run;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out: {run:#}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Setup {
    /// A new token for `user`, made with the admin token.
    pub async fn token_for(&self, user: &str) -> String {
        let response = self
            .http
            .post(self.url("/v1/tokens"))
            .bearer_auth(API)
            .json(&json!({ "user": user }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.unwrap();
        body["token"].as_str().unwrap().to_owned()
    }

    /// `method path` with `token` (none: no Authorization header) and an optional JSON
    /// body: the status and the JSON answer (`null` when there is none).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self.http.request(method, self.url(path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

impl Setup {
    /// Waits until `nodes` nodes report free GPU memory (their first telemetry arrived).
    pub async fn wait_nodes(&self, nodes: usize) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let listed = self.get("/v1/nodes").await;
            let sampled = listed
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["gpu_memory_free"].as_u64().unwrap_or(0) > 0)
                .count();
            if sampled >= nodes {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nodes never reported: {listed:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
