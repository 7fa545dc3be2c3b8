//! Groups, quotas and fair share in a real server (REST and gRPC on loopback, sled in a
//! temporary directory), with test agents at the edge: limits refuse with 429 naming
//! the limit, the use and when it frees; no interleaving of submissions passes a limit;
//! GPU limits hold runs in the queue with the reason; everything survives a restart.

mod common;

use common::{API, TOKEN, quick, setup};
use reqwest::Method;
use serde_json::{Value, json};
use skein_testkit::agent::{EngineBehaviour, TestAgent};

const SEVEN_B: &str =
    "name: w\nagents:\n  a: { model: Qwen/Qwen2.5-7B-Instruct }\nsteps:\n  - { id: s, agent: a, prompt: hi }\n";

const ONE_AGENT: &str =
    "name: w\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\nsteps:\n  - { id: s, agent: a, prompt: hi }\n";

/// `POST /v1/runs` of `workflow` as the owner of `token`.
async fn submit(s: &common::Setup, token: &str, workflow: &str) -> (u16, Value) {
    s.call(
        Method::POST,
        "/v1/runs",
        Some(token),
        Some(json!({ "workflow": workflow })),
    )
    .await
}

fn message(body: &Value) -> &str {
    body["error"]["message"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_limit_refuses_with_429_naming_it_and_frees_when_a_run_ends() {
    let s = setup(quick(), None).await;
    let ada = s.token_for("ada").await;
    let (status, group) = s
        .call(
            Method::PUT,
            "/v1/groups/nlp",
            Some(API),
            Some(json!({"shares": 2, "limits": {"runs": 3}})),
        )
        .await;
    assert_eq!(status, 200, "{group}");
    assert_eq!(
        (group["shares"].clone(), group["limits"]["runs"].clone()),
        (json!(2), json!(3))
    );
    let (status, user) = s
        .call(
            Method::PUT,
            "/v1/users/ada",
            Some(API),
            Some(json!({"group": "nlp", "limits": {"runs": 2}})),
        )
        .await;
    assert_eq!(status, 200, "{user}");
    // Only the admin changes groups.
    let (status, _) = s
        .call(Method::PUT, "/v1/groups/nlp", Some(&ada), Some(json!({"shares": 100})))
        .await;
    assert_eq!(status, 403);

    // No agent joined: runs wait in the queue, and count as in progress.
    let submit = |token: String| {
        let s = &s;
        async move { submit(s, &token, ONE_AGENT).await }
    };
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, run) = submit(ada.clone()).await;
        assert_eq!(status, 202, "{run}");
        ids.push(run["id"].as_str().unwrap().to_owned());
    }
    let (status, refused) = submit(ada.clone()).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "quota_exceeded");
    assert_eq!(
        message(&refused),
        "user `ada` may use 2 runs in progress (queued or running) at once: 2 runs in use, and this needs 1 run more; it frees when one of those runs ends (`skein runs` lists them); help: an admin can raise it with `skein quota set --user ada --runs N`"
    );
    let (status, quota) = s.call(Method::GET, "/v1/quota", Some(&ada), None).await;
    assert_eq!(status, 200, "{quota}");
    assert_eq!(
        (quota["group"].clone(), quota["mine"]["runs"].clone()),
        (json!("nlp"), json!(2))
    );
    // Another user's quota is the admin's to see.
    let (status, _) = s.call(Method::GET, "/v1/quota?user=bob", Some(&ada), None).await;
    assert_eq!(status, 403);

    // A run ending frees its place.
    let (status, _) = s
        .call(Method::POST, &format!("/v1/runs/{}/cancel", ids[0]), Some(&ada), None)
        .await;
    assert_eq!(status, 200);
    let (status, run) = submit(ada.clone()).await;
    assert_eq!(status, 202, "{run}");

    // The group's limit counts every member: bob (in nlp) may start one more, not two.
    let bob = s.token_for("bob").await;
    let (status, _) = s
        .call(Method::PUT, "/v1/users/bob", Some(API), Some(json!({"group": "nlp"})))
        .await;
    assert_eq!(status, 200);
    let (status, run) = submit(bob.clone()).await;
    assert_eq!(status, 202, "{run}");
    let (status, refused) = submit(bob.clone()).await;
    assert_eq!(status, 429, "{refused}");
    assert!(message(&refused).starts_with("group `nlp` may use 3 runs"), "{refused}");

    // Bad changes say what is wrong.
    for (path, body, expected) in [
        (
            "/v1/groups/nlp",
            json!({"limits": {"gpus": 0}}),
            "`gpus` must be at least 1",
        ),
        ("/v1/groups/nlp", json!({"shares": 0}), "shares must be 1 to"),
        ("/v1/groups/Bad Name", json!({}), "group name `Bad Name` is not allowed"),
        ("/v1/users/cy", json!({"group": "nope"}), "no group `nope`"),
        (
            "/v1/groups/nlp",
            json!({"limits": {"gpu_gb": 1}}),
            "unknown field `gpu_gb`",
        ),
        ("/v1/groups/nlp", json!([null, null]), "send a JSON object"),
        ("/v1/users/ada", json!([null]), "send a JSON object"),
    ] {
        let (status, body) = s.call(Method::PUT, path, Some(API), Some(body)).await;
        assert!(matches!(status, 400 | 404), "{path}: {status} {body}");
        assert!(message(&body).contains(expected), "{path}: {body}");
    }
    let (status, body) = s.call(Method::DELETE, "/v1/groups/nlp", Some(API), None).await;
    assert_eq!(status, 409, "{body}");
    assert!(message(&body).contains("ada, bob"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_interleaving_of_submissions_passes_a_user_or_group_limit() {
    let s = setup(quick(), None).await;
    for (path, body) in [
        ("/v1/groups/vision", json!({"limits": {"runs": 5}})),
        ("/v1/users/ada", json!({"group": "vision", "limits": {"runs": 3}})),
        ("/v1/users/bob", json!({"group": "vision"})),
    ] {
        let (status, body) = s.call(Method::PUT, path, Some(API), Some(body)).await;
        assert_eq!(status, 200, "{body}");
    }
    let ada = s.token_for("ada").await;
    let bob = s.token_for("bob").await;
    // 24 submissions each, all at once.
    let submissions = (0..48).map(|i| {
        let token = if i % 2 == 0 { ada.clone() } else { bob.clone() };
        let s = &s;
        async move {
            loop {
                let (status, body) = submit(s, &token, ONE_AGENT).await;
                // A user's workflows are read a few at a time: those turned away for that
                // are sent again, still overlapping the others.
                if body["error"]["code"] != "overloaded" {
                    break (i % 2 == 0, status, body);
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    });
    let answers = futures::future::join_all(submissions).await;
    let accepted = |ada_only: bool| {
        answers
            .iter()
            .filter(|(is_ada, status, _)| *status == 202 && (!ada_only || *is_ada))
            .count()
    };
    for (_, status, body) in &answers {
        assert!(matches!(status, 202 | 429), "{status}: {body}");
        if *status == 429 {
            assert_eq!(body["error"]["code"], "quota_exceeded", "{body}");
        }
    }
    assert!(accepted(true) <= 3, "ada passed her limit of 3: {}", accepted(true));
    assert_eq!(accepted(false), 5, "the group's limit of 5, filled exactly");
    let runs = s.get("/v1/runs?limit=100").await;
    assert_eq!(
        runs["data"].as_array().unwrap().len(),
        5,
        "only accepted runs are stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_beyond_a_gpu_limit_waits_with_the_reason_and_starts_once_there_is_room() {
    let s = setup(quick(), None).await;
    // Slow answers: the first run holds its GPU while the second is admitted.
    let engines = EngineBehaviour {
        delay: std::time::Duration::from_secs(2),
        ..EngineBehaviour::default()
    };
    let _agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 2, engines).await;
    s.wait_nodes(1).await;
    for (path, body) in [
        ("/v1/groups/nlp", json!({"limits": {"gpus": 1, "gpu_gib": 1.0}})),
        ("/v1/users/ada", json!({"group": "nlp"})),
    ] {
        let (status, body) = s.call(Method::PUT, path, Some(API), Some(body)).await;
        assert_eq!(status, 200, "{body}");
    }
    let ada = s.token_for("ada").await;
    let submit = || async {
        let (status, run) = submit(&s, &ada, SEVEN_B).await;
        assert_eq!(status, 202, "{run}");
        run["id"].as_str().unwrap().to_owned()
    };
    let over =
        |prefix: &'static str| move |r: &Value| r["reason"].as_str().is_some_and(|reason| reason.starts_with(prefix));
    // The fleet has room (a 7B model on a 24 GiB GPU); the group may reserve 1 GiB.
    let first = submit().await;
    let waiting = s
        .wait_run(
            &first,
            over("over a quota: group `nlp` may use 1.0 GiB of GPU memory at once: 0.0 GiB in use, and this needs"),
        )
        .await;
    assert_eq!(waiting["state"], "queued", "{waiting:#}");
    assert!(
        waiting["reason"]
            .as_str()
            .unwrap()
            .ends_with("it frees as their running runs end (`skein runs`); the run waits until then; help: an admin can raise it with `skein quota set --group nlp --gpu-gib N`"),
        "{waiting:#}"
    );
    // Lifted: the run starts on one GPU, the group's one.
    let (status, _) = s
        .call(
            Method::PUT,
            "/v1/groups/nlp",
            Some(API),
            Some(json!({"clear": ["gpu_gib"]})),
        )
        .await;
    assert_eq!(status, 200);
    s.wait_run(&first, |r| r["state"] == "running").await;
    let (_, quota) = s.call(Method::GET, "/v1/quota", Some(&ada), None).await;
    assert_eq!(quota["ours"]["gpus"], 1, "{quota}");
    // A second run needs the other GPU (the first one's is nearly full): it waits...
    let second = submit().await;
    let waiting = s
        .wait_run(
            &second,
            over("over a quota: group `nlp` may use 1 GPU at once: 1 GPU in use, and this needs 1 GPU more"),
        )
        .await;
    assert_eq!(waiting["state"], "queued");
    // ...until the first ends, and its instance (warm, held by nobody) serves the second.
    let done = |r: &Value| matches!(r["state"].as_str(), Some("succeeded" | "failed" | "cancelled"));
    assert_eq!(s.wait_run(&first, done).await["state"], "succeeded");
    let run = s.wait_run(&second, done).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_members_and_runs_in_progress_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("db");
    let ada_token;
    {
        let s = setup(quick(), Some(&db)).await;
        for (path, body) in [
            ("/v1/groups/nlp", json!({"shares": 3, "limits": {"runs": 1}})),
            ("/v1/users/ada", json!({"group": "nlp", "shares": 2})),
        ] {
            let (status, body) = s.call(Method::PUT, path, Some(API), Some(body)).await;
            assert_eq!(status, 200, "{body}");
        }
        ada_token = s.token_for("ada").await;
        let (status, run) = submit(&s, &ada_token, ONE_AGENT).await;
        assert_eq!(status, 202, "{run}");
        s.server.shutdown().await.unwrap();
    }
    let s = setup(quick(), Some(&db)).await;
    let (status, groups) = s.call(Method::GET, "/v1/groups", Some(&ada_token), None).await;
    assert_eq!(status, 200);
    let nlp = groups.as_array().unwrap().iter().find(|g| g["name"] == "nlp").unwrap();
    assert_eq!(
        (nlp["shares"].clone(), nlp["members"].clone()),
        (json!(3), json!(["ada"]))
    );
    assert_eq!(nlp["holding"]["runs"], 1, "the queued run resumed, in progress");
    // Still in progress after the restart: the group's one place is taken.
    let (status, refused) = submit(&s, &ada_token, ONE_AGENT).await;
    assert_eq!(status, 429, "{refused}");
    let (status, users) = s.call(Method::GET, "/v1/users", Some(API), None).await;
    assert_eq!(status, 200);
    assert_eq!(users[0]["shares"], 2);
}

/// The sessions limit: 16 creates of one user at once against a limit of 3 make exactly
/// 3, the rest answer 429 naming the limit; an idempotent retry makes none; a delete
/// frees a place; a restart counts what is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_interleaving_of_session_creates_passes_a_sessions_limit_and_a_restart_counts_them() {
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("db");
    let ada;
    let made: Vec<String>;
    {
        let s = setup(quick(), Some(&db)).await;
        let (status, body) = s
            .call(
                Method::PUT,
                "/v1/users/ada",
                Some(API),
                Some(json!({"limits": {"sessions": 3}})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        ada = s.token_for("ada").await;
        let create = || {
            s.call(
                Method::POST,
                "/v1/sessions",
                Some(&ada),
                Some(json!({"model": "Qwen/Qwen2.5-0.5B-Instruct"})),
            )
        };
        let outcomes = futures::future::join_all((0..16).map(|_| create())).await;
        let created: Vec<&Value> = outcomes.iter().filter(|(s, _)| *s == 201).map(|(_, b)| b).collect();
        let refused: Vec<&Value> = outcomes.iter().filter(|(s, _)| *s == 429).map(|(_, b)| b).collect();
        assert_eq!((created.len(), refused.len()), (3, 13), "{outcomes:?}");
        assert_eq!(refused[0]["error"]["code"], "quota_exceeded", "{}", refused[0]);
        assert!(
            message(refused[0]).starts_with("user `ada` may use 3 sessions at once (made and not deleted): 3 sessions in use, and this needs 1 session more"),
            "{}",
            refused[0]
        );
        made = created.iter().map(|b| b["id"].as_str().unwrap().to_owned()).collect();
        let (_, quota) = s.call(Method::GET, "/v1/quota", Some(&ada), None).await;
        assert_eq!(quota["mine"]["sessions"], 3, "{quota}");
        // A delete frees one place; an idempotent retry of the create that took it
        // makes nothing more.
        let (status, _) = s
            .call(Method::DELETE, &format!("/v1/sessions/{}", made[0]), Some(&ada), None)
            .await;
        assert!(status == 200 || status == 204, "{status}");
        let keyed = || async {
            s.http
                .post(s.url("/v1/sessions"))
                .bearer_auth(&ada)
                .header("Idempotency-Key", "one")
                .json(&json!({"model": "Qwen/Qwen2.5-0.5B-Instruct"}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        };
        let first = keyed().await;
        let again = keyed().await;
        assert_eq!((first, again), (201, 200));
        let (status, _) = create().await;
        assert_eq!(status, 429, "three again");
        s.server.shutdown().await.unwrap();
    }
    // After a restart the three stored sessions still count.
    let s = setup(quick(), Some(&db)).await;
    let (_, quota) = s.call(Method::GET, "/v1/quota", Some(&ada), None).await;
    assert_eq!(quota["mine"]["sessions"], 3, "{quota}");
    let (status, _) = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(&ada),
            Some(json!({"model": "Qwen/Qwen2.5-0.5B-Instruct"})),
        )
        .await;
    assert_eq!(status, 429);
}
