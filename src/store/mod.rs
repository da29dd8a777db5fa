//! The `JobStore` port and its one error enum. Adapters: [`sqlite`] (the embedded default) and [`dynamodb`].
//!
//! Every method is one atomic operation on the backend. A job's transitions all go through one method,
//! [`JobStore::apply`], which applies [`Transition::apply`] — the pure transitions of [`crate::domain::job`] — inside
//! the backend's guarded write; a refused transition comes back as [`StoreError::Refused`] with the same [`Refusal`] on
//! every backend, and nothing was written.

pub mod dynamodb;
mod listing;
pub mod sqlite;

pub use listing::{Cursor, JobPage, ListQuery};

use std::fmt::Debug;

use async_trait::async_trait;
use serde_json::Value;

use chrono::Duration;

use crate::domain::{
    Applied, AttemptCancel, AttemptRef, Bound, Breaker, CallReport, ClearedBy, Completion,
    Deliveries, Endpoint, ErrorInfo, Failover, Fingerprint, IdempotencyKey, Job, JobCancel, JobId,
    NewJob, Owner, OwnerLedger, OwnerLimits, ProviderName, Qualification, Refusal, Stamp,
    Timestamp, Transition, WriteToken,
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
    /// What a create that found `existing` under its key did: it is this write's own job if the job carries the
    /// write's token (its earlier try landed), else a replay of the same intent or a conflict with another.
    pub fn of_existing(existing: Job, fingerprint: &Fingerprint, token: &WriteToken) -> Self {
        if existing.created_by(token) {
            Self::Created(existing)
        } else if existing.fingerprint == *fingerprint {
            Self::Replayed(existing)
        } else {
            Self::Conflict(existing)
        }
    }

    pub fn job(&self) -> &Job {
        match self {
            Self::Created(job) | Self::Replayed(job) | Self::Conflict(job) => job,
        }
    }
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
    /// Other writers kept winning a guarded write of shared state (an owner's ledger, a provider's slots, a job)
    /// through every try: nothing was written by this one. Worth trying again shortly.
    #[error("{0} kept changing under a guarded write")]
    Contended(String),
}

impl StoreError {
    pub fn backend(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Backend(source.into())
    }
}

/// One transition as a store is asked to make it: the transition, on whose behalf (an owner's request, that
/// finds only the owner's jobs; or the engine's own write, by id alone), the writer's stamp, and the owner's limits
/// the write is held to if it makes the job live again (a manual attempt: invariant 18).
#[derive(Debug, Clone)]
pub struct JobWrite<'a> {
    pub owner: Option<&'a Owner>,
    pub transition: Transition,
    pub stamp: &'a Stamp,
    pub held: Option<Held<'a>>,
}

/// What a write that makes a job live again is held to: its owner's limits, and its call's worst case for a
/// budget.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    pub limits: &'a OwnerLimits,
    pub bound: Bound,
}

impl Held<'static> {
    /// Held to no limit.
    pub fn none() -> Self {
        static NONE: OwnerLimits = OwnerLimits {
            live_jobs: None,
            creates_per_minute: None,
            tokens_per_minute: None,
            budget: None,
        };
        Self {
            limits: &NONE,
            bound: Bound {
                tokens: 0,
                nanos: 0,
            },
        }
    }
}

impl<'a> JobWrite<'a> {
    /// An owner's write: another owner's job is not found.
    pub fn by(owner: &'a Owner, transition: Transition, stamp: &'a Stamp) -> Self {
        let owner = Some(owner);
        Self {
            owner,
            transition,
            stamp,
            held: None,
        }
    }

    /// The engine's own write.
    pub fn engine(transition: Transition, stamp: &'a Stamp) -> Self {
        Self {
            owner: None,
            transition,
            stamp,
            held: None,
        }
    }

    /// This write, held to `limits` if it makes the job live: refused with [`Refusal::Limit`] beyond one, as a
    /// create would be ([`crate::domain::OwnerLedger::admit_attempt`]).
    pub fn held_to(self, held: Held<'a>) -> Self {
        Self {
            held: Some(held),
            ..self
        }
    }
}

/// The answer of a transition's own kind, which [`Transition::apply`] always gives.
fn answer<T>(
    (applied, job): (Applied, Job),
    pick: impl FnOnce(Applied) -> Option<T>,
) -> Result<(T, Job), StoreError> {
    let answered = pick(applied)
        .ok_or_else(|| StoreError::backend(format!("a transition answered {applied:?}")))?;
    Ok((answered, job))
}

