//! The reconciler, on every store: an `unknown` attempt clears without a person — by asking a provider that keeps
//! its calls (never by calling it again), or by a provider's stated retry policy — through the same guarded
//! transitions as a worker's answer. Exact counts throughout: calls made, calls whose work was done (the stand-in's
//! stored completions: what the provider billed), lookups asked.

use onejob::domain::ClearedBy;
use onejob::providers::{ProviderConfig, ProviderKind};
use onejob::store::{EventStore, StoreError};
use onejob::worker::process_message;

use super::*;
use crate::support::stand_in::{Loss, anthropic};

/// An openai provider at `base_url` that stores its calls, to be asked about them.
fn storing(base_url: String) -> ProviderConfig {
    let mut config = openai(base_url);
    let ProviderKind::Openai(settings) = &mut config.kind else {
        unreachable!("an openai provider")
    };
    settings.store = Some(true);
    config
}

/// The attempt's state and how it left `unknown`.
pub(super) fn cleared(job: &Job, number: u32) -> (AttemptState, Option<ClearedBy>) {
    let attempt = job.attempt(number).unwrap();
    (attempt.state, attempt.cleared.map(|c| c.by))
}

/// Runs the attempt `message` names to `unknown`: at once for a lost answer, after the time-out and the late
/// window for one that never comes.
async fn to_unknown(
    rig: &Rig,
    provider: &StandIn,
    job: &Job,
    message: &onejob::domain::AttemptRef,
    loss: Loss,
) {
    if loss == Loss::Never {
        let calls = provider.call_count();
        let step = rig.process_in_background(message);
        provider.received(calls + 1).await;
        rig.advance(TIMEOUT_MS);
        rig.until(job, |j| {
            j.attempt(message.number).unwrap().state == AttemptState::Unknown
        })
        .await;
        rig.advance(LATE_MS);
        assert_eq!(step.await.unwrap(), Processed::Unknown);
    } else {
        assert_eq!(rig.process(message).await, Processed::Unknown, "{loss:?}");
    }
}

/// A job whose first call (on a storing primary, `first` its reply, lost as `loss` says; every later call answered
/// `then`) is `unknown`, its lease over: the primary, the fallback, the rig and the job.
async fn unknown_past_its_lease(
    store: Arc<dyn JobStore>,
    first: Reply,
    loss: Loss,
    then: Value,
) -> (StandIn, StandIn, Rig, Job) {
    let primary = StandIn::spawn(vec![first], Reply::Answer(then)).await;
    let fallback = StandIn::answering(summary("B")).await;
    let mut rig = Rig::new(
        store,
        storing(primary.base_url()),
        openai(fallback.base_url()),
    );
    let (job, message) = rig.create("past-its-lease").await;
    to_unknown(&rig, &primary, &job, &message, loss).await;
    rig.advance(lease_ms(&rig));
    (primary, fallback, rig, job)
}

/// The lease of every attempt, in milliseconds: until it ends, a worker may still hear the answer.
pub(super) fn lease_ms(rig: &Rig) -> u64 {
    rig.engine.lease().num_milliseconds() as u64
}

