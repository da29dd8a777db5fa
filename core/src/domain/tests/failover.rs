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

/// Failover to `b`, with retries of the failing provider: 2 in a row within 60 s, backoff from 1 s at `jitter`.
fn retrying(jitter_permille: u16) -> Failover {
    Failover {
        retry: Some(RetryPolicy {
            max_retries: 2,
            within: Duration::seconds(60),
            base: Duration::seconds(1),
            cap: Duration::seconds(30),
        }),
        jitter_permille,
        ..to(&["b"])
    }
}

fn rate_limited(retry_after_s: Option<u64>) -> (ErrorInfo, CallReport) {
    let report = CallReport {
        retry_after_s,
        ..CallReport::default()
    };
    (ErrorInfo::new("rate_limited", "429"), report)
}

/// Claims attempt `number` at `ms` and fails it then with `error`.
fn run_and_fail(
    job: &mut Job,
    number: u32,
    ms: i64,
    (error, report): (ErrorInfo, CallReport),
    failover: &Failover,
) {
    job.claim(number, at(ms + 30_000), &by(ms)).unwrap();
    job.fail(number, error, report, failover, &by(ms)).unwrap();
}

#[test]
fn a_refusal_that_did_no_work_is_retried_on_its_provider_then_fails_over() {
    let mut job = job();
    run_and_fail(&mut job, 1, 1_000, rate_limited(Some(5)), &retrying(0));
    let retry = job.attempt(2).unwrap();
    assert_eq!(
        (
            &retry.provider,
            retry.retry_of,
            retry.not_before,
            retry.dispatched_at
        ),
        (&provider("a"), Some(1), Some(at(6_000)), at(6_000))
    );
    // Not before its time.
    assert_eq!(
        job.claim(2, at(40_000), &by(5_999)),
        Err(Refusal::NotYet {
            number: 2,
            not_before: at(6_000)
        })
    );
    // Without Retry-After: a backoff, 2 s for the second retry (equal jitter: between 1 and 2 s).
    run_and_fail(&mut job, 2, 6_000, rate_limited(None), &retrying(0));
    assert_eq!(job.attempt(3).unwrap().not_before, Some(at(7_000)));
    // Two retries in a row are the policy's: the third refusal fails over to b.
    run_and_fail(&mut job, 3, 7_000, rate_limited(None), &retrying(1_000));
    let next = job.attempt(4).unwrap();
    assert_eq!(
        (&next.provider, next.retry_of, next.not_before),
        (&provider("b"), None, None)
    );
}

#[test]
fn only_a_refusal_that_did_no_work_within_the_window_is_retried() {
    // Another failure: failover.
    let mut job = job();
    run_and_fail(
        &mut job,
        1,
        0,
        (provider_error(), CallReport::default()),
        &retrying(0),
    );
    assert_eq!(job.attempt(2).unwrap().provider, provider("b"));
    // A Retry-After past the window: failover.
    let mut job = super::job();
    run_and_fail(&mut job, 1, 0, rate_limited(Some(61)), &retrying(0));
    assert_eq!(job.attempt(2).unwrap().provider, provider("b"));
    // No retry policy: failover.
    let mut job = super::job();
    run_and_fail(&mut job, 1, 0, rate_limited(Some(1)), &to(&["b"]));
    assert_eq!(job.attempt(2).unwrap().provider, provider("b"));
    // An attempt that was unknown may have done the work, whatever it said later: never retried.
    let mut job = super::job();
    job.claim(1, at(30_000), &by(0)).unwrap();
    job.mark_unknown(1, None, &by(1)).unwrap();
    let (error, report) = rate_limited(Some(1));
    job.fail(1, error, report, &retrying(0), &by(2)).unwrap();
    assert_eq!(job.attempt(2).unwrap().provider, provider("b"));
    // A job cancelled while the attempt ran: its failure is kept on the cancelled attempt, and nothing is queued.
    let mut job = super::job();
    job.claim(1, at(30_000), &by(0)).unwrap();
    job.cancel(&by(1)).unwrap();
    let (error, report) = rate_limited(Some(1));
    job.fail(1, error, report, &retrying(0), &by(2)).unwrap();
    assert_eq!(job.attempts.len(), 1);
    assert_eq!(job.attempt(1).unwrap().state, AttemptState::Cancelled);
    assert!(job.attempt(1).unwrap().error.is_some());
}

fn evidence(model: &str) -> Qualification {
    Qualification {
        contract: ContractRef::parse("summarize@1").unwrap(),
        contract_fingerprint: Fingerprint::of_value(&json!("contract")),
        provider: provider("b"),
        provider_fingerprint: Fingerprint::of_value(&json!("provider")),
        passed: true,
        runs_per_sample: 1,
        checked_at: at(0),
        runs: vec![RunEvidence {
            sample: 0,
            run: 1,
            problem: None,
            elapsed_ms: 1,
            counted_prompt_tokens: None,
            report: Some(CallReport {
                model: Some(model.into()),
                ..CallReport::default()
            }),
        }],
        strikes: Vec::new(),
        suspected: None,
    }
}

