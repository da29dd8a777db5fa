//! The worker is one step, [`process_attempt`], and thin loops around it: [`run_local`] for the local server
//! (a Lambda SQS handler wraps the same step). [`sweeper`] is the other step: expired leases and lost messages.

pub mod sweeper;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tracing::Instrument;
use tracing::field::Empty;

use crate::contracts::Contract;
use crate::domain::{
    Admission, AttemptRef, CallReport, Completion, ErrorInfo, Health, Job, Refusal, Timestamp,
    WriteToken,
};
use crate::engine::{AnswerLost, Engine};
use crate::providers::checks::{self, Prepared};
use crate::providers::{ConfiguredProvider, ProviderOutcome, ProviderRequest, Reply};
use crate::queue::{Delivery, Message};
use crate::store::StoreError;
use crate::telemetry::trace;

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
    /// The attempt's provider takes no call now — its breaker is open and nothing else may take the job, or every
    /// one of its call slots is taken: the attempt stays `queued`, unclaimed, and its message comes back. No try is
    /// charged.
    Waiting,
}

/// Claims the attempt, calls its provider once, and records what happened:
/// - an answer that keeps the contract completes by compare-and-swap (the loser is discarded and logged);
/// - a definite failure fails the attempt, and failover queues the next qualified provider in the same write;
/// - no answer within `timeout_ms` makes the attempt `unknown`; the step keeps listening `late_result_ms` more and
///   completes by compare-and-swap if the answer comes.
///
/// Every write of the step carries one token, made here: a claim whose answer was lost is found again as this
/// step's own, and an answer the step holds is written for as long as it can still matter (see [`Engine`]).
///
/// An `Err` is a store failure: the message should be delivered again. A redelivery is a new step with a new
/// token: if the claim had landed, it is refused, and after the lease the attempt is `unknown`.
pub async fn process_attempt(
    engine: &Engine,
    message: &AttemptRef,
) -> Result<Processed, StoreError> {
    process_message(engine, &Message::new(message.clone(), None), None).await
}

/// [`process_message`] for a message as it arrived: the step is a span of the job's trace, under the dispatch that
/// sent the message.
pub async fn process_delivery(
    engine: &Engine,
    delivery: &Delivery,
    deadline: Option<Timestamp>,
) -> Result<Processed, StoreError> {
    let message = &delivery.message.attempt;
    let span = tracing::info_span!("message", job_id = %message.job_id, attempt = message.number, trace_id = Empty);
    trace::join(&span, &message.job_id, delivery.traceparent.as_deref());
    process_message(engine, &delivery.message, deadline)
        .instrument(span)
        .await
}

/// [`process_attempt`] for a message that may name the attempt's provider (then, if its breaker lets no call
/// through and nothing else may take the job, the attempt waits unclaimed: [`Engine::wait_out_breaker`]),
/// listening for a late answer and writing answers no later than `deadline` (a Lambda's remaining time).
pub async fn process_message(
    engine: &Engine,
    sent: &Message,
    deadline: Option<Timestamp>,
) -> Result<Processed, StoreError> {
    if engine.wait_out_breaker(sent).await? || !engine.take_slot(sent).await? {
        return Ok(Processed::Waiting);
    }
    claim_and_run(engine, sent, deadline).await
}

