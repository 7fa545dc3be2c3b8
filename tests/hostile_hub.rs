//! A hostile (or intercepted) Hugging Face Hub whose `ETag` or `X-Repo-Commit` header
//! names a path outside the cache: `skein models inspect` (the server's path to a
//! model's metadata) and an agent's model download refuse the answer with the header
//! named, write nothing outside the Hugging Face cache, and replace no file with a
//! symlink.

use std::path::{Path, PathBuf};
use std::process::Command;

use skein_testkit::lab::{Lab, stderr, stdout};
use skein_testkit::mock_hub::{Hostile, MockHub};
use skein_testkit::tiny_llama;

/// Every path under `root`, sorted, symlinks with their targets: what a test compares
/// before and after.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let shown = path.strip_prefix(root).unwrap().display().to_string();
            if meta.file_type().is_symlink() {
                out.push(format!("{shown} -> {}", std::fs::read_link(&path).unwrap().display()));
            } else if meta.is_dir() {
                out.push(format!("{shown}/"));
                stack.push(path);
            } else {
                out.push(format!("{shown} ({} bytes)", meta.len()));
            }
        }
    }
    out.sort();
    out
}

/// A folder outside every cache, holding a file of the user's named like a file of the
/// repository (what a hostile commit would replace with a symlink).
fn outside(root: &Path) -> (PathBuf, Vec<String>) {
    let dir = root.join("outside");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["config.json", "tokenizer.json"] {
        std::fs::write(dir.join(file), "a file of the user's").unwrap();
    }
    let before = tree(&dir);
    (dir, before)
}

#[test]
fn models_inspect_refuses_a_hostile_hub_and_writes_nothing_outside_the_cache() {
    let hub = MockHub::start_in_background(vec![tiny_llama::repo()]);
    let root = tempfile::tempdir().unwrap();
    let (outside, before) = outside(root.path());
    let cache = root.path().join("hf");

    for (hostile, header) in [
        (Hostile::etag_to(&outside), "ETag"),
        (Hostile::commit_to(&outside), "X-Repo-Commit"),
    ] {
        hub.hostile("config.json", hostile);
        let mut command = Command::new(env!("CARGO_BIN_EXE_skein"));
        hub.environment(&mut command, &cache)
            .args(["models", "inspect", tiny_llama::REPO_ID]);
        let out = command.output().unwrap();
        assert_eq!(tree(&outside), before, "a hostile {header} wrote outside the cache");
        let text = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{}\n{text}", stdout(&out));
        for needed in [tiny_llama::REPO_ID, "config.json", header, "../../", "misbehaving"] {
            assert!(text.contains(needed), "`{needed}` missing from: {text}");
        }
    }
}

#[test]
fn an_agent_refuses_a_hostile_hub_and_writes_nothing_outside_its_cache() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let (outside, before) = outside(lab.dir());
    // Only agents download `tokenizer.json` (the server reads configs and headers): both
    // headers name paths outside the agent's cache, as an intercepting proxy could.
    lab.hub().hostile(
        "tokenizer.json",
        Hostile {
            etag: Hostile::etag_to(&outside).etag,
            commit: Hostile::commit_to(&outside).commit,
        },
    );
    let _server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    let workflow = lab.dir().join("hello.yaml");
    std::fs::write(
        &workflow,
        format!(
            "name: hello\nagents:\n  a: {{ model: {{ repo: {}, context: 256 }}, max_tokens: 4 }}\nsteps:\n  - {{ id: s, agent: a, prompt: hi }}\n",
            tiny_llama::REPO_ID
        ),
    )
    .unwrap();
    let submitted = lab.cli(&["submit", workflow.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));

    let run = stdout(&submitted).trim().to_owned();
    // The run fails with the agent's reason (the instance is stopped and forgotten).
    let failed = lab.wait_run(&run, "the download to be refused", |run| {
        run["state"] == "failed" || run.to_string().contains("X-Repo-Commit")
    });
    assert_eq!(tree(&outside), before, "the agent wrote outside its cache");
    let detail = failed.to_string().replace("\\\"", "\"");
    for needed in [
        tiny_llama::REPO_ID,
        "tokenizer.json",
        "X-Repo-Commit",
        "../../",
        "misbehaving",
    ] {
        assert!(detail.contains(needed), "`{needed}` missing from: {detail}");
    }
}
