//! The pure core: identifiers, the intent's fingerprint, jobs, attempts and their transitions. No I/O, no async.
//!
//! - [`job`]: the job, its status, and every transition (all in one place, each whole or refused).
//! - [`attempt`]: one try at a job and its states.
//! - [`failover`]: where a job goes after an attempt ends without a result.
//! - [`write`](mod@write): what a transition is given (the writer's stamp) and what it answers.
//! - [`report`]: the bounded error and call report kept on an attempt.
//! - [`ids`], [`fingerprint`], [`qualification`]: names, the intent's fingerprint, providers' standing.
//! - [`breaker`]: a provider's breaker, shared by every worker through the store.
//! - [`event`]: completion events, their endpoint, signature and deliveries.

pub mod attempt;
pub mod breaker;
pub mod event;
pub mod failover;
pub mod fingerprint;
pub mod ids;
pub mod job;
pub mod qualification;
pub mod report;
pub mod write;

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
#[cfg(test)]
mod tests;

pub use attempt::{Attempt, AttemptRef, AttemptState};
pub use breaker::{Admission, Breaker, BreakerPolicy};
pub use event::{Deliveries, Endpoint, EventDelivery, SinkKind};
pub use failover::{Failover, FailoverDecision, RetryLimits, RetryPolicy};
pub use fingerprint::Fingerprint;
pub use ids::{ContractRef, IdempotencyKey, JobId, Owner, ParseError, ProviderName, WriteToken};
pub use job::{Job, JobStatus, MAX_INPUT_BYTES, NewJob, Timestamp, expiry};
pub use qualification::{ContractStanding, Qualification, RunEvidence, Standing, Suspicion};
pub use report::{CallReport, ErrorInfo};
pub use write::{AttemptCancel, Completion, JobCancel, Refusal, Stamp};
