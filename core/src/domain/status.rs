//! A job's status and its settle, derived from its fields and its attempts (`docs/design.md`, States): what every view
//! shows, what the stores index, and what a completion event is made of (invariants 12 and 14).

use serde::{Deserialize, Serialize};

use super::attempt::{Attempt, AttemptState};
use super::job::Job;
use super::time::Timestamp;

/// A job's status, derived from its fields and its attempts (`docs/design.md`, States).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Unknown,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [Self; 6] = [
        Self::Queued,
        Self::Running,
        Self::Unknown,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Unknown => "unknown",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

impl Job {
    pub fn status(&self) -> JobStatus {
        if self.completed_by.is_some() {
            return JobStatus::Succeeded;
        }
        if self.cancelled_at.is_some() {
            return JobStatus::Cancelled;
        }
        match self.live_attempt().map(|a| a.state) {
            Some(AttemptState::Queued) => JobStatus::Queued,
            Some(AttemptState::Started) => JobStatus::Running,
            Some(_) => JobStatus::Unknown,
            None => JobStatus::Failed,
        }
    }

    /// Whether the job is `queued`, `running` or `unknown`: what a place among its owner's live jobs stands for.
    pub fn is_live(&self) -> bool {
        matches!(
            self.status(),
            JobStatus::Queued | JobStatus::Running | JobStatus::Unknown
        )
    }

    pub fn live_attempt(&self) -> Option<&Attempt> {
        self.attempts.iter().find(|a| a.state.is_live())
    }

    /// From when nothing can change the job's outcome any more without someone asking (invariant 12); `None`
    /// while an attempt is live. A failed job whose cancelled attempt may still answer, and win, settles when that
    /// attempt's lease ends: after it, its answer is discarded.
    ///
    /// The time is read off what settled the job, never off a later write (invariant 14): the winning attempt's
    /// answer, the cancel, or the write that failed the job and the leases of the cancelled attempts it had to wait
    /// out. An orphaned attempt of a succeeded job that times out or fails afterwards, or a cancelled attempt whose
    /// answer is discarded after its lease, leaves it where it was: one settle, one event id.
    pub fn settles_at(&self) -> Option<Timestamp> {
        match self.status() {
            JobStatus::Queued | JobStatus::Running | JobStatus::Unknown => None,
            JobStatus::Succeeded => Some(
                self.completed_by
                    .and_then(|winner| self.attempt(winner)?.finished_at)
                    .unwrap_or(self.updated_at),
            ),
            JobStatus::Cancelled => Some(self.cancelled_at.unwrap_or(self.updated_at)),
            JobStatus::Failed => Some(
                self.attempts
                    .iter()
                    .filter(|a| self.waited_out(a))
                    .filter_map(|a| a.lease_expires_at)
                    .fold(self.updated_at, Timestamp::max),
            ),
        }
    }

    pub fn is_settled(&self, now: Timestamp) -> bool {
        self.settles_at().is_some_and(|at| at <= now)
    }

    /// Whether no write can change the job any more (only its expiry ends it): it succeeded or was cancelled, and
    /// every attempt ended for good — none live, none cancelled (a cancelled attempt may still answer, and be
    /// recorded as discarded).
    pub fn is_final(&self) -> bool {
        matches!(self.status(), JobStatus::Succeeded | JobStatus::Cancelled)
            && self.attempts.iter().all(|a| {
                matches!(
                    a.state,
                    AttemptState::Succeeded | AttemptState::Failed | AttemptState::Discarded
                )
            })
    }

    /// An attempt whose lease a failed job waits out before it settles: a cancelled one claimed while the job
    /// stood as it stands, whose answer would still win until its lease ends — or whose answer came after it and
    /// was discarded (the settle it waited for stays where it was).
    fn waited_out(&self, attempt: &Attempt) -> bool {
        matches!(
            attempt.state,
            AttemptState::Cancelled | AttemptState::Discarded
        ) && attempt.seen_version == Some(self.version)
            && self.completed_by.is_none()
    }
}
