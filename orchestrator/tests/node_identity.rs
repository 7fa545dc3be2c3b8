//! Node identities and join tokens over the real agent protocol and REST API: a rogue
//! agent holding the join token cannot take over a known node (its registration, its
//! stream and its leave change nothing), the real agent comes back with its credential
//! (even after its join token was revoked), an admin frees a name, and revoked, expired
//! or out-of-scope join tokens claim nothing.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{API, TOKEN, quick, setup};
use serde_json::{Value, json};
use skein_proto::agent::v1::{self as pb, agent_message, agent_service_client::AgentServiceClient};
use skein_testkit::agent::{inventory, telemetry};
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// A fresh random credential, as an agent makes one on its first start.
fn credential() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn with_token<T>(token: Option<&str>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

/// An agent speaking the protocol by hand: who it claims to be is up to the test.
struct Agent {
    client: AgentServiceClient<Channel>,
    name: String,
    credential: String,
}

/// A node's open stream.
struct Stream {
    tx: mpsc::Sender<pb::AgentMessage>,
    inbound: tonic::Streaming<pb::OrchestratorMessage>,
}

impl Agent {
    async fn new(grpc: std::net::SocketAddr, name: &str, credential: &str) -> Agent {
        Agent {
            client: AgentServiceClient::connect(format!("http://{grpc}")).await.unwrap(),
            name: name.to_owned(),
            credential: credential.to_owned(),
        }
    }

    async fn register(
        &mut self,
        token: Option<&str>,
        gpus: u32,
        labels: BTreeMap<String, String>,
    ) -> Result<pb::RegisterResponse, tonic::Status> {
        let request = pb::RegisterRequest {
            node_name: self.name.clone(),
            agent_version: "test".to_owned(),
            inventory: Some(inventory(&self.name, gpus, labels)),
            node_credential: self.credential.clone(),
        };
        self.client
            .register(with_token(token, request))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Opens the stream of `node_id` with this agent's credential.
    async fn open(&mut self, node_id: &str) -> Result<Stream, tonic::Status> {
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(16);
        tx.send(pb::AgentMessage {
            kind: Some(agent_message::Kind::Hello(pb::Hello {
                node_id: node_id.to_owned(),
                node_credential: self.credential.clone(),
            })),
        })
        .await
        .unwrap();
        let outbound = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let inbound = self
            .client
            .session(with_token(Some(TOKEN), outbound))
            .await?
            .into_inner();
        Ok(Stream { tx, inbound })
    }
}

impl Stream {
    async fn send(&self, kind: agent_message::Kind) {
        self.tx.send(pb::AgentMessage { kind: Some(kind) }).await.unwrap();
    }

    /// Says `Leave` and waits for the orchestrator to close the stream.
    async fn leave(mut self) {
        self.send(agent_message::Kind::Leave(pb::Leave {
            reason: "bye".to_owned(),
        }))
        .await;
        tokio::time::timeout(common::PATIENCE, async {
            while let Ok(Some(_)) = self.inbound.message().await {}
        })
        .await
        .unwrap();
    }
}

fn node<'a>(nodes: &'a Value, name: &str) -> Option<&'a Value> {
    nodes.as_array().unwrap().iter().find(|n| n["name"] == name)
}