/// The step once its provider may take the call: claim, call, write; then the call slot is freed — by this step
/// only if its claim succeeded, so that a duplicate message, whose claim is refused, never frees the slot of the
/// call its attempt is making (a late one, of an attempt whose call is over, frees the slot it took again).
async fn claim_and_run(
    engine: &Engine,
    sent: &Message,
    deadline: Option<Timestamp>,
) -> Result<Processed, StoreError> {
    let message = &sent.attempt;
    let token = WriteToken::new();
    let job = match engine
        .claim(message, &token, engine.answer_deadline(deadline))
        .instrument(tracing::info_span!("claim"))
        .await
    {
        Ok(job) => job,
        Err(StoreError::Refused(Refusal::NotYet { not_before, .. })) => {
            // Here before its time (a queue's longest delay is shorter than the wait): sent again for the rest.
            tracing::info!(job_id = %message.job_id, attempt = message.number, %not_before, "message early: sent again for its time");
            engine.dispatch_at(sent, Some(not_before)).await;
            return Ok(Processed::Dropped);
        }
        Err(StoreError::Refused(refusal)) => {
            tracing::info!(job_id = %message.job_id, attempt = message.number, %refusal, "message dropped: attempt not queued");
            engine.dropped(sent).await?;
            return Ok(Processed::Dropped);
        }
        Err(StoreError::NotFound) => {
            tracing::warn!(job_id = %message.job_id, attempt = message.number, "message dropped: no such job");
            return Ok(Processed::Dropped);
        }
        Err(e) => return Err(e),
    };
    let attempt = job
        .attempt(message.number)
        .expect("the claimed attempt exists");
    let span = tracing::info_span!("attempt", job_id = %job.id, attempt = attempt.number, provider = %attempt.provider, trace_id = %trace::trace_id(&job.id));
    let processed = Step {
        engine,
        job: &job,
        message,
        deadline,
        token,
    }
    .run()
    .instrument(span)
    .await;
    engine.free_slot(sent).await;
    processed
}

/// One claimed attempt on its way to an outcome.
struct Step<'a> {
    engine: &'a Engine,
    /// The job as the claim left it.
    job: &'a Job,
    message: &'a AttemptRef,
    /// No listening, and no writing, past this point.
    deadline: Option<Timestamp>,
    /// The token of every write of this step.
    token: WriteToken,
}

