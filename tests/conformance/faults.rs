//! onejob's own faults (invariant 11), on every store: each write the engine makes, failing before it reaches the
//! store and landing with its answer lost, through the engine and the worker step as they run. Each case asserts
//! what the product promises: one job and one `Created` per key, one provider call per attempt, every answer that
//! reached the worker in the store, and the follow-up (a dispatch) at once rather than at the next sweep.

mod advisory;
pub(crate) use advisory::*;

use std::future::Future;
use std::sync::Arc;

use onejob::clock::Clock;
use onejob::domain::{
    AttemptRef, AttemptState, Endpoint, Fingerprint, Job, JobStatus, ProviderName,
};
use onejob::engine::Actor;
use onejob::queue::Message;
use onejob::store::{CallSlot, CreateOutcome, EventStore, JobStore, ListQuery, StoreError};
use onejob::worker::sweeper::sweep;
use onejob::worker::{Processed, process_attempt, process_message};
use serde_json::{Value, json};

use crate::support::faulty::{Call, Fault, FaultyStore};
use crate::support::record_qualified;
use crate::support::rig::Rig;
use crate::support::stand_in::{Reply, StandIn, openai, resetting};

const FAULTS: [Fault; 2] = [Fault::Before, Fault::After];

fn summary(text: &str) -> Value {
    json!({"summary": text})
}

fn state(job: &Job, number: u32) -> AttemptState {
    job.attempt(number).unwrap().state
}

/// A rig on `store` behind a [`FaultyStore`], with these providers; `fallback` qualified if `qualified`.
async fn rig(
    store: Arc<dyn JobStore>,
    primary: String,
    fallback: String,
    qualified: bool,
) -> (Arc<FaultyStore>, Rig) {
    let faulty = FaultyStore::new(store, Vec::new());
    let rig = Rig::new(faulty.clone(), openai(primary), openai(fallback));
    if qualified {
        record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    }
    (faulty, rig)
}

/// Creates the job under `key`.
async fn create(rig: &mut Rig, key: &str) -> Job {
    let (job, _) = rig.create(key).await;
    job
}

fn fallback_provider() -> ProviderName {
    ProviderName::parse("fallback").unwrap()
}

/// A create that fails on either side of its write is still `Created` (one per key), and its attempt is dispatched
/// at once and runs once.
pub(crate) async fn a_create_that_fails_either_side_of_its_write_is_created_once(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        faulty.plan(&[(Call::Create, fault)]);
        let intent = rig.intent(&format!("create-{i}"));
        let outcome = rig.engine.create_job(intent.clone()).await.unwrap();
        let CreateOutcome::Created(job) = outcome else {
            panic!("{fault:?}: the create's own job, found by its repeat, is Created: {outcome:?}")
        };
        assert!(faulty.spent());
        let message = rig.next_message();
        assert_eq!(
            rig.process(&message).await,
            Processed::Succeeded,
            "{fault:?}"
        );
        assert_eq!(primary.call_count(), i + 1, "{fault:?}: one call");
        let again = rig.engine.create_job(intent.clone()).await.unwrap();
        assert!(matches!(again, CreateOutcome::Replayed(_)), "{fault:?}");
        assert!(rig.no_message());
        let query = ListQuery {
            status: None,
            limit: 100,
            cursor: None,
            created_before: None,
        };
        let page = rig.engine.list_jobs(&intent.owner, &query).await.unwrap();
        let mine: Vec<&Job> = page
            .jobs
            .iter()
            .filter(|j| j.idempotency_key == intent.idempotency_key)
            .collect();
        assert_eq!(mine.len(), 1, "{fault:?}: one job for one intent");
        assert_eq!(mine[0].id, job.id);
        assert_eq!(mine[0].result, Some(summary("A")));
    }
    assert_eq!(rig.metric("onejob_store_retries_total", &[]), 2.0);
}