/// Waits until the node `name` has sent telemetry (its GPUs report free memory).
async fn wait_sampled(s: &common::Setup, name: &str) -> Value {
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let nodes = s.get("/v1/nodes").await;
        if let Some(node) = node(&nodes, name)
            && node["gpu_memory_free"].as_u64().unwrap_or(0) > 0
        {
            return node.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never reported: {nodes:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rogue_agent_with_the_join_token_cannot_take_over_a_known_node() {
    let s = setup(quick(), None).await;
    let grpc = s.server.grpc_addr;

    // The real rtx-1: two GPUs, zone lab-a, streaming telemetry.
    let mut real = Agent::new(grpc, "rtx-1", &credential()).await;
    let registered = real
        .register(Some(TOKEN), 2, labels(&[("zone", "lab-a")]))
        .await
        .unwrap();
    assert!(!registered.known);
    let stream = real.open(&registered.node_id).await.unwrap();
    stream
        .send(agent_message::Kind::Telemetry(telemetry(1, &[Default::default(); 2])))
        .await;
    let before = wait_sampled(&s, "rtx-1").await;
    assert_eq!(before["gpus"], 2, "{before:#}");

    // A rogue with the same join token claims the name with 8 GPUs and other labels.
    let mut rogue = Agent::new(grpc, "rtx-1", &credential()).await;
    let refused = rogue
        .register(Some(TOKEN), 8, labels(&[("zone", "evil")]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("node name `rtx-1` is taken"),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("skein node reset rtx-1"),
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("skein node rm rtx-1"),
        "{}",
        refused.message()
    );

    // Its stream under the real node's id is refused, with or without a credential, so
    // its telemetry and its Leave never reach the graph.
    let refused = rogue.open(&registered.node_id).await.err().unwrap();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let mut blank = Agent::new(grpc, "rtx-1", "").await;
    let refused = blank.open(&registered.node_id).await.err().unwrap();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

    // Nothing changed: inventory, labels, health, connection.
    let nodes = s.get("/v1/nodes").await;
    let after = node(&nodes, "rtx-1").unwrap();
    assert_eq!(after["gpus"], 2, "{after:#}");
    assert_eq!(after["labels"], json!({ "zone": "lab-a" }));
    assert_eq!(after["id"], before["id"]);
    assert_ne!(after["health"], "left", "{after:#}");
    assert_eq!(after["connected"], true, "{after:#}");
    assert_eq!(nodes.as_array().unwrap().len(), 1);

    // The real agent's own leave still counts.
    stream.leave().await;
    let nodes = s.get("/v1/nodes").await;
    assert_eq!(node(&nodes, "rtx-1").unwrap()["health"], "left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_comes_back_with_its_credential_even_after_its_token_is_revoked() {
    let s = setup(quick(), None).await;
    let grpc = s.server.grpc_addr;
    let (status, created) = s
        .call(
            reqwest::Method::POST,
            "/v1/join-tokens",
            Some(API),
            Some(json!({ "node": "gpu-7" })),
        )
        .await;
    assert_eq!(status, 201, "{created:#}");
    let join = created["token"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("j-"), "{created:#}");
    assert_ne!(created["sha256"], created["token"]);

    // A token for gpu-7 claims nothing else.
    let mut other = Agent::new(grpc, "gpu-8", &credential()).await;
    let refused = other.register(Some(&join), 1, BTreeMap::new()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused.message().contains("good only for node `gpu-7`"),
        "{}",
        refused.message()
    );

    let kept = credential();
    let mut first = Agent::new(grpc, "gpu-7", &kept).await;
    let registered = first.register(Some(&join), 1, BTreeMap::new()).await.unwrap();
    let stream = first.open(&registered.node_id).await.unwrap();
    drop(stream);
    drop(first);

    // The admin revokes the token; the node keeps its identity.
    let (status, revoked) = s
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/join-tokens/{id}"),
            Some(API),
            None,
        )
        .await;
    assert_eq!(status, 200, "{revoked:#}");
    assert!(revoked["revoked_at"].is_string());

    // The same agent, restarted with its credential: back as the same node, with the
    // revoked token or none at all.
    let mut again = Agent::new(grpc, "gpu-7", &kept).await;
    let back = again.register(Some(&join), 1, BTreeMap::new()).await.unwrap();
    assert!(back.known);
    assert_eq!(back.node_id, registered.node_id);
    let back = again.register(None, 1, BTreeMap::new()).await.unwrap();
    assert_eq!(back.node_id, registered.node_id);
    let stream = again.open(&back.node_id).await.unwrap();
    stream
        .send(agent_message::Kind::Telemetry(telemetry(1, &[Default::default()])))
        .await;
    wait_sampled(&s, "gpu-7").await;

    // A new agent with the revoked token is refused, saying so.
    let mut late = Agent::new(grpc, "gpu-9", &credential()).await;
    let refused = late.register(Some(&join), 1, BTreeMap::new()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused.message().contains(&format!("join token `{id}` was revoked")),
        "{}",
        refused.message()
    );
    let (_, listed) = s.call(reqwest::Method::GET, "/v1/join-tokens", Some(API), None).await;
    assert_eq!(listed["data"][0]["id"], id.as_str());
    assert!(listed["data"][0].get("token").is_none(), "{listed:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_unknown_join_tokens_claim_nothing_and_only_the_admin_makes_them() {
    let s = setup(quick(), None).await;
    let grpc = s.server.grpc_addr;
    let (status, created) = s
        .call(
            reqwest::Method::POST,
            "/v1/join-tokens",
            Some(API),
            Some(json!({ "expires_in_s": 1 })),
        )
        .await;
    assert_eq!(status, 201, "{created:#}");
    let join = created["token"].as_str().unwrap().to_owned();
    assert!(created["expires_at"].is_string(), "{created:#}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut agent = Agent::new(grpc, "late-1", &credential()).await;
    let refused = agent.register(Some(&join), 1, BTreeMap::new()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(refused.message().contains("expired at"), "{}", refused.message());
    let refused = agent
        .register(Some("not-a-token"), 1, BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert!(
        refused.message().starts_with("wrong join token"),
        "{}",
        refused.message()
    );
    let refused = agent.register(None, 1, BTreeMap::new()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(s.get("/v1/nodes").await.as_array().unwrap().is_empty());

    // Users manage no join tokens and free no names.
    let user = s.token_for("ada").await;
    for (method, path) in [
        (reqwest::Method::GET, "/v1/join-tokens"),
        (reqwest::Method::POST, "/v1/join-tokens"),
        (reqwest::Method::DELETE, "/v1/nodes/late-1"),
        (reqwest::Method::POST, "/v1/nodes/late-1/reset"),
    ] {
        let (status, body) = s.call(method, path, Some(&user), Some(json!({}))).await;
        assert_eq!(status, 403, "{path}: {body:#}");
    }
    let (status, body) = s
        .call(
            reqwest::Method::POST,
            "/v1/join-tokens",
            Some(API),
            Some(json!({ "node": "a", "name_prefix": "b" })),
        )
        .await;
    assert_eq!(status, 400, "{body:#}");
    let (status, body) = s
        .call(reqwest::Method::DELETE, "/v1/join-tokens/bootstrap", Some(API), None)
        .await;
    assert_eq!(status, 400, "{body:#}");
    // An array is no request, and an expiry past ten years is refused (it once overflowed
    // the clock and dropped the connection).
    for bad in [
        json!([null, null]),
        json!({ "expires_in_s": 9_223_372_036_854_775_808_u64 }),
    ] {
        let (status, body) = s
            .call(reqwest::Method::POST, "/v1/join-tokens", Some(API), Some(bad))
            .await;
        assert_eq!(status, 400, "{body:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_frees_a_name_by_removing_the_node_or_resetting_its_identity() {
    let s = setup(quick(), None).await;
    let grpc = s.server.grpc_addr;
    let mut real = Agent::new(grpc, "rtx-1", &credential()).await;
    let registered = real.register(Some(TOKEN), 2, BTreeMap::new()).await.unwrap();
    let stream = real.open(&registered.node_id).await.unwrap();
    stream
        .send(agent_message::Kind::Telemetry(telemetry(1, &[Default::default(); 2])))
        .await;
    wait_sampled(&s, "rtx-1").await;

    // Reset: the node stays, the next agent with a join token claims the name.
    let (status, body) = s
        .call(reqwest::Method::POST, "/v1/nodes/rtx-1/reset", Some(API), None)
        .await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["identity_forgotten"], true);
    assert!(node(&s.get("/v1/nodes").await, "rtx-1").is_some());
    let mut replacement = Agent::new(grpc, "rtx-1", &credential()).await;
    let claimed = replacement.register(Some(TOKEN), 4, BTreeMap::new()).await.unwrap();
    assert_eq!(claimed.node_id, registered.node_id);
    // ... and the old credential is now the stranger.
    let refused = real.register(Some(TOKEN), 2, BTreeMap::new()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);

    // Remove: the node leaves the graph and the name is free.
    let (status, body) = s
        .call(reqwest::Method::DELETE, "/v1/nodes/rtx-1", Some(API), None)
        .await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["node_id"], registered.node_id.as_str());
    assert_eq!(body["identity_forgotten"], true);
    assert!(s.get("/v1/nodes").await.as_array().unwrap().is_empty());
    let again = real.register(Some(TOKEN), 2, BTreeMap::new()).await.unwrap();
    assert!(!again.known);
    let (status, body) = s
        .call(reqwest::Method::DELETE, "/v1/nodes/no-such-node", Some(API), None)
        .await;
    assert_eq!(status, 404, "{body:#}");
}
