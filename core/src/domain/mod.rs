//! The pure core: identifiers, the intent's fingerprint, jobs, attempts and their transitions. No I/O, no async.
//!
//! - [`job`]: the job and every transition (all in one place, each whole or refused).
//! - [`status`]: its status and its settle, derived from its fields and attempts.
//! - [`attempt`]: one try at a job and its states.
//! - [`failover`]: where a job goes after an attempt ends without a result.
//! - [`write`](mod@write): what a transition is given (the writer's stamp) and what it answers;
//!   [`transition`]: each transition as a value, as a store applies it.
//! - [`report`]: the bounded error and call report kept on an attempt; [`bill`]: what an intent cost.
//! - [`ids`], [`fingerprint`], [`qualification`]: names, the intent's fingerprint, providers' standing.
//! - [`breaker`]: a provider's breaker, shared by every worker through the store.
//! - [`limits`]: what one owner may start (live jobs, creates a minute, a budget), and its ledger; [`slots`]: a
//!   provider's calls in flight.
//! - [`event`]: completion events, their endpoint, signature and deliveries.
//! - [`time`]: the one `Timestamp` every part keeps.

pub mod attempt;
pub mod bill;
pub mod breaker;
pub mod event;
pub mod failover;
pub mod fingerprint;
pub mod ids;
pub mod intervention;
pub mod job;
pub mod limits;
pub mod qualification;
pub mod report;
pub mod slots;
pub mod status;
pub mod time;
pub mod transition;
pub mod write;

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
#[cfg(test)]
mod tests;

pub use attempt::{Attempt, AttemptRef, AttemptState, Cleared, ClearedBy};
pub use bill::{Bill, Price, PriceTable, Share, amount};
pub use breaker::{Admission, Breaker, BreakerPolicy, BreakerState, Health};
pub use event::{Deliveries, Endpoint, EventDelivery, SinkKind};
pub use failover::{BUDGET_EXCEEDED, Failover, FailoverDecision, RetryLimits, RetryPolicy};
pub use fingerprint::Fingerprint;
pub use ids::{ContractRef, IdempotencyKey, JobId, Owner, ParseError, ProviderName, WriteToken};
pub use intervention::Intervention;
pub use job::{Job, MAX_INPUT_BYTES, NewJob, expiry};
pub use limits::{
    Bound, Budget, LimitReached, Limits, Live, OwnerLedger, OwnerLimits, Period, PeriodSpend,
    Place, Spend, Within,
};
pub use qualification::{ContractStanding, Qualification, RunEvidence, Standing, Suspicion};
pub use report::{CallReport, ErrorInfo};
pub use slots::CallSlots;
pub use status::JobStatus;
pub use time::Timestamp;
pub use transition::{Applied, Transition};
pub use write::{AttemptCancel, Completion, JobCancel, Refusal, Stamp};
