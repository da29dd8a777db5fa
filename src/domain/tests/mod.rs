//! The transitions' own tests, and the model every store is held to: no sequence of transitions, repeats
//! included, breaks an invariant.

mod failover;
mod model;
mod repeats;
mod transitions;

use chrono::{Duration, TimeZone, Utc};
use serde_json::json;

use super::*;

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
