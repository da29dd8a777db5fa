//! Jobs, attempts and every transition of SPEC §4, as pure functions on a [`Job`].
//!
//! Each transition either changes the job and returns what happened, or returns a typed [`Refusal`] and leaves the
//! job exactly as it was. The store adapters apply these same rules inside one atomic write; the tests use them as
//! the reference model.
//!
//! Every transition carries a [`Stamp`]: the writer's token and the time. A transition that finds its own token
//! already applied answers as it did the first time and changes nothing (invariant 11), so a store write retried
//! by the SDK, by the engine or after a lost answer is a success, never another writer's.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, DurationRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fingerprint::Fingerprint;
use super::ids::{ContractRef, IdempotencyKey, JobId, Owner, ProviderName, WriteToken};

/// A point in time, UTC, with millisecond precision (what every store keeps).
pub type Timestamp = DateTime<Utc>;

/// The longest input kept, as JSON text, in bytes: with the largest result, the attempt limit and error messages
/// cut to size, a job stays well within a DynamoDB item (400 KB; `docs/dynamodb.md` gives the worst case).
pub const MAX_INPUT_BYTES: usize = 256 * 1024;

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
}

/// A machine-readable reason with a human one, kept on a failed attempt or a failed job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorInfo {
    /// Stable, snake_case: clients branch on it.
    pub code: String,
    pub message: String,
}

impl ErrorInfo {
    /// The longest message kept, in bytes: an error may quote a provider's answer, and a job must stay within
    /// what every store accepts (invariant 11).
    pub const MAX_MESSAGE_BYTES: usize = 1024;

    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
        .bounded()
    }

    /// The same error with its message cut to [`ErrorInfo::MAX_MESSAGE_BYTES`] (marked with `…`).
    pub fn bounded(mut self) -> Self {
        truncate(&mut self.message, Self::MAX_MESSAGE_BYTES);
        self
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, ending with `…` when something was cut.
fn truncate(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
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
    /// The longest model id kept, in bytes (the provider chooses it).
    pub const MAX_MODEL_BYTES: usize = 200;

    /// `None` when the provider said nothing worth keeping; the model id cut to [`CallReport::MAX_MODEL_BYTES`].
    pub fn into_option(mut self) -> Option<Self> {
        if let Some(model) = &mut self.model {
            truncate(model, Self::MAX_MODEL_BYTES);
        }
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
    /// The end of the lease its claim took: until then the claiming worker owns it (past it, while still
    /// `started`, the sweeper makes it `unknown`). Kept after the attempt moves on: once it is `cancelled`, a late
    /// answer wins only before this moment, so a failed job is settled from then on (invariant 12).
    pub lease_expires_at: Option<Timestamp>,
    pub created_at: Timestamp,
    /// When it was last handed to the queue: at creation, then by each re-dispatch of the sweeper.
    pub dispatched_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub error: Option<ErrorInfo>,
    /// What the provider reported about the call (model, token usage, `Retry-After`), once it answered.
    pub report: Option<CallReport>,
    /// The token of the write that queued it (a create, a manual retry, a failover): a repeat of that write finds
    /// it here. `None` only on attempts stored before tokens existed.
    pub origin: Option<WriteToken>,
    /// The token of the last write that moved its state (claim, time-out, completion, failure, cancel).
    pub writer: Option<WriteToken>,
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
    /// The token of the write that cancelled it.
    pub cancelled_by: Option<WriteToken>,
    pub attempts: Vec<Attempt>,
    pub created_at: Timestamp,
    /// The last time the job's status, version or result changed.
    pub updated_at: Timestamp,
    /// When the job is gone, on every store and for every read, and its key is free again (invariant 13). Whole
    /// seconds (DynamoDB's TTL keeps seconds).
    pub expires_at: Timestamp,
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
    #[error("the job already has {limit} attempts, the most one job may have")]
    AttemptLimitReached { limit: u32 },
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

/// What cancelling an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptCancel {
    /// This write cancelled it (failover followed in the same write).
    Cancelled,
    /// Another write had cancelled it (by hand, or with its job); nothing changed.
    AlreadyCancelled,
}

/// Who writes, and when: the writer's token and the time of this try of the write. Retries of one write keep the
/// token and take a new time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub token: WriteToken,
    pub now: Timestamp,
}

impl Stamp {
    pub fn new(token: WriteToken, now: Timestamp) -> Self {
        Self { token, now }
    }

    /// A stamp with a fresh token: a write that nobody will repeat under the same token.
    pub fn fresh(now: Timestamp) -> Self {
        Self::new(WriteToken::new(), now)
    }

    fn is(&self, token: Option<&WriteToken>) -> bool {
        token == Some(&self.token)
    }
}

/// What automatic failover (and a manual retry that names no provider) may do. The decision is taken inside the
/// write, on the state being written, so a decision can never go stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// Providers qualified for the job's contract at its current fingerprint (invariant 9). It only needs to
    /// cover the providers of the chain not tried yet.
    pub qualified: BTreeSet<ProviderName>,
    /// The most attempts one job may have, so that no job grows past what a store accepts.
    pub max_attempts: u32,
}

