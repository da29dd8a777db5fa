//! The engine on a store: the worker step, the sweeper and failover, driven by hand against provider stand-ins
//! (real HTTP servers on loopback) with a manual clock. Every backend runs these cases too.

use std::sync::Arc;

use onejob::clock::Clock;
use onejob::config::Config;
use onejob::domain::{AttemptRef, AttemptState, Job, JobStatus, ProviderName, Refusal};
use onejob::engine::Actor;
use onejob::store::{JobStore, StoreError};
use onejob::worker::Processed;
use onejob::worker::sweeper::sweep;
use serde_json::{Value, json};

use crate::support::faulty::{Call, FaultyStore};
use crate::support::rig::Rig;
use crate::support::stand_in::{
    Gate, LATE_MS, Reply, StandIn, TIMEOUT_MS, hanging_up, openai, refusing, resetting,
};
use crate::support::{record_qualified, record_qualified_as};

fn summary(text: &str) -> Value {
    json!({"summary": text})
}

fn state(job: &Job, number: u32) -> AttemptState {
    job.attempt(number).unwrap().state
}

/// A primary that holds its first answer until the gate opens.
async fn held() -> (Gate, StandIn) {
    let gate = Gate::new();
    let primary =
        StandIn::spawn(vec![Reply::Held(gate.clone())], Reply::Answer(summary("A"))).await;
    (gate, primary)
}

/// A rig on `store` whose primary and (qualified) fallback are these stand-ins.
async fn rig(store: Arc<dyn JobStore>, primary: &StandIn, fallback: &StandIn) -> Rig {
    let rig = Rig::new(
        store,
        openai(primary.base_url()),
        openai(fallback.base_url()),
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    rig
}

async fn answering(text: &str) -> StandIn {
    StandIn::answering(summary(text)).await
}

/// Breakpoint 3: a timeout is `unknown`, not `failed`, and blocks new attempts until resolved.
pub async fn a_timeout_is_unknown_and_blocks_new_attempts(store: Arc<dyn JobStore>) {
    let (_gate, primary) = held().await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, message) = rig.create("k").await;
    let step = rig.process_in_background(&message);
    primary.received(1).await;
    rig.advance(TIMEOUT_MS);
    let unknown = rig
        .until(&job, |j| state(j, 1) == AttemptState::Unknown)
        .await;
    assert_eq!(unknown.status(), JobStatus::Unknown);
    let refused = rig
        .engine
        .add_attempt(
            &Actor::Owner(job.owner.clone()),
            &job.id,
            Some(ProviderName::parse("fallback").unwrap()),
            None,
        )
        .await;
    assert!(matches!(
        refused,
        Err(StoreError::Refused(Refusal::AttemptInProgress {
            number: 1,
            state: AttemptState::Unknown
        }))
    ));
    // The late window passes without an answer: still unknown, never failed, and nothing failed over.
    rig.advance(LATE_MS);
    assert_eq!(step.await.unwrap(), Processed::Unknown);
    let after = rig.job(&job).await;
    assert_eq!(state(&after, 1), AttemptState::Unknown);
    assert_eq!(after.attempts.len(), 1);
    assert!(rig.no_message());
    assert_eq!((primary.call_count(), fallback.call_count()), (1, 0));
}

/// Breakpoint 4: A leaves first and returns last, B leaves second and returns first → B wins, A's result
/// is discarded and counted, although A was the primary.
pub async fn the_attempt_that_answers_first_wins_the_race(store: Arc<dyn JobStore>) {
    let (gate, primary) = held().await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, first) = rig.create("k").await;
    let a = rig.process_in_background(&first);
    primary.received(1).await;
    rig.advance(TIMEOUT_MS);
    rig.until(&job, |j| state(j, 1) == AttemptState::Unknown)
        .await;
    let cancelled = rig.cancel_attempt(&job, 1).await;
    assert_eq!(state(&cancelled, 2), AttemptState::Queued);
    let second = rig.next_message();
    assert_eq!(
        second,
        AttemptRef {
            job_id: job.id.clone(),
            number: 2
        }
    );
    assert_eq!(rig.process(&second).await, Processed::Succeeded);
    gate.open(summary("A"));
    assert_eq!(a.await.unwrap(), Processed::Discarded { winner: Some(2) });
    let done = rig.job(&job).await;
    assert_eq!(done.result, Some(summary("B")));
    assert_eq!((done.completed_by, done.version), (Some(2), 1));
    assert_eq!(state(&done, 1), AttemptState::Discarded);
    assert_eq!(rig.metric("onejob_races_lost_total", &[]), 1.0);
    assert_eq!((primary.call_count(), fallback.call_count()), (1, 1));
}

