//! Where a job goes when an attempt ends without a result: the policy a write is given, and the decision taken
//! on the job as it is being written.

use std::collections::BTreeSet;

use super::ids::ProviderName;
use super::job::Job;
use super::report::ErrorInfo;

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

/// What follows when an attempt ends `failed` or `cancelled` without a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailoverDecision {
    /// Queue the next attempt on this provider.
    Queue(ProviderName),
    /// No next attempt: the job is `failed` with this error (a manual retry may still add one).
    Stop(ErrorInfo),
}

impl Job {
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
            Some(next) => FailoverDecision::Queue(next.clone()),
        }
    }
}