impl Failover {
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
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

/// The retention's end for a job created at `now`: rounded up to a whole second.
pub fn expiry(now: Timestamp, retention: Duration) -> Timestamp {
    let end = now + retention;
    let floor = end
        .duration_trunc(Duration::seconds(1))
        .expect("a time truncates to seconds");
    if floor == end {
        end
    } else {
        floor + Duration::seconds(1)
    }
}

impl Job {
    /// A fresh job with attempt 1 queued on the chain's first provider, kept for `retention`.
    pub fn new(new: NewJob, retention: Duration, stamp: &Stamp) -> Self {
        let now = stamp.now;
        let first = new
            .providers
            .first()
            .cloned()
            .expect("a provider chain is never empty");
        Self {
            id: JobId::derive(&new.owner, &new.idempotency_key, now),
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
            cancelled_by: None,
            attempts: vec![Attempt::queued(1, first, stamp)],
            created_at: now,
            updated_at: now,
            expires_at: expiry(now, retention),
        }
    }

    /// Whether the write stamped `token` created this job (a create whose answer was lost finds its job so).
    pub fn created_by(&self, token: &WriteToken) -> bool {
        self.attempts.first().and_then(|a| a.origin.as_ref()) == Some(token)
    }

    /// Past its retention the job is gone: reads do not find it and its key makes a new job.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
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

    /// From when nothing can change the job's outcome any more without someone asking (invariant 12); `None`
    /// while an attempt is live. A failed job whose cancelled attempt may still answer, and win, settles when that
    /// attempt's lease ends: after it, its answer is discarded.
    pub fn settles_at(&self) -> Option<Timestamp> {
        match self.status() {
            JobStatus::Queued | JobStatus::Running | JobStatus::Unknown => None,
            JobStatus::Succeeded | JobStatus::Cancelled => Some(self.updated_at),
            JobStatus::Failed => Some(
                self.attempts
                    .iter()
                    .filter(|a| self.may_still_win(a))
                    .filter_map(|a| a.lease_expires_at)
                    .fold(self.updated_at, Timestamp::max),
            ),
        }
    }

    pub fn is_settled(&self, now: Timestamp) -> bool {
        self.settles_at().is_some_and(|at| at <= now)
    }

    /// A cancelled attempt that was claimed while the job stood as it stands: its answer would still win until
    /// its lease ends.
    fn may_still_win(&self, attempt: &Attempt) -> bool {
        attempt.state == AttemptState::Cancelled
            && attempt.seen_version == Some(self.version)
            && self.completed_by.is_none()
    }

    pub fn live_attempt(&self) -> Option<&Attempt> {
        self.attempts.iter().find(|a| a.state.is_live())
    }

    /// The first provider of the chain that no attempt has tried yet.
    pub fn next_untried_provider(&self) -> Option<&ProviderName> {
        self.untried_providers().next()
    }

    /// The providers of the chain that no attempt has tried yet, in chain order.
    pub fn untried_providers(&self) -> impl Iterator<Item = &ProviderName> {
        self.providers
            .iter()
            .filter(|p| self.attempts.iter().all(|a| &a.provider != *p))
    }

    /// Where automatic failover goes once the live attempt ends without a result: the next untried provider of
    /// the chain, if `failover` says it is qualified; else the job stops with `providers_exhausted`,
    /// `fallback_not_qualified` or, at the attempt limit, `attempt_limit_reached`.
    pub fn next_step(&self, failover: &Failover) -> NextStep {
        if self.attempts.len() >= failover.max_attempts as usize {
            return NextStep::Stop(ErrorInfo::new(
                "attempt_limit_reached",
                format!(
                    "the job has {} attempts, the most one job may have",
                    self.attempts.len()
                ),
            ));
        }
        match self.next_untried_provider() {
            None => NextStep::Stop(ErrorInfo::new(
                "providers_exhausted",
                "every provider of the chain was tried without a result",
            )),
            Some(next) if !failover.qualified.contains(next) => NextStep::Stop(ErrorInfo::new(
                "fallback_not_qualified",
                format!(
                    "the next provider, {next}, is not qualified for {}",
                    self.contract
                ),
            )),
            Some(next) => NextStep::Queue(next.clone()),
        }
    }

    /// Applies failover after the live attempt ended without a result, decided on the job as it now is.
    fn fail_over(&mut self, failover: &Failover, stamp: &Stamp) {
        if self.status() == JobStatus::Failed {
            match self.next_step(failover) {
                NextStep::Queue(provider) => {
                    self.queue(provider, stamp);
                }
                NextStep::Stop(error) => self.error = Some(error),
            }
        }
    }

