//! The engine: the parts an attempt's life touches (store, clock, contracts, providers, queue, metrics, change
//! feed) and every write of a job's life — the API's, the worker's and the sweeper's — each followed by the same
//! dispatch, count and change notice.
//!
//! # Writes that may be repeated
//!
//! onejob's own parts are clients of the store, and a store write can fail after it landed (invariant 11). Each
//! write here carries a [`WriteToken`]; when the store fails, whether the write landed is not known, so the engine
//! tries the same write again with the same token, after a backoff with full jitter, for as long as its budget
//! allows. A repeat that finds its own earlier effect answers as the first write did: a create is still `Created`
//! (one 201 per key, and its attempt is dispatched), a manual retry finds its attempt, a claim is still this
//! worker's. An answer a worker holds is written for as long as it can still matter, and logged at ERROR with the
//! result if it cannot be.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use chrono::Duration;
use futures_util::future::try_join_all;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::clock::Clock;
use crate::contracts::Contracts;
use crate::domain::{
    AttemptCancel, AttemptRef, AttemptState, CallReport, Completion, ContractRef, ErrorInfo,
    Failover, Job, JobCancel, JobId, NewJob, Owner, ProviderName, Qualification, Stamp, Standing,
    Timestamp, WriteToken,
};
use crate::metrics::{CreateKind, Metrics};
use crate::providers::Providers;
use crate::queue::Dispatcher;
use crate::store::{CreateOutcome, JobPage, JobStore, ListQuery, StoreError};

/// Timings and limits of the engine that do not belong to one provider.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Added to the longest listen of any provider (timeout + late window) to make a claim's lease.
    pub lease_margin: Duration,
    /// A `queued` attempt nobody claimed for this long is dispatched again by the sweeper.
    pub redispatch_after: Duration,
    /// How many attempts one sweep handles of each kind.
    pub sweep_batch: usize,
    /// How long a job, and the memory of its key, is kept.
    pub retention: Duration,
    /// The most attempts one job may have (failover stops there; a manual retry is refused).
    pub max_attempts: u32,
    /// How long a write made for an API call (or a claim) is tried again after the store failed.
    pub write_budget: Duration,
    /// How long a worker keeps trying to write an answer it holds (a result, a failure, a time-out), bounded by
    /// a Lambda's remaining time.
    pub answer_budget: Duration,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            lease_margin: Duration::seconds(30),
            redispatch_after: Duration::seconds(30),
            sweep_batch: 100,
            retention: Duration::days(30),
            max_attempts: Failover::DEFAULT_MAX_ATTEMPTS,
            write_budget: Duration::seconds(3),
            answer_budget: Duration::minutes(5),
        }
    }
}

/// Backoff between tries of one store write: the first repeat at once (the store's client has already waited),
/// then full jitter from this base up to the cap.
const WRITE_BACKOFF_BASE: std::time::Duration = std::time::Duration::from_millis(50);
const WRITE_BACKOFF_CAP: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Debug)]
pub struct Engine {
    pub store: Arc<dyn JobStore>,
    pub clock: Arc<dyn Clock>,
    pub contracts: Arc<Contracts>,
    pub providers: Arc<Providers>,
    pub dispatcher: Arc<dyn Dispatcher>,
    pub metrics: Metrics,
    pub settings: EngineSettings,
    /// Ids of jobs that just changed, for long polls in this process.
    changes: broadcast::Sender<JobId>,
}

/// What a worker's answer write did when the store kept failing: the answer could not be kept.
#[derive(Debug, thiserror::Error)]
#[error("the answer of attempt {number} of job {job_id} could not be written")]
pub struct AnswerLost {
    pub job_id: JobId,
    pub number: u32,
    #[source]
    pub source: StoreError,
}

impl Engine {
    pub fn new(
        store: Arc<dyn JobStore>,
        clock: Arc<dyn Clock>,
        contracts: Arc<Contracts>,
        providers: Arc<Providers>,
        dispatcher: Arc<dyn Dispatcher>,
        settings: EngineSettings,
    ) -> Self {
        Self {
            store,
            clock,
            contracts,
            providers,
            dispatcher,
            metrics: Metrics::default(),
            settings,
            changes: broadcast::channel(1024).0,
        }
    }

    /// How long a claim owns its attempt: long enough for the worker to hear a late answer.
    pub fn lease(&self) -> Duration {
        self.providers.longest_listen() + self.settings.lease_margin
    }

    /// A feed of the ids of jobs changed by this process.
    pub fn subscribe(&self) -> broadcast::Receiver<JobId> {
        self.changes.subscribe()
    }

