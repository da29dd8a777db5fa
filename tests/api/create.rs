use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::helpers::{ALICE, BOB, TestApp, assert_problem, intent, json_with_status, summarize};

/// Breakpoint 1: N simultaneous POSTs with one key → one job, one 201, the same id everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_double_click_storm_makes_one_job() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    let mut tasks = JoinSet::new();
    for _ in 0..40 {
        let app = app.clone();
        tasks.spawn(async move {
            let response = app
                .create(ALICE, "checkout-42", &summarize("one intent"))
                .await;
            let status = response.status();
            let replayed = response.headers().get("idempotent-replayed").cloned();
            let location = response.headers().get("location").cloned();
            let body: Value = response.json().await.unwrap();
            (status, replayed, location, body)
        });
    }
    let answers = tasks.join_all().await;
    let created: Vec<_> = answers
        .iter()
        .filter(|a| a.0 == StatusCode::CREATED)
        .collect();
    assert_eq!(created.len(), 1);
    let id = created[0].3["id"].as_str().unwrap().to_owned();
    assert_eq!(created[0].2.as_ref().unwrap(), &format!("/v1/jobs/{id}"));
    assert!(created[0].1.is_none());
    for (status, replayed, _, body) in &answers {
        assert_eq!(body["id"], id);
        if *status != StatusCode::CREATED {
            assert_eq!(*status, StatusCode::OK);
            assert_eq!(replayed.as_ref().unwrap(), "true");
        }
    }
    assert_eq!(app.row_counts().await, (1, 1));
}

#[tokio::test]
async fn a_new_job_is_queued_on_its_first_provider() {
    let app = TestApp::spawn().await;
    let job = json_with_status(app.create(ALICE, "k", &summarize("hello")).await, 201).await;
    assert_eq!(job["status"], "queued");
    assert_eq!(job["contract"], "summarize@1");
    assert_eq!(job["idempotency_key"], "k");
    assert_eq!(job["providers"], json!(["demo", "demo-backup"]));
    assert_eq!(job["version"], 0);
    assert_eq!(job["completed_by"], Value::Null);
    let attempts = job["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["number"], 1);
    assert_eq!(attempts[0]["provider"], "demo");
    assert_eq!(attempts[0]["state"], "queued");
    let created_at = job["created_at"].as_str().unwrap();
    assert!(chrono::DateTime::parse_from_rfc3339(created_at).is_ok());
    assert!(created_at.ends_with('Z'), "{created_at}");
}

/// Breakpoint 2: same key, different input → 409 naming the job; the job is unchanged.
#[tokio::test]
async fn the_same_key_with_another_input_is_a_conflict_that_changes_nothing() {
    let app = TestApp::spawn().await;
    let job = json_with_status(app.create(ALICE, "k", &summarize("first")).await, 201).await;
    let id = job["id"].as_str().unwrap();

    let problem = assert_problem(
        app.create(ALICE, "k", &summarize("second")).await,
        409,
        "idempotency_key_reused",
    )
    .await;
    assert_eq!(problem["job_id"], id);
    let other_chain = json!({"contract": "summarize@1", "input": {"text": "first"}, "providers": ["demo-backup"]});
    assert_problem(
        app.create(ALICE, "k", &other_chain).await,
        409,
        "idempotency_key_reused",
    )
    .await;

    let now = json_with_status(app.get_job(ALICE, id).await, 200).await;
    assert_eq!(intent(&now), intent(&job));
    assert_eq!(
        (&now["version"], &now["result"]),
        (&job["version"], &job["result"])
    );
    assert_eq!(app.row_counts().await, (1, 1));
}

#[tokio::test]
async fn the_same_intent_spelt_differently_is_a_replay() {
    let app = TestApp::spawn().await;
    let first = r#"{"contract": "classify@1", "input": {"text": "charged twice", "labels": ["billing", "praise"], "max_labels": 1}}"#;
    let respelt = r#"{ "input" : { "max_labels" : 1.0, "labels" : ["billing","praise"], "text" : "charged twice" },
                       "contract" : "classify@1" }"#;
    let headers: &[(&str, &[u8])] = &[
        ("authorization", b"Bearer token-alice"),
        ("idempotency-key", b"classify-1"),
        ("content-type", b"application/json"),
    ];
    let created = json_with_status(app.create_raw(headers, first).await, 201).await;
    let response = app.create_raw(headers, respelt).await;
    assert_eq!(response.headers()["idempotent-replayed"], "true");
    let replayed = json_with_status(response, 200).await;
    assert_eq!(replayed["id"], created["id"]);
    assert_eq!(replayed["fingerprint"], created["fingerprint"]);
    assert_eq!(app.row_counts().await, (1, 1));
}

/// A replay answers with the job as it is now, not as it was created.
#[tokio::test]
async fn a_replay_shows_the_job_as_it_is_now() {
    let app = TestApp::spawn().await;
    let job = json_with_status(app.create(ALICE, "k", &summarize("x")).await, 201).await;
    json_with_status(
        app.cancel_job(ALICE, job["id"].as_str().unwrap()).await,
        200,
    )
    .await;
    let replay = json_with_status(app.create(ALICE, "k", &summarize("x")).await, 200).await;
    assert_eq!(replay["status"], "cancelled");
    assert_eq!(replay["version"], 1);
}

#[tokio::test]
async fn an_explicit_provider_chain_is_kept() {
    let app = TestApp::spawn().await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}, "providers": ["demo-backup", "demo"]});
    let job = json_with_status(app.create(ALICE, "k", &body).await, 201).await;
    assert_eq!(job["providers"], json!(["demo-backup", "demo"]));
    assert_eq!(job["attempts"][0]["provider"], "demo-backup");
}

/// Invariant 10: another owner's job answers 404, and its key is free for the other owner.
#[tokio::test]
async fn owners_do_not_see_each_others_jobs_and_keys() {
    let app = TestApp::spawn().await;
    let alice_job = json_with_status(
        app.create(ALICE, "shared-key", &summarize("alice's")).await,
        201,
    )
    .await;
    let alice_id = alice_job["id"].as_str().unwrap();

    assert_problem(app.get_job(BOB, alice_id).await, 404, "job_not_found").await;
    assert_problem(app.cancel_job(BOB, alice_id).await, 404, "job_not_found").await;
    let bob_list = json_with_status(app.list_jobs(BOB, "").await, 200).await;
    assert_eq!(bob_list["jobs"], json!([]));

    let bob_job = json_with_status(
        app.create(BOB, "shared-key", &summarize("bob's")).await,
        201,
    )
    .await;
    assert_ne!(bob_job["id"], alice_job["id"]);
    let alice_now = json_with_status(app.get_job(ALICE, alice_id).await, 200).await;
    assert_eq!(intent(&alice_now), intent(&alice_job));
    assert_eq!(app.row_counts().await, (2, 2));
}
