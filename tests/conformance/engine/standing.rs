//! A provider's shared state as the engine reads it on every store: a standing voided by a changed model, breakers and
//! evidence read once per window, a breaker shared and probed.

use super::*;

/// A fallback that answers as another model than the one it was qualified as is no longer the qualified provider
/// (invariant 15: the model an answer reports is the provider's evidence, not an owner's input). Its answer does
/// not stand — failover went there because it was qualified — and its standing is void at once: the next job's
/// failover does not go there. The sweeper qualifies it again on the contract's samples, as the model it is now, and
/// failover goes there again.
pub(crate) async fn a_fallback_that_answers_as_another_model_loses_its_standing_at_once(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(vec![], Reply::Status(403, "down")).await;
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
pub(crate) async fn a_clean_breaker_and_evidence_are_read_once_per_window_and_a_failure_always_reads(
    store: Arc<dyn JobStore>,
) {
    let mut replies = vec![Reply::Answer(summary("A")); 3];
    replies.push(Reply::Status(403, "down"));
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
pub(crate) async fn a_breaker_opened_by_five_failures_is_shared_and_probed_after_its_cooldown(
    store: Arc<dyn JobStore>,
) {
    let primary = StandIn::spawn(
        vec![Reply::Status(403, "down"); 5],
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
