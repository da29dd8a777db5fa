//! The engine: the parts a job's life touches (store, clock, contracts, providers, queue, sinks, metrics, change
//! feed), and every write of that life, by concept:
//!
//! - [`writes`](self#writes): a caller's writes — create, manual attempt, cancels;
//! - `step`: a worker's attempt as two calls around its provider's call, [`Engine::begin`] and [`Engine::settle`],
//!   which own the order of its writes (the answer first, then what it told of the provider, then the slot);
//! - `attempts`: a worker's writes — the claim and the answer (result, failure, time-out);
//! - `sweep`: the sweeper's writes and queries — expired leases, attempts dispatched again, retention;
//! - `follow_up`: what follows every write, in one order (count, dispatch, change notice, event armed);
//! - `breakers`: each provider's breaker, and waiting one out; `slots`: each provider's calls in flight, capped;
//! - `qualification`: the qualification evidence — failover's gate, standings, production's suspicions;
//! - `deliveries`: endpoints and the deliverer of completion events (to the `sinks`);
//! - `intake`: the rules a create must pass before it is written;
//! - `usage`: what an owner's intents cost, by day and contract (from the jobs' own bills);
//! - `changes`, `in_flight`, `in_hand`, `recent`: what one process keeps for a moment (who waits for which job,
//!   creates being written, deliveries its batches hold and the tries in flight, provider state read a moment ago).
//!
//! The store and the queue are the engine's own: every other part of onejob reaches them through it.
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

mod attempts;
mod breakers;
mod changes;
mod deliveries;
mod follow_up;
mod in_flight;
mod in_hand;
mod intake;
mod qualification;
mod recent;
mod reconcile;
mod slots;
mod step;
mod sweep;
mod usage;
mod writes;

use std::future::Future;
use std::sync::Arc;

use chrono::Duration;

use crate::clock::Clock;
use crate::contracts::Contracts;
use crate::domain::{
    Failover, Fingerprint, IdempotencyKey, Job, JobId, JobStatus, Limits, Owner, PriceTable,
    ProviderName, Qualification, RetryPolicy, Stamp, Timestamp, WriteToken,
};
use crate::metrics::Metrics;
use crate::providers::Providers;
use crate::queue::Dispatcher;
use crate::sinks::Sinks;
use crate::store::{Cursor, JobPage, JobStore, ListQuery, StoreError};
pub use changes::JobWatch;
pub use deliveries::EventSettings;
pub use intake::{Intake, Refused};
use recent::Recent;
pub use reconcile::Reconciled;
pub use step::{Begun, Claimed, Heard, Processed};
pub use usage::{Usage, UsageRow};
pub use writes::AddedAttempt;

/// What one batch of a sweep's work came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Batch {
    /// The items listed (at most a sweep's batch).
    pub listed: usize,
    /// Those the batch is done with; the rest are left for the next sweep (a store that failed on one, a send that
    /// failed, a row another writer moved on).
    pub done: usize,
    /// Those the sweep counts (attempts expired or dispatched again, events delivered).
    pub counted: usize,
}

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
    /// How a provider is tried again after an answer that says it did not do the work (429, 503 with
    /// `Retry-After`, a refused connection).
    pub retry: RetryPolicy,
    /// Qualification evidence older than this qualifies no more.
    pub qualification_max_age: Duration,
    /// Whether the sweeper qualifies again, one pair per sweep, what passed once and no longer stands (it calls the
    /// providers: it spends money, so it is off unless asked for).
    pub requalify_stale: bool,
    /// Definite failures of a provider within `breaker_window` that open its breaker (0: no breakers), and how
    /// long it stays open before one probe.
    pub breaker_threshold: u32,
    pub breaker_window: Duration,
    pub breaker_cooldown: Duration,
    /// How long this process uses a breaker it read clean, and evidence it read, instead of reading again.
    pub provider_state_cache: std::time::Duration,
    /// How long a write made for an API call (or a claim) is tried again after the store failed.
    pub write_budget: Duration,
    /// How long a worker keeps trying to write an answer it holds (a result, a failure, a time-out), bounded by
    /// a Lambda's remaining time.
    pub answer_budget: Duration,
    /// How completion events are delivered.
    pub events: EventSettings,
    /// The fingerprint of the config file's text this engine was made from (none: the built-in defaults).
    pub config: Option<Fingerprint>,
    /// What providers' calls cost: each attempt's usage is priced when it is recorded.
    pub prices: PriceTable,
    /// What each owner may start.
    pub limits: Limits,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            lease_margin: Duration::seconds(30),
            redispatch_after: Duration::seconds(30),
            sweep_batch: 100,
            retention: Duration::days(30),
            max_attempts: Failover::DEFAULT_MAX_ATTEMPTS,
            retry: RetryPolicy {
                max_retries: 2,
                within: Duration::seconds(60),
                base: Duration::seconds(1),
                cap: Duration::seconds(30),
            },
            qualification_max_age: Duration::days(30),
            requalify_stale: false,
            breaker_threshold: 5,
            breaker_window: Duration::seconds(60),
            breaker_cooldown: Duration::seconds(30),
            provider_state_cache: std::time::Duration::from_millis(100),
            write_budget: Duration::seconds(3),
            answer_budget: Duration::minutes(5),
            events: EventSettings::default(),
            config: None,
            prices: PriceTable::default(),
            limits: Limits::default(),
        }
    }
}

