//! The tour's scenarios (`docs/tour.md`) end to end: a job created over HTTP runs on the local worker against provider
//! stand-ins (real HTTP servers on loopback), watched through `?wait=` long polls.

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
    let primary = StandIn::spawn(vec![], Reply::Status(500, "boom")).await;
    let fallback = StandIn::answering(json!({"summary": "from the fallback"})).await;
    let app = app_on(&primary, &fallback).await;
    let id = created_id(&app, "k", &chain_job("text")).await;
    let job = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(attempt_state(&job, 1), "failed");
    assert_eq!(job["attempts"][0]["error"]["code"], "provider_error");
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
        Reply::Status(500, "unused"),
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
    let primary = StandIn::spawn(vec![], Reply::Status(500, "boom")).await;
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
    assert_eq!(failed["attempts"][0]["error"]["code"], "provider_error");
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
    let boom = Reply::Status(500, "boom");
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

#[tokio::test]
async fn a_long_poll_answers_at_once_for_a_settled_job_and_refuses_long_waits() {
    let app = TestApp::spawn().await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let id = created_id(&app, "k", &body).await;
    json_with_status(app.cancel_job(ALICE, &id).await, 200).await;
    // The clock never moves: a wait that did not answer at once would never answer.
    let settled =
        json_with_status(app.get(ALICE, &format!("/v1/jobs/{id}?wait=25")).await, 200).await;
    assert_eq!(settled["status"], "cancelled");
    assert_problem(
        app.get(ALICE, &format!("/v1/jobs/{id}?wait=26")).await,
        400,
        "invalid_parameter",
    )
    .await;
}

/// A crash while an attempt is `started`: after the restart, the sweeper makes it `unknown` once its lease has
/// passed — not `failed` — and the provider is not called again.
#[tokio::test]
async fn after_a_crash_a_started_attempt_becomes_unknown_without_a_second_call() {
    let primary =
        StandIn::spawn(vec![Reply::Held(Gate::new())], Reply::Status(500, "unused")).await;
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

/// `ETag` and `If-None-Match`: a client names the version it has and waits for the next one.
#[tokio::test]
async fn a_long_poll_waits_for_a_version_the_client_has_not_seen() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let id = created_id(&app, "k", &body).await;
    // The demo provider now waits on the clock, which stands still: the job holds still too.
    app.wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    let response = app.get_job(ALICE, &id).await;
    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
    let same = app
        .client
        .get(app.url(&format!("/v1/jobs/{id}")))
        .bearer_auth(ALICE)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(same.status(), 304);

    let poll = app.long_poll(ALICE, &id, etag.clone());
    json_with_status(app.cancel_job(ALICE, &id).await, 200).await;
    let changed = poll.await.unwrap();
    assert_ne!(changed.headers()["etag"].to_str().unwrap(), etag);
    let job = json_with_status(changed, 200).await;
    assert_eq!(job["status"], "cancelled");
}

/// A long poll woken by the write that made the job final answers from the copy that write brought along, not
/// from a read: it shows exactly what a read shows afterwards, entity tag included.
#[tokio::test]
async fn a_long_poll_woken_by_the_final_write_shows_what_a_read_shows() {
    let gate = Gate::new();
    let primary = StandIn::spawn(
        vec![Reply::Held(gate.clone())],
        Reply::Status(500, "unused"),
    )
    .await;
    let fallback = StandIn::answering(json!({"summary": "unused"})).await;
    let app = std::sync::Arc::new(app_on(&primary, &fallback).await);
    let id = created_id(&app, "k", &chain_job("text")).await;
    primary.received(1).await;
    let running = app.get_job(ALICE, &id).await;
    let etag = running.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(json_with_status(running, 200).await["status"], "running");

    let poll = app.long_poll(ALICE, &id, etag);
    gate.open(json!({"summary": "A"}));
    let polled = poll.await.unwrap();
    let polled_tag = polled.headers()["etag"].clone();
    let polled = json_with_status(polled, 200).await;
    assert_eq!(polled["status"], "succeeded");
    assert_eq!(polled["result"], json!({"summary": "A"}));
    let read = app.get_job(ALICE, &id).await;
    assert_eq!(read.headers()["etag"], polled_tag);
    assert_eq!(json_with_status(read, 200).await, polled);
}

/// `If-None-Match` as RFC 9110 reads it: a list matches if any tag does, a weak tag matches its strong twin, `*`
/// matches any version; a list of other versions is a change.
#[tokio::test]
async fn if_none_match_takes_lists_weak_tags_and_a_star() {
    let app = TestApp::spawn().await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let id = created_id(&app, "k", &body).await;
    app.wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    let etag = app.get_job(ALICE, &id).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let other = "\"00000000000000000000000000000000\"";
    for (named, status) in [
        (format!("{other}, {etag}"), 304),
        (format!("W/{etag}"), 304),
        ("*".to_owned(), 304),
        (other.to_owned(), 200),
        (format!("{other}, W/{other}"), 200),
    ] {
        let response = app
            .client
            .get(app.url(&format!("/v1/jobs/{id}")))
            .bearer_auth(ALICE)
            .header("if-none-match", &named)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "If-None-Match: {named}");
        assert_eq!(response.headers()["etag"], etag.as_str());
    }
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

