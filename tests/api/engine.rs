//! The tour's scenarios (`docs/tour.md`) end to end: a job created over HTTP runs on the local worker against provider
//! stand-ins (real HTTP servers on loopback), watched through `?wait=` long polls.

mod polls;
mod providers;

use chrono::Duration;
use onejob::domain::ProviderName;
use onejob::providers::{DemoBehavior, ProviderConfig};
use onejob::store::ProviderStore;
use serde_json::{Value, json};

use crate::helpers::{ALICE, TestApp, assert_problem, config, json_with_status};
use crate::support::stand_in::{Gate, Reply, StandIn, TIMEOUT_MS, openai};
use crate::support::{metric, record_qualified};

async fn app_with(primary: ProviderConfig, fallback: ProviderConfig) -> TestApp {
    let mut config = config();
    config
        .providers
        .insert(ProviderName::parse("primary").unwrap(), primary);
    config
        .providers
        .insert(ProviderName::parse("fallback").unwrap(), fallback);
    TestApp::spawn_with(config).await
}

/// An app whose `primary` and (qualified) `fallback` are these stand-ins.
async fn app_on(primary: &StandIn, fallback: &StandIn) -> TestApp {
    let app = app_with(openai(primary.base_url()), openai(fallback.base_url())).await;
    record_qualified(app.engine(), app.faults.as_ref(), "fallback").await;
    app
}

fn chain_job(text: &str) -> Value {
    json!({"contract": "summarize@1", "input": {"text": text}, "providers": ["primary", "fallback"]})
}

fn attempt_state(job: &Value, number: usize) -> &str {
    job["attempts"][number - 1]["state"]
        .as_str()
        .unwrap_or("absent")
}

