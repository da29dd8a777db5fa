//! Every caller-driven write is one intent (invariant 17): a manual attempt and the cancels sent again under one
//! `Idempotency-Key` act once and answer the same; a job is found by its key alone; a quoted key is the bare key.
//! And what one owner may see of the shared providers.

use std::sync::Arc;

use onejob::domain::ProviderName;
use onejob::providers::{DemoBehavior, ProviderConfig};
use serde_json::{Value, json};

use crate::helpers::{ALICE, BOB, TestApp, assert_problem, config, json_with_status};

/// An app with a provider that fails at once (`fast-fail`), one that answers (`demo`) and one that hangs.
async fn app() -> TestApp {
    let mut config = config();
    for (name, behavior) in [
        ("fast-fail", DemoBehavior::Fail),
        ("demo", DemoBehavior::Answer),
        ("hangs", DemoBehavior::Hang),
    ] {
        config.providers.insert(
            ProviderName::parse(name).unwrap(),
            ProviderConfig::demo(behavior, 0),
        );
    }
    TestApp::spawn_with(config).await
}

async fn keyed_post(
    app: &TestApp,
    path: &str,
    key: &str,
    body: Option<&Value>,
) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url(path))
        .bearer_auth(ALICE)
        .header("Idempotency-Key", key);
    if let Some(body) = body {
        request = request.json(body);
    }
    request.send().await.unwrap()
}

/// A job of Alice's on `providers`, once it failed.
async fn failed_job(app: &TestApp, key: &str, providers: &[&str]) -> String {
    let body =
        json!({"contract": "summarize@1", "input": {"text": "Retry me."}, "providers": providers});
    let job = json_with_status(app.create(ALICE, key, &body).await, 201).await;
    let id = job["id"].as_str().unwrap().to_owned();
    app.wait_until(ALICE, &id, |j| j["status"] == "failed")
        .await;
    id
}

/// A double-clicked "Retry on demo" after a fast failure: ten clicks at once under one key make one attempt and
/// one 201; the rest answer 200 replayed with that attempt, and so does a click after it succeeded. Another body
/// under the key is 409, naming the job.
#[tokio::test]
async fn a_manual_retry_clicked_again_under_its_key_queues_one_attempt() {
    let app = Arc::new(app().await);
    let id = failed_job(&app, "retry-me", &["fast-fail"]).await;
    let path = format!("/v1/jobs/{id}/attempts");
    let body = json!({"provider": "demo"});
    let clicks: Vec<_> = (0..10)
        .map(|_| {
            let (app, path, body) = (app.clone(), path.clone(), body.clone());
            tokio::spawn(async move {
                let answer = keyed_post(&app, &path, "click-1", Some(&body)).await;
                let replayed = answer.headers().get("idempotent-replayed").cloned();
                (
                    answer.status().as_u16(),
                    replayed,
                    answer.json::<Value>().await.unwrap(),
                )
            })
        })
        .collect();
    let mut created = 0;
    for click in clicks {
        let (status, replayed, attempt) = click.await.unwrap();
        assert_eq!(attempt["number"], 2, "{attempt}");
        match status {
            201 => created += 1,
            200 => assert_eq!(replayed.unwrap(), "true"),
            other => panic!("{other}: {attempt}"),
        }
    }
    assert_eq!(created, 1);
    let done = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(done["attempts"].as_array().unwrap().len(), 2, "{done}");
    let again = keyed_post(&app, &path, "click-1", Some(&body)).await;
    let again = json_with_status(again, 200).await;
    assert_eq!(
        (&again["number"], &again["state"]),
        (&json!(2), &json!("succeeded"))
    );
    let other = keyed_post(&app, &path, "click-1", Some(&json!({"provider": "hangs"}))).await;
    let conflict = assert_problem(other, 409, "idempotency_key_reused").await;
    assert_eq!(conflict["job_id"], id.as_str());
    let unkeyed = app.post(ALICE, &path).await;
    assert_problem(unkeyed, 409, "job_finished").await;
}

/// A cancel of an attempt sent again under its key answers 200 with the job; the key used to cancel another
/// attempt of the job is 409. A job cancel sent twice under its key answers the cancelled job twice.
#[tokio::test]
async fn the_cancels_sent_again_under_their_key_act_once() {
    let app = app().await;
    let body =
        json!({"contract": "summarize@1", "input": {"text": "Hang."}, "providers": ["hangs"]});
    let job = json_with_status(app.create(ALICE, "hangs", &body).await, 201).await;
    let id = job["id"].as_str().unwrap().to_owned();
    app.wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    let stop = format!("/v1/jobs/{id}/attempts/1/cancel");
    let first = json_with_status(keyed_post(&app, &stop, "stop-1", None).await, 200).await;
    assert_eq!(first["attempts"][0]["state"], "cancelled");
    let again = json_with_status(keyed_post(&app, &stop, "\"stop-1\"", None).await, 200).await;
    assert_eq!(again["attempts"].as_array().unwrap().len(), 1);
    let retry = format!("/v1/jobs/{id}/attempts");
    let added = json_with_status(
        keyed_post(
            &app,
            &retry,
            "retry-hang",
            Some(&json!({"provider": "hangs"})),
        )
        .await,
        201,
    )
    .await;
    assert_eq!(added["number"], 2);
    app.wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    let other = keyed_post(
        &app,
        &format!("/v1/jobs/{id}/attempts/2/cancel"),
        "stop-1",
        None,
    )
    .await;
    assert_problem(other, 409, "idempotency_key_reused").await;

    let cancel = format!("/v1/jobs/{id}/cancel");
    for _ in 0..2 {
        let cancelled =
            json_with_status(keyed_post(&app, &cancel, "give-up", None).await, 200).await;
        assert_eq!(cancelled["status"], "cancelled");
    }
}

