//! The reconciler: what clears an `unknown` attempt without a person. Each sweep reads the `unknown` jobs, newest
//! first, and for each `unknown` attempt no worker can still hear an answer for (its lease ended):
//!
//! - its provider [can be asked](crate::providers::Kind::can_be_asked): a worker is sent to ask it about the call
//!   ([`crate::queue::Message::look_up`]: the workers are what talks to providers, side by side), never to call it
//!   again. An answer found is a late answer, written as one (it wins the slot by compare-and-swap, or is
//!   discarded); the provider's "no such call" clears the attempt once the call is old enough that it cannot still
//!   be running (`lookup_absent_after_ms`), and its provider is tried again: the work was not done, so no second
//!   call is paid; a question unanswered is asked again at the next sweep.
//! - its job's contract, else its provider, sets `unknown_retry_after_ms`: that long after its time-out the
//!   attempt is cleared by policy and tried again, accepting a possible second paid call (on the bill: possibly
//!   paid).
//! - otherwise (or where the contract says `unknown = "hold"`) it stays `unknown` for a person.
//!
//! Every write goes through the same guarded transitions as a worker's: a clear the domain refuses (a late answer,
//! a person, got there first) is no error.

use chrono::Duration;

use super::follow_up::Wrote;
use super::{Claimed, Engine, Processed};
use crate::contracts::UnknownPolicy;
use crate::domain::{
    Attempt, AttemptRef, AttemptState, ClearedBy, Failover, Job, Timestamp, WriteToken,
};
use crate::providers::checks;
use crate::providers::{Asked, ConfiguredProvider, Lookup, ProviderOutcome};
use crate::queue::Message;
use crate::store::{Cursor, StoreError};

/// How long after its call's start the reconciler is trusted with an `unknown` attempt it asks about: a batch's
/// 24-hour window and its finalising. Past it, a person is needed too (the operators' list).
const ASKED_AT_MOST: Duration = Duration::hours(26);

/// However short the provider's time-out (a batch provider's is), a lookup gets this long: reading a batch's results
/// may take longer than a call's first answer.
const LOOKUP_AT_LEAST: Duration = Duration::seconds(60);

/// What one page of the reconciler came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Lookups sent to the workers.
    pub asked: usize,
    /// Attempts cleared by policy.
    pub cleared: usize,
    /// Where the next page starts, if there is one.
    pub next: Option<Cursor>,
}

/// What the reconciler may do about one `unknown` attempt now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Ask its provider.
    Ask,
    /// Clear it by its provider's policy.
    Policy,
    /// Nothing yet, or nothing ever (`hold`: a person's).
    Wait,
}

impl Engine {
    /// One page of `unknown` jobs, from `cursor`, each attempt cleared as far as it can be now.
    pub async fn reconcile_page(
        &self,
        cursor: Option<&Cursor>,
        deadline: Option<Timestamp>,
    ) -> Result<Reconciled, StoreError> {
        let page = self
            .needing_a_person(
                Some(crate::domain::JobStatus::Unknown),
                self.settings.sweep_batch,
                cursor,
            )
            .await?;
        let mut done = Reconciled {
            next: page.next_cursor,
            ..Reconciled::default()
        };
        for job in page.jobs {
            if deadline.is_some_and(|deadline| self.clock.now() >= deadline) {
                break;
            }
            let Some(attempt) = (job.attempts.iter()).find(|a| a.state == AttemptState::Unknown)
            else {
                continue;
            };
            let number = attempt.number;
            match self.due(&job, attempt) {
                Due::Ask => {
                    let question = Message::look_up(attempt_ref(&job, number));
                    match self.dispatcher.dispatch(&question, Duration::zero()).await {
                        Ok(()) => done.asked += 1,
                        Err(e) => {
                            tracing::warn!(job_id = %job.id, attempt = number, error = %e, "the lookup could not be sent: the next sweep sends it");
                        }
                    }
                }
                Due::Policy => {
                    let cleared = self.clear(&job, number, ClearedBy::Policy).await?;
                    done.cleared += usize::from(cleared.is_some());
                }
                Due::Wait => {}
            }
        }
        Ok(done)
    }

    /// A worker's lookup of `attempt` ([`Message::look_up`]): if it is still `unknown` and due to be asked, its
    /// provider is asked about its call, and what it says written. What came of it: the found answer's
    /// [`Processed`], [`Processed::Cleared`] (the provider had no such call, and it is tried again), or
    /// [`Processed::Unknown`] (nothing learned yet); [`Processed::Dropped`] for an attempt no longer to ask about.
    pub async fn look_up(
        &self,
        attempt: &AttemptRef,
        deadline: Option<Timestamp>,
    ) -> Result<Processed, StoreError> {
        let Some(job) = self
            .store
            .read_job(&attempt.job_id, self.clock.now())
            .await?
        else {
            return Ok(Processed::Dropped);
        };
        let due = job
            .attempt(attempt.number)
            .filter(|a| a.state == AttemptState::Unknown)
            .map(|a| self.due(&job, a));
        match due {
            Some(Due::Ask) => self.ask(&job, attempt.number, deadline).await,
            _ => {
                // Cleared already — perhaps by this lookup's own write, whose step failed after it landed (its
                // answer lost, or its event's arming): the ended job's event is armed, as a refused claim's is.
                self.arm_deliveries(&job).await?;
                Ok(Processed::Dropped)
            }
        }
    }

