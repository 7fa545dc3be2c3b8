//! `HubClient::download` against the mock hub on loopback: files land in the standard
//! Hugging Face cache layout, progress reaches the total, a second call transfers
//! nothing, and a file the commit lacks is a clear error before any transfer. A hostile
//! hub, whose ETag or commit header names a path outside the cache, is refused before
//! anything is written.

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skein_model_registry::Error;
use skein_model_registry::hub::{DownloadProgress, HubClient, HubClientBuilder, HubConfig, RepoId};
use support::mock_hub::{Hostile, MockHub, MockRepo};

const REPO: &str = "skein-test/download";

fn repo() -> MockRepo {
    MockRepo::new(REPO)
        .file("config.json", r#"{"model_type": "llama"}"#)
        .file("weights.bin", vec![7u8; 300_000])
}

fn client(hub: &MockHub, cache: &Path) -> HubClient {
    HubClientBuilder::from_config(HubConfig::from_lookup(|_| None))
        .endpoint(&hub.url)
        .cache_dir(cache)
        .token(None)
        .offline(false)
        .request_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn files(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_fills_the_standard_cache_layout_and_a_second_call_is_free() {
    let hub = MockHub::start(vec![repo()]).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path());
    let resolved = client.resolve(&RepoId::parse(REPO).unwrap(), "main").await.unwrap();
    let reports = Arc::new(Mutex::new(Vec::<DownloadProgress>::new()));
    let sink = Arc::clone(&reports);
    let wanted = files(&["config.json", "weights.bin"]);
    let snapshot = client
        .download(&resolved, &wanted, move |p| sink.lock().unwrap().push(p))
        .await
        .unwrap();

    let expected = cache
        .path()
        .join("models--skein-test--download")
        .join("snapshots")
        .join(resolved.sha.as_str());
    assert_eq!(snapshot, expected);
    assert_eq!(std::fs::read(snapshot.join("weights.bin")).unwrap(), vec![7u8; 300_000]);
    assert!(snapshot.join("config.json").is_file());
    assert!(cache.path().join("models--skein-test--download/blobs").is_dir());
    let reports = reports.lock().unwrap().clone();
    let last = reports.last().unwrap();
    assert_eq!((last.bytes_done, last.bytes_total), (last.bytes_total, 300_000 + 23));
    assert!(
        reports.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done),
        "{reports:?}"
    );
    assert!(
        reports
            .iter()
            .any(|p| p.file == "weights.bin" && p.file_bytes_done == 300_000)
    );

    let requests = hub.requests();
    let again = client.download(&resolved, &wanted, |_| {}).await.unwrap();
    assert_eq!(again, snapshot);
    assert_eq!(hub.requests(), requests, "a second download asks the hub nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_of_a_file_the_commit_lacks_names_it_and_transfers_nothing() {
    let hub = MockHub::start(vec![repo()]).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path());
    let resolved = client.resolve(&RepoId::parse(REPO).unwrap(), "main").await.unwrap();
    let requests = hub.requests();
    let error = client
        .download(&resolved, &files(&["config.json", "tokenizer.json"]), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::HubFileMissing { file, .. } if file == "tokenizer.json"),
        "{error:?}"
    );
    assert!(error.to_string().contains("has no file `tokenizer.json`"), "{error}");
    assert_eq!(hub.requests(), requests);
}

/// Every path under `root`, sorted, with the symlinks' targets.
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
                out.push(shown);
            }
        }
    }
    out.sort();
    out
}

/// A hub whose ETag or commit for a file names a path outside the cache gets its answer
/// refused, with the repository, the file, the header and its value named; the small-file
/// read (`fetch_small`, what planning does) and the whole-file download (what agents do)
/// write nothing outside the cache, and no file there is replaced by a symlink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_hub_cannot_write_outside_the_cache() {
    let hub = MockHub::start(vec![repo()]).await;
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("config.json"), "a file of the user's").unwrap();
    std::fs::write(outside.join("weights.bin"), "another").unwrap();
    let before = tree(&outside);
    let client = client(&hub, &cache);
    let resolved = client.resolve(&RepoId::parse(REPO).unwrap(), "main").await.unwrap();

    let cases = [
        ("config.json", Hostile::etag_to(&outside), "ETag"),
        ("weights.bin", Hostile::etag_to(&outside), "ETag"),
        ("config.json", Hostile::commit_to(&outside), "X-Repo-Commit"),
        ("weights.bin", Hostile::commit_to(&outside), "X-Repo-Commit"),
    ];
    for (file, hostile, header) in cases {
        hub.hostile(file, hostile);
        let answer = if file == "config.json" {
            client.fetch_small(&resolved, file).await.map(|_| ())
        } else {
            client.download(&resolved, &files(&[file]), |_| {}).await.map(|_| ())
        };
        assert_eq!(tree(&outside), before, "after {file} with a hostile {header}");
        assert_eq!(
            std::fs::read_to_string(outside.join("config.json")).unwrap(),
            "a file of the user's"
        );
        let error = answer.unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::HubUntrustedAnswer { .. }), "{error:?}");
        for needed in [REPO, file, header, "../../", "nothing was written", "HF_ENDPOINT"] {
            assert!(text.contains(needed), "`{needed}` missing from: {text}");
        }
    }
    // Nothing of the two files reached the cache either.
    let cached = if cache.exists() { tree(&cache) } else { Vec::new() };
    assert!(
        !cached.iter().any(|p| p.contains("blobs/") || p.contains("snapshots/")),
        "{cached:#?}"
    );
}
