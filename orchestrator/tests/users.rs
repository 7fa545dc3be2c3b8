//! Users and tokens over REST: who may do what, and what another user's ids look like.

mod common;

use common::{API, quick, setup};
use reqwest::Method;
use serde_json::json;

const WORKFLOW: &str =
    "name: w\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\nsteps:\n  - { id: s, agent: a, prompt: hi }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_see_only_their_own_runs_and_only_the_admin_manages_tokens() {
    let s = setup(quick(), None).await;
    let ada = s.token_for("ada").await;
    let bob = s.token_for("bob").await;

    // No agent joined: the run waits in the queue, which is all this test needs.
    let (status, run) = s
        .call(
            Method::POST,
            "/v1/runs",
            Some(&ada),
            Some(json!({"workflow": WORKFLOW})),
        )
        .await;
    assert_eq!(status, 202, "{run}");
    assert_eq!(run["owner"], "ada");
    let id = run["id"].as_str().unwrap();

    let (status, runs) = s.call(Method::GET, "/v1/runs", Some(&bob), None).await;
    assert_eq!((status, runs["data"].as_array().unwrap().len()), (200, 0));
    for (method, path) in [
        (Method::GET, format!("/v1/runs/{id}")),
        (Method::POST, format!("/v1/runs/{id}/cancel")),
        (Method::GET, format!("/v1/runs/{id}/events")),
    ] {
        let (status, body) = s.call(method, &path, Some(&bob), None).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["error"]["code"], "not_found");
    }
    let (status, runs) = s.call(Method::GET, "/v1/runs", Some(&ada), None).await;
    assert_eq!((status, runs["data"].as_array().unwrap().len()), (200, 1));
    let (status, runs) = s.call(Method::GET, "/v1/runs", Some(API), None).await;
    assert_eq!(
        (status, runs["data"].as_array().unwrap().len()),
        (200, 1),
        "the admin sees all"
    );

    // Missing, wrong and revoked tokens: 401 with a message that says what to do.
    let (status, body) = s.call(Method::GET, "/v1/runs", None, None).await;
    assert_eq!(status, 401);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer")
    );
    let (status, _) = s.call(Method::GET, "/v1/runs", Some("not-a-token"), None).await;
    assert_eq!(status, 401);

    // Tokens are the admin's business.
    let (status, body) = s
        .call(Method::POST, "/v1/tokens", Some(&bob), Some(json!({"user": "eve"})))
        .await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
    let (status, body) = s
        .call(
            Method::POST,
            "/v1/tokens",
            Some(API),
            Some(json!({"user": "Not A Name"})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (_, tokens) = s.call(Method::GET, "/v1/tokens", Some(API), None).await;
    assert!(tokens["next"].is_null(), "{tokens}");
    let tokens = tokens["data"].as_array().unwrap();
    assert_eq!(tokens.len(), 3);
    assert!(
        !tokens.iter().any(|t| t.to_string().contains(&ada)),
        "tokens are never listed"
    );
    let ada_id = tokens.iter().find(|t| t["user"] == "ada").unwrap()["id"]
        .as_str()
        .unwrap();
    let (status, _) = s
        .call(Method::DELETE, &format!("/v1/tokens/{ada_id}"), Some(API), None)
        .await;
    assert_eq!(status, 200);
    let (status, _) = s.call(Method::GET, "/v1/runs", Some(&ada), None).await;
    assert_eq!(status, 401, "a revoked token stops working at once");
}

/// Runs list newest first, a page at a time: `next` is the `after=` of the next page,
/// null on the last; pages never repeat or skip a run, and skip other users' runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_a_page_at_a_time() {
    let s = setup(quick(), None).await;
    let ada = s.token_for("ada").await;
    let bob = s.token_for("bob").await;
    let mut submitted = Vec::new();
    for (i, token) in [&ada, &bob, &ada, &ada, &bob, &ada, &ada].into_iter().enumerate() {
        let (status, run) = s
            .call(
                Method::POST,
                "/v1/runs",
                Some(token),
                Some(json!({"workflow": WORKFLOW})),
            )
            .await;
        assert_eq!(status, 202, "run {i}: {run}");
        if token == &ada {
            submitted.push(run["id"].as_str().unwrap().to_owned());
        }
    }
    submitted.reverse();
    let mut seen = Vec::new();
    let mut path = "/v1/runs?limit=2".to_owned();
    loop {
        let (status, page) = s.call(Method::GET, &path, Some(&ada), None).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap();
        assert!(data.len() <= 2, "{page}");
        seen.extend(data.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        match page["next"].as_str() {
            Some(next) => path = format!("/v1/runs?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, submitted, "ada's five runs, newest first, each once");

    let (status, body) = s.call(Method::GET, "/v1/runs?limit=many", Some(&ada), None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
}

/// POSTs `body` as `token` with `Idempotency-Key: key`: the status, whether the answer
/// says it was replayed, and the body.
async fn keyed(
    s: &common::Setup,
    path: &str,
    token: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, bool, serde_json::Value) {
    let response = s
        .http
        .post(s.url(path))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    (status, replayed, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_with_the_same_idempotency_key_returns_the_first_and_never_makes_a_second() {
    let s = setup(quick(), None).await;
    let ada = s.token_for("ada").await;
    let bob = s.token_for("bob").await;

    // Runs: the retry answers the first run; another body with the key is refused.
    let run = json!({"workflow": WORKFLOW});
    let (status, replayed, first) = keyed(&s, "/v1/runs", &ada, "k-1", &run).await;
    assert_eq!((status, replayed), (202, false), "{first}");
    let (status, replayed, again) = keyed(&s, "/v1/runs", &ada, "k-1", &run).await;
    assert_eq!((status, replayed), (202, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    let other = json!({"workflow": WORKFLOW.replace("prompt: hi", "prompt: bye")});
    let (status, _, refused) = keyed(&s, "/v1/runs", &ada, "k-1", &other).await;
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("different request"),
        "{refused}"
    );
    // Keys are per user: bob's k-1 is his own.
    let (status, replayed, bobs) = keyed(&s, "/v1/runs", &bob, "k-1", &run).await;
    assert_eq!((status, replayed), (202, false), "{bobs}");
    assert_ne!(bobs["id"], first["id"]);
    let runs = s.get("/v1/runs").await;
    assert_eq!(runs["data"].as_array().unwrap().len(), 2, "{runs:#}");
    let (status, _, bad) = keyed(&s, "/v1/runs", &ada, "has space", &run).await;
    assert_eq!(status, 400, "{bad}");

    // Sessions: 201 once, then 200 with the same session.
    let session = json!({"model": "Qwen/Qwen2.5-0.5B-Instruct"});
    let (status, replayed, first) = keyed(&s, "/v1/sessions", &ada, "s-1", &session).await;
    assert_eq!((status, replayed), (201, false), "{first}");
    let (status, replayed, again) = keyed(&s, "/v1/sessions", &ada, "s-1", &session).await;
    assert_eq!((status, replayed), (200, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    let other = json!({"model": "Qwen/Qwen2.5-1.5B-Instruct"});
    let (status, _, refused) = keyed(&s, "/v1/sessions", &ada, "s-1", &other).await;
    assert_eq!(status, 409, "{refused}");
    let sessions = s.get("/v1/sessions").await;
    assert_eq!(sessions["data"].as_array().unwrap().len(), 1, "{sessions:#}");

    // Tokens: a retry cannot make a second token, nor show the first one's secret again.
    let token = json!({"user": "cy"});
    let (status, _, made) = keyed(&s, "/v1/tokens", API, "t-1", &token).await;
    assert_eq!(status, 201, "{made}");
    let (status, _, refused) = keyed(&s, "/v1/tokens", API, "t-1", &token).await;
    assert_eq!(status, 409, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains(made["id"].as_str().unwrap()), "{message}");
    assert!(!message.contains(made["token"].as_str().unwrap()), "{message}");
    let tokens = s.get("/v1/tokens").await;
    let cys = tokens["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["user"] == "cy")
        .count();
    assert_eq!(cys, 1, "{tokens:#}");
}

/// An instance's engine log can hold the prompts of everyone it served: the admin reads
/// any; a user only that of an instance that served their requests alone (another user
/// gets 403, an unknown instance is 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_logs_are_for_the_admin_and_the_one_user_whose_prompts_they_hold() {
    use skein_testkit::agent::{EngineBehaviour, TestAgent};

    let s = setup(quick(), None).await;
    let _agent = TestAgent::join(
        s.server.grpc_addr,
        common::TOKEN,
        "node-a",
        1,
        EngineBehaviour::default(),
    )
    .await;
    s.wait_nodes(1).await;
    let alice = s.token_for("alice").await;
    let bob = s.token_for("bob").await;
    let run_of = |token: String| {
        let s = &s;
        async move {
            let (status, run) = s
                .call(
                    Method::POST,
                    "/v1/runs",
                    Some(&token),
                    Some(json!({"workflow": WORKFLOW})),
                )
                .await;
            assert_eq!(status, 202, "{run}");
            let id = run["id"].as_str().unwrap().to_owned();
            let run = s
                .wait_run(&id, |r| r["state"] == "succeeded" || r["state"] == "failed")
                .await;
            assert_eq!(run["state"], "succeeded", "{run:#}");
            run["steps"][0]["instance"].as_str().unwrap().to_owned()
        }
    };
    let instance = run_of(alice.clone()).await;
    let logs = format!("/v1/instances/{instance}/logs?tail=5");

    let (status, body) = s.call(Method::GET, &logs, Some(&bob), None).await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.to_string().contains("log of"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("an admin can read them"),
        "{body}"
    );
    for token in [alice.as_str(), API] {
        let (status, body) = s.call(Method::GET, &logs, Some(token), None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["lines"], json!([format!("log of {instance}")]));
    }
    let (status, _) = s
        .call(Method::GET, "/v1/instances/nothing/logs", Some(&bob), None)
        .await;
    assert_eq!(status, 404);

    // Bob's run of the same workflow takes the warm instance: its log may now hold both
    // users' prompts, and it is the admin's alone.
    assert_eq!(run_of(bob.clone()).await, instance, "the warm instance served bob too");
    for token in [alice.as_str(), bob.as_str()] {
        let (status, body) = s.call(Method::GET, &logs, Some(token), None).await;
        assert_eq!(status, 403, "{body}");
    }
    let (status, _) = s.call(Method::GET, &logs, Some(API), None).await;
    assert_eq!(status, 200);
}
