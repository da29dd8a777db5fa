//! The writes of an attempt's run — the worker's claim, result, failure and time-out — and the sweeper's.

use serde_json::Value;

use super::{AnswerLost, Engine};
use crate::domain::{
    Admission, AttemptRef, AttemptState, Breaker, BreakerPolicy, CallReport, Completion, ErrorInfo,
    Failover, FailoverDecision, Job, JobId, ProviderName, RetryPolicy, Stamp, Timestamp,
    WriteToken,
};
use crate::queue::Message;
use crate::store::StoreError;

impl Engine {
    /// A worker takes the attempt a message names (`queued` → `started`), as the step that `token` stands for,
    /// tried again while the store fails until `until` (the message's own time: an invocation's deadline, within
    /// its visibility): a claim that landed and lost its answer is found again as this step's, not left to its
    /// lease.
    pub async fn claim(
        &self,
        message: &AttemptRef,
        token: &WriteToken,
        until: Timestamp,
    ) -> Result<Job, StoreError> {
        let lease = self.lease();
        let job = self
            .persist("claim", token, until, |stamp| async move {
                let lease_expires_at = stamp.now + lease;
                self.store
                    .claim_attempt(&message.job_id, message.number, lease_expires_at, &stamp)
                    .await
            })
            .await?;
        self.metrics
            .attempt(&job, message.number, AttemptState::Started);
        self.changed(&job).await?;
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
                self.metrics
                    .attempt(&job, attempt.number, AttemptState::Unknown);
                self.changed(&job).await?;
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
        // Every try is stamped with the time the answer came: a cancelled attempt's answer is in time, or not, by
        // when it arrived, however long its write takes to land.
        let answered_at = self.clock.now();
        let written = self
            .persist("completion", token, until, |stamp| {
                let (result, report) = (result.clone(), report.clone());
                let stamp = Stamp::new(stamp.token, answered_at);
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
                self.metrics.attempt(&job, number, AttemptState::Succeeded);
                self.metrics.ended(&job);
                self.followed(&job, number).await?;
                Ok(Completion::Won)
            }
            Ok((Completion::Lost { winner }, job)) => {
                // `winner` is the attempt holding the result slot; none when the job was cancelled, or when a
                // cancelled attempt answered after its lease.
                let winner_text = winner.map_or_else(|| "none".to_owned(), |w| w.to_string());
                tracing::warn!(job_id = %job.id, loser = number, winner = %winner_text, "race lost: result discarded");
                self.metrics.race_lost(&job, number);
                self.followed(&job, number).await?;
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

    /// [`Engine::changed`] after an answer's write: if the event could not be armed, the answer is written but the
    /// step fails, so that its message comes back and the redelivery arms it.
    async fn followed(&self, job: &Job, number: u32) -> Result<(), AnswerLost> {
        self.changed(job).await.map_err(|source| AnswerLost {
            job_id: job.id.clone(),
            number,
            source,
        })
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
                    let failover = Failover {
                        retry: Some(self.retry_policy(job, number)),
                        jitter_permille: fastrand::u16(0..=1000),
                        ..self.failover(job).await?
                    };
                    self.store
                        .fail_attempt(&job.id, number, error, report, &failover, &stamp)
                        .await
                }
            })
            .await;
        match written {
            Ok(after) => {
                self.metrics.attempt(&after, number, AttemptState::Failed);
                self.metrics.ended(&after);
                if let Some(error) = &after.error {
                    tracing::warn!(job_id = %after.id, code = %error.code, "no failover: {}", error.message);
                }
                self.dispatch_queued(&after).await;
                self.followed(&after, number).await?;
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
        self.dispatch_again(attempt, chrono::Duration::zero()).await
    }

    /// Sends a `queued` attempt's message again, delivered after `delay`, recorded first (at its sending time), so
    /// that the sweeper does not send it once more meanwhile. Whether it was sent.
    async fn dispatch_again(
        &self,
        attempt: &AttemptRef,
        delay: chrono::Duration,
    ) -> Result<bool, StoreError> {
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
        let job = match recorded {
            Ok(job) => job,
            Err(StoreError::Refused(_) | StoreError::NotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
        let provider = job.attempt(attempt.number).map(|a| a.provider.clone());
        match self
            .dispatcher
            .dispatch(&Message::new(attempt.clone(), provider), delay)
            .await
        {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, error = %e, "re-dispatch failed; the next sweep tries again");
                Ok(false)
            }
        }
    }

    /// Whether the worker leaves the attempt `message` names `queued`, its message coming back later, rather than
    /// claim it: its provider's breaker lets no call through now (and, while one probe runs, the waiters look again
    /// within the probe's own timeout), failover would not take the job elsewhere, and the wait stays within the
    /// retry window of the attempt's first try. Waiting is not a try: no attempt is made, none is charged.
    pub async fn wait_out_breaker(&self, message: &Message) -> Result<bool, StoreError> {
        let Some(provider) = &message.provider else {
            return Ok(false);
        };
        let Admission::Skip { until } = self.peek_breaker(provider).await else {
            return Ok(false);
        };
        let attempt = &message.attempt;
        let now = self.clock.now();
        // Anything but the queued attempt the message names is for the claim to refuse.
        let Some(job) = self.store.read_job(&attempt.job_id, now).await? else {
            return Ok(false);
        };
        let Some(queued) = job
            .attempt(attempt.number)
            .filter(|a| a.state == AttemptState::Queued && a.provider == *provider)
        else {
            return Ok(false);
        };
        let failover = self.failover(&job).await?;
        if matches!(job.failover_decision(&failover), FailoverDecision::Queue(_)) {
            return Ok(false);
        }
        let first_try = job
            .retry_chain(queued.number)
            .map_or(now, |(first, _)| first.created_at);
        if until - first_try > self.retry_policy(&job, attempt.number).within {
            return Ok(false);
        }
        tracing::info!(job_id = %attempt.job_id, attempt = attempt.number, %provider, %until, "breaker open: the attempt waits, queued, without a try");
        let put_off = self.dispatch_again(attempt, until - now).await?;
        if put_off {
            self.metrics.breaker_wait(provider);
        }
        Ok(put_off)
    }

    /// `started` attempts whose lease ended before now, oldest first, for the sweeper.
    pub async fn expired_leases(&self) -> Result<Vec<AttemptRef>, StoreError> {
        let now = self.clock.now();
        self.store
            .expired_leases(now, self.settings.sweep_batch)
            .await
    }

    /// `queued` attempts nobody claimed since `redispatch_after`, oldest first, for the sweeper.
    pub async fn stale_queued(&self) -> Result<Vec<AttemptRef>, StoreError> {
        let now = self.clock.now();
        self.store
            .stale_queued(
                now - self.settings.redispatch_after,
                now,
                self.settings.sweep_batch,
            )
            .await
    }

    /// Deletes a batch of jobs past their retention (where the store does not do it by itself); how many.
    pub async fn purge_expired(&self) -> Result<usize, StoreError> {
        self.store
            .purge_expired(self.clock.now(), self.settings.sweep_batch)
            .await
    }
}

impl Engine {
    /// The retry policy for attempt `number` of `job`: the deployment's, its provider's limits in their place,
    /// its contract's as a ceiling.
    fn retry_policy(&self, job: &Job, number: u32) -> RetryPolicy {
        let provider = job
            .attempt(number)
            .and_then(|a| self.providers.get(&a.provider))
            .map(|p| p.config.retry_limits())
            .unwrap_or_default();
        let contract = self
            .contracts
            .get(&job.contract)
            .map(|c| c.retry)
            .unwrap_or_default();
        self.settings.retry.limited(provider, contract)
    }
}

/// A provider's breaker, read and written by compare-and-swap so that every worker of every process shares it. A
/// store that fails here is logged and lets the call through: the breaker saves calls, it never decides a job.
impl Engine {
    fn breaker_policy(&self, provider: &ProviderName) -> BreakerPolicy {
        let timeout = self
            .providers
            .get(provider)
            .map_or(BREAKER_LOOK_AGAIN, |p| p.config.timeout());
        BreakerPolicy {
            threshold: self.settings.breaker_threshold,
            window: self.settings.breaker_window,
            cooldown: self.settings.breaker_cooldown,
            // A probe's worker that dies frees the probe once its claim's lease would have ended.
            probe_lease: self.lease(),
            // The probe answers, or times out (and opens the breaker again), within its timeout.
            look_again: timeout.min(BREAKER_LOOK_AGAIN),
        }
    }

    /// `provider`'s breaker as the store holds it, and its state now (`closed`, `open`, `half_open`, `probing`).
    pub async fn breaker(
        &self,
        provider: &ProviderName,
    ) -> Result<(Breaker, &'static str), StoreError> {
        let (breaker, _) = self.store.breaker(provider).await?;
        let state = breaker.state(self.clock.now(), &self.breaker_policy(provider));
        Ok((breaker, state))
    }

    /// What `provider`'s breaker would admit now, without taking the probe (a probe the cooldown allows reads as
    /// [`Admission::Call`]): for a worker deciding whether to claim at all. A store that fails reads as closed.
    pub async fn peek_breaker(&self, provider: &ProviderName) -> Admission {
        let policy = self.breaker_policy(provider);
        if policy.threshold == 0 || self.clean_breakers.get(provider).is_some() {
            return Admission::Call;
        }
        match self.store.breaker(provider).await {
            Ok((breaker, _)) => {
                self.saw_breaker(provider, &breaker);
                match breaker.admit(self.clock.now(), &policy) {
                    Admission::Probe => Admission::Call,
                    admission => admission,
                }
            }
            Err(e) => {
                tracing::warn!(%provider, error = %e, "the breaker could not be read: calling");
                Admission::Call
            }
        }
    }

    /// Whether a worker may call `provider` now: closed, or this worker's call is the probe after the cooldown
    /// (recorded first, so that one worker probes), or not before `until`.
    pub async fn admit(&self, provider: &ProviderName) -> Admission {
        let policy = self.breaker_policy(provider);
        if policy.threshold == 0 || self.clean_breakers.get(provider).is_some() {
            return Admission::Call;
        }
        for _ in 0..BREAKER_TRIES {
            let now = self.clock.now();
            let (mut breaker, rev) = match self.store.breaker(provider).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(%provider, error = %e, "the breaker could not be read: calling");
                    return Admission::Call;
                }
            };
            self.saw_breaker(provider, &breaker);
            let admission = breaker.admit(now, &policy);
            if admission != Admission::Probe {
                return admission;
            }
            breaker.start_probe(now);
            match self.store.put_breaker(provider, &breaker, rev).await {
                Ok(true) => {
                    self.saw_breaker(provider, &breaker);
                    tracing::info!(%provider, "breaker cooldown over: this call is the probe");
                    return Admission::Probe;
                }
                Ok(false) => {}
                Err(e) => {
                    // Whether it landed is not known: the next attempt reads the breaker.
                    self.clean_breakers.forget(provider);
                    tracing::warn!(%provider, error = %e, "the probe could not be recorded: calling");
                    return Admission::Call;
                }
            }
        }
        Admission::Call
    }