async fn created_id(app: &TestApp, key: &str, body: &Value) -> String {
    let job = json_with_status(app.create(ALICE, key, body).await, 201).await;
    job["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_job_runs_to_success_on_the_built_in_demo_provider() {
    let mut config = config();
    let instant = ProviderConfig::demo(DemoBehavior::Answer, 0);
    config
        .providers
        .insert(ProviderName::parse("demo").unwrap(), instant);
    let app = TestApp::spawn_with(config).await;
    let body = json!({"contract": "summarize@1", "input": {"text": "The projector broke. The meeting moved."}});
    let id = created_id(&app, "k", &body).await;
    let job = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(job["result"], json!({"summary": "The projector broke."}));
    assert_eq!(
        (&job["completed_by"], &job["version"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(attempt_state(&job, 1), "succeeded");
    assert!(job["attempts"][0]["finished_at"].is_string());

    // The run in the metrics: each histogram's buckets under its labels.
    let ended = [
        ("contract", "summarize"),
        ("outcome", "succeeded"),
        ("le", "1"),
    ];
    let metrics = app
        .metrics_when(|m| metric(m, "onejob_attempts_per_job_bucket", &ended) == 1.0)
        .await;
    let created = [("contract", "summarize"), ("outcome", "created")];
    let queued = [("contract", "summarize"), ("provider", "demo")];
    let called = [
        ("provider", "demo"),
        ("model", "demo/answer"),
        ("outcome", "answered"),
    ];
    for (series, labels) in [
        ("onejob_create_seconds_count", &created[..]),
        ("onejob_creates_total", &created[..]),
        ("onejob_queue_wait_seconds_count", &queued[..]),
        ("onejob_provider_call_seconds_count", &called[..]),
        ("onejob_attempts_per_job_count", &ended[..2]),
    ] {
        assert_eq!(metric(&metrics, series, labels), 1.0, "{series}: {metrics}");
    }
    let inf = [
        ("provider", "demo"),
        ("outcome", "answered"),
        ("le", "+Inf"),
    ];
    assert_eq!(
        metric(&metrics, "onejob_provider_call_seconds_bucket", &inf),
        1.0
    );
    let none = [
        ("contract", "summarize"),
        ("outcome", "succeeded"),
        ("le", "0"),
    ];
    assert_eq!(
        metric(&metrics, "onejob_attempts_per_job_bucket", &none),
        0.0,
        "{metrics}"
    );
    let buckets = metrics
        .lines()
        .filter(|l| l.starts_with("onejob_create_seconds_bucket{"))
        .count();
    assert_eq!(buckets, 15, "14 bounds and +Inf: {metrics}");
}

#[tokio::test]
async fn a_failing_primary_fails_over_and_the_fallback_wins() {
    let primary = StandIn::spawn(vec![], Reply::Status(403, "boom")).await;
    let fallback = StandIn::answering(json!({"summary": "from the fallback"})).await;
    let app = app_on(&primary, &fallback).await;
    let id = created_id(&app, "k", &chain_job("text")).await;
    let job = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(attempt_state(&job, 1), "failed");
    assert_eq!(job["attempts"][0]["error"]["code"], "provider_refused");
    assert_eq!(job["attempts"][1]["provider"], "fallback");
    assert_eq!(job["completed_by"], 2);
    assert_eq!(job["result"], json!({"summary": "from the fallback"}));
}

/// The tour's hang scenario, and breakpoints 3 and 4 over HTTP: the primary times out into `unknown`,
/// new attempts are refused, an out-of-band cancel lets the fallback run and win, and the primary's late answer is
/// discarded, logged and counted.
#[tokio::test]
async fn a_hanging_primary_blocks_until_cancelled_and_its_late_answer_loses() {
    let gate = Gate::new();
    let primary = StandIn::spawn(
        vec![Reply::Held(gate.clone())],
        Reply::Status(403, "unused"),
    )
    .await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    let app = app_on(&primary, &fallback).await;
    let id = created_id(&app, "k", &chain_job("text")).await;
    primary.received(1).await;
    app.clock.advance(Duration::milliseconds(TIMEOUT_MS as i64));
    let job = app
        .wait_until(ALICE, &id, |j| j["status"] == "unknown")
        .await;
    assert_eq!(attempt_state(&job, 1), "unknown");

    let retry = app.post(ALICE, &format!("/v1/jobs/{id}/attempts")).await;
    let problem = assert_problem(retry, 409, "attempt_in_progress").await;
    assert!(
        problem["detail"].as_str().unwrap().contains("unknown"),
        "{problem}"
    );

    let cancelled = json_with_status(
        app.post(ALICE, &format!("/v1/jobs/{id}/attempts/1/cancel"))
            .await,
        200,
    )
    .await;
    assert_eq!(attempt_state(&cancelled, 1), "cancelled");
    assert_eq!(cancelled["attempts"][1]["provider"], "fallback");
    let won = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(
        (&won["completed_by"], &won["result"]),
        (&json!(2), &json!({"summary": "B"}))
    );

    gate.open(json!({"summary": "A, too late"}));
    let after = app
        .wait_until(ALICE, &id, |j| attempt_state(j, 1) == "discarded")
        .await;
    assert_eq!(after["result"], json!({"summary": "B"}));
    assert_eq!(after["version"], won["version"]);
    let metrics = app.metrics().await;
    let lost = [("contract", "summarize"), ("provider", "primary")];
    assert_eq!(
        metric(&metrics, "onejob_races_lost_total", &lost),
        1.0,
        "{metrics}"
    );
    let discarded = [("provider", "primary"), ("state", "discarded")];
    assert_eq!(
        metric(&metrics, "onejob_attempts_total", &discarded),
        1.0,
        "{metrics}"
    );
    assert_eq!((primary.call_count(), fallback.call_count()), (1, 1));
}

#[tokio::test]
async fn a_failed_job_can_be_retried_by_hand_on_any_provider() {
    // A failure that may have done the work is not retried on the same provider.
    let primary = StandIn::spawn(vec![], Reply::Status(403, "boom")).await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    // The fallback was never qualified.
    let app = app_with(openai(primary.base_url()), openai(fallback.base_url())).await;
    let id = created_id(&app, "k", &chain_job("text")).await;
    let failed = app
        .wait_until(ALICE, &id, |j| j["status"] == "failed")
        .await;
    assert_eq!(
        failed["error"]["code"], "fallback_not_qualified",
        "{failed}"
    );
    assert_eq!(failed["attempts"][0]["error"]["code"], "provider_refused");
    assert_eq!(fallback.call_count(), 0);

    let attempts = format!("/v1/jobs/{id}/attempts");
    let unknown = app
        .post_json(ALICE, &attempts, &json!({"provider": "nope"}))
        .await;
    assert_problem(unknown, 422, "unknown_provider").await;
    let extra = app
        .post_json(
            ALICE,
            &attempts,
            &json!({"provider": "fallback", "priority": 1}),
        )
        .await;
    assert_problem(extra, 422, "invalid_request").await;
    let added = json_with_status(
        app.post_json(ALICE, &attempts, &json!({"provider": "fallback"}))
            .await,
        201,
    )
    .await;
    assert_eq!(
        (&added["number"], &added["state"]),
        (&json!(2), &json!("queued"))
    );
    let done = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(done["error"], Value::Null);

    assert_problem(app.post(ALICE, &attempts).await, 409, "job_finished").await;
    // An empty body is no body, whatever its declared type: the default request (and so the same refusal); a
    // JSON `null` is not a request.
    let send = |content_type: &'static str, body: &'static str| {
        app.client
            .post(app.url(&attempts))
            .bearer_auth(ALICE)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    assert_problem(
        send("application/json", "").await.unwrap(),
        409,
        "job_finished",
    )
    .await;
    assert_problem(send("text/plain", "").await.unwrap(), 409, "job_finished").await;
    assert_problem(
        send("application/json", "null").await.unwrap(),
        422,
        "invalid_request",
    )
    .await;
    assert_problem(
        send("text/plain", "{}").await.unwrap(),
        415,
        "unsupported_media_type",
    )
    .await;
    let cancel_done = app
        .post(ALICE, &format!("/v1/jobs/{id}/attempts/2/cancel"))
        .await;
    assert_problem(cancel_done, 409, "attempt_not_cancellable").await;
    let cancel_missing = app
        .post(ALICE, &format!("/v1/jobs/{id}/attempts/9/cancel"))
        .await;
    assert_problem(cancel_missing, 404, "attempt_not_found").await;
}

/// `onejob_attempts_per_job` counts a job's ends: its failure, not the cancel of the failed job; a job reopened by
/// a manual retry again when that ends; a cancel of an open job once, however often it is asked for.
#[tokio::test]
async fn a_job_is_counted_once_per_end_and_cancelling_a_failed_job_ends_nothing() {
    let gate = Gate::new();
    let boom = Reply::Status(403, "boom");
    let primary = StandIn::spawn(
        vec![boom.clone(), boom.clone(), Reply::Held(gate.clone())],
        boom,
    )
    .await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    // The fallback was never qualified: no failover.
    let app = app_with(openai(primary.base_url()), openai(fallback.base_url())).await;
    let count = |text: &str, outcome: &str| {
        metric(
            text,
            "onejob_attempts_per_job_count",
            &[("contract", "summarize"), ("outcome", outcome)],
        )
    };
    let failed = created_id(&app, "failed", &chain_job("a")).await;
    app.wait_until(ALICE, &failed, |j| j["status"] == "failed")
        .await;
    app.metrics_when(|m| count(m, "failed") == 1.0).await;
    let cancelled = json_with_status(app.cancel_job(ALICE, &failed).await, 200).await;
    assert_eq!(cancelled["status"], "cancelled");

    let retried = created_id(&app, "retried", &chain_job("b")).await;
    app.wait_until(ALICE, &retried, |j| j["status"] == "failed")
        .await;
    let attempts = format!("/v1/jobs/{retried}/attempts");
    let added = app
        .post_json(ALICE, &attempts, &json!({"provider": "fallback"}))
        .await;
    json_with_status(added, 201).await;
    app.wait_until(ALICE, &retried, |j| j["status"] == "succeeded")
        .await;

    // Held in its provider call, then cancelled twice.
    let open = created_id(&app, "open", &chain_job("c")).await;
    primary.received(3).await;
    for _ in 0..2 {
        let cancelled = json_with_status(app.cancel_job(ALICE, &open).await, 200).await;
        assert_eq!(cancelled["status"], "cancelled");
    }
    gate.open(json!({"summary": "too late"}));
    app.wait_until(ALICE, &open, |j| j["attempts"][0]["state"] == "discarded")
        .await;
    let metrics = app
        .metrics_when(|m| count(m, "succeeded") == 1.0 && count(m, "failed") == 2.0)
        .await;
    assert_eq!(count(&metrics, "cancelled"), 1.0, "{metrics}");
    assert_eq!(primary.call_count(), 3);
}

/// A crash while an attempt is `started`: after the restart, the sweeper makes it `unknown` once its lease has
/// passed — not `failed` — and the provider is not called again.
#[tokio::test]
async fn after_a_crash_a_started_attempt_becomes_unknown_without_a_second_call() {
    let primary =
        StandIn::spawn(vec![Reply::Held(Gate::new())], Reply::Status(403, "unused")).await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    let app = app_on(&primary, &fallback).await;
    let id = created_id(&app, "k", &chain_job("text")).await;
    primary.received(1).await;
    let running = app
        .wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    assert_eq!(attempt_state(&running, 1), "started");

    let lease = app.engine().lease();
    let app = app.crash_and_restart(lease + Duration::seconds(1)).await;
    let job = app
        .wait_until(ALICE, &id, |j| j["status"] == "unknown")
        .await;
    assert_eq!(attempt_state(&job, 1), "unknown");
    assert_eq!(job["attempts"].as_array().unwrap().len(), 1);
    assert_eq!((primary.call_count(), fallback.call_count()), (1, 0));
}

/// Every answer carries a request id: the caller's own when it sent one, else a fresh one per request.
#[tokio::test]
async fn every_answer_names_its_request() {
    let app = TestApp::spawn().await;
    let mine = app
        .client
        .get(app.url("/healthz"))
        .header("x-request-id", "req-42")
        .send()
        .await
        .unwrap();
    assert_eq!(mine.headers()["x-request-id"], "req-42");
    let mut ids = std::collections::BTreeSet::new();
    for path in ["/healthz", "/v1/jobs/nope"] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        ids.insert(
            response.headers()["x-request-id"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(ids.len(), 2, "a fresh id per request: {ids:?}");
    assert!(ids.iter().all(|id| !id.is_empty()));
}
