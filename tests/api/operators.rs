//! Operators: they see every owner's jobs that need a person and settle them on their owners' behalf, each act
//! recorded on the job with who did it; owners keep seeing only their own, and the operators' view is not theirs.

use chrono::Duration;
use onejob::domain::ProviderName;
use serde_json::{Value, json};

use crate::helpers::{ALICE, BOB, TestApp, assert_problem, config, json_with_status};
use crate::support::stand_in::{Gate, Reply, StandIn, TIMEOUT_MS, openai};

const CAROL: &str = "token-carol";

/// An app with an operator, Carol, and a provider `stuck` (the stand-in) that holds every call.
async fn app(stuck: &StandIn) -> TestApp {
    let mut config = config();
    config.providers.insert(
        ProviderName::parse("stuck").unwrap(),
        openai(stuck.base_url()),
    );
    config.operators.tokens = [(CAROL.to_owned(), "carol".to_owned())].into();
    TestApp::spawn_with(config).await
}

async fn held() -> StandIn {
    StandIn::spawn(vec![], Reply::Held(Gate::new())).await
}

fn stuck_job(text: &str) -> Value {
    json!({"contract": "summarize@1", "input": {"text": text}, "providers": ["stuck"]})
}

/// Creates `owner`'s job under `key`, the stand-in's `n`th call, and waits until its attempt is `unknown`.
async fn unknown_job(app: &TestApp, stuck: &StandIn, n: usize, owner: &str, key: &str) -> String {
    let job = json_with_status(app.create(owner, key, &stuck_job(key)).await, 201).await;
    let id = job["id"].as_str().unwrap().to_owned();
    stuck.received(n).await;
    app.clock.advance(Duration::milliseconds(TIMEOUT_MS as i64));
    app.wait_until(owner, &id, |j| j["status"] == "unknown")
        .await;
    id
}

fn ids(page: &Value) -> Vec<&str> {
    page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn an_operator_sees_every_owners_unknown_jobs_settles_one_and_the_job_says_who() {
    let stuck = held().await;
    let app = app(&stuck).await;
    let alices = unknown_job(&app, &stuck, 1, ALICE, "a").await;
    let bobs = unknown_job(&app, &stuck, 2, BOB, "b").await;

    // Every owner's, the latest first; an owner's credential does not reach the view.
    let page = json_with_status(
        app.get(CAROL, "/v1/operator/jobs?status=unknown").await,
        200,
    )
    .await;
    assert_eq!(ids(&page), [bobs.as_str(), alices.as_str()]);
    assert_problem(app.get(ALICE, "/v1/operator/jobs").await, 403, "forbidden").await;
    assert_problem(
        app.get("nobody", "/v1/operator/jobs").await,
        401,
        "unauthorized",
    )
    .await;
    let paged = json_with_status(app.get(CAROL, "/v1/operator/jobs?limit=1").await, 200).await;
    assert_eq!(ids(&paged), [bobs.as_str()]);
    let cursor = paged["next_cursor"].as_str().unwrap();
    let rest = json_with_status(
        app.get(CAROL, &format!("/v1/operator/jobs?limit=1&cursor={cursor}"))
            .await,
        200,
    )
    .await;
    assert_eq!(ids(&rest), [alices.as_str()]);

    // Carol stops waiting on Alice's attempt, on Alice's behalf: once, under her key.
    let path = format!("/v1/jobs/{alices}/attempts/1/cancel");
    let cancel = || {
        app.client
            .post(app.url(&path))
            .bearer_auth(CAROL)
            .header("idempotency-key", "settle-a")
            .send()
    };
    let settled = json_with_status(cancel().await.unwrap(), 200).await;
    assert_eq!(settled["attempts"][0]["state"], "cancelled");
    let again = json_with_status(cancel().await.unwrap(), 200).await;
    assert_eq!(
        again["interventions"], settled["interventions"],
        "one act, however often sent"
    );
    let acts = settled["interventions"].as_array().unwrap();
    assert_eq!(acts.len(), 1, "{settled}");
    assert_eq!(
        (&acts[0]["by"], &acts[0]["action"], &acts[0]["attempt"]),
        (&json!("carol"), &json!("attempt_cancelled"), &json!(1))
    );

    // Alice sees what was done to her job and by whom; Bob still cannot see it.
    let seen = json_with_status(app.get_job(ALICE, &alices).await, 200).await;
    assert_eq!(seen["interventions"], settled["interventions"]);
    assert_problem(app.get_job(BOB, &alices).await, 404, "job_not_found").await;
    // Settled, it needs nobody: failed with nowhere to go, it is listed as failed now, no longer unknown.
    let unknown = json_with_status(
        app.get(CAROL, "/v1/operator/jobs?status=unknown").await,
        200,
    )
    .await;
    assert_eq!(ids(&unknown), [bobs.as_str()]);
    let failed =
        json_with_status(app.get(CAROL, "/v1/operator/jobs?status=failed").await, 200).await;
    assert_eq!(ids(&failed), [alices.as_str()]);

    // She cancels it for good; that is recorded too, and it leaves the view.
    let cancelled = json_with_status(app.cancel_job(CAROL, &alices).await, 200).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["interventions"][1]["action"], "job_cancelled");
    let failed =
        json_with_status(app.get(CAROL, "/v1/operator/jobs?status=failed").await, 200).await;
    assert_eq!(ids(&failed), Vec::<&str>::new());

    // Only jobs that need a person are asked for.
    let wrong = app.get(CAROL, "/v1/operator/jobs?status=succeeded").await;
    assert_problem(wrong, 400, "invalid_parameter").await;
}

#[tokio::test]
async fn an_operator_reads_any_owners_usage_and_the_counters_and_an_owner_only_its_own() {
    let app = app(&held().await).await;
    let day = "from=2026-11-30&to=2026-11-30";
    let alices = app
        .get(CAROL, &format!("/v1/usage?{day}&owner=alice"))
        .await;
    assert_eq!(alices.status(), 200);
    assert_problem(
        app.get(ALICE, &format!("/v1/usage?{day}&owner=bob")).await,
        403,
        "forbidden",
    )
    .await;
    assert_problem(
        app.get(CAROL, &format!("/v1/usage?{day}")).await,
        400,
        "invalid_parameter",
    )
    .await;
    assert_eq!(app.get(CAROL, "/metrics").await.status(), 200);
    assert_problem(app.get(ALICE, "/metrics").await, 403, "forbidden").await;
    // The full provider view: where each provider is.
    let providers = json_with_status(app.get(CAROL, "/v1/providers").await, 200).await;
    assert!(
        providers["providers"][0].get("breaker").is_some(),
        "{providers}"
    );
}