/// Invariant 8: one attempt delivered many times at once makes one provider call.
pub async fn a_duplicate_delivery_makes_one_provider_call(store: Arc<dyn JobStore>) {
    let primary = answering("A").await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, message) = rig.create("k").await;
    let steps: Vec<_> = (0..10)
        .map(|_| rig.process_in_background(&message))
        .collect();
    let mut outcomes = Vec::new();
    for step in steps {
        outcomes.push(step.await.unwrap());
    }
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == Processed::Succeeded)
            .count(),
        1
    );
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == Processed::Dropped)
            .count(),
        9
    );
    assert_eq!(
        rig.process(&message).await,
        Processed::Dropped,
        "a late redelivery"
    );
    assert_eq!(primary.call_count(), 1);
    assert_eq!(rig.job(&job).await.result, Some(summary("A")));
}

pub async fn a_late_result_after_a_job_cancel_is_discarded(store: Arc<dyn JobStore>) {
    let (gate, primary) = held().await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, message) = rig.create("k").await;
    let step = rig.process_in_background(&message);
    primary.received(1).await;
    rig.engine
        .cancel_job(&Actor::Owner(job.owner.clone()), &job.id, None)
        .await
        .unwrap();
    gate.open(summary("late"));
    assert_eq!(step.await.unwrap(), Processed::Discarded { winner: None });
    let after = rig.job(&job).await;
    assert_eq!(
        (after.status(), &after.result, after.version),
        (JobStatus::Cancelled, &None, 1)
    );
    assert_eq!(state(&after, 1), AttemptState::Discarded);
    assert!(rig.no_message(), "a cancelled job fails over nowhere");
}

pub async fn a_late_answer_after_the_timeout_wins_a_free_slot(store: Arc<dyn JobStore>) {
    let (gate, primary) = held().await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, message) = rig.create("k").await;
    let step = rig.process_in_background(&message);
    primary.received(1).await;
    rig.advance(TIMEOUT_MS);
    rig.until(&job, |j| j.status() == JobStatus::Unknown).await;
    gate.open(summary("late but first"));
    assert_eq!(step.await.unwrap(), Processed::Succeeded);
    let after = rig.job(&job).await;
    assert_eq!(
        (after.completed_by, &after.result),
        (Some(1), &Some(summary("late but first")))
    );
    assert_eq!(fallback.call_count(), 0);
}

pub async fn a_provider_error_fails_over_to_the_fallback(store: Arc<dyn JobStore>) {
    let primary = StandIn::spawn(vec![], Reply::Status(500, "upstream exploded")).await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, first) = rig.create("k").await;
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let failed = rig.job(&job).await;
    let error = failed.attempt(1).unwrap().error.clone().unwrap();
    assert_eq!(error.code, "provider_error");
    assert!(error.message.contains("500"), "{}", error.message);
    let second = rig.next_message();
    assert_eq!(rig.process(&second).await, Processed::Succeeded);
    let done = rig.job(&job).await;
    assert_eq!(
        (done.status(), done.completed_by),
        (JobStatus::Succeeded, Some(2))
    );
}

/// The primary answers `output`; the attempt fails with `code`, the job fails with `fallback_not_qualified`, and
/// the unqualified fallback gets no call. Nothing of the answer is written.
async fn an_answer_that_fails_the_attempt(store: Arc<dyn JobStore>, output: Value, code: &str) {
    let primary = StandIn::answering(output).await;
    let fallback = answering("B").await;
    // The fallback was never qualified.
    let mut rig = Rig::new(
        store,
        openai(primary.base_url()),
        openai(fallback.base_url()),
    );
    let (job, first) = rig.create("k").await;
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let after = rig.job(&job).await;
    assert_eq!(after.attempt(1).unwrap().error.as_ref().unwrap().code, code);
    assert_eq!((&after.result, after.status()), (&None, JobStatus::Failed));
    assert_eq!(after.error.as_ref().unwrap().code, "fallback_not_qualified");
    assert!(rig.no_message());
    assert_eq!(fallback.call_count(), 0);
}

