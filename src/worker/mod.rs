//! The worker is one step, [`process_attempt`], and thin loops around it: [`run_local`] for the local server
//! (a Lambda SQS handler wraps the same step). [`sweeper`] is the other step: expired leases and lost messages.

pub mod sweeper;

use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::checks::{self, Prepared};
use crate::contracts::Contract;
use crate::domain::{AttemptRef, AttemptState, CallReport, Completion, ErrorInfo, Job, Timestamp};
use crate::engine::Engine;
use crate::providers::{ConfiguredProvider, ProviderOutcome, ProviderRequest, Reply};
use crate::store::StoreError;

/// What one step did with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// The attempt was not `queued` (a duplicate or late message, or a cancelled attempt): nothing was called.
    Dropped,
    /// The provider's result won the result slot.
    Succeeded,
    /// A valid result came after another attempt had won (or the job was cancelled); it was discarded.
    Discarded { winner: Option<u32> },
    /// A definite failure; failover queued the next attempt or gave the job its error.
    Failed,
    /// No answer in time (or the connection was lost after sending): the attempt is `unknown`.
    Unknown,
}

/// Claims the attempt, calls its provider once, and records what happened:
/// - an answer that keeps the contract completes by compare-and-swap (the loser is discarded and logged);
/// - a definite failure fails the attempt, and failover queues the next qualified provider in the same write;
/// - no answer within `timeout_ms` makes the attempt `unknown`; the step keeps listening `late_result_ms` more and
///   completes by compare-and-swap if the answer comes.
///
/// An `Err` is a store failure: the message should be delivered again (the claim makes that safe).
pub async fn process_attempt(
    engine: &Engine,
    message: &AttemptRef,
) -> Result<Processed, StoreError> {
    process_attempt_until(engine, message, None).await
}

/// [`process_attempt`], listening for a late answer no later than `deadline` (a Lambda's remaining time).
pub async fn process_attempt_until(
    engine: &Engine,
    message: &AttemptRef,
    deadline: Option<Timestamp>,
) -> Result<Processed, StoreError> {
    let now = engine.clock.now();
    let job = match engine
        .store
        .claim_attempt(&message.job_id, message.number, now + engine.lease(), now)
        .await
    {
        Ok(job) => job,
        Err(StoreError::Refused(refusal)) => {
            tracing::info!(job_id = %message.job_id, attempt = message.number, %refusal, "message dropped: attempt not queued");
            return Ok(Processed::Dropped);
        }
        Err(StoreError::NotFound) => {
            tracing::warn!(job_id = %message.job_id, attempt = message.number, "message dropped: no such job");
            return Ok(Processed::Dropped);
        }
        Err(e) => return Err(e),
    };
    engine.metrics.attempt(AttemptState::Started);
    engine.changed(&job);
    let attempt = job
        .attempt(message.number)
        .expect("the claimed attempt exists");
    let span = tracing::info_span!("attempt", job_id = %job.id, attempt = attempt.number, provider = %attempt.provider);
    Step {
        engine,
        job: &job,
        number: message.number,
        deadline,
    }
    .run()
    .instrument(span)
    .await
}

/// One claimed attempt on its way to an outcome.
struct Step<'a> {
    engine: &'a Engine,
    /// The job as the claim left it.
    job: &'a Job,
    number: u32,
    /// No listening past this point.
    deadline: Option<Timestamp>,
}