/// Duplicates of an intent whose create is being written in this process wait for that write instead of writing
/// too: held in its backoff after a lost answer and a failure, the first create ends `Created`, the duplicates
/// answer from its job once it is committed (the same intent a replay, another input a conflict), and the store
/// saw the first create's three tries and nothing else.
pub(crate) async fn duplicates_of_a_create_in_flight_answer_from_its_write_without_writing(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    faulty.plan(&[(Call::Create, Fault::After), (Call::Create, Fault::Before)]);
    let intent = rig.intent("in-flight");
    let first = tokio::spawn({
        let (engine, intent) = (rig.engine.clone(), intent.clone());
        async move { engine.create_job(intent).await }
    });
    let started = std::time::Instant::now();
    while !(faulty.spent() && rig.clock.sleepers() > 0) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the create never waits in its backoff"
        );
        tokio::task::yield_now().await;
    }
    let mut other = intent.clone();
    other.fingerprint = Fingerprint::of_intent("summarize@1", &json!({"text": "another"}), None);
    let mut duplicates: Vec<_> = [intent.clone(), intent.clone(), other]
        .into_iter()
        .map(|new| Box::pin(rig.engine.create_job(new)))
        .collect();
    // Each duplicate runs until it waits (for the first create's write).
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for duplicate in &mut duplicates {
        assert!(duplicate.as_mut().poll(&mut cx).is_pending());
    }
    rig.advance(2_000);
    let CreateOutcome::Created(job) = first.await.unwrap().unwrap() else {
        panic!("the first create's repeat finds its own job: Created")
    };
    let mut answers = Vec::new();
    for duplicate in duplicates {
        answers.push(duplicate.await.unwrap());
    }
    assert!(matches!(&answers[0], CreateOutcome::Replayed(j) if j.id == job.id));
    assert!(matches!(&answers[1], CreateOutcome::Replayed(j) if j.id == job.id));
    assert!(matches!(&answers[2], CreateOutcome::Conflict(j) if j.id == job.id));
    assert_eq!(
        faulty.calls(Call::Create),
        3,
        "the duplicates wrote nothing"
    );
    // The intent is free again: a later duplicate reads the store itself.
    let later = rig.engine.create_job(intent).await.unwrap();
    assert!(matches!(later, CreateOutcome::Replayed(j) if j.id == job.id));
    assert_eq!(faulty.calls(Call::Create), 4);
}

/// A claim that fails on either side of its write is still this step's: the provider is called once, and a
/// redelivered message (a new step) is dropped.
pub(crate) async fn a_claim_that_fails_either_side_of_its_write_calls_the_provider_once(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        let (job, message) = rig.create(&format!("claim-{i}")).await;
        faulty.plan(&[(Call::Claim, fault)]);
        assert_eq!(
            rig.process(&message).await,
            Processed::Succeeded,
            "{fault:?}"
        );
        assert!(faulty.spent());
        assert_eq!(
            rig.process(&message).await,
            Processed::Dropped,
            "a redelivery"
        );
        assert_eq!(primary.call_count(), i + 1, "{fault:?}: one call");
        let done = rig.job(&job).await;
        assert_eq!(
            (done.status(), done.result),
            (JobStatus::Succeeded, Some(summary("A")))
        );
    }
}

/// A completion that fails on either side of its write keeps the answer: it is in the store, once.
pub(crate) async fn a_completion_that_fails_either_side_of_its_write_keeps_the_answer(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        let (job, message) = rig.create(&format!("complete-{i}")).await;
        faulty.plan(&[(Call::Complete, fault)]);
        assert_eq!(
            rig.process(&message).await,
            Processed::Succeeded,
            "{fault:?}"
        );
        assert!(faulty.spent());
        let done = rig.job(&job).await;
        assert_eq!(
            (done.completed_by, done.result.clone(), done.version),
            (Some(1), Some(summary("A")), 1),
            "{fault:?}"
        );
        assert_eq!(state(&done, 1), AttemptState::Succeeded);
        assert_eq!(primary.call_count(), i + 1);
    }
}

/// A failure that fails on either side of its write (or whose qualification read fails) is recorded once, and its
/// failover attempt is dispatched at once, not by the sweeper.
pub(crate) async fn a_failure_that_fails_either_side_of_its_write_fails_over_at_once(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(vec![], Reply::Status(403, "upstream exploded")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    let plans = [
        vec![(Call::Fail, Fault::Before)],
        vec![(Call::Fail, Fault::After)],
        vec![(Call::Qualification, Fault::Before)],
    ];
    for (i, plan) in plans.iter().enumerate() {
        let (job, first) = rig.create(&format!("fail-{i}")).await;
        faulty.plan(plan);
        assert_eq!(rig.process(&first).await, Processed::Failed, "{plan:?}");
        assert!(faulty.spent());
        let second = rig.next_message();
        assert_eq!(second.number, 2, "{plan:?}: dispatched at once");
        assert_eq!(rig.process(&second).await, Processed::Succeeded);
        let done = rig.job(&job).await;
        assert_eq!(done.attempts.len(), 2, "{plan:?}: one failover attempt");
        assert_eq!(
            done.attempt(1).unwrap().error.as_ref().unwrap().code,
            "provider_refused"
        );
        assert_eq!(
            (done.completed_by, done.result),
            (Some(2), Some(summary("B")))
        );
        assert_eq!(
            (primary.call_count(), fallback.call_count()),
            (i + 1, i + 1)
        );
    }
}

/// A time-out whose write fails on either side of it still makes the attempt `unknown` — a lost connection here.
pub(crate) async fn a_time_out_that_fails_either_side_of_its_write_is_unknown(
    store: Arc<dyn JobStore>,
) {
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, resetting().await, fallback.base_url(), true).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        let (job, message) = rig.create(&format!("unknown-{i}")).await;
        faulty.plan(&[(Call::MarkUnknown, fault)]);
        assert_eq!(rig.process(&message).await, Processed::Unknown, "{fault:?}");
        assert!(faulty.spent());
        let after = rig.job(&job).await;
        assert_eq!(
            (after.status(), state(&after, 1)),
            (JobStatus::Unknown, AttemptState::Unknown)
        );
        assert!(rig.no_message(), "an unknown attempt never fails over");
    }
    assert_eq!(fallback.call_count(), 0);
}

