//! Jobs, attempts and every transition of SPEC §4, as pure functions on a [`Job`].
//!
//! Each transition either changes the job and returns what happened, or returns a typed [`Refusal`] and leaves the
//! job exactly as it was. The store adapters apply these same rules inside one atomic write; the tests use them as
//! the reference model.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fingerprint::Fingerprint;
use super::ids::{ContractRef, IdempotencyKey, JobId, Owner, ProviderName};

/// A point in time, UTC, with millisecond precision (what every store keeps).
pub type Timestamp = DateTime<Utc>;

/// Where one try at a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptState {
    Queued,
    Started,
    Succeeded,
    Failed,
    /// Timed out, lost its connection after sending, or its worker's lease expired: the provider may still have
    /// done the work. Blocks new attempts until resolved.
    Unknown,
    /// Completed after another attempt had already won (or after the job was cancelled): its payload was dropped.
    Discarded,
    /// Resolved out of band: stop waiting, allow the next attempt.
    Cancelled,
}

impl AttemptState {
    pub const ALL: [Self; 7] = [
        Self::Queued,
        Self::Started,
        Self::Succeeded,
        Self::Failed,
        Self::Unknown,
        Self::Discarded,
        Self::Cancelled,
    ];

    /// A live attempt blocks any other: at most one is live per job (invariant 4).
    pub fn is_live(self) -> bool {
        matches!(self, Self::Queued | Self::Started | Self::Unknown)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Started => "started",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::Discarded => "discarded",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// A job's status, derived from its fields and its attempts (SPEC §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Unknown,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [Self; 6] = [
        Self::Queued,
        Self::Running,
        Self::Unknown,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Unknown => "unknown",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }

    /// No further change will happen without someone asking for it.
    pub fn is_settled(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// A machine-readable reason with a human one, kept on a failed attempt or a failed job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorInfo {
    /// Stable, snake_case: clients branch on it.
    pub code: String,
    pub message: String,
}

impl ErrorInfo {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
    }
}

/// What a provider said about one call besides its answer, recorded on the attempt for billing and operators.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CallReport {
    /// The model id the provider reports having used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Prompt tokens, as the provider counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Answer tokens, as the provider counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// The provider's `Retry-After`, in seconds: information for the operator. onejob never retries by itself; a
    /// retry is a new attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
}

impl CallReport {
    /// `None` when the provider said nothing worth keeping.
    pub fn into_option(self) -> Option<Self> {
        (self != Self::default()).then_some(self)
    }
}

/// One concrete try at a job on one provider.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    /// 1, 2, … in creation order; never reused.
    pub number: u32,
    pub provider: ProviderName,
    pub state: AttemptState,
    /// The job's `version` when this attempt was claimed: its result may win only if the job is still there.
    pub seen_version: Option<u64>,
    /// Until when the worker that claimed this attempt owns it; past it the sweeper makes the attempt `unknown`.
    pub lease_expires_at: Option<Timestamp>,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub error: Option<ErrorInfo>,
    /// What the provider reported about the call (model, token usage, `Retry-After`), once it answered.
    pub report: Option<CallReport>,
}

/// The durable record of one intent.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: JobId,
    pub owner: Owner,
    pub idempotency_key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub contract: ContractRef,
    pub input: Value,
    /// The provider chain: the client's, or the contract's default when the client sent none.
    pub providers: Vec<ProviderName>,
    /// Bumped by job-level transitions only: a result claimed, the job cancelled.
    pub version: u64,
    /// The attempt whose result won the result slot.
    pub completed_by: Option<u32>,
    pub result: Option<Value>,
    /// Why the job failed, once no attempt is live and none will follow.
    pub error: Option<ErrorInfo>,
    /// Set when the owner cancelled the job; any later result is discarded.
    pub cancelled_at: Option<Timestamp>,
    pub attempts: Vec<Attempt>,
    pub created_at: Timestamp,
    /// The last time the job's status, version or result changed.
    pub updated_at: Timestamp,
}

/// Everything a create carries; the job's id is derived from `owner` and `idempotency_key`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub owner: Owner,
    pub idempotency_key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub contract: ContractRef,
    pub input: Value,
    pub providers: Vec<ProviderName>,
}