/// The work was done and its answer lost — the connection dropped, a 500 after the work, a 303 "see other" (never
/// followed), no answer ever: the
/// reconciler finds the stored answer once no worker can still hear it, and writes it as a late answer. One call,
/// one billed, the fallback never called, no second attempt; the attempt says it was cleared by a lookup.
pub(crate) async fn a_lost_answer_is_found_at_the_provider_not_bought_again(
    store: Arc<dyn JobStore>,
) {
    for loss in [
        Loss::Dropped,
        Loss::ServerError,
        Loss::SeeOther,
        Loss::Never,
    ] {
        let primary = StandIn::spawn(
            vec![Reply::AfterWork(summary("found"), loss)],
            Reply::Answer(summary("bought again")),
        )
        .await;
        let fallback = StandIn::answering(summary("B")).await;
        let mut rig = Rig::new(
            store.clone(),
            storing(primary.base_url()),
            openai(fallback.base_url()),
        );
        record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
        let (job, message) = rig.create(&format!("found-{loss:?}")).await;
        to_unknown(&rig, &primary, &job, &message, loss).await;
        // A worker may still hear the answer until the lease ends: nobody asks before.
        assert_eq!(rig.reconcile().await, []);
        assert!(
            primary.lookups().is_empty(),
            "{loss:?}: asked within the lease"
        );
        rig.advance(lease_ms(&rig));
        assert_eq!(rig.reconcile().await, [Processed::Succeeded], "{loss:?}");
        let done = rig.job(&job).await;
        assert_eq!(done.status(), JobStatus::Succeeded, "{loss:?}");
        assert_eq!(done.result, Some(summary("found")));
        assert_eq!(
            cleared(&done, 1),
            (AttemptState::Succeeded, Some(ClearedBy::Lookup))
        );
        assert_eq!(done.attempts.len(), 1, "{loss:?}: no second attempt");
        assert!(rig.no_message());
        assert_eq!(
            (
                primary.call_count(),
                primary.stored_count(),
                fallback.call_count()
            ),
            (1, 1, 0),
            "{loss:?}"
        );
        let asked = primary.lookups();
        assert_eq!(asked.len(), 1, "{loss:?}: {asked:?}");
        assert!(
            asked[0].contains(&format!("metadata%5Bonejob_attempt%5D={}%3A1", job.id)),
            "{asked:?}"
        );
        let call = &primary.calls()[0].body;
        assert_eq!(call["store"], true);
        assert_eq!(call["metadata"]["onejob_attempt"], format!("{}:1", job.id));
        // Nothing left for a person, nothing more for the reconciler.
        assert_eq!(rig.reconcile().await, []);
        assert_eq!(
            rig.metric(
                "onejob_unknown_cleared_total",
                &[("by", "lookup"), ("provider", "primary")]
            ),
            1.0
        );
    }
}

/// The call was lost before any work: the provider has no such call. Until the call is old enough that it cannot
/// still be running, that proves nothing and the attempt waits; then it is cleared by the lookup and its provider is
/// tried again, as a retry of it — two calls, one billed, the intent answered.
pub(crate) async fn a_call_the_provider_never_did_is_tried_again_once_its_absence_is_sure(
    store: Arc<dyn JobStore>,
) {
    let (primary, fallback, mut rig, job) = unknown_past_its_lease(
        store,
        Reply::BeforeWork(Loss::Dropped),
        Loss::Dropped,
        summary("A"),
    )
    .await;
    assert_eq!(rig.reconcile().await, [Processed::Unknown]);
    assert_eq!(primary.lookups().len(), 1);
    let waiting = rig.job(&job).await;
    assert_eq!(cleared(&waiting, 1), (AttemptState::Unknown, None));
    // Absence is sure 15 minutes after the call started.
    let absent_ms = ProviderConfig::of(ProviderKind::Demo(Default::default()))
        .limits
        .lookup_absent_after_ms;
    rig.advance(absent_ms - lease_ms(&rig));
    assert_eq!(rig.reconcile().await, [Processed::Cleared]);
    let cleared_job = rig.job(&job).await;
    assert_eq!(
        cleared(&cleared_job, 1),
        (AttemptState::Cancelled, Some(ClearedBy::Lookup))
    );
    let retry = cleared_job.attempt(2).unwrap();
    assert_eq!(
        (retry.state, retry.provider.as_str(), retry.retry_of),
        (AttemptState::Queued, "primary", Some(1))
    );
    // Not paid: the bill counts no unknown cost for it.
    assert!(onejob::domain::Bill::of(&cleared_job).unknown.is_empty());
    let second = rig.message().await;
    assert_eq!(second.number, 2, "dispatched at once");
    assert_eq!(rig.process(&second).await, Processed::Succeeded);
    let done = rig.job(&job).await;
    assert_eq!(done.result, Some(summary("A")));
    assert_eq!(
        (
            primary.call_count(),
            primary.stored_count(),
            fallback.call_count()
        ),
        (2, 1, 0)
    );
}

