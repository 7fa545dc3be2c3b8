//! Plans of the example workflows on fleet files, as snapshots: the graph each fleet's
//! agents would build (through the protocol's messages), the reference models' catalogs
//! (what `skein models inspect` reads from the hub), and the planner users run.

use std::collections::BTreeMap;
use std::path::Path;

use skein_model_registry::catalog::ModelInfo;
use skein_orchestrator::graph::{GraphConfig, GraphSnapshot};
use skein_orchestrator::plan::{self, Plan, PlanInput, PlanSettings};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn models() -> BTreeMap<String, ModelInfo> {
    skein_testkit::models::reference_models()
        .into_iter()
        .map(|m| (m.repo.to_string(), m))
        .collect()
}

fn graph(fleet: &str) -> GraphSnapshot {
    let fleet = skein_agent::fleet::load_fleet(root().join(fleet)).expect("a valid fleet file");
    let messages = skein_agent::daemon::fleet_messages(&fleet, 0.0);
    skein_orchestrator::agents::graph_from_wire(messages, GraphConfig::default(), 0)
        .expect("the orchestrator accepts the fleet's nodes")
        .snapshot()
}

fn workflow(file: &str) -> skein_dsl::Workflow {
    let parsed = skein_orchestrator::workflows::load(&root().join(file)).expect("readable");
    parsed.workflow.expect("a valid workflow")
}

fn plan_of(workflow_file: &str, fleet: &str) -> Plan {
    let workflow = workflow(workflow_file);
    let models = models();
    let graph = graph(fleet);
    plan::plan(&PlanInput {
        workflow: &workflow,
        models: &models,
        graph: &graph,
        running: &[],
        settings: PlanSettings::default(),
    })
    .expect("plans")
}

#[test]
fn scratch() {
    use skein_orchestrator::plan::options::State;
    use skein_orchestrator::plan::{PlanFleet, demand, make_units};
    let workflow = workflow("workflows/lab-research.yaml");
    let models = models();
    let graph = graph("workflows/fleets/lab-busy.yaml");
    let s = PlanSettings::default();
    let fleet = PlanFleet::from_snapshot(&graph, s.headroom, s.host_headroom, &[]);
    let instances = demand::instances(&workflow);
    let infos = demand::catalogs(&instances, &models).unwrap();
    let units = make_units(&instances, &infos, &fleet, s.kv_dtype);
    let mut state = State::new(&fleet);
    for u in &units {
        eprintln!("unit {}", instances[u.instance].agents[0]);
    }
    let coder = &units[0].unit;
    let c = coder.candidates(&fleet, &state);
    for c in &c {
        eprintln!(
            "coder {} {:?} {:?} {}",
            coder_variant(c.variant),
            c.family,
            c.devices,
            c.score
        );
    }
    let awq = c.iter().find(|c| c.variant == 5).unwrap().clone();
    state.apply(&awq);
    for c in units[2].unit.candidates(&fleet, &state) {
        eprintln!("writer v{} {:?} {:?} {}", c.variant, c.family, c.devices, c.score);
    }
    fn coder_variant(v: usize) -> usize {
        v
    }
    let _ = plan_of;
}