/// Why a transition was refused. The job is unchanged whenever one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("attempt {number} is still {state:?}; resolve or cancel it first")]
    AttemptInProgress { number: u32, state: AttemptState },
    #[error("the job is already {status:?}")]
    JobFinished { status: JobStatus },
    #[error("the job has no attempt {number}")]
    NoSuchAttempt { number: u32 },
    #[error("attempt {number} is {from:?} and cannot become {to:?}")]
    InvalidTransition {
        number: u32,
        from: AttemptState,
        to: AttemptState,
    },
}

/// What a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// The result slot was free and the version unchanged: this attempt's result is the job's.
    Won,
    /// The slot was taken or the job moved on: the payload was discarded. `winner` is the attempt that holds the
    /// slot, if any (none when the job was cancelled).
    Lost { winner: Option<u32> },
}

/// What cancelling a job did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobCancel {
    Cancelled,
    /// It was cancelled before; nothing changed.
    AlreadyCancelled,
}

/// Names one attempt: what a queue message carries, and what the sweeper finds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttemptRef {
    pub job_id: JobId,
    #[serde(rename = "attempt")]
    pub number: u32,
}

/// What follows when an attempt ends `failed` or `cancelled` without a result (SPEC §4, failover).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// Queue the next attempt on this provider.
    Queue(ProviderName),
    /// No next attempt: the job is `failed` with this error (a manual retry may still add one).
    Stop(ErrorInfo),
}

impl Job {
    /// A fresh job with attempt 1 queued on the chain's first provider.
    pub fn new(new: NewJob, now: Timestamp) -> Self {
        let first = new
            .providers
            .first()
            .cloned()
            .expect("a provider chain is never empty");
        Self {
            id: JobId::derive(&new.owner, &new.idempotency_key),
            owner: new.owner,
            idempotency_key: new.idempotency_key,
            fingerprint: new.fingerprint,
            contract: new.contract,
            input: new.input,
            providers: new.providers,
            version: 0,
            completed_by: None,
            result: None,
            error: None,
            cancelled_at: None,
            attempts: vec![Attempt::queued(1, first, now)],
            created_at: now,
            updated_at: now,
        }
    }

    pub fn status(&self) -> JobStatus {
        if self.completed_by.is_some() {
            return JobStatus::Succeeded;
        }
        if self.cancelled_at.is_some() {
            return JobStatus::Cancelled;
        }
        match self.live_attempt().map(|a| a.state) {
            Some(AttemptState::Queued) => JobStatus::Queued,
            Some(AttemptState::Started) => JobStatus::Running,
            Some(_) => JobStatus::Unknown,
            None => JobStatus::Failed,
        }
    }

    pub fn live_attempt(&self) -> Option<&Attempt> {
        self.attempts.iter().find(|a| a.state.is_live())
    }

    /// The first provider of the chain that no attempt has tried yet.
    pub fn next_untried_provider(&self) -> Option<&ProviderName> {
        self.providers
            .iter()
            .find(|p| self.attempts.iter().all(|a| &a.provider != *p))
    }

    /// Where automatic failover goes once the live attempt ends without a result: the next untried provider of
    /// the chain, if `is_qualified` says it kept the contract; else the job stops with `providers_exhausted` or
    /// `fallback_not_qualified`.
    pub fn failover(&self, is_qualified: impl Fn(&ProviderName) -> bool) -> NextStep {
        match self.next_untried_provider() {
            None => NextStep::Stop(ErrorInfo::new(
                "providers_exhausted",
                "every provider of the chain was tried without a result",
            )),
            Some(next) if !is_qualified(next) => NextStep::Stop(ErrorInfo::new(
                "fallback_not_qualified",
                format!(
                    "the next provider, {next}, is not qualified for {}",
                    self.contract
                ),
            )),
            Some(next) => NextStep::Queue(next.clone()),
        }
    }

    /// Applies a failover decision after the live attempt ended without a result.
    fn then(&mut self, next: NextStep, now: Timestamp) {
        if self.status() == JobStatus::Failed {
            match next {
                NextStep::Queue(provider) => {
                    let number = self.attempts.iter().map(|a| a.number).max().unwrap_or(0) + 1;
                    self.attempts.push(Attempt::queued(number, provider, now));
                    self.error = None;
                }
                NextStep::Stop(error) => self.error = Some(error),
            }
        }
    }

