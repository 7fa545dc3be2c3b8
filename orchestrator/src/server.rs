//! `skein server`: the hardware graph with its two doors, the gRPC service agents join
//! and the REST API, plus the sweep that marks silent nodes down.
//!
//! The running server ([`RunningServer`]) holds a cancellation token and a task tracker
//! ([`Lifecycle`]): every task it starts is tracked, and [`RunningServer::shutdown`]
//! cancels the token (both doors stop accepting, connections finish what is in flight,
//! event streams end), waits for the tracked tasks up to [`DRAIN_TIMEOUT`], stops what
//! is left, and flushes the store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use skein_proto::agent::v1::agent_service_server::AgentServiceServer;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::agents::AgentGateway;
use crate::api::{ApiState, router};
pub use crate::base::Lifecycle;
use crate::base::{Clock, Secret};
use crate::graph::{GraphConfig, GraphEvent, HardwareGraph, HealthState};
use crate::instances::Instances;
use crate::run::{Executor, ExecutorConfig};
use crate::store::Db;
pub use crate::transport::tls::TlsFiles;

/// Where the server listens and whom it lets in.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The REST API (and later the web page).
    pub api_addr: SocketAddr,
    /// The gRPC service agents join.
    pub grpc_addr: SocketAddr,
    /// The token agents present.
    pub join_token: Secret,
    /// The token REST clients present.
    pub api_token: Secret,
    /// Telemetry interval and health rules.
    pub graph: GraphConfig,
    /// TLS: the certificate and key (PEM), and which doors speak it; `None`: neither.
    pub tls: Option<ServerTls>,
    /// Timeouts and connection caps of both doors.
    pub transport: crate::transport::TransportConfig,
    /// The Hugging Face hub client plans read model metadata with (`POST /v1/plans`).
    pub hub: skein_model_registry::hub::HubClient,
    /// Where runs are stored (a sled database); `None`: in memory, lost at exit.
    pub db_dir: Option<PathBuf>,
    /// The database's page cache, bytes ([`crate::store::CACHE_BYTES`] by default).
    pub db_cache_bytes: u64,
    /// Queues, timeouts and retries of the executor.
    pub executor: ExecutorConfig,
    /// Where endpoint agents may connect (`--endpoint-allow`, `--endpoint-deny`), past
    /// the built-in refusals of loopback, link-local and the server's own addresses.
    pub endpoints: crate::egress::EgressRules,
    /// The file of the key users' secrets are encrypted with (created on first start);
    /// `None`: a random key, for a database in memory.
    pub secrets_key: Option<PathBuf>,
    /// What one chat request and one user may ask at once (sizes, requests and streams
    /// in flight).
    pub chat_limits: crate::session::ChatLimits,
}

/// The server's certificate and the doors that speak TLS with it.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The certificate chain and key.
    pub files: TlsFiles,
    /// The REST API speaks TLS.
    pub rest: bool,
    /// The agent service speaks TLS.
    pub grpc: bool,
}

/// How long the agent service takes to answer one request (a stream answers at once).
const GRPC_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Streams one agent connection may have open at once: an agent holds one stream and
/// makes a few calls.
const GRPC_MAX_STREAMS: u32 = 32;

