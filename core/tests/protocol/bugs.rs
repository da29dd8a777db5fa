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
}

impl Bug {
    pub(crate) const ALL: [Self; 13] = [
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
