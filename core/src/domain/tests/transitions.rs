use super::*;

#[test]
fn a_new_job_is_queued_on_its_first_provider() {
    let job = job();
    assert_eq!(job.status(), JobStatus::Queued);
    assert_eq!(job.attempts.len(), 1);
    assert_eq!(job.attempts[0].provider, provider("a"));
    assert_eq!(job.version, 0);
    assert_eq!(job.expires_at, at(0) + Duration::days(30));
}

#[test]
fn the_retention_ends_on_a_whole_second() {
    let end = expiry(at(1), Duration::days(1));
    assert_eq!(end.timestamp_subsec_millis(), 0);
    assert!(
        end >= at(1) + Duration::days(1) && end < at(1) + Duration::days(1) + Duration::seconds(1)
    );
    assert_eq!(expiry(at(0), Duration::days(1)), at(0) + Duration::days(1));
    let job = job();
    assert!(!job.is_expired(job.expires_at - Duration::milliseconds(1)));
    assert!(job.is_expired(job.expires_at));
}

#[test]
fn a_timeout_is_unknown_and_blocks_the_next_attempt() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    assert_eq!(job.status(), JobStatus::Running);
    job.mark_unknown(1, None, &by(2)).unwrap();
    assert_eq!(job.status(), JobStatus::Unknown);
    let before = job.clone();
    assert_eq!(
        job.add_attempt(Some(provider("b")), &nowhere(), &by(3)),
        Err(Refusal::AttemptInProgress {
            number: 1,
            state: AttemptState::Unknown
        })
    );
    assert_eq!(job, before);
    job.cancel_attempt(1, &nowhere(), &by(4)).unwrap();
    assert_eq!(
        job.add_attempt(Some(provider("b")), &nowhere(), &by(5)),
        Ok(2)
    );
}

#[test]
fn the_attempt_that_answers_first_wins_even_if_it_left_last() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.mark_unknown(1, None, &by(2)).unwrap();
    job.cancel_attempt(1, &nowhere(), &by(3)).unwrap();
    job.add_attempt(Some(provider("b")), &nowhere(), &by(4))
        .unwrap();
    job.claim(2, at(30_000), &by(5)).unwrap();
    assert_eq!(
        job.complete(2, json!({"summary": "B"}), CallReport::default(), &by(6)),
        Ok(Completion::Won)
    );
    let after_win = job.clone();
    assert_eq!(
        job.complete(1, json!({"summary": "A"}), CallReport::default(), &by(7)),
        Ok(Completion::Lost { winner: Some(2) })
    );
    assert_eq!(job.result, Some(json!({"summary": "B"})));
    assert_eq!((job.version, job.completed_by), (1, Some(2)));
    assert_eq!(job.attempt(1).unwrap().state, AttemptState::Discarded);
    assert_eq!(job.updated_at, after_win.updated_at);
}

#[test]
fn a_cancelled_attempt_that_answers_while_the_slot_is_free_wins_and_ends_the_queued_one() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.cancel_attempt(1, &to(&["b"]), &by(2)).unwrap();
    assert_eq!(job.attempt(2).unwrap().state, AttemptState::Queued);
    assert_eq!(
        job.complete(1, json!({"summary": "late"}), CallReport::default(), &by(3)),
        Ok(Completion::Won)
    );
    assert_eq!(job.attempt(1).unwrap().state, AttemptState::Succeeded);
    assert_eq!(job.status(), JobStatus::Succeeded);
    assert_eq!(job.attempt(2).unwrap().state, AttemptState::Cancelled);
    assert_eq!(job.live_attempt(), None);
}

#[test]
fn a_cancelled_attempt_answering_after_its_lease_is_discarded_so_a_failed_job_settles() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.cancel_attempt(1, &nowhere(), &by(2)).unwrap();
    assert_eq!(job.status(), JobStatus::Failed);
    assert_eq!(job.settles_at(), Some(at(30_000)));
    assert!(!job.is_settled(at(29_999)));
    assert!(job.is_settled(at(30_000)));
    let mut in_time = job.clone();
    assert_eq!(
        in_time.complete(
            1,
            json!({"summary": "late"}),
            CallReport::default(),
            &by(29_999)
        ),
        Ok(Completion::Won)
    );
    assert_eq!(
        job.complete(
            1,
            json!({"summary": "late"}),
            CallReport::default(),
            &by(30_000)
        ),
        Ok(Completion::Lost { winner: None })
    );
    assert_eq!(
        (job.status(), job.attempt(1).unwrap().state),
        (JobStatus::Failed, AttemptState::Discarded)
    );
}

