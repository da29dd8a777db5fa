//! The transitions' own tests, and the model every store is held to: no sequence of transitions, repeats
//! included, breaks an invariant (the fixtures are `domain::fixtures`).

mod bill;
mod failover;
mod model;
mod repeats;
mod transitions;

use chrono::Duration;
use serde_json::json;

pub(crate) use super::fixtures::*;
use super::*;

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
