//! Issue 12 over HTTP: the answers a client gets when onejob's own parts fail or repeat themselves, and at the edges
//! (long polls that time out, settled jobs, retention, strict input, caps, the operators' counters).

use chrono::Duration;
use onejob::clock::Clock;
use onejob::domain::ProviderName;
use onejob::providers::{DemoBehavior, ProviderConfig};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::helpers::{
    ALICE, OPERATOR, TestApp, assert_problem, config, json_with_status, summarize,
};
use crate::support::faulty::{Call, Fault};
use crate::support::record_qualified;
use crate::support::stand_in::{Gate, LATE_MS, Reply, StandIn, TIMEOUT_MS, openai};

fn chain_job(text: &str) -> Value {
    json!({"contract": "summarize@1", "input": {"text": text}, "providers": ["primary", "fallback"]})
}

/// An app whose `primary` and `fallback` are these stand-ins; `fallback` qualified if `qualified`.
async fn app_on(primary: &StandIn, fallback: &StandIn, qualified: bool) -> TestApp {
    let mut config = config();
    for (name, stand_in) in [("primary", primary), ("fallback", fallback)] {
        config.providers.insert(
            ProviderName::parse(name).unwrap(),
            openai(stand_in.base_url()),
        );
    }
    let app = TestApp::spawn_with(config).await;
    if qualified {
        record_qualified(app.engine(), app.faults.as_ref(), "fallback").await;
    }
    app
}

fn attempt_state(job: &Value, number: usize) -> &str {
    job["attempts"][number - 1]["state"]
        .as_str()
        .unwrap_or("absent")
}

/// A create whose write fails on either side is answered 201 to its own request — exactly one 201 per key, however
/// many identical requests race it — and its job runs.
#[tokio::test]
async fn a_create_whose_store_write_fails_either_side_answers_one_201_per_key() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    for (i, fault) in [Fault::Before, Fault::After].into_iter().enumerate() {
        app.faults.plan(&[(Call::Create, fault)]);
        let key = format!("k{i}");
        let mut requests = JoinSet::new();
        for _ in 0..8 {
            let (app, key) = (app.clone(), key.clone());
            requests.spawn(async move {
                let response = app.create(ALICE, &key, &summarize("x")).await;
                let status = response.status().as_u16();
                let job: Value = response.json().await.unwrap();
                (status, job["id"].as_str().unwrap().to_owned())
            });
        }
        let answers = requests.join_all().await;
        assert!(app.faults.spent());
        let created = answers.iter().filter(|(s, _)| *s == 201).count();
        let replayed = answers.iter().filter(|(s, _)| *s == 200).count();
        assert_eq!((created, replayed), (1, 7), "{fault:?}: {answers:?}");
        assert!(answers.iter().all(|(_, id)| *id == answers[0].1));
    }
    assert_eq!(app.row_counts().await.0, 2, "one job per key");
    let metrics = app.metrics().await;
    let created =
        crate::support::metric(&metrics, "onejob_creates_total", &[("outcome", "created")]);
    assert_eq!(created, 2.0, "{metrics}");
    let retries = crate::support::metric(&metrics, "onejob_store_retries_total", &[]);
    assert_eq!(retries, 2.0, "{metrics}");
}