/// Final: succeeded or cancelled with every attempt ended for good. A cancelled attempt keeps a job from being
/// final (it may still answer), and a failed job never is (its owner may still cancel it).
#[test]
fn a_job_is_final_once_no_write_can_change_it() {
    let mut job = job();
    assert!(!job.is_final());
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.complete(
        1,
        serde_json::json!({"ok": true}),
        CallReport::default(),
        &by(2),
    )
    .unwrap();
    assert!(job.is_final());

    let mut job = failed_job();
    assert!(!job.is_final());
    job.cancel(&by(9)).unwrap();
    assert!(job.is_final(), "cancelled, every attempt failed: {job:?}");

    let mut job = super::job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.cancel(&by(2)).unwrap();
    assert!(!job.is_final(), "its cancelled attempt may still answer");
}

#[test]
fn live_jobs_are_not_settled_and_finished_ones_are() {
    let mut job = job();
    assert_eq!(job.settles_at(), None);
    job.claim(1, at(30_000), &by(1)).unwrap();
    assert_eq!(job.settles_at(), None);
    // A failure without a cancelled attempt behind it settles at once.
    job.fail(
        1,
        provider_error(),
        CallReport::default(),
        &nowhere(),
        &by(2),
    )
    .unwrap();
    assert_eq!(job.settles_at(), Some(at(2)));
    job.cancel(&by(3)).unwrap();
    assert!(job.is_settled(at(3)));
}

#[test]
fn a_started_attempt_of_a_job_another_attempt_won_can_still_become_unknown() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.cancel_attempt(1, &to(&["b"]), &by(2)).unwrap();
    job.claim(2, at(30_000), &by(3)).unwrap();
    job.complete(1, json!({"summary": "late"}), CallReport::default(), &by(4))
        .unwrap();
    job.mark_unknown(2, None, &by(5)).unwrap();
    assert_eq!(job.attempt(2).unwrap().state, AttemptState::Unknown);
    assert_eq!(job.status(), JobStatus::Succeeded);
    assert_eq!(
        job.complete(2, json!({"summary": "B"}), CallReport::default(), &by(6)),
        Ok(Completion::Lost { winner: Some(1) })
    );
}

#[test]
fn a_result_after_the_job_was_cancelled_is_discarded() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    assert_eq!(job.cancel(&by(2)), Ok(JobCancel::Cancelled));
    assert_eq!(job.attempt(1).unwrap().state, AttemptState::Cancelled);
    assert_eq!(
        job.complete(1, json!({"summary": "late"}), CallReport::default(), &by(3)),
        Ok(Completion::Lost { winner: None })
    );
    assert_eq!(job.status(), JobStatus::Cancelled);
    assert_eq!(job.result, None);
    assert_eq!(job.cancel(&by(4)), Ok(JobCancel::AlreadyCancelled));
}

#[test]
fn a_succeeded_job_cannot_be_cancelled_or_retried() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.complete(1, json!({"summary": "x"}), CallReport::default(), &by(2))
        .unwrap();
    let finished = Err(Refusal::JobFinished {
        status: JobStatus::Succeeded,
    });
    assert_eq!(job.cancel(&by(3)).map(|_| ()), finished.clone());
    assert_eq!(
        job.add_attempt(Some(provider("b")), &nowhere(), &by(3))
            .map(|_| ()),
        finished
    );
}

#[test]
fn a_claim_of_a_claimed_attempt_is_refused() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    assert_eq!(
        job.claim(1, at(30_000), &by(2)),
        Err(Refusal::InvalidTransition {
            number: 1,
            from: AttemptState::Started,
            to: AttemptState::Started
        })
    );
    assert_eq!(
        job.claim(7, at(30_000), &by(2)),
        Err(Refusal::NoSuchAttempt { number: 7 })
    );
}

#[test]
fn a_failed_job_may_be_retried_by_hand() {
    let mut job = failed_job();
    assert_eq!(job.status(), JobStatus::Failed);
    assert_eq!(
        job.add_attempt(Some(provider("b")), &nowhere(), &by(3)),
        Ok(2)
    );
    assert_eq!(job.status(), JobStatus::Queued);
}

