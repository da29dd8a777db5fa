//! The promise kept in the features added last (invariants 14–16), on every store: one settle makes one event id
//! whatever its orphaned attempts do; a breaker or a standing moves only on evidence no owner's inputs make; an
//! answer the worker holds is written first and heard while its time-out is written; a job waiting on a breaker is
//! not charged a try; a cancelled attempt's answer is in time by when it came.

mod batches;
mod providers;
mod reconcile;
pub(crate) use batches::*;
pub(crate) use providers::*;
pub(crate) use reconcile::*;

use std::collections::BTreeSet;
use std::sync::Arc;

use onejob::clock::Clock;
use onejob::domain::{
    AttemptState, Breaker, ErrorInfo, Job, JobStatus, Owner, ProviderName, Standing,
};
use onejob::store::JobStore;
use onejob::worker::Processed;
use onejob::worker::sweeper::sweep;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::support::faulty::{Call, Fault, FaultyStore};
use crate::support::record_qualified;
use crate::support::rig::Rig;
use crate::support::stand_in::{Gate, LATE_MS, Reply, StandIn, TIMEOUT_MS, openai};

fn summary(text: &str) -> Value {
    json!({"summary": text})
}

/// A stand-in that holds each call until its gate opens.
async fn held_twice() -> (Gate, Gate, StandIn) {
    let (first, second) = (Gate::new(), Gate::new());
    let stand_in = StandIn::spawn(
        vec![Reply::Held(first.clone()), Reply::Held(second.clone())],
        Reply::Answer(summary("unused")),
    )
    .await;
    (first, second, stand_in)
}

