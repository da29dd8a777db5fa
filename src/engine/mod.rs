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

mod api;
mod changes;
mod events;
mod in_flight;
mod recent;
mod worker;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use chrono::Duration;
use futures_util::future::try_join_all;

use crate::clock::Clock;
use crate::contracts::Contracts;
use crate::domain::{
    AttemptRef, AttemptState, ContractRef, ContractStanding, ErrorInfo, Failover, Fingerprint,
    IdempotencyKey, Job, JobId, Owner, ProviderName, Qualification, RetryPolicy, Stamp, Standing,
    Timestamp, WriteToken,
};
use crate::metrics::Metrics;
use crate::providers::Providers;
use crate::queue::{Dispatcher, Message};
use crate::store::{JobPage, JobStore, ListQuery, StoreError};
use crate::telemetry::trace;
pub use api::AddedAttempt;
pub use changes::JobWatch;
pub use events::{EndpointRefused, EventSettings, is_private};
use recent::Recent;
use tracing::Instrument;

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
        }
    }
}

/// Reads and compare-and-swaps of a provider's evidence before a production note on it is given up.
const NOTE_TRIES: usize = 3;

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
    /// The deliverer's HTTP client (`events::client`), made when it first delivers: the API and worker functions
    /// never do, and do not carry its code.
    event_client: std::sync::OnceLock<reqwest::Client>,
    /// The EventBridge client that puts events on the settings' bus ([`Engine::with_bus`]): only a process that
    /// delivers has one.
    bus: Option<aws_sdk_eventbridge::Client>,
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
    pub fn new(
        store: Arc<dyn JobStore>,
        clock: Arc<dyn Clock>,
        contracts: Arc<Contracts>,
        providers: Arc<Providers>,
        dispatcher: Arc<dyn Dispatcher>,
        settings: EngineSettings,
        metrics: Metrics,
    ) -> Self {
        Self {
            store,
            clock,
            contracts,
            providers,
            dispatcher,
            metrics,
            changes: changes::Changes::default(),
            creating: in_flight::InFlight::default(),
            clean_breakers: Recent::new(settings.provider_state_cache),
            evidence: Recent::new(settings.provider_state_cache),
            deliveries_due: tokio::sync::Notify::new(),
            event_client: std::sync::OnceLock::new(),
            bus: None,
            settings,
        }
    }

    /// This engine, putting events on the bus its settings name (`events.bus`) with `bus`, the EventBridge client
    /// (`None`: this process does not put them).
    pub fn with_bus(self, bus: Option<aws_sdk_eventbridge::Client>) -> Self {
        Self { bus, ..self }
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

    /// After every write of a job: its watchers hear of it, and if it ended, its owner's endpoint will. An `Err`
    /// (the store would not arm the event through a write's budget) is for the caller to pass on as a failure: its
    /// client's retry, or its message's redelivery, arms it again.
    async fn changed(&self, job: &Job) -> Result<(), StoreError> {
        self.changes
            .changed(&job.id, || job.is_final().then(|| job.clone()));
        self.arm_deliveries(job).await
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

    /// One of the owner's jobs, unless it is gone.
    pub async fn get_job(&self, owner: &Owner, id: &JobId) -> Result<Option<Job>, StoreError> {
        self.store.get_job(owner, id, self.clock.now()).await
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
            .filter(|(_, evidence)| self.standing(evidence.as_ref()).0 == Standing::Qualified)
            .map(|(provider, _)| provider.clone())
            .collect();
        Ok(self.failover_to(qualified))
    }

    fn failover_to(&self, qualified: BTreeSet<ProviderName>) -> Failover {
        Failover {
            qualified,
            max_attempts: self.settings.max_attempts,
            retry: None,
            jitter_permille: 0,
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
    /// Each provider's standing for each contract, as the ledger holds it for their current fingerprints.
    pub async fn standings(
        &self,
    ) -> Result<Vec<(ProviderName, Vec<ContractStanding>)>, StoreError> {
        let mut out = Vec::new();
        for (name, provider) in self.providers.iter() {
            let mut rows = Vec::new();
            for contract in self.contracts.iter() {
                let evidence = self
                    .store
                    .qualification(&contract.fingerprint, &provider.fingerprint)
                    .await?;
                let (standing, reason) = self.standing(evidence.as_ref());
                rows.push(ContractStanding {
                    contract: contract.reference.clone(),
                    standing,
                    reason,
                    evidence,
                });
            }
            out.push((name.clone(), rows));
        }
        Ok(out)
    }

    /// Where `evidence` leaves its provider now, and why not qualified.
    fn standing(&self, evidence: Option<&Qualification>) -> (Standing, Option<ErrorInfo>) {
        evidence.map_or((Standing::Unqualified, None), |q| {
            q.standing(self.clock.now(), self.settings.qualification_max_age)
        })
    }

    /// What production attempt `number` of `job` showed about its provider's qualification for the job's contract:
    /// the model it answered as, and whether its answer broke the contract. A provider that answers as a model its
    /// qualification never saw, or breaks the contract [`Qualification::STRIKES`] times, becomes suspected (kept in
    /// the ledger, with the attempts): cause to qualify it again, never a loss of standing (invariant 15). The note
    /// is a compare-and-swap on the evidence as read, so it never overwrites a qualification written meanwhile. A
    /// ledger that fails is logged: watching never fails an attempt.
    pub async fn observe(
        &self,
        job: &Job,
        number: u32,
        model: Option<&str>,
        broke: Option<&ErrorInfo>,
    ) {
        let (Some(attempt), Some(contract)) =
            (job.attempt(number), self.contracts.get(&job.contract))
        else {
            return;
        };
        let Some(provider) = self.providers.get(&attempt.provider) else {
            return;
        };
        let pair = (contract.fingerprint, provider.fingerprint);
        let name = format!("{}#{number}", job.id);
        let unchanged = |evidence: &Option<Qualification>| {
            evidence
                .as_ref()
                .is_none_or(|q| !q.notices(&name, model, broke))
        };
        if self
            .evidence
            .get(&pair)
            .is_some_and(|seen| unchanged(&seen))
        {
            return;
        }
        for _ in 0..NOTE_TRIES {
            let read = match self.store.qualification(&pair.0, &pair.1).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(error = %e, "the ledger could not be read to watch the provider's standing");
                    return;
                }
            };
            if unchanged(&read) {
                self.evidence.put(pair, Arc::new(read));
                return;
            }
            let Some(seen) = read else {
                return;
            };
            let mut evidence = seen.clone();
            evidence.observe(&name, model, broke, self.clock.now());
            self.evidence.forget(&pair);
            match self.store.replace_qualification(&seen, &evidence).await {
                Ok(true) => {
                    if let Some(suspicion) = evidence
                        .suspected
                        .as_ref()
                        .filter(|_| seen.suspected.is_none())
                    {
                        tracing::warn!(provider = %attempt.provider, contract = %job.contract, code = %suspicion.reason.code, "provider suspected, to be qualified again: {}", suspicion.reason.message);
                    }
                    return;
                }
                // The evidence changed meanwhile (a qualification, another note): noted on it as it is now.
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the provider's standing could not be written");
                    return;
                }
            }
        }
    }

    /// The pairs whose qualification passed and is now too old or suspected in production, with why: what the
    /// sweeper qualifies again on the contract's samples (suspected ones first).
    pub async fn needing_requalification(
        &self,
    ) -> Result<Vec<(ProviderName, ContractRef, ErrorInfo)>, StoreError> {
        let (mut suspected, mut stale) = (Vec::new(), Vec::new());
        for (name, rows) in self.standings().await? {
            for row in rows {
                let Some(evidence) = row.evidence.as_ref().filter(|q| q.passed) else {
                    continue;
                };
                if let Some(suspicion) = &evidence.suspected {
                    suspected.push((name.clone(), row.contract, suspicion.reason.clone()));
                } else if let Some(why) = row.reason {
                    stale.push((name.clone(), row.contract, why));
                }
            }
        }
        suspected.extend(stale);
        Ok(suspected)
    }

    /// The longest a qualification of `provider` for `contract` may take, `runs` runs of each sample, each bounded
    /// by the provider's timeout.
    pub fn longest_qualification(
        &self,
        contract: &ContractRef,
        provider: &ProviderName,
        runs: u32,
    ) -> Duration {
        let (Some(contract), Some(provider)) =
            (self.contracts.get(contract), self.providers.get(provider))
        else {
            return Duration::zero();
        };
        let calls =
            i32::try_from(contract.samples.len() as u64 * u64::from(runs)).unwrap_or(i32::MAX);
        provider.config.timeout() * calls
    }

    /// Qualifies `provider` for `contract` through its real client (`runs` runs of each sample, `progress` told of
    /// each) and keeps the evidence in the ledger. `None` when either is not configured.
    pub async fn requalify(
        &self,
        contract: &ContractRef,
        provider: &ProviderName,
        runs: u32,
        progress: impl FnMut(&crate::domain::RunEvidence, usize, usize),
    ) -> Result<Option<Qualification>, StoreError> {
        let (Some(contract), Some(configured)) =
            (self.contracts.get(contract), self.providers.get(provider))
        else {
            return Ok(None);
        };
        let evidence = crate::providers::qualify::qualify(
            contract,
            provider,
            configured,
            runs,
            &*self.clock,
            progress,
        )
        .await;
        self.evidence
            .forget(&(contract.fingerprint, configured.fingerprint));
        self.store.put_qualification(&evidence).await?;
        Ok(Some(evidence))
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
        self.metrics
            .attempt(job, attempt.number, AttemptState::Queued);
        let message = Message::new(
            AttemptRef {
                job_id: job.id.clone(),
                number: attempt.number,
            },
            Some(attempt.provider.clone()),
        );
        self.dispatch_at(&message, attempt.not_before).await;
    }

    /// Sends `message`, delivered no sooner than `not_before` (if given); a failure is logged, and the sweeper
    /// sends it again later.
    pub(crate) async fn dispatch_at(&self, message: &Message, not_before: Option<Timestamp>) {
        let delay = not_before.map_or_else(Duration::zero, |t| t - self.clock.now());
        let (job_id, attempt) = (&message.attempt.job_id, message.attempt.number);
        let span =
            tracing::info_span!("dispatch", %job_id, attempt, trace_id = tracing::field::Empty);
        trace::join(&span, job_id, None);
        let sent = self
            .dispatcher
            .dispatch(message, delay)
            .instrument(span)
            .await;
        if let Err(e) = sent {
            tracing::warn!(%job_id, attempt, error = %e, "dispatch failed; the sweeper will retry");
        }
    }
}
