//! Where a job goes when an attempt ends without a result: the policy a write is given, and the decision taken
//! on the job as it is being written.

use std::collections::BTreeSet;

use chrono::Duration;

use super::attempt::Attempt;
use super::ids::ProviderName;
use super::job::Job;
use super::limits::LimitReached;
use super::report::ErrorInfo;
use super::status::JobStatus;
use super::time::Timestamp;

/// What automatic failover (and a manual retry that names no provider) may do. The decision is taken inside the
/// write, on the state being written, so a decision can never go stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// Providers qualified for the job's contract at its current fingerprint (invariant 9). It only needs to
    /// cover the providers of the chain not tried yet.
    pub qualified: BTreeSet<ProviderName>,
    /// The most attempts one job may have, so that no job grows past what a store accepts.
    pub max_attempts: u32,
    /// How the failing attempt's provider may be tried again when it did not do the work; `None`: never.
    pub retry: Option<RetryPolicy>,
    /// Where in its window a backoff without `Retry-After` lands: 0 its middle, 1000 its end (equal jitter,
    /// drawn by the caller so that the decision itself stays a function of what it is given).
    pub jitter_permille: u16,
    /// The owner's budget, if it is spent (invariant 18): no attempt is queued — no failover, no retry, no manual
    /// attempt — and the job stops with `budget_exceeded` (a manual attempt is refused with it).
    pub budget: Option<LimitReached>,
}

impl Failover {
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
}

/// Retries of one provider after answers that say the work was not done: at most `max_retries` in a row, each
/// starting no later than `within` after the first try, each not before the provider's `Retry-After` or, without
/// one, a backoff: `min(cap, base·2ⁿ)` with equal jitter (half of it, plus up to the other half).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub within: Duration,
    pub base: Duration,
    pub cap: Duration,
}

/// Retry limits a provider or a contract sets for itself: retries in a row after answers that say the work was not
/// done, and how long after the first try a retry may still start. Unset: the deployment's (for a provider), no
/// further limit (for a contract).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryLimits {
    pub retries: Option<u32>,
    pub retry_within_ms: Option<u64>,
}

impl RetryLimits {
    /// The largest `retries`, and the longest `retry_within_ms` (a day).
    pub const MAX_RETRIES: u32 = 10;
    pub const MAX_WITHIN_MS: u64 = 86_400_000;

    /// The limits within bounds, or what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.retries.is_some_and(|r| r > Self::MAX_RETRIES)
            || self
                .retry_within_ms
                .is_some_and(|w| w > Self::MAX_WITHIN_MS)
        {
            return Err(format!(
                "retries must be 0 to {}, retry_within_ms at most {} (a day)",
                Self::MAX_RETRIES,
                Self::MAX_WITHIN_MS
            ));
        }
        Ok(())
    }
}

impl RetryPolicy {
    /// This policy for one attempt: its provider's own limits in place of the deployment's, then its contract's
    /// as a ceiling — a contract whose users cannot wait lowers them, never raises them.
    pub fn limited(mut self, provider: RetryLimits, contract: RetryLimits) -> Self {
        // Checked limits: at most a day.
        let ms =
            |ms: u64| Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX / 1_000_000));
        if let Some(retries) = provider.retries {
            self.max_retries = retries;
        }
        if let Some(within) = provider.retry_within_ms {
            self.within = ms(within);
        }
        if let Some(retries) = contract.retries {
            self.max_retries = self.max_retries.min(retries);
        }
        if let Some(within) = contract.retry_within_ms {
            self.within = self.within.min(ms(within));
        }
        self
    }
}

/// The error codes of answers that say the provider did not do the work: a 429, a 503 with `Retry-After`, a
/// connection refused before anything was sent, no call at all (the provider's breaker was open), and a call the
/// provider cancelled before its work (a background response or a batch cancelled there). Nothing else is retried
/// on the same provider.
pub const NOT_DONE: [&str; 5] = [
    "rate_limited",
    "provider_unavailable",
    "connection_failed",
    "breaker_open",
    "cancelled_at_provider",
];

