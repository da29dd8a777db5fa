//! The engine: the parts an attempt's life touches (store, clock, contracts, providers, queue, metrics, change
//! feed) and the mutations that the API and the worker both make through them, so that every write is followed by
//! the same dispatch, count and change notice.

use std::sync::Arc;

use chrono::Duration;
use tokio::sync::broadcast;

use crate::clock::Clock;
use crate::contracts::Contracts;
use crate::domain::{
    AttemptRef, AttemptState, ContractRef, Job, JobCancel, JobId, NewJob, NextStep, Owner,
    ProviderName, Qualification, Standing,
};
use crate::metrics::{CreateKind, Metrics};
use crate::providers::Providers;
use crate::queue::Dispatcher;
use crate::store::{CreateOutcome, JobStore, StoreError};

/// Timings of the engine that do not belong to one provider.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Added to the longest listen of any provider (timeout + late window) to make a claim's lease.
    pub lease_margin: Duration,
    /// A `queued` attempt nobody claimed for this long is dispatched again by the sweeper.
    pub redispatch_after: Duration,
    /// How many attempts one sweep handles of each kind.
    pub sweep_batch: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            lease_margin: Duration::seconds(30),
            redispatch_after: Duration::seconds(30),
            sweep_batch: 100,
        }
    }
}

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

    pub(crate) fn changed(&self, job: &Job) {
        // Nobody listening is fine.
        let _ = self.changes.send(job.id.clone());
    }

    /// Creates the job, or finds the one its key names; a new job's attempt 1 is dispatched.
    pub async fn create_job(&self, new: NewJob) -> Result<CreateOutcome, StoreError> {
        let outcome = self.store.create_job(new, self.clock.now()).await?;
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

    /// Queues a new attempt by hand: on `provider`, or on the next untried provider of the chain (else the
    /// primary). The caller's explicit choice needs no qualification.
    pub async fn add_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        provider: Option<ProviderName>,
    ) -> Result<(u32, Job), StoreError> {
        let provider = match provider {
            Some(provider) => provider,
            None => {
                let job = self
                    .store
                    .get_job(owner, id)
                    .await?
                    .ok_or(StoreError::NotFound)?;
                job.next_untried_provider()
                    .unwrap_or(&job.providers[0])
                    .clone()
            }
        };
        let (number, job) = self
            .store
            .add_attempt(owner, id, provider, self.clock.now())
            .await?;
        self.changed(&job);
        self.dispatch_queued(&job).await;
        Ok((number, job))
    }

    /// Resolves a live attempt out of band; automatic failover follows (SPEC §4).
    pub async fn cancel_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        number: u32,
    ) -> Result<Job, StoreError> {
        let job = self
            .store
            .get_job(owner, id)
            .await?
            .ok_or(StoreError::NotFound)?;
        // While attempt `number` is live no other attempt can be added, so this decision cannot go stale: if the
        // attempt is no longer live, the write below is refused.
        let next = self.failover(&job).await?;
        let job = self
            .store
            .cancel_attempt(owner, id, number, next, self.clock.now())
            .await?;
        tracing::info!(job_id = %job.id, attempt = number, "attempt cancelled");
        self.metrics.attempt(AttemptState::Cancelled);
        self.changed(&job);
        self.dispatch_queued(&job).await;
        Ok(job)
    }

    /// Where automatic failover goes once `job`'s live attempt ends without a result: the next untried provider
    /// of the chain, only if it is qualified for the contract's current fingerprint (SPEC invariant 9). One read
    /// of the ledger when there is a next provider.
    pub async fn failover(&self, job: &Job) -> Result<NextStep, StoreError> {
        let qualified = match job.next_untried_provider() {
            Some(next) => {
                Standing::of(self.qualification(&job.contract, next).await?.as_ref())
                    == Standing::Qualified
            }
            None => false,
        };
        // `failover` asks only about the next untried provider.
        Ok(job.failover(|_| qualified))
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

    pub async fn cancel_job(&self, owner: &Owner, id: &JobId) -> Result<Job, StoreError> {
        let (outcome, job) = self.store.cancel_job(owner, id, self.clock.now()).await?;
        if outcome == JobCancel::Cancelled {
            tracing::info!(job_id = %job.id, "job cancelled");
            self.changed(&job);
        }
        Ok(job)
    }

    /// Dispatches the job's queued attempt, if the last write queued one. A failure to dispatch is logged, not
    /// returned: the write stands, and the sweeper dispatches the attempt again.
    pub(crate) async fn dispatch_queued(&self, job: &Job) {
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
