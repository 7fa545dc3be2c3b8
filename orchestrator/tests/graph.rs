//! The hardware graph as a pure state machine: registration, telemetry, health, down
//! detection, snapshots, labels and the metrics text. Times are passed in
//! (milliseconds). And labels end to end: a test agent's, over gRPC, in the REST API.

mod common;

use std::collections::BTreeMap;

use skein_orchestrator::api::prometheus_text;
use skein_orchestrator::graph::{
    GpuFacts, GpuSample, GraphConfig, GraphError, GraphEvent, HardwareGraph, HealthState, HostFacts, IndexedSample,
    LinkKind, NodeInventory, TelemetryBatch,
};

const INTERVAL: u64 = 1000;

fn gpu(index: u32, name: &str, memory_gib: u64, peers: &[&str]) -> GpuFacts {
    GpuFacts {
        index,
        uuid: format!("GPU-{name}-{index}"),
        name: name.to_owned(),
        memory_total: memory_gib << 30,
        compute_capability: Some((8, 0)),
        power_limit_mw: Some(400_000),
        pcie: Some((4, 16)),
        nvlink_peers: peers.iter().map(|p| (*p).to_owned()).collect(),
        mig_enabled: Some(false),
        simulated: true,
    }
}

fn node(name: &str, gpus: Vec<GpuFacts>) -> NodeInventory {
    NodeInventory {
        name: name.to_owned(),
        agent_version: "0.1.0".to_owned(),
        gpu_source: format!("simulated node {name}"),
        host: HostFacts {
            hostname: name.to_owned(),
            ..HostFacts::default()
        },
        gpus,
        labels: BTreeMap::new(),
    }
}

fn a100_box() -> NodeInventory {
    let uuid = |i: u32| format!("GPU-NVIDIA A100-SXM4-80GB-{i}");
    let peers = |me: u32| (0..4).filter(|&i| i != me).map(uuid).collect::<Vec<_>>();
    let gpus = (0..4)
        .map(|i| {
            let peers = peers(i);
            gpu(
                i,
                "NVIDIA A100-SXM4-80GB",
                80,
                &peers.iter().map(String::as_str).collect::<Vec<_>>(),
            )
        })
        .collect();
    node("a100-box", gpus)
}

fn sample(used_gib: u64, util: u32) -> GpuSample {
    GpuSample {
        received_ms: 0,
        unix_ms: 1_790_000_000_000,
        memory_used: used_gib << 30,
        memory_free: (80 - used_gib) << 30,
        utilization_pct: Some(util),
        memory_utilization_pct: Some(util / 2),
        temperature_c: Some(40),
        power_mw: Some(100_000),
        sm_clock_mhz: Some(1410),
        throttle_reasons: 0,
        ecc_corrected: Some(0),
        ecc_uncorrected: Some(0),
        foreign_memory: Some(0),
    }
}

fn batch(seq: u64, samples: Vec<(u32, GpuSample)>) -> TelemetryBatch {
    TelemetryBatch {
        seq,
        gpus: samples
            .into_iter()
            .map(|(index, sample)| IndexedSample { index, sample })
            .collect(),
        host: None,
    }
}

fn graph() -> HardwareGraph {
    HardwareGraph::new(GraphConfig {
        sample_interval_ms: INTERVAL,
        ..GraphConfig::default()
    })
}

#[test]
fn registration_keeps_the_id_of_a_known_name() {
    let g = graph();
    let (first, events) = g.register(a100_box(), 0);
    assert!(!first.known);
    assert!(matches!(&events[..], [GraphEvent::NodeRegistered { known: false, .. }]));
    let (other, _) = g.register(node("rtx-1", vec![gpu(0, "NVIDIA GeForce RTX 4090", 24, &[])]), 0);
    let (again, _) = g.register(a100_box(), 5000);
    assert_eq!(again.id, first.id);
    assert!(again.known);
    assert_ne!(other.id, first.id);
    let snapshot = g.snapshot();
    let names: Vec<&str> = snapshot.nodes.iter().map(|n| n.inventory.name.as_str()).collect();
    assert_eq!(names, ["a100-box", "rtx-1"]);
    // NVLink between all four GPUs of the box: six links.
    let links = &snapshot.nodes[0].links;
    assert_eq!(links.len(), 6);
    assert!(links.iter().all(|l| l.kind == LinkKind::Nvlink));
}