/// An attempt cancel whose write landed but whose answer was lost answers 200 (not 409 for its own success), its
/// failover runs at once; cancelling it again answers 200 as well.
#[tokio::test]
async fn an_attempt_cancel_is_idempotent_even_when_its_answer_was_lost() {
    let primary =
        StandIn::spawn(vec![Reply::Held(Gate::new())], Reply::Status(500, "unused")).await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    let app = app_on(&primary, &fallback, true).await;
    let job = json_with_status(app.create(ALICE, "k", &chain_job("t")).await, 201).await;
    let id = job["id"].as_str().unwrap();
    primary.received(1).await;
    app.faults.plan(&[(Call::CancelAttempt, Fault::After)]);
    let cancel = format!("/v1/jobs/{id}/attempts/1/cancel");
    let cancelled = json_with_status(app.post(ALICE, &cancel).await, 200).await;
    assert_eq!(attempt_state(&cancelled, 1), "cancelled");
    let again = json_with_status(app.post(ALICE, &cancel).await, 200).await;
    assert_eq!(attempt_state(&again, 1), "cancelled");
    let done = app
        .wait_until(ALICE, id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(done["completed_by"], 2);
    assert_eq!(fallback.call_count(), 1);
}

/// `?wait=` without `If-None-Match` that times out answers 200 with the job, never 304 (RFC 9110: a 304 answers
/// only a conditional request).
#[tokio::test]
async fn an_unconditional_long_poll_that_times_out_answers_200() {
    let primary =
        StandIn::spawn(vec![Reply::Held(Gate::new())], Reply::Status(500, "unused")).await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    let mut config = config();
    // The primary holds on its gate, and its timeout is far beyond the wait.
    let patient = openai(primary.base_url()).with_timings(600_000, LATE_MS);
    config
        .providers
        .insert(ProviderName::parse("primary").unwrap(), patient);
    config.providers.insert(
        ProviderName::parse("fallback").unwrap(),
        openai(fallback.base_url()),
    );
    let app = std::sync::Arc::new(TestApp::spawn_with(config).await);
    let job = json_with_status(app.create(ALICE, "k", &chain_job("t")).await, 201).await;
    let id = job["id"].as_str().unwrap().to_owned();
    primary.received(1).await;
    let running = app
        .wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    let sleeping = app.clock.sleepers();
    let (poller, poll_id) = (app.clone(), id.clone());
    let poll = tokio::spawn(async move {
        poller
            .get(ALICE, &format!("/v1/jobs/{poll_id}?wait=1"))
            .await
    });
    // Once the poll waits on the server's clock, its second passes.
    while app.clock.sleepers() <= sleeping {
        tokio::task::yield_now().await;
    }
    app.clock.advance(Duration::seconds(1));
    let answer = poll.await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.headers().contains_key("etag"));
    let same = json_with_status(answer, 200).await;
    assert_eq!(same["status"], "running");
    assert_eq!(same["attempts"], running["attempts"]);
}

/// A failed job whose cancelled attempt may still answer is not settled until that attempt's lease ends; a long
/// poll on it returns when it settles; an answer after that is discarded and the job stays failed.
#[tokio::test]
async fn a_failed_job_is_settled_only_once_no_attempt_can_still_answer() {
    let gate = Gate::new();
    let primary = StandIn::spawn(
        vec![Reply::Held(gate.clone())],
        Reply::Status(500, "unused"),
    )
    .await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    // The fallback is not qualified: cancelling attempt 1 fails the job.
    let app = std::sync::Arc::new(app_on(&primary, &fallback, false).await);
    let job = json_with_status(app.create(ALICE, "k", &chain_job("t")).await, 201).await;
    let id = job["id"].as_str().unwrap().to_owned();
    primary.received(1).await;
    let claimed_at = app.clock.now();
    app.clock.advance(Duration::milliseconds(TIMEOUT_MS as i64));
    app.wait_until(ALICE, &id, |j| j["status"] == "unknown")
        .await;
    let failed = json_with_status(
        app.post(ALICE, &format!("/v1/jobs/{id}/attempts/1/cancel"))
            .await,
        200,
    )
    .await;
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["settled"], false, "{failed}");
    let lease_end = claimed_at + app.engine().lease();
    assert_eq!(
        failed["settles_at"],
        lease_end.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    );

    let response = app.get_job(ALICE, &id).await;
    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
    let poll = app.long_poll(ALICE, &id, etag);
    app.clock.advance(lease_end - app.clock.now());
    let settled = json_with_status(poll.await.unwrap(), 200).await;
    assert_eq!(
        (
            &settled["status"],
            &settled["settled"],
            &settled["settles_at"]
        ),
        (&json!("failed"), &json!(true), &Value::Null)
    );
    gate.open(json!({"summary": "too late"}));
    let after = json_with_status(app.get_job(ALICE, &id).await, 200).await;
    assert_eq!(
        (&after["status"], &after["result"]),
        (&json!("failed"), &Value::Null)
    );
}

/// Past its retention a job is gone for every read, and its key makes a new job with a new id.
#[tokio::test]
async fn a_job_past_its_retention_is_gone_and_its_key_makes_a_new_job() {
    let mut config = config();
    config.retention_days = 1;
    let app = TestApp::spawn_with(config).await;
    let old = json_with_status(app.create(ALICE, "k", &summarize("x")).await, 201).await;
    let old_id = old["id"].as_str().unwrap();
    let expires_at = chrono::DateTime::parse_from_rfc3339(old["expires_at"].as_str().unwrap())
        .unwrap()
        .to_utc();
    assert_eq!(expires_at - app.clock.now(), Duration::days(1));
    app.clock
        .advance(Duration::days(1) - Duration::milliseconds(1));
    json_with_status(app.get_job(ALICE, old_id).await, 200).await;
    app.clock.advance(Duration::milliseconds(1));
    assert_problem(app.get_job(ALICE, old_id).await, 404, "job_not_found").await;
    let listed = json_with_status(app.list_jobs(ALICE, "").await, 200).await;
    assert_eq!(listed["jobs"], json!([]));
    assert_problem(app.cancel_job(ALICE, old_id).await, 404, "job_not_found").await;

    let new = json_with_status(app.create(ALICE, "k", &summarize("another")).await, 201).await;
    assert_ne!(new["id"], old["id"]);
    assert_eq!(new["idempotency_key"], "k");
    assert_problem(app.get_job(ALICE, old_id).await, 404, "job_not_found").await;
}

