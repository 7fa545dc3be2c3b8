//! The reflex engine's pure core, driven with load patterns at exact times: when a
//! reflex fires and releases, what its decisions carry, that it never flaps, and that a
//! sample only reaches the reflexes that watch its GPU.

use proptest::prelude::*;
use skein_dsl::ir::Reflex;
use skein_orchestrator::reflex::{AgentReading, Decision, DecisionKind, Engine, GpuKey, GpuReading};

/// The reflexes of a workflow whose `reflexes:` section is `section`.
fn reflexes(section: &str) -> Vec<Reflex> {
    let text = format!(
        "name: w\nagents:\n  coder: {{ model: Qwen/Qwen2.5-Coder-7B-Instruct }}\n  chat: {{ model: Qwen/Qwen2.5-7B-Instruct }}\nsteps:\n  - {{ id: s, agent: coder, prompt: hi }}\nreflexes:\n{section}"
    );
    let parsed = skein_dsl::parse("w.yaml", &text);
    assert!(!parsed.diagnostics.has_errors(), "{:?}", parsed.diagnostics);
    parsed.workflow.unwrap().reflexes
}

const HOT_CODER: &str = r#"
  - name: hot-coder
    when: 'gpu.util > 0.8'
    for: 5s
    scope: { agent: coder }
    do:
      - clone: 1
      - reroute: new
      - decay: { target: original, capacity: 0.5 }
    cooldown: 30s
"#;

fn util(u: f64) -> GpuReading {
    GpuReading {
        util: u,
        ..GpuReading::default()
    }
}

/// One sample a second of `load(t)` on `gpu` from second `from` to `to`.
fn drive(engine: &mut Engine, gpu: &GpuKey, from: i64, to: i64, load: impl Fn(i64) -> f64) -> Vec<Decision> {
    (from..to)
        .flat_map(|t| engine.gpu_sample(gpu, util(load(t)), t * 1000))
        .collect()
}

#[test]
fn a_spike_fires_the_reflex_after_its_hold_and_releases_it_after_the_cooldown() {
    let mut engine = Engine::default();
    let id = engine.add("r1", &reflexes(HOT_CODER)[0]).unwrap();
    let gpu = GpuKey::new("a100-box", 0);
    engine.set_scope(id, vec![gpu.clone()], vec!["a100-box".to_owned()]);
    // Quiet for 10 s, a spike to 95 % for 20 s, quiet again.
    let decisions = drive(&mut engine, &gpu, 0, 120, |t| {
        if (10..30).contains(&t) { 0.95 } else { 0.3 }
    });
    insta::assert_yaml_snapshot!(decisions);
    assert_eq!(decisions.len(), 2);
    assert_eq!((decisions[0].at_ms, &decisions[0].kind), (15_000, &DecisionKind::Fire));
    assert_eq!(
        (decisions[1].at_ms, &decisions[1].kind),
        (60_000, &DecisionKind::Release)
    );
}

#[test]
fn the_aggregate_combines_the_scope_gpus() {
    let section = r#"
  - name: all-busy
    when: 'gpu.util > 0.8'
    aggregate: min
    scope: { node: rtx-1 }
    do: [ { notify: "every GPU is busy" } ]
  - name: any-busy
    when: 'gpu.util > 0.8'
    scope: { node: rtx-1 }
    do: [ { notify: "a GPU is busy" } ]
  - name: busy-on-average
    when: 'gpu.util > 0.8'
    aggregate: avg
    scope: { node: rtx-1 }
    do: [ { notify: "busy on average" } ]
"#;
    let mut engine = Engine::default();
    let gpus: Vec<GpuKey> = (0..4).map(|i| GpuKey::new("rtx-1", i)).collect();
    for reflex in reflexes(section) {
        let id = engine.add("r1", &reflex).unwrap();
        engine.set_scope(id, gpus.clone(), vec!["rtx-1".to_owned()]);
    }
    // A node's batch: each reflex is evaluated once, on all four GPUs.
    let fired = |engine: &mut Engine, loads: [f64; 4]| -> Vec<String> {
        let batch: Vec<(GpuKey, GpuReading)> = gpus.iter().cloned().zip(loads.map(util)).collect();
        let mut names: Vec<String> = engine.gpu_batch(&batch, 0).into_iter().map(|d| d.reflex).collect();
        names.sort();
        names
    };
    assert_eq!(fired(&mut engine, [0.9, 0.9, 0.9, 0.5]), ["any-busy"]);
    let mut engine2 = Engine::default();
    for reflex in reflexes(section) {
        let id = engine2.add("r1", &reflex).unwrap();
        engine2.set_scope(id, gpus.clone(), vec!["rtx-1".to_owned()]);
    }
    assert_eq!(
        fired(&mut engine2, [0.95, 0.95, 0.95, 0.9]),
        ["all-busy", "any-busy", "busy-on-average"]
    );
}

