//! A worker's attempt, as two engine calls around its provider's call:
//!
//! - [`Engine::begin`]: wait out an open breaker or a provider with every call slot taken (the attempt stays
//!   `queued`, no try charged), take the call slot, claim the attempt, prepare its request, and let the breaker
//!   admit the call; what is claimed is a [`Claimed`].
//! - [`Engine::settle`]: what the provider's reply means for the attempt, written first (invariant 16) — a result by
//!   compare-and-swap, a definite failure with its failover, a lost answer as `unknown` — then what it told of the
//!   provider (its breaker, its standing, the owner's spend), advisory and bounded by the deadline, then the call
//!   slot freed.
//!
//! Between the two the worker calls the provider, times the call, and at its time-out has the attempt written
//! `unknown` ([`Engine::time_out`]) while it goes on listening. Whatever settles an attempt later from what its
//! provider said goes through `settle` too: the order of writes is decided here, once.

use tracing::Instrument;

use super::Engine;
use crate::contracts::Contract;
use crate::domain::{
    Admission, Attempt, BUDGET_EXCEEDED, CallReport, Completion, ErrorInfo, Health, Job, Refusal,
    Timestamp, WriteToken,
};
use crate::providers::checks::{self, Prepared};
use crate::providers::{ConfiguredProvider, ProviderOutcome, ProviderRequest, Reply};
use crate::queue::Message;
use crate::store::StoreError;

use super::AnswerLost;
use super::attempts::Answerer;

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
    /// No answer in time (or the connection was lost after sending): the attempt is `unknown`. For a lookup:
    /// nothing learned yet, it stays `unknown`. For a claim that landed too late to call within its lease: not
    /// called, it becomes `unknown` at its lease's end, for the reconciler to find no call.
    Unknown,
    /// A lookup found the provider had no such call: the `unknown` attempt was cleared, and its provider is tried
    /// again.
    Cleared,
    /// The attempt's provider takes no call now — its breaker is open and nothing else may take the job, or every
    /// one of its call slots is taken: the attempt stays `queued`, unclaimed, and its message comes back. No try is
    /// charged.
    Waiting,
}

/// What [`Engine::begin`] came to.
#[derive(Debug)]
pub enum Begun {
    /// The step is over without a call: what it did.
    Done(Processed),
    /// The attempt is claimed and its request ready: call its provider, then [`Engine::settle`].
    Claimed(Box<Claimed>),
}

/// A claimed attempt whose provider is to be called: what [`Engine::begin`] hands the worker and
/// [`Engine::settle`] takes back.
#[derive(Debug)]
pub struct Claimed {
    /// The job as the claim left it.
    job: Job,
    /// The message that named the attempt.
    message: Message,
    /// The token of every write of this step.
    token: WriteToken,
    /// No listening, and no writing, past this point (a Lambda's remaining time).
    deadline: Option<Timestamp>,
    provider: ConfiguredProvider,
    /// The request, and the prompt's size as counted before it went out.
    prepared: Prepared,
}

impl Claimed {
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The claimed attempt.
    pub fn attempt(&self) -> &Attempt {
        (self.job.attempt(self.message.attempt.number)).expect("the claimed attempt exists")
    }

    pub fn provider(&self) -> &ConfiguredProvider {
        &self.provider
    }

    pub fn request(&self) -> &ProviderRequest {
        &self.prepared.request
    }

    pub fn deadline(&self) -> Option<Timestamp> {
        self.deadline
    }
}

/// What the worker heard of the provider.
#[derive(Debug)]
pub enum Heard {
    /// The provider's reply, in time or within the late window.
    Reply(Box<Reply>),
    /// Nothing, within the time-out and the late window.
    Silence {
        /// Whether the attempt's time-out was written.
        written: Result<(), StoreError>,
        /// Whether the provider named the call (a background response, a batch): it took the work, which runs
        /// on — no sign of a failing provider.
        named: bool,
    },
}