    pub fn attempt(&self, number: u32) -> Option<&Attempt> {
        self.attempts.iter().find(|a| a.number == number)
    }

    fn attempt_mut(&mut self, number: u32) -> Result<&mut Attempt, Refusal> {
        self.attempts
            .iter_mut()
            .find(|a| a.number == number)
            .ok_or(Refusal::NoSuchAttempt { number })
    }

    /// Refuses when the job already has its outcome: succeeded or cancelled.
    fn ensure_open(&self) -> Result<(), Refusal> {
        match self.status() {
            status @ (JobStatus::Succeeded | JobStatus::Cancelled) => {
                Err(Refusal::JobFinished { status })
            }
            _ => Ok(()),
        }
    }

    /// Queues a new attempt on `provider`. Refused while another attempt is live or once the job has its outcome.
    pub fn add_attempt(&mut self, provider: ProviderName, now: Timestamp) -> Result<u32, Refusal> {
        self.ensure_open()?;
        if let Some(live) = self.live_attempt() {
            return Err(Refusal::AttemptInProgress {
                number: live.number,
                state: live.state,
            });
        }
        let number = self.attempts.iter().map(|a| a.number).max().unwrap_or(0) + 1;
        self.attempts.push(Attempt::queued(number, provider, now));
        self.error = None;
        self.updated_at = now;
        Ok(number)
    }

    /// A worker takes a queued attempt: `queued` → `started`, remembering the job's version. Refused once the job
    /// has its outcome: no provider is called for a job that is done.
    pub fn claim(
        &mut self,
        number: u32,
        lease_expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        self.ensure_open()?;
        let version = self.version;
        let attempt = self.attempt_mut(number)?;
        attempt.expect(AttemptState::Queued, AttemptState::Started)?;
        attempt.state = AttemptState::Started;
        attempt.seen_version = Some(version);
        attempt.started_at = Some(now);
        attempt.lease_expires_at = Some(lease_expires_at);
        self.updated_at = now;
        Ok(())
    }

    /// No answer in time, a connection lost after sending, or an expired lease: `started` → `unknown`.
    pub fn mark_unknown(&mut self, number: u32, now: Timestamp) -> Result<(), Refusal> {
        self.ensure_open()?;
        let attempt = self.attempt_mut(number)?;
        attempt.expect(AttemptState::Started, AttemptState::Unknown)?;
        attempt.state = AttemptState::Unknown;
        attempt.lease_expires_at = None;
        self.updated_at = now;
        Ok(())
    }

    /// A definite answer that is not a result: `started` | `unknown` → `failed`, then `next`.
    pub fn fail(
        &mut self,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        next: NextStep,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let attempt = self.attempt_mut(number)?;
        if !matches!(attempt.state, AttemptState::Started | AttemptState::Unknown) {
            return Err(attempt.refuse(AttemptState::Failed));
        }
        attempt.state = AttemptState::Failed;
        attempt.error = Some(error);
        attempt.report = report.into_option();
        attempt.finished_at = Some(now);
        attempt.lease_expires_at = None;
        self.then(next, now);
        self.updated_at = now;
        Ok(())
    }

    /// A valid result arrived for attempt `number`: compare-and-swap on the result slot (invariant 6).
    ///
    /// It wins when the job's version is the one the attempt saw at its start and no attempt holds the slot;
    /// otherwise the attempt becomes `discarded` and the job is left exactly as it was (invariant 7).
    pub fn complete(
        &mut self,
        number: u32,
        result: Value,
        report: CallReport,
        now: Timestamp,
    ) -> Result<Completion, Refusal> {
        let (version, completed_by) = (self.version, self.completed_by);
        let attempt = self.attempt_mut(number)?;
        if !matches!(
            attempt.state,
            AttemptState::Started | AttemptState::Unknown | AttemptState::Cancelled
        ) {
            return Err(attempt.refuse(AttemptState::Succeeded));
        }
        // The loser's usage is kept too: its call was paid for.
        attempt.report = report.into_option();
        attempt.finished_at = Some(now);
        attempt.lease_expires_at = None;
        if attempt.seen_version == Some(version) && completed_by.is_none() {
            attempt.state = AttemptState::Succeeded;
            self.completed_by = Some(number);
            self.result = Some(result);
            self.version += 1;
            self.error = None;
            self.updated_at = now;
            Ok(Completion::Won)
        } else {
            attempt.state = AttemptState::Discarded;
            Ok(Completion::Lost {
                winner: completed_by,
            })
        }
    }