/// Backoff between tries of one store write: the first repeat at once (the store's client has already waited),
/// then full jitter from this base up to the cap.
const WRITE_BACKOFF_BASE: std::time::Duration = std::time::Duration::from_millis(50);
const WRITE_BACKOFF_CAP: std::time::Duration = std::time::Duration::from_secs(2);

/// What an engine is made of, built once per process (`startup::parts`): where its jobs are kept and its attempts
/// sent, its clock, what it serves, where its events go, and its metrics.
#[derive(Debug)]
pub struct Parts {
    pub store: Arc<dyn JobStore>,
    pub queue: Arc<dyn Dispatcher>,
    pub clock: Arc<dyn Clock>,
    pub contracts: Arc<Contracts>,
    pub providers: Arc<Providers>,
    /// The owners' endpoints, and the bus if the config names one (with a client where the process delivers).
    pub sinks: Sinks,
    pub metrics: Metrics,
}

#[derive(Debug)]
pub struct Engine {
    store: Arc<dyn JobStore>,
    pub clock: Arc<dyn Clock>,
    pub contracts: Arc<Contracts>,
    pub providers: Arc<Providers>,
    dispatcher: Arc<dyn Dispatcher>,
    /// Where completion events go: the owners' endpoints, the deployment's bus.
    sinks: Sinks,
    pub metrics: Metrics,
    pub settings: EngineSettings,
    /// Who in this process waits for which job (long polls).
    changes: changes::Changes,
    /// Creates being written by this process, by intent: a duplicate waits for the first.
    creating: in_flight::InFlight,
    /// Providers whose breaker this process read clean a moment ago: a call is admitted and an answer recorded
    /// without reading it again.
    clean_breakers: Recent<ProviderName, ()>,
    /// Evidence this process read a moment ago, by (contract, provider) fingerprint: an answer it would not
    /// change is not read for.
    evidence: Recent<(Fingerprint, Fingerprint), Arc<Option<Qualification>>>,
    /// Woken when this process armed deliveries (the local deliverer waits on it).
    deliveries_due: tokio::sync::Notify,
    /// The deliveries this process's batches hold, and the tries in flight, by owner: the local server's batches
    /// and its sweeper's run side by side without taking each other's (the compare-and-swap would keep either from
    /// sending twice, but the loser's store calls would be wasted).
    in_hand: in_hand::InHand,
}

/// What an engine runs, by fingerprint: an operator compares them with `onejob check`'s to see which config and
/// contracts a function serves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Served {
    /// SHA-256 of the config file's text; null when no file was read (the built-in defaults).
    pub config: Option<String>,
    /// SHA-256 of every served contract's fingerprint, by name@version.
    pub contracts: String,
}

/// What a worker's answer write did when the store kept failing: the answer could not be kept — or it was, and
/// the completion event of the job it ended could not be armed after it (the step fails all the same, so that its
/// message comes back and the redelivery arms it).
#[derive(Debug, thiserror::Error)]
#[error(
    "the answer of attempt {number} of job {job_id}, or the event after it, could not be written"
)]
pub struct AnswerLost {
    pub job_id: JobId,
    pub number: u32,
    #[source]
    pub source: StoreError,
}

impl Engine {
    /// The currency of the price table: what bills and usage are in.
    pub fn currency(&self) -> &str {
        &self.settings.prices.currency
    }

