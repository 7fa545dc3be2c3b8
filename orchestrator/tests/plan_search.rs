//! The planner on generated fleets and workflows: every plan is valid (no GPU over its
//! usable memory, valid tensor-parallel degrees, precision at least the minimum, whole
//! gangs, deterministic), and on small cases no exhaustive search over every GPU subset
//! finds a better objective.

#[path = "common/generated.rs"]
mod generated;

use std::collections::HashMap;

use generated::{agent_spec, fleet_spec, models, snapshot, workflow};
use proptest::prelude::*;
use skein_model_registry::estimate::{Layout, check_tp};
use skein_orchestrator::plan::options::{Cand, Dev, Family, FleetState, State, Unit, for_each_subset};
use skein_orchestrator::plan::{
    self, PlanFleet, PlanInput, PlanSettings, Planner, UnitCaches, demand, make_units, search,
};

/// The exhaustive comparison's configuration: `PLAN_EXHAUSTIVE_CASES` cases (else 256)
/// from a fixed seed, so that every run checks the same cases in the same time (about a
/// minute in the debug build CI runs); `PROPTEST_RNG_SEED` draws other cases.
fn exhaustive_config() -> ProptestConfig {
    let cases = std::env::var("PLAN_EXHAUSTIVE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let mut config = ProptestConfig::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x5ce1_2026);
    }
    config
}

