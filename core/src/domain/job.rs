//! Jobs, attempts and every transition of `docs/design.md` (States), as pure functions on a [`Job`].
//!
//! Each transition either changes the job and returns what happened, or returns a typed [`Refusal`] and leaves the
//! job exactly as it was. The store adapters apply these same rules inside one atomic write; the tests use them as
//! the reference model.
//!
//! Every transition carries a [`Stamp`]: the writer's token and the time. A transition that finds its own token
//! already applied answers as it did the first time and changes nothing (invariant 11), so a store write retried
//! by the SDK, by the engine or after a lost answer is a success, never another writer's.

use chrono::{Duration, DurationRound};
use serde_json::Value;

use super::attempt::{Attempt, AttemptState, ClearedBy};
use super::failover::{BUDGET_EXCEEDED, Failover, FailoverDecision};
use super::fingerprint::Fingerprint;
use super::ids::{ContractRef, IdempotencyKey, JobId, Owner, ProviderName, WriteToken};
use super::intervention::Intervention;
use super::report::{CallReport, ErrorInfo};
use super::status::JobStatus;
use super::time::Timestamp;
use super::write::{AttemptCancel, Completion, JobCancel, Refusal, Stamp};

/// The longest input kept, as JSON text, in bytes: with the largest result, the attempt limit and error messages
/// cut to size, a job stays well within a DynamoDB item (400 KB; `docs/dynamodb.md` gives the worst case).
pub const MAX_INPUT_BYTES: usize = 256 * 1024;

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
    /// Why the job failed, once no attempt is live and none will follow; a cancel keeps it (the job had failed
    /// before its owner cancelled it).
    pub error: Option<ErrorInfo>,
    /// Set when the owner cancelled the job; any later result is discarded.
    pub cancelled_at: Option<Timestamp>,
    /// The token of the write that cancelled it.
    pub cancelled_by: Option<WriteToken>,
    pub attempts: Vec<Attempt>,
    /// What operators did to the job on its owner's behalf, and who, oldest first.
    pub interventions: Vec<Intervention>,
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
            interventions: Vec::new(),
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

    /// Applies failover after the live attempt ended without a result, decided on the job as it now is.
    fn fail_over(&mut self, failover: &Failover, stamp: &Stamp) {
        if self.status() == JobStatus::Failed {
            match self.failover_decision(failover) {
                FailoverDecision::Queue(provider) => {
                    self.queue(provider, stamp);
                }
                FailoverDecision::Stop(error) => self.error = Some(error),
            }
        }
    }

    /// Attempt `of` again on its provider, not before `not_before`.
    fn queue_retry(&mut self, of: u32, not_before: Timestamp, stamp: &Stamp) {
        let provider = self
            .attempt(of)
            .expect("the failed attempt")
            .provider
            .clone();
        let number = self.queue(provider, stamp);
        let retry = self.attempt_mut(number).expect("just queued");
        retry.retry_of = Some(of);
        retry.not_before = Some(not_before);
        retry.dispatched_at = not_before;
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
    /// qualified, else on the primary. Refused while another attempt is live, once the job has its outcome, at the
    /// attempt limit, and with the owner's budget spent ([`Failover::budget`]). Returns its number. A caller's request sent again under its `Idempotency-Key`
    /// (`stamp.request`) is refused as done ([`Refusal::RequestDone`], naming its attempt); another request under
    /// a key used on this job is refused ([`Refusal::KeyReused`]).
    pub fn add_attempt(
        &mut self,
        provider: Option<ProviderName>,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<u32, Refusal> {
        if let Some(mine) = self.attempts.iter().find(|a| stamp.is(a.origin.as_ref())) {
            return Ok(mine.number);
        }
        if let Some(request) = &stamp.request {
            if let Some(done) = self
                .attempts
                .iter()
                .find(|a| a.request.as_ref() == Some(request))
            {
                return Err(Refusal::RequestDone {
                    number: done.number,
                });
            }
            self.ensure_key_unused(request)?;
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
        if let Some(spent) = failover.budget {
            return Err(Refusal::Limit(spent));
        }
        let provider = provider.unwrap_or_else(|| {
            self.untried_providers()
                .find(|p| failover.qualified.contains(*p))
                .unwrap_or(&self.providers[0])
                .clone()
        });
        let number = self.queue(provider, stamp);
        self.attempt_mut(number).expect("just queued").request = stamp.request.clone();
        self.updated_at = stamp.now;
        self.record(stamp, "attempt_added", Some(number));
        Ok(number)
    }

    /// Records what an operator's write did, if an operator made it.
    fn record(&mut self, stamp: &Stamp, action: &str, attempt: Option<u32>) {
        if let Some(by) = &stamp.operator
            && self.interventions.len() < Intervention::MAX
        {
            self.interventions.push(Intervention {
                by: by.clone(),
                action: action.to_owned(),
                attempt,
                at: stamp.now,
            });
        }
    }

    /// Refuses `request` if another request under its key was made on this job (invariant 17): the tokens of the
    /// caller's keyed writes kept on the job are its manual attempts' requests, its attempt cancels and its cancel.
    fn ensure_key_unused(&self, request: &WriteToken) -> Result<(), Refusal> {
        let keyed = self
            .attempts
            .iter()
            .flat_map(|a| [a.request.as_ref(), a.cancelled_by.as_ref()])
            .chain([self.cancelled_by.as_ref()])
            .flatten();
        for token in keyed {
            if token != request && token.same_intent(request) {
                return Err(Refusal::KeyReused);
            }
        }
        Ok(())
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
        if let Some(not_before) = attempt.not_before.filter(|t| stamp.now < *t) {
            return Err(Refusal::NotYet { number, not_before });
        }
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
    /// `call_id` is the provider's name of the call, if it gave one before its answer (kept for the reconciler).
    pub fn mark_unknown(
        &mut self,
        number: u32,
        call_id: Option<&str>,
        stamp: &Stamp,
    ) -> Result<(), Refusal> {
        if self.already(number, AttemptState::Unknown, stamp) {
            return Ok(());
        }
        let attempt = self.attempt_mut(number)?;
        attempt.expect(AttemptState::Started, AttemptState::Unknown)?;
        attempt.state = AttemptState::Unknown;
        attempt.call_id = call_id.map(str::to_owned);
        attempt.writer = Some(stamp.token.clone());
        self.updated_at = stamp.now;
        Ok(())
    }

    /// A definite answer that is not a result: `started` | `unknown` → `failed`, then a retry on the same provider
    /// when the answer says the work was not done (and the policy allows), else failover. An attempt that was
    /// `unknown` is never retried: its call may have done the work.
    ///
    /// A `cancelled` attempt whose provider answered after all, without a result, keeps what the answer said —
    /// its error and its usage: the call was paid for — and stays `cancelled`; the job is left as it was, its
    /// settle too (invariant 14): the cancel already resolved the attempt, and its failover ran then.
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
        if attempt.state == AttemptState::Cancelled {
            attempt.error = Some(error.bounded());
            attempt.report = report.into_option();
            attempt.writer = Some(stamp.token.clone());
            return Ok(());
        }
        if !matches!(attempt.state, AttemptState::Started | AttemptState::Unknown) {
            return Err(attempt.refuse(AttemptState::Failed));
        }
        let was_started = attempt.state == AttemptState::Started;
        attempt.clear(stamp.answer_clears(), stamp.now);
        attempt.state = AttemptState::Failed;
        attempt.error = Some(error.bounded());
        attempt.report = report.into_option();
        attempt.finished_at = Some(stamp.now);
        attempt.writer = Some(stamp.token.clone());
        // Its call did not fit the owner's budget: no other call would (invariant 18).
        let over_budget = (attempt.error.as_ref())
            .filter(|e| e.code == BUDGET_EXCEEDED)
            .cloned();
        let retry = was_started
            .then(|| self.retry_decision(number, failover, stamp.now))
            .flatten();
        match (retry, over_budget) {
            (_, Some(error)) => self.error = Some(error),
            (Some(not_before), None) => self.queue_retry(number, not_before, stamp),
            (None, None) => self.fail_over(failover, stamp),
        }
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
        attempt.clear(stamp.answer_clears(), now);
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
            // `now` is when the answer came (every try of its write carries it): a write that landed meanwhile
            // is not undone in time.
            self.updated_at = self.updated_at.max(now);
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
        // This very cancel, sent again: it answers as it did, whatever its attempt did since (a late answer).
        if self
            .attempt(number)
            .is_some_and(|a| stamp.is(a.cancelled_by.as_ref()))
        {
            return Ok(AttemptCancel::Cancelled);
        }
        self.ensure_key_unused(&stamp.token)?;
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
        attempt.clear(ClearedBy::Person, stamp.now);
        attempt.state = AttemptState::Cancelled;
        attempt.finished_at = Some(stamp.now);
        attempt.writer = Some(stamp.token.clone());
        attempt.cancelled_by = Some(stamp.token.clone());
        self.fail_over(failover, stamp);
        self.updated_at = stamp.now;
        self.record(stamp, "attempt_cancelled", Some(number));
        Ok(AttemptCancel::Cancelled)
    }

    /// An `unknown` attempt cleared without its answer — the reconciler's: `unknown` → `cancelled`, `by` a lookup
    /// that found the provider has no answer for it (the work was not done), or by the provider's policy
    /// (`unknown_retry_after_ms`: it may have been done, and paid). Its provider is then tried again in the same
    /// write, as a retry of it, while the retry policy, the attempt limit and the owner's budget allow; else
    /// failover decides. A late answer of it still wins until its lease ends (invariant 12), never after.
    pub fn clear_unknown(
        &mut self,
        number: u32,
        by: ClearedBy,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<(), Refusal> {
        if self.already(number, AttemptState::Cancelled, stamp) {
            return Ok(());
        }
        self.ensure_open()?;
        let attempt = self.attempt_mut(number)?;
        attempt.expect(AttemptState::Unknown, AttemptState::Cancelled)?;
        attempt.clear(by, stamp.now);
        attempt.state = AttemptState::Cancelled;
        attempt.finished_at = Some(stamp.now);
        attempt.writer = Some(stamp.token.clone());
        let retries = self.retry_chain(number).map(|(_, retries)| retries);
        let again = failover.budget.is_none()
            && self.status() == JobStatus::Failed
            && self.attempts.len() < failover.max_attempts as usize
            && (failover.retry)
                .zip(retries)
                .is_some_and(|(policy, retries)| retries < policy.max_retries);
        match again {
            true => self.queue_retry(number, stamp.now, stamp),
            false => self.fail_over(failover, stamp),
        }
        self.updated_at = stamp.now;
        Ok(())
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
            attempt.clear(ClearedBy::Person, stamp.now);
            attempt.state = AttemptState::Cancelled;
            attempt.finished_at = Some(stamp.now);
        }
        self.cancelled_at = Some(stamp.now);
        self.cancelled_by = Some(stamp.token.clone());
        self.version += 1;
        self.updated_at = stamp.now;
        self.record(stamp, "job_cancelled", None);
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