    fn changed(&self, job: &Job) {
        // Nobody listening is fine.
        let _ = self.changes.send(job.id.clone());
    }

    /// The end of an API write's budget, from now.
    fn write_deadline(&self) -> Timestamp {
        self.clock.now() + self.settings.write_budget
    }

    /// The end of the time a worker may spend writing an answer: its budget, and no later than `deadline`.
    pub fn answer_deadline(&self, deadline: Option<Timestamp>) -> Timestamp {
        let budget = self.clock.now() + self.settings.answer_budget;
        deadline.map_or(budget, |d| d.min(budget))
    }

    /// Runs one store write until the store answers: while it fails (the write may or may not have landed), the
    /// same write is tried again with the same token until `until`, the first repeat at once, then after a backoff
    /// with full jitter.
    async fn persist<T, Fut>(
        &self,
        what: &'static str,
        token: &WriteToken,
        until: Timestamp,
        mut write: impl FnMut(Stamp) -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut repeats = 0u32;
        loop {
            let stamp = Stamp::new(token.clone(), self.clock.now());
            match write(stamp).await {
                Err(StoreError::Backend(e)) if self.clock.now() < until => {
                    tracing::warn!(write = what, repeats, error = %crate::telemetry::error_chain(e.as_ref()), "store write failed; trying it again with the same token");
                    self.metrics.store_retry();
                    if repeats > 0 {
                        let wait = crate::retry::full_jitter(
                            WRITE_BACKOFF_BASE,
                            WRITE_BACKOFF_CAP,
                            repeats - 1,
                        );
                        let wait = Duration::from_std(wait)
                            .unwrap_or_default()
                            .min(until - self.clock.now());
                        self.clock.sleep(wait).await;
                    }
                    repeats += 1;
                }
                other => return other,
            }
        }
    }

    /// Creates the job, or finds the one its key names; a new job's attempt 1 is dispatched. A create whose answer
    /// was lost and that is repeated finds its own job: still `Created`.
    pub async fn create_job(&self, new: NewJob) -> Result<CreateOutcome, StoreError> {
        let token = WriteToken::new();
        let retention = self.settings.retention;
        let outcome = self
            .persist("create", &token, self.write_deadline(), |stamp| {
                let new = new.clone();
                async move { self.store.create_job(new, retention, &stamp).await }
            })
            .await?;
        match &outcome {
            CreateOutcome::Created(job) => {
                self.metrics.create(CreateKind::Created);
                self.changed(job);
                self.dispatch_queued(job).await;
            }
            CreateOutcome::Replayed(_) => self.metrics.create(CreateKind::Replayed),
            CreateOutcome::Conflict(_) => self.metrics.create(CreateKind::Conflict),
        }
        Ok(outcome)
    }

    /// One of the owner's jobs, unless it is gone.
    pub async fn get_job(&self, owner: &Owner, id: &JobId) -> Result<Option<Job>, StoreError> {
        self.store.get_job(owner, id, self.clock.now()).await
    }

    pub async fn list_jobs(&self, owner: &Owner, query: &ListQuery) -> Result<JobPage, StoreError> {
        self.store.list_jobs(owner, query, self.clock.now()).await
    }

    async fn existing_job(&self, owner: &Owner, id: &JobId) -> Result<Job, StoreError> {
        self.get_job(owner, id).await?.ok_or(StoreError::NotFound)
    }

