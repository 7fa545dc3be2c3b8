//! The reflex event log over REST: events are durable before they are announced, listed
//! newest first a page at a time, streamed as they come, and a user sees only the
//! events of their own runs.

mod common;

use std::collections::BTreeMap;

use common::{API, quick, setup};
use reqwest::Method;
use skein_dsl::ir::Action;
use skein_orchestrator::reflex::{ActionRecord, EventKind, EventRecord, Outcome};
use skein_orchestrator::run::record::UnixMs;

fn event(owner: &str, reflex: &str, at: i64) -> EventRecord {
    EventRecord {
        id: String::new(),
        at: UnixMs(at),
        sampled_at: None,
        run: format!("r-{owner}"),
        owner: owner.to_owned(),
        reflex: reflex.to_owned(),
        kind: EventKind::Fire,
        values: BTreeMap::from([("gpu.util".to_owned(), 0.93)]),
        actions: vec![ActionRecord {
            action: Action::Notify {
                message: Some("hot".to_owned()),
            },
            outcome: Outcome::Done,
            detail: "recorded".to_owned(),
        }],
        error: None,
        dry_run: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflex_events_are_durable_paged_streamed_and_private() {
    let db = tempfile::tempdir().unwrap();
    let s = setup(quick(), Some(db.path())).await;
    let ada = s.token_for("ada").await;
    let bob = s.token_for("bob").await;

    // The stream sees an event recorded after it opened.
    let mut stream = s
        .http
        .get(s.url("/v1/events/stream"))
        .bearer_auth(&ada)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);

    for i in 0..5 {
        s.server
            .reflex_events
            .record(event("ada", &format!("hot-{i}"), 1_000 * i))
            .await
            .unwrap();
        s.server
            .reflex_events
            .record(event("bob", "bob's", 1_000 * i))
            .await
            .unwrap();
    }
    let mut seen = String::new();
    while !seen.contains("hot-0") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), stream.chunk())
            .await
            .expect("the stream delivers")
            .unwrap()
            .expect("the stream stays open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: reflex"), "{seen}");
    assert!(!seen.contains("bob's"), "ada's stream shows only her runs: {seen}");

    // Ada's five, newest first, two a page.
    let mut names = Vec::new();
    let mut path = "/v1/events?limit=2".to_owned();
    loop {
        let (status, page) = s.call(Method::GET, &path, Some(&ada), None).await;
        assert_eq!(status, 200, "{page}");
        names.extend(
            page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["reflex"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => path = format!("/v1/events?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(names, ["hot-4", "hot-3", "hot-2", "hot-1", "hot-0"]);
    let (_, page) = s.call(Method::GET, "/v1/events", Some(&bob), None).await;
    assert_eq!(page["data"].as_array().unwrap().len(), 5);
    let (_, page) = s.call(Method::GET, "/v1/events", Some(API), None).await;
    assert_eq!(page["data"].as_array().unwrap().len(), 10, "the admin sees all");
    let first = &page["data"][9];
    assert_eq!(first["values"]["gpu.util"], 0.93);
    assert_eq!(first["actions"][0]["outcome"], "done");

    // Acknowledged events survive a restart of the server.
    drop(stream);
    drop(s);
    let s = setup(quick(), Some(db.path())).await;
    let (_, page) = s.call(Method::GET, "/v1/events?limit=1000", Some(API), None).await;
    assert_eq!(page["data"].as_array().unwrap().len(), 10);
}
