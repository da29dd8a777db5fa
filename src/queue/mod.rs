//! The dispatch port: how an attempt reaches a worker. A message names (job id, attempt number) and nothing else
//! but the sender's trace context; the worker reads everything else from the store. Adapters: [`local`] (in-process channel), [`sqs`].
//!
//! Delivery is at least once. A message that is lost is found again by the sweeper (a `queued` attempt nobody
//! claimed); one delivered twice is dropped by the claim.

pub mod local;
pub mod sqs;

use std::fmt::Debug;

use async_trait::async_trait;
use chrono::Duration;

use crate::domain::AttemptRef;

#[derive(Debug, thiserror::Error)]
#[error("the attempt could not be dispatched")]
pub struct DispatchError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// A message as a worker receives it: the attempt, and the W3C `traceparent` of the step that sent it, or of the
/// job's root where the sender exports no traces (absent from a sender that carried none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub attempt: AttemptRef,
    pub traceparent: Option<String>,
}

#[async_trait]
pub trait Dispatcher: Send + Sync + Debug {
    /// Hands the attempt to a worker, once `delay` has passed (a retry's wait; zero for everything else), with its
    /// job's trace context ([`crate::telemetry::trace::traceparent`]).
    async fn dispatch(&self, attempt: &AttemptRef, delay: Duration) -> Result<(), DispatchError>;
}