/// An attempt cancel that fails on either side of its write answers the job (not 409 for its own success), and its
/// failover attempt is dispatched at once.
pub(crate) async fn an_attempt_cancel_that_fails_either_side_of_its_write_fails_over_at_once(
    store: Arc<dyn JobStore>,
) {
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, resetting().await, fallback.base_url(), true).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        let (job, message) = rig.create(&format!("cancel-attempt-{i}")).await;
        assert_eq!(rig.process(&message).await, Processed::Unknown);
        faulty.plan(&[(Call::CancelAttempt, fault)]);
        let cancelled = rig
            .engine
            .cancel_attempt(&Actor::Owner(job.owner.clone()), &job.id, 1, None)
            .await
            .unwrap();
        assert!(faulty.spent());
        assert_eq!(state(&cancelled, 1), AttemptState::Cancelled, "{fault:?}");
        assert_eq!(state(&cancelled, 2), AttemptState::Queued);
        let second = rig.next_message();
        assert_eq!(second.number, 2, "{fault:?}: dispatched at once");
        assert_eq!(rig.process(&second).await, Processed::Succeeded);
        assert_eq!(fallback.call_count(), i + 1);
    }
}

/// A manual retry that fails on either side of its write answers its attempt (not 409 for its own success, nor a
/// replay under its key), adds one attempt, and dispatches it at once.
pub(crate) async fn a_manual_retry_that_fails_either_side_of_its_write_adds_one_attempt(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(vec![], Reply::Status(403, "upstream exploded")).await;
    let fallback = StandIn::answering(summary("B")).await;
    // The fallback is not qualified: the job fails, and a person retries it there by hand.
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), false).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        let (job, first) = rig.create(&format!("retry-{i}")).await;
        assert_eq!(rig.process(&first).await, Processed::Failed);
        assert!(rig.no_message());
        faulty.plan(&[(Call::AddAttempt, fault)]);
        let key = onejob::domain::IdempotencyKey::parse(&format!("retry-click-{i}")).unwrap();
        let added = rig
            .engine
            .add_attempt(
                &Actor::Owner(job.owner.clone()),
                &job.id,
                Some(fallback_provider()),
                Some(&key),
            )
            .await
            .unwrap();
        assert!(faulty.spent());
        assert!(!added.replayed, "{fault:?}: its own write, not a replay");
        assert_eq!(
            (added.number, added.job.attempts.len()),
            (2, 2),
            "{fault:?}"
        );
        let second = rig.next_message();
        assert_eq!(second.number, 2, "{fault:?}: dispatched at once");
        assert_eq!(rig.process(&second).await, Processed::Succeeded);
        assert_eq!(rig.job(&job).await.attempts.len(), 2);
    }
}

/// A job cancel that fails on either side of its write answers the cancelled job.
pub(crate) async fn a_job_cancel_that_fails_either_side_of_its_write_cancels(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        let job = create(&mut rig, &format!("cancel-job-{i}")).await;
        faulty.plan(&[(Call::CancelJob, fault)]);
        let cancelled = rig
            .engine
            .cancel_job(&Actor::Owner(job.owner.clone()), &job.id, None)
            .await
            .unwrap();
        assert!(faulty.spent());
        assert_eq!(cancelled.status(), JobStatus::Cancelled, "{fault:?}");
        assert_eq!(rig.job(&job).await.status(), JobStatus::Cancelled);
    }
}