    /// Resolves a live attempt out of band: `queued` | `started` | `unknown` → `cancelled`, then `next`.
    pub fn cancel_attempt(
        &mut self,
        number: u32,
        next: NextStep,
        now: Timestamp,
    ) -> Result<(), Refusal> {
        let attempt = self.attempt_mut(number)?;
        if !attempt.state.is_live() {
            return Err(attempt.refuse(AttemptState::Cancelled));
        }
        attempt.state = AttemptState::Cancelled;
        attempt.finished_at = Some(now);
        attempt.lease_expires_at = None;
        self.then(next, now);
        self.updated_at = now;
        Ok(())
    }

    /// The owner gives up on the job: version bumped, every live attempt cancelled, later results discarded.
    pub fn cancel(&mut self, now: Timestamp) -> Result<JobCancel, Refusal> {
        match self.status() {
            JobStatus::Cancelled => return Ok(JobCancel::AlreadyCancelled),
            JobStatus::Succeeded => {
                return Err(Refusal::JobFinished {
                    status: JobStatus::Succeeded,
                });
            }
            _ => {}
        }
        for attempt in self.attempts.iter_mut().filter(|a| a.state.is_live()) {
            attempt.state = AttemptState::Cancelled;
            attempt.finished_at = Some(now);
            attempt.lease_expires_at = None;
        }
        self.cancelled_at = Some(now);
        self.version += 1;
        self.updated_at = now;
        Ok(JobCancel::Cancelled)
    }
}

impl Attempt {
    fn queued(number: u32, provider: ProviderName, now: Timestamp) -> Self {
        Self {
            number,
            provider,
            state: AttemptState::Queued,
            seen_version: None,
            lease_expires_at: None,
            created_at: now,
            started_at: None,
            finished_at: None,
            error: None,
            report: None,
        }
    }

    fn refuse(&self, to: AttemptState) -> Refusal {
        Refusal::InvalidTransition {
            number: self.number,
            from: self.state,
            to,
        }
    }