    /// The engine of `parts`, with `settings`.
    pub fn new(parts: Parts, settings: EngineSettings) -> Self {
        let Parts {
            store,
            queue,
            clock,
            contracts,
            providers,
            sinks,
            metrics,
        } = parts;
        Self {
            store,
            clock,
            contracts,
            providers,
            dispatcher: queue,
            sinks,
            metrics,
            changes: changes::Changes::default(),
            creating: in_flight::InFlight::default(),
            clean_breakers: Recent::new(settings.provider_state_cache),
            evidence: Recent::new(settings.provider_state_cache),
            deliveries_due: tokio::sync::Notify::new(),
            in_hand: in_hand::InHand::default(),
            settings,
        }
    }

    /// What this engine runs: the fingerprints of its config file and of its contracts (each one's, together), as
    /// `/healthz` and each function's first log line show them.
    pub fn served(&self) -> Served {
        Served {
            config: self.settings.config.map(|f| f.to_string()),
            contracts: self.contracts.fingerprint().to_string(),
        }
    }

    /// How long a claim owns its attempt: long enough for the worker to hear a late answer.
    pub fn lease(&self) -> Duration {
        self.providers.longest_listen() + self.settings.lease_margin
    }

    /// Watches job `id` for changes this process makes from now on: watch first, then read, then wait, and no
    /// change is missed.
    pub fn watch(&self, id: &JobId) -> JobWatch<'_> {
        self.changes.watch(id)
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

    /// Runs one store write until the store answers: while it fails (the write may or may not have landed) or other
    /// writers keep winning its guard, the same write is tried again with the same token until `until`, the first
    /// repeat at once, then after a backoff with full jitter.
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
                Err(e @ (StoreError::Backend(_) | StoreError::Contended(_)))
                    if self.clock.now() < until =>
                {
                    tracing::warn!(write = what, repeats, error = %crate::telemetry::error_chain(&e), "store write failed; trying it again with the same token");
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

    /// One of the owner's jobs, unless it is gone.
    pub async fn get_job(&self, owner: &Owner, id: &JobId) -> Result<Option<Job>, StoreError> {
        self.store.get_job(owner, id, self.clock.now()).await
    }

    /// The job `id` names, as `actor` may see it: an owner its own, an operator any owner's.
    pub async fn job_for(&self, actor: &Actor, id: &JobId) -> Result<Option<Job>, StoreError> {
        match actor {
            Actor::Owner(owner) => self.get_job(owner, id).await,
            Actor::Operator(_) => self.store.read_job(id, self.clock.now()).await,
        }
    }

    /// Every owner's jobs that need a person (`unknown`, `failed`, or only `status`), the latest first: the
    /// operators' view.
    pub async fn needing_a_person(
        &self,
        status: Option<JobStatus>,
        limit: usize,
        cursor: Option<&Cursor>,
    ) -> Result<JobPage, StoreError> {
        let query = ListQuery {
            status,
            limit,
            cursor: cursor.cloned(),
            created_before: None,
        };
        (self.store)
            .needing_a_person(&query, self.clock.now())
            .await
    }

    /// The owner's job that `key` names, unless it is gone.
    pub async fn find_job(
        &self,
        owner: &Owner,
        key: &IdempotencyKey,
    ) -> Result<Option<Job>, StoreError> {
        self.store.find_job(owner, key, self.clock.now()).await
    }

    pub async fn list_jobs(&self, owner: &Owner, query: &ListQuery) -> Result<JobPage, StoreError> {
        self.store.list_jobs(owner, query, self.clock.now()).await
    }

    async fn existing_job(&self, owner: &Owner, id: &JobId) -> Result<Job, StoreError> {
        self.get_job(owner, id).await?.ok_or(StoreError::NotFound)
    }

    /// The job `actor` acts on and the owner it acts as: an owner on its own job; an operator on any owner's, as
    /// its owner (the write records the operator).
    async fn acted_on(&self, actor: &Actor, id: &JobId) -> Result<Job, StoreError> {
        self.job_for(actor, id).await?.ok_or(StoreError::NotFound)
    }
}

/// On whose behalf a caller acts: an owner, on its own jobs only; or an operator, on any owner's, each of its acts
/// recorded on the job with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    Owner(Owner),
    Operator(String),
}

impl Actor {
    /// The operator's name, for the stamp of a write it makes.
    pub fn operator(&self) -> Option<String> {
        match self {
            Self::Owner(_) => None,
            Self::Operator(name) => Some(name.clone()),
        }
    }

    /// Whose `Idempotency-Key`s a request's is, besides the job: an operator's keys are its own, apart from the
    /// owner's and other operators'.
    fn scope(&self) -> String {
        match self {
            Self::Owner(_) => String::new(),
            Self::Operator(name) => format!("operator {name}"),
        }
    }
}