    /// Whether `job` waits on an `unknown` attempt that the reconciler clears by itself (its provider can be asked,
    /// or a retry policy holds for it): no person is needed for it. A provider asked for longer than
    /// [`ASKED_AT_MOST`] without an answer that clears it (its lookups failing, its batch unreadable, a batch that
    /// may be it still running) hands the attempt back to a person, while the reconciler goes on asking.
    pub fn clears_itself(&self, job: &Job) -> bool {
        let unknown = (job.attempts.iter()).find(|a| a.state == AttemptState::Unknown);
        let now = self.clock.now();
        unknown.is_some_and(|a| {
            (self.providers.get(&a.provider)).is_some_and(|p| {
                (askable(p, a) && now < call_start(a) + ASKED_AT_MOST)
                    || self.retry_after_ms(job, p).is_some()
            })
        })
    }

    /// The retry policy for `job`'s `unknown` attempts on `provider`, where it cannot be asked: its contract's
    /// (`unknown = "hold"`: none), else the provider's `unknown_retry_after_ms`.
    fn retry_after_ms(&self, job: &Job, provider: &ConfiguredProvider) -> Option<u64> {
        match self.contracts.get(&job.contract).and_then(|c| c.unknown) {
            Some(UnknownPolicy::Hold) => None,
            Some(UnknownPolicy::RetryAfterMs(ms)) => Some(ms),
            None => provider.config.limits.unknown_retry_after_ms,
        }
    }

    /// Whether claimed attempt `number` of `job` is too late to call: its provider's `unknown` attempts are cleared
    /// by the reconciler, which takes the end of the lease for the end of listening, and the call's window (its
    /// time-out and late window, from now) would outlast the lease — as for a claim found again after its answer
    /// was lost, whose lease is its first try's.
    pub(super) fn too_late_to_call(&self, job: &Job, number: u32) -> bool {
        let Some(attempt) = job.attempt(number) else {
            return false;
        };
        let (Some(provider), Some(lease_end)) = (
            self.providers.get(&attempt.provider),
            attempt.lease_expires_at,
        ) else {
            return false;
        };
        let heard_until =
            self.clock.now() + provider.config.timeout() + provider.config.late_result();
        let reconciled = provider.config.kind.kind().can_be_asked()
            || self.retry_after_ms(job, provider).is_some();
        reconciled && heard_until > lease_end
    }

    /// What may be done about `job`'s `attempt` now: nothing while a worker may still hear its answer (its lease);
    /// then ask its provider if it can be asked, or clear it by policy once its time has come.
    fn due(&self, job: &Job, attempt: &Attempt) -> Due {
        let now = self.clock.now();
        if attempt.lease_expires_at.is_some_and(|end| now < end) {
            return Due::Wait;
        }
        let Some(provider) = self.providers.get(&attempt.provider) else {
            return Due::Wait;
        };
        if askable(provider, attempt) {
            return Due::Ask;
        }
        let Some(after) = self.retry_after_ms(job, provider) else {
            return Due::Wait;
        };
        let timed_out = call_start(attempt) + provider.config.timeout();
        match now >= timed_out + ms(after) {
            true => Due::Policy,
            false => Due::Wait,
        }
    }

