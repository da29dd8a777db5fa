//! What a provider's silence or refusal leads to on every store: a gateway's time-out is unknown and nobody else is
//! paid, a rate limit is waited out on the same provider.

use super::*;

/// Invariant 5: a gateway that stopped waiting (408, 502, 504, 524), or a provider failing while it had the request
/// (500), says nothing about the work behind it — the attempt is `unknown` and the fallback is not paid; a 503 says
/// the request was not taken: a retry on the same provider.
/// (Each of them tells of the provider's health too: the primary's breaker, shared through the store, is kept out
/// of this test.)
pub(crate) async fn a_gateway_timeout_is_unknown_and_the_fallback_is_not_paid(
    store: Arc<dyn JobStore>,
) {
    let fallback = answering("B").await;
    let no_breaker = |config: &mut Config| config.breaker_threshold = 0;
    for status in [408, 500, 502, 504, 524] {
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
    // A 503 that does not say when to come back did not take the request either: the same provider again.
    let after = rig.job(&job).await;
    let next = after.attempt(2).unwrap();
    assert_eq!(
        after.attempt(1).unwrap().error.as_ref().unwrap().code,
        "provider_unavailable"
    );
    assert_eq!(
        (next.state, next.provider.as_str(), next.retry_of),
        (AttemptState::Queued, "primary", Some(1))
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
pub(crate) async fn a_rate_limited_provider_is_retried_not_before_its_retry_after(
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

/// A provider's own retry hints (OpenAI's, Anthropic's): `retry-after-ms` is waited to the millisecond, and
/// `x-should-retry: false` on a 429 or a 503 (an exhausted quota) is no retry — the job fails over at once, and the
/// provider's breaker hears of a failing provider all the same; on a 500 it changes nothing: the work may have been
/// done, so the attempt is `unknown`.
pub(crate) async fn a_providers_retry_hints_are_honoured(store: Arc<dyn JobStore>) {
    let primary = StandIn::spawn(
        vec![
            Reply::Headed(429, &[("retry-after-ms", "1500"), ("retry-after", "2")]),
            Reply::Answer(summary("A")),
            Reply::Headed(429, &[("x-should-retry", "false")]),
            Reply::Headed(503, &[("x-should-retry", "false")]),
            Reply::Headed(500, &[("x-should-retry", "false")]),
        ],
        Reply::Answer(summary("unused")),
    )
    .await;
    let fallback = answering("B").await;
    let mut rig = rig(store, &primary, &fallback).await;
    let (job, first) = rig.create("retry-after-ms").await;
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let after = rig.job(&job).await;
    let (failed, retry) = (after.attempt(1).unwrap(), after.attempt(2).unwrap());
    assert_eq!(
        retry.not_before,
        Some(failed.finished_at.unwrap() + chrono::Duration::milliseconds(1_500))
    );
    assert_eq!(failed.report.as_ref().unwrap().retry_after_ms, Some(1_500));
    rig.advance(1_500);
    let second = rig.message().await;
    assert_eq!(rig.process(&second).await, Processed::Succeeded);

    for (key, status) in [("quota-429", 429), ("quota-503", 503)] {
        let (job, message) = rig.create(key).await;
        assert_eq!(rig.process(&message).await, Processed::Failed, "{status}");
        let after = rig.job(&job).await;
        assert_eq!(
            after.attempt(1).unwrap().error.as_ref().unwrap().code,
            "provider_refused",
            "{status}"
        );
        let next = after.attempt(2).unwrap();
        assert_eq!(
            (next.provider.as_str(), next.retry_of),
            ("fallback", None),
            "{status}: failed over, not retried"
        );
        let fallen = rig.message().await;
        assert_eq!(rig.process(&fallen).await, Processed::Succeeded);
    }
    let (job, message) = rig.create("error-500").await;
    assert_eq!(rig.process(&message).await, Processed::Unknown);
    assert_eq!(state(&rig.job(&job).await, 1), AttemptState::Unknown);
    assert!(rig.no_message());
    assert_eq!((primary.call_count(), fallback.call_count()), (5, 2));
    let primary_name = ProviderName::parse("primary").unwrap();
    let (breaker, _) = rig.store.breaker(&primary_name).await.unwrap();
    assert_eq!(breaker.failures.len(), 3, "{breaker:?}");
}