/// A provider that cannot be asked (no stored calls): without a policy its `unknown` waits for a person, in the
/// operators' list; with `unknown_retry_after_ms` it is tried again that long after its time-out, recorded as
/// cleared by policy and possibly paid on the bill — and never before the lease ends. The job's contract's own
/// policy, where it states one, is the one that holds: its `unknown_retry_after_ms` retries on a provider with
/// none, its `unknown = "hold"` holds on a provider that would retry.
pub(crate) async fn an_unknown_no_provider_can_answer_waits_for_its_policy_or_a_person(
    store: Arc<dyn JobStore>,
) {
    // Longer than the lease (the longest listen of any provider configured, and its margin).
    let retry_after_ms = 600_000;
    let contracts = tempfile::tempdir().unwrap();
    let summarize = include_str!("../../../contracts/summarize.toml");
    for (case, (provider_policy, contract_policy)) in [
        // The holding cases last: each rig's sweep reads every unknown job of the shared store.
        (Some(retry_after_ms), None),
        (
            None,
            Some(format!("unknown_retry_after_ms = {retry_after_ms}")),
        ),
        (None, None),
        (Some(retry_after_ms), Some("unknown = \"hold\"".to_owned())),
    ]
    .into_iter()
    .enumerate()
    {
        let policy = match contract_policy.as_deref() {
            Some(said) => (!said.contains("hold")).then_some(retry_after_ms),
            None => provider_policy,
        };
        let primary = StandIn::spawn(
            vec![Reply::AfterWork(summary("lost"), Loss::Dropped)],
            Reply::Answer(summary("again")),
        )
        .await;
        let mut config = anthropic(primary.base_url());
        config.limits.unknown_retry_after_ms = provider_policy;
        let fallback = StandIn::answering(summary("B")).await;
        // The contract as built in, with the policy it states (before its first table).
        let file = contracts.path().join(format!(
            "summarize-{provider_policy:?}-{}.toml",
            contract_policy.is_some()
        ));
        let said = contract_policy.clone().unwrap_or_default();
        std::fs::write(
            &file,
            summarize.replacen("\n[input_schema]", &format!("{said}\n\n[input_schema]"), 1),
        )
        .unwrap();
        let mut rig = Rig::configured(
            store.clone(),
            config,
            openai(fallback.base_url()),
            |config| config.contract_files = vec![file],
        );
        let (job, message) = rig.create(&format!("policy-{case}")).await;
        to_unknown(&rig, &primary, &job, &message, Loss::Dropped).await;
        assert_eq!(
            rig.engine.clears_itself(&rig.job(&job).await),
            policy.is_some()
        );
        rig.advance(lease_ms(&rig));
        let early = sweep(&rig.engine, None).await.unwrap().cleared;
        assert_eq!(
            early,
            0,
            "{:#?} at {}",
            rig.job(&job).await,
            rig.clock.now()
        );
        rig.advance(retry_after_ms + TIMEOUT_MS);
        let swept = sweep(&rig.engine, None).await.unwrap();
        let after = rig.job(&job).await;
        if policy.is_none() {
            assert_eq!(swept.cleared, 0);
            assert_eq!(cleared(&after, 1), (AttemptState::Unknown, None));
            assert_eq!(primary.call_count(), 1);
            let listed = rig
                .engine
                .needing_a_person(Some(JobStatus::Unknown), 100, None)
                .await
                .unwrap();
            assert!(listed.jobs.iter().any(|j| j.id == job.id));
            continue;
        }
        assert_eq!(swept.cleared, 1);
        assert_eq!(
            cleared(&after, 1),
            (AttemptState::Cancelled, Some(ClearedBy::Policy))
        );
        let bill = onejob::domain::Bill::of(&after);
        assert_eq!(
            (bill.possibly_paid.clone(), bill.unknown.clone()),
            (vec![1], vec![])
        );
        assert!(!bill.complete());
        let second = rig.message().await;
        assert_eq!(second.number, 2);
        assert_eq!(rig.process(&second).await, Processed::Succeeded);
        assert_eq!(rig.job(&job).await.result, Some(summary("again")));
        assert_eq!((primary.call_count(), fallback.call_count()), (2, 0));
    }
}