impl Engine {
    /// The first half of a worker's step on the attempt `sent` names: anything but a claimed attempt whose provider
    /// is to be called is [`Begun::Done`] — waiting on a breaker or a call slot, a message early, late or
    /// duplicated, or an attempt failed before its call (its contract or provider gone, a request that cannot be
    /// made, an open breaker with failover to go to). `deadline` bounds the step's writes and listening.
    pub async fn begin(
        &self,
        sent: &Message,
        deadline: Option<Timestamp>,
    ) -> Result<Begun, StoreError> {
        if self.wait_out_breaker(sent).await? || !self.take_slot(sent).await? {
            return Ok(Begun::Done(Processed::Waiting));
        }
        let message = &sent.attempt;
        let token = WriteToken::new();
        let claim = self.claim(message, &token, self.answer_deadline(deadline));
        let job = match claim.instrument(tracing::info_span!("claim")).await {
            Ok(job) => job,
            Err(StoreError::Refused(Refusal::NotYet { not_before, .. })) => {
                // Here before its time (a queue's longest delay is shorter than the wait): sent again for the
                // rest. Its attempt is queued, so no call of it holds the slot this message took.
                tracing::info!(job_id = %message.job_id, attempt = message.number, %not_before, "message early: sent again for its time");
                self.free_slot(sent).await;
                self.dispatch_at(sent, Some(not_before)).await;
                return Ok(Begun::Done(Processed::Dropped));
            }
            Err(StoreError::Refused(refusal)) => {
                tracing::info!(job_id = %message.job_id, attempt = message.number, %refusal, "message dropped: attempt not queued");
                self.dropped(sent).await?;
                return Ok(Begun::Done(Processed::Dropped));
            }
            Err(StoreError::NotFound) => {
                tracing::warn!(job_id = %message.job_id, attempt = message.number, "message dropped: no such job");
                return Ok(Begun::Done(Processed::Dropped));
            }
            Err(e) => return Err(e),
        };
        if self.too_late_to_call(&job, message.number) {
            // A claim found again long after it first landed (its answer lost, then tried again) keeps that first
            // try's lease: a call made now would be heard past it, while the sweeper and the reconciler take the
            // attempt for one nobody hears — a provider's "no such call" for absence, a policy's time for a retry.
            // No call: the lease runs out on none, and the reconciler finds none and tries the provider again.
            tracing::warn!(job_id = %message.job_id, attempt = message.number, "claim landed too late to call within its lease: not called");
            self.free_slot(sent).await;
            return Ok(Begun::Done(Processed::Unknown));
        }
        let prepared = match self.prepare(&job, message.number).await {
            // Under a budget, the call is reserved before it is made ([`Engine::reserve`]).
            Ok(ready) => match self.reserve(&job, message.number, &token, deadline).await {
                Ok(None) => Ok(ready),
                Ok(Some(limit)) => {
                    // Its worst case does not fit: not called, and no other call is (invariant 18).
                    let what = format!("{limit}: no call is made for this job");
                    Err((ErrorInfo::new(BUDGET_EXCEEDED, what), CallReport::default()))
                }
                Err(e) => {
                    self.free_slot(sent).await;
                    return Err(e);
                }
            },
            Err(failed) => Err(failed),
        };
        match prepared {
            Ok((provider, prepared)) => Ok(Begun::Claimed(Box::new(Claimed {
                job,
                message: sent.clone(),
                token,
                deadline,
                provider,
                prepared,
            }))),
            Err((error, report)) => {
                let step = Step {
                    engine: self,
                    job: &job,
                    message: sent,
                    token: &token,
                    deadline,
                    by_lookup: false,
                };
                let processed = step.fail(error, report).await;
                self.free_slot(sent).await;
                processed.map(Begun::Done)
            }
        }
    }

