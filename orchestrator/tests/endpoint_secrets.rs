//! A session on an endpoint agent calls it with the key of the run's owner, read at
//! each turn: set, it is sent; removed, the turn is refused with the fix, and nothing
//! is sent.

mod common;

use common::{quick, setup};
use reqwest::Method;
use serde_json::{Value, json};
use skein_testkit::endpoint::WholeAnswer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_an_endpoint_sends_the_run_owners_secret_read_at_each_turn() {
    let s = setup(quick(), None).await;
    let hosted = WholeAnswer::start("hosted");
    let url = hosted.url();
    let ada = s.token_for("ada").await;
    let bob = s.token_for("bob").await;
    let (status, _) = s
        .call(
            Method::PUT,
            "/v1/secrets/hosted-key",
            Some(&ada),
            Some(json!({"value": "sk-ada-0123"})),
        )
        .await;
    assert_eq!(status, 200);
    // Bob's secret of the same name is his, and never used for ada's run.
    let (status, _) = s
        .call(
            Method::PUT,
            "/v1/secrets/hosted-key",
            Some(&bob),
            Some(json!({"value": "sk-bob-0123"})),
        )
        .await;
    assert_eq!(status, 200);
    let workflow = format!(
        "name: hosted\nagents:\n  hosted: {{ endpoint: {{ url: \"{url}\", model: m, api_key_secret: hosted-key }} }}\nsteps: []\n"
    );
    let (status, run) = s
        .call(
            Method::POST,
            "/v1/runs",
            Some(&ada),
            Some(json!({ "workflow": workflow })),
        )
        .await;
    assert_eq!(status, 202, "{run}");
    let run = run["id"].as_str().unwrap().to_owned();
    let (status, session) = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(&ada),
            Some(json!({"agent": "hosted", "run": run})),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let messages = format!("/v1/sessions/{}/messages", session["id"].as_str().unwrap());

    let (status, reply) = s
        .call(Method::POST, &messages, Some(&ada), Some(json!({"content": "hi"})))
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["message"]["content"], "hosted");
    assert_eq!(hosted.authorizations(), [Some("Bearer sk-ada-0123".to_owned())]);

    // Removed: the next turn is refused with the fix, and nothing is sent.
    let (status, _) = s.call(Method::DELETE, "/v1/secrets/hosted-key", Some(&ada), None).await;
    assert_eq!(status, 200);
    let (status, refused) = s
        .call(Method::POST, &messages, Some(&ada), Some(json!({"content": "again"})))
        .await;
    assert_eq!(status, 400, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("secret `hosted-key` is not set for user ada; help: `skein secret set hosted-key`"),
        "{refused}"
    );
    assert_eq!(hosted.requests().len(), 1);
    let listed: Value = s.get("/v1/secrets").await;
    assert!(!listed.to_string().contains("sk-"), "{listed}");
}
