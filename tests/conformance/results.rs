//! One live attempt and one winner: claims, completions and the result slot under races.

use super::*;

pub(crate) async fn a_second_live_attempt_is_refused(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    let refused = |number, state| {
        move |r: Result<(u32, Job), StoreError>| match r {
            Err(StoreError::Refused(Refusal::AttemptInProgress {
                number: n,
                state: s,
            })) => {
                assert_eq!((n, s), (number, state))
            }
            other => panic!("expected attempt_in_progress, got {other:?}"),
        }
    };
    let (nowhere, one) = (stop(), by(1));
    let add = || {
        store.add_attempt(
            &job.owner,
            &job.id,
            Some(provider("fallback")),
            &nowhere,
            onejob::store::Held::none(),
            &one,
        )
    };
    refused(1, AttemptState::Queued)(add().await);
    store
        .claim_attempt(&job.id, 1, lease(), &by(2))
        .await
        .unwrap();
    refused(1, AttemptState::Started)(add().await);
    let unknown = store.mark_unknown(&job.id, 1, None, &by(3)).await.unwrap();
    assert_eq!(unknown.status(), JobStatus::Unknown);
    refused(1, AttemptState::Unknown)(add().await);
    assert_eq!(
        store.get_job(&job.owner, &job.id, later()).await.unwrap(),
        Some(unknown)
    );

    store
        .cancel_attempt(&job.owner, &job.id, 1, &stop(), &by(4))
        .await
        .unwrap();
    // Released: many concurrent requests for the next attempt, exactly one gets it.
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let (store, job) = (store.clone(), job.clone());
        tasks.spawn(async move {
            store
                .add_attempt(
                    &job.owner,
                    &job.id,
                    Some(provider("fallback")),
                    &stop(),
                    onejob::store::Held::none(),
                    &by(5),
                )
                .await
        });
    }
    let results = tasks.join_all().await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results.iter().all(|r| matches!(
        r,
        Ok((2, _))
            | Err(StoreError::Refused(Refusal::AttemptInProgress {
                number: 2,
                ..
            }))
    )));
    let job = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.attempts.len(), 2);
    assert_eq!(job.attempts[1].state, AttemptState::Queued);
}

/// Puts `job` in the state of breakpoint 4: attempt 1 (primary) claimed then released by an out-of-band cancel,
/// attempt 2 (fallback) claimed. Both may now deliver a result.
async fn two_claimed_attempts(store: &dyn JobStore, job: &Job) {
    store
        .claim_attempt(&job.id, 1, lease(), &by(1))
        .await
        .unwrap();
    store.mark_unknown(&job.id, 1, None, &by(2)).await.unwrap();
    let (cancel, job) = store
        .cancel_attempt(&job.owner, &job.id, 1, &to("fallback"), &by(3))
        .await
        .unwrap();
    assert_eq!(cancel, AttemptCancel::Cancelled);
    assert_eq!(job.attempt(2).unwrap().state, AttemptState::Queued);
    store
        .claim_attempt(&job.id, 2, lease(), &by(5))
        .await
        .unwrap();
}

pub(crate) async fn concurrent_completions_have_exactly_one_winner(store: Arc<dyn JobStore>) {
    for round in 0..10 {
        let job = created(
            store.as_ref(),
            new_job("alice", &format!("race-{round}"), json!({"text": "a"})),
            at(0),
        )
        .await;
        two_claimed_attempts(store.as_ref(), &job).await;
        let mut tasks = JoinSet::new();
        for number in [1u32, 2] {
            let (store, id) = (store.clone(), job.id.clone());
            tasks.spawn(async move {
                let outcome = store
                    .complete_attempt(
                        &id,
                        number,
                        json!({"summary": number}),
                        CallReport::default(),
                        &by(10),
                    )
                    .await
                    .unwrap();
                (number, outcome.0)
            });
        }
        let outcomes = tasks.join_all().await;
        let winners: Vec<u32> = outcomes
            .iter()
            .filter(|(_, c)| *c == Completion::Won)
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let winner = winners[0];
        let loser = 3 - winner;
        assert!(outcomes.contains(&(
            loser,
            Completion::Lost {
                winner: Some(winner)
            }
        )));
        let job = store
            .get_job(&job.owner, &job.id, later())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(job.result, Some(json!({"summary": winner})));
        assert_eq!((job.completed_by, job.version), (Some(winner), 1));
        assert_eq!(job.attempt(winner).unwrap().state, AttemptState::Succeeded);
        assert_eq!(job.attempt(loser).unwrap().state, AttemptState::Discarded);
    }
}

pub(crate) async fn a_duplicate_claim_is_refused(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    let mut tasks = JoinSet::new();
    for _ in 0..10 {
        let (store, id) = (store.clone(), job.id.clone());
        tasks.spawn(async move { store.claim_attempt(&id, 1, lease(), &by(1)).await });
    }
    let results = tasks.join_all().await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results.iter().all(|r| matches!(
        r,
        Ok(_)
            | Err(StoreError::Refused(Refusal::InvalidTransition {
                from: AttemptState::Started,
                ..
            }))
    )));
    let job = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.attempts[0].seen_version, Some(0));
    assert_eq!(job.attempts[0].lease_expires_at, Some(lease()));
    assert_eq!(job.status(), JobStatus::Running);
}

/// Breakpoint 4 at the store: A leaves first and returns last, B leaves second and returns first.
pub(crate) async fn the_attempt_that_answers_first_wins_even_if_it_left_last(
    store: Arc<dyn JobStore>,
) {
    let job = fresh_job(store.as_ref()).await;
    two_claimed_attempts(store.as_ref(), &job).await;
    let (won, after_b) = answer(store.as_ref(), &job, 2, "B", 6).await;
    assert_eq!(won, Completion::Won);
    // The loser's call was paid for: what its provider reported is kept even though its result is not.
    let paid = CallReport {
        model: Some("model-a".into()),
        input_tokens: Some(120),
        output_tokens: Some(9),
        ..CallReport::default()
    };
    let (lost, after_a) = store
        .complete_attempt(&job.id, 1, json!({"summary": "A"}), paid.clone(), &by(7))
        .await
        .unwrap();
    assert_eq!(lost, Completion::Lost { winner: Some(2) });
    assert_eq!(after_a.result, Some(json!({"summary": "B"})));
    assert_eq!(
        (after_a.version, after_a.completed_by, after_a.updated_at),
        (after_b.version, after_b.completed_by, after_b.updated_at)
    );
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Discarded);
    assert_eq!(stored.attempt(1).unwrap().report, Some(paid));
    assert_eq!(stored.attempt(2).unwrap().report, None);
    assert_eq!(stored.result, Some(json!({"summary": "B"})));
}

pub(crate) async fn a_result_after_the_job_was_cancelled_is_discarded(store: Arc<dyn JobStore>) {
    let job = claimed_job(store.as_ref()).await;
    let (cancel, cancelled) = store.cancel_job(&job.owner, &job.id, &by(2)).await.unwrap();
    assert_eq!(cancel, JobCancel::Cancelled);
    assert_eq!(cancelled.version, 1);
    let (outcome, after) = answer(store.as_ref(), &job, 1, "late", 3).await;
    assert_eq!(outcome, Completion::Lost { winner: None });
    assert_eq!(after.status(), JobStatus::Cancelled);
    assert_eq!(after.result, None);
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Discarded);
    assert_eq!((stored.version, stored.result), (1, None));
}