    fn expect(&self, from: AttemptState, to: AttemptState) -> Result<(), Refusal> {
        if self.state == from {
            Ok(())
        } else {
            Err(self.refuse(to))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use serde_json::json;

    fn at(ms: i64) -> Timestamp {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    fn provider(name: &str) -> ProviderName {
        ProviderName::parse(name).unwrap()
    }

    fn stop() -> NextStep {
        NextStep::Stop(ErrorInfo::new("providers_exhausted", "test"))
    }

    fn job() -> Job {
        let input = json!({"text": "hello"});
        Job::new(
            NewJob {
                owner: Owner::parse("alice").unwrap(),
                idempotency_key: IdempotencyKey::parse("k").unwrap(),
                fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
                contract: ContractRef::parse("summarize@1").unwrap(),
                input,
                providers: vec![provider("a"), provider("b"), provider("c")],
            },
            at(0),
        )
    }

    #[test]
    fn failover_goes_to_the_next_untried_provider_if_it_is_qualified() {
        let mut job = job();
        assert_eq!(job.failover(|_| true), NextStep::Queue(provider("b")));
        job.claim(1, at(30_000), at(1)).unwrap();
        job.fail(
            1,
            ErrorInfo::new("provider_error", "500"),
            CallReport::default(),
            NextStep::Queue(provider("b")),
            at(2),
        )
        .unwrap();
        assert_eq!(job.status(), JobStatus::Queued);
        assert_eq!(job.attempt(2).unwrap().provider, provider("b"));
        job.claim(2, at(30_000), at(3)).unwrap();
        let next = job.failover(|p| p.as_str() != "c");
        assert!(
            matches!(&next, NextStep::Stop(e) if e.code == "fallback_not_qualified"),
            "{next:?}"
        );
        job.cancel_attempt(2, next, at(4)).unwrap();
        assert_eq!(job.status(), JobStatus::Failed);
        assert_eq!(job.error.as_ref().unwrap().code, "fallback_not_qualified");
        assert_eq!(job.attempts.len(), 2);
        // A manual retry clears the error; once every provider was tried, the chain is exhausted.
        job.add_attempt(provider("c"), at(5)).unwrap();
        assert_eq!(job.error, None);
        assert!(
            matches!(job.failover(|_| true), NextStep::Stop(e) if e.code == "providers_exhausted")
        );
    }

    #[test]
    fn a_failover_decision_does_nothing_once_the_job_is_cancelled() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        job.mark_unknown(1, at(2)).unwrap();
        job.cancel(at(3)).unwrap();
        assert_eq!(
            job.cancel_attempt(1, NextStep::Queue(provider("b")), at(4)),
            Err(Refusal::InvalidTransition {
                number: 1,
                from: AttemptState::Cancelled,
                to: AttemptState::Cancelled
            })
        );
        assert_eq!(job.attempts.len(), 1);
    }

    #[test]
    fn a_new_job_is_queued_on_its_first_provider() {
        let job = job();
        assert_eq!(job.status(), JobStatus::Queued);
        assert_eq!(job.attempts.len(), 1);
        assert_eq!(job.attempts[0].provider, provider("a"));
        assert_eq!(job.version, 0);
    }

    #[test]
    fn a_timeout_is_unknown_and_blocks_the_next_attempt() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        assert_eq!(job.status(), JobStatus::Running);
        job.mark_unknown(1, at(2)).unwrap();
        assert_eq!(job.status(), JobStatus::Unknown);
        let before = job.clone();
        assert_eq!(
            job.add_attempt(provider("b"), at(3)),
            Err(Refusal::AttemptInProgress {
                number: 1,
                state: AttemptState::Unknown
            })
        );
        assert_eq!(job, before);
        job.cancel_attempt(1, stop(), at(4)).unwrap();
        assert_eq!(job.add_attempt(provider("b"), at(5)), Ok(2));
    }

    #[test]
    fn the_attempt_that_answers_first_wins_even_if_it_left_last() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        job.mark_unknown(1, at(2)).unwrap();
        job.cancel_attempt(1, stop(), at(3)).unwrap();
        job.add_attempt(provider("b"), at(4)).unwrap();
        job.claim(2, at(30_000), at(5)).unwrap();
        assert_eq!(
            job.complete(2, json!({"summary": "B"}), CallReport::default(), at(6)),
            Ok(Completion::Won)
        );
        let after_win = job.clone();
        assert_eq!(
            job.complete(1, json!({"summary": "A"}), CallReport::default(), at(7)),
            Ok(Completion::Lost { winner: Some(2) })
        );
        assert_eq!(job.result, Some(json!({"summary": "B"})));
        assert_eq!((job.version, job.completed_by), (1, Some(2)));
        assert_eq!(job.attempt(1).unwrap().state, AttemptState::Discarded);
        assert_eq!(job.updated_at, after_win.updated_at);
    }