    /// Queues a new attempt by hand: on `provider`, or on the next untried provider of the chain that is qualified
    /// (else the primary). The caller's explicit choice needs no qualification.
    pub async fn add_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        provider: Option<ProviderName>,
    ) -> Result<(u32, Job), StoreError> {
        let job = self.existing_job(owner, id).await?;
        let failover = match &provider {
            Some(_) => self.failover_to(BTreeSet::new()),
            None => self.failover(&job).await?,
        };
        let token = WriteToken::new();
        let (number, job) = self
            .persist("add attempt", &token, self.write_deadline(), |stamp| {
                let (provider, failover) = (provider.clone(), &failover);
                async move {
                    self.store
                        .add_attempt(owner, id, provider, failover, &stamp)
                        .await
                }
            })
            .await?;
        self.changed(&job);
        self.dispatch_queued(&job).await;
        Ok((number, job))
    }

    /// Resolves a live attempt out of band; automatic failover follows (SPEC §4), decided on the state written.
    /// Cancelling a cancelled attempt answers the job as it is.
    pub async fn cancel_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        number: u32,
    ) -> Result<Job, StoreError> {
        let job = self.existing_job(owner, id).await?;
        let failover = self.failover(&job).await?;
        let token = WriteToken::new();
        let (outcome, job) = self
            .persist("cancel attempt", &token, self.write_deadline(), |stamp| {
                let failover = &failover;
                async move {
                    self.store
                        .cancel_attempt(owner, id, number, failover, &stamp)
                        .await
                }
            })
            .await?;
        if outcome == AttemptCancel::Cancelled {
            tracing::info!(job_id = %job.id, attempt = number, "attempt cancelled");
            self.metrics.attempt(AttemptState::Cancelled);
            self.changed(&job);
            self.dispatch_queued(&job).await;
        }
        Ok(job)
    }

    pub async fn cancel_job(&self, owner: &Owner, id: &JobId) -> Result<Job, StoreError> {
        let token = WriteToken::new();
        let (outcome, job) = self
            .persist(
                "cancel job",
                &token,
                self.write_deadline(),
                |stamp| async move { self.store.cancel_job(owner, id, &stamp).await },
            )
            .await?;
        if outcome == JobCancel::Cancelled {
            tracing::info!(job_id = %job.id, "job cancelled");
        }
        // Also when it was cancelled before: that may have been this very call, whose first answer was lost.
        self.changed(&job);
        Ok(job)
    }

    /// What failover may do for `job`: the providers of its chain not tried yet that are qualified for the
    /// contract's current fingerprint (invariant 9), one read of the ledger each, and the attempt limit. Providers
    /// are only ever tried, never untried, so this stays right for any later state of the job.
    pub async fn failover(&self, job: &Job) -> Result<Failover, StoreError> {
        let untried: Vec<&ProviderName> = job.untried_providers().collect();
        let standings = try_join_all(
            untried
                .iter()
                .map(|provider| self.qualification(&job.contract, provider)),
        )
        .await?;
        let qualified = untried
            .into_iter()
            .zip(standings)
            .filter(|(_, evidence)| Standing::of(evidence.as_ref()) == Standing::Qualified)
            .map(|(provider, _)| provider.clone())
            .collect();
        Ok(self.failover_to(qualified))
    }

    fn failover_to(&self, qualified: BTreeSet<ProviderName>) -> Failover {
        Failover {
            qualified,
            max_attempts: self.settings.max_attempts,
        }
    }

    /// The stored qualification of `provider` for `contract`'s current fingerprint, if any.
    pub async fn qualification(
        &self,
        contract: &ContractRef,
        provider: &ProviderName,
    ) -> Result<Option<Qualification>, StoreError> {
        let (Some(contract), Some(provider)) =
            (self.contracts.get(contract), self.providers.get(provider))
        else {
            return Ok(None);
        };
        self.store
            .qualification(&contract.fingerprint, &provider.fingerprint)
            .await
    }

    /// A worker takes the attempt a message names (`queued` → `started`), as the step that `token` stands for.
    pub async fn claim(&self, message: &AttemptRef, token: &WriteToken) -> Result<Job, StoreError> {
        let lease = self.lease();
        let job = self
            .persist("claim", token, self.write_deadline(), |stamp| async move {
                let lease_expires_at = stamp.now + lease;
                self.store
                    .claim_attempt(&message.job_id, message.number, lease_expires_at, &stamp)
                    .await
            })
            .await?;
        self.metrics.attempt(AttemptState::Started);
        self.changed(&job);
        Ok(job)
    }

    /// `started` → `unknown`, written until `until`. `None` when the domain refused: someone resolved the attempt
    /// meanwhile.
    pub async fn mark_unknown(
        &self,
        attempt: &AttemptRef,
        token: &WriteToken,
        until: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        let written = self
            .persist("time-out", token, until, |stamp| async move {
                self.store
                    .mark_unknown(&attempt.job_id, attempt.number, &stamp)
                    .await
            })
            .await;
        match written {
            Ok(job) => {
                self.metrics.attempt(AttemptState::Unknown);
                self.changed(&job);
                Ok(Some(job))
            }
            Err(StoreError::Refused(_) | StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A valid result for attempt `number` of `job`: compare-and-swap on the result slot, written until `until`.
    /// The loser is discarded and logged. If the store never takes it, the result is logged at ERROR, whole, so
    /// that an operator can recover it.
    pub async fn complete(
        &self,
        job_id: &JobId,
        number: u32,
        result: Value,
        report: CallReport,
        token: &WriteToken,
        until: Timestamp,
    ) -> Result<Completion, AnswerLost> {
        let written = self
            .persist("completion", token, until, |stamp| {
                let (result, report) = (result.clone(), report.clone());
                async move {
                    self.store
                        .complete_attempt(job_id, number, result, report, &stamp)
                        .await
                }
            })
            .await;
        match written {
            Ok((Completion::Won, job)) => {
                tracing::info!(job_id = %job.id, attempt = number, "result claimed");
                self.metrics.attempt(AttemptState::Succeeded);
                self.changed(&job);
                Ok(Completion::Won)
            }
            Ok((Completion::Lost { winner }, job)) => {
                // `winner` is the attempt holding the result slot; none when the job was cancelled, or when a
                // cancelled attempt answered after its lease.
                let winner_text = winner.map_or_else(|| "none".to_owned(), |w| w.to_string());
                tracing::warn!(job_id = %job.id, loser = number, winner = %winner_text, "race lost: result discarded");
                self.metrics.race_lost();
                self.changed(&job);
                Ok(Completion::Lost { winner })
            }
            Err(e) => {
                let lost = AnswerLost {
                    job_id: job_id.clone(),
                    number,
                    source: e,
                };
                if !matches!(lost.source, StoreError::Refused(_) | StoreError::NotFound) {
                    tracing::error!(job_id = %job_id, attempt = number, result = %result, error = %crate::telemetry::error_chain(&lost), "a result could not be written: recover it from this line");
                }
                Err(lost)
            }
        }
    }

    /// A definite failure of attempt `number` of `job` (the claimed copy), with failover in the same write,
    /// written until `until`.
    pub async fn fail(
        &self,
        job: &Job,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        token: &WriteToken,
        until: Timestamp,
    ) -> Result<Job, AnswerLost> {
        let written = self
            .persist("failure", token, until, |stamp| {
                let (error, report) = (error.clone(), report.clone());
                async move {
                    let failover = self.failover(job).await?;
                    self.store
                        .fail_attempt(&job.id, number, error, report, &failover, &stamp)
                        .await
                }
            })
            .await;
        match written {
            Ok(after) => {
                self.metrics.attempt(AttemptState::Failed);
                if let Some(error) = &after.error {
                    tracing::warn!(job_id = %after.id, code = %error.code, "no failover: {}", error.message);
                }
                self.changed(&after);
                self.dispatch_queued(&after).await;
                Ok(after)
            }
            Err(e) => {
                if !matches!(e, StoreError::Refused(_) | StoreError::NotFound) {
                    tracing::error!(job_id = %job.id, attempt = number, code = %error.code, message = %error.message, error = %crate::telemetry::error_chain(&e), "a failure could not be written");
                }
                Err(AnswerLost {
                    job_id: job.id.clone(),
                    number,
                    source: e,
                })
            }
        }
    }

    /// The sweeper's time-out of a `started` attempt whose lease ended. Whether it wrote (its worker may have got
    /// there first).
    pub async fn expire_lease(&self, attempt: &AttemptRef) -> Result<bool, StoreError> {
        let token = WriteToken::new();
        let written = self
            .mark_unknown(attempt, &token, self.write_deadline())
            .await?;
        if written.is_some() {
            tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, "lease expired: attempt unknown");
        }
        Ok(written.is_some())
    }

    /// The sweeper's second dispatch of a `queued` attempt nobody claimed: recorded first, so the next sweep waits
    /// its turn, then sent. Whether it was sent.
    pub async fn redispatch(&self, attempt: &AttemptRef) -> Result<bool, StoreError> {
        let token = WriteToken::new();
        let recorded = self
            .persist(
                "re-dispatch",
                &token,
                self.write_deadline(),
                |stamp| async move {
                    self.store
                        .redispatch(&attempt.job_id, attempt.number, stamp.now)
                        .await
                },
            )
            .await;
        match recorded {
            Ok(_) => {}
            Err(StoreError::Refused(_) | StoreError::NotFound) => return Ok(false),
            Err(e) => return Err(e),
        }
        match self.dispatcher.dispatch(attempt).await {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, error = %e, "re-dispatch failed; the next sweep tries again");
                Ok(false)
            }
        }
    }

    /// Dispatches the job's queued attempt, if the last write queued one. A failure to dispatch is logged, not
    /// returned: the write stands, and the sweeper dispatches the attempt again.
    async fn dispatch_queued(&self, job: &Job) {
        let Some(attempt) = job
            .live_attempt()
            .filter(|a| a.state == AttemptState::Queued)
        else {
            return;
        };
        self.metrics.attempt(AttemptState::Queued);
        let message = AttemptRef {
            job_id: job.id.clone(),
            number: attempt.number,
        };
        if let Err(e) = self.dispatcher.dispatch(&message).await {
            tracing::warn!(job_id = %job.id, attempt = attempt.number, error = %e, "dispatch failed; the sweeper will retry");
        }
    }
}
