//! An attempt's writes as its worker makes them: the claim, then its answer — a result (compare-and-swap on the
//! slot), a definite failure (with its retry or failover in the same write) or a time-out into `unknown` — each
//! tried again under the step's token while the store fails, for as long as the answer can still matter.

use serde_json::Value;

use super::follow_up::Wrote;
use super::{AnswerLost, Engine};
use crate::domain::{
    AttemptRef, AttemptState, CallReport, Completion, ErrorInfo, Failover, Job, JobId, RetryPolicy,
    Stamp, Timestamp, WriteToken,
};
use crate::store::StoreError;

/// Who writes an attempt's answer: the step's token (every try of the write carries it), and whether the answer
/// was found by asking the provider (the reconciler) rather than heard by the worker that made the call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answerer<'a> {
    pub token: &'a WriteToken,
    pub by_lookup: bool,
}

impl Answerer<'_> {
    /// The stamp of one try of the answer's write, at `now`.
    fn stamp(&self, now: Timestamp) -> Stamp {
        let stamp = Stamp::new(self.token.clone(), now);
        match self.by_lookup {
            true => stamp.looked_up(),
            false => stamp,
        }
    }
}

impl Engine {
    /// A worker takes the attempt a message names (`queued` → `started`), as the step that `token` stands for,
    /// tried again while the store fails until `until` (the message's own time: an invocation's deadline, within
    /// its visibility): a claim that landed and lost its answer is found again as this step's, not left to its
    /// lease.
    pub(super) async fn claim(
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
        self.follow_up(&job, Wrote::Claimed(message.number)).await?;
        Ok(job)
    }

    /// `started` → `unknown`, with the provider's name of the call if it gave one, written until `until`. `None`
    /// when the domain refused: someone resolved the attempt meanwhile.
    pub(super) async fn mark_unknown(
        &self,
        attempt: &AttemptRef,
        call_id: Option<&str>,
        token: &WriteToken,
        until: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        let written = self
            .persist("time-out", token, until, |stamp| async move {
                self.store
                    .mark_unknown(&attempt.job_id, attempt.number, call_id, &stamp)
                    .await
            })
            .await;
        match written {
            Ok(job) => {
                self.follow_up(&job, Wrote::Unknown(attempt.number)).await?;
                Ok(Some(job))
            }
            Err(StoreError::Refused(_) | StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A valid result for attempt `number` of `job`: compare-and-swap on the result slot, written until `until`.
    /// The loser is discarded and logged. If the store never takes it, the result is logged at ERROR, whole, so
    /// that an operator can recover it.
    pub(super) async fn complete(
        &self,
        job_id: &JobId,
        number: u32,
        result: Value,
        report: CallReport,
        by: Answerer<'_>,
        until: Timestamp,
    ) -> Result<Completion, AnswerLost> {
        // Every try is stamped with the time the answer came: a cancelled attempt's answer is in time, or not, by
        // when it arrived, however long its write takes to land.
        let answered_at = self.clock.now();
        let written = self
            .persist("completion", by.token, until, |_| {
                let (result, report) = (result.clone(), report.clone());
                let stamp = by.stamp(answered_at);
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
                self.answer_followed_up(&job, Wrote::Won(number)).await?;
                Ok(Completion::Won)
            }
            Ok((Completion::Lost { winner }, job)) => {
                // `winner` is the attempt holding the result slot; none when the job was cancelled, or when a
                // cancelled attempt answered after its lease.
                let winner_text = winner.map_or_else(|| "none".to_owned(), |w| w.to_string());
                tracing::warn!(job_id = %job.id, loser = number, winner = %winner_text, "race lost: result discarded");
                self.answer_followed_up(&job, Wrote::Lost(number)).await?;
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

    /// [`Engine::follow_up`] after an answer's write: if the event could not be armed, the answer is written but
    /// the step fails, so that its message comes back and the redelivery arms it.
    async fn answer_followed_up(&self, job: &Job, wrote: Wrote) -> Result<(), AnswerLost> {
        let number = wrote.attempt().expect("an answer names its attempt");
        self.follow_up(job, wrote)
            .await
            .map_err(|source| AnswerLost {
                job_id: job.id.clone(),
                number,
                source,
            })
    }

    /// A definite failure of attempt `number` of `job` (the claimed copy), with failover in the same write,
    /// written until `until`.
    pub(super) async fn fail(
        &self,
        job: &Job,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        by: Answerer<'_>,
        until: Timestamp,
    ) -> Result<Job, AnswerLost> {
        let written = self
            .persist("failure", by.token, until, |stamp| {
                let (error, report) = (error.clone(), report.clone());
                let stamp = by.stamp(stamp.now);
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
                // A cancelled attempt's late failure is kept on it and moves nothing else.
                let late = after
                    .attempt(number)
                    .is_some_and(|a| a.state == AttemptState::Cancelled);
                if late {
                    tracing::info!(job_id = %after.id, attempt = number, code = %error.code, "a cancelled attempt answered after all: kept on it");
                } else if let Some(error) = &after.error {
                    tracing::warn!(job_id = %after.id, code = %error.code, "no failover: {}", error.message);
                }
                let wrote = if late {
                    Wrote::Late(number)
                } else {
                    Wrote::Failed(number)
                };
                self.answer_followed_up(&after, wrote).await?;
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

    /// The retry policy for attempt `number` of `job`: the deployment's, its provider's limits in their place,
    /// its contract's as a ceiling.
    pub(super) fn retry_policy(&self, job: &Job, number: u32) -> RetryPolicy {
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