/// A client that kept its key and lost the rest finds its job by the key alone; another owner's key finds
/// nothing; nothing is created. A quoted key (a Structured Field string, as the draft writes it) is the bare key.
#[tokio::test]
async fn a_job_is_found_by_its_key_alone_and_a_quoted_key_is_the_bare_key() {
    let app = app().await;
    let body = json!({"contract": "summarize@1", "input": {"text": "Find me."}});
    let made = json_with_status(app.create(ALICE, "\"order-42\"", &body).await, 201).await;
    assert_eq!(made["idempotency_key"], "order-42");
    let replay = app.create(ALICE, "order-42", &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json_with_status(replay, 200).await["id"], made["id"]);

    let found =
        json_with_status(app.list_jobs(ALICE, "?idempotency_key=order-42").await, 200).await;
    let jobs = found["jobs"].as_array().unwrap();
    assert_eq!((jobs.len(), &jobs[0]["id"]), (1, &made["id"]));
    for (token, query) in [
        (BOB, "?idempotency_key=order-42"),
        (ALICE, "?idempotency_key=order-43"),
        (ALICE, "?idempotency_key=order-42&status=failed"),
    ] {
        let none = json_with_status(app.list_jobs(token, query).await, 200).await;
        assert_eq!(none["jobs"], json!([]), "{query}");
    }
    let with_cursor = app
        .list_jobs(
            ALICE,
            "?idempotency_key=order-42&cursor=1.job_00000000000000000000000000000000",
        )
        .await;
    assert_problem(with_cursor, 400, "invalid_parameter").await;
    assert_eq!(app.row_counts().await.0, 1);
    for bad in ["\"two words\"", "two words"] {
        let refused = app.create(ALICE, bad, &body).await;
        assert_problem(refused, 400, "invalid_idempotency_key").await;
    }
}

/// Text that is no Structured Field string is a key as it stands (any visible ASCII is, by the design): `"abc`,
/// `"a"b"`. A job made under a quoted key before quoted keys were read as Structured Field strings — its key the
/// literal text, quotes and all — is still found by that key: its create replays, and a lookup finds it.
#[tokio::test]
async fn keys_that_are_no_structured_strings_stand_as_sent_and_a_quoted_keys_earlier_job_is_found()
{
    let app = app().await;
    let body = json!({"contract": "summarize@1", "input": {"text": "Keys."}});
    for key in ["\"abc", "\"a\"b\"", "\"\"", "\"a\";p=1"] {
        let made = json_with_status(app.create(ALICE, key, &body).await, 201).await;
        assert_eq!(made["idempotency_key"], key);
        let replay = app.create(ALICE, key, &body).await;
        assert_eq!(json_with_status(replay, 200).await["id"], made["id"]);
    }
    // As an earlier release made it: the key kept with its quotes.
    let earlier = app
        .engine()
        .intake(onejob::engine::Intake {
            owner: onejob::domain::Owner::parse("alice").unwrap(),
            key: onejob::domain::IdempotencyKey::parse("\"order-7\"").unwrap(),
            contract: "summarize@1".into(),
            input: json!({"text": "Keys."}),
            providers: None,
        })
        .unwrap();
    let earlier = app
        .engine()
        .create_job(earlier)
        .await
        .unwrap()
        .job()
        .clone();
    let replay = app.create(ALICE, "\"order-7\"", &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        json_with_status(replay, 200).await["id"],
        earlier.id.as_str()
    );
    let other = json!({"contract": "summarize@1", "input": {"text": "Another."}});
    let conflict = assert_problem(
        app.create(ALICE, "\"order-7\"", &other).await,
        409,
        "idempotency_key_reused",
    )
    .await;
    assert_eq!(conflict["job_id"], earlier.id.as_str());
    let found = json_with_status(
        app.list_jobs(ALICE, "?idempotency_key=%22order-7%22").await,
        200,
    )
    .await;
    assert_eq!(found["jobs"][0]["id"], earlier.id.as_str());
    assert_eq!(app.row_counts().await.0, 5);
}

/// `GET /v1/providers` is every owner's: it shows the deployment's settings and what qualification on the
/// contract's own samples found, never what other owners' jobs showed (a breaker's counters, production's
/// suspicions and their attempts) nor where a provider is. The operators' token sees all of it.
#[tokio::test]
async fn owners_see_the_providers_standing_and_only_operators_see_what_other_owners_jobs_showed() {
    let app = app().await;
    failed_job(&app, "fails", &["fast-fail"]).await;
    let owners = json_with_status(app.get(ALICE, "/v1/providers").await, 200).await;
    let text = owners.to_string();
    for hidden in [
        "breaker",
        "base_url",
        "suspected",
        "strikes",
        "lost_by",
        "job_",
    ] {
        assert!(!text.contains(hidden), "{hidden} in {owners:#}");
    }
    let fast_fail = owners["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "fast-fail")
        .unwrap();
    assert_eq!(fast_fail["contracts"][0]["standing"], "unqualified");
    let fast_fail = app
        .provider_when("fast-fail", |p| p["breaker"]["recent_failures"] != 0)
        .await;
    assert_eq!(fast_fail["breaker"]["recent_failures"], 1, "{fast_fail}");
    assert_problem(
        app.get("no-such-token", "/v1/providers").await,
        401,
        "unauthorized",
    )
    .await;
}