/// A member named twice, anywhere in a body, or two `Idempotency-Key` headers: 400, and nothing is written.
#[tokio::test]
async fn ambiguous_requests_are_refused() {
    let app = TestApp::spawn().await;
    let auth = format!("Bearer {ALICE}");
    let json = [
        ("authorization", auth.as_bytes()),
        ("content-type", b"application/json".as_slice()),
    ];
    for body in [
        r#"{"contract": "summarize@1", "contract": "classify@1", "input": {"text": "x"}}"#,
        r#"{"contract": "summarize@1", "input": {"text": "x", "text": "y"}}"#,
    ] {
        let mut headers = json.to_vec();
        headers.push(("idempotency-key", b"k"));
        let response = app.create_raw(&headers, body).await;
        assert_problem(response, 400, "malformed_json").await;
    }
    let mut headers = json.to_vec();
    headers.push(("idempotency-key", b"k1"));
    headers.push(("idempotency-key", b"k2"));
    let response = app.create_raw(&headers, summarize("x").to_string()).await;
    assert_problem(response, 400, "invalid_idempotency_key").await;
    assert_eq!(app.row_counts().await, (0, 0));
}

/// The input as stored (`1e5` is kept as `100000.0`) must fit what a job keeps: 413 `input_too_large`.
#[tokio::test]
async fn an_input_too_large_to_keep_is_refused() {
    let app = TestApp::spawn().await;
    let numbers = vec!["1e5"; 40_000].join(",");
    let body =
        format!(r#"{{"contract": "summarize@1", "input": {{"text": "x", "n": [{numbers}]}}}}"#);
    assert!(body.len() < app.config.body_limit_bytes);
    let auth = format!("Bearer {ALICE}");
    let headers = [
        ("authorization", auth.as_bytes()),
        ("content-type", b"application/json".as_slice()),
        ("idempotency-key", b"k"),
    ];
    let problem =
        assert_problem(app.create_raw(&headers, body).await, 413, "input_too_large").await;
    assert_eq!(problem["limit"], onejob::domain::MAX_INPUT_BYTES);
    assert_eq!(app.row_counts().await, (0, 0));
}

/// A job has at most `max_attempts_per_job` attempts: a manual retry beyond answers 409 `attempt_limit_reached`.
#[tokio::test]
async fn a_job_stops_at_its_attempt_limit() {
    let mut config = config();
    config.max_attempts_per_job = 2;
    config.providers.insert(
        ProviderName::parse("failing").unwrap(),
        ProviderConfig::demo(DemoBehavior::Fail, 0),
    );
    let app = TestApp::spawn_with(config).await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}, "providers": ["failing"]});
    let job = json_with_status(app.create(ALICE, "k", &body).await, 201).await;
    let id = job["id"].as_str().unwrap();
    app.wait_until(ALICE, id, |j| j["status"] == "failed").await;
    let retry = format!("/v1/jobs/{id}/attempts");
    json_with_status(app.post(ALICE, &retry).await, 201).await;
    app.wait_until(ALICE, id, |j| {
        j["status"] == "failed" && j["attempts"].as_array().unwrap().len() == 2
    })
    .await;
    let problem = assert_problem(app.post(ALICE, &retry).await, 409, "attempt_limit_reached").await;
    assert_eq!(problem["limit"], 2);
}

/// The counters cover every owner's activity: only the operators' token reads them.
#[tokio::test]
async fn the_metrics_are_for_operators_only() {
    let app = TestApp::spawn().await;
    let get = |token: Option<&'static str>| {
        let mut request = app.client.get(app.url("/metrics"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    assert_problem(get(None).await.unwrap(), 401, "unauthorized").await;
    assert_problem(get(Some(ALICE)).await.unwrap(), 403, "forbidden").await;
    let ok = get(Some(OPERATOR)).await.unwrap();
    assert_eq!(ok.status(), 200);
    let text = ok.text().await.unwrap();
    assert!(text.contains("\nonejob_store_retries_total 0\n"), "{text}");
}