    fn queue(&mut self, provider: ProviderName, stamp: &Stamp) -> u32 {
        let number = self.attempts.iter().map(|a| a.number).max().unwrap_or(0) + 1;
        self.attempts.push(Attempt::queued(number, provider, stamp));
        self.error = None;
        number
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

    /// Whether attempt `number` is in `state`, moved there by the write stamped `stamp`: that write landed before.
    fn already(&self, number: u32, state: AttemptState, stamp: &Stamp) -> bool {
        self.attempt(number)
            .is_some_and(|a| a.state == state && stamp.is(a.writer.as_ref()))
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

    /// Queues a new attempt by hand: on `provider`, else on the next untried provider of the chain that is
    /// qualified, else on the primary. Refused while another attempt is live, once the job has its outcome, and at
    /// the attempt limit. Returns its number.
    pub fn add_attempt(
        &mut self,
        provider: Option<ProviderName>,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<u32, Refusal> {
        if let Some(mine) = self.attempts.iter().find(|a| stamp.is(a.origin.as_ref())) {
            return Ok(mine.number);
        }
        self.ensure_open()?;
        if let Some(live) = self.live_attempt() {
            return Err(Refusal::AttemptInProgress {
                number: live.number,
                state: live.state,
            });
        }
        if self.attempts.len() >= failover.max_attempts as usize {
            return Err(Refusal::AttemptLimitReached {
                limit: failover.max_attempts,
            });
        }
        let provider = provider.unwrap_or_else(|| {
            self.untried_providers()
                .find(|p| failover.qualified.contains(*p))
                .unwrap_or(&self.providers[0])
                .clone()
        });
        let number = self.queue(provider, stamp);
        self.updated_at = stamp.now;
        Ok(number)
    }

    /// A worker takes a queued attempt: `queued` → `started`, remembering the job's version. Refused once the job
    /// has its outcome: no provider is called for a job that is done.
    pub fn claim(
        &mut self,
        number: u32,
        lease_expires_at: Timestamp,
        stamp: &Stamp,
    ) -> Result<(), Refusal> {
        if self.already(number, AttemptState::Started, stamp) {
            return Ok(());
        }
        self.ensure_open()?;
        let version = self.version;
        let attempt = self.attempt_mut(number)?;
        attempt.expect(AttemptState::Queued, AttemptState::Started)?;
        attempt.state = AttemptState::Started;
        attempt.seen_version = Some(version);
        attempt.started_at = Some(stamp.now);
        attempt.lease_expires_at = Some(lease_expires_at);
        attempt.writer = Some(stamp.token.clone());
        self.updated_at = stamp.now;
        Ok(())
    }

    /// No answer in time, a connection lost after sending, or an expired lease: `started` → `unknown`. Also once
    /// another attempt has won: the provider may still have done (and billed) the work, and the timeline shows it.
    pub fn mark_unknown(&mut self, number: u32, stamp: &Stamp) -> Result<(), Refusal> {
        if self.already(number, AttemptState::Unknown, stamp) {
            return Ok(());
        }
        let attempt = self.attempt_mut(number)?;
        attempt.expect(AttemptState::Started, AttemptState::Unknown)?;
        attempt.state = AttemptState::Unknown;
        attempt.writer = Some(stamp.token.clone());
        self.updated_at = stamp.now;
        Ok(())
    }

    /// A definite answer that is not a result: `started` | `unknown` → `failed`, then failover.
    pub fn fail(
        &mut self,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<(), Refusal> {
        if self.already(number, AttemptState::Failed, stamp) {
            return Ok(());
        }
        let attempt = self.attempt_mut(number)?;
        if !matches!(attempt.state, AttemptState::Started | AttemptState::Unknown) {
            return Err(attempt.refuse(AttemptState::Failed));
        }
        attempt.state = AttemptState::Failed;
        attempt.error = Some(error.bounded());
        attempt.report = report.into_option();
        attempt.finished_at = Some(stamp.now);
        attempt.writer = Some(stamp.token.clone());
        self.fail_over(failover, stamp);
        self.updated_at = stamp.now;
        Ok(())
    }

    /// A valid result arrived for attempt `number`: compare-and-swap on the result slot (invariant 6).
    ///
    /// It wins when the job's version is the one the attempt saw at its start, no attempt holds the slot, and (for
    /// an attempt cancelled meanwhile) its lease has not ended; a queued attempt then ends `cancelled`, as it can
    /// never run. Otherwise the attempt becomes `discarded` and the job is left exactly as it was (invariant 7).
    pub fn complete(
        &mut self,
        number: u32,
        result: Value,
        report: CallReport,
        stamp: &Stamp,
    ) -> Result<Completion, Refusal> {
        let (version, completed_by) = (self.version, self.completed_by);
        let now = stamp.now;
        let attempt = self.attempt_mut(number)?;
        if stamp.is(attempt.writer.as_ref())
            && matches!(
                attempt.state,
                AttemptState::Succeeded | AttemptState::Discarded
            )
        {
            return Ok(if completed_by == Some(number) {
                Completion::Won
            } else {
                Completion::Lost {
                    winner: completed_by,
                }
            });
        }
        if !matches!(
            attempt.state,
            AttemptState::Started | AttemptState::Unknown | AttemptState::Cancelled
        ) {
            return Err(attempt.refuse(AttemptState::Succeeded));
        }
        let in_time = attempt.state != AttemptState::Cancelled
            || attempt.lease_expires_at.is_some_and(|end| now < end);
        // The loser's usage is kept too: its call was paid for.
        attempt.report = report.into_option();
        attempt.finished_at = Some(now);
        attempt.writer = Some(stamp.token.clone());
        if attempt.seen_version == Some(version) && completed_by.is_none() && in_time {
            attempt.state = AttemptState::Succeeded;
            self.completed_by = Some(number);
            self.result = Some(result);
            self.version += 1;
            self.error = None;
            self.updated_at = now;
            for queued in self
                .attempts
                .iter_mut()
                .filter(|a| a.state == AttemptState::Queued)
            {
                queued.state = AttemptState::Cancelled;
                queued.finished_at = Some(now);
                queued.writer = Some(stamp.token.clone());
            }
            Ok(Completion::Won)
        } else {
            attempt.state = AttemptState::Discarded;
            Ok(Completion::Lost {
                winner: completed_by,
            })
        }
    }

    /// Resolves a live attempt out of band: `queued` | `started` | `unknown` → `cancelled`, then failover. Cancelling
    /// a cancelled attempt changes nothing.
    pub fn cancel_attempt(
        &mut self,
        number: u32,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<AttemptCancel, Refusal> {
        let attempt = self.attempt_mut(number)?;
        if attempt.state == AttemptState::Cancelled {
            return Ok(if stamp.is(attempt.writer.as_ref()) {
                AttemptCancel::Cancelled
            } else {
                AttemptCancel::AlreadyCancelled
            });
        }
        if !attempt.state.is_live() {
            return Err(attempt.refuse(AttemptState::Cancelled));
        }
        attempt.state = AttemptState::Cancelled;
        attempt.finished_at = Some(stamp.now);
        attempt.writer = Some(stamp.token.clone());
        self.fail_over(failover, stamp);
        self.updated_at = stamp.now;
        Ok(AttemptCancel::Cancelled)
    }

    /// The owner gives up on the job: version bumped, every live attempt cancelled, later results discarded.
    pub fn cancel(&mut self, stamp: &Stamp) -> Result<JobCancel, Refusal> {
        match self.status() {
            JobStatus::Cancelled if stamp.is(self.cancelled_by.as_ref()) => {
                return Ok(JobCancel::Cancelled);
            }
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
            attempt.finished_at = Some(stamp.now);
        }
        self.cancelled_at = Some(stamp.now);
        self.cancelled_by = Some(stamp.token.clone());
        self.version += 1;
        self.updated_at = stamp.now;
        Ok(JobCancel::Cancelled)
    }

    /// The sweeper hands a `queued` attempt nobody claimed to the queue again; recorded so that the next sweep
    /// waits its turn before sending it once more.
    pub fn redispatch(&mut self, number: u32, now: Timestamp) -> Result<(), Refusal> {
        self.ensure_open()?;
        let attempt = self.attempt_mut(number)?;
        attempt.expect(AttemptState::Queued, AttemptState::Queued)?;
        attempt.dispatched_at = now;
        Ok(())
    }
}

impl Attempt {
    fn queued(number: u32, provider: ProviderName, stamp: &Stamp) -> Self {
        Self {
            number,
            provider,
            state: AttemptState::Queued,
            seen_version: None,
            lease_expires_at: None,
            created_at: stamp.now,
            dispatched_at: stamp.now,
            started_at: None,
            finished_at: None,
            error: None,
            report: None,
            origin: Some(stamp.token.clone()),
            writer: None,
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

    /// A write by a writer of its own, at `ms`.
    fn by(ms: i64) -> Stamp {
        Stamp::fresh(at(ms))
    }

    fn provider(name: &str) -> ProviderName {
        ProviderName::parse(name).unwrap()
    }

    /// Failover to any of `qualified`.
    fn to(qualified: &[&str]) -> Failover {
        Failover {
            qualified: qualified.iter().map(|p| provider(p)).collect(),
            max_attempts: Failover::DEFAULT_MAX_ATTEMPTS,
        }
    }

    fn nowhere() -> Failover {
        to(&[])
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
            Duration::days(30),
            &by(0),
        )
    }

    fn provider_error() -> ErrorInfo {
        ErrorInfo::new("provider_error", "500")
    }

    #[test]
    fn failover_goes_to_the_next_untried_provider_if_it_is_qualified() {
        let mut job = job();
        assert_eq!(job.next_step(&to(&["b"])), NextStep::Queue(provider("b")));
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &to(&["b"]),
            &by(2),
        )
        .unwrap();
        assert_eq!(job.status(), JobStatus::Queued);
        assert_eq!(job.attempt(2).unwrap().provider, provider("b"));
        job.claim(2, at(30_000), &by(3)).unwrap();
        let next = job.next_step(&to(&["a", "b"]));
        assert!(
            matches!(&next, NextStep::Stop(e) if e.code == "fallback_not_qualified"),
            "{next:?}"
        );
        job.cancel_attempt(2, &to(&["a", "b"]), &by(4)).unwrap();
        assert_eq!(job.status(), JobStatus::Failed);
        assert_eq!(job.error.as_ref().unwrap().code, "fallback_not_qualified");
        assert_eq!(job.attempts.len(), 2);
        // A manual retry clears the error; once every provider was tried, the chain is exhausted.
        job.add_attempt(Some(provider("c")), &nowhere(), &by(5))
            .unwrap();
        assert_eq!(job.error, None);
        assert!(
            matches!(job.next_step(&to(&["c"])), NextStep::Stop(e) if e.code == "providers_exhausted")
        );
    }

    #[test]
    fn failover_is_decided_on_the_state_the_write_lands_on() {
        let mut job = job();
        // A cancel decided while attempt 1 was live, landing after attempt 1 failed over to b: b was tried, so
        // the cancel of attempt 2 goes to c, not to b again.
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &to(&["b", "c"]),
            &by(2),
        )
        .unwrap();
        job.cancel_attempt(2, &to(&["b", "c"]), &by(3)).unwrap();
        assert_eq!(job.attempt(3).unwrap().provider, provider("c"));
    }

    #[test]
    fn a_manual_retry_without_a_provider_takes_the_next_qualified_one_else_the_primary() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &nowhere(),
            &by(2),
        )
        .unwrap();
        assert_eq!(job.error.as_ref().unwrap().code, "fallback_not_qualified");
        // b was refused as unqualified: a retry that names nobody goes to c, which is qualified...
        let number = job.add_attempt(None, &to(&["c"]), &by(3)).unwrap();
        assert_eq!(job.attempt(number).unwrap().provider, provider("c"));
        job.cancel_attempt(number, &nowhere(), &by(4)).unwrap();
        // ... and with nobody qualified, to the primary.
        let number = job.add_attempt(None, &nowhere(), &by(5)).unwrap();
        assert_eq!(job.attempt(number).unwrap().provider, provider("a"));
    }

    #[test]
    fn a_job_stops_at_its_attempt_limit() {
        let mut job = job();
        let limit = Failover {
            max_attempts: 2,
            ..to(&["b", "c"])
        };
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.fail(1, provider_error(), CallReport::default(), &limit, &by(2))
            .unwrap();
        job.claim(2, at(30_000), &by(3)).unwrap();
        job.fail(2, provider_error(), CallReport::default(), &limit, &by(4))
            .unwrap();
        assert_eq!(job.attempts.len(), 2);
        assert_eq!(job.error.as_ref().unwrap().code, "attempt_limit_reached");
        let before = job.clone();
        assert_eq!(
            job.add_attempt(None, &limit, &by(5)),
            Err(Refusal::AttemptLimitReached { limit: 2 })
        );
        assert_eq!(job, before);
    }

    #[test]
    fn every_transition_repeated_with_its_token_answers_the_same_and_changes_nothing() {
        let mut job = job();
        let (claim, unknown, fail) = (by(1), by(2), by(3));
        job.claim(1, at(30_000), &claim).unwrap();
        let claimed = job.clone();
        job.claim(1, at(30_000), &claim).unwrap();
        assert_eq!(job, claimed);
        job.mark_unknown(1, &unknown).unwrap();
        let once = job.clone();
        job.mark_unknown(1, &unknown).unwrap();
        assert_eq!(job, once);
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &to(&["b"]),
            &fail,
        )
        .unwrap();
        let failed = job.clone();
        // The repeat finds its own failure: no second failover attempt.
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &to(&["b"]),
            &fail,
        )
        .unwrap();
        assert_eq!(job, failed);
        assert_ne!(job, once);
        assert_eq!(job.attempts.len(), 2);
        // Another writer's claim of the claimed attempt is refused; the claimant's own repeat is not.
        let claim = by(4);
        job.claim(2, at(30_000), &claim).unwrap();
        assert!(job.claim(2, at(30_000), &by(4)).is_err());
        job.claim(2, at(30_000), &claim).unwrap();
        let complete = by(5);
        let result = json!({"summary": "x"});
        for _ in 0..2 {
            assert_eq!(
                job.complete(2, result.clone(), CallReport::default(), &complete),
                Ok(Completion::Won)
            );
        }
        assert_eq!(job.version, 1);
        assert!(
            job.complete(2, result, CallReport::default(), &by(6))
                .is_err(),
            "another writer's result for the same attempt"
        );
    }