/// Two processes' sweepers and workers ask about the same `unknown` attempt at once: both may find the answer, one
/// write clears it and the other finds it cleared — one result, one attempt, one clearing counted.
pub(crate) async fn two_reconcilers_clear_an_unknown_once(store: Arc<dyn JobStore>) {
    let primary = StandIn::spawn(
        vec![Reply::AfterWork(summary("found"), Loss::Dropped)],
        Reply::Answer(summary("bought again")),
    )
    .await;
    let fallback = StandIn::answering(summary("B")).await;
    let process = || {
        Rig::new(
            store.clone(),
            storing(primary.base_url()),
            openai(fallback.base_url()),
        )
    };
    let (mut first, mut second) = (process(), process());
    let (job, message) = first.create("two-sweepers").await;
    to_unknown(&first, &primary, &job, &message, Loss::Dropped).await;
    for rig in [&first, &second] {
        rig.advance(lease_ms(rig));
    }
    // Both sweeps send their lookup before either worker asks: both find the job unknown.
    for rig in [&first, &second] {
        assert_eq!(sweep(&rig.engine, None).await.unwrap().asked, 1);
    }
    let (a, b) = (first.sent().await, second.sent().await);
    let (a, b) = (
        first.process_sent_in_background(&a),
        second.process_sent_in_background(&b),
    );
    let mut outcomes = [a.await.unwrap(), b.await.unwrap()];
    outcomes.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(outcomes, [Processed::Dropped, Processed::Succeeded]);
    let done = first.job(&job).await;
    assert_eq!(done.result, Some(summary("found")));
    assert_eq!(done.attempts.len(), 1);
    assert_eq!(primary.call_count(), 1);
    let counted = |rig: &Rig| rig.metric("onejob_unknown_cleared_total", &[("by", "lookup")]);
    assert_eq!(counted(&first) + counted(&second), 1.0);
}

/// A lookup the provider does not answer (a 500) changes nothing and calls nothing; the next sweep asks again and
/// finds the answer.
pub(crate) async fn a_lookup_that_fails_is_asked_again_and_never_calls(store: Arc<dyn JobStore>) {
    let (primary, fallback, mut rig, job) = unknown_past_its_lease(
        store,
        Reply::AfterWork(summary("found"), Loss::ServerError),
        Loss::ServerError,
        summary("bought again"),
    )
    .await;
    primary.fail_lookups(true);
    for _ in 0..2 {
        assert_eq!(rig.reconcile().await, [Processed::Unknown]);
    }
    assert_eq!(
        cleared(&rig.job(&job).await, 1),
        (AttemptState::Unknown, None)
    );
    primary.fail_lookups(false);
    assert_eq!(rig.reconcile().await, [Processed::Succeeded]);
    assert_eq!(rig.job(&job).await.result, Some(summary("found")));
    assert_eq!(primary.lookups().len(), 3);
    assert_eq!((primary.call_count(), fallback.call_count()), (1, 0));
}