#[test]
fn a_sample_reaches_only_the_reflexes_whose_scope_holds_its_gpu() {
    let mut engine = Engine::default();
    let id = engine.add("r1", &reflexes(HOT_CODER)[0]).unwrap();
    let inside = GpuKey::new("rtx-1", 2);
    let outside = GpuKey::new("rtx-1", 3);
    engine.set_scope(id, vec![inside.clone()], Vec::new());
    assert!(drive(&mut engine, &outside, 0, 60, |_| 1.0).is_empty());
    // The instance moved: the scope follows it, the old GPU no longer counts.
    engine.set_scope(id, vec![outside.clone()], Vec::new());
    assert!(drive(&mut engine, &inside, 0, 60, |_| 1.0).is_empty());
    let fired = drive(&mut engine, &outside, 60, 70, |_| 1.0);
    assert_eq!(fired.len(), 1, "{fired:?}");
    // A run that ends takes its reflexes with it.
    engine.remove_run("r1");
    assert_eq!(engine.ids().count(), 0);
    assert!(drive(&mut engine, &outside, 100, 200, |_| 1.0).is_empty());
}

#[test]
fn ecc_errors_node_loss_and_agent_figures_reach_their_reflexes() {
    let section = r#"
  - name: failing-memory
    when: 'gpu.ecc_rate > 0 || node.down'
    scope: { node: rtx-2 }
    do: [ drain, { notify: "ECC errors on rtx-2: draining" } ]
    cooldown: 10m
  - name: queueing
    when: 'agent.queue_depth > 4 && agent.latency_p95_ms > 2000'
    for: 2s
    scope: { agent: chat }
    do: [ { clone: 1 } ]
    dry_run: true
"#;
    let reflexes = reflexes(section);
    let mut engine = Engine::default();
    let drain = engine.add("r1", &reflexes[0]).unwrap();
    engine.set_scope(drain, vec![GpuKey::new("rtx-2", 0)], vec!["rtx-2".to_owned()]);
    let errors = GpuReading {
        ecc_rate: 0.5,
        ..GpuReading::default()
    };
    let fired = engine.gpu_sample(&GpuKey::new("rtx-2", 0), errors, 1_000);
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].values["gpu.ecc_rate"], 0.5);
    assert_eq!(fired[0].values["node.down"], 0.0);
    assert_eq!(fired[0].actions.len(), 2);

    let mut engine = Engine::default();
    let drain = engine.add("r1", &reflexes[0]).unwrap();
    engine.set_scope(drain, Vec::new(), vec!["rtx-2".to_owned()]);
    assert!(engine.node_state("rtx-1", true, 1_000).is_empty());
    let fired = engine.node_state("rtx-2", true, 2_000);
    assert_eq!((fired.len(), fired[0].values["node.down"]), (1, 1.0));

    let queueing = engine.add("r1", &reflexes[1]).unwrap();
    let busy = AgentReading {
        queue_depth: 9.0,
        latency_p95_ms: Some(3500.0),
        ..AgentReading::default()
    };
    assert!(
        engine.agent_sample("r2", "chat", Some(busy), 0).is_empty(),
        "another run's agent"
    );
    assert!(engine.agent_sample("r1", "chat", Some(busy), 0).is_empty());
    assert!(engine.agent_sample("r1", "chat", Some(busy), 1_000).is_empty());
    // The samples stop but the figures held: the window closes on the next tick.
    let fired = engine.tick(2_500);
    assert_eq!(fired.len(), 1);
    assert_eq!(fired[0].id, queueing);
    assert!(fired[0].dry_run, "recorded, not acted on");
    assert_eq!(fired[0].values["agent.queue_depth"], 9.0);
    assert!(engine.is_active(queueing));
}