/// A re-dispatch whose record fails on either side of its write still sends the lost attempt, once; the next
/// sweep does not send it again before its turn.
pub(crate) async fn a_redispatch_that_fails_either_side_of_its_write_sends_the_attempt_once(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    for (i, fault) in FAULTS.into_iter().enumerate() {
        // The message is lost.
        let (job, _) = rig.create(&format!("lost-{i}")).await;
        rig.advance(30_001);
        faulty.plan(&[(Call::Redispatch, fault)]);
        let swept = sweep(&rig.engine, None).await.unwrap();
        assert!(faulty.spent());
        assert_eq!(swept.redispatched, 1, "{fault:?}");
        let again = sweep(&rig.engine, None).await.unwrap();
        assert_eq!(again.redispatched, 0, "{fault:?}: not before its turn");
        let message = rig.next_message();
        assert!(rig.no_message(), "{fault:?}: sent once");
        assert_eq!(rig.process(&message).await, Processed::Succeeded);
        assert_eq!(rig.job(&job).await.status(), JobStatus::Succeeded);
    }
}

/// Through a store outage the worker keeps the answer it holds, trying again with backoff; it is written once
/// the store is back. One provider call.
pub(crate) async fn an_answer_is_written_through_a_store_outage(store: Arc<dyn JobStore>) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    let (job, message) = rig.create("outage").await;
    faulty.plan(&[(Call::Complete, Fault::Before); 6]);
    let engine = rig.engine.clone();
    let step = tokio::spawn(async move { process_attempt(&engine, &message).await });
    // Each backoff waits on the clock: move it whenever the step sleeps, until the step is done.
    rig.drive_backoff(&faulty, 2_000, Call::Complete, &step)
        .await;
    assert_eq!(step.await.unwrap().unwrap(), Processed::Succeeded);
    assert!(faulty.spent());
    assert_eq!(faulty.calls(Call::Complete), 7);
    let done = rig.job(&job).await;
    assert_eq!(
        (done.completed_by, done.result),
        (Some(1), Some(summary("A")))
    );
    assert_eq!(primary.call_count(), 1);
}

/// Past its budget a worker gives the answer up (logged at ERROR, whole) and reports the store's failure: the
/// message comes back, the redelivery is refused, and the attempt stays `started` until the sweeper makes it
/// `unknown`. Never a second paid call.
pub(crate) async fn an_answer_the_store_never_takes_is_given_up_after_the_budget(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    let (job, message) = rig.create("down").await;
    faulty.plan(&[(Call::Complete, Fault::Before); 10_000]);
    let engine = rig.engine.clone();
    let redelivered = message.clone();
    let step = tokio::spawn(async move { process_attempt(&engine, &message).await });
    rig.drive_backoff(&faulty, 2_000, Call::Complete, &step)
        .await;
    let outcome = step.await.unwrap();
    assert!(
        matches!(outcome, Err(StoreError::Backend(_))),
        "{outcome:?}"
    );
    let tries = faulty.calls(Call::Complete);
    assert!(tries > 10, "tried again through the budget: {tries}");
    assert_eq!(state(&rig.job(&job).await, 1), AttemptState::Started);
    assert_eq!(rig.process(&redelivered).await, Processed::Dropped);
    assert_eq!(primary.call_count(), 1, "no second paid call");
    rig.advance(rig.engine.lease().num_milliseconds() as u64);
    assert_eq!(sweep(&rig.engine, None).await.unwrap().expired, 1);
    assert_eq!(state(&rig.job(&job).await, 1), AttemptState::Unknown);
}

/// The answer is written, and the store will not arm its job's completion event through a write's budget: the step
/// fails (the answer stays written), its message comes back, and the redelivery, whose claim is refused, arms the
/// event. One provider call.
pub(crate) async fn an_event_the_store_would_not_arm_is_armed_by_the_redelivery(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    let (job, message) = rig.create("unarmed").await;
    let endpoint = Endpoint::new("https://hooks.example.com/".into(), rig.clock.now());
    faulty
        .put_endpoint(&job.owner, Some(&endpoint))
        .await
        .unwrap();
    faulty.plan(&[(Call::ArmDeliveries, Fault::Before); 10_000]);
    let engine = rig.engine.clone();
    let redelivered = message.clone();
    let step = tokio::spawn(async move { process_attempt(&engine, &message).await });
    rig.drive_backoff(&faulty, 2_000, Call::ArmDeliveries, &step)
        .await;
    let outcome = step.await.unwrap();
    assert!(
        matches!(outcome, Err(StoreError::Backend(_))),
        "{outcome:?}"
    );
    let done = rig.job(&job).await;
    assert_eq!(done.result, Some(summary("A")), "the answer stays written");

    faulty.clear();
    assert_eq!(rig.process(&redelivered).await, Processed::Dropped);
    let (armed, _) = faulty
        .deliveries(&job.id)
        .await
        .unwrap()
        .expect("armed by the redelivery");
    assert_eq!(armed.due_at, done.settles_at());
    assert_eq!(primary.call_count(), 1, "no second paid call");
}