/// Failover goes only to a qualified provider; the unqualified fallback gets no call.
pub async fn an_output_that_breaks_the_contract_fails_and_an_unqualified_fallback_gets_nothing(
    store: Arc<dyn JobStore>,
) {
    let extra_key = json!({"summary": "fine", "confidence": 0.9});
    an_answer_that_fails_the_attempt(store, extra_key, "output_invalid").await;
}

/// A result too large to keep fails its attempt with a clear code.
pub async fn a_result_too_large_to_keep_fails_the_attempt(store: Arc<dyn JobStore>) {
    let huge = summary(&"x".repeat(onejob::providers::checks::MAX_RESULT_BYTES));
    an_answer_that_fails_the_attempt(store, huge, "result_too_large").await;
}

/// Invariant 5: a connection lost after the request was sent is `unknown`; one refused before is `failed`.
pub async fn a_lost_connection_is_unknown_and_a_refused_one_is_failed(store: Arc<dyn JobStore>) {
    let fallback = answering("B").await;
    // Closed without a word, or reset (RST) after the request arrived: the work may have been done.
    for (key, lost) in [("closed", hanging_up().await), ("reset", resetting().await)] {
        let mut rig = Rig::new(store.clone(), openai(lost), openai(fallback.base_url()));
        record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
        let (job, message) = rig.create(key).await;
        assert_eq!(rig.process(&message).await, Processed::Unknown, "{key}");
        let after = rig.job(&job).await;
        assert_eq!(
            (after.status(), state(&after, 1)),
            (JobStatus::Unknown, AttemptState::Unknown),
            "{key}"
        );
        assert!(rig.no_message(), "{key}");
    }

    let mut rig = Rig::new(store, openai(refusing().await), openai(fallback.base_url()));
    let (job, message) = rig.create("refused").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let after = rig.job(&job).await;
    assert_eq!(
        after.attempt(1).unwrap().error.as_ref().unwrap().code,
        "connection_failed"
    );
    // Refused before anything was sent: the same provider again, after a backoff (1 s, with equal jitter).
    let retry = after.attempt(2).unwrap();
    assert_eq!(
        (retry.state, retry.provider.as_str(), retry.retry_of),
        (AttemptState::Queued, "primary", Some(1))
    );
    let waited = retry.not_before.unwrap() - after.attempt(1).unwrap().finished_at.unwrap();
    assert!(
        (500..=1_000).contains(&waited.num_milliseconds()),
        "{waited}"
    );
}

/// The call carries the attempt's idempotency key, the key from `api_key_env` and the contract's settings; what
/// the provider reports back (model, usage) is kept on the attempt.
pub async fn the_provider_call_carries_the_attempt_key_and_the_contract(store: Arc<dyn JobStore>) {
    let primary = answering("A").await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, message) = rig.create("k").await;
    rig.process(&message).await;
    let call = &primary.calls()[0];
    assert_eq!(
        call.headers["idempotency-key"],
        format!("{}:1", job.id).as_str()
    );
    let key = std::env::var("CARGO_PKG_NAME").unwrap();
    assert_eq!(
        call.headers["authorization"],
        format!("Bearer {key}").as_str()
    );
    assert_eq!(call.body["model"], "gpt-4o-mini");
    assert_eq!(call.body["temperature"], 0.0);
    assert_eq!(call.body["max_tokens"], 256);
    assert_eq!(call.body["response_format"]["type"], "json_schema");
    assert_eq!(
        call.body["response_format"]["json_schema"]["schema"]["required"],
        json!(["summary"])
    );
    let prompt = call.body["messages"][1]["content"].as_str().unwrap();
    assert!(
        prompt.contains("The projector broke. The meeting moved."),
        "{prompt}"
    );
    let report = rig
        .job(&job)
        .await
        .attempt(1)
        .unwrap()
        .report
        .clone()
        .unwrap();
    assert_eq!(report.model.as_deref(), Some("stand-in-model"));
    assert_eq!(report.output_tokens, Some(10));
    assert!(report.input_tokens.unwrap() > prompt.len() as u64);
}