#[test]
fn error_messages_and_model_ids_are_bounded() {
    let long = "é".repeat(ErrorInfo::MAX_MESSAGE_BYTES);
    let error = ErrorInfo::new("output_invalid", long);
    assert!(error.message.len() <= ErrorInfo::MAX_MESSAGE_BYTES);
    assert!(error.message.ends_with('…'));
    assert_eq!(ErrorInfo::new("x", "short").message, "short");
    let report = CallReport {
        model: Some("m".repeat(10_000)),
        ..CallReport::default()
    };
    let kept = report.into_option().unwrap().model.unwrap();
    assert!(kept.len() <= CallReport::MAX_MODEL_BYTES);
}

#[test]
fn a_redispatch_is_recorded_on_a_queued_attempt_only() {
    let mut job = job();
    job.redispatch(1, at(40_000)).unwrap();
    assert_eq!(job.attempt(1).unwrap().dispatched_at, at(40_000));
    job.claim(1, at(90_000), &by(40_001)).unwrap();
    assert!(job.redispatch(1, at(40_002)).is_err());
}

/// Invariant 14: the orphan a late winner leaves behind (`started` when attempt 1's answer won) times out, then
/// fails; neither write settles the job again, so its settle, and the event id derived from it, stay as they were.
#[test]
fn writes_to_a_settled_job_that_leave_its_outcome_do_not_move_its_settle() {
    use crate::domain::event::event_id;
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.cancel_attempt(1, &to(&["b"]), &by(2)).unwrap();
    job.claim(2, at(60_000), &by(3)).unwrap();
    job.complete(1, json!({"summary": "late"}), CallReport::default(), &by(4))
        .unwrap();
    let settled = job.settles_at().expect("succeeded");
    assert_eq!(settled, at(4));
    let id = event_id(&job, settled);
    job.mark_unknown(2, None, &by(50)).unwrap();
    assert_eq!(job.settles_at(), Some(settled), "time-out of the orphan");
    job.fail(
        2,
        provider_error(),
        CallReport::default(),
        &to(&["c"]),
        &by(60),
    )
    .unwrap();
    assert_eq!(job.settles_at(), Some(settled), "failure of the orphan");
    assert_eq!(event_id(&job, job.settles_at().unwrap()), id);
    assert_eq!(job.live_attempt(), None, "nothing queued after a win");

    // A failed job waits out its cancelled attempt's lease; the answer that comes after it is discarded, and the
    // settle stays at the lease's end.
    let mut job = super::job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.cancel_attempt(1, &nowhere(), &by(2)).unwrap();
    assert_eq!(job.settles_at(), Some(at(30_000)));
    job.complete(
        1,
        json!({"summary": "late"}),
        CallReport::default(),
        &by(40_000),
    )
    .unwrap();
    assert_eq!(job.attempt(1).unwrap().state, AttemptState::Discarded);
    assert_eq!(job.settles_at(), Some(at(30_000)));
}

/// Found by the model checker (core/tests/protocol): a cancelled attempt's provider that answers after all without
/// a result. What it said and what the call used are kept on the attempt, which stays cancelled; nothing else of
/// the job moves — not its status, not when it settles (invariant 14) — and the write repeated under its token is
/// the same write.
#[test]
fn a_cancelled_attempts_late_failure_keeps_its_usage_and_moves_nothing_else() {
    let mut job = job();
    job.claim(1, at(30_000), &by(1)).unwrap();
    job.cancel_attempt(1, &nowhere(), &by(2)).unwrap();
    let before = job.clone();
    let report = CallReport {
        output_tokens: Some(10),
        ..CallReport::default()
    };
    let late = by(3);
    let broke = ErrorInfo::new("output_invalid", "the answer breaks the contract");
    job.fail(1, broke.clone(), report.clone(), &nowhere(), &late)
        .unwrap();
    let attempt = job.attempt(1).unwrap();
    assert_eq!(attempt.state, AttemptState::Cancelled);
    assert_eq!(
        (attempt.error.as_ref(), attempt.report.as_ref()),
        (Some(&broke), Some(&report))
    );
    assert_eq!(
        (
            job.status(),
            job.settles_at(),
            job.updated_at,
            job.attempts.len()
        ),
        (
            before.status(),
            before.settles_at(),
            before.updated_at,
            before.attempts.len()
        )
    );
    let once = job.clone();
    job.fail(1, broke, report, &nowhere(), &late).unwrap();
    assert_eq!(job, once, "the same write again");
    let bill = Bill::of(&job);
    assert_eq!((bill.failed.attempts, bill.failed.output_tokens), (1, 10));
    assert!(bill.unknown.is_empty());
}