    /// The claimed attempt's provider and request, or why it fails without a call.
    async fn prepare(
        &self,
        job: &Job,
        number: u32,
    ) -> Result<(ConfiguredProvider, Prepared), (ErrorInfo, CallReport)> {
        let attempt = job.attempt(number).expect("the claimed attempt exists");
        let Some(contract) = self.contracts.get(&job.contract) else {
            return Err(no_longer("unknown_contract", &job.contract));
        };
        let Some(provider) = self.providers.get(&attempt.provider) else {
            return Err(no_longer("unknown_provider", &attempt.provider));
        };
        let key = super::reconcile::attempt_key(job, number);
        let prepared = checks::prepare(contract, provider, &job.input, key)
            .map_err(|e| (e, CallReport::default()))?;

        if let Admission::Skip { until } = self.admit(&attempt.provider).await {
            // No call: the provider's breaker is open. Failover takes the job on, or a retry waits it out.
            let wait = (until - self.clock.now()).num_milliseconds().max(0);
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
            return Err((error, report));
        }
        Ok((provider.clone(), prepared))
    }

    /// The claimed attempt's time-out: `unknown`, with the provider's name of the call if it gave one by now
    /// (`call_id`: a background response's id), written while the worker goes on listening, until `until` (the late
    /// window's end). A time-out the domain refuses (someone resolved the attempt meanwhile) is done.
    pub async fn time_out(
        &self,
        claimed: &Claimed,
        call_id: Option<&str>,
        until: Timestamp,
    ) -> Result<(), StoreError> {
        (self
            .mark_unknown(&claimed.message.attempt, call_id, &claimed.token, until)
            .await)
            .map(|_| ())
    }

    /// The second half of a worker's step: what it heard of the provider, written — the answer first, then what it
    /// told of the provider — and the call slot freed.
    pub async fn settle(&self, claimed: Claimed, heard: Heard) -> Result<Processed, StoreError> {
        let step = claimed.step(self, false);
        let processed = match heard {
            Heard::Reply(reply) => step.answer(&claimed, *reply).await,
            Heard::Silence {
                written: Ok(()),
                named,
            } => {
                // No answer at all: the provider's health, for its breaker (the time-out is written already) —
                // unless it took the work under a name, and runs it still.
                if !named {
                    step.advise(Health::Failing, None, None).await;
                }
                Ok(Processed::Unknown)
            }
            Heard::Silence {
                written: Err(e), ..
            } => Err(e),
        };
        self.free_slot(&claimed.message).await;
        processed
    }
}

impl Claimed {
    /// An `unknown` attempt of `job` whose provider the reconciler asks about its call, as if its worker had
    /// claimed it: what an answer found is written through, under a token of its own. It holds no call slot.
    pub(super) fn asked(
        job: Job,
        message: Message,
        deadline: Option<Timestamp>,
        provider: ConfiguredProvider,
        prepared: Prepared,
    ) -> Self {
        let token = WriteToken::new();
        Self {
            job,
            message,
            token,
            deadline,
            provider,
            prepared,
        }
    }

    fn step<'a>(&'a self, engine: &'a Engine, by_lookup: bool) -> Step<'a> {
        Step {
            engine,
            job: &self.job,
            message: &self.message,
            token: &self.token,
            deadline: self.deadline,
            by_lookup,
        }
    }
}

impl Engine {
    /// An answer the reconciler found by asking the provider about `claimed`'s call ([`Claimed::asked`]): a late
    /// answer, written as one — held to the contract, a result by compare-and-swap (it wins, or is discarded), a
    /// failure with its failover (its cost settled against the budget by the write's follow-up). It tells nothing of the provider's
    /// health now, and frees no call slot (the reconciler took none).
    pub(super) async fn settle_found(
        &self,
        claimed: &Claimed,
        mut reply: Reply,
    ) -> Result<Processed, StoreError> {
        reply.health = Health::Silent;
        claimed.step(self, true).answer(claimed, reply).await
    }
}

/// A failure without a call: what the attempt names is no longer configured.
fn no_longer(code: &str, what: &dyn std::fmt::Display) -> (ErrorInfo, CallReport) {
    let error = ErrorInfo::new(code, format!("{what} is no longer configured"));
    (error, CallReport::default())
}

/// One step's writes, under its token.
struct Step<'a> {
    engine: &'a Engine,
    job: &'a Job,
    message: &'a Message,
    token: &'a WriteToken,
    deadline: Option<Timestamp>,
    /// The answer it writes was found by asking the provider (the reconciler's), not heard by the worker.
    by_lookup: bool,
}