/// The sweeper makes expired leases `unknown` (never `failed`) and dispatches unclaimed attempts again.
pub async fn the_sweeper_resolves_expired_leases_and_lost_messages(store: Arc<dyn JobStore>) {
    let primary = answering("A").await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    // A worker claimed this one and died.
    let (crashed, message) = rig.create("crashed").await;
    let now = rig.clock.now();
    rig.store
        .claim_attempt(
            &crashed.id,
            message.number,
            now + rig.engine.lease(),
            &onejob::domain::Stamp::fresh(now),
        )
        .await
        .unwrap();
    // This one's message was lost.
    let (lost, _) = rig.create("lost").await;

    let swept = sweep(&rig.engine, None).await.unwrap();
    assert_eq!(
        (swept.expired, swept.redispatched),
        (0, 0),
        "nothing is due yet"
    );
    rig.advance(rig.engine.lease().num_milliseconds() as u64 + 1);
    let swept = sweep(&rig.engine, None).await.unwrap();
    assert_eq!((swept.expired, swept.redispatched), (1, 1));
    assert_eq!(state(&rig.job(&crashed).await, 1), AttemptState::Unknown);
    let again = rig.next_message();
    assert_eq!(
        again,
        AttemptRef {
            job_id: lost.id.clone(),
            number: 1
        }
    );
    assert_eq!(rig.process(&again).await, Processed::Succeeded);
    assert_eq!(
        primary.call_count(),
        1,
        "the crashed attempt was not called again"
    );
}