    /// Asks the provider of attempt `number` about its call, bounded by the provider's timeout, and writes what
    /// it learns.
    async fn ask(
        &self,
        job: &Job,
        number: u32,
        deadline: Option<Timestamp>,
    ) -> Result<Processed, StoreError> {
        let attempt = job.attempt(number).expect("the unknown attempt");
        let (Some(contract), Some(provider)) = (
            self.contracts.get(&job.contract),
            self.providers.get(&attempt.provider),
        ) else {
            return Ok(Processed::Dropped);
        };
        let prepared = match checks::prepare(
            contract,
            provider,
            &job.input,
            attempt_key(job, number),
        ) {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::warn!(job_id = %job.id, attempt = number, code = %error.code, "the attempt's request cannot be made again to ask about it");
                return Ok(Processed::Dropped);
            }
        };
        let left = deadline.map_or(Duration::MAX, |deadline| deadline - self.clock.now());
        let looked = tokio::select! {
            looked = provider.client.look_up(&prepared.request, Asked { call_id: attempt.call_id.as_deref(), since: call_start(attempt), until: attempt.lease_expires_at }) => looked,
            () = self.clock.sleep(provider.config.timeout().max(LOOKUP_AT_LEAST).min(left)) => Lookup::Failed(crate::domain::ErrorInfo::new(
                "timeout",
                "the provider did not answer the lookup in time",
            )),
        };
        match looked {
            Lookup::Found(reply) if !matches!(reply.outcome, ProviderOutcome::Lost(_)) => {
                tracing::info!(job_id = %job.id, attempt = number, "found the unknown attempt's answer at its provider");
                let message =
                    Message::new(attempt_ref(job, number), Some(attempt.provider.clone()));
                let claimed =
                    Claimed::asked(job.clone(), message, deadline, provider.clone(), prepared);
                self.settle_found(&claimed, *reply).await
            }
            Lookup::NotFound if self.absent(attempt, provider) => {
                tracing::info!(job_id = %job.id, attempt = number, "the provider has no such call: the work was not done");
                let cleared = self.clear(job, number, ClearedBy::Lookup).await?;
                Ok(cleared.map_or(Processed::Dropped, |_| Processed::Cleared))
            }
            Lookup::Ended => {
                tracing::info!(job_id = %job.id, attempt = number, "the provider ended the call without its work");
                let cleared = self.clear(job, number, ClearedBy::Lookup).await?;
                Ok(cleared.map_or(Processed::Dropped, |_| Processed::Cleared))
            }
            Lookup::NotFound => Ok(Processed::Unknown),
            Lookup::Running => {
                tracing::info!(job_id = %job.id, attempt = number, "the call is still running at its provider: asked again at the next sweep");
                Ok(Processed::Unknown)
            }
            Lookup::Found(reply) => {
                tracing::warn!(job_id = %job.id, attempt = number, ?reply, "the lookup's answer was lost: asked again at the next sweep");
                Ok(Processed::Unknown)
            }
            Lookup::Failed(error) => {
                tracing::warn!(job_id = %job.id, attempt = number, code = %error.code, message = %error.message, "the provider could not be asked: asked again at the next sweep");
                Ok(Processed::Unknown)
            }
        }
    }

    /// Whether the provider's "no such call" about `attempt` means the work was not done: the call started long
    /// enough ago that it cannot still be running, nor its record still be on its way.
    fn absent(&self, attempt: &Attempt, provider: &ConfiguredProvider) -> bool {
        let after = ms(provider.config.limits.lookup_absent_after_ms);
        self.clock.now() >= call_start(attempt) + after
    }

    /// Clears `unknown` attempt `number` of `job` without an answer, `by` a lookup or policy, its retry or failover
    /// queued in the same write and dispatched after it. The job after it, if this write cleared it (a late answer
    /// or a person may have got there first).
    async fn clear(
        &self,
        job: &Job,
        number: u32,
        by: ClearedBy,
    ) -> Result<Option<Job>, StoreError> {
        let token = WriteToken::new();
        let written = self
            .persist("clear", &token, self.write_deadline(), |stamp| async move {
                let failover = Failover {
                    retry: Some(self.retry_policy(job, number)),
                    jitter_permille: fastrand::u16(0..=1000),
                    ..self.failover(job).await?
                };
                (self.store)
                    .clear_unknown(&job.id, number, by, &failover, &stamp)
                    .await
            })
            .await;
        let cleared = match written {
            Ok(after) => {
                tracing::warn!(job_id = %job.id, attempt = number, by = by.as_str(), "unknown attempt cleared");
                (self.follow_up(&after, Wrote::Cleared(number)).await).map(|()| Some(after))
            }
            Err(StoreError::Refused(_) | StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        };
        if cleared.is_err() {
            // Given up, or its follow-up failed: the clear may have landed and ended the job, which no sweep lists
            // again (a lookup's message comes back; a policy's clear has none): its event is armed now, as far as
            // the store lets it.
            self.arm_what_landed(&job.id).await;
        }
        cleared
    }
}

/// Whether `attempt`'s provider can be asked about its call: it keeps its calls, and, where it is asked by the name
/// it gave the call, the attempt kept that name.
fn askable(provider: &ConfiguredProvider, attempt: &Attempt) -> bool {
    let kind = provider.config.kind.kind();
    kind.can_be_asked() && (!kind.asked_by_call_name() || attempt.call_id.is_some())
}

/// The identity attempt `number` of `job` carries to its provider (`Idempotency-Key`, metadata): `<job id>:<n>`.
pub(super) fn attempt_key(job: &Job, number: u32) -> String {
    format!("{}:{}", job.id, number)
}

fn attempt_ref(job: &Job, number: u32) -> AttemptRef {
    AttemptRef {
        job_id: job.id.clone(),
        number,
    }
}

/// When the attempt's call started (its claim), or at the latest could have.
fn call_start(attempt: &Attempt) -> Timestamp {
    attempt.started_at.unwrap_or(attempt.created_at)
}

fn ms(ms: u64) -> Duration {
    Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX / 1_000_000))
}