#[test]
fn a_metric_with_no_data_is_absent_and_a_condition_it_decides_does_not_hold() {
    let section = r#"
  - name: idle
    when: 'gpu.util < 0.1'
    scope: { agent: chat }
    do: [ { notify: "idle" } ]
  - name: queue-or-heat
    when: 'agent.queue_depth > 4 || gpu.temp > 85'
    scope: { agent: chat }
    do: [ notify ]
  - name: slow
    when: 'agent.latency_p95_ms > 1000 || !(agent.sessions > 0)'
    scope: { agent: chat }
    do: [ notify ]
  - name: calm
    when: 'agent.queue_depth > 4'
    release: 'gpu.util < 0.5'
    scope: { agent: chat }
    do: [ notify ]
    cooldown: 1s
"#;
    let reflexes = reflexes(section);
    let mut engine = Engine::default();
    let ids: Vec<_> = reflexes.iter().map(|r| engine.add("r1", r).unwrap()).collect();
    // An agent on no GPU (a remote endpoint): its figures are measured, `gpu.*` and
    // `node.down` have no data.
    let quiet = AgentReading {
        queue_depth: 0.0,
        latency_p95_ms: None,
        tokens_per_s: 0.0,
        sessions: 1.0,
    };
    for at in [0, 1_000, 60_000] {
        assert_eq!(engine.agent_sample("r1", "chat", Some(quiet), at), Vec::new());
    }
    assert!(ids.iter().all(|id| !engine.is_active(*id)), "nothing fires on no data");
    // A known side of `||` decides alone; absent values are left out of the event.
    let busy = AgentReading {
        queue_depth: 9.0,
        ..quiet
    };
    let fired = engine.agent_sample("r1", "chat", Some(busy), 61_000);
    let names: Vec<&str> = fired.iter().map(|d| d.reflex.as_str()).collect();
    assert_eq!(names, ["queue-or-heat", "calm"]);
    assert_eq!(
        fired[0].values,
        std::collections::BTreeMap::from([("agent.queue_depth".to_owned(), 9.0)])
    );
    // Unknown lets nothing go: `calm` releases only when `gpu.util < 0.5` is true, and
    // `queue-or-heat` (no `release`) only once its condition is false, which
    // `false || unknown` is not.
    assert_eq!(engine.agent_sample("r1", "chat", Some(quiet), 62_000), Vec::new());
    assert_eq!(engine.agent_sample("r1", "chat", Some(quiet), 100_000), Vec::new());
    assert!(engine.is_active(ids[1]) && engine.is_active(ids[3]));
    // Nothing serving the agent: `agent.*` are absent too.
    assert_eq!(engine.agent_sample("r1", "chat", None, 200_000), Vec::new());
    assert!(engine.is_active(ids[3]));
}

#[test]
fn a_release_condition_gives_hysteresis() {
    let section = r#"
  - name: busy
    when: 'gpu.util > 0.85'
    release: 'gpu.util < 0.5'
    scope: { agent: coder }
    do: [ { clone: 1 } ]
    cooldown: 10s
"#;
    let mut engine = Engine::default();
    let id = engine.add("r1", &reflexes(section)[0]).unwrap();
    let gpu = GpuKey::new("a100-box", 0);
    engine.set_scope(id, vec![gpu.clone()], Vec::new());
    // Up, then hovering at 0.7 (neither busy nor released) for a minute, then idle.
    let decisions = drive(&mut engine, &gpu, 0, 120, |t| match t {
        0..5 => 0.9,
        5..65 => 0.7,
        _ => 0.2,
    });
    let kinds: Vec<(i64, DecisionKind)> = decisions.into_iter().map(|d| (d.at_ms, d.kind)).collect();
    assert_eq!(kinds, [(0, DecisionKind::Fire), (75_000, DecisionKind::Release)]);
}