/// The error of an attempt whose call its owner's budget had no room for (it was not made): the job stops with it.
pub const BUDGET_EXCEEDED: &str = "budget_exceeded";

/// What follows when an attempt ends `failed` or `cancelled` without a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailoverDecision {
    /// Queue the next attempt on this provider.
    Queue(ProviderName),
    /// No next attempt: the job is `failed` with this error (a manual retry may still add one).
    Stop(ErrorInfo),
}

impl Job {
    /// When the failed attempt `number` is tried again on its provider: not before the returned moment, if its
    /// answer said the work was not done, the job is `failed` (nothing else live, no result, not cancelled), and
    /// the policy and the attempt limit allow another try.
    pub(super) fn retry_decision(
        &self,
        number: u32,
        failover: &Failover,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let policy = failover.retry?;
        if failover.budget.is_some() {
            return None;
        }
        let failed = self.attempt(number)?;
        let code = failed.error.as_ref()?.code.as_str();
        if !NOT_DONE.contains(&code)
            || self.status() != JobStatus::Failed
            || self.attempts.len() >= failover.max_attempts as usize
        {
            return None;
        }
        // An open breaker sends the job on to a qualified next provider when there is one, rather than wait.
        if code == "breaker_open"
            && matches!(self.failover_decision(failover), FailoverDecision::Queue(_))
        {
            return None;
        }
        let (first, retries) = self.retry_chain(number)?;
        if retries >= policy.max_retries {
            return None;
        }
        let asked = (failed.report.as_ref()).and_then(|r| {
            (r.retry_after_ms).or_else(|| r.retry_after_s.map(|s| s.saturating_mul(1000)))
        });
        let wait = match asked {
            // Past the window, a wait needs no exact size: it is refused below either way.
            Some(ms) => Duration::milliseconds(
                i64::try_from(ms)
                    .unwrap_or(i64::MAX)
                    .min(policy.within.num_milliseconds() + 1000),
            ),
            None => {
                let ceiling = (policy.base * 2i32.saturating_pow(retries.min(30))).min(policy.cap);
                ceiling / 2 + ceiling / 2 * i32::from(failover.jitter_permille.min(1000)) / 1000
            }
        };
        let not_before = now + wait;
        (not_before - first.created_at <= policy.within).then_some(not_before)
    }

    /// The first try of the retries on one provider that attempt `number` ends (the attempt itself when it is no
    /// retry), and how many retries lead from it to `number`.
    pub fn retry_chain(&self, number: u32) -> Option<(&Attempt, u32)> {
        let (mut first, mut retries) = (self.attempt(number)?, 0u32);
        while let Some(of) = first.retry_of {
            first = self.attempt(of)?;
            retries += 1;
        }
        Some((first, retries))
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
    /// `fallback_not_qualified`, at the attempt limit `attempt_limit_reached`, or with the owner's budget spent
    /// `budget_exceeded`.
    pub fn failover_decision(&self, failover: &Failover) -> FailoverDecision {
        if self.attempts.len() >= failover.max_attempts as usize {
            return FailoverDecision::Stop(ErrorInfo::new(
                "attempt_limit_reached",
                format!(
                    "the job has {} attempts, the most one job may have",
                    self.attempts.len()
                ),
            ));
        }
        match self.next_untried_provider() {
            None => FailoverDecision::Stop(ErrorInfo::new(
                "providers_exhausted",
                "every provider of the chain was tried without a result",
            )),
            Some(next) if !failover.qualified.contains(next) => {
                FailoverDecision::Stop(ErrorInfo::new(
                    "fallback_not_qualified",
                    format!(
                        "the next provider, {next}, is not qualified for {}",
                        self.contract
                    ),
                ))
            }
            Some(_) if let Some(spent) = &failover.budget => {
                FailoverDecision::Stop(ErrorInfo::new(
                    BUDGET_EXCEEDED,
                    format!("{spent}: no other provider is called for this job"),
                ))
            }
            Some(next) => FailoverDecision::Queue(next.clone()),
        }
    }
}
