//! Fixtures for the domain's tests and for the service's own unit tests (`onejob` builds this module with the
//! `fixtures` feature in its tests): a moment, a writer's stamp, a provider, a failover, a job.

use chrono::{Duration, TimeZone, Utc};
use serde_json::json;

use super::*;

pub fn at(ms: i64) -> Timestamp {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
}

/// A write by a writer of its own, at `ms`.
pub fn by(ms: i64) -> Stamp {
    Stamp::fresh(at(ms))
}

pub fn provider(name: &str) -> ProviderName {
    ProviderName::parse(name).unwrap()
}

/// Failover to any of `qualified`.
pub fn to(qualified: &[&str]) -> Failover {
    Failover {
        qualified: qualified.iter().map(|p| provider(p)).collect(),
        max_attempts: Failover::DEFAULT_MAX_ATTEMPTS,
        retry: None,
        jitter_permille: 0,
        budget: None,
    }
}

pub fn nowhere() -> Failover {
    to(&[])
}

pub fn job() -> Job {
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
