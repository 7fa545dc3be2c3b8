//! `HubClient::download` against the mock hub on loopback: files land in the standard
//! Hugging Face cache layout, progress reaches the total, a second call transfers
//! nothing, and a file the commit lacks is a clear error before any transfer.

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skein_model_registry::Error;
use skein_model_registry::hub::{DownloadProgress, HubClient, HubClientBuilder, HubConfig, RepoId};
use support::mock_hub::{MockHub, MockRepo};

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
