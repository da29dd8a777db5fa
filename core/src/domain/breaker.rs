//! A breaker per provider, shared by every worker through the store: after repeated definite failures in a window
//! the provider is open for a cooldown, and its attempts end `breaker_open` without a call (failover takes the
//! job on, or it waits for the cooldown); after it, one worker's call is the probe, whose answer closes the breaker
//! or opens it for another cooldown.

use chrono::Duration;
use serde::{Deserialize, Serialize};

use super::time::Timestamp;

/// When a breaker opens, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Definite failures within `window` that open it; 0 turns breakers off.
    pub threshold: u32,
    pub window: Duration,
    /// How long it stays open before a probe.
    pub cooldown: Duration,
    /// How long a probe may take before another worker may probe in its place (a probe's worker may die).
    pub probe_lease: Duration,
    /// While a probe runs, how soon the others look again: within the probe's own timeout, not its whole lease.
    pub look_again: Duration,
}

/// One provider's breaker, as the store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    /// Definite failures within the window, oldest first: when, and which attempt (`job_id#n`), so that a
    /// failure recorded twice (a write repeated after its answer was lost) counts once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<(Timestamp, String)>,
    /// Open until then: no calls before it; after it, one probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_until: Option<Timestamp>,
    /// When the current probe started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_since: Option<Timestamp>,
    /// How many times it opened (closing keeps the count).
    #[serde(default)]
    pub trips: u64,
}

/// What one call's reply tells of its provider's health (invariant 15): the only evidence a breaker takes. The rule
/// is here, so that the providers' clients, the engine and the protocol's model read replies alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// The provider is failing, whatever was asked of it: a 5xx, a 429, a key refused, a connection refused or
    /// lost, a time-out, a body that is not what its API sends. Counts towards opening its breaker.
    Failing,
    /// The provider's model ran and answered — whether or not the answer kept the contract, which an owner's input
    /// can break. Closes its breaker.
    Answered,
    /// Nothing of its health: a refusal the request caused (another 4xx), which an owner's input can cause at will.
    /// Moves no breaker, neither towards opening nor towards closing.
    Silent,
}

impl Health {
    /// The failure codes that tell of the provider's own state, whatever was asked of it.
    pub const FAILING_CODES: [&'static str; 7] = [
        "bad_response",
        "connection_failed",
        "connection_lost",
        "gateway_timeout",
        "provider_error",
        "provider_unavailable",
        "rate_limited",
    ];

    /// What a definite failure with `code` tells of the provider: failing for [`Self::FAILING_CODES`], silent for a
    /// refusal of the request (`provider_refused`: a key refused says more, [`Self::of_refusal`]), answered for the
    /// rest (the model ran: it refused, was cut off, or broke the contract).
    pub fn of_failure(code: &str) -> Self {
        if Self::FAILING_CODES.contains(&code) {
            Self::Failing
        } else if code == "provider_refused" {
            Self::Silent
        } else {
            Self::Answered
        }
    }

    /// What a refusal with HTTP `status` tells: a key refused (401, 403) is the deployment's trouble, every call
    /// fails alike until the key is rotated; another refusal is the request's.
    pub fn of_refusal(status: u16, code: &str) -> Self {
        match status {
            401 | 403 => Self::Failing,
            _ => Self::of_failure(code),
        }
    }
}

/// What a worker may do with its attempt on the provider now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: call.
    Call,
    /// The cooldown is over and nobody probes: call, as the probe (after recording it).
    Probe,
    /// Open (or another worker probes): no call before `until`.
    Skip { until: Timestamp },
}

/// Where a breaker stands, for views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// No calls until `open_until`.
    Open,
    /// The cooldown is over: the next call probes.
    HalfOpen,
    /// One call probes now.
    Probing,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::Probing => "probing",
        }
    }
}

impl std::fmt::Display for BreakerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Breaker {
    /// Where the breaker stands at `now`.
    pub fn state(&self, now: Timestamp, policy: &BreakerPolicy) -> BreakerState {
        match self.admit(now, policy) {
            Admission::Call => BreakerState::Closed,
            Admission::Probe => BreakerState::HalfOpen,
            Admission::Skip { .. } if self.probe_since.is_some() => BreakerState::Probing,
            Admission::Skip { .. } => BreakerState::Open,
        }
    }

    pub fn admit(&self, now: Timestamp, policy: &BreakerPolicy) -> Admission {
        let Some(until) = self.open_until else {
            return Admission::Call;
        };
        if now < until {
            return Admission::Skip { until };
        }
        match self.probe_since {
            Some(since) if now < since + policy.probe_lease => Admission::Skip {
                until: (since + policy.probe_lease).min(now + policy.look_again),
            },
            _ => Admission::Probe,
        }
    }

    /// Nothing counts towards opening it and it is not open: any call is admitted and an answer changes nothing.
    pub fn is_clean(&self) -> bool {
        self.failures.is_empty() && self.open_until.is_none() && self.probe_since.is_none()
    }

    /// This worker's call is the probe.
    pub fn start_probe(&mut self, now: Timestamp) {
        self.probe_since = Some(now);
    }

