//! `HubClient::download` against the mock hub on loopback: files land in the standard
//! Hugging Face cache layout, progress reaches the total, a second call transfers
//! nothing, and a file the commit lacks is a clear error before any transfer. A hostile
//! hub, whose ETag or commit header names a path outside the cache, is refused before
//! anything is written. Files larger than the download chunk come in Range requests,
//! each answer checked: a `Content-Range` that is not the range asked stops the download.

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
    builder(hub, cache).build().unwrap()
}

fn builder(hub: &MockHub, cache: &Path) -> HubClientBuilder {
    HubClientBuilder::from_config(HubConfig::from_lookup(|_| None))
        .endpoint(&hub.url)
        .cache_dir(cache)
        .token(None)
        .offline(false)
        .request_timeout(Duration::from_secs(30))
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

/// The download chunk of the range tests: a large file of the mock is a few of them.
const CHUNK: u64 = 1 << 20;

/// A file of three and a bit chunks: a pattern over its first two and a half (so a range
/// written at the wrong offset shows), then zeros, generated by the mock as weights are.
fn large_repo() -> (MockRepo, Vec<u8>) {
    let len = 3 * CHUNK + 12_345;
    let prefix: Vec<u8> = (0..5 * CHUNK / 2).map(|i| (i % 251) as u8).collect();
    let mut content = prefix.clone();
    content.resize(len as usize, 0);
    let repo = MockRepo::new(REPO)
        .file("config.json", r#"{"model_type": "llama"}"#)
        .virtual_file("model.safetensors", prefix, len);
    (repo, content)
}

/// A file larger than the download chunk comes in Range requests of the chunk, each
/// written at its offset: the cached file is the hub's, byte for byte, progress reaches
/// its size, and no whole-file `GET` was sent (the hub serves large files in ranges only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_comes_in_ranges_written_at_their_offsets() {
    let (repo, content) = large_repo();
    let size = content.len() as u64;
    let hub = MockHub::start(vec![repo]).await;
    let cache = tempfile::tempdir().unwrap();
    let client = builder(&hub, cache.path()).download_chunk_bytes(CHUNK).build().unwrap();
    let resolved = client.resolve(&RepoId::parse(REPO).unwrap(), "main").await.unwrap();
    let reports = Arc::new(Mutex::new(Vec::<DownloadProgress>::new()));
    let sink = Arc::clone(&reports);
    let snapshot = client
        .download(&resolved, &files(&["model.safetensors"]), move |p| {
            sink.lock().unwrap().push(p)
        })
        .await
        .unwrap();

    let cached = std::fs::read(snapshot.join("model.safetensors")).unwrap();
    assert_eq!(cached.len(), content.len());
    assert!(cached == content, "the cached file differs from the hub's");
    let gets: Vec<String> = hub
        .log()
        .into_iter()
        .filter(|line| line.starts_with("GET ") && line.contains("/resolve/"))
        .collect();
    let mut ranges: Vec<&str> = gets
        .iter()
        .map(|line| line.split_once(" [").map_or("whole file", |(_, range)| range))
        .collect();
    ranges.sort_unstable();
    let last = size - 1;
    assert_eq!(
        ranges,
        [
            "bytes=0-1048575]",
            "bytes=1048576-2097151]",
            "bytes=2097152-3145727]",
            &format!("bytes=3145728-{last}]"),
        ],
        "{gets:#?}"
    );
    let reports = reports.lock().unwrap().clone();
    assert!(reports.len() > 4, "{reports:?}");
    assert!(
        reports.windows(2).all(|w| w[0].file_bytes_done <= w[1].file_bytes_done),
        "{reports:?}"
    );
    let done = reports.last().unwrap();
    assert_eq!(
        (done.file_bytes_done, done.bytes_done, done.bytes_total),
        (size, size, size)
    );
    let blobs = cache.path().join("models--skein-test--download/blobs");
    let left: Vec<String> = tree(&blobs)
        .into_iter()
        .filter(|p| p.ends_with(".incomplete"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A range whose transfer breaks off halfway is asked for again, from its start: the
/// download completes with the hub's bytes, and progress never goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_that_breaks_off_is_asked_for_again() {
    let (repo, content) = large_repo();
    let hub = MockHub::start(vec![repo]).await;
    hub.break_ranges("model.safetensors", 2);
    let cache = tempfile::tempdir().unwrap();
    let client = builder(&hub, cache.path()).download_chunk_bytes(CHUNK).build().unwrap();
    let resolved = client.resolve(&RepoId::parse(REPO).unwrap(), "main").await.unwrap();
    let reports = Arc::new(Mutex::new(Vec::<u64>::new()));
    let sink = Arc::clone(&reports);
    let snapshot = client
        .download(&resolved, &files(&["model.safetensors"]), move |p| {
            sink.lock().unwrap().push(p.file_bytes_done)
        })
        .await
        .unwrap();
    assert!(std::fs::read(snapshot.join("model.safetensors")).unwrap() == content);
    let ranges = hub.log().iter().filter(|line| line.contains("[bytes=")).count();
    assert_eq!(ranges, 4 + 2, "{:#?}", hub.log());
    let reports = reports.lock().unwrap().clone();
    assert!(reports.windows(2).all(|w| w[0] <= w[1]), "{reports:?}");
    assert_eq!(reports.last(), Some(&(content.len() as u64)));
}

/// A range answered under a `Content-Range` that is not the range asked for (a broken
/// proxy) stops the download with an error naming the file, the range and the header,
/// and nothing is cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_answered_as_another_range_is_a_clear_error() {
    let (repo, _) = large_repo();
    let hub = MockHub::start(vec![repo]).await;
    hub.misreport_ranges("model.safetensors");
    let cache = tempfile::tempdir().unwrap();
    let client = builder(&hub, cache.path()).download_chunk_bytes(CHUNK).build().unwrap();
    let resolved = client.resolve(&RepoId::parse(REPO).unwrap(), "main").await.unwrap();
    let error = client
        .download(&resolved, &files(&["model.safetensors"]), |_| {})
        .await
        .unwrap_err();
    assert!(matches!(error, Error::HubResponse { .. }), "{error:?}");
    let text = error.to_string();
    for needed in [
        REPO,
        "`model.safetensors`",
        "Content-Range \"bytes ",
        "listed with 3158073 bytes",
        "nothing was cached",
        "HF_ENDPOINT",
    ] {
        assert!(text.contains(needed), "`{needed}` missing from: {text}");
    }
    let cached = tree(cache.path());
    assert!(
        !cached
            .iter()
            .any(|p| (p.contains("snapshots/") || p.contains("blobs/")) && !p.ends_with('/')),
        "{cached:#?}"
    );
}