#[test]
fn telemetry_lands_in_the_snapshot_and_the_window() {
    let g = graph();
    let (r, _) = g.register(a100_box(), 0);
    let before = g.snapshot();
    for seq in 1..=5 {
        g.ingest(
            &r.id,
            batch(seq, vec![(0, sample(seq, 10 * seq as u32))]),
            seq * INTERVAL,
        )
        .unwrap();
    }
    let after = g.snapshot();
    assert!(after.version > before.version);
    // The snapshot taken before is unchanged: views are immutable.
    assert!(before.nodes[0].gpus[0].latest.is_none());
    let gpu0 = &after.nodes[0].gpus[0];
    assert_eq!(gpu0.latest.unwrap().utilization_pct, Some(50));
    assert_eq!(gpu0.latest.unwrap().received_ms, 5 * INTERVAL);
    assert_eq!(gpu0.memory_free(), Some(75 << 30));
    let window = g.window(&r.id, 0).unwrap();
    assert_eq!(window.len(), 5);
    assert_eq!(window[0].utilization_pct, Some(10));
    assert_eq!(after.nodes[0].last_seq, Some(5));
}

#[test]
fn the_window_keeps_the_newest_samples() {
    let g = HardwareGraph::new(GraphConfig {
        window: 3,
        ..GraphConfig::default()
    });
    let (r, _) = g.register(a100_box(), 0);
    for seq in 1..=10 {
        g.ingest(&r.id, batch(seq, vec![(1, sample(1, seq as u32))]), seq)
            .unwrap();
    }
    let utils: Vec<Option<u32>> = g.window(&r.id, 1).unwrap().iter().map(|s| s.utilization_pct).collect();
    assert_eq!(utils, [Some(8), Some(9), Some(10)]);
}

#[test]
fn samples_for_unknown_nodes_or_gpus_are_refused() {
    let g = graph();
    let (r, _) = g.register(a100_box(), 0);
    let err = g.ingest(&r.id, batch(1, vec![(4, sample(1, 1))]), 1).unwrap_err();
    assert_eq!(err.to_string(), "node `node-1` has no GPU 4 (it registered 4)");
    let stranger = skein_orchestrator::graph::NodeId("node-99".to_owned());
    assert!(matches!(
        g.ingest(&stranger, batch(1, vec![]), 1),
        Err(GraphError::UnknownNode(_))
    ));
    // Nothing of the refused batch was kept.
    assert!(g.window(&r.id, 0).unwrap().is_empty());
}

