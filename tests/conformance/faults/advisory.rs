//! onejob's own faults in its advisory writes, on every store: a breaker's, the evidence's, a call slot's and a spend's
//! write failing on either side never decides a job, nor calls a provider twice.

use super::*;

/// The job whose attempt on the primary just failed goes on to the fallback and succeeds there; the primary has
/// been called `calls` times in all, once per attempt.
async fn failed_over_after_one_call(
    rig: &mut Rig,
    job: &Job,
    primary: &StandIn,
    calls: usize,
    fault: Fault,
) {
    let to_fallback = rig.next_message();
    assert_eq!(
        rig.process(&to_fallback).await,
        Processed::Succeeded,
        "{fault:?}"
    );
    assert_eq!(rig.job(job).await.completed_by, Some(2), "{fault:?}");
    assert_eq!(
        primary.call_count(),
        calls,
        "{fault:?}: one call per attempt"
    );
}

/// A breaker write that fails on either side never decides a job: the attempt fails and fails over as it would,
/// with one call; the failure is counted if the write landed (its answer lost) and not if it failed before; and
/// either way the breaker is read again for the provider's next attempt, not taken as clean from memory.
pub(crate) async fn a_breaker_write_that_fails_either_side_never_decides_a_job(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(Vec::new(), Reply::Status(403, "down")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let faulty = FaultyStore::new(store.clone(), Vec::new());
    let mut rig = Rig::configured(
        faulty.clone(),
        openai(primary.base_url()),
        openai(fallback.base_url()),
        |config| config.provider_state_cache_ms = 60_000,
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let name = ProviderName::parse("primary").unwrap();
    for (i, fault) in FAULTS.into_iter().enumerate() {
        faulty.plan(&[(Call::PutBreaker, fault)]);
        let (job, message) = rig.create(&format!("breaker-{i}")).await;
        let reads = faulty.calls(Call::Breaker);
        assert_eq!(rig.process(&message).await, Processed::Failed, "{fault:?}");
        assert!(faulty.spent(), "{fault:?}");
        // Read before the call (nothing clean is remembered after a write in doubt), and for the failure.
        assert_eq!(faulty.calls(Call::Breaker) - reads, 2, "{fault:?}");
        failed_over_after_one_call(&mut rig, &job, &primary, i + 1, fault).await;
        let (breaker, _) = store.breaker(&name).await.unwrap();
        let counted = usize::from(fault == Fault::After);
        assert_eq!(breaker.failures.len(), counted, "{fault:?}");
    }
}

/// An evidence write that fails on either side never decides a job: an answer that broke the contract fails its
/// attempt and fails over as it would, with one call; the strike is kept if the write landed and not if it failed
/// before.
pub(crate) async fn an_evidence_write_that_fails_either_side_never_decides_a_job(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(Vec::new(), Reply::Prose("Sure! The meeting moved.")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let (faulty, mut rig) = rig(store, primary.base_url(), fallback.base_url(), true).await;
    record_qualified(&rig.engine, rig.store.as_ref(), "primary").await;
    let (contract, name) = (
        rig.intent("any").contract,
        ProviderName::parse("primary").unwrap(),
    );
    for (i, fault) in FAULTS.into_iter().enumerate() {
        faulty.plan(&[(Call::ReplaceQualification, fault)]);
        let (job, message) = rig.create(&format!("evidence-{i}")).await;
        assert_eq!(rig.process(&message).await, Processed::Failed, "{fault:?}");
        assert!(faulty.spent(), "{fault:?}");
        failed_over_after_one_call(&mut rig, &job, &primary, i + 1, fault).await;
        let evidence = rig
            .engine
            .qualification(&contract, &name)
            .await
            .unwrap()
            .unwrap();
        let counted = usize::from(fault == Fault::After);
        assert_eq!(evidence.strikes.len(), counted, "{fault:?}");
    }
}

/// A call slot of a capped provider whose take fails on either side fails the step before any call (its message
/// comes back); the redelivery takes the slot — its own again, if the failed take had landed — and calls once.
/// A free that fails either side never decides the job: the slot frees itself at its lease's end, or at once.
pub(crate) async fn a_call_slot_write_that_fails_either_side_never_calls_twice(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let faulty = FaultyStore::new(store.clone(), Vec::new());
    let mut capped = openai(primary.base_url());
    capped.limits.max_in_flight = Some(1);
    let mut rig = Rig::new(faulty.clone(), capped, openai(fallback.base_url()));
    let name = ProviderName::parse("primary").unwrap();
    // Each message as the queue carries it: naming its attempt's provider.
    let engine = rig.engine.clone();
    let step = |message: &AttemptRef| {
        let sent = Message::new(message.clone(), Some(name.clone()));
        let engine = engine.clone();
        async move { process_message(&engine, &sent, None).await }
    };
    for (i, fault) in FAULTS.into_iter().enumerate() {
        faulty.plan(&[(Call::TakeCallSlot, fault)]);
        let (job, message) = rig.create(&format!("slot-{i}")).await;
        assert!(step(&message).await.is_err(), "{fault:?}");
        assert_eq!(
            primary.call_count(),
            i,
            "{fault:?}: no call before the slot"
        );
        assert_eq!(
            step(&message).await.unwrap(),
            Processed::Succeeded,
            "{fault:?}"
        );
        assert_eq!(primary.call_count(), i + 1, "{fault:?}: one call");
        assert_eq!(rig.job(&job).await.status(), JobStatus::Succeeded);
    }
    // A free that fails leaves the slot held until its lease ends; the next attempt waits, without a try.
    faulty.plan(&[(Call::FreeCallSlot, Fault::Before)]);
    let (_, message) = rig.create("slot-held").await;
    assert_eq!(step(&message).await.unwrap(), Processed::Succeeded);
    let (waiting, message) = rig.create("slot-waits").await;
    assert_eq!(step(&message).await.unwrap(), Processed::Waiting);
    assert_eq!(rig.job(&waiting).await.attempts.len(), 1, "no try charged");
    // The message comes back (put off); once the slot's lease has ended, it takes the slot.
    rig.clock.advance(engine.lease());
    let again = rig.message().await;
    assert_eq!(again, message);
    assert_eq!(step(&again).await.unwrap(), Processed::Succeeded);
    // A free whose answer was lost freed the slot.
    faulty.plan(&[(Call::FreeCallSlot, Fault::After)]);
    let (_, message) = rig.create("slot-freed").await;
    assert_eq!(step(&message).await.unwrap(), Processed::Succeeded);
    let (_, message) = rig.create("slot-next").await;
    assert_eq!(step(&message).await.unwrap(), Processed::Succeeded);
    assert!(faulty.spent());
    let now = rig.clock.now();
    assert!(
        store
            .take_call_slot(
                &name,
                "probe",
                CallSlot {
                    cap: 1,
                    until: now,
                    now,
                },
            )
            .await
            .unwrap(),
        "every slot free"
    );
}

/// A call's reservation and its settle, each failing on either side, never decide a job, and never count the call
/// twice or lose it: a reservation whose write failed is tried again (the same write: it lands once), a settle
/// whose answer was lost landed once, and a settle that failed before its write leaves the call reserved at its
/// worst case (settled later by a check) — counted neither at its cost nor twice.
pub(crate) async fn a_reservation_or_settle_that_fails_either_side_counts_each_call_once(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let faulty = FaultyStore::new(store.clone(), Vec::new());
    let mut rig = Rig::configured(
        faulty.clone(),
        openai(primary.base_url()),
        openai(fallback.base_url()),
        |config| {
            config.limits.default.budget = Some(onejob::domain::Budget {
                period: onejob::domain::Period::Month,
                tokens: Some(1_000_000),
                cost: None,
            });
        },
    );
    let (mut used, mut unsettled) = (0, None);
    for call in [Call::Reserve, Call::SettlePlace] {
        for (i, fault) in FAULTS.into_iter().enumerate() {
            faulty.plan(&[(call, fault)]);
            let (job, message) = rig.create(&format!("spend-{call:?}-{i}")).await;
            assert_eq!(
                rig.process(&message).await,
                Processed::Succeeded,
                "{call:?} {fault:?}"
            );
            assert!(faulty.spent(), "{call:?} {fault:?}");
            let job = rig.job(&job).await;
            assert_eq!(job.status(), JobStatus::Succeeded, "{call:?} {fault:?}");
            let report = job.attempt(1).unwrap().report.clone().unwrap();
            let tokens = report.input_tokens.unwrap() + report.output_tokens.unwrap();
            let bound = rig.engine.bound_of(&job, None);
            assert!(tokens <= bound.tokens, "the worst case bounds the call");
            match (call, fault) {
                (Call::SettlePlace, Fault::Before) => unsettled = Some(bound.tokens),
                _ => used += tokens,
            }
        }
    }
    let ledger = store.owner_ledger(&rig.intent("x").owner).await.unwrap();
    assert_eq!(ledger.month.tokens, used, "each settled call counted once");
    assert_eq!(
        ledger.reserved().tokens,
        unsettled.unwrap(),
        "the call whose settle failed stays reserved at its worst case"
    );
    assert_eq!(primary.call_count(), 4, "one call each");
}