impl Step<'_> {
    async fn run(&self) -> Result<Processed, StoreError> {
        let attempt = self
            .job
            .attempt(self.number)
            .expect("the claimed attempt exists");
        let Some(contract) = self.engine.contracts.get(&self.job.contract) else {
            return self
                .fail(
                    ErrorInfo::new(
                        "unknown_contract",
                        format!("{} is no longer configured", self.job.contract),
                    ),
                    CallReport::default(),
                )
                .await;
        };
        let Some(provider) = self.engine.providers.get(&attempt.provider) else {
            return self
                .fail(
                    ErrorInfo::new(
                        "unknown_provider",
                        format!("{} is no longer configured", attempt.provider),
                    ),
                    CallReport::default(),
                )
                .await;
        };
        let key = format!("{}:{}", self.job.id, self.number);
        let prepared = match checks::prepare(contract, provider, &self.job.input, key) {
            Ok(prepared) => prepared,
            Err(e) => return self.fail(e, CallReport::default()).await,
        };
        match self.call(provider, &prepared.request).await? {
            Some(reply) => self.settle(contract, &prepared, reply).await,
            None => Ok(Processed::Unknown),
        }
    }

    /// The provider's reply, or `None` if none came within the timeout and the late window.
    async fn call(
        &self,
        provider: &ConfiguredProvider,
        request: &ProviderRequest,
    ) -> Result<Option<Reply>, StoreError> {
        let clock = &self.engine.clock;
        let mut call = provider.client.call(request);
        tokio::select! {
            outcome = &mut call => return Ok(Some(outcome)),
            () = clock.sleep(provider.config.timeout()) => {}
        }
        // The late window starts at the timeout, not when the store has answered, and ends by the deadline.
        let mut late = provider.config.late_result();
        if let Some(deadline) = self.deadline {
            late = late
                .min(deadline - clock.now())
                .max(chrono::Duration::zero());
        }
        let late_window = clock.sleep(late);
        tracing::warn!(
            timeout_ms = provider.config.timeout_ms,
            "no answer in time: attempt unknown"
        );
        self.mark_unknown().await?;
        tokio::select! {
            outcome = &mut call => Ok(Some(outcome)),
            () = late_window => {
                tracing::warn!(late_result_ms = provider.config.late_result_ms, "no late answer either: attempt stays unknown");
                Ok(None)
            }
        }
    }

    async fn settle(
        &self,
        contract: &Contract,
        prepared: &Prepared,
        reply: Reply,
    ) -> Result<Processed, StoreError> {
        let Reply { outcome, report } = reply;
        match outcome {
            ProviderOutcome::Answered(output) => {
                match checks::check_answer(contract, prepared, &output, &report) {
                    Ok(()) => self.complete(output, report).await,
                    Err(problem) => self.fail(problem, report).await,
                }
            }
            ProviderOutcome::Failed(error) => self.fail(error, report).await,
            ProviderOutcome::Lost(error) => {
                tracing::warn!(error = %error.message, "connection lost after sending: attempt unknown");
                self.mark_unknown().await?;
                Ok(Processed::Unknown)
            }
        }
    }

    async fn complete(
        &self,
        output: serde_json::Value,
        report: CallReport,
    ) -> Result<Processed, StoreError> {
        let engine = self.engine;
        let now = engine.clock.now();
        match engine
            .store
            .complete_attempt(&self.job.id, self.number, output, report, now)
            .await
        {
            Ok((Completion::Won, job)) => {
                tracing::info!("result claimed");
                engine.metrics.attempt(AttemptState::Succeeded);
                engine.changed(&job);
                Ok(Processed::Succeeded)
            }
            Ok((Completion::Lost { winner }, job)) => {
                // `winner` is the attempt holding the result slot; none when the job was cancelled instead.
                let winner_text =
                    winner.map_or_else(|| "none (job cancelled)".to_owned(), |w| w.to_string());
                tracing::warn!(job_id = %job.id, loser = self.number, winner = %winner_text, "race lost: result discarded");
                engine.metrics.race_lost();
                engine.changed(&job);
                Ok(Processed::Discarded { winner })
            }
            Err(StoreError::Refused(refusal)) => {
                tracing::warn!(%refusal, "result for an attempt that already ended: dropped");
                Ok(Processed::Dropped)
            }
            Err(e) => Err(e),
        }
    }

    async fn fail(&self, error: ErrorInfo, report: CallReport) -> Result<Processed, StoreError> {
        let engine = self.engine;
        tracing::warn!(code = %error.code, message = %error.message, "attempt failed");
        // The claimed copy is current enough: while this attempt is live, no other can be added.
        let next = engine.failover(self.job).await?;
        match engine
            .store
            .fail_attempt(
                &self.job.id,
                self.number,
                error,
                report,
                next,
                engine.clock.now(),
            )
            .await
        {
            Ok(job) => {
                engine.metrics.attempt(AttemptState::Failed);
                if let Some(error) = &job.error {
                    tracing::warn!(code = %error.code, "no failover: {}", error.message);
                }
                engine.changed(&job);
                engine.dispatch_queued(&job).await;
                Ok(Processed::Failed)
            }
            Err(StoreError::Refused(refusal)) => {
                tracing::info!(%refusal, "failure for an attempt that already ended: dropped");
                Ok(Processed::Dropped)
            }
            Err(e) => Err(e),
        }
    }

    /// `started` → `unknown`. Refused if someone resolved the attempt meanwhile, which is fine: keep listening.
    async fn mark_unknown(&self) -> Result<(), StoreError> {
        let engine = self.engine;
        match engine
            .store
            .mark_unknown(&self.job.id, self.number, engine.clock.now())
            .await
        {
            Ok(job) => {
                engine.metrics.attempt(AttemptState::Unknown);
                engine.changed(&job);
                Ok(())
            }
            Err(StoreError::Refused(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The local server's worker: runs each message from the in-process queue, up to `concurrency` at once, until the
/// queue closes. A store failure is logged; the sweeper dispatches the attempt again if it is still queued.
/// Aborting this task aborts the attempts it runs, as a crash would.
pub async fn run_local(
    engine: Arc<Engine>,
    mut queue: mpsc::UnboundedReceiver<AttemptRef>,
    concurrency: usize,
) {
    let slots = Arc::new(Semaphore::new(concurrency));
    let mut running = JoinSet::new();
    while let Some(message) = queue.recv().await {
        while running.try_join_next().is_some() {}
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let engine = engine.clone();
        running.spawn(async move {
            if let Err(e) = process_attempt(&engine, &message).await {
                tracing::error!(job_id = %message.job_id, attempt = message.number, error = %crate::telemetry::error_chain(&e), "attempt step failed");
            }
            drop(slot);
        });
    }
    running.join_all().await;
}
