//! Each provider's breaker, read and written by compare-and-swap so that every worker of every process shares it
//! (`ProviderStore`). It counts only failures that tell of the provider's health (invariant 15), is written after
//! the answer (invariant 16), and a store that fails here is logged and lets the call through: the breaker saves
//! calls, it never decides a job. A job with nowhere else to go waits out an open breaker unclaimed
//! ([`Engine::wait_out_breaker`]).

use super::Engine;
use crate::domain::{
    Admission, AttemptState, Breaker, BreakerPolicy, BreakerState, FailoverDecision, Health,
    ProviderName,
};
use crate::queue::Message;
use crate::store::StoreError;

impl Engine {
    /// Whether the worker leaves the attempt `message` names `queued`, its message coming back later, rather than
    /// claim it: its provider's breaker lets no call through now (and, while one probe runs, the waiters look again
    /// within the probe's own timeout), failover would not take the job elsewhere, and the wait stays within the
    /// retry window of the attempt's first try. Waiting is not a try: no attempt is made, none is charged.
    pub(super) async fn wait_out_breaker(&self, message: &Message) -> Result<bool, StoreError> {
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

    /// `provider`'s breaker as the store holds it, and where it stands now.
    pub async fn breaker(
        &self,
        provider: &ProviderName,
    ) -> Result<(Breaker, BreakerState), StoreError> {
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
    pub(super) async fn admit(&self, provider: &ProviderName) -> Admission {
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

    /// What a call to `provider` by `attempt` (`job_id#n`) told of its health: a failure (a 5xx, a 429, a refused
    /// key or connection, a lost answer, a time-out) counts towards opening its breaker (a failed probe opens it
    /// again); an answer closes it; a refusal the request caused moves it neither way (invariant 15).
    pub(super) async fn breaker_saw(&self, provider: &ProviderName, attempt: &str, health: Health) {
        let policy = self.breaker_policy(provider);
        // An answer leaves a clean breaker as it is; a failure is always counted on the stored one.
        let moves = match health {
            Health::Failing => true,
            Health::Answered => self.clean_breakers.get(provider).is_none(),
            Health::Silent => false,
        };
        if policy.threshold == 0 || !moves {
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
            if !breaker.saw(health, attempt, now, &policy) {
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
