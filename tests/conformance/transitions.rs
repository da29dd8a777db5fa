//! Cancels, failures with their failover, the sweeper's finds, and reads that never see half a write.

use super::*;

/// Found by the model test on DynamoDB: a job cancelled while its attempt was still queued (never claimed), then a
/// result for that attempt. Every backend discards it the same way, and the job stays as the cancel left it.
pub(crate) async fn a_result_for_a_never_claimed_attempt_of_a_cancelled_job_is_discarded(
    store: Arc<dyn JobStore>,
) {
    let job = fresh_job(store.as_ref()).await;
    let (_, cancelled) = store.cancel_job(&job.owner, &job.id, &by(1)).await.unwrap();
    assert_eq!(cancelled.attempt(1).unwrap().state, AttemptState::Cancelled);
    let unasked = by(2);
    let (outcome, after) = store
        .complete_attempt(
            &job.id,
            1,
            json!({"summary": "unasked"}),
            CallReport::default(),
            &unasked,
        )
        .await
        .unwrap();
    assert_eq!(outcome, Completion::Lost { winner: None });
    let mut expected = cancelled.clone();
    assert_eq!(
        expected.complete(
            1,
            json!({"summary": "unasked"}),
            CallReport::default(),
            &unasked
        ),
        Ok(Completion::Lost { winner: None })
    );
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((&after, &stored), (&expected, &expected));
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Discarded);
}

pub(crate) async fn a_late_result_for_an_unknown_attempt_with_a_free_slot_wins(
    store: Arc<dyn JobStore>,
) {
    let job = claimed_job(store.as_ref()).await;
    store.mark_unknown(&job.id, 1, None, &by(2)).await.unwrap();
    let (outcome, after) = answer(store.as_ref(), &job, 1, "late", 3).await;
    assert_eq!(outcome, Completion::Won);
    assert_eq!(after.status(), JobStatus::Succeeded);
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.result, Some(json!({"summary": "late"})));
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Succeeded);
    // A second delivery of the same result is refused: the attempt already ended.
    assert!(matches!(
        store
            .complete_attempt(
                &job.id,
                1,
                json!({"summary": "again"}),
                CallReport::default(),
                &by(4)
            )
            .await,
        Err(StoreError::Refused(Refusal::InvalidTransition {
            from: AttemptState::Succeeded,
            ..
        }))
    ));
}

pub(crate) async fn cancelling_a_job_is_idempotent_and_refused_once_it_succeeded(
    store: Arc<dyn JobStore>,
) {
    let job = created(
        store.as_ref(),
        new_job("alice", "a", json!({"text": "a"})),
        at(0),
    )
    .await;
    let (first, once) = store.cancel_job(&job.owner, &job.id, &by(1)).await.unwrap();
    let (second, twice) = store.cancel_job(&job.owner, &job.id, &by(2)).await.unwrap();
    assert_eq!(
        (first, second),
        (JobCancel::Cancelled, JobCancel::AlreadyCancelled)
    );
    assert_eq!(once, twice);
    assert_eq!(twice.attempts[0].state, AttemptState::Cancelled);
    assert!(matches!(
        store
            .add_attempt(
                &job.owner,
                &job.id,
                Some(provider("fallback")),
                &stop(),
                onejob::store::Held::none(),
                &by(3)
            )
            .await,
        Err(StoreError::Refused(Refusal::JobFinished {
            status: JobStatus::Cancelled
        }))
    ));

    let done = created(
        store.as_ref(),
        new_job("alice", "b", json!({"text": "b"})),
        at(0),
    )
    .await;
    store
        .claim_attempt(&done.id, 1, lease(), &by(1))
        .await
        .unwrap();
    answer(store.as_ref(), &done, 1, "x", 2).await;
    assert!(matches!(
        store.cancel_job(&done.owner, &done.id, &by(3)).await,
        Err(StoreError::Refused(Refusal::JobFinished {
            status: JobStatus::Succeeded
        }))
    ));
}