fn settings(budget: u64) -> PlanSettings {
    PlanSettings {
        search_budget: budget,
        ..PlanSettings::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Every plan respects memory, degrees, precision and gangs, and is reproducible:
    /// by a new planner, and by one planner that planned every case before (its caches
    /// carried from fleet to fleet).
    #[test]
    fn plans_are_valid_and_deterministic(
        fleet in fleet_spec(10),
        agents in prop::collection::vec(agent_spec(), 1..=4),
    ) {
        let snapshot = snapshot(&fleet);
        let workflow = workflow(&agents);
        let input = PlanInput { workflow: &workflow, models: models(), adapters: &plan::NO_ADAPTERS, graph: &snapshot, running: &[], settings: settings(5_000) };
        let plan = plan::plan(&input).expect("plans");
        let again = plan::plan(&input).expect("plans");
        let json = serde_json::to_string(&plan).unwrap();
        prop_assert_eq!(&json, &serde_json::to_string(&again).unwrap());
        thread_local!(static PLANNER: std::cell::RefCell<Planner> = std::cell::RefCell::default());
        let kept = PLANNER.with(|p| p.borrow_mut().plan(&input)).expect("plans");
        prop_assert_eq!(&json, &serde_json::to_string(&kept).unwrap());

        let plan_fleet = PlanFleet::from_snapshot(&snapshot, input.settings.headroom, input.settings.host_headroom, &[]);
        let mut reserved: HashMap<(String, Option<u32>), u64> = HashMap::new();
        for i in &plan.instances {
            let agent = &workflow.agents[&i.agents[0]];
            let skein_dsl::ir::Backend::Model(req) = &agent.backend else { unreachable!() };
            prop_assert!(i.precision >= req.min_precision, "{} below {}", i.precision, req.min_precision);
            let e = i.estimate.as_ref().expect("an estimate");
            // The gang: one device per estimate device, every one reserved.
            prop_assert_eq!(i.devices.len(), e.devices.len());
            prop_assert_eq!(e.layout.devices() as usize, i.devices.len());
            if e.layout.tensor_parallel > 1 {
                let info = &models()[&i.model];
                let variant = info.variants.iter().find(|v| v.id == i.variant).expect("the variant");
                prop_assert!(check_tp(&info.shape, Some(&variant.quantization), e.layout.tensor_parallel).is_ok());
                // TP groups are GPUs of one model on one node.
                for stage in i.devices.chunks(e.layout.tensor_parallel as usize) {
                    prop_assert!(stage.iter().all(|d| d.node == stage[0].node && d.name == stage[0].name));
                }
            }
            for d in &i.devices {
                prop_assert!(d.reserved >= d.need);
                *reserved.entry((d.node.clone(), d.gpu)).or_default() += d.reserved;
            }
        }
        for ((node, gpu), bytes) in reserved {
            let n = plan_fleet.nodes.iter().find(|n| n.name == node).expect("the node");
            let usable = match gpu {
                Some(index) => n.gpus.iter().find(|g| g.index == index).expect("the GPU").usable,
                None => n.host_free,
            };
            prop_assert!(bytes <= usable, "{node} {gpu:?}: {bytes} reserved of {usable} usable");
        }
        prop_assert_eq!(plan.admitted, plan.unplaced.is_empty());
    }

}

proptest! {
    #![proptest_config(exhaustive_config())]

    /// On small cases (up to 8 GPUs, up to 4 agents), an exhaustive search over every
    /// subset of GPUs finds no better objective than the planner.
    #[test]
    fn no_exhaustive_search_beats_the_planner(
        fleet in fleet_spec(8),
        agents in prop::collection::vec(agent_spec(), 1..=4),
    ) {
        let snapshot = snapshot(&fleet);
        let workflow = workflow(&agents);
        let s = settings(200_000);
        let plan_fleet = PlanFleet::from_snapshot(&snapshot, s.headroom, s.host_headroom, &[]);
        let instances = demand::instances(&workflow);
        let infos = demand::catalogs(&instances, models()).expect("catalogs");
        let mut state = State::new(&plan_fleet);
        let units = make_units(&instances, &infos, &plan_fleet, &state, s.kv_dtype, &mut UnitCaches::default());
        let refs: Vec<&Unit<'_>> = units.iter().map(|u| &u.unit).collect();
        let found = search::search(&refs, &plan_fleet, &mut state, s.search_budget);
        prop_assume!(found.complete);
        // The same visiting order: a split's layers follow the memory free when its
        // instance is placed, so the order is part of the candidate space.
        let order = search::visiting_order(&refs, &plan_fleet, &state);
        let ordered: Vec<&Unit<'_>> = order.iter().map(|&u| refs[u]).collect();
        let Some((best, mut choice)) = exhaustive(&ordered, &plan_fleet) else {
            return Err(TestCaseError::reject("the exhaustive search would take too long"));
        };
        let mut by_unit = vec![None; refs.len()];
        for (depth, &u) in order.iter().enumerate() {
            by_unit[u] = choice[depth].take();
        }
        let choice = by_unit;
        let describe = |c: &Option<Cand>| c.as_ref().map(|c| format!("v{} {:?} {:?} {} {:?}", c.variant, c.family, c.devices, c.score, c.parts));
        prop_assert!(
            (found.placed, found.score) >= best,
            "planner {:?} < exhaustive {:?}\nplanner: {:#?}\nexhaustive: {:#?}", (found.placed, found.score), best,
            found.chosen.iter().map(describe).collect::<Vec<_>>(),
            choice.iter().map(describe).collect::<Vec<_>>()
        );
    }
}

/// Every candidate of `unit` in `state` by brute force: every variant on every subset
/// of the fleet's GPUs as one GPU, tensor parallel (one node, one model) or a layer split
/// (GPUs ordered node by node, as the planner orders them), and the host fallbacks on
/// every node.
fn brute_candidates(unit: &Unit<'_>, fleet: &PlanFleet, state: &State) -> Vec<Cand> {
    let all: Vec<Dev> = fleet
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| (0..node.gpus.len()).map(move |p| Dev { node: n, gpu: Some(p) }))
        .collect();
    let at = FleetState::new(fleet, state);
    let mut out = Vec::new();
    for &(v, _) in &unit.allowed {
        for size in 1..=all.len() {
            for_each_subset(&all, size, &mut |subset: &[Dev]| {
                if size == 1 {
                    out.extend(unit.evaluate(at, v, Family::Single, Layout::single(), subset.to_vec()));
                    return;
                }
                let one_node = subset.iter().all(|d| d.node == subset[0].node);
                let gpu = |d: &Dev| &fleet.nodes[d.node].gpus[d.gpu.unwrap_or(0)];
                if one_node && subset.iter().all(|d| gpu(d).name == gpu(&subset[0]).name) {
                    out.extend(unit.evaluate(
                        at,
                        v,
                        Family::TensorParallel,
                        Layout::tensor_parallel(size as u64),
                        subset.to_vec(),
                    ));
                }
                let usable = |d: &Dev| state.usable[d.node][d.gpu.unwrap_or(0)];
                let mut nodes: Vec<usize> = subset.iter().map(|d| d.node).collect();
                nodes.dedup();
                let capacity = |n: usize| subset.iter().filter(|d| d.node == n).map(usable).sum::<u64>();
                nodes.sort_by(|&a, &b| capacity(b).cmp(&capacity(a)).then(a.cmp(&b)));
                let mut order = Vec::new();
                for n in nodes {
                    let mut mine: Vec<Dev> = subset.iter().copied().filter(|d| d.node == n).collect();
                    mine.sort_by(|a, b| usable(b).cmp(&usable(a)).then(a.gpu.cmp(&b.gpu)));
                    order.extend(mine);
                }
                let memory = order
                    .iter()
                    .map(|d| skein_model_registry::Bytes::new(usable(d)))
                    .collect();
                let family = if one_node { Family::NodeSplit } else { Family::CrossNode };
                out.extend(unit.evaluate(at, v, family, Layout::pipeline_by_memory(memory), order));
            });
        }
    }
    // The host fallbacks have no subset to choose: the planner's own.
    for n in 0..fleet.nodes.len() {
        out.extend(unit.fallback(at, n));
    }
    out
}