/// Invariant 5: a gateway that stopped waiting (408, 502, 504, 524) says nothing about the work behind it — the
/// attempt is `unknown` and the fallback is not paid; a 503 from the provider's own API is a definite failure.
/// (Each of them tells of the provider's health too: the primary's breaker, shared through the store, is kept out
/// of this test.)
pub async fn a_gateway_timeout_is_unknown_and_the_fallback_is_not_paid(store: Arc<dyn JobStore>) {
    let fallback = answering("B").await;
    let no_breaker = |config: &mut Config| config.breaker_threshold = 0;
    for status in [408, 502, 504, 524] {
        let primary = StandIn::spawn(
            vec![],
            Reply::Status(status, "<html>Gateway Timeout</html>"),
        )
        .await;
        let mut rig = Rig::configured(
            store.clone(),
            openai(primary.base_url()),
            openai(fallback.base_url()),
            no_breaker,
        );
        record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
        let (job, message) = rig.create(&format!("gateway-{status}")).await;
        assert_eq!(rig.process(&message).await, Processed::Unknown, "{status}");
        let after = rig.job(&job).await;
        assert_eq!(state(&after, 1), AttemptState::Unknown, "{status}");
        assert_eq!(after.attempts.len(), 1, "{status}: no retry, no failover");
        assert!(rig.no_message(), "{status}: no failover");
        assert_eq!(primary.call_count(), 1);
    }
    assert_eq!(fallback.call_count(), 0);

    let unavailable = StandIn::spawn(vec![], Reply::Status(503, "overloaded")).await;
    let mut rig = Rig::configured(
        store.clone(),
        openai(unavailable.base_url()),
        openai(fallback.base_url()),
        no_breaker,
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let (job, message) = rig.create("unavailable").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    // A 503 that does not say when to come back may have been the provider failing mid-work: failover.
    let after = rig.job(&job).await;
    let next = after.attempt(2).unwrap();
    assert_eq!(
        (next.state, next.provider.as_str(), next.retry_of),
        (AttemptState::Queued, "fallback", None)
    );

    // A 503 with `Retry-After` said it did not take the request: a retry on the same provider, at its time.
    let down = StandIn::spawn(vec![], Reply::Unavailable(7)).await;
    let mut rig = Rig::configured(
        store.clone(),
        openai(down.base_url()),
        openai(fallback.base_url()),
        no_breaker,
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let (job, message) = rig.create("maintenance").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let after = rig.job(&job).await;
    let (first, retry) = (after.attempt(1).unwrap(), after.attempt(2).unwrap());
    assert_eq!(first.error.as_ref().unwrap().code, "provider_unavailable");
    assert_eq!(
        (retry.provider.as_str(), retry.retry_of, retry.not_before),
        (
            "primary",
            Some(1),
            Some(first.finished_at.unwrap() + chrono::Duration::seconds(7))
        )
    );

    // A provider configured with `retries = 0` is not retried: failover at once.
    let mut no_retries = openai(down.base_url());
    no_retries.limits.retries = Some(0);
    let mut rig = Rig::new(store, no_retries, openai(fallback.base_url()));
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let (job, message) = rig.create("no-retries").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let next = rig.job(&job).await.attempt(2).unwrap().clone();
    assert_eq!((next.provider.as_str(), next.retry_of), ("fallback", None));
}

/// A provider that says it did not do the work — 429 with `Retry-After: 1`, twice — is tried again on its own,
/// each time as a new attempt that no worker starts before the `Retry-After` (a message that comes early is sent
/// again for its time): three attempts on one provider, three calls, one winner, no failover.
pub async fn a_rate_limited_provider_is_retried_not_before_its_retry_after(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(
        vec![Reply::RateLimited(1), Reply::RateLimited(1)],
        Reply::Answer(summary("A")),
    )
    .await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, first) = rig.create("k").await;
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let after = rig.job(&job).await;
    let (failed, retry) = (after.attempt(1).unwrap(), after.attempt(2).unwrap());
    assert_eq!(failed.error.as_ref().unwrap().code, "rate_limited");
    assert_eq!(
        (retry.state, retry.provider.as_str(), retry.retry_of),
        (AttemptState::Queued, "primary", Some(1))
    );
    assert_eq!(
        retry.not_before,
        Some(failed.finished_at.unwrap() + chrono::Duration::seconds(1))
    );
    assert_eq!(after.status(), JobStatus::Queued);
    assert!(rig.no_message(), "not sent before its time");

    // Delivered early anyway (a redelivery): refused, nothing called, sent again for its time.
    let second = AttemptRef {
        job_id: job.id.clone(),
        number: 2,
    };
    assert_eq!(rig.process(&second).await, Processed::Dropped);
    assert_eq!(primary.call_count(), 1);

    rig.advance(1_000);
    // The delayed message and the one sent again: one runs, the other finds it running.
    let (a, b) = (rig.message().await, rig.message().await);
    assert_eq!((&a, &b), (&second, &second));
    assert_eq!(rig.process(&a).await, Processed::Failed);
    assert_eq!(rig.process(&b).await, Processed::Dropped);
    let after = rig.job(&job).await;
    assert_eq!(
        after.attempt(2).unwrap().error.as_ref().unwrap().code,
        "rate_limited"
    );
    rig.advance(1_000);
    let third = rig.message().await;
    assert_eq!(third.number, 3);
    assert_eq!(rig.process(&third).await, Processed::Succeeded);

    let done = rig.job(&job).await;
    let summary_of = |n: u32| {
        let a = done.attempt(n).unwrap();
        (a.provider.as_str().to_owned(), a.state, a.retry_of)
    };
    assert_eq!(
        (1..=3).map(summary_of).collect::<Vec<_>>(),
        [
            ("primary".to_owned(), AttemptState::Failed, None),
            ("primary".to_owned(), AttemptState::Failed, Some(1)),
            ("primary".to_owned(), AttemptState::Succeeded, Some(2)),
        ]
    );
    for n in [2, 3] {
        let (before, this) = (done.attempt(n - 1).unwrap(), done.attempt(n).unwrap());
        assert!(
            this.started_at.unwrap() >= before.finished_at.unwrap() + chrono::Duration::seconds(1),
            "attempt {n} started a second after attempt {} ended",
            n - 1
        );
    }
    assert_eq!(done.completed_by, Some(3));
    assert_eq!((primary.call_count(), fallback.call_count()), (3, 0));
    assert!(rig.no_message());
}

/// A cancelled attempt's late answer wins while the next attempt runs: that attempt's worker, timing out, makes it
/// `unknown` — a state the timeline draws — rather than leaving it `started` for ever.
pub async fn the_loser_of_a_race_won_by_a_cancelled_attempt_ends_unknown(store: Arc<dyn JobStore>) {
    let (first_gate, primary) = held().await;
    let second_gate = Gate::new();
    let fallback = StandIn::spawn(
        vec![Reply::Held(second_gate.clone())],
        Reply::Answer(summary("B")),
    )
    .await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, first) = rig.create("k").await;
    let a = rig.process_in_background(&first);
    primary.received(1).await;
    rig.cancel_attempt(&job, 1).await;
    let second = rig.next_message();
    let b = rig.process_in_background(&second);
    fallback.received(1).await;
    first_gate.open(summary("A"));
    assert_eq!(a.await.unwrap(), Processed::Succeeded);
    rig.advance(TIMEOUT_MS);
    let after = rig
        .until(&job, |j| state(j, 2) == AttemptState::Unknown)
        .await;
    assert_eq!(
        (after.status(), after.completed_by),
        (JobStatus::Succeeded, Some(1))
    );
    rig.advance(LATE_MS);
    assert_eq!(b.await.unwrap(), Processed::Unknown);
    second_gate.open(summary("B"));
    assert_eq!(state(&rig.job(&job).await, 2), AttemptState::Unknown);
}

