//! The OpenAPI document is made from the routes' code: its shape is pinned here, so a
//! change of the API shows in review, and it is checked for what clients rely on.

mod common;

use common::{API, quick, setup};
use reqwest::Method;
use serde_json::Value;

fn document() -> Value {
    serde_json::to_value(skein_orchestrator::api::openapi()).expect("the document serializes")
}

#[test]
fn the_document_is_openapi_3_1_with_every_route() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths: Vec<&str> = doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
    insta::assert_yaml_snapshot!("paths", paths);
}

#[test]
fn the_document_is_pinned() {
    // Keys sorted, so the snapshot is the same whether or not another crate of the build
    // turns on serde_json's `preserve_order` (the built-in engine's llguidance does).
    insta::assert_json_snapshot!("openapi", sorted(document()));
}

/// `value` with every object's keys in sorted order.
fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let entries: std::collections::BTreeMap<String, serde_json::Value> =
                map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            serde_json::Value::Object(entries.into_iter().collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[test]
fn every_operation_has_its_own_id_and_says_how_it_fails() {
    let doc = document();
    let mut seen = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no id"));
            assert!(
                seen.insert(id.to_owned()),
                "{method} {path}: operationId `{id}` is taken"
            );
            let responses = operation["responses"].as_object().unwrap();
            assert!(responses.contains_key("500"), "{method} {path} does not document 500");
            let public = ["/healthz", "/v1/openapi.json"].contains(&path.as_str());
            assert_eq!(
                responses.contains_key("401"),
                !public,
                "{method} {path}: 401 iff it needs a token"
            );
        }
    }
}

/// The server serves the same document to anyone, and every error it makes, even
/// outside the handlers (a bad query, an oversized body, a wrong method), is JSON in the
/// documented shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_serves_the_document_and_answers_errors_in_its_shape() {
    let s = setup(quick(), None).await;
    let served = s.http.get(s.url("/v1/openapi.json")).send().await.unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.json::<Value>().await.unwrap(), document());

    let wrong_method = s.http.delete(s.url("/v1/nodes")).bearer_auth(API).send().await.unwrap();
    assert_eq!(wrong_method.status(), 405);
    let body: Value = wrong_method.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    let (status, body) = s.call(Method::GET, "/v1/sessions?limit=-3", Some(API), None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    assert!(body["error"]["message"].as_str().unwrap().contains("limit"), "{body}");
    let oversized = "x".repeat(skein_orchestrator::api::MAX_BODY_BYTES + 1);
    let response = s
        .http
        .post(s.url("/v1/runs"))
        .bearer_auth(API)
        .header("content-type", "application/json")
        .body(oversized)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_large", "{body}");
}