/// A claim whose answer was lost is found again by the step's next try — here after the lease's margin, the store
/// stalled — and keeps its first try's lease: a call made now would be heard past it, while the reconciler takes
/// the lease's end for the end of listening (the provider's "no such call" for absence). It is not called: the
/// lease runs out on no call, the provider has none, and once absence is sure the reconciler tries it again — one
/// call, one paid, the intent answered.
pub(crate) async fn a_claim_found_again_too_late_for_its_lease_is_not_called(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let faulty = FaultyStore::new(
        store,
        vec![(Call::Claim, Fault::After), (Call::Claim, Fault::Stall)],
    );
    let mut rig = Rig::new(
        faulty.clone(),
        storing(primary.base_url()),
        openai(fallback.base_url()),
    );
    let (job, message) = rig.create("claimed-late").await;
    let step = rig.process_in_background(&message);
    // The first try lands and loses its answer; its repeat stalls until the call's window would outlast the lease.
    faulty.made(Call::Claim, 2).await;
    rig.advance(lease_ms(&rig) - (TIMEOUT_MS + LATE_MS) + 1);
    faulty.release();
    assert_eq!(step.await.unwrap(), Processed::Unknown);
    assert_eq!(primary.call_count(), 0, "called past its lease");
    let claimed = rig.job(&job).await;
    assert_eq!(cleared(&claimed, 1), (AttemptState::Started, None));

    rig.advance(TIMEOUT_MS + LATE_MS);
    assert_eq!(rig.reconcile().await, [Processed::Unknown]);
    assert_eq!(
        cleared(&rig.job(&job).await, 1),
        (AttemptState::Unknown, None)
    );
    let absent_ms = ProviderConfig::of(ProviderKind::Demo(Default::default()))
        .limits
        .lookup_absent_after_ms;
    rig.advance(absent_ms);
    assert_eq!(rig.reconcile().await, [Processed::Cleared]);
    let retry = rig.message().await;
    assert_eq!(rig.process(&retry).await, Processed::Succeeded);
    let done = rig.job(&job).await;
    assert_eq!(done.result, Some(summary("A")));
    assert_eq!(
        (
            primary.call_count(),
            primary.stored_count(),
            fallback.call_count()
        ),
        (1, 1, 0)
    );
}

/// A lookup finds the answer and writes it, and the store will not arm the ended job's event through a write's
/// budget: the step fails, its message comes back, and the redelivery — the attempt no longer `unknown`, nothing to
/// ask — arms the event. One call, never a second.
pub(crate) async fn a_lookups_event_the_store_would_not_arm_is_armed_by_its_redelivery(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(
        vec![Reply::AfterWork(summary("found"), Loss::Dropped)],
        Reply::Answer(summary("bought again")),
    )
    .await;
    let fallback = StandIn::answering(summary("B")).await;
    let faulty = FaultyStore::new(store, Vec::new());
    let mut rig = Rig::new(
        faulty.clone(),
        storing(primary.base_url()),
        openai(fallback.base_url()),
    );
    let (job, message) = rig.create("lookup-unarmed").await;
    let endpoint =
        onejob::domain::Endpoint::new("https://hooks.example.com/".into(), rig.clock.now());
    faulty
        .put_endpoint(&job.owner, Some(&endpoint))
        .await
        .unwrap();
    to_unknown(&rig, &primary, &job, &message, Loss::Dropped).await;
    rig.advance(lease_ms(&rig));
    assert_eq!(sweep(&rig.engine, None).await.unwrap().asked, 1);
    let lookup = rig.sent().await;
    faulty.plan(&[(Call::ArmDeliveries, Fault::Before); 10_000]);
    let (engine, redelivered) = (rig.engine.clone(), lookup.clone());
    let step = tokio::spawn(async move { process_message(&engine, &lookup, None).await });
    rig.drive_backoff(&faulty, 2_000, Call::ArmDeliveries, &step)
        .await;
    let outcome = step.await.unwrap();
    assert!(
        matches!(outcome, Err(StoreError::Backend(_))),
        "{outcome:?}"
    );
    let done = rig.job(&job).await;
    assert_eq!(
        done.result,
        Some(summary("found")),
        "the answer stays written"
    );

    faulty.clear();
    assert_eq!(
        process_message(&rig.engine, &redelivered, None)
            .await
            .unwrap(),
        Processed::Dropped
    );
    let (armed, _) = faulty
        .deliveries(&job.id)
        .await
        .unwrap()
        .expect("armed by the redelivery");
    assert_eq!(armed.due_at, done.settles_at());
    assert_eq!((primary.call_count(), fallback.call_count()), (1, 0));
}

