use super::*;

#[test]
fn failover_goes_to_the_next_untried_provider_if_it_is_qualified() {
    let mut job = job();
    assert_eq!(
        job.failover_decision(&to(&["b"])),
        FailoverDecision::Queue(provider("b"))
    );
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.fail(
        1,
        provider_error(),
        CallReport::default(),
        &to(&["b"]),
        &by(2),
    )
    .unwrap();
    assert_eq!(job.status(), JobStatus::Queued);
    assert_eq!(job.attempt(2).unwrap().provider, provider("b"));
    job.claim(2, at(30_000), &by(3)).unwrap();
    let next = job.failover_decision(&to(&["a", "b"]));
    assert!(
        matches!(&next, FailoverDecision::Stop(e) if e.code == "fallback_not_qualified"),
        "{next:?}"
    );
    job.cancel_attempt(2, &to(&["a", "b"]), &by(4)).unwrap();
    assert_eq!(job.status(), JobStatus::Failed);
    assert_eq!(job.error.as_ref().unwrap().code, "fallback_not_qualified");
    assert_eq!(job.attempts.len(), 2);
    // A manual retry clears the error; once every provider was tried, the chain is exhausted.
    job.add_attempt(Some(provider("c")), &nowhere(), &by(5))
        .unwrap();
    assert_eq!(job.error, None);
    assert!(
        matches!(job.failover_decision(&to(&["c"])), FailoverDecision::Stop(e) if e.code == "providers_exhausted")
    );
}

#[test]
fn failover_is_decided_on_the_state_the_write_lands_on() {
    let mut job = job();
    // A cancel decided while attempt 1 was live, landing after attempt 1 failed over to b: b was tried, so
    // the cancel of attempt 2 goes to c, not to b again.
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.fail(
        1,
        provider_error(),
        CallReport::default(),
        &to(&["b", "c"]),
        &by(2),
    )
    .unwrap();
    job.cancel_attempt(2, &to(&["b", "c"]), &by(3)).unwrap();
    assert_eq!(job.attempt(3).unwrap().provider, provider("c"));
}

#[test]
fn a_manual_retry_without_a_provider_takes_the_next_qualified_one_else_the_primary() {
    let mut job = failed_job();
    assert_eq!(job.error.as_ref().unwrap().code, "fallback_not_qualified");
    // b was refused as unqualified: a retry that names nobody goes to c, which is qualified...
    let number = job.add_attempt(None, &to(&["c"]), &by(3)).unwrap();
    assert_eq!(job.attempt(number).unwrap().provider, provider("c"));
    job.cancel_attempt(number, &nowhere(), &by(4)).unwrap();
    // ... and with nobody qualified, to the primary.
    let number = job.add_attempt(None, &nowhere(), &by(5)).unwrap();
    assert_eq!(job.attempt(number).unwrap().provider, provider("a"));
}

#[test]
fn a_job_stops_at_its_attempt_limit() {
    let mut job = job();
    let limit = Failover {
        max_attempts: 2,
        ..to(&["b", "c"])
    };
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.fail(1, provider_error(), CallReport::default(), &limit, &by(2))
        .unwrap();
    job.claim(2, at(30_000), &by(3)).unwrap();
    job.fail(2, provider_error(), CallReport::default(), &limit, &by(4))
        .unwrap();
    assert_eq!(job.attempts.len(), 2);
    assert_eq!(job.error.as_ref().unwrap().code, "attempt_limit_reached");
    let before = job.clone();
    assert_eq!(
        job.add_attempt(None, &limit, &by(5)),
        Err(Refusal::AttemptLimitReached { limit: 2 })
    );
    assert_eq!(job, before);
}