pub(crate) async fn a_failure_and_its_failover_are_one_write(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    assert!(matches!(
        store
            .fail_attempt(
                &job.id,
                1,
                ErrorInfo::new("x", "queued"),
                CallReport::default(),
                &stop(),
                &by(1)
            )
            .await,
        Err(StoreError::Refused(Refusal::InvalidTransition {
            from: AttemptState::Queued,
            ..
        }))
    ));
    store
        .claim_attempt(&job.id, 1, lease(), &by(1))
        .await
        .unwrap();
    let error = ErrorInfo::new("rate_limited", "HTTP 429 (Retry-After: 30 s)");
    let limited = CallReport {
        retry_after_s: Some(30),
        ..CallReport::default()
    };
    let after = store
        .fail_attempt(
            &job.id,
            1,
            error.clone(),
            limited.clone(),
            &to("fallback"),
            &by(2),
        )
        .await
        .unwrap();
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, after);
    assert_eq!(stored.status(), JobStatus::Queued);
    let first = stored.attempt(1).unwrap();
    assert_eq!(
        (first.state, &first.error, first.finished_at),
        (AttemptState::Failed, &Some(error), Some(at(2)))
    );
    assert_eq!(first.report, Some(limited));
    let second = stored.attempt(2).unwrap();
    assert_eq!(
        (second.state, second.provider.as_str()),
        (AttemptState::Queued, "fallback")
    );

    store
        .claim_attempt(&job.id, 2, lease(), &by(3))
        .await
        .unwrap();
    let failed = store
        .fail_attempt(
            &job.id,
            2,
            ErrorInfo::new("provider_error", "HTTP 503"),
            CallReport::default(),
            &to_any(&["primary", "fallback"]),
            &by(4),
        )
        .await
        .unwrap();
    assert_eq!(failed.status(), JobStatus::Failed);
    assert_eq!(failed.error.as_ref().unwrap().code, "providers_exhausted");
    assert_eq!(
        store.get_job(&job.owner, &job.id, later()).await.unwrap(),
        Some(failed)
    );
}

/// What the sweeper asks for: `started` attempts past their lease, `queued` attempts nobody claimed.
pub(crate) async fn expired_leases_and_stale_queued_attempts_are_found(store: Arc<dyn JobStore>) {
    let short = created(
        store.as_ref(),
        new_job("alice", "short", json!({"text": "a"})),
        at(0),
    )
    .await;
    let long = created(
        store.as_ref(),
        new_job("alice", "long", json!({"text": "b"})),
        at(0),
    )
    .await;
    let queued = created(
        store.as_ref(),
        new_job("bob", "queued", json!({"text": "c"})),
        at(10),
    )
    .await;
    created(
        store.as_ref(),
        new_job("bob", "fresh", json!({"text": "d"})),
        at(5_000),
    )
    .await;
    store
        .claim_attempt(&short.id, 1, at(1_000), &by(1))
        .await
        .unwrap();
    store
        .claim_attempt(&long.id, 1, at(90_000), &by(1))
        .await
        .unwrap();

    let expired = store.expired_leases(at(2_000), 10).await.unwrap();
    assert_eq!(
        expired,
        vec![AttemptRef {
            job_id: short.id.clone(),
            number: 1
        }]
    );
    assert_eq!(store.expired_leases(at(999), 10).await.unwrap(), vec![]);

    let stale = store.stale_queued(at(1_000), later(), 10).await.unwrap();
    assert_eq!(
        stale,
        vec![AttemptRef {
            job_id: queued.id.clone(),
            number: 1
        }]
    );
    assert_eq!(
        store
            .stale_queued(at(9_000), later(), 1)
            .await
            .unwrap()
            .len(),
        1,
        "the limit holds"
    );

    store
        .mark_unknown(&short.id, 1, None, &by(2_000))
        .await
        .unwrap();
    assert_eq!(store.expired_leases(at(2_000), 10).await.unwrap(), vec![]);
}

/// A failure and its job-level error are one write: a reader racing it sees both or neither.
pub(crate) async fn reads_never_see_half_a_write(store: Arc<dyn JobStore>) {
    for round in 0..50 {
        let job = created(
            store.as_ref(),
            new_job("alice", &format!("torn-{round}"), json!({"text": "a"})),
            at(0),
        )
        .await;
        store
            .claim_attempt(&job.id, 1, lease(), &by(1))
            .await
            .unwrap();
        let mut readers = JoinSet::new();
        for _ in 0..3 {
            let (store, job) = (store.clone(), job.clone());
            readers.spawn(async move {
                loop {
                    let seen = store
                        .get_job(&job.owner, &job.id, later())
                        .await
                        .unwrap()
                        .unwrap();
                    let failed = seen.attempt(1).unwrap().state == AttemptState::Failed;
                    assert_eq!(failed, seen.error.is_some(), "a torn read: {seen:?}");
                    if failed {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            });
        }
        store
            .fail_attempt(
                &job.id,
                1,
                ErrorInfo::new("provider_error", "500"),
                CallReport::default(),
                &stop(),
                &by(2),
            )
            .await
            .unwrap();
        readers.join_all().await;
    }
}