/// Brute-force candidate sets (each every subset of GPUs for every variant) an
/// exhaustive search computes at most; the rare case that needs more is left out, so
/// that a run's time stays bounded whatever cases it draws.
const BRUTE_FORCE_LIMIT: usize = 2_000;

/// The best (placed, score) over every combination of brute-force candidates. Branches
/// are cut only when even each remaining unit's best candidate on the untouched fleet
/// could not beat the best found (reserving memory only removes candidates).
/// The best objective and the candidate of each unit that reaches it.
type Best = ((usize, i128), Vec<Option<Cand>>);

fn exhaustive(units: &[&Unit<'_>], fleet: &PlanFleet) -> Option<Best> {
    struct Ctx<'a, 'b> {
        units: &'a [&'a Unit<'b>],
        fleet: &'a PlanFleet,
        rest: Vec<(usize, i128)>,
        best: (usize, i128),
        current: Vec<Option<Cand>>,
        choice: Vec<Option<Cand>>,
        /// Each depth's brute-force candidates by the free memory they were made in:
        /// different choices on interchangeable GPUs leave the same state.
        seen: HashMap<(usize, Vec<u64>), std::rc::Rc<Vec<Cand>>>,
        /// Candidate sets computed, and whether the limit stopped the search.
        computed: usize,
        gave_up: bool,
    }
    fn go(ctx: &mut Ctx<'_, '_>, state: &mut State, depth: usize, acc: (usize, i128)) {
        if ctx.gave_up {
            return;
        }
        if depth == ctx.units.len() {
            if acc > ctx.best {
                ctx.best = acc;
                ctx.choice = ctx.current.clone();
            }
            return;
        }
        let (more, bound) = ctx.rest[depth];
        if (acc.0 + more, acc.1 + bound) <= ctx.best {
            return;
        }
        let free: Vec<u64> = state.usable.iter().flatten().chain(&state.host).copied().collect();
        let cands = match ctx.seen.get(&(depth, free.clone())) {
            Some(cands) => cands.clone(),
            None => {
                if ctx.computed == BRUTE_FORCE_LIMIT {
                    ctx.gave_up = true;
                    return;
                }
                ctx.computed += 1;
                let mut cands = brute_candidates(ctx.units[depth], ctx.fleet, state);
                cands.sort_by_key(|c| std::cmp::Reverse(c.score));
                let cands = std::rc::Rc::new(cands);
                ctx.seen.insert((depth, free), cands.clone());
                cands
            }
        };
        let (rest_placed, rest_score) = ctx.rest[depth + 1];
        for cand in cands.iter().cloned() {
            // Best first: once one cannot beat the best even with every later unit at
            // its best, none can.
            if (acc.0 + 1 + rest_placed, acc.1 + i128::from(cand.score) + rest_score) <= ctx.best {
                break;
            }
            state.apply(&cand);
            let score = i128::from(cand.score);
            ctx.current[depth] = Some(cand);
            go(ctx, state, depth + 1, (acc.0 + 1, acc.1 + score));
            if let Some(cand) = ctx.current[depth].take() {
                state.undo(&cand);
            }
        }
        go(ctx, state, depth + 1, acc);
    }
    let initial = State::new(fleet);
    let alone: Vec<Option<i64>> = units
        .iter()
        .map(|u| brute_candidates(u, fleet, &initial).iter().map(|c| c.score).max())
        .collect();
    let mut rest = vec![(0usize, 0i128); units.len() + 1];
    for d in (0..units.len()).rev() {
        rest[d] = match alone[d] {
            Some(s) => (rest[d + 1].0 + 1, rest[d + 1].1 + i128::from(s)),
            None => rest[d + 1],
        };
    }
    let mut ctx = Ctx {
        units,
        fleet,
        rest,
        best: (0, i128::MIN),
        current: vec![None; units.len()],
        choice: vec![None; units.len()],
        seen: HashMap::new(),
        computed: 0,
        gave_up: false,
    };
    go(&mut ctx, &mut State::new(fleet), 0, (0, 0));
    (!ctx.gave_up).then_some((ctx.best, ctx.choice))
}