/// Who creates a job, and what the create is held to: the writer's stamp (a repeat of a create whose answer was
/// lost finds its job by the token) and the owner's limits, with its first call's worst case for a budget.
#[derive(Debug, Clone, Copy)]
pub struct CreateTerms<'a> {
    pub stamp: &'a Stamp,
    pub limits: &'a OwnerLimits,
    pub bound: Bound,
}

/// A provider's call slot to take: one of `cap`, held until `until`, as the slots stand at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallSlot {
    pub cap: u32,
    pub until: Timestamp,
    pub now: Timestamp,
}

/// The job store. Methods taking an `owner` answer [`StoreError::NotFound`] for another owner's job; the others
/// are the worker's and address a job by id alone. A job past its retention is gone for every method: reads do not
/// find it, writes answer `NotFound`, and a create under its key makes a new job.
///
/// Every write takes a [`Stamp`]. A write repeated with its stamp's token — by the backend's own client, by the
/// engine, after an answer was lost — answers as it did the first time and writes nothing again (invariant 11).
#[async_trait]
pub trait JobStore: EventStore + ProviderStore + Send + Sync + Debug {
    /// Creates the job (with attempt 1 queued, kept for `retention`) unless (owner, key) names a job that is not
    /// expired; the database's uniqueness decides. A repeat of a create that landed is `Created` again.
    async fn create_job(
        &self,
        new: NewJob,
        retention: Duration,
        stamp: &Stamp,
    ) -> Result<CreateOutcome, StoreError> {
        let limits = OwnerLimits::default();
        let terms = CreateTerms {
            stamp,
            limits: &limits,
            bound: Bound::default(),
        };
        self.create_within(Job::new(new, retention, stamp), terms)
            .await
    }

    /// [`JobStore::create_job`] of `job` (made by [`Job::new`] under `terms.stamp`) within the owner's limits: a job
    /// the key names answers as it would (a replay is never refused); else, in the write that would create the job,
    /// the owner's live jobs and ledger are held to the limits ([`OwnerLedger::admit_create`](crate::domain::OwnerLedger::admit_create)) — beyond one,
    /// [`Refusal::Limit`] and nothing written — and the ledger counts the create. A limit of N admits at most N
    /// under concurrent creates.
    async fn create_within(
        &self,
        job: Job,
        terms: CreateTerms<'_>,
    ) -> Result<CreateOutcome, StoreError>;

