use proptest::prelude::*;

use super::*;

/// One step of the attempt life cycle, chosen at random.
#[derive(Debug, Clone)]
enum Step {
    Add,
    Claim(u32),
    Unknown(u32),
    Complete(u32),
    Fail(u32),
    CancelAttempt(u32),
    CancelJob,
    /// The last write again, with its token: as if its answer had been lost.
    Repeat,
}

fn arb_step() -> impl Strategy<Value = Step> {
    let n = 1u32..5;
    prop_oneof![
        Just(Step::Add),
        n.clone().prop_map(Step::Claim),
        n.clone().prop_map(Step::Unknown),
        n.clone().prop_map(Step::Complete),
        n.clone().prop_map(Step::Fail),
        n.prop_map(Step::CancelAttempt),
        Just(Step::CancelJob),
        Just(Step::Repeat),
    ]
}

fn apply(job: &mut Job, step: &Step, stamp: &Stamp, winners: &mut usize) -> Result<(), Refusal> {
    match *step {
        Step::Add => job
            .add_attempt(Some(provider("b")), &nowhere(), stamp)
            .map(|_| ()),
        Step::Claim(n) => job.claim(n, at(1_000), stamp),
        Step::Unknown(n) => job.mark_unknown(n, None, stamp),
        Step::Complete(n) => job
            .complete(n, json!({"n": n}), CallReport::default(), stamp)
            .map(|c| {
                if c == Completion::Won {
                    *winners += 1
                }
            }),
        Step::Fail(n) => job.fail(
            n,
            ErrorInfo::new("x", "y"),
            CallReport::default(),
            &to(&["a", "b"]),
            stamp,
        ),
        Step::CancelAttempt(n) => job
            .cancel_attempt(n, &to(&["a", "b", "c"]), stamp)
            .map(|_| ()),
        Step::CancelJob => job.cancel(stamp).map(|_| ()),
        Step::Repeat => Ok(()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]
    #[test]
    fn no_sequence_of_transitions_breaks_the_invariants(steps in prop::collection::vec(arb_step(), 0..40)) {
        let mut job = job();
        let mut winners = 0;
        let mut last: Option<(Step, Stamp, Result<(), Refusal>, Job)> = None;
        for (i, step) in steps.into_iter().enumerate() {
            let before = job.clone();
            if let Step::Repeat = step {
                // A repeat of a write that landed changes nothing and answers as the write did.
                if let Some((step, stamp, outcome, after)) = &last {
                    // Its answer is the first one's (a repeated win says "won" again), so it is not counted.
                    let mut answered_again = 0;
                    let again = apply(&mut job, step, &Stamp::new(stamp.token.clone(), at(i as i64 + 1)), &mut answered_again);
                    if outcome.is_ok() && &job == after {
                        prop_assert!(again.is_ok(), "{step:?} repeated: {again:?}");
                        prop_assert_eq!(&job, &before, "{:?} repeated changed the job", step);
                    }
                    if again.is_err() || before.is_final() {
                        prop_assert_eq!(&job, &before, "a refusal, or a write on a final job, changed it");
                    }
                }
                continue;
            }
            let stamp = by(i as i64 + 1);
            let outcome = apply(&mut job, &step, &stamp, &mut winners);
            if outcome.is_err() || before.is_final() {
                prop_assert_eq!(&job, &before, "a refusal, or a write on a final job, changed it");
            }
            last = Some((step.clone(), stamp, outcome, job.clone()));
            let live = job.attempts.iter().filter(|a| a.state.is_live()).count();
            prop_assert!(live <= 1, "{} live attempts", live);
            let succeeded = job.attempts.iter().filter(|a| a.state == AttemptState::Succeeded).count();
            prop_assert!(succeeded <= 1 && winners <= 1);
            prop_assert_eq!(job.completed_by.is_some(), succeeded == 1);
            prop_assert_eq!(job.result.is_some(), job.completed_by.is_some());
            prop_assert!(job.version >= before.version);
            prop_assert!(job.attempts.iter().all(|a| a.state != AttemptState::Queued) || job.completed_by.is_none(),
                "a queued attempt in a succeeded job");
            if before.completed_by.is_some() {
                prop_assert_eq!(&job.result, &before.result, "a result was replaced");
            }
            // Invariant 14: a job that stays settled with the same outcome keeps its settle (its event id).
            if let (Some(was), Some(is)) = (before.settles_at(), job.settles_at())
                && before.status() == job.status()
            {
                prop_assert_eq!(was, is, "{:?} moved the settle of a {:?} job", step, job.status());
            }
        }
    }
}