impl Step<'_> {
    async fn run(&self) -> Result<Processed, StoreError> {
        let attempt = self
            .job
            .attempt(self.message.number)
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
        let key = format!("{}:{}", self.job.id, self.message.number);
        let prepared = match checks::prepare(contract, provider, &self.job.input, key) {
            Ok(prepared) => prepared,
            Err(e) => return self.fail(e, CallReport::default()).await,
        };
        if let Admission::Skip { until } = self.engine.admit(&attempt.provider).await {
            // No call: the provider's breaker is open. Failover takes the job on, or a retry waits it out.
            let wait = (until - self.engine.clock.now()).num_milliseconds().max(0);
            let report = CallReport {
                retry_after_s: Some(u64::try_from((wait + 999) / 1000).unwrap_or_default()),
                ..CallReport::default()
            };
            let error = ErrorInfo::new(
                "breaker_open",
                format!(
                    "{} failed repeatedly: not called until {until}",
                    attempt.provider
                ),
            );
            return self.fail(error, report).await;
        }
        match self.call(provider, &prepared.request).await? {
            Some(reply) => self.settle(contract, &prepared, reply).await,
            None => {
                // No answer at all: the provider's health, for its breaker (the time-out is written already).
                self.advise(Health::Failing, None, None, None).await;
                Ok(Processed::Unknown)
            }
        }
    }

    /// The provider's reply, or `None` if none came within the timeout and the late window. After the timeout the
    /// attempt is written `unknown` while listening goes on: a write that stalls never keeps an answer from being
    /// heard, and an answer that is ready always wins over a timer (invariant 16).
    async fn call(
        &self,
        provider: &ConfiguredProvider,
        request: &ProviderRequest,
    ) -> Result<Option<Reply>, StoreError> {
        let clock = &self.engine.clock;
        let began = Instant::now();
        let span = tracing::info_span!("provider_call", outcome = Empty);
        let mut call = std::pin::pin!(provider.client.call(request).instrument(span.clone()));
        tokio::select! {
            biased;
            outcome = &mut call => {
                span.record("outcome", self.timed(provider, Some(&outcome), began));
                return Ok(Some(outcome));
            }
            () = clock.sleep(provider.config.timeout()) => {}
        }
        // The late window starts at the timeout, not when the store has answered, and ends by the deadline.
        let mut late = provider.config.late_result();
        if let Some(deadline) = self.deadline {
            late = late
                .min(deadline - clock.now())
                .max(chrono::Duration::zero());
        }
        let late_end = clock.now() + late;
        let mut late_window = std::pin::pin!(clock.sleep(late));
        tracing::warn!(
            timeout_ms = provider.config.timeout_ms(),
            "no answer in time: attempt unknown"
        );
        // Written while the window runs; if the store will not take it, listening goes on all the same (an answer
        // that comes is worth more), and the sweeper makes the attempt unknown after its lease.
        let mut marking = std::pin::pin!(self.engine.mark_unknown(
            self.message,
            &self.token,
            late_end
        ));
        let mut marked = None;
        loop {
            tokio::select! {
                biased;
                outcome = &mut call => {
                    span.record("outcome", self.timed(provider, Some(&outcome), began));
                    return Ok(Some(outcome));
                }
                written = &mut marking, if marked.is_none() => marked = Some(written),
                () = &mut late_window => break,
            }
        }
        tracing::warn!(
            late_result_ms = provider.config.late_result_ms(),
            "no late answer either: attempt stays unknown"
        );
        span.record("outcome", self.timed(provider, None, began));
        let marked = match marked {
            Some(written) => written,
            None => marking.await,
        };
        marked.map(|_| None)
    }

    /// Records a call begun at `began`: its reply, or `None` when listening ended without one; the outcome's name.
    fn timed(
        &self,
        provider: &ConfiguredProvider,
        reply: Option<&Reply>,
        began: Instant,
    ) -> &'static str {
        let outcome = match reply.map(|r| &r.outcome) {
            Some(ProviderOutcome::Answered(_)) => "answered",
            Some(ProviderOutcome::Failed(_)) => "failed",
            Some(ProviderOutcome::Lost(_)) => "lost",
            None => "no_answer",
        };
        // The configured model (what a demo provider reports for a demo): a remote provider's report could name
        // anything, and each name would be a series of its own.
        let model = (provider.config.model())
            .or_else(|| reply.and_then(|r| r.report.model.as_deref()))
            .unwrap_or("");
        let attempt = self
            .job
            .attempt(self.message.number)
            .expect("the claimed attempt exists");
        self.engine
            .metrics
            .provider_call(&attempt.provider, model, outcome, began.elapsed());
        outcome
    }

    /// Writes what the reply means for the attempt first (invariant 16), then what it tells of the provider.
    async fn settle(
        &self,
        contract: &Contract,
        prepared: &Prepared,
        reply: Reply,
    ) -> Result<Processed, StoreError> {
        let redacted = |problem| reply.redacted(problem);
        let (outcome, mut report, health) =
            (reply.outcome.clone(), reply.report.clone(), reply.health);
        checks::annotate(prepared, &mut report);
        self.price(&mut report);
        let model = report.model.clone();
        let spent = report.clone();
        let (processed, broke) = match outcome {
            ProviderOutcome::Answered(output) => {
                let unqualified = (self.engine)
                    .unqualified_answer(self.job, self.message.number, model.as_deref())
                    .await;
                let checked = match unqualified {
                    Some(problem) => Err(problem),
                    None => checks::check_answer(contract, prepared, &output, &report),
                };
                match checked {
                    Ok(()) => (self.complete(output, report).await, None),
                    Err(problem) => {
                        let problem = redacted(problem);
                        let broke = checks::breaks_contract(&problem).then(|| problem.clone());
                        (self.fail(problem, report).await, broke)
                    }
                }
            }
            ProviderOutcome::Failed(error) => {
                let broke = checks::breaks_contract(&error).then(|| error.clone());
                (self.fail(error, report).await, broke)
            }
            ProviderOutcome::Lost(error) => {
                tracing::warn!(code = %error.code, error = %error.message, "the provider may have done the work: attempt unknown");
                let until = self.engine.answer_deadline(self.deadline);
                let marked = self
                    .engine
                    .mark_unknown(self.message, &self.token, until)
                    .await
                    .map(|_| Processed::Unknown);
                (marked, None)
            }
        };
        self.advise(health, model.as_deref(), broke.as_ref(), Some(&spent))
            .await;
        processed
    }

    /// The call's cost by the price table, kept with its usage: what it cost when it was made.
    fn price(&self, report: &mut CallReport) {
        let attempt = self
            .job
            .attempt(self.message.number)
            .expect("the claimed attempt exists");
        let model = (self.engine.providers.get(&attempt.provider)).and_then(|p| p.config.model());
        report.cost_nanos =
            (self.engine.settings.prices).cost_nanos(&attempt.provider, model, report);
    }

    /// What the call told of its provider, once its answer is written: whether it is failing (its breaker) and what
    /// model answered and whether the answer broke the contract (its standing); and what it cost, for its owner's
    /// budget. Advisory state: it never decides the attempt, and it stops at the deadline.
    async fn advise(
        &self,
        health: Health,
        model: Option<&str>,
        broke: Option<&ErrorInfo>,
        spent: Option<&CallReport>,
    ) {
        let attempt = self
            .job
            .attempt(self.message.number)
            .expect("the claimed attempt exists");
        let name = format!("{}#{}", self.job.id, self.message.number);
        let advice = async {
            self.engine
                .breaker_saw(&attempt.provider, &name, health)
                .await;
            self.engine
                .observe(self.job, self.message.number, model, broke)
                .await;
            if let Some(report) = spent {
                self.engine.record_spend(&self.job.owner, report).await;
            }
        };
        match self.deadline {
            None => advice.await,
            Some(deadline) => {
                let left = (deadline - self.engine.clock.now()).max(chrono::Duration::zero());
                tokio::select! {
                    () = advice => {}
                    () = self.engine.clock.sleep(left) => {
                        tracing::warn!("out of time for the provider's breaker and standing: not recorded");
                    }
                }
            }
        }
    }

    #[tracing::instrument(name = "complete", skip_all)]
    async fn complete(
        &self,
        output: serde_json::Value,
        report: CallReport,
    ) -> Result<Processed, StoreError> {
        let until = self.engine.answer_deadline(self.deadline);
        let number = self.message.number;
        match self
            .engine
            .complete(&self.job.id, number, output, report, &self.token, until)
            .await
        {
            Ok(Completion::Won) => Ok(Processed::Succeeded),
            Ok(Completion::Lost { winner }) => Ok(Processed::Discarded { winner }),
            Err(AnswerLost {
                source: StoreError::Refused(refusal),
                ..
            }) => {
                tracing::warn!(%refusal, "result for an attempt that already ended: dropped");
                Ok(Processed::Dropped)
            }
            Err(lost) => Err(lost.source),
        }
    }

    #[tracing::instrument(name = "fail", skip_all)]
    async fn fail(&self, error: ErrorInfo, report: CallReport) -> Result<Processed, StoreError> {
        tracing::warn!(code = %error.code, message = %error.message, "attempt failed");
        let until = self.engine.answer_deadline(self.deadline);
        match self
            .engine
            .fail(
                self.job,
                self.message.number,
                error,
                report,
                &self.token,
                until,
            )
            .await
        {
            Ok(_) => Ok(Processed::Failed),
            Err(AnswerLost {
                source: StoreError::Refused(refusal),
                ..
            }) => {
                tracing::info!(%refusal, "failure for an attempt that already ended: dropped");
                Ok(Processed::Dropped)
            }
            Err(lost) => Err(lost.source),
        }
    }
}

/// The local server's worker: runs each message from the in-process queue, up to `concurrency` at once, until the
/// queue closes. A store failure is logged; the sweeper dispatches the attempt again if it is still queued.
/// Aborting this task aborts the attempts it runs, as a crash would.
pub async fn run_local(
    engine: Arc<Engine>,
    mut queue: mpsc::UnboundedReceiver<Delivery>,
    concurrency: usize,
) {
    let slots = Arc::new(Semaphore::new(concurrency));
    let mut running = JoinSet::new();
    while let Some(message) = queue.recv().await {
        while running.try_join_next().is_some() {}
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let engine = engine.clone();
        running.spawn(async move {
            if let Err(e) = process_delivery(&engine, &message, None).await {
                let message = &message.message.attempt;
                tracing::error!(job_id = %message.job_id, attempt = message.number, error = %crate::telemetry::error_chain(&e), "attempt step failed");
            }
            drop(slot);
        });
    }
    running.join_all().await;
}