    /// A definite failure of `attempt` at `now`. Whether it changed the breaker (a failure already counted does
    /// not); it opens once `threshold` failures fall in the window, and a failed probe opens it again.
    pub fn failed(&mut self, attempt: &str, now: Timestamp, policy: &BreakerPolicy) -> bool {
        if policy.threshold == 0 || self.failures.iter().any(|(_, a)| a == attempt) {
            return false;
        }
        self.failures.push((now, attempt.to_owned()));
        self.failures.retain(|(at, _)| now - *at < policy.window);
        let probing = self.open_until.is_some_and(|until| now >= until);
        if probing
            || (self.open_until.is_none() && self.failures.len() >= policy.threshold as usize)
        {
            self.open_until = Some(now + policy.cooldown);
            self.probe_since = None;
            self.trips += 1;
        }
        true
    }

    /// What a call by `attempt` (`job_id#n`) told at `now`: a failure counts towards opening it ([`Self::failed`]),
    /// an answer closes it ([`Self::answered`]), a refusal of the request moves nothing. Whether it changed.
    pub fn saw(
        &mut self,
        health: Health,
        attempt: &str,
        now: Timestamp,
        policy: &BreakerPolicy,
    ) -> bool {
        match health {
            Health::Failing => self.failed(attempt, now, policy),
            Health::Answered => self.answered(),
            Health::Silent => false,
        }
    }

    /// An answer at all (not a definite failure): closes the breaker. Whether it changed anything.
    pub fn answered(&mut self) -> bool {
        let before = self.clone();
        self.failures.clear();
        self.open_until = None;
        self.probe_since = None;
        *self != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::tests::at;

    const POLICY: BreakerPolicy = BreakerPolicy {
        threshold: 3,
        window: Duration::seconds(10),
        cooldown: Duration::seconds(30),
        probe_lease: Duration::seconds(5),
        look_again: Duration::seconds(2),
    };

    #[test]
    fn failures_in_the_window_open_it_one_probe_follows_and_its_answer_decides() {
        let mut b = Breaker::default();
        // Failures drop out of the window; the same attempt counts once.
        assert!(b.failed("j#1", at(0), &POLICY));
        assert!(!b.failed("j#1", at(1), &POLICY));
        assert!(b.failed("j#2", at(1_000), &POLICY));
        assert!(b.failed("j#3", at(10_500), &POLICY));
        assert_eq!((b.failures.len(), b.open_until), (2, None));
        assert!(b.failed("j#4", at(10_900), &POLICY));
        assert_eq!((b.open_until, b.trips), (Some(at(40_900)), 1));
        assert_eq!(
            b.admit(at(40_899), &POLICY),
            Admission::Skip { until: at(40_900) }
        );
        assert_eq!(b.state(at(40_899), &POLICY), BreakerState::Open);
        // After the cooldown: one probe; while it runs (within its lease) others wait.
        assert_eq!(b.admit(at(41_000), &POLICY), Admission::Probe);
        b.start_probe(at(41_000));
        assert_eq!(
            b.admit(at(42_000), &POLICY),
            Admission::Skip { until: at(44_000) },
            "the others look again within the probe's own timeout"
        );
        assert_eq!(
            b.admit(at(45_000), &POLICY),
            Admission::Skip { until: at(46_000) },
            "not past the probe's lease"
        );
        assert_eq!(b.state(at(42_000), &POLICY), BreakerState::Probing);
        assert_eq!(
            b.admit(at(46_000), &POLICY),
            Admission::Probe,
            "a probe whose worker died"
        );
        // A failed probe opens it again at once; an answer closes it.
        assert!(b.failed("j#5", at(42_000), &POLICY));
        assert_eq!(
            (b.open_until, b.trips, b.probe_since),
            (Some(at(72_000)), 2, None)
        );
        assert!(b.answered());
        assert_eq!(b.admit(at(42_001), &POLICY), Admission::Call);
        assert!(!b.answered(), "closed already: nothing to write");
        assert_eq!(b.trips, 2);
        // Off: never opens.
        let off = BreakerPolicy {
            threshold: 0,
            ..POLICY
        };
        let mut b = Breaker::default();
        for n in 0..10 {
            assert!(!b.failed(&format!("j#{n}"), at(n), &off));
        }
        assert_eq!(b.admit(at(10), &off), Admission::Call);
    }

    #[test]
    fn a_refusal_of_the_request_moves_no_breaker_either_way() {
        let mut b = Breaker::default();
        assert!(b.saw(Health::Failing, "j#1", at(0), &POLICY));
        assert!(b.saw(Health::Failing, "j#2", at(1), &POLICY));
        // An owner's bad requests between the failures neither count nor clear them.
        assert!(!b.saw(Health::Silent, "j#3", at(2), &POLICY));
        assert_eq!(b.failures.len(), 2);
        assert!(b.saw(Health::Failing, "j#4", at(3), &POLICY));
        assert_eq!(b.trips, 1);
        assert!(b.saw(Health::Answered, "j#5", at(40_000), &POLICY));
        assert!(b.is_clean());
        assert_eq!(Health::of_failure("provider_refused"), Health::Silent);
        assert_eq!(Health::of_refusal(401, "provider_refused"), Health::Failing);
        assert_eq!(Health::of_refusal(400, "provider_refused"), Health::Silent);
        assert_eq!(Health::of_failure("output_not_json"), Health::Answered);
        assert_eq!(Health::of_failure("rate_limited"), Health::Failing);
    }
}