/// An openai provider at `base_url` whose calls are background responses (the Responses API, stored), read by
/// their id.
fn background(base_url: String) -> ProviderConfig {
    let mut config = storing(base_url);
    let ProviderKind::Openai(settings) = &mut config.kind else {
        unreachable!("an openai provider")
    };
    settings.api = Some(onejob::providers::OpenAiApi::Responses);
    settings.background = Some(true);
    config
}

/// Waits (on the worker's own progress, not on time) until `provider` was read `n` times and the worker sleeps
/// until its next read, beside its time-out.
pub(super) async fn read(rig: &Rig, provider: &StandIn, n: usize) {
    let started = std::time::Instant::now();
    while !(provider.lookups().len() >= n && rig.clock.sleepers() >= 2) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "never read {n} times: {:?}",
            provider.lookups()
        );
        tokio::task::yield_now().await;
    }
}

/// Runs a call its provider named and the worker reads until done (a background response, a batch), the `step`
/// already begun, past its time-out and its late window: the attempt `unknown`, the step over. The job as it went
/// `unknown`, with the name it kept.
pub(super) async fn read_past_its_time_out(
    rig: &Rig,
    provider: &StandIn,
    job: &Job,
    step: tokio::task::JoinHandle<Processed>,
) -> Job {
    read(rig, provider, 1).await;
    rig.advance(TIMEOUT_MS);
    let unknown = rig
        .until(job, |j| {
            j.attempt(1).unwrap().state == AttemptState::Unknown
        })
        .await;
    rig.advance(LATE_MS);
    assert_eq!(step.await.unwrap(), Processed::Unknown);
    unknown
}

