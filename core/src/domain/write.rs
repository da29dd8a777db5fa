//! What every transition is given and answers: the writer's [`Stamp`], a typed [`Refusal`], and what each
//! transition did.

use super::attempt::{AttemptState, ClearedBy};
use super::ids::WriteToken;
use super::limits::LimitReached;
use super::status::JobStatus;
use super::time::Timestamp;

/// Why a transition was refused. The job is unchanged whenever one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("attempt {number} is still {state:?}; resolve or cancel it first")]
    AttemptInProgress { number: u32, state: AttemptState },
    #[error("the job is already {status:?}")]
    JobFinished { status: JobStatus },
    #[error("the job has no attempt {number}")]
    NoSuchAttempt { number: u32 },
    #[error("attempt {number} is {from:?} and cannot become {to:?}")]
    InvalidTransition {
        number: u32,
        from: AttemptState,
        to: AttemptState,
    },
    #[error("the job already has {limit} attempts, the most one job may have")]
    AttemptLimitReached { limit: u32 },
    #[error("attempt {number} may not start before {not_before}")]
    NotYet { number: u32, not_before: Timestamp },
    /// The request (its `Idempotency-Key` and body) was made before and queued attempt `number`: answered with it.
    #[error("this request queued attempt {number} before")]
    RequestDone { number: u32 },
    /// The request's `Idempotency-Key` was used on this job for another request.
    #[error("this Idempotency-Key was used on this job for another request")]
    KeyReused,
    /// A create beyond one of its owner's limits: nothing was written.
    #[error(transparent)]
    Limit(#[from] LimitReached),
}

/// What a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The result slot was free and the version unchanged: this attempt's result is the job's.
    Won,
    /// The slot was taken or the job moved on: the payload was discarded. `winner` is the attempt that holds the
    /// slot, if any (none when the job was cancelled).
    Lost { winner: Option<u32> },
}

/// What cancelling a job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobCancel {
    Cancelled,
    /// It was cancelled before; nothing changed.
    AlreadyCancelled,
}

/// What cancelling an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptCancel {
    /// This write cancelled it (failover followed in the same write).
    Cancelled,
    /// Another write had cancelled it (by hand, or with its job); nothing changed.
    AlreadyCancelled,
}

/// Who writes, and when: the writer's token and the time of this try of the write. Retries of one write keep the
/// token and take a new time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub token: WriteToken,
    pub now: Timestamp,
    /// The caller's request a manual attempt serves, when it came with an `Idempotency-Key`
    /// ([`WriteToken::for_request`]): kept on the attempt, so the same request sent again answers with it.
    pub request: Option<WriteToken>,
    /// The operator this write acts for, on an owner's behalf: the job records what it did and who.
    pub operator: Option<String>,
    /// Whether the answer this write records was found by asking the provider (the reconciler), rather than heard
    /// by the worker that made the call: an `unknown` attempt it moves on is cleared by a lookup.
    pub by_lookup: bool,
}

impl Stamp {
    pub fn new(token: WriteToken, now: Timestamp) -> Self {
        Self {
            token,
            now,
            request: None,
            operator: None,
            by_lookup: false,
        }
    }

    /// This stamp, for a write of an answer the reconciler found by asking the provider.
    pub fn looked_up(self) -> Self {
        Self {
            by_lookup: true,
            ..self
        }
    }

    /// How an `unknown` attempt that this write answers is cleared: by a lookup, or by the late answer itself.
    pub(super) fn answer_clears(&self) -> ClearedBy {
        match self.by_lookup {
            true => ClearedBy::Lookup,
            false => ClearedBy::LateAnswer,
        }
    }

    /// This stamp, for a write an operator makes on an owner's behalf.
    pub fn by_operator(self, operator: Option<String>) -> Self {
        Self { operator, ..self }
    }

    /// This stamp, for a write that serves the caller's `request`.
    pub fn serving(self, request: Option<WriteToken>) -> Self {
        Self { request, ..self }
    }

    /// A stamp with a fresh token: a write that nobody will repeat under the same token.
    pub fn fresh(now: Timestamp) -> Self {
        Self::new(WriteToken::new(), now)
    }

    pub(super) fn is(&self, token: Option<&WriteToken>) -> bool {
        token == Some(&self.token)
    }
}
