//! The transitions' own tests, and the model every store is held to: no sequence of transitions, repeats
//! included, breaks an invariant. The fixtures here serve the store adapters' own unit tests too.

mod failover;
mod model;
mod repeats;
mod transitions;

use chrono::{Duration, TimeZone, Utc};
use serde_json::json;

use super::*;

pub(crate) fn at(ms: i64) -> Timestamp {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
}

/// A write by a writer of its own, at `ms`.
pub(crate) fn by(ms: i64) -> Stamp {
    Stamp::fresh(at(ms))
}

pub(crate) fn provider(name: &str) -> ProviderName {
    ProviderName::parse(name).unwrap()
}

/// Failover to any of `qualified`.
pub(crate) fn to(qualified: &[&str]) -> Failover {
    Failover {
        qualified: qualified.iter().map(|p| provider(p)).collect(),
        max_attempts: Failover::DEFAULT_MAX_ATTEMPTS,
        retry: None,
        jitter_permille: 0,
    }
}

pub(crate) fn nowhere() -> Failover {
    to(&[])
}

pub(crate) fn job() -> Job {
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

/// [`job`] whose attempt 1 was claimed at `by(1)` and failed at `by(2)` with nowhere to fail over: `failed`.
fn failed_job() -> Job {
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
    job
}
