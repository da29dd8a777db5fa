//! A job's transitions as values: what a store is asked to apply inside one atomic write, and what it answers. Every
//! store applies them through [`Transition::apply`] — the same functions of [`Job`] the tests hold it to — inside
//! its guarded write, so that domain and store cannot disagree.

use serde_json::Value;

use super::attempt::ClearedBy;
use super::failover::Failover;
use super::ids::ProviderName;
use super::job::Job;
use super::report::{CallReport, ErrorInfo};
use super::time::Timestamp;
use super::write::{AttemptCancel, Completion, JobCancel, Refusal, Stamp};

/// One transition of a job, with what it is given.
#[derive(Debug, Clone, PartialEq)]
pub enum Transition {
    /// A manual attempt ([`Job::add_attempt`]).
    AddAttempt {
        provider: Option<ProviderName>,
        failover: Failover,
    },
    /// `queued` → `started` with a lease ([`Job::claim`]).
    Claim {
        number: u32,
        lease_expires_at: Timestamp,
    },
    /// `started` → `unknown` ([`Job::mark_unknown`]), with the provider's name of the call if it gave one.
    MarkUnknown {
        number: u32,
        call_id: Option<String>,
    },
    /// A result, by compare-and-swap on the slot ([`Job::complete`]).
    Complete {
        number: u32,
        result: Value,
        report: CallReport,
    },
    /// A definite failure, with its retry or failover ([`Job::fail`]).
    Fail {
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        failover: Failover,
    },
    /// A live attempt resolved out of band, with failover ([`Job::cancel_attempt`]).
    CancelAttempt { number: u32, failover: Failover },
    /// An `unknown` attempt cleared by the reconciler without an answer, then retried or failed over
    /// ([`Job::clear_unknown`]).
    ClearUnknown {
        number: u32,
        by: ClearedBy,
        failover: Failover,
    },
    /// A `queued` attempt handed to the queue again ([`Job::redispatch`]).
    Redispatch { number: u32 },
    /// The owner gives up on the job ([`Job::cancel`]).
    CancelJob,
}

/// What a transition did: its answer, one variant per [`Transition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Added(u32),
    Claimed,
    MarkedUnknown,
    Completed(Completion),
    Failed,
    AttemptCancelled(AttemptCancel),
    Cleared,
    Redispatched,
    JobCancelled(JobCancel),
}

impl Transition {
    /// Applies the transition to `job` as the write `stamp` makes it: the job changed and what it did, or a refusal
    /// and the job exactly as it was.
    pub fn apply(&self, job: &mut Job, stamp: &Stamp) -> Result<Applied, Refusal> {
        match self {
            Self::AddAttempt { provider, failover } => job
                .add_attempt(provider.clone(), failover, stamp)
                .map(Applied::Added),
            Self::Claim {
                number,
                lease_expires_at,
            } => job
                .claim(*number, *lease_expires_at, stamp)
                .map(|()| Applied::Claimed),
            Self::MarkUnknown { number, call_id } => job
                .mark_unknown(*number, call_id.as_deref(), stamp)
                .map(|()| Applied::MarkedUnknown),
            Self::Complete {
                number,
                result,
                report,
            } => job
                .complete(*number, result.clone(), report.clone(), stamp)
                .map(Applied::Completed),
            Self::Fail {
                number,
                error,
                report,
                failover,
            } => job
                .fail(*number, error.clone(), report.clone(), failover, stamp)
                .map(|()| Applied::Failed),
            Self::CancelAttempt { number, failover } => job
                .cancel_attempt(*number, failover, stamp)
                .map(Applied::AttemptCancelled),
            Self::ClearUnknown {
                number,
                by,
                failover,
            } => job
                .clear_unknown(*number, *by, failover, stamp)
                .map(|()| Applied::Cleared),
            Self::Redispatch { number } => job
                .redispatch(*number, stamp.now)
                .map(|()| Applied::Redispatched),
            Self::CancelJob => job.cancel(stamp).map(Applied::JobCancelled),
        }
    }

    /// The attempt the transition names, if it names one.
    pub fn attempt(&self) -> Option<u32> {
        match self {
            Self::Claim { number, .. }
            | Self::MarkUnknown { number, .. }
            | Self::Complete { number, .. }
            | Self::Fail { number, .. }
            | Self::CancelAttempt { number, .. }
            | Self::ClearUnknown { number, .. }
            | Self::Redispatch { number } => Some(*number),
            Self::AddAttempt { .. } | Self::CancelJob => None,
        }
    }
}
