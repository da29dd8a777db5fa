//! The `JobStore` port and its one error enum. Adapters: [`sqlite`] (the embedded default) and [`dynamodb`].
//!
//! Every method is one atomic operation on the backend. The rules each applies are the pure transitions of
//! [`crate::domain::job`]; a refused transition comes back as [`StoreError::Refused`] with the same [`Refusal`] on
//! every backend, and nothing was written.

pub mod dynamodb;
pub mod sqlite;

use std::fmt::{self, Debug};
use std::str::FromStr;

use async_trait::async_trait;
use serde_json::Value;

use crate::domain::{
    AttemptRef, CallReport, Completion, ErrorInfo, Fingerprint, Job, JobCancel, JobId, JobStatus,
    NewJob, NextStep, Owner, ParseError, ProviderName, Qualification, Refusal, Timestamp,
};

/// What a create did. Each variant carries the job as it is now in the store.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    /// No job had this (owner, key): this one was written, with attempt 1 queued.
    Created(Job),
    /// The same intent (same fingerprint) was sent before: nothing was written.
    Replayed(Job),
    /// The key was used for another intent: nothing was written; this is the existing job.
    Conflict(Job),
}

impl CreateOutcome {
    pub fn job(&self) -> &Job {
        match self {
            Self::Created(job) | Self::Replayed(job) | Self::Conflict(job) => job,
        }
    }
}

/// Where a page of a listing starts: just after the job with this creation time and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub created_at_ms: i64,
    pub id: JobId,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_at_ms, self.id)
    }
}

impl FromStr for Cursor {
    type Err = ParseError;

    fn from_str(raw: &str) -> Result<Self, ParseError> {
        let refuse = || ParseError(format!("not a cursor from this API: {raw:?}"));
        let (ms, id) = raw.split_once('.').ok_or_else(refuse)?;
        Ok(Self {
            created_at_ms: ms.parse().map_err(|_| refuse())?,
            id: JobId::parse(id).map_err(|_| refuse())?,
        })
    }
}

impl Cursor {
    pub fn after(job: &Job) -> Self {
        Self {
            created_at_ms: job.created_at.timestamp_millis(),
            id: job.id.clone(),
        }
    }
}

/// A listing of one owner's jobs, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub status: Option<JobStatus>,
    /// 1 to [`ListQuery::MAX_LIMIT`].
    pub limit: usize,
    pub cursor: Option<Cursor>,
}

impl ListQuery {
    pub const DEFAULT_LIMIT: usize = 20;
    pub const MAX_LIMIT: usize = 100;
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Set when more jobs may follow.
    pub next_cursor: Option<Cursor>,
}

/// The one error type of the port; it means the same on every backend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such job, or it belongs to another owner (the two are indistinguishable by design).
    #[error("job not found")]
    NotFound,
    /// The transition's rules refused it; nothing was written.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The backend failed or answered something unreadable. Whether the write happened is not known.
    #[error("the job store failed")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    pub fn backend(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Backend(source.into())
    }
}

/// The job ledger. Methods taking an `owner` answer [`StoreError::NotFound`] for another owner's job; the others
/// are the worker's and address a job by id alone.
#[async_trait]
pub trait JobStore: Send + Sync + Debug {
    /// Creates the job (with attempt 1 queued) unless (owner, key) exists; the database's uniqueness decides.
    async fn create_job(&self, new: NewJob, now: Timestamp) -> Result<CreateOutcome, StoreError>;

    /// A consistent read of one job with its attempts.
    async fn get_job(&self, owner: &Owner, id: &JobId) -> Result<Option<Job>, StoreError>;

    async fn list_jobs(&self, owner: &Owner, query: &ListQuery) -> Result<JobPage, StoreError>;

    /// Queues a new attempt; refused while one is live or once the job has its outcome. Returns its number.
    async fn add_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        provider: ProviderName,
        now: Timestamp,
    ) -> Result<(u32, Job), StoreError>;

    /// `queued` → `started` with a lease; a duplicate or late claim is refused.
    async fn claim_attempt(
        &self,
        id: &JobId,
        number: u32,
        lease_expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<Job, StoreError>;

    /// `started` → `unknown`.
    async fn mark_unknown(
        &self,
        id: &JobId,
        number: u32,
        now: Timestamp,
    ) -> Result<Job, StoreError>;

    /// Compare-and-swap on the result slot; the loser becomes `discarded` and the job is left as it was.
    async fn complete_attempt(
        &self,
        id: &JobId,
        number: u32,
        result: Value,
        report: CallReport,
        now: Timestamp,
    ) -> Result<(Completion, Job), StoreError>;

    /// `started` | `unknown` → `failed`, and in the same write `next`: the failover attempt, or the job's error.
    async fn fail_attempt(
        &self,
        id: &JobId,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        next: NextStep,
        now: Timestamp,
    ) -> Result<Job, StoreError>;

    /// A live attempt → `cancelled`, and in the same write `next`.
    async fn cancel_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        number: u32,
        next: NextStep,
        now: Timestamp,
    ) -> Result<Job, StoreError>;

    /// `started` attempts whose lease ended before `now`, oldest lease first, at most `limit`.
    async fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError>;

    /// Attempts still `queued` that were queued before `before`, oldest first, at most `limit`.
    async fn stale_queued(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError>;

    /// Stores qualification evidence, replacing any earlier one for the same pair of fingerprints.
    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError>;

    /// The qualification evidence for this contract fingerprint and provider fingerprint, if any.
    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError>;

    /// Cancels the job and its live attempt; idempotent; refused once it succeeded.
    async fn cancel_job(
        &self,
        owner: &Owner,
        id: &JobId,
        now: Timestamp,
    ) -> Result<(JobCancel, Job), StoreError>;
}
