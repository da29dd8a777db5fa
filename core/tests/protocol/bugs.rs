//! Broken variants of the protocol, each behind a seam of the model (never of the product): the checker must find
//! each one out, through the property it breaks. They are the proof that the checker bites.

use onejob_core::domain::{AttemptState, Job};

/// A deliberately broken transition or step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bug {
    /// The create puts the job whatever is there (no condition): a second job for the key. Breaks invariant 1.
    UnconditionalCreate,
    /// A create tried again after its write's answer was lost does not know its own write (no token): it answers
    /// the job it made as a replay, and nobody is told 201. Breaks invariant 2's liveness.
    RepeatWithoutToken,
    /// A create that finds a job of the same payload answers 201, as if it had made it. Breaks invariant 2.
    ReplayAnswersCreated,
    /// A create that finds the key with another payload answers the job as a replay. Breaks invariant 3.
    ConflictAnswered,
    /// A time-out fails over as a failure does: a second attempt while the first may still be working. Breaks
    /// invariant 4.
    UnknownFailsOver,
    /// The time-out writes `failed`, not `unknown`. Breaks invariant 5.
    TimeoutFails,
    /// The completion takes the slot without comparing: a later result overwrites the first. Breaks invariant 6.
    CompleteWithoutSwap,
    /// The claim takes any `started` attempt for its own, whatever token claimed it: a redelivered message calls
    /// the provider again. Breaks invariant 8.
    ClaimWithoutToken,
    /// Failover goes to the next provider of the chain, qualified or not. Breaks invariant 9.
    FailoverUnqualified,
    /// The late window and the answer race unbiased: the window may end with an answer in hand, dropped. Breaks
    /// invariants 11 and 16.
    UnbiasedLateWindow,
    /// A job settles when it was last written (`updated_at`), as before the first issue's fix: an orphaned
    /// attempt's time-out after the result announces a second settle. Breaks invariant 14.
    SettleFromUpdatedAt,
    /// The sweeper never sends a lost message again: a job whose first message was lost never runs. Breaks
    /// invariant 12's liveness.
    NoRedispatch,
    /// A redelivered message of an ended job does not arm its event again: an event whose arming failed is never
    /// delivered. Breaks invariant 14's liveness.
    NoRearm,
    /// The reconciler takes the provider's "no such call" as absence while the call may still be running (before
    /// `lookup_absent_after_ms`): it clears the attempt by lookup and retries a provider that may yet do, and bill,
    /// the first call's work. Breaks "a lookup is no call".
    AbsenceTooEarly,
    /// The reconciler writes an answer it found without the compare-and-swap: onto the attempt as it read it
    /// (`unknown`, the slot free), whatever was written since — a person's cancel, another attempt's win. Breaks
    /// invariant 6.
    FoundWithoutSwap,
    /// The reconciler acts before the attempt's lease ends, while its worker may still hear the answer. Breaks
    /// "the reconciler never races the worker".
    BeforeLease,
    /// The reconciler "looks up" a call by making it again (the same request, trusting the provider's idempotency
    /// to answer the stored one). Breaks invariant 8: a lookup is no call.
    LookupCalls,
    /// The reconciler writes an answer it found under a worker's stamp, not a lookup's: the attempt says a late
    /// answer cleared it. Breaks "cleared is recorded as it happened".
    FoundUnmarked,
    /// The reconciler stops asking about an attempt once its provider said "no such call" too early to count: the
    /// attempt stays `unknown` for good. Breaks "an unknown clears by itself" (liveness).
    AskOnce,
    /// A claim whose answer was lost lands again later and keeps its first try's lease and `started_at`, and its
    /// call is made all the same and listened to past the lease: a reconciler, counting from `started_at`, takes the
    /// provider's "no such call" as absence while the call may still run and retries it. Breaks "paid once". (The
    /// checker found this in the product; a claim that late is no longer called.)
    ListensPastLease,
    /// A reconciler's write that landed, and whose step failed after it, leaves an ended job's event unarmed: the
    /// lookup's redelivery drops an attempt no longer `unknown` without arming, and a clear by policy given up arms
    /// nothing. Breaks invariant 14's liveness. (The checker found this in the product, on DynamoDB.)
    UnarmedAfterReconciler,
}

impl Bug {
    pub(crate) const ALL: [Self; 21] = [
        Self::UnconditionalCreate,
        Self::RepeatWithoutToken,
        Self::ReplayAnswersCreated,
        Self::ConflictAnswered,
        Self::UnknownFailsOver,
        Self::TimeoutFails,
        Self::CompleteWithoutSwap,
        Self::ClaimWithoutToken,
        Self::FailoverUnqualified,
        Self::UnbiasedLateWindow,
        Self::SettleFromUpdatedAt,
        Self::NoRedispatch,
        Self::NoRearm,
        Self::AbsenceTooEarly,
        Self::FoundWithoutSwap,
        Self::BeforeLease,
        Self::LookupCalls,
        Self::FoundUnmarked,
        Self::AskOnce,
        Self::ListensPastLease,
        Self::UnarmedAfterReconciler,
    ];
}

/// The job as a broken settle sees it: a succeeded job settles when it was last written.
pub(crate) fn settled_from_updated_at(job: &Job) -> Job {
    let mut seen = job.clone();
    if let Some(winner) = seen.completed_by
        && let Some(attempt) = seen.attempts.iter_mut().find(|a| a.number == winner)
    {
        attempt.finished_at = Some(job.updated_at);
    }
    seen
}

/// The job as a completion without compare-and-swap sees it: the slot free, the version the attempt's own.
pub(crate) fn slot_looks_free(job: &mut Job, number: u32) {
    let version = job.version;
    job.completed_by = None;
    if let Some(attempt) = job.attempts.iter_mut().find(|a| a.number == number) {
        attempt.seen_version = Some(version);
        if attempt.state == AttemptState::Discarded {
            attempt.state = AttemptState::Started;
        }
    }
}

/// The job as a reconciler's write without compare-and-swap sees it ([`Bug::FoundWithoutSwap`]): attempt `number`
/// as it read it, `unknown`, and the result slot free at the version the attempt saw.
pub(crate) fn found_over_slot(job: &mut Job, number: u32) {
    let version = job.version;
    job.completed_by = None;
    if let Some(attempt) = job.attempts.iter_mut().find(|a| a.number == number) {
        attempt.seen_version = Some(version);
        attempt.state = AttemptState::Unknown;
    }
}