/// How long a stopping server waits for the requests in flight (and every other task
/// it owns) to finish before it stops them.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Graph changes buffered for slow subscribers (event streams, reflexes).
const GRAPH_EVENTS: usize = 4096;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listener could not bind.
    #[error("cannot listen on {addr} for the {what}; help: choose another address or stop what holds it")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Which door.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The database could not be opened or read.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The key of users' secrets could not be read or made.
    #[error(transparent)]
    Secrets(crate::secrets::SecretError),
    /// A TLS file could not be read or used.
    #[error("cannot use the TLS file {}", .path.display())]
    Tls {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The REST door's certificate could not be read or used.
    #[error(transparent)]
    Certificate(#[from] crate::transport::tls::TlsError),
    /// A part of the server stopped by itself.
    #[error("a part of the server stopped unexpectedly (see the log); the server stopped")]
    Stopped,
}

/// A running server. [`RunningServer::shutdown`] stops it gracefully; dropping it stops
/// it at once.
pub struct RunningServer {
    /// The REST address it listens on (with the real port when 0 was asked).
    pub api_addr: SocketAddr,
    /// The gRPC address.
    pub grpc_addr: SocketAddr,
    /// The fingerprint of the certificate, when a door speaks TLS.
    pub tls_fingerprint: Option<skein_proto::tls::Fingerprint>,
    /// The REST API speaks TLS.
    pub rest_tls: bool,
    /// The agent service speaks TLS.
    pub grpc_tls: bool,
    /// The graph.
    pub graph: Arc<HardwareGraph>,
    /// Graph changes.
    pub events: broadcast::Sender<GraphEvent>,
    /// The executor.
    pub executor: Executor,
    /// The model instances.
    pub instances: Arc<Instances>,
    /// What reflexes did.
    pub reflex_events: crate::reflex::Events,
    /// The live reflexes.
    pub reflexes: crate::reflex::Reflexes,
    /// Its shutdown token and the tracker of its tasks.
    lifecycle: Lifecycle,
    /// The store, flushed last.
    db: Db,
    /// Every long-lived task, to notice one that stops and to stop what is left.
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.lifecycle.shutdown.cancel();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// How a graceful stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Every task ended within [`DRAIN_TIMEOUT`] (else the rest were stopped).
    pub drained: bool,
}

impl RunningServer {
    /// The token that stops the server: cancelled by [`RunningServer::shutdown`], for
    /// what else should stop with it.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.lifecycle.shutdown.clone()
    }

    /// Waits until a part of the server stops (it should not).
    pub async fn wait(mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        let _ = futures::future::select_all(tasks).await;
    }

    /// Serves until `stop` is ready (a signal), then stops gracefully
    /// ([`RunningServer::shutdown`]). A part of the server that stops by itself (it
    /// should not) is [`ServerError::Stopped`], after the same graceful stop.
    ///
    /// Errors: [`ServerError::Stopped`], [`ServerError::Store`].
    pub async fn serve_until(mut self, stop: impl std::future::Future<Output = ()>) -> Result<Stopped, ServerError> {
        let part_stopped = {
            let parts = futures::future::select_all(self.tasks.iter_mut());
            tokio::select! {
                _ = parts => true,
                () = stop => false,
            }
        };
        let stopped = self.shutdown().await?;
        if part_stopped {
            return Err(ServerError::Stopped);
        }
        Ok(stopped)
    }

    /// Stops the server gracefully: both doors stop accepting, the requests in flight
    /// are answered and the connections closed, event streams end; every task the
    /// server owns is waited for up to [`DRAIN_TIMEOUT`], then what is left is stopped;
    /// last, the store is flushed (acknowledged writes are on disk already; this writes
    /// what was kept lazily).
    ///
    /// Errors: [`ServerError::Store`] when the flush fails.
    pub async fn shutdown(mut self) -> Result<Stopped, ServerError> {
        tracing::info!("stopping: no new connections; draining the requests in flight");
        let Lifecycle { shutdown, tasks } = self.lifecycle.clone();
        shutdown.cancel();
        tasks.close();
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, tasks.wait()).await.is_ok();
        if !drained {
            tracing::warn!(
                left = tasks.len(),
                timeout = ?DRAIN_TIMEOUT,
                "tasks still running after the drain timeout; stopped"
            );
        }
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.flush_blocking())
            .await
            .map_err(|e| {
                ServerError::Store(crate::store::StoreError::Io(sled::Error::Io(std::io::Error::other(e))))
            })??;
        tracing::info!(drained, "stopped");
        Ok(Stopped { drained })
    }
}