impl Step<'_> {
    fn answerer(&self) -> Answerer<'_> {
        Answerer {
            token: self.token,
            by_lookup: self.by_lookup,
        }
    }

    fn number(&self) -> u32 {
        self.message.attempt.number
    }

    fn attempt(&self) -> &Attempt {
        (self.job.attempt(self.number())).expect("the claimed attempt exists")
    }

    /// Writes what the reply means for the attempt first (invariant 16), then what it tells of the provider.
    async fn answer(&self, claimed: &Claimed, reply: Reply) -> Result<Processed, StoreError> {
        let engine = self.engine;
        let prepared = &claimed.prepared;
        let contract =
            (engine.contracts.get(&self.job.contract)).expect("prepared with its contract");
        let (outcome, mut report, health) =
            (reply.outcome.clone(), reply.report.clone(), reply.health);
        checks::annotate(prepared, &mut report);
        self.price(&mut report);
        let model = report.model.clone();
        let (processed, broke) = match outcome {
            ProviderOutcome::Answered(output) => {
                self.answered(contract, prepared, &reply, output, report)
                    .await
            }
            ProviderOutcome::Failed(error) => {
                let broke = checks::breaks_contract(&error).then(|| error.clone());
                (self.fail(error, report).await, broke)
            }
            ProviderOutcome::Lost(error) => {
                tracing::warn!(code = %error.code, error = %error.message, "the provider may have done the work: attempt unknown");
                let until = engine.answer_deadline(self.deadline);
                let marked = (engine
                    .mark_unknown(&self.message.attempt, None, self.token, until)
                    .await)
                    .map(|_| Processed::Unknown);
                (marked, None)
            }
        };
        (self.advise(health, model.as_deref(), broke.as_ref())).await;
        processed
    }

    /// An answer held to the contract (and to the model qualified): a result, or a failure that may break the
    /// contract.
    async fn answered(
        &self,
        contract: &Contract,
        prepared: &Prepared,
        reply: &Reply,
        output: serde_json::Value,
        report: CallReport,
    ) -> (Result<Processed, StoreError>, Option<ErrorInfo>) {
        let unqualified = (self.engine)
            .unqualified_answer(self.job, self.number(), report.model.as_deref())
            .await;
        let checked = match unqualified {
            Some(problem) => Err(problem),
            None => checks::check_answer(contract, prepared, &output, &report),
        };
        match checked {
            Ok(()) => (self.complete(output, report).await, None),
            Err(problem) => {
                let problem = reply.redacted(problem);
                let broke = checks::breaks_contract(&problem).then(|| problem.clone());
                (self.fail(problem, report).await, broke)
            }
        }
    }

    /// The call's cost by the price table, kept with its usage: what it cost when it was made.
    fn price(&self, report: &mut CallReport) {
        report.cost_nanos = self.engine.priced(&self.attempt().provider, report);
    }

    /// What the call told of its provider, once its answer is written: its health (the breaker) and what model
    /// answered and whether the answer broke the contract (its standing). Advisory state: it never decides the
    /// attempt, and it stops at the deadline. (What the call cost is settled against the owner's budget from the
    /// attempt's record, by the write's follow-up.)
    async fn advise(&self, health: Health, model: Option<&str>, broke: Option<&ErrorInfo>) {
        let engine = self.engine;
        let provider = &self.attempt().provider;
        let name = format!("{}#{}", self.job.id, self.number());
        let advice = async {
            engine.breaker_saw(provider, &name, health).await;
            engine.observe(self.job, self.number(), model, broke).await;
        };
        match self.deadline {
            None => advice.await,
            Some(deadline) => {
                let left = (deadline - engine.clock.now()).max(chrono::Duration::zero());
                tokio::select! {
                    () = advice => {}
                    () = engine.clock.sleep(left) => {
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
        let written = (self.engine)
            .complete(
                &self.job.id,
                self.number(),
                output,
                report,
                self.answerer(),
                until,
            )
            .await;
        match written {
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
        let written = (self.engine)
            .fail(
                self.job,
                self.number(),
                error,
                report,
                self.answerer(),
                until,
            )
            .await;
        match written {
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