    #[test]
    fn a_manual_retry_repeated_with_its_token_finds_its_attempt() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &nowhere(),
            &by(2),
        )
        .unwrap();
        let retry = by(3);
        assert_eq!(
            job.add_attempt(Some(provider("b")), &nowhere(), &retry),
            Ok(2)
        );
        job.claim(2, at(30_000), &by(4)).unwrap();
        // The repeat (a lost answer) finds attempt 2, though it has moved on; another writer is refused.
        assert_eq!(
            job.add_attempt(Some(provider("b")), &nowhere(), &retry),
            Ok(2)
        );
        assert!(matches!(
            job.add_attempt(Some(provider("b")), &nowhere(), &by(5)),
            Err(Refusal::AttemptInProgress { number: 2, .. })
        ));
        assert_eq!(job.attempts.len(), 2);
    }

    #[test]
    fn a_cancelled_attempt_cancelled_again_is_an_answer_not_an_error() {
        let mut job = job();
        let cancel = by(1);
        assert_eq!(
            job.cancel_attempt(1, &nowhere(), &cancel),
            Ok(AttemptCancel::Cancelled)
        );
        let once = job.clone();
        assert_eq!(
            job.cancel_attempt(1, &nowhere(), &cancel),
            Ok(AttemptCancel::Cancelled)
        );
        assert_eq!(
            job.cancel_attempt(1, &nowhere(), &by(2)),
            Ok(AttemptCancel::AlreadyCancelled)
        );
        assert_eq!(job, once);
    }

    #[test]
    fn a_new_job_is_queued_on_its_first_provider() {
        let job = job();
        assert_eq!(job.status(), JobStatus::Queued);
        assert_eq!(job.attempts.len(), 1);
        assert_eq!(job.attempts[0].provider, provider("a"));
        assert_eq!(job.version, 0);
        assert_eq!(job.expires_at, at(0) + Duration::days(30));
    }

    #[test]
    fn the_retention_ends_on_a_whole_second() {
        let end = expiry(at(1), Duration::days(1));
        assert_eq!(end.timestamp_subsec_millis(), 0);
        assert!(
            end >= at(1) + Duration::days(1)
                && end < at(1) + Duration::days(1) + Duration::seconds(1)
        );
        assert_eq!(expiry(at(0), Duration::days(1)), at(0) + Duration::days(1));
        let job = job();
        assert!(!job.is_expired(job.expires_at - Duration::milliseconds(1)));
        assert!(job.is_expired(job.expires_at));
    }

    #[test]
    fn a_timeout_is_unknown_and_blocks_the_next_attempt() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        assert_eq!(job.status(), JobStatus::Running);
        job.mark_unknown(1, &by(2)).unwrap();
        assert_eq!(job.status(), JobStatus::Unknown);
        let before = job.clone();
        assert_eq!(
            job.add_attempt(Some(provider("b")), &nowhere(), &by(3)),
            Err(Refusal::AttemptInProgress {
                number: 1,
                state: AttemptState::Unknown
            })
        );
        assert_eq!(job, before);
        job.cancel_attempt(1, &nowhere(), &by(4)).unwrap();
        assert_eq!(
            job.add_attempt(Some(provider("b")), &nowhere(), &by(5)),
            Ok(2)
        );
    }

    #[test]
    fn the_attempt_that_answers_first_wins_even_if_it_left_last() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.mark_unknown(1, &by(2)).unwrap();
        job.cancel_attempt(1, &nowhere(), &by(3)).unwrap();
        job.add_attempt(Some(provider("b")), &nowhere(), &by(4))
            .unwrap();
        job.claim(2, at(30_000), &by(5)).unwrap();
        assert_eq!(
            job.complete(2, json!({"summary": "B"}), CallReport::default(), &by(6)),
            Ok(Completion::Won)
        );
        let after_win = job.clone();
        assert_eq!(
            job.complete(1, json!({"summary": "A"}), CallReport::default(), &by(7)),
            Ok(Completion::Lost { winner: Some(2) })
        );
        assert_eq!(job.result, Some(json!({"summary": "B"})));
        assert_eq!((job.version, job.completed_by), (1, Some(2)));
        assert_eq!(job.attempt(1).unwrap().state, AttemptState::Discarded);
        assert_eq!(job.updated_at, after_win.updated_at);
    }

    #[test]
    fn a_cancelled_attempt_that_answers_while_the_slot_is_free_wins_and_ends_the_queued_one() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.cancel_attempt(1, &to(&["b"]), &by(2)).unwrap();
        assert_eq!(job.attempt(2).unwrap().state, AttemptState::Queued);
        assert_eq!(
            job.complete(1, json!({"summary": "late"}), CallReport::default(), &by(3)),
            Ok(Completion::Won)
        );
        assert_eq!(job.attempt(1).unwrap().state, AttemptState::Succeeded);
        assert_eq!(job.status(), JobStatus::Succeeded);
        assert_eq!(job.attempt(2).unwrap().state, AttemptState::Cancelled);
        assert_eq!(job.live_attempt(), None);
    }

    #[test]
    fn a_cancelled_attempt_answering_after_its_lease_is_discarded_so_a_failed_job_settles() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.cancel_attempt(1, &nowhere(), &by(2)).unwrap();
        assert_eq!(job.status(), JobStatus::Failed);
        assert_eq!(job.settles_at(), Some(at(30_000)));
        assert!(!job.is_settled(at(29_999)));
        assert!(job.is_settled(at(30_000)));
        let mut in_time = job.clone();
        assert_eq!(
            in_time.complete(
                1,
                json!({"summary": "late"}),
                CallReport::default(),
                &by(29_999)
            ),
            Ok(Completion::Won)
        );
        assert_eq!(
            job.complete(
                1,
                json!({"summary": "late"}),
                CallReport::default(),
                &by(30_000)
            ),
            Ok(Completion::Lost { winner: None })
        );
        assert_eq!(
            (job.status(), job.attempt(1).unwrap().state),
            (JobStatus::Failed, AttemptState::Discarded)
        );
    }

    #[test]
    fn live_jobs_are_not_settled_and_finished_ones_are() {
        let mut job = job();
        assert_eq!(job.settles_at(), None);
        job.claim(1, at(30_000), &by(1)).unwrap();
        assert_eq!(job.settles_at(), None);
        // A failure without a cancelled attempt behind it settles at once.
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &nowhere(),
            &by(2),
        )
        .unwrap();
        assert_eq!(job.settles_at(), Some(at(2)));
        job.cancel(&by(3)).unwrap();
        assert!(job.is_settled(at(3)));
    }

    #[test]
    fn a_started_attempt_of_a_job_another_attempt_won_can_still_become_unknown() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.cancel_attempt(1, &to(&["b"]), &by(2)).unwrap();
        job.claim(2, at(30_000), &by(3)).unwrap();
        job.complete(1, json!({"summary": "late"}), CallReport::default(), &by(4))
            .unwrap();
        job.mark_unknown(2, &by(5)).unwrap();
        assert_eq!(job.attempt(2).unwrap().state, AttemptState::Unknown);
        assert_eq!(job.status(), JobStatus::Succeeded);
        assert_eq!(
            job.complete(2, json!({"summary": "B"}), CallReport::default(), &by(6)),
            Ok(Completion::Lost { winner: Some(1) })
        );
    }

    #[test]
    fn a_result_after_the_job_was_cancelled_is_discarded() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        assert_eq!(job.cancel(&by(2)), Ok(JobCancel::Cancelled));
        assert_eq!(job.attempt(1).unwrap().state, AttemptState::Cancelled);
        assert_eq!(
            job.complete(1, json!({"summary": "late"}), CallReport::default(), &by(3)),
            Ok(Completion::Lost { winner: None })
        );
        assert_eq!(job.status(), JobStatus::Cancelled);
        assert_eq!(job.result, None);
        assert_eq!(job.cancel(&by(4)), Ok(JobCancel::AlreadyCancelled));
    }

    #[test]
    fn a_succeeded_job_cannot_be_cancelled_or_retried() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.complete(1, json!({"summary": "x"}), CallReport::default(), &by(2))
            .unwrap();
        let finished = Err(Refusal::JobFinished {
            status: JobStatus::Succeeded,
        });
        assert_eq!(job.cancel(&by(3)).map(|_| ()), finished.clone());
        assert_eq!(
            job.add_attempt(Some(provider("b")), &nowhere(), &by(3))
                .map(|_| ()),
            finished
        );
    }

    #[test]
    fn a_claim_of_a_claimed_attempt_is_refused() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        assert_eq!(
            job.claim(1, at(30_000), &by(2)),
            Err(Refusal::InvalidTransition {
                number: 1,
                from: AttemptState::Started,
                to: AttemptState::Started
            })
        );
        assert_eq!(
            job.claim(7, at(30_000), &by(2)),
            Err(Refusal::NoSuchAttempt { number: 7 })
        );
    }

    #[test]
    fn a_failed_job_may_be_retried_by_hand() {
        let mut job = job();
        job.claim(1, at(30_000), &by(1)).unwrap();
        job.fail(
            1,
            provider_error(),
            CallReport::default(),
            &nowhere(),
            &by(2),
        )
        .unwrap();
        assert_eq!(job.status(), JobStatus::Failed);
        assert_eq!(
            job.add_attempt(Some(provider("b")), &nowhere(), &by(3)),
            Ok(2)
        );
        assert_eq!(job.status(), JobStatus::Queued);
    }

    #[test]
    fn error_messages_and_model_ids_are_bounded() {
        let long = "é".repeat(ErrorInfo::MAX_MESSAGE_BYTES);
        let error = ErrorInfo::new("output_invalid", long);
        assert!(error.message.len() <= ErrorInfo::MAX_MESSAGE_BYTES);
        assert!(error.message.ends_with('…'));
        assert_eq!(ErrorInfo::new("x", "short").message, "short");
        let report = CallReport {
            model: Some("m".repeat(10_000)),
            ..CallReport::default()
        };
        let kept = report.into_option().unwrap().model.unwrap();
        assert!(kept.len() <= CallReport::MAX_MODEL_BYTES);
    }

    #[test]
    fn a_redispatch_is_recorded_on_a_queued_attempt_only() {
        let mut job = job();
        job.redispatch(1, at(40_000)).unwrap();
        assert_eq!(job.attempt(1).unwrap().dispatched_at, at(40_000));
        job.claim(1, at(90_000), &by(40_001)).unwrap();
        assert!(job.redispatch(1, at(40_002)).is_err());
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
        /// The last write again, with its token: as if its answer had been lost.
        Repeat,
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
            Just(Step::Repeat),
        ]
    }

    fn apply(
        job: &mut Job,
        step: &Step,
        stamp: &Stamp,
        winners: &mut usize,
    ) -> Result<(), Refusal> {
        match *step {
            Step::Add => job
                .add_attempt(Some(provider("b")), &nowhere(), stamp)
                .map(|_| ()),
            Step::Claim(n) => job.claim(n, at(1_000), stamp),
            Step::Unknown(n) => job.mark_unknown(n, stamp),
            Step::Complete(n) => job
                .complete(n, json!({"n": n}), CallReport::default(), stamp)
                .map(|c| {
                    if c == Completion::Won {
                        *winners += 1
                    }
                }),
            Step::Fail(n) => job.fail(
                n,
                ErrorInfo::new("x", "y"),
                CallReport::default(),
                &to(&["a", "b"]),
                stamp,
            ),
            Step::CancelAttempt(n) => job
                .cancel_attempt(n, &to(&["a", "b", "c"]), stamp)
                .map(|_| ()),
            Step::CancelJob => job.cancel(stamp).map(|_| ()),
            Step::Repeat => Ok(()),
        }
    }

    proptest! {
        #[test]
        fn no_sequence_of_transitions_breaks_the_invariants(steps in prop::collection::vec(arb_step(), 0..40)) {
            let mut job = job();
            let mut winners = 0;
            let mut last: Option<(Step, Stamp, Result<(), Refusal>, Job)> = None;
            for (i, step) in steps.into_iter().enumerate() {
                let before = job.clone();
                if let Step::Repeat = step {
                    // A repeat of a write that landed changes nothing and answers as the write did.
                    if let Some((step, stamp, outcome, after)) = &last {
                        // Its answer is the first one's (a repeated win says "won" again), so it is not counted.
                        let mut answered_again = 0;
                        let again = apply(&mut job, step, &Stamp::new(stamp.token.clone(), at(i as i64 + 1)), &mut answered_again);
                        if outcome.is_ok() && &job == after {
                            prop_assert!(again.is_ok(), "{step:?} repeated: {again:?}");
                            prop_assert_eq!(&job, &before, "{:?} repeated changed the job", step);
                        }
                        if again.is_err() {
                            prop_assert_eq!(&job, &before, "a refusal changed the job");
                        }
                    }
                    continue;
                }
                let stamp = by(i as i64 + 1);
                let outcome = apply(&mut job, &step, &stamp, &mut winners);
                if outcome.is_err() {
                    prop_assert_eq!(&job, &before, "a refusal changed the job");
                }
                last = Some((step, stamp, outcome, job.clone()));
                let live = job.attempts.iter().filter(|a| a.state.is_live()).count();
                prop_assert!(live <= 1, "{} live attempts", live);
                let succeeded = job.attempts.iter().filter(|a| a.state == AttemptState::Succeeded).count();
                prop_assert!(succeeded <= 1 && winners <= 1);
                prop_assert_eq!(job.completed_by.is_some(), succeeded == 1);
                prop_assert_eq!(job.result.is_some(), job.completed_by.is_some());
                prop_assert!(job.version >= before.version);
                prop_assert!(job.attempts.iter().all(|a| a.state != AttemptState::Queued) || job.completed_by.is_none(),
                    "a queued attempt in a succeeded job");
                if before.completed_by.is_some() {
                    prop_assert_eq!(&job.result, &before.result, "a result was replaced");
                }
            }
        }
    }
}
