//! The engine on a store: the worker step, the sweeper and failover, driven by hand against provider stand-ins
//! (real HTTP servers on loopback) with a manual clock. Every backend runs these cases too.

mod standing;
mod sweeper;
mod waits;
pub(crate) use standing::*;
pub(crate) use sweeper::*;
pub(crate) use waits::*;

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
pub(crate) async fn a_timeout_is_unknown_and_blocks_new_attempts(store: Arc<dyn JobStore>) {
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
pub(crate) async fn the_attempt_that_answers_first_wins_the_race(store: Arc<dyn JobStore>) {
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
pub(crate) async fn a_duplicate_delivery_makes_one_provider_call(store: Arc<dyn JobStore>) {
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

pub(crate) async fn a_late_result_after_a_job_cancel_is_discarded(store: Arc<dyn JobStore>) {
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

pub(crate) async fn a_late_answer_after_the_timeout_wins_a_free_slot(store: Arc<dyn JobStore>) {
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

/// A definite failure (the provider refused the call: its key, here) fails over to the qualified fallback.
pub(crate) async fn a_definite_failure_fails_over_to_the_fallback(store: Arc<dyn JobStore>) {
    let primary = StandIn::spawn(vec![], Reply::Status(403, "upstream exploded")).await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, first) = rig.create("k").await;
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let failed = rig.job(&job).await;
    let error = failed.attempt(1).unwrap().error.clone().unwrap();
    assert_eq!(error.code, "provider_refused");
    assert!(error.message.contains("403"), "{}", error.message);
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
pub(crate) async fn an_output_that_breaks_the_contract_fails_and_an_unqualified_fallback_gets_nothing(
    store: Arc<dyn JobStore>,
) {
    let extra_key = json!({"summary": "fine", "confidence": 0.9});
    an_answer_that_fails_the_attempt(store, extra_key, "output_invalid").await;
}

/// A result too large to keep fails its attempt with a clear code.
pub(crate) async fn a_result_too_large_to_keep_fails_the_attempt(store: Arc<dyn JobStore>) {
    let huge = summary(&"x".repeat(onejob::providers::checks::MAX_RESULT_BYTES));
    an_answer_that_fails_the_attempt(store, huge, "result_too_large").await;
}

/// Invariant 5: a connection lost after the request was sent is `unknown`; one refused before is `failed`.
pub(crate) async fn a_lost_connection_is_unknown_and_a_refused_one_is_failed(
    store: Arc<dyn JobStore>,
) {
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
pub(crate) async fn the_provider_call_carries_the_attempt_key_and_the_contract(
    store: Arc<dyn JobStore>,
) {
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
pub(crate) async fn the_sweeper_resolves_expired_leases_and_lost_messages(
    store: Arc<dyn JobStore>,
) {
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

/// A cancelled attempt's late answer wins while the next attempt runs: that attempt's worker, timing out, makes it
/// `unknown` — a state the timeline draws — rather than leaving it `started` for ever.
pub(crate) async fn the_loser_of_a_race_won_by_a_cancelled_attempt_ends_unknown(
    store: Arc<dyn JobStore>,
) {
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

/// A sweep's batch in the batch-after-batch tests: more than the deliveries tried side by side (16), so a batch of
/// deliveries is two rounds of tries in the time the sweeper gives it.
const SMALL_BATCH: usize = 20;