    /// Before attempt `attempt` of `job` calls its provider: the call's worst case `bound` reserved against its
    /// owner's budget at `now` ([`OwnerLedger::reserve`]) in a guarded write of the ledger — the reservation its
    /// create or manual attempt made kept as it is, an earlier attempt's settled from `job`'s record. Beyond the
    /// budget, [`Refusal::Limit`] and nothing written but checks.
    async fn reserve(
        &self,
        job: &Job,
        attempt: u32,
        limits: &OwnerLimits,
        bound: Bound,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// `owner`'s ledger as stored (an empty one if it has none): what its budget stands at.
    async fn owner_ledger(&self, owner: &Owner) -> Result<OwnerLedger, StoreError>;

    /// After a write that ended an attempt of `job` (the job as it left it): what its intent's place reserved is
    /// settled to what the record says it cost, once, and the place is free if the job is no longer live — unless a
    /// later attempt took it again ([`OwnerLedger::settle`]). Advisory, after the write: a reservation not settled
    /// is settled by the next attempt's reservation, or checked against its job when the budget is reached.
    async fn settle_place(&self, job: &Job, now: Timestamp) -> Result<(), StoreError>;

    /// Every owner's jobs that need a person — `unknown` or `failed` (or only `query.status`) — not expired by
    /// `now`, the latest to come to need one first: the operators' view, paged by `query`'s limit and cursor (its
    /// `created_before` bounds nothing here).
    async fn needing_a_person(
        &self,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError>;

    /// A consistent read of one job with its attempts, whoever owns it, unless it expired before `now`: for the
    /// engine's own steps (a message names a job, not its owner).
    async fn read_job(&self, id: &JobId, now: Timestamp) -> Result<Option<Job>, StoreError>;

    /// [`JobStore::read_job`], if `owner`'s: what an owner may see.
    async fn get_job(
        &self,
        owner: &Owner,
        id: &JobId,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        Ok(self
            .read_job(id, now)
            .await?
            .filter(|job| job.owner == *owner))
    }

    /// The owner's job that `key` names, unless it expired by `now`: for a client that kept the key and lost the
    /// rest.
    async fn find_job(
        &self,
        owner: &Owner,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError>;

    /// The owner's jobs that have not expired by `now`, newest first.
    async fn list_jobs(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError>;

    /// [`JobStore::list_jobs`], each job without its input and its result (both null): what its bill is made of
    /// (its attempts, their usage and cost), without what an owner's inputs and answers weigh. A usage report reads
    /// thousands of jobs; it never reads an input kept apart.
    async fn list_bills(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError>;

    /// `started` attempts whose lease ended before `now` (in jobs not cancelled, not expired), oldest lease first,
    /// at most `limit`.
    async fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError>;

    /// Attempts still `queued` in open jobs that were last dispatched before `before` (not expired by `now`),
    /// oldest first, at most `limit`.
    async fn stale_queued(
        &self,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError>;

    /// Deletes up to `limit` jobs that expired before `now`; how many went. A backend that expires items by itself
    /// (DynamoDB's TTL) deletes nothing here: its reads already treat them as gone.
    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError>;

    /// Makes one transition of the job `id` names, in one atomic write guarded as [`Transition::apply`] rules
    /// (the same functions of the domain on every store): what it did and the job after it, or a refusal and
    /// nothing written. The methods below are its callers' names for each transition.
    async fn apply(&self, id: &JobId, write: JobWrite<'_>) -> Result<(Applied, Job), StoreError>;

    /// Queues a new attempt (on `provider`, or as [`Job::add_attempt`] chooses); refused while one is live, once
    /// the job has its outcome, at the attempt limit, or beyond the owner's `limits` (it makes the job live
    /// again). Returns its number.
    async fn add_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        provider: Option<ProviderName>,
        failover: &Failover,
        held: Held<'_>,
        stamp: &Stamp,
    ) -> Result<(u32, Job), StoreError> {
        let failover = failover.clone();
        let add = Transition::AddAttempt { provider, failover };
        let write = JobWrite::by(owner, add, stamp).held_to(held);
        answer(self.apply(id, write).await?, |applied| match applied {
            Applied::Added(number) => Some(number),
            _ => None,
        })
    }

    /// `queued` → `started` with a lease; a duplicate or late claim (another token) is refused.
    async fn claim_attempt(
        &self,
        id: &JobId,
        number: u32,
        lease_expires_at: Timestamp,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let claim = Transition::Claim {
            number,
            lease_expires_at,
        };
        Ok(self.apply(id, JobWrite::engine(claim, stamp)).await?.1)
    }

    /// `started` → `unknown`, keeping the provider's name of the call if it gave one.
    async fn mark_unknown(
        &self,
        id: &JobId,
        number: u32,
        call_id: Option<&str>,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let call_id = call_id.map(str::to_owned);
        let write = JobWrite::engine(Transition::MarkUnknown { number, call_id }, stamp);
        Ok(self.apply(id, write).await?.1)
    }

    /// Compare-and-swap on the result slot; the loser becomes `discarded` and the job is left as it was.
    async fn complete_attempt(
        &self,
        id: &JobId,
        number: u32,
        result: Value,
        report: CallReport,
        stamp: &Stamp,
    ) -> Result<(Completion, Job), StoreError> {
        let complete = Transition::Complete {
            number,
            result,
            report,
        };
        answer(
            self.apply(id, JobWrite::engine(complete, stamp)).await?,
            |applied| match applied {
                Applied::Completed(completion) => Some(completion),
                _ => None,
            },
        )
    }

    /// `started` | `unknown` → `failed`, and in the same write the failover `failover` allows.
    async fn fail_attempt(
        &self,
        id: &JobId,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let failover = failover.clone();
        let fail = Transition::Fail {
            number,
            error,
            report,
            failover,
        };
        Ok(self.apply(id, JobWrite::engine(fail, stamp)).await?.1)
    }

    /// A live attempt → `cancelled`, and in the same write the failover `failover` allows.
    async fn cancel_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        number: u32,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<(AttemptCancel, Job), StoreError> {
        let failover = failover.clone();
        let write = JobWrite::by(owner, Transition::CancelAttempt { number, failover }, stamp);
        answer(self.apply(id, write).await?, |applied| match applied {
            Applied::AttemptCancelled(cancel) => Some(cancel),
            _ => None,
        })
    }

    /// An `unknown` attempt → `cancelled`, cleared `by` the reconciler without an answer, and in the same write
    /// its retry or the failover `failover` allows ([`Job::clear_unknown`]).
    async fn clear_unknown(
        &self,
        id: &JobId,
        number: u32,
        by: ClearedBy,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let failover = failover.clone();
        let clear = Transition::ClearUnknown {
            number,
            by,
            failover,
        };
        Ok(self.apply(id, JobWrite::engine(clear, stamp)).await?.1)
    }

    /// Records that a `queued` attempt was handed to the queue again at `now`.
    async fn redispatch(&self, id: &JobId, number: u32, now: Timestamp) -> Result<Job, StoreError> {
        let stamp = Stamp::fresh(now);
        let write = JobWrite::engine(Transition::Redispatch { number }, &stamp);
        Ok(self.apply(id, write).await?.1)
    }

    /// Cancels the job and its live attempt; idempotent; refused once it succeeded.
    async fn cancel_job(
        &self,
        owner: &Owner,
        id: &JobId,
        stamp: &Stamp,
    ) -> Result<(JobCancel, Job), StoreError> {
        let write = JobWrite::by(owner, Transition::CancelJob, stamp);
        answer(self.apply(id, write).await?, |applied| match applied {
            Applied::JobCancelled(cancel) => Some(cancel),
            _ => None,
        })
    }
}

/// What onejob knows of each provider, shared by every process through the store: its breaker and its qualification
/// evidence. Advisory state (invariant 16): a worker writes it after an answer, and a store that fails here never
/// decides a job. A breaker is written by compare-and-swap, and so is a production note on evidence, so that no
/// writer's change overwrites another's.
#[async_trait]
pub trait ProviderStore: Send + Sync + Debug {
    /// Stores qualification evidence, replacing any earlier one for the same pair of fingerprints.
    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError>;

    /// The qualification evidence for this contract fingerprint and provider fingerprint, if any.
    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError>;

    /// A provider's breaker, and its revision (0 when none is stored yet: a closed breaker).
    async fn breaker(&self, provider: &ProviderName) -> Result<(Breaker, u64), StoreError>;

    /// Stores `breaker` if the stored one is still at revision `rev` (compare-and-swap); whether it was written.
    async fn put_breaker(
        &self,
        provider: &ProviderName,
        breaker: &Breaker,
        rev: u64,
    ) -> Result<bool, StoreError>;

    /// Stores `evidence` in place of `seen` — the evidence this writer read and changed (a production note on it)
    /// — if the stored evidence is still `seen` (compare-and-swap): a note made on old evidence never overwrites a
    /// newer qualification. Whether it was written.
    async fn replace_qualification(
        &self,
        seen: &Qualification,
        evidence: &Qualification,
    ) -> Result<bool, StoreError>;

    /// Takes one of `provider`'s `slot.cap` call slots for `holder` until `slot.until` (a slot held past it is free
    /// again: its holder died), unless all are taken at `slot.now`; whether `holder` holds one (taking it again is
    /// holding it).
    async fn take_call_slot(
        &self,
        provider: &ProviderName,
        holder: &str,
        slot: CallSlot,
    ) -> Result<bool, StoreError>;

    /// Frees `holder`'s slot of `provider`, if it holds one.
    async fn free_call_slot(&self, provider: &ProviderName, holder: &str)
    -> Result<(), StoreError>;
}

/// Completion events' side of the store: owners' endpoints and each job's deliveries (`domain::event`). A job's
/// deliveries exist only if its owner had an endpoint when a write ended it, or the store arms every job (a
/// deployment with a bus); they go with the job at its expiry.
#[async_trait]
pub trait EventStore: Send + Sync + Debug {
    /// The owner's endpoint, if one is registered.
    async fn endpoint(&self, owner: &Owner) -> Result<Option<Endpoint>, StoreError>;

    /// Registers the owner's endpoint (`Some`, replacing any other) or removes it (`None`).
    async fn put_endpoint(
        &self,
        owner: &Owner,
        endpoint: Option<&Endpoint>,
    ) -> Result<(), StoreError>;

    /// If the job's owner has an endpoint (or the store arms every job): the job, ended, settles at `settles_at`,
    /// and its deliveries are due then (made if there were none) — unless they were armed for this very settle
    /// before (its event id), so that a later write that leaves the settle as it was (a discarded answer, a
    /// repeat) changes nothing. Whether its event goes anywhere.
    async fn arm_deliveries(&self, job: &Job, settles_at: Timestamp) -> Result<bool, StoreError>;

    /// A job's deliveries and their revision.
    async fn deliveries(&self, id: &JobId) -> Result<Option<(Deliveries, u64)>, StoreError>;

    /// Stores `deliveries` if they are still at revision `rev` (compare-and-swap); whether they were written.
    async fn put_deliveries(&self, deliveries: &Deliveries, rev: u64) -> Result<bool, StoreError>;

    /// Deliveries due at `now` (of jobs not expired), at most `limit`, and of each owner at most its fair share of
    /// them ([`crate::domain::event::fair_share`] among the owners with some due), each owner's soonest first: one
    /// owner's backlog never stands in the way of another owner's events.
    async fn due_deliveries(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<(Deliveries, u64)>, StoreError>;
}