/// A fallback that answers as another model than the one it was qualified as is no longer the qualified provider
/// (invariant 15: the model an answer reports is the provider's evidence, not an owner's input). Its answer does
/// not stand — failover went there because it was qualified — and its standing is void at once: the next job's
/// failover does not go there. The sweeper qualifies it again on the contract's samples, as the model it is now, and
/// failover goes there again.
pub async fn a_fallback_that_answers_as_another_model_loses_its_standing_at_once(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(vec![], Reply::Status(500, "down")).await;
    let fallback = answering("B").await;
    let mut rig = Rig::configured(
        store,
        openai(primary.base_url()),
        openai(fallback.base_url()),
        |config| config.requalify_stale = true,
    );
    // Qualified while it answered as another model than the one it reports now.
    record_qualified_as(
        &rig.engine,
        rig.store.as_ref(),
        "fallback",
        "stand-in-model-2025-01",
    )
    .await;
    let (job, first) = rig.create("first").await;
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let to_fallback = rig.next_message();
    assert_eq!(rig.process(&to_fallback).await, Processed::Failed);
    let failed = rig.job(&job).await;
    assert_eq!(failed.completed_by, None);
    let refused = failed.attempt(2).unwrap().error.clone().unwrap();
    assert_eq!(refused.code, "model_changed");
    assert!(refused.message.contains("stand-in-model"), "{refused:?}");
    assert_eq!(failed.error.as_ref().unwrap().code, "providers_exhausted");

    let summarize = |standings: Vec<(ProviderName, Vec<onejob::domain::ContractStanding>)>| {
        let (_, rows) = standings
            .into_iter()
            .find(|(name, _)| name.as_str() == "fallback")
            .unwrap();
        rows.into_iter()
            .find(|row| row.contract.to_string() == "summarize@1")
            .unwrap()
    };
    let row = summarize(rig.engine.standings().await.unwrap());
    assert_eq!(row.standing, onejob::domain::Standing::Unqualified);
    assert_eq!(row.reason.unwrap().code, "model_changed");
    let voided = row.evidence.as_ref().unwrap().suspected.clone().unwrap();
    assert_eq!(voided.reason.code, "model_changed");
    assert_eq!(voided.attempts, [format!("{}#2", job.id)]);

    let (second, message) = rig.create("second").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let stopped = rig.job(&second).await;
    assert_eq!(stopped.error.unwrap().code, "fallback_not_qualified");
    assert_eq!(stopped.attempts.len(), 1);
    assert_eq!(fallback.call_count(), 1);

    let swept = sweep(&rig.engine, None).await.unwrap();
    assert_eq!(swept.requalified, 1);
    let row = summarize(rig.engine.standings().await.unwrap());
    assert_eq!(row.standing, onejob::domain::Standing::Qualified);
    let evidence = row.evidence.unwrap();
    assert!(
        evidence.passed && evidence.suspected.is_none(),
        "{evidence:?}"
    );
    assert_eq!(
        evidence.models().into_iter().collect::<Vec<_>>(),
        ["stand-in-model"]
    );
    let (third, message) = rig.create("third").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let to_fallback = rig.next_message();
    assert_eq!(rig.process(&to_fallback).await, Processed::Succeeded);
    assert_eq!(rig.job(&third).await.completed_by, Some(2));
}