/// Qualifies `provider` for summarize@1 through the app's engine and stores the evidence, as `onejob qualify` does.
async fn qualify_on(app: &TestApp, provider: &str) -> bool {
    let engine = app.engine();
    let name = ProviderName::parse(provider).unwrap();
    let contract = engine
        .contracts
        .get(&onejob::domain::ContractRef::parse("summarize@1").unwrap())
        .unwrap();
    let candidate = engine.providers.get(&name).unwrap();
    let evidence = onejob::providers::qualify::qualify(
        contract,
        &name,
        candidate,
        1,
        &*engine.clock,
        |_, _, _| {},
    )
    .await;
    app.faults.put_qualification(&evidence).await.unwrap();
    evidence.passed
}

/// The standing of `provider` for `contract` in `GET /v1/providers`.
async fn standing(app: &TestApp, provider: &str, contract: &str) -> Value {
    let list = json_with_status(app.get(ALICE, "/v1/providers").await, 200).await;
    let entry = list["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == provider)
        .unwrap()
        .clone();
    entry["contracts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["contract"] == contract)
        .unwrap()
        .clone()
}

#[tokio::test]
async fn failover_waits_for_qualification_and_providers_show_their_standing() {
    let mut config = config();
    for (name, behavior) in [
        ("demo-fail", DemoBehavior::Fail),
        ("demo-backup", DemoBehavior::Answer),
        ("demo-sloppy", DemoBehavior::ExtraKey),
    ] {
        config.providers.insert(
            ProviderName::parse(name).unwrap(),
            ProviderConfig::demo(behavior, 0),
        );
    }
    let app = TestApp::spawn_with(config).await;
    let chain = |text: &str| json!({"contract": "summarize@1", "input": {"text": text}, "providers": ["demo-fail", "demo-backup"]});
    let before = standing(&app, "demo-backup", "summarize@1").await;
    assert_eq!(before["standing"], "unqualified");
    assert_eq!(before["checked_at"], Value::Null);

    let id = created_id(&app, "before", &chain("Too early.")).await;
    let failed = app
        .wait_until(ALICE, &id, |j| j["status"] == "failed")
        .await;
    assert_eq!(failed["error"]["code"], "fallback_not_qualified");
    assert_eq!(failed["attempts"].as_array().unwrap().len(), 1);

    assert!(qualify_on(&app, "demo-backup").await);
    let after = standing(&app, "demo-backup", "summarize@1").await;
    assert_eq!(after["standing"], "qualified");
    assert_eq!(after["runs"], 3);
    assert_eq!(
        standing(&app, "demo-backup", "classify@1").await["standing"],
        "unqualified"
    );

    let id = created_id(&app, "after", &chain("Now it fails over. Fine.")).await;
    let done = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(done["completed_by"], 2);
    assert_eq!(done["attempts"][1]["provider"], "demo-backup");
    assert_eq!(done["attempts"][1]["report"]["model"], "demo/answer");
    assert_eq!(done["result"], json!({"summary": "Now it fails over."}));

    assert!(!qualify_on(&app, "demo-sloppy").await);
    let sloppy = standing(&app, "demo-sloppy", "summarize@1").await;
    assert_eq!(sloppy["standing"], "failed");
    assert_eq!(sloppy["problem"]["code"], "output_invalid");
    assert!(
        sloppy["problem"]["message"]
            .as_str()
            .unwrap()
            .contains("'note' was unexpected")
    );
}

/// Five failures that tell of the provider's health open its breaker: `GET /v1/providers` shows it open to the
/// operator; the next job on it makes no call and, its chain having nowhere else to go, waits out the cooldown
/// queued, unclaimed, without a try charged (no `breaker_open` attempt, no retry).
#[tokio::test]
async fn a_provider_that_keeps_failing_opens_its_breaker() {
    let mut config = config();
    config.providers.insert(
        ProviderName::parse("demo-fail").unwrap(),
        ProviderConfig::demo(DemoBehavior::Fail, 0),
    );
    let app = TestApp::spawn_with(config).await;
    let body = |n: u32| json!({"contract": "summarize@1", "input": {"text": format!("fails {n}")}, "providers": ["demo-fail"]});
    for n in 0..5 {
        let id = created_id(&app, &format!("k{n}"), &body(n)).await;
        app.wait_until(ALICE, &id, |j| j["status"] == "failed")
            .await;
    }
    let failing = app
        .provider_when("demo-fail", |p| p["breaker"]["recent_failures"] == 5)
        .await;
    let breaker = &failing["breaker"];
    assert_eq!(
        (
            &breaker["state"],
            &breaker["trips"],
            &breaker["recent_failures"]
        ),
        (&json!("open"), &json!(1), &json!(5)),
        "{breaker}"
    );

    let id = created_id(&app, "k5", &body(5)).await;
    let failing = [("provider", "demo-fail")];
    let metrics = app
        .metrics_when(|m| metric(m, "onejob_breaker_waits_total", &failing) >= 1.0)
        .await;
    let waiting = json_with_status(app.get(ALICE, &format!("/v1/jobs/{id}")).await, 200).await;
    assert_eq!(waiting["status"], "queued", "{waiting}");
    assert_eq!(
        waiting["attempts"].as_array().unwrap().len(),
        1,
        "{waiting}"
    );
    assert_eq!(waiting["attempts"][0]["state"], "queued", "{waiting}");
    assert_eq!(metric(&metrics, "onejob_retries_total", &failing), 0.0);
    assert_eq!(
        metric(&metrics, "onejob_breaker_trips_total", &failing),
        1.0,
        "{metrics}"
    );
    let failed = [("provider", "demo-fail"), ("state", "failed")];
    assert_eq!(
        metric(&metrics, "onejob_attempts_total", &failed),
        5.0,
        "{metrics}"
    );
}
