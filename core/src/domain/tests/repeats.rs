use super::*;

#[test]
fn every_transition_repeated_with_its_token_answers_the_same_and_changes_nothing() {
    let mut job = job();
    let (claim, unknown, fail) = (by(1), by(2), by(3));
    job.claim(1, at(30_000), &claim).unwrap();
    let claimed = job.clone();
    job.claim(1, at(30_000), &claim).unwrap();
    assert_eq!(job, claimed);
    job.mark_unknown(1, None, &unknown).unwrap();
    let once = job.clone();
    job.mark_unknown(1, None, &unknown).unwrap();
    assert_eq!(job, once);
    job.fail(
        1,
        provider_error(),
        CallReport::default(),
        &to(&["b"]),
        &fail,
    )
    .unwrap();
    let failed = job.clone();
    // The repeat finds its own failure: no second failover attempt.
    job.fail(
        1,
        provider_error(),
        CallReport::default(),
        &to(&["b"]),
        &fail,
    )
    .unwrap();
    assert_eq!(job, failed);
    assert_ne!(job, once);
    assert_eq!(job.attempts.len(), 2);
    // Another writer's claim of the claimed attempt is refused; the claimant's own repeat is not.
    let claim = by(4);
    job.claim(2, at(30_000), &claim).unwrap();
    assert!(job.claim(2, at(30_000), &by(4)).is_err());
    job.claim(2, at(30_000), &claim).unwrap();
    let complete = by(5);
    let result = json!({"summary": "x"});
    for _ in 0..2 {
        assert_eq!(
            job.complete(2, result.clone(), CallReport::default(), &complete),
            Ok(Completion::Won)
        );
    }
    assert_eq!(job.version, 1);
    assert!(
        job.complete(2, result, CallReport::default(), &by(6))
            .is_err(),
        "another writer's result for the same attempt"
    );
}

#[test]
fn a_manual_retry_repeated_with_its_token_finds_its_attempt() {
    let mut job = failed_job();
    let retry = by(3);
    assert_eq!(
        job.add_attempt(Some(provider("b")), &nowhere(), &retry),
        Ok(2)
    );
    job.claim(2, at(30_000), &by(4)).unwrap();
    // The repeat (a lost answer) finds attempt 2, though it has moved on; another writer is refused.
    assert_eq!(
        job.add_attempt(Some(provider("b")), &nowhere(), &retry),
        Ok(2)
    );
    assert!(matches!(
        job.add_attempt(Some(provider("b")), &nowhere(), &by(5)),
        Err(Refusal::AttemptInProgress { number: 2, .. })
    ));
    assert_eq!(job.attempts.len(), 2);
}

#[test]
fn a_cancelled_attempt_cancelled_again_is_an_answer_not_an_error() {
    let mut job = job();
    let cancel = by(1);
    assert_eq!(
        job.cancel_attempt(1, &nowhere(), &cancel),
        Ok(AttemptCancel::Cancelled)
    );
    let once = job.clone();
    assert_eq!(
        job.cancel_attempt(1, &nowhere(), &cancel),
        Ok(AttemptCancel::Cancelled)
    );
    assert_eq!(
        job.cancel_attempt(1, &nowhere(), &by(2)),
        Ok(AttemptCancel::AlreadyCancelled)
    );
    assert_eq!(job, once);
}