/// Invariant 14. Attempt 1 is cancelled by hand while it runs, attempt 2 (the failover) is claimed, then attempt
/// 1's late answer wins: the job succeeds, and its event goes out. Attempt 2, orphaned, then times out and is
/// cancelled by hand: neither write settles the job again, so the endpoint hears one event id, once.
pub(crate) async fn one_settle_is_one_event_whatever_its_orphan_does(store: Arc<dyn JobStore>) {
    let receiver = StandIn::answering(summary("heard")).await;
    let (first, _, primary) = held_twice().await;
    let (_, orphan, fallback) = held_twice().await;
    let mut rig = Rig::configured(
        store,
        openai(primary.base_url()),
        openai(fallback.base_url()),
        |config| config.allow_private_endpoints = true,
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let owner = Owner::parse("alice").unwrap();
    let url = format!("{}/chat/completions", receiver.base_url());
    let url = rig.engine.check_endpoint(&url).await.unwrap();
    rig.engine.put_endpoint(&owner, url).await.unwrap();

    let (job, message) = rig.create("orphan").await;
    let one = rig.process_in_background(&message);
    primary.received(1).await;
    rig.cancel_attempt(&job, 1).await;
    let to_fallback = rig.next_message();
    let two = rig.process_in_background(&to_fallback);
    fallback.received(1).await;
    first.open(summary("A, late"));
    assert_eq!(one.await.unwrap(), Processed::Succeeded);
    let won = rig.job(&job).await;
    assert_eq!(
        (
            won.status(),
            won.completed_by,
            won.attempt(2).unwrap().state
        ),
        (JobStatus::Succeeded, Some(1), AttemptState::Started)
    );
    assert_eq!(rig.engine.deliver_due().await.unwrap(), 1);

    // The orphan times out (its late window passes with nothing), then is cancelled by hand.
    rig.advance(TIMEOUT_MS);
    rig.until(&job, |j| {
        j.attempt(2).unwrap().state == AttemptState::Unknown
    })
    .await;
    assert_eq!(rig.engine.deliver_due().await.unwrap(), 0);
    rig.advance(LATE_MS);
    assert_eq!(two.await.unwrap(), Processed::Unknown);
    rig.cancel_attempt(&job, 2).await;
    orphan.open(summary("B, later still"));
    rig.advance(60_000);
    assert_eq!(rig.engine.deliver_due().await.unwrap(), 0);
    let ids: BTreeSet<String> = receiver
        .calls()
        .iter()
        .map(|c| c.body["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!((receiver.call_count(), ids.len()), (1, 1), "{ids:?}");
    assert_eq!(
        receiver.calls()[0].body["job"]["status"],
        "succeeded",
        "the settle's own status"
    );
}

/// Invariant 16: after the timeout the step writes the attempt `unknown` while it goes on listening. A store
/// that stalls that write (a held write lock, a throttled table) never keeps the answer that comes meanwhile from
/// being heard and written.
pub(crate) async fn an_answer_that_comes_while_the_time_out_write_stalls_is_kept(
    store: Arc<dyn JobStore>,
) {
    let (gate, _, primary) = held_twice().await;
    let unused = StandIn::answering(summary("B")).await;
    let faulty = FaultyStore::new(store, vec![(Call::MarkUnknown, Fault::Stall)]);
    let mut rig = Rig::new(
        faulty.clone(),
        openai(primary.base_url()),
        openai(unused.base_url()),
    );
    let (job, message) = rig.create("stalled").await;
    let step = rig.process_in_background(&message);
    primary.received(1).await;
    rig.advance(TIMEOUT_MS);
    faulty.made(Call::MarkUnknown, 1).await;
    gate.open(summary("A, while the store stalls"));
    assert_eq!(step.await.unwrap(), Processed::Succeeded);
    faulty.release();
    let done = rig
        .until(&job, |j| j.status() == JobStatus::Succeeded)
        .await;
    assert_eq!(done.result, Some(summary("A, while the store stalls")));
    assert_eq!(primary.call_count(), 1);
}

/// Invariant 16: a provider's breaker and its evidence are advisory, read and written after the answer: with
/// either stalled, the answer (a result, a failure and its failover) is already in the store.
pub(crate) async fn the_answer_is_written_before_the_breaker_and_the_evidence(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(
        vec![Reply::Answer(summary("A"))],
        Reply::Status(403, "down"),
    )
    .await;
    let fallback = StandIn::answering(summary("B")).await;
    // The first breaker read (the admission) passes; the evidence read after the answer stalls.
    let faulty = FaultyStore::new(store, vec![(Call::Qualification, Fault::Stall)]);
    let mut rig = Rig::new(
        faulty.clone(),
        openai(primary.base_url()),
        openai(fallback.base_url()),
    );
    let (job, message) = rig.create("answered").await;
    let step = rig.process_in_background(&message);
    rig.until(&job, |j| j.status() == JobStatus::Succeeded)
        .await;
    faulty.made(Call::Qualification, 1).await;
    assert!(!step.is_finished(), "still stalled on the evidence");
    faulty.release();
    assert_eq!(step.await.unwrap(), Processed::Succeeded);

    // A failure is counted on the stored breaker: with that write stalled, the failure and its failover are
    // written.
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let breaker_writes = faulty.calls(Call::PutBreaker);
    faulty.plan(&[(Call::PutBreaker, Fault::Stall)]);
    let (job, message) = rig.create("failed").await;
    let step = rig.process_in_background(&message);
    let failed = rig
        .until(&job, |j| {
            j.attempts.len() == 2 && j.attempt(1).unwrap().state == AttemptState::Failed
        })
        .await;
    assert_eq!(failed.attempt(2).unwrap().provider.as_str(), "fallback");
    faulty.made(Call::PutBreaker, breaker_writes + 1).await;
    assert!(!step.is_finished(), "still stalled on the breaker");
    faulty.release();
    assert_eq!(step.await.unwrap(), Processed::Failed);
}

/// A job under `key` whose attempt 1 is cancelled while its provider holds the call (no qualified fallback: the job
/// fails at once), and the step still listening; the job as created and as the cancel left it.
async fn cancelled_mid_call(
    rig: &mut Rig,
    primary: &StandIn,
    key: &str,
) -> (Job, Job, JoinHandle<Processed>) {
    let (job, message) = rig.create(key).await;
    let step = rig.process_in_background(&message);
    primary.received(1).await;
    let cancelled = rig.cancel_attempt(&job, 1).await;
    assert_eq!(
        cancelled.status(),
        JobStatus::Failed,
        "no qualified fallback"
    );
    (job, cancelled, step)
}

/// A cancelled attempt's answer that came before its lease ended wins a free slot, even when the store took its
/// write only after the lease: it is judged by when it came, not by when its write landed.
pub(crate) async fn a_cancelled_attempts_answer_is_in_time_by_when_it_came(
    store: Arc<dyn JobStore>,
) {
    let (gate, _, primary) = held_twice().await;
    let unused = StandIn::answering(summary("B")).await;
    let faulty = FaultyStore::new(store, Vec::new());
    let mut rig = Rig::new(
        faulty.clone(),
        openai(primary.base_url()),
        openai(unused.base_url()),
    );
    let (job, _, step) = cancelled_mid_call(&mut rig, &primary, "cancelled").await;
    faulty.plan(&[
        (Call::Complete, Fault::Before),
        (Call::Complete, Fault::Before),
    ]);
    let completes = faulty.calls(Call::Complete);
    gate.open(summary("A, in time"));
    faulty.made(Call::Complete, completes + 2).await;
    // The store is back only after the lease has ended: the step's backoff is woken a lease later.
    let lease = rig.engine.lease().num_milliseconds() as u64;
    rig.drive_backoff(&faulty, lease, Call::Complete, &step)
        .await;
    assert_eq!(step.await.unwrap(), Processed::Succeeded);
    let done = rig.job(&job).await;
    assert_eq!(
        (done.status(), done.completed_by),
        (JobStatus::Succeeded, Some(1))
    );
    assert!(rig.no_message());
}

/// Found by the model checker (core/tests/protocol): a cancelled attempt whose provider answers after all with an
/// answer that breaks the contract was dropped — and with it the call's usage, which was paid for. It is kept on
/// the attempt, which stays cancelled; the job, its settle and its event stay as they were, and the bill counts
/// the call.
pub(crate) async fn a_cancelled_attempts_late_failure_is_kept_and_settles_nothing(
    store: Arc<dyn JobStore>,
) {
    let (gate, _, primary) = held_twice().await;
    let unused = StandIn::answering(summary("B")).await;
    let mut rig = Rig::new(store, openai(primary.base_url()), openai(unused.base_url()));
    let (job, cancelled, step) = cancelled_mid_call(&mut rig, &primary, "late-failure").await;
    let settles_at = cancelled.settles_at();
    gate.open(json!({"summary": "x", "extra": true}));
    assert_eq!(step.await.unwrap(), Processed::Failed);
    let done = rig.job(&job).await;
    let attempt = done.attempt(1).unwrap();
    assert_eq!(attempt.state, AttemptState::Cancelled);
    assert_eq!(
        attempt.error.as_ref().map(|e| e.code.as_str()),
        Some("output_invalid")
    );
    assert!(
        attempt
            .report
            .as_ref()
            .and_then(|r| r.output_tokens)
            .is_some(),
        "the call's usage is kept: {attempt:?}"
    );
    assert_eq!(
        (done.status(), done.settles_at()),
        (JobStatus::Failed, settles_at)
    );
    let bill = onejob::domain::Bill::of(&done);
    assert_eq!((bill.failed.attempts, bill.unknown.len()), (1, 0));
    assert!(rig.no_message());
}

/// A key the provider echoes is scrubbed from the messages onejob writes — the check's that quotes the answer, which
/// an owner reads on the attempt — and never from an answer (invariant 19): a result that carries the key is kept
/// as it came. A key too short to be a secret (a local server's placeholder) is scrubbed from nothing.
pub(crate) async fn an_echoed_key_is_scrubbed_from_messages_and_never_from_an_answer(
    store: Arc<dyn JobStore>,
) {
    // The stand-ins' key is read from `CARGO_PKG_NAME`, "onejob": a placeholder's length. This one's is the
    // package's description, a secret's.
    let long = std::env::var("CARGO_PKG_DESCRIPTION").unwrap();
    let keyed = |base_url: String| {
        let mut endpoint = crate::support::stand_in::endpoint(base_url);
        endpoint.api_key_env = Some("CARGO_PKG_DESCRIPTION".into());
        crate::support::stand_in::timed(onejob::providers::ProviderKind::Openai(
            onejob::providers::kinds::openai::OpenAiSettings(endpoint),
        ))
    };
    let echoing = StandIn::spawn(vec![Reply::EchoKey(2_100)], Reply::EchoKey(0)).await;
    let unused = StandIn::answering(summary("B")).await;
    let mut rig = Rig::new(
        store.clone(),
        keyed(echoing.base_url()),
        openai(unused.base_url()),
    );
    let (job, message) = rig.create("echo-invalid").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let error = rig.attempt_error(&job, 1).await;
    assert_eq!(error.code, "output_invalid");
    assert!(error.message.contains("Bearer [redacted]"), "{error:?}");
    assert!(!error.message.contains(&long), "{error:?}");
    let (job, message) = rig.create("echo-valid").await;
    assert_eq!(rig.process(&message).await, Processed::Succeeded);
    let done = rig.job(&job).await;
    assert_eq!(done.result, Some(summary(&format!("Bearer {long}"))));

    let placeholder = StandIn::spawn(vec![Reply::EchoKey(2_100)], Reply::EchoKey(0)).await;
    let mut rig = Rig::new(
        store.clone(),
        openai(placeholder.base_url()),
        openai(unused.base_url()),
    );
    let (job, message) = rig.create("placeholder-invalid").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let error = rig.attempt_error(&job, 1).await;
    assert!(error.message.contains("Bearer onejob"), "{error:?}");
    let (job, message) = rig.create("placeholder-valid").await;
    assert_eq!(rig.process(&message).await, Processed::Succeeded);
    assert_eq!(rig.job(&job).await.result, Some(summary("Bearer onejob")));

    // The batch lane reads its answer from a results file: kept whole as well, its messages scrubbed as well.
    let echoing = StandIn::spawn(vec![Reply::EchoKey(2_100)], Reply::EchoKey(0)).await;
    let mut batching = keyed(echoing.base_url());
    if let onejob::providers::ProviderKind::Openai(settings) = &mut batching.kind {
        settings.batch = Some(true);
    }
    let mut rig = Rig::new(store, batching, openai(unused.base_url()));
    let (job, message) = rig.create("batch-echo-invalid").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let error = rig.attempt_error(&job, 1).await;
    assert!(error.message.contains("Bearer [redacted]"), "{error:?}");
    assert!(!error.message.contains(&long), "{error:?}");
    let (job, message) = rig.create("batch-echo-valid").await;
    assert_eq!(rig.process(&message).await, Processed::Succeeded);
    assert_eq!(
        rig.job(&job).await.result,
        Some(summary(&format!("Bearer {long}")))
    );
}

/// A prompt of separator lines counts far fewer tokens than a quarter of its bytes. The provider's honest count
/// is no truncation: the answer is kept, the fallback is not paid, and the report carries a note.
pub(crate) async fn a_prompt_of_separator_lines_is_answered_not_called_truncated(
    store: Arc<dyn JobStore>,
) {
    let packed = StandIn::spawn(vec![], Reply::Packed(summary("A report."), 64)).await;
    let fallback = StandIn::answering(summary("B")).await;
    let mut rig = Rig::new(
        store,
        openai(packed.base_url()),
        openai(fallback.base_url()),
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let report = format!("{}\nQ3 REPORT\n{}\n", "=".repeat(79), "=".repeat(79)).repeat(40);
    let intent = onejob::domain::NewJob {
        input: json!({"text": report}),
        fingerprint: onejob::domain::Fingerprint::of_value(&json!("separator lines")),
        ..rig.intent("separators")
    };
    let job = rig.engine.create_job(intent).await.unwrap().job().clone();
    let message = rig.next_message();
    assert_eq!(rig.process(&message).await, Processed::Succeeded);
    let done = rig.job(&job).await;
    assert_eq!(done.completed_by, Some(1));
    let note = done
        .attempt(1)
        .unwrap()
        .report
        .as_ref()
        .and_then(|r| r.note.clone());
    assert!(
        note.is_some_and(|n| n.contains("prompt tokens")),
        "{done:?}"
    );
    assert_eq!(fallback.call_count(), 0);
}