/// A worker reads a provider's clean breaker and its evidence once per `provider_state_cache_ms`, not for every
/// attempt; a failure is always counted on the stored breaker, and a breaker that is not clean is read for every
/// attempt until an answer has cleaned it.
pub async fn a_clean_breaker_and_evidence_are_read_once_per_window_and_a_failure_always_reads(
    store: Arc<dyn JobStore>,
) {
    let mut replies = vec![Reply::Answer(summary("A")); 3];
    replies.push(Reply::Status(500, "down"));
    let primary = StandIn::spawn(replies, Reply::Answer(summary("A"))).await;
    let fallback = answering("B").await;
    let faulty = FaultyStore::new(store, Vec::new());
    let mut rig = Rig::configured(
        faulty.clone(),
        openai(primary.base_url()),
        openai(fallback.base_url()),
        |config| config.provider_state_cache_ms = 60_000,
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "primary").await;
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let evidence_reads = faulty.calls(Call::Qualification);
    let before = (faulty.calls(Call::Breaker), faulty.calls(Call::PutBreaker));
    // Each job on the primary: what it came to, and the breaker's reads and writes so far.
    async fn run(
        rig: &mut Rig,
        faulty: &FaultyStore,
        key: &str,
        before: (usize, usize),
    ) -> (Processed, usize, usize) {
        let (_, message) = rig.create(key).await;
        let processed = rig.process(&message).await;
        let reads = faulty.calls(Call::Breaker) - before.0;
        (processed, reads, faulty.calls(Call::PutBreaker) - before.1)
    }
    // Three answers: the breaker is read once (clean: the answers change nothing), the evidence once.
    for n in 0..3 {
        let key = format!("ok-{n}");
        let done = run(&mut rig, &faulty, &key, before).await;
        assert_eq!(done, (Processed::Succeeded, 1, 0));
    }
    assert_eq!(faulty.calls(Call::Qualification) - evidence_reads, 1);
    // A failure reads the stored breaker and writes it; the next attempt reads it again (it is not clean), and
    // its answer cleans it (a read and a write); then the window holds again.
    let failed = run(&mut rig, &faulty, "down", before).await;
    assert_eq!(failed, (Processed::Failed, 2, 1));
    let _to_fallback = rig.next_message();
    let after = run(&mut rig, &faulty, "after", before).await;
    assert_eq!(after, (Processed::Succeeded, 4, 2));
    let again = run(&mut rig, &faulty, "again", before).await;
    assert_eq!(again, (Processed::Succeeded, 4, 2));
    assert_eq!(primary.call_count(), 6);
}

/// Two engines (two processes, two Lambdas) over one store share each provider's breaker: five definite failures
/// seen by one open it, so the other's next job skips the provider without a call (`breaker_open`) and fails over;
/// after the cooldown one call is the probe, and its answer closes the breaker for both.
pub async fn a_breaker_opened_by_five_failures_is_shared_and_probed_after_its_cooldown(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(
        vec![Reply::Status(500, "down"); 5],
        Reply::Answer(summary("A")),
    )
    .await;
    let fallback = answering("B").await;
    let mut one = rig(store.clone(), &primary, &fallback).await;
    let mut two = rig(store.clone(), &primary, &fallback).await;
    let name = ProviderName::parse("primary").unwrap();
    for n in 0..5 {
        let (_, message) = one.create(&format!("failing-{n}")).await;
        assert_eq!(one.process(&message).await, Processed::Failed);
        let _to_fallback = one.next_message();
    }
    assert_eq!(primary.call_count(), 5);
    let (breaker, _) = store.breaker(&name).await.unwrap();
    assert_eq!(breaker.trips, 1);
    assert!(breaker.open_until.is_some());

    // The other engine's next job: no call to the open provider; failover to the qualified fallback.
    let (skipped, message) = two.create("skipped").await;
    assert_eq!(two.process(&message).await, Processed::Failed);
    let after = two.job(&skipped).await;
    let error = after.attempt(1).unwrap().error.clone().unwrap();
    assert_eq!(error.code, "breaker_open");
    assert_eq!(after.attempt(2).unwrap().provider.as_str(), "fallback");
    assert_eq!(primary.call_count(), 5);
    let to_fallback = two.next_message();
    assert_eq!(two.process(&to_fallback).await, Processed::Succeeded);

    // The cooldown passes (on both engines' clocks): one call is the probe; it answers, and the breaker closes.
    one.advance(30_000);
    two.advance(30_000);
    let (probed, message) = two.create("probe").await;
    assert_eq!(two.process(&message).await, Processed::Succeeded);
    assert_eq!(two.job(&probed).await.completed_by, Some(1));
    assert_eq!(primary.call_count(), 6);
    let (breaker, _) = store.breaker(&name).await.unwrap();
    assert_eq!((breaker.open_until, breaker.failures.len()), (None, 0));
    let (closed, message) = one.create("closed").await;
    assert_eq!(one.process(&message).await, Processed::Succeeded);
    assert_eq!(one.job(&closed).await.completed_by, Some(1));
    assert_eq!(primary.call_count(), 7);
}

