//! One try at a job: its state, its record, and the name a queue message carries.

use serde::{Deserialize, Serialize};

use super::ids::{JobId, ProviderName, WriteToken};
use super::report::{CallReport, ErrorInfo};
use super::time::Timestamp;
use super::write::{Refusal, Stamp};

/// Where one try at a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    Queued,
    Started,
    Succeeded,
    Failed,
    /// Timed out, lost its connection after sending, or its worker's lease expired: the provider may still have
    /// done the work. Blocks new attempts until resolved.
    Unknown,
    /// Completed after another attempt had already won (or after the job was cancelled): its payload was dropped.
    Discarded,
    /// Resolved out of band: stop waiting, allow the next attempt.
    Cancelled,
}

impl AttemptState {
    pub const ALL: [Self; 7] = [
        Self::Queued,
        Self::Started,
        Self::Succeeded,
        Self::Failed,
        Self::Unknown,
        Self::Discarded,
        Self::Cancelled,
    ];

    /// A live attempt blocks any other: at most one is live per job (invariant 4).
    pub fn is_live(self) -> bool {
        matches!(self, Self::Queued | Self::Started | Self::Unknown)
    }

    /// Its call is over: it ended with what the call came to (a result, a failure, an answer discarded). A
    /// `started`, `unknown` or `cancelled` attempt's call may still be running.
    pub fn call_over(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Discarded)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Started => "started",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::Discarded => "discarded",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// One concrete try at a job on one provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// 1, 2, … in creation order; never reused.
    pub number: u32,
    pub provider: ProviderName,
    pub state: AttemptState,
    /// The job's `version` when this attempt was claimed: its result may win only if the job is still there.
    pub seen_version: Option<u64>,
    /// The end of the lease its claim took: until then the claiming worker owns it (past it, while still
    /// `started`, the sweeper makes it `unknown`). Kept after the attempt moves on: once it is `cancelled`, a late
    /// answer wins only before this moment, so a failed job is settled from then on (invariant 12).
    pub lease_expires_at: Option<Timestamp>,
    pub created_at: Timestamp,
    /// When it was last handed to the queue: at creation (for a retry, the moment it may run), then by each
    /// re-dispatch of the sweeper.
    pub dispatched_at: Timestamp,
    /// A retry's earliest start: no worker claims it before (the provider's `Retry-After`, or a backoff).
    pub not_before: Option<Timestamp>,
    /// The attempt this one retries on the same provider, after it was refused without doing the work.
    pub retry_of: Option<u32>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub error: Option<ErrorInfo>,
    /// What the provider reported about the call (model, token usage, `Retry-After`), once it answered.
    pub report: Option<CallReport>,
    /// The token of the write that queued it (a create, a manual retry, a failover): a repeat of that write finds
    /// it here. `None` only on attempts stored before tokens existed.
    pub origin: Option<WriteToken>,
    /// The token of the last write that moved its state (claim, time-out, completion, failure, cancel).
    pub writer: Option<WriteToken>,
    /// The caller's request that queued it by hand under an `Idempotency-Key` (see `WriteToken::for_request`).
    pub request: Option<WriteToken>,
    /// The token of the attempt cancel that cancelled it by hand, kept when a late answer moves it on: that cancel
    /// sent again answers as it did.
    pub cancelled_by: Option<WriteToken>,
    /// How it left `unknown`, and when: what a person reads of an ambiguity that cleared (`None` while it is
    /// unknown, and for an attempt that never was).
    pub cleared: Option<Cleared>,
    /// The provider's own name of the call, where it gives one before its answer (a background response's id),
    /// kept when the attempt goes `unknown` at its time-out: what the reconciler reads the call's fate by.
    pub call_id: Option<String>,
}

/// How an `unknown` attempt came to leave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClearedBy {
    /// Its provider answered after all, within the worker's late window.
    LateAnswer,
    /// The reconciler asked its provider: an answer found (already paid for), or the provider's word that it has
    /// none (the work was not done, so a retry costs no second call).
    Lookup,
    /// Its provider cannot be asked, and its `unknown_retry_after_ms` ran out: retried, accepting a possible
    /// second paid call (the attempt counts as possibly paid on the bill).
    Policy,
    /// An owner or an operator cancelled it (or the job).
    Person,
}

impl ClearedBy {
    pub const ALL: [Self; 4] = [Self::LateAnswer, Self::Lookup, Self::Policy, Self::Person];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::LateAnswer => "late_answer",
            Self::Lookup => "lookup",
            Self::Policy => "policy",
            Self::Person => "person",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// How and when an attempt left `unknown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cleared {
    pub by: ClearedBy,
    pub at: Timestamp,
}

/// Names one attempt: what a queue message carries, and what the sweeper finds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttemptRef {
    pub job_id: JobId,
    #[serde(rename = "attempt")]
    pub number: u32,
}

impl Attempt {
    pub(super) fn queued(number: u32, provider: ProviderName, stamp: &Stamp) -> Self {
        Self {
            number,
            provider,
            state: AttemptState::Queued,
            seen_version: None,
            lease_expires_at: None,
            created_at: stamp.now,
            dispatched_at: stamp.now,
            not_before: None,
            retry_of: None,
            started_at: None,
            finished_at: None,
            error: None,
            report: None,
            origin: Some(stamp.token.clone()),
            writer: None,
            request: None,
            cancelled_by: None,
            cleared: None,
            call_id: None,
        }
    }

    /// Records that it leaves `unknown` (if it is there) by `by`, at `at`.
    pub(super) fn clear(&mut self, by: ClearedBy, at: Timestamp) {
        if self.state == AttemptState::Unknown {
            self.cleared = Some(Cleared { by, at });
        }
    }

    pub(super) fn refuse(&self, to: AttemptState) -> Refusal {
        Refusal::InvalidTransition {
            number: self.number,
            from: self.state,
            to,
        }
    }

    pub(super) fn expect(&self, from: AttemptState, to: AttemptState) -> Result<(), Refusal> {
        if self.state == from {
            Ok(())
        } else {
            Err(self.refuse(to))
        }
    }
}
