//! The planner's time against the exact solver's on the oracle's cases
//! (`tests/plan_oracle.rs`): fleets of 8 to 64 GPUs, 1 to 4 agents. Per case, the
//! planner's whole plan (`plan::plan`, median of repeated runs) and HiGHS's own solve
//! time for the same problem (all three objectives; the oracle's column enumeration and
//! the solver's start are not counted). Prints each case and the median ratio.
//!
//! `cargo bench -p skein-orchestrator --bench plan_oracle` (`PLAN_ORACLE_CASES`, else 40).

#[path = "../tests/common/generated.rs"]
mod generated;
#[path = "../tests/common/oracle.rs"]
mod oracle;

use std::time::Instant;

use generated::{agent_spec, drawn, fleet_between, models, snapshot, with_units, workflow};
use proptest::prelude::*;
use skein_orchestrator::plan::{self, PlanFleet, PlanInput, PlanSettings};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (as `cargo test --benches` does) is
    // a quick check that it runs.
    let quick = !std::env::args().any(|a| a == "--bench");
    let count = std::env::var("PLAN_ORACLE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 2 } else { 40 });
    let cases = drawn(
        (fleet_between(8, 64), prop::collection::vec(agent_spec(), 1..=4)),
        count,
        0x5ce1_0ac1,
    );
    let settings = PlanSettings::default();
    let mut programs = Vec::new();
    let mut planner = Vec::new();
    let mut names = Vec::new();
    for (case, (fleet, agents)) in cases.iter().enumerate() {
        let snapshot = snapshot(fleet);
        let workflow = workflow(agents);
        let plan_fleet = PlanFleet::from_snapshot(&snapshot, settings.headroom, settings.host_headroom, &[]);
        let problem = with_units(&workflow, &plan_fleet, &settings, |refs, _| {
            oracle::problem(refs, &plan_fleet)
        });
        let Ok(problem) = problem else {
            continue;
        };
        let input = PlanInput {
            workflow: &workflow,
            models: models(),
            adapters: &skein_orchestrator::plan::NO_ADAPTERS,
            graph: &snapshot,
            running: &[],
            settings,
        };
        let runs = if quick { 1 } else { 15 };
        let times: Vec<f64> = (0..runs)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(plan::plan(&input).expect("plans"));
                start.elapsed().as_secs_f64()
            })
            .collect();
        planner.push(median(times));
        programs.push(problem.program(120.0));
        names.push(format!(
            "case {case:>2}: {:>2} GPUs, {} agents, {:>4} columns",
            fleet.iter().map(|n| n.gpus.len()).sum::<usize>(),
            agents.len(),
            problem.columns.len()
        ));
    }
    let solutions = oracle::solve(&programs);
    let mut ratios = Vec::new();
    for ((name, planned), solution) in names.iter().zip(&planner).zip(&solutions) {
        let solver = solution["seconds"].as_f64().unwrap_or(f64::NAN);
        ratios.push(solver / planned);
        println!(
            "{name}: planner {:>9.3} ms, HiGHS {:>9.3} ms, {:>8.1}x",
            planned * 1e3,
            solver * 1e3,
            solver / planned
        );
    }
    println!(
        "{} cases: planner median {:.3} ms, HiGHS median {:.3} ms, HiGHS/planner median {:.1}x",
        ratios.len(),
        median(planner.clone()) * 1e3,
        median(
            solutions
                .iter()
                .map(|s| s["seconds"].as_f64().unwrap_or(f64::NAN))
                .collect()
        ) * 1e3,
        median(ratios)
    );
}
