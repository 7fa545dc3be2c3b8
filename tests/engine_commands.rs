//! The exact command lines and environments of the engines for real plans: every example
//! workflow (`workflows/*.yaml`) planned on every fleet file (`workflows/fleets/`, the
//! reference fleet `lab.yaml` among them) with the reference models, each planned replica
//! turned into the start commands the orchestrator sends (a split's pieces, then its
//! serving engine) and the command each agent then runs. One snapshot per fleet: a change
//! to the planner, the launch or the command builder that changes what an engine is
//! started with shows here. (agent/tests/engine_commands.rs checks the command builder's
//! refusals and that the supervisor starts exactly these commands.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[path = "support/launches.rs"]
mod launches;

fn sorted_files(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| keep(p))
        .collect();
    files.sort();
    files
}

fn name(path: &Path) -> String {
    path.file_name().unwrap_or_default().to_string_lossy().into_owned()
}

#[test]
fn every_engine_command_of_the_examples_plans_on_each_fleet() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut models = skein_testkit::models::reference_catalog();
    // The base of the LoRA tutors (workflows/lora-tutors.yaml).
    let llama_8b = skein_testkit::adapters::llama_3_8b_info();
    models.insert(llama_8b.repo.to_string(), llama_8b);
    // The embedding model of workflows/paper-search.yaml.
    let e5 = skein_testkit::embeddings::e5_mistral_info();
    models.insert(e5.repo.to_string(), e5);
    let yaml = |p: &Path| p.extension().is_some_and(|e| e == "yaml");
    let workflows = sorted_files(&root.join("workflows"), yaml);
    let mut engines = BTreeMap::new();
    for fleet in sorted_files(&root.join("workflows/fleets"), yaml) {
        // Workflow file → replica → its commands in the order they are started.
        let mut commands = BTreeMap::new();
        for workflow in &workflows {
            let Some((plan, graph)) = launches::plan_files(workflow, &fleet, &models) else {
                continue;
            };
            let mut replicas = BTreeMap::new();
            for planned in &plan.instances {
                let (_, variant) = launches::model_of(planned, &models);
                let started: Vec<serde_json::Value> =
                    launches::starts(&format!("r1-{}", planned.instance), planned, &models, &graph)
                        .iter()
                        .map(|s| {
                            let command = launches::spec(&s.start, variant).command().expect("a command");
                            *engines.entry(planned.engine.clone()).or_insert(0) += 1;
                            serde_json::json!({ "node": s.node, "instance": s.start.instance, "command": command })
                        })
                        .collect();
                replicas.insert(planned.instance.clone(), started);
            }
            commands.insert(name(workflow), replicas);
        }
        let fleet_name = fleet.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        insta::assert_yaml_snapshot!(format!("commands_on_{fleet_name}"), commands);
    }
    // Every engine the planner chooses is among them.
    for engine in ["vllm", "llama.cpp", "candle"] {
        assert!(engines.contains_key(engine), "no {engine} command: {engines:?}");
    }
}