/// Evidence ages; production only suspects (invariant 15): breaches any owner's inputs can cause, or a model
/// qualification never saw, leave the standing as it was and call for a new qualification.
#[test]
fn evidence_ages_and_production_only_suspects() {
    let month = Duration::days(30);
    let mut q = evidence("m");
    assert_eq!(
        q.standing(at(0) + month, month),
        (Standing::Qualified, None)
    );
    let (stale, why) = q.standing(at(1) + month, month);
    assert_eq!(
        (stale, why.unwrap().code.as_str()),
        (Standing::Unqualified, "qualification_stale")
    );
    // The model it was qualified as, keeping the contract: nothing to write.
    assert!(!q.observe("j#1", Some("m"), None, at(1)));
    // Breaches count once per attempt; the third makes it suspected, naming the three attempts, and it stays
    // qualified.
    let bad = ErrorInfo::new(
        "output_invalid",
        "the answer quoted: Bearer sk-secret, an owner's text",
    );
    assert!(q.observe("j#2", Some("m"), Some(&bad), at(2)));
    assert!(!q.observe("j#2", Some("m"), Some(&bad), at(2)));
    assert!(q.observe("j#3", None, Some(&bad), at(3)));
    assert!(q.observe("j#4", Some("m"), Some(&bad), at(4)));
    assert_eq!(q.standing(at(4), month), (Standing::Qualified, None));
    let suspicion = q.suspected.as_ref().unwrap();
    assert_eq!(suspicion.attempts, ["j#2", "j#3", "j#4"]);
    assert_eq!(suspicion.reason.code, "contract_broken");
    assert!(
        !suspicion.reason.message.contains("owner's text"),
        "no answer's text in the shared ledger: {suspicion:?}"
    );
    // Suspected stays suspected until qualified again: another breach writes nothing more.
    assert!(!q.observe("j#5", Some("m"), Some(&bad), at(5)));
    // But an answer as another model voids even a suspected standing.
    assert!(q.observe("j#6", Some("other"), None, at(6)));
    assert_eq!(q.standing(at(6), month).0, Standing::Unqualified);

    // Another model: the provider's own evidence voids the standing at once, until it is qualified again.
    let mut q = evidence("m");
    assert!(q.observe("j#1", Some("m-2"), None, at(1)));
    let voided = q.suspected.clone().unwrap();
    assert_eq!(voided.reason.code, "model_changed");
    assert_eq!(voided.attempts, ["j#1"]);
    assert_eq!(
        q.standing(at(1), month),
        (Standing::Unqualified, Some(voided.reason))
    );
    assert!(!q.observe("j#2", Some("m-3"), None, at(2)));
    // Evidence without a reported model is not compared; failed evidence is not watched.
    let mut unnamed = evidence("m");
    unnamed.runs[0].report = None;
    assert!(!unnamed.observe("j#1", Some("m-2"), None, at(1)));
    let mut failed = evidence("m");
    failed.passed = false;
    assert!(!failed.observe("j#1", Some("m-2"), None, at(1)));
    // Evidence written when production took standings away reads as suspected, and qualifies.
    let mut old = serde_json::to_value(evidence("m")).unwrap();
    old["lost"] = json!({"reason": {"code": "contract_broken", "message": "3 answers"}, "at": "2027-01-15T08:00:00Z", "attempts": ["j#1"]});
    let old: Qualification = serde_json::from_value(old).unwrap();
    assert_eq!(old.suspected.unwrap().attempts, ["j#1"]);
}

#[test]
fn a_provider_sets_its_own_retry_limits_and_a_contract_only_lowers_them() {
    let deployment = retrying(0).retry.unwrap();
    let limits = |retries, within| RetryLimits {
        retries,
        retry_within_ms: within,
    };
    let unset = RetryLimits::default();
    assert_eq!(deployment.limited(unset, unset), deployment);
    let generous = deployment.limited(limits(Some(5), Some(600_000)), unset);
    assert_eq!(
        (generous.max_retries, generous.within),
        (5, Duration::minutes(10))
    );
    let capped = deployment.limited(
        limits(Some(5), Some(600_000)),
        limits(Some(1), Some(20_000)),
    );
    assert_eq!(
        (capped.max_retries, capped.within),
        (1, Duration::seconds(20))
    );
    // A contract never raises what the provider (or the deployment) allows.
    let not_raised = deployment.limited(limits(Some(0), None), limits(Some(9), Some(600_000)));
    assert_eq!(
        (not_raised.max_retries, not_raised.within),
        (0, Duration::seconds(60))
    );
}