    #[test]
    fn a_cancelled_attempt_that_answers_while_the_slot_is_free_wins() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        job.cancel_attempt(1, stop(), at(2)).unwrap();
        assert_eq!(
            job.complete(1, json!({"summary": "late"}), CallReport::default(), at(3)),
            Ok(Completion::Won)
        );
        assert_eq!(job.attempt(1).unwrap().state, AttemptState::Succeeded);
        assert_eq!(job.status(), JobStatus::Succeeded);
    }

    #[test]
    fn a_result_after_the_job_was_cancelled_is_discarded() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        assert_eq!(job.cancel(at(2)), Ok(JobCancel::Cancelled));
        assert_eq!(job.attempt(1).unwrap().state, AttemptState::Cancelled);
        assert_eq!(
            job.complete(1, json!({"summary": "late"}), CallReport::default(), at(3)),
            Ok(Completion::Lost { winner: None })
        );
        assert_eq!(job.status(), JobStatus::Cancelled);
        assert_eq!(job.result, None);
        assert_eq!(job.cancel(at(4)), Ok(JobCancel::AlreadyCancelled));
    }

    #[test]
    fn a_succeeded_job_cannot_be_cancelled_or_retried() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        job.complete(1, json!({"summary": "x"}), CallReport::default(), at(2))
            .unwrap();
        let finished = Err(Refusal::JobFinished {
            status: JobStatus::Succeeded,
        });
        assert_eq!(job.cancel(at(3)).map(|_| ()), finished.clone());
        assert_eq!(job.add_attempt(provider("b"), at(3)).map(|_| ()), finished);
    }

    #[test]
    fn a_claim_of_a_claimed_attempt_is_refused() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        assert_eq!(
            job.claim(1, at(30_000), at(2)),
            Err(Refusal::InvalidTransition {
                number: 1,
                from: AttemptState::Started,
                to: AttemptState::Started
            })
        );
        assert_eq!(
            job.claim(7, at(30_000), at(2)),
            Err(Refusal::NoSuchAttempt { number: 7 })
        );
    }

    #[test]
    fn a_failed_job_may_be_retried_by_hand() {
        let mut job = job();
        job.claim(1, at(30_000), at(1)).unwrap();
        job.fail(
            1,
            ErrorInfo::new("provider_error", "500"),
            CallReport::default(),
            stop(),
            at(2),
        )
        .unwrap();
        assert_eq!(job.status(), JobStatus::Failed);
        assert_eq!(job.add_attempt(provider("b"), at(3)), Ok(2));
        assert_eq!(job.status(), JobStatus::Queued);
    }

    /// One step of the attempt life cycle, chosen at random.
    #[derive(Debug, Clone)]
    enum Step {
        Add,
        Claim(u32),
        Unknown(u32),
        Complete(u32),
        Fail(u32),
        CancelAttempt(u32),
        CancelJob,
    }

    fn arb_step() -> impl Strategy<Value = Step> {
        let n = 1u32..5;
        prop_oneof![
            Just(Step::Add),
            n.clone().prop_map(Step::Claim),
            n.clone().prop_map(Step::Unknown),
            n.clone().prop_map(Step::Complete),
            n.clone().prop_map(Step::Fail),
            n.prop_map(Step::CancelAttempt),
            Just(Step::CancelJob),
        ]
    }

    proptest! {
        #[test]
        fn no_sequence_of_transitions_breaks_the_invariants(steps in prop::collection::vec(arb_step(), 0..40)) {
            let mut job = job();
            let mut winners = 0;
            for (i, step) in steps.into_iter().enumerate() {
                let now = at(i as i64 + 1);
                let before = job.clone();
                let outcome = match step {
                    Step::Add => job.add_attempt(provider("b"), now).map(|_| ()),
                    Step::Claim(n) => job.claim(n, at(1_000), now),
                    Step::Unknown(n) => job.mark_unknown(n, now),
                    Step::Complete(n) => job.complete(n, json!({"n": n}), CallReport::default(), now).map(|c| {
                        if c == Completion::Won { winners += 1 }
                    }),
                    Step::Fail(n) => {
                        let next = job.failover(|p| p.as_str() != "c");
                        job.fail(n, ErrorInfo::new("x", "y"), CallReport::default(), next, now)
                    }
                    Step::CancelAttempt(n) => {
                        let next = job.failover(|_| true);
                        job.cancel_attempt(n, next, now)
                    }
                    Step::CancelJob => job.cancel(now).map(|_| ()),
                };
                if outcome.is_err() {
                    prop_assert_eq!(&job, &before, "a refusal changed the job");
                }
                let live = job.attempts.iter().filter(|a| a.state.is_live()).count();
                prop_assert!(live <= 1, "{} live attempts", live);
                let succeeded = job.attempts.iter().filter(|a| a.state == AttemptState::Succeeded).count();
                prop_assert!(succeeded <= 1 && winners <= 1);
                prop_assert_eq!(job.completed_by.is_some(), succeeded == 1);
                prop_assert_eq!(job.result.is_some(), job.completed_by.is_some());
                prop_assert!(job.version >= before.version);
                if before.completed_by.is_some() {
                    prop_assert_eq!(&job.result, &before.result, "a result was replaced");
                }
            }
        }
    }
}