/// A sweep's batch in the batch-after-batch tests: more than the deliveries tried side by side (16), so a batch of
/// deliveries is two rounds of tries in the time the sweeper gives it.
const SMALL_BATCH: usize = 20;

/// More settled jobs than a sweep's batch: the scheduled sweeper's delivery goes on a batch at a time until none is
/// due, each event once; with no time left for a second batch, it stops after the first.
pub async fn the_sweeper_delivers_batch_after_batch_until_none_is_due(store: Arc<dyn JobStore>) {
    let receiver = answering("heard").await;
    let unused = answering("B").await;
    let rig = Rig::configured(
        store,
        openai(unused.base_url()),
        openai(unused.base_url()),
        |config| config.allow_private_endpoints = true,
    )
    .sweeping(SMALL_BATCH);
    let owner = onejob::domain::Owner::parse("alice").unwrap();
    let url = format!("{}/chat/completions", receiver.base_url());
    let url = rig.engine.check_endpoint(&url).await.unwrap();
    rig.engine.put_endpoint(&owner, url).await.unwrap();
    let batch = rig.engine.settings.sweep_batch;
    let jobs = 2 * batch + batch / 2;
    for i in 0..jobs {
        let job = rig.engine.create_job(rig.intent(&format!("k{i}"))).await;
        let job = job.unwrap().job().clone();
        (rig.engine)
            .cancel_job(&Actor::Owner(owner.clone()), &job.id, None)
            .await
            .unwrap();
    }
    let engine = &rig.engine;
    let delivered =
        |deadline| async move { sweep(engine, Some(deadline)).await.unwrap().delivered };
    let now = rig.clock.now();
    assert_eq!(delivered(now).await, batch);
    // Time for more: the next full batch and the half one after it.
    let later = now + chrono::Duration::hours(1);
    assert_eq!(delivered(later).await, jobs - batch);
    assert_eq!(delivered(later).await, 0);
    let ids: std::collections::BTreeSet<String> = receiver
        .calls()
        .iter()
        .map(|c| c.body["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!((receiver.call_count(), ids.len()), (jobs, jobs));
}

/// More expired leases and unclaimed attempts than a sweep's batch (a provider that hung with every attempt in
/// flight, dispatches lost): the scheduled sweeper goes on a batch at a time until none is left, each attempt once;
/// with no time left for a second batch, it stops after the first.
pub async fn the_sweeper_expires_and_dispatches_again_batch_after_batch(store: Arc<dyn JobStore>) {
    let unused = answering("A").await;
    let mut rig =
        Rig::new(store, openai(unused.base_url()), openai(unused.base_url())).sweeping(SMALL_BATCH);
    let batch = rig.engine.settings.sweep_batch;
    let each = 2 * batch + batch / 2;
    let now = rig.clock.now();
    let mut hung = Vec::new();
    let mut lost = std::collections::BTreeSet::new();
    for i in 0..each {
        let (job, message) = rig.create(&format!("hung-{i}")).await;
        let lease = now + rig.engine.lease();
        let stamp = onejob::domain::Stamp::fresh(now);
        let claim = rig
            .store
            .claim_attempt(&job.id, message.number, lease, &stamp);
        claim.await.unwrap();
        hung.push(job);
        let (job, _) = rig.create(&format!("lost-{i}")).await;
        lost.insert(job.id);
    }
    rig.advance(rig.engine.lease().num_milliseconds() as u64 + 1);

    let deadline = rig.clock.now();
    let first = sweep(&rig.engine, Some(deadline)).await.unwrap();
    assert_eq!((first.expired, first.redispatched), (batch, batch));
    let later = deadline + chrono::Duration::hours(1);
    let rest = sweep(&rig.engine, Some(later)).await.unwrap();
    assert_eq!(
        (rest.expired, rest.redispatched),
        (each - batch, each - batch)
    );
    let after = sweep(&rig.engine, Some(later)).await.unwrap();
    assert_eq!((after.expired, after.redispatched), (0, 0));

    for job in &hung {
        assert_eq!(state(&rig.job(job).await, 1), AttemptState::Unknown);
    }
    let sent: std::collections::BTreeSet<_> =
        (0..each).map(|_| rig.next_message().job_id).collect();
    assert_eq!(sent, lost, "each lost dispatch sent again, once");
    assert!(rig.no_message());
}