#[test]
fn a_condition_that_cannot_be_evaluated_is_said_once() {
    let section = r#"
  - name: odd
    when: 'gpu.util / 0 > 1'
    scope: { agent: coder }
    do: [ { notify: "never" } ]
"#;
    let mut engine = Engine::default();
    let id = engine.add("r1", &reflexes(section)[0]).unwrap();
    let gpu = GpuKey::new("a100-box", 0);
    engine.set_scope(id, vec![gpu.clone()], Vec::new());
    let decisions = drive(&mut engine, &gpu, 0, 10, |_| 0.5);
    assert!(
        decisions.iter().all(|d| matches!(d.kind, DecisionKind::Error(_))),
        "{decisions:?}"
    );
    assert!(decisions.len() <= 1, "{decisions:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Under a square-wave load of any period and duty, a reflex fires at most once per
    /// cooldown, releases only after its release held for the cooldown, and fire and
    /// release alternate.
    #[test]
    fn a_square_wave_never_makes_a_reflex_flap(
        period in 1i64..120,
        duty in 1i64..100,
        hold in 0u64..20,
        cooldown in 1u64..90,
    ) {
        let section = format!(
            "  - name: wave\n    when: 'gpu.util > 0.8'\n    for: {hold}s\n    scope: {{ agent: coder }}\n    do: [ {{ clone: 1 }} ]\n    cooldown: {cooldown}s\n"
        );
        let mut engine = Engine::default();
        let id = engine.add("r1", &reflexes(&section)[0]).unwrap();
        let gpu = GpuKey::new("n", 0);
        engine.set_scope(id, vec![gpu.clone()], Vec::new());
        let high = (period * duty / 100).max(1);
        let decisions = drive(&mut engine, &gpu, 0, 1200, |t| if t % period < high { 0.95 } else { 0.1 });
        let fires: Vec<i64> = decisions.iter().filter(|d| d.kind == DecisionKind::Fire).map(|d| d.at_ms).collect();
        for pair in fires.windows(2) {
            prop_assert!(pair[1] - pair[0] >= cooldown as i64 * 1000, "fired at {} and {}", pair[0], pair[1]);
        }
        let kinds: Vec<&DecisionKind> = decisions.iter().map(|d| &d.kind).collect();
        for (i, kind) in kinds.iter().enumerate() {
            let expected = if i % 2 == 0 { DecisionKind::Fire } else { DecisionKind::Release };
            prop_assert_eq!(*kind, &expected);
        }
    }
}

#[test]
fn a_reading_is_made_from_a_sample() {
    use skein_orchestrator::graph::{GpuFacts, GpuSample};
    let facts = GpuFacts {
        index: 0,
        uuid: "GPU-1".to_owned(),
        name: "NVIDIA A100-SXM4-80GB".to_owned(),
        memory_total: 80 << 30,
        compute_capability: Some((8, 0)),
        power_limit_mw: Some(400_000),
        pcie: None,
        nvlink_peers: Vec::new(),
        mig_enabled: None,
        simulated: true,
    };
    let sample = |unix_ms: i64, ecc: u64| GpuSample {
        received_ms: Default::default(),
        unix_ms,
        memory_used: 20 << 30,
        memory_free: 60 << 30,
        utilization_pct: Some(91),
        memory_utilization_pct: None,
        temperature_c: Some(84),
        power_mw: Some(300_000),
        sm_clock_mhz: None,
        throttle_reasons: skein_proto::throttle::HW_THERMAL_SLOWDOWN,
        ecc_corrected: Some(ecc),
        ecc_uncorrected: Some(0),
        foreign_memory: None,
    };
    let reading = GpuReading::of(&facts, &sample(3_000, 10), Some(&sample(1_000, 4)));
    assert_eq!(
        reading,
        GpuReading {
            util: 0.91,
            mem_used_frac: 0.25,
            temp: 84.0,
            power_frac: 0.75,
            throttled: true,
            ecc_rate: 3.0,
        }
    );
    assert_eq!(GpuReading::of(&facts, &sample(3_000, 10), None).ecc_rate, 0.0);
}