/// A background response: the create answers at once with its id, and the call reads the response by it until it
/// is done. Reads lost on the wire (500s) are harmless: the next read finds the answer. One call, one create, the
/// answer kept; the request is the Responses API's, in background, stored under the attempt's identity.
pub(crate) async fn a_background_response_is_waited_on_by_its_id_through_lost_reads(
    store: Arc<dyn JobStore>,
) {
    let gate = Gate::new();
    let primary = StandIn::spawn(
        vec![Reply::Held(gate.clone())],
        Reply::Answer(summary("again")),
    )
    .await;
    let fallback = StandIn::answering(summary("B")).await;
    let mut rig = Rig::new(
        store,
        background(primary.base_url()),
        openai(fallback.base_url()),
    );
    let (job, message) = rig.create("in-background").await;
    primary.fail_lookups(true);
    let step = rig.process_in_background(&message);
    read(&rig, &primary, 1).await;
    rig.advance(250);
    read(&rig, &primary, 2).await;
    primary.fail_lookups(false);
    gate.open(summary("A"));
    while primary.stored_count() < 1 {
        tokio::task::yield_now().await;
    }
    rig.advance(500);
    assert_eq!(step.await.unwrap(), Processed::Succeeded);
    let done = rig.job(&job).await;
    assert_eq!(done.result, Some(summary("A")));
    assert_eq!(cleared(&done, 1), (AttemptState::Succeeded, None));
    assert_eq!(
        (
            primary.call_count(),
            primary.lookups().len(),
            fallback.call_count()
        ),
        (1, 3, 0)
    );
    let created = &primary.calls()[0];
    assert_eq!(created.uri.path(), "/v1/responses");
    let body = &created.body;
    assert_eq!(
        (body["background"].clone(), body["store"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(body["metadata"]["onejob_attempt"], format!("{}:1", job.id));
    assert_eq!(body["text"]["format"]["type"], "json_schema");
    assert!(
        body["max_output_tokens"].is_u64() && body.get("messages").is_none(),
        "{body}"
    );
}

/// A background response still running past its time-out and late window leaves the attempt `unknown` with the
/// response's id; once no worker can hear it, the reconciler reads the response by that id: done, its answer is the
/// attempt's (one call, one paid); cancelled at the provider, the attempt is cleared at once and tried again. A
/// create whose answer was lost left no id: nothing to read, the attempt waits for a person.
pub(crate) async fn an_unknown_background_response_is_settled_by_reading_its_id(
    store: Arc<dyn JobStore>,
) {
    for cancelled in [false, true] {
        let gate = Gate::new();
        let primary = StandIn::spawn(
            vec![Reply::Held(gate.clone())],
            Reply::Answer(summary("again")),
        )
        .await;
        let fallback = StandIn::answering(summary("B")).await;
        let mut rig = Rig::new(
            store.clone(),
            background(primary.base_url()),
            openai(fallback.base_url()),
        );
        let (job, message) = rig.create(&format!("slow-in-background-{cancelled}")).await;
        let step = rig.process_in_background(&message);
        let unknown = read_past_its_time_out(&rig, &primary, &job, step).await;
        assert_eq!(
            unknown.attempt(1).unwrap().call_id.as_deref(),
            Some("resp_stand_in_1")
        );
        match cancelled {
            false => gate.open(summary("A, late")),
            true => primary.cancel_responses(),
        }
        while primary.stored_count() + usize::from(cancelled) < 1 {
            tokio::task::yield_now().await;
        }
        rig.advance(lease_ms(&rig));
        let reads = primary.lookups().len();
        if cancelled {
            assert_eq!(rig.reconcile().await, [Processed::Cleared]);
            let retry = rig.message().await;
            assert_eq!(rig.process(&retry).await, Processed::Succeeded);
        } else {
            assert_eq!(rig.reconcile().await, [Processed::Succeeded]);
        }
        // The reconciler's one read, by the id (a retry's own create then reads its new response).
        assert_eq!(primary.lookups()[reads], "responses/resp_stand_in_1");
        assert_eq!(primary.lookups().len(), reads + 1 + usize::from(cancelled));
        let done = rig.job(&job).await;
        let (answer, calls, by) = match cancelled {
            false => (summary("A, late"), 1, ClearedBy::Lookup),
            true => (summary("again"), 2, ClearedBy::Lookup),
        };
        assert_eq!(done.result, Some(answer));
        assert_eq!(done.attempt(1).unwrap().cleared.map(|c| c.by), Some(by));
        assert_eq!(
            (
                primary.call_count(),
                primary.stored_count(),
                fallback.call_count()
            ),
            (calls, 1, 0)
        );
    }

    // The policy's case first: each rig's sweep reads every unknown job of the shared store.
    for policy in [Some(0), None] {
        let primary = StandIn::spawn(
            vec![Reply::AfterWork(summary("lost"), Loss::Dropped)],
            Reply::Answer(summary("again")),
        )
        .await;
        let fallback = StandIn::answering(summary("B")).await;
        let mut config = background(primary.base_url());
        config.limits.unknown_retry_after_ms = policy;
        let mut rig = Rig::new(store.clone(), config, openai(fallback.base_url()));
        let (job, message) = rig.create(&format!("create-lost-{policy:?}")).await;
        assert_eq!(rig.process(&message).await, Processed::Unknown);
        assert_eq!(
            rig.engine.clears_itself(&rig.job(&job).await),
            policy.is_some()
        );
        rig.advance(lease_ms(&rig));
        assert_eq!(rig.reconcile().await, []);
        let after = rig.job(&job).await;
        assert_eq!(after.attempt(1).unwrap().call_id, None);
        assert_eq!(primary.lookups().len(), 0, "nothing to read it by");
        if policy.is_none() {
            assert_eq!(cleared(&after, 1), (AttemptState::Unknown, None));
            assert_eq!(primary.call_count(), 1);
            continue;
        }
        // The provider's policy holds for a call it never named: retried, recorded as possibly paid.
        assert_eq!(
            cleared(&after, 1),
            (AttemptState::Cancelled, Some(ClearedBy::Policy))
        );
        assert_eq!(onejob::domain::Bill::of(&after).possibly_paid, vec![1]);
        let retry = rig.message().await;
        assert_eq!(rig.process(&retry).await, Processed::Succeeded);
        assert_eq!(
            (
                primary.call_count(),
                primary.stored_count(),
                fallback.call_count()
            ),
            (2, 2, 0)
        );
    }
}