    /// What a call to `provider` by `attempt` (`job_id#n`) came to: a failure that tells of the provider's health
    /// (`failed`: a 5xx, a 429, a refused key or connection, a lost answer, a time-out) counts towards opening its
    /// breaker (a failed probe opens it again); any other answer closes it.
    pub async fn breaker_saw(&self, provider: &ProviderName, attempt: &str, failed: bool) {
        let policy = self.breaker_policy(provider);
        // An answer leaves a clean breaker as it is; a failure is always counted on the stored one.
        if policy.threshold == 0 || (!failed && self.clean_breakers.get(provider).is_some()) {
            return;
        }
        for _ in 0..BREAKER_TRIES {
            let now = self.clock.now();
            let Ok((mut breaker, rev)) = self.store.breaker(provider).await else {
                tracing::warn!(%provider, "the breaker could not be read: this call is not counted");
                return;
            };
            self.saw_breaker(provider, &breaker);
            let trips = breaker.trips;
            let changed = if failed {
                breaker.failed(attempt, now, &policy)
            } else {
                breaker.answered()
            };
            if !changed {
                return;
            }
            match self.store.put_breaker(provider, &breaker, rev).await {
                Ok(true) => {
                    self.saw_breaker(provider, &breaker);
                    if breaker.trips > trips {
                        self.metrics.breaker_trip(provider);
                        tracing::warn!(%provider, until = ?breaker.open_until, "breaker open");
                    }
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    // Whether it landed is not known: the next attempt reads the breaker.
                    self.clean_breakers.forget(provider);
                    tracing::warn!(%provider, error = %e, "the breaker could not be written");
                    return;
                }
            }
        }
    }

    /// Remembers for a moment whether `provider`'s breaker, as just read or written, is clean.
    fn saw_breaker(&self, provider: &ProviderName, breaker: &Breaker) {
        if breaker.is_clean() {
            self.clean_breakers.put(provider.clone(), ());
        } else {
            self.clean_breakers.forget(provider);
        }
    }
}

/// Reads and compare-and-swaps of a breaker before giving up on one change (other workers write it meanwhile).
const BREAKER_TRIES: usize = 5;

/// The longest a job waiting on a probe goes before it looks again at the breaker.
const BREAKER_LOOK_AGAIN: chrono::Duration = chrono::Duration::seconds(2);