/// Binds both doors and starts serving on the current tokio runtime.
///
/// Errors: [`ServerError::Bind`], [`ServerError::Tls`], [`ServerError::Store`].
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    let clock = Clock::start();
    let lifecycle = Lifecycle::default();
    let graph = Arc::new(HardwareGraph::new(config.graph));
    let (events, _) = broadcast::channel(GRAPH_EVENTS);

    let bind = |addr: SocketAddr, what: &'static str| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, what, source })
    };
    let api_listener = bind(config.api_addr, "REST API").await?;
    let grpc_listener = bind(config.grpc_addr, "agent service (gRPC)").await?;
    let api_addr = api_listener.local_addr().unwrap_or(config.api_addr);
    let grpc_addr = grpc_listener.local_addr().unwrap_or(config.grpc_addr);

    let db = match &config.db_dir {
        Some(dir) => Db::open_with_cache(dir, config.db_cache_bytes)?,
        None => Db::temporary()?,
    };
    let tokens = crate::auth::Tokens::open(&db, &config.api_token)?;
    let secrets_key = match &config.secrets_key {
        Some(file) => crate::secrets::SecretsKey::load_or_create(file),
        None => crate::secrets::SecretsKey::random(),
    }
    .map_err(ServerError::Secrets)?;
    let secrets = crate::secrets::Secrets::open(&db, &secrets_key)?;
    let egress = Arc::new(crate::egress::EgressPolicy::new(
        config.endpoints.clone(),
        crate::egress::own_addresses(&[api_addr, grpc_addr]),
    ));
    let clients = crate::engine_client::Clients::new(egress, secrets.clone());
    let instances = Arc::new(Instances::default());
    instances.record_measurements(db.tree("measurements")?);
    let planner = Arc::new(std::sync::Mutex::new(crate::plan::Planner::default()));
    let executor = Executor::new(
        &db,
        Arc::clone(&graph),
        config.hub.clone(),
        Arc::clone(&instances),
        Arc::clone(&planner),
        config.executor.clone(),
        clients,
    )?;
    let session_store = Arc::new(crate::session::SledSessions::open(&db)?);
    // The sessions limits count from what is stored.
    executor
        .sharing()
        .load_sessions(crate::session::SessionStore::owners(session_store.as_ref())?);
    let session_log = crate::session::SessionLog::start(session_store, crate::session::LogConfig::default())
        .map_err(|e| ServerError::Store(crate::store::StoreError::Io(sled::Error::Io(e))))?;
    let sessions = crate::session::Sessions::new(
        session_log,
        executor.clone(),
        Arc::clone(&instances),
        crate::session::SessionsConfig {
            limits: config.chat_limits,
            ..crate::session::SessionsConfig::default()
        },
    );
    let reflex_events = crate::reflex::Events::open(&db)?;
    let (reflexes, reflex_task) = crate::reflex::Reflexes::start(
        Arc::clone(&graph),
        &events,
        Arc::clone(&instances),
        executor.clone(),
        sessions.clone(),
        reflex_events.clone(),
        &lifecycle,
    );
    let join = crate::join::Join::open(&db, config.join_token.clone())?;
    let gateway = AgentGateway::new(
        Arc::clone(&graph),
        join.clone(),
        events.clone(),
        clock,
        Arc::clone(&instances),
        lifecycle.clone(),
    );
    // Both doors full must leave descriptors for everything else (the database, engines'
    // logs, the hub): the limit is raised, then each door gets its share.
    let open_files = crate::transport::raise_open_files_limit();
    let cap = crate::transport::connection_cap(open_files, config.transport.max_connections);
    tracing::info!(
        open_files = open_files.unwrap_or(u64::MAX),
        connections_per_door = cap,
        "connection caps"
    );
    let tls_fingerprint = match &config.tls {
        Some(tls) if tls.rest || tls.grpc => Some(crate::transport::tls::fingerprint(&tls.files.cert)?),
        _ => None,
    };
    let rest_tls = config.tls.as_ref().is_some_and(|tls| tls.rest);
    let grpc_tls = config.tls.as_ref().is_some_and(|tls| tls.grpc);
    // An agent holds one stream and makes a few calls; a request that takes longer than
    // this to be answered (not streamed) is abandoned.
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .timeout(GRPC_REQUEST_TIMEOUT)
        .max_concurrent_streams(Some(GRPC_MAX_STREAMS))
        .concurrency_limit_per_connection(GRPC_MAX_STREAMS as usize)
        .http2_max_header_list_size(Some(64 << 10));
    if let Some(tls) = config.tls.as_ref().filter(|tls| tls.grpc).map(|tls| &tls.files) {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| ServerError::Tls {
                path: path.clone(),
                source: Box::new(source),
            })
        };
        let identity = tonic::transport::Identity::from_pem(read(&tls.cert)?, read(&tls.key)?);
        builder = builder
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(identity)
                    .timeout(config.transport.header_read_timeout),
            )
            .map_err(|source| ServerError::Tls {
                path: tls.cert.clone(),
                source: Box::new(source),
            })?;
    }
    let (incoming, grpc_accept_task) =
        crate::transport::grpc_incoming(grpc_listener, cap, config.transport.clone(), grpc_tls, &lifecycle);
    let grpc = builder
        .add_service(AgentServiceServer::new(gateway))
        .serve_with_incoming_shutdown(incoming, lifecycle.shutdown.clone().cancelled_owned());
    let grpc_task = lifecycle.tasks.spawn(async move {
        if let Err(error) = grpc.await {
            tracing::error!(%error, "the agent service stopped");
        }
    });

    let app = router(ApiState {
        graph: Arc::clone(&graph),
        events: events.clone(),
        tokens,
        secrets,
        hub: config.hub.clone(),
        planner,
        executor: executor.clone(),
        instances: Arc::clone(&instances),
        sessions,
        reflex_events: reflex_events.clone(),
        reflexes: reflexes.clone(),
        db: db.clone(),
        join,
        tasks: lifecycle.tasks.clone(),
    });
    let rest = crate::transport::RestService {
        router: app,
        tls: match config.tls.as_ref().filter(|tls| tls.rest) {
            Some(tls) => Some(crate::transport::tls::acceptor(&tls.files)?),
            None => None,
        },
        config: config.transport.clone(),
        max_body_bytes: crate::api::MAX_BODY_BYTES as u64,
        lifecycle: lifecycle.clone(),
    };
    let api_task = lifecycle
        .tasks
        .spawn(crate::transport::serve_rest(api_listener, cap, rest));

    let sweep_graph = Arc::clone(&graph);
    let sweep_events = events.clone();
    let sweep_instances = Arc::clone(&instances);
    let period = Duration::from_millis((config.graph.sample_interval_ms / 4).max(10));
    let sweep_shutdown = lifecycle.shutdown.clone();
    let sweep_task = lifecycle.tasks.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = sweep_shutdown.cancelled() => return,
            }
            for event in sweep_graph.sweep(clock.now()) {
                if let GraphEvent::Health {
                    node, gpu: None, to, ..
                } = &event
                {
                    tracing::warn!(%node, state = %to.state, reasons = ?to.reasons, "node health changed");
                    if to.state == HealthState::Down {
                        sweep_instances.node_lost(node, "went down");
                    }
                }
                let _ = sweep_events.send(event);
            }
        }
    });

    let executor_task = executor.start(&lifecycle)?;

    tracing::info!(%api_addr, %grpc_addr, rest_tls, grpc_tls, fingerprint = ?tls_fingerprint, "skein server listening");
    Ok(RunningServer {
        api_addr,
        grpc_addr,
        tls_fingerprint,
        rest_tls,
        grpc_tls,
        graph,
        events,
        executor,
        instances,
        reflex_events,
        reflexes,
        lifecycle,
        db,
        tasks: vec![
            grpc_accept_task,
            grpc_task,
            api_task,
            sweep_task,
            executor_task,
            reflex_task,
        ],
    })
}