#[test]
fn throttling_and_rising_ecc_degrade_a_gpu_and_recovery_clears_it() {
    let g = graph();
    let (r, _) = g.register(a100_box(), 0);
    g.ingest(&r.id, batch(1, vec![(2, sample(1, 90))]), 1000).unwrap();
    let hot = GpuSample {
        temperature_c: Some(91),
        throttle_reasons: skein_proto::throttle::HW_THERMAL_SLOWDOWN,
        ..sample(1, 90)
    };
    let events = g.ingest(&r.id, batch(2, vec![(2, hot)]), 2000).unwrap();
    let health_events: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            GraphEvent::Health { gpu, from, to, .. } => Some((*gpu, *from, to.state, to.reasons.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        health_events,
        [(
            Some(2),
            HealthState::Ok,
            HealthState::Degraded,
            vec!["thermal throttling at 91 °C".to_owned()]
        )]
    );
    let snapshot = g.snapshot();
    assert_eq!(snapshot.nodes[0].health.state, HealthState::Degraded);
    assert_eq!(snapshot.nodes[0].health.reasons, ["GPU 2: thermal throttling at 91 °C"]);

    let errors = GpuSample {
        ecc_corrected: Some(12),
        ..sample(1, 90)
    };
    g.ingest(&r.id, batch(3, vec![(2, errors)]), 3000).unwrap();
    assert_eq!(
        g.snapshot().nodes[0].gpus[2].health.reasons,
        ["12 corrected ECC errors in the last 3 samples"]
    );
    // Once the window no longer holds the rise, and nothing throttles, it is ok again.
    let g = HardwareGraph::new(GraphConfig {
        window: 2,
        ..GraphConfig::default()
    });
    let (r, _) = g.register(a100_box(), 0);
    g.ingest(&r.id, batch(1, vec![(2, hot)]), 1000).unwrap();
    g.ingest(&r.id, batch(2, vec![(2, sample(1, 5))]), 2000).unwrap();
    assert_eq!(g.snapshot().nodes[0].gpus[2].health.state, HealthState::Ok);
}

#[test]
fn a_silent_node_goes_down_after_three_intervals_and_comes_back() {
    let g = graph();
    let (r, _) = g.register(a100_box(), 0);
    g.connected(&r.id, 0).unwrap();
    g.ingest(&r.id, batch(1, vec![(0, sample(1, 1))]), 1000).unwrap();
    assert!(g.sweep(3999).is_empty(), "three intervals have not passed");
    let events = g.sweep(4001);
    assert!(
        matches!(&events[..], [GraphEvent::Health { gpu: None, to, .. }] if to.state == HealthState::Down),
        "{events:?}"
    );
    assert!(g.sweep(5000).is_empty(), "down is reported once");
    let snapshot = g.snapshot();
    assert_eq!(snapshot.nodes[0].health.state, HealthState::Down);
    assert!(
        snapshot.nodes[0]
            .gpus
            .iter()
            .all(|gpu| gpu.health.state == HealthState::Down)
    );
    // Telemetry again: up.
    let events = g.ingest(&r.id, batch(2, vec![(0, sample(1, 1))]), 6000).unwrap();
    assert!(events.iter().any(
        |e| matches!(e, GraphEvent::Health { gpu: None, from: HealthState::Down, to, .. } if to.state == HealthState::Ok)
    ));
    assert_eq!(g.snapshot().nodes[0].health.state, HealthState::Ok);
}

#[test]
fn a_draining_node_is_drained_and_a_node_that_left_is_left_not_down() {
    let g = graph();
    let (r, _) = g.register(a100_box(), 0);
    g.connected(&r.id, 0).unwrap();
    g.ingest(&r.id, batch(1, vec![(0, sample(1, 1))]), 1000).unwrap();
    assert!(g.drain_node(&r.id, "slurm job 7 ends soon".to_owned()).unwrap());
    assert!(
        !g.drain_node(&r.id, "slurm job 7 ends soon".to_owned()).unwrap(),
        "said again: no change"
    );
    let snapshot = g.snapshot();
    let node = &snapshot.nodes[0];
    assert_eq!(node.draining.as_deref(), Some("slurm job 7 ends soon"));
    assert!(
        node.gpus
            .iter()
            .all(|gpu| gpu.drained.as_deref() == Some("slurm job 7 ends soon"))
    );
    assert!(
        snapshot.without_drained().nodes[0]
            .gpus
            .iter()
            .all(|gpu| gpu.health.state == HealthState::Down)
    );

    let events = g.leave(&r.id, "slurm job 7 was cancelled".to_owned()).unwrap();
    assert!(
        matches!(&events[..], [GraphEvent::Health { gpu: None, from: HealthState::Ok, to, .. }]
            if to.state == HealthState::Left && to.reasons == ["slurm job 7 was cancelled"]),
        "{events:?}"
    );
    assert!(
        g.leave(&r.id, "again".to_owned()).unwrap().is_empty(),
        "left is reported once"
    );
    assert!(g.sweep(60_000).is_empty(), "a node that left is not swept down");
    let node = g.snapshot().nodes[0].clone();
    assert_eq!(node.health.state, HealthState::Left);
    assert!(node.health.state.is_unavailable());
    assert!(node.gpus.iter().all(|gpu| gpu.health.state == HealthState::Left));

    // A new registration (a new job on the node) starts afresh.
    let (again, _) = g.register(a100_box(), 61_000);
    assert_eq!(again.id, r.id);
    let node = g.snapshot().nodes[0].clone();
    assert_eq!((node.health.state, node.draining.clone()), (HealthState::Ok, None));
    assert!(node.gpus.iter().all(|gpu| gpu.drained.is_none()));
}

#[test]
fn a_node_that_never_reports_goes_down_counted_from_registration() {
    let g = graph();
    g.register(a100_box(), 10_000);
    assert!(g.sweep(12_000).is_empty());
    assert_eq!(g.sweep(13_001).len(), 1);
}

#[test]
fn only_the_newest_connection_counts() {
    let g = graph();
    let (r, _) = g.register(a100_box(), 0);
    let (old, _) = g.connected(&r.id, 0).unwrap();
    let (new, _) = g.connected(&r.id, 10).unwrap();
    assert!(
        g.disconnected(&r.id, old).is_empty(),
        "a stale stream ending changes nothing"
    );
    assert!(g.snapshot().nodes[0].connected);
    assert_eq!(g.disconnected(&r.id, new).len(), 1);
    assert!(!g.snapshot().nodes[0].connected);
}

#[test]
fn metrics_use_the_gpu_exporter_names() {
    let g = graph();
    let (r, _) = g.register(a100_box(), 0);
    g.ingest(&r.id, batch(1, vec![(0, sample(8, 42))]), 1000).unwrap();
    let text = prometheus_text(&g.snapshot());
    insta::assert_snapshot!(text);
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn labels_are_in_the_snapshot_and_select_the_nodes_of_a_zone() {
    let g = graph();
    let rtx = |name: &str, zone: Option<&str>| {
        let mut inventory = node(name, vec![gpu(0, "NVIDIA GeForce RTX 4090", 24, &[])]);
        inventory.labels = zone.map_or_else(BTreeMap::new, |zone| labels(&[("zone", zone)]));
        inventory
    };
    let mut a100 = a100_box();
    a100.labels = labels(&[("zone", "lab-a"), ("rack", "r1")]);
    g.register(a100, 0);
    g.register(rtx("rtx-1", Some("lab-b")), 0);
    g.register(rtx("rtx-2", Some("lab-a")), 0);
    g.register(rtx("old-1", None), 0);

    let snapshot = g.snapshot();
    let labelled = |key: &str, value: &str| -> Vec<String> {
        snapshot
            .nodes_labelled(key, value)
            .map(|n| n.inventory.name.clone())
            .collect()
    };
    assert_eq!(labelled("zone", "lab-a"), ["a100-box", "rtx-2"]);
    assert_eq!(labelled("zone", "lab-b"), ["rtx-1"]);
    assert_eq!(labelled("rack", "r1"), ["a100-box"]);
    assert!(labelled("zone", "lab-c").is_empty());
    // Exact: case matters, and a value is not a key.
    assert!(labelled("zone", "LAB-A").is_empty());
    assert!(labelled("lab-a", "zone").is_empty());

    // GET /v1/graph serializes the inventory: labels in key order, `{}` for none.
    let json = serde_json::to_value(&snapshot).unwrap();
    let inventory = |name: &str| {
        json["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["inventory"]["name"] == name)
            .unwrap()["inventory"]
            .clone()
    };
    assert_eq!(
        inventory("a100-box")["labels"].to_string(),
        r#"{"rack":"r1","zone":"lab-a"}"#
    );
    assert_eq!(inventory("old-1")["labels"], serde_json::json!({}));

    // An agent that restarts with other labels replaces them.
    g.register(rtx("rtx-1", Some("lab-a")), 10);
    let snapshot = g.snapshot();
    let names: Vec<&str> = snapshot
        .nodes_labelled("zone", "lab-a")
        .map(|n| n.inventory.name.as_str())
        .collect();
    assert_eq!(names, ["a100-box", "rtx-1", "rtx-2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_labels_reach_the_nodes_and_the_graph_and_bad_ones_are_refused() {
    use skein_proto::agent::v1 as pb;
    use skein_testkit::agent::{EngineBehaviour, TestAgent};

    let s = common::setup(common::quick(), None).await;
    let grpc = s.server.grpc_addr;
    let behaviour = EngineBehaviour::default();
    let _a = TestAgent::join_labelled(
        grpc,
        common::TOKEN,
        "node-a",
        1,
        behaviour.clone(),
        &[("zone", "lab-a")],
    )
    .await;
    let _b = TestAgent::join(grpc, common::TOKEN, "node-b", 1, behaviour).await;
    s.wait_nodes(2).await;

    let nodes = s.get("/v1/nodes").await;
    let listed = |name: &str| nodes.as_array().unwrap().iter().find(|n| n["name"] == name).unwrap()["labels"].clone();
    assert_eq!(listed("node-a"), serde_json::json!({ "zone": "lab-a" }));
    assert_eq!(listed("node-b"), serde_json::json!({}));
    let graph = s.get("/v1/graph").await;
    let in_graph: Vec<(String, serde_json::Value)> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["inventory"]["name"].as_str().unwrap().to_owned(),
                n["inventory"]["labels"].clone(),
            )
        })
        .collect();
    assert_eq!(
        in_graph,
        [
            ("node-a".to_owned(), serde_json::json!({ "zone": "lab-a" })),
            ("node-b".to_owned(), serde_json::json!({})),
        ]
    );
    let snapshot = s.server.graph.snapshot();
    let zone: Vec<&str> = snapshot
        .nodes_labelled("zone", "lab-a")
        .map(|n| n.inventory.name.as_str())
        .collect();
    assert_eq!(zone, ["node-a"]);

    // An agent with a label the rules refuse is told which, and does not join.
    let mut client = pb::agent_service_client::AgentServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let mut request = tonic::Request::new(pb::RegisterRequest {
        node_name: "node-c".to_owned(),
        agent_version: "test".to_owned(),
        inventory: Some(pb::Inventory {
            labels: labels(&[("zone", "lab a")]),
            ..pb::Inventory::default()
        }),
        node_credential: skein_testkit::agent::node_credential("node-c"),
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {}", common::TOKEN).parse().unwrap());
    let status = client.register(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "node `node-c`: the value `lab a` of label `zone` contains ' ': use only ASCII letters, digits, `.`, `_`, \
         `-` and `/`"
    );
    assert_eq!(s.get("/v1/nodes").await.as_array().unwrap().len(), 2);
}

/// What one thread of [`many_threads_at_once_finish_and_leave_a_consistent_graph`] is
/// doing, so a stuck run can say where its threads wait.
const OPERATIONS: [&str; 10] = [
    "nothing",
    "register (new name)",
    "register (known name)",
    "connected",
    "ingest",
    "disconnected",
    "leave",
    "snapshot",
    "node / window / id_of",
    "sweep",
];

/// Many threads at once on one graph: registrations of new and known names, streams
/// opening and closing, telemetry, departures, snapshots and sweeps, as a fleet of agents
/// (re)joining while the API reads. The graph once took its two maps' locks in opposite
/// orders (`register` the name map then the id map, `connected` the id map then the name
/// map) and froze for good under exactly this. A watchdog fails the test, naming where
/// the threads wait, instead of hanging.
#[test]
fn many_threads_at_once_finish_and_leave_a_consistent_graph() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, mpsc};
    use std::time::Duration;

    const THREADS: usize = 8;
    const ROUNDS: usize = 4_000;
    const WATCHDOG: Duration = Duration::from_secs(60);
    /// Nodes registered before the threads start, so every operation has targets.
    const SEEDED: usize = 16;

    fn rtx_node(name: &str, gpus: u32) -> NodeInventory {
        node(
            name,
            (0..gpus).map(|i| gpu(i, "NVIDIA GeForce RTX 4090", 24, &[])).collect(),
        )
    }

    let g = Arc::new(graph());
    let mut seeded = Vec::new();
    for n in 0..SEEDED {
        let (r, _) = g.register(rtx_node(&format!("seed-{n:02}"), 8), 0);
        seeded.push((format!("seed-{n:02}"), r.id));
    }
    let seeded = Arc::new(seeded);
    let doing: Arc<Vec<AtomicUsize>> = Arc::new((0..THREADS).map(|_| AtomicUsize::new(0)).collect());
    let (done_tx, done_rx) = mpsc::channel();
    for thread in 0..THREADS {
        let (g, seeded, doing, done) = (Arc::clone(&g), Arc::clone(&seeded), Arc::clone(&doing), done_tx.clone());
        std::thread::spawn(move || {
            // A fixed, different sequence of operations per thread.
            let mut rng = skein_testkit::lab::Rng((thread as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut next = move || rng.below(u64::MAX);
            let mut mine: Vec<(String, skein_orchestrator::graph::NodeId)> = Vec::new();
            for round in 0..ROUNDS {
                let now = round as u64;
                let pick = next();
                let target = if mine.is_empty() || pick % 2 == 0 {
                    seeded[(pick as usize >> 1) % seeded.len()].clone()
                } else {
                    mine[(pick as usize >> 1) % mine.len()].clone()
                };
                let operation = 1 + (next() % (OPERATIONS.len() as u64 - 1)) as usize;
                doing[thread].store(operation, Ordering::SeqCst);
                match operation {
                    1 => {
                        let name = format!("t{thread}-{round}");
                        let (r, _) = g.register(rtx_node(&name, 8), now);
                        assert!(!r.known, "{name} is new");
                        mine.push((name, r.id));
                    }
                    2 => {
                        // Sometimes with other GPUs: the windows start afresh.
                        let gpus = if next() % 8 == 0 { 4 } else { 8 };
                        let (r, _) = g.register(rtx_node(&target.0, gpus), now);
                        assert_eq!((r.id, r.known), (target.1.clone(), true), "{}", target.0);
                    }
                    3 => {
                        g.connected(&target.1, now).unwrap();
                    }
                    4 => {
                        let samples = (0..8).map(|i| (i, sample(1, (round % 100) as u32))).collect();
                        // A batch for 8 GPUs of a node re-registered with 4 is refused.
                        match g.ingest(&target.1, batch(round as u64, samples), now) {
                            Ok(_) | Err(GraphError::UnknownGpu { .. }) => {}
                            Err(other) => panic!("{other}"),
                        }
                    }
                    5 => {
                        let _ = g.disconnected(&target.1, next() % 4);
                    }
                    6 => {
                        g.leave(&target.1, "rack reboot".to_owned()).unwrap();
                    }
                    7 => {
                        let snapshot = g.snapshot();
                        assert!(snapshot.nodes.len() >= SEEDED);
                    }
                    8 => {
                        assert!(g.node(&target.1).is_some());
                        let _ = g.window(&target.1, 0);
                        assert_eq!(g.id_of(&target.0), Some(target.1.clone()));
                    }
                    _ => {
                        let _ = g.sweep(now);
                    }
                }
                doing[thread].store(0, Ordering::SeqCst);
            }
            let _ = done.send(mine);
        });
    }
    drop(done_tx);

    let deadline = std::time::Instant::now() + WATCHDOG;
    let mut registered: Vec<(String, skein_orchestrator::graph::NodeId)> = seeded.to_vec();
    for _ in 0..THREADS {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(mine) => registered.extend(mine),
            Err(_) => {
                let mut stuck: BTreeMap<&str, usize> = BTreeMap::new();
                for operation in doing.iter().map(|d| d.load(Ordering::SeqCst)).filter(|&d| d != 0) {
                    *stuck.entry(OPERATIONS[operation]).or_default() += 1;
                }
                panic!(
                    "the graph is stuck: after {WATCHDOG:?}, threads still wait inside {stuck:?} (a lock-order \
                     inversion or a lock held across a wait)"
                );
            }
        }
    }

    // Every name once, under the id its first registration got, and nothing else.
    let snapshot = g.snapshot();
    assert_eq!(snapshot.nodes.len(), registered.len());
    let in_graph: BTreeMap<String, skein_orchestrator::graph::NodeId> = snapshot
        .nodes
        .iter()
        .map(|n| (n.inventory.name.clone(), n.id.clone()))
        .collect();
    let expected: BTreeMap<String, skein_orchestrator::graph::NodeId> = registered.into_iter().collect();
    assert_eq!(in_graph, expected);
    for view in &snapshot.nodes {
        assert_eq!(g.id_of(&view.inventory.name).as_ref(), Some(&view.id));
        assert_eq!(view.gpus.len(), view.inventory.gpus.len(), "{}", view.inventory.name);
        assert!(view.version <= g.version());
    }
}
