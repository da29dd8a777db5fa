//! The dispatch port: how an attempt reaches a worker. A message names (job id, attempt number), the attempt's
//! provider as the sender knew it, and the sender's trace context; the worker reads everything else from the store.
//! Adapters: [`local`] (in-process channel), [`sqs`].
//!
//! Delivery is at least once. A message that is lost is found again by the sweeper (a `queued` attempt nobody
//! claimed); one delivered twice is dropped by the claim.

pub mod local;
pub mod sqs;

use std::fmt::Debug;

use async_trait::async_trait;
use chrono::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::{AttemptRef, ProviderName};

#[derive(Debug, thiserror::Error)]
#[error("the attempt could not be dispatched")]
pub struct DispatchError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// What a message says: the attempt, and the provider it runs on as its sender knew it (absent from older senders):
/// a worker that finds that provider's breaker open can wait without claiming the attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    #[serde(flatten)]
    pub attempt: AttemptRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ProviderName>,
    /// The reconciler's: ask the attempt's provider about its call, which is `unknown` (never call it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub look_up: bool,
}

impl Message {
    pub fn new(attempt: AttemptRef, provider: Option<ProviderName>) -> Self {
        Self {
            attempt,
            provider,
            look_up: false,
        }
    }

    /// The reconciler's question about `attempt`'s call, for a worker to ask its provider.
    pub fn look_up(attempt: AttemptRef) -> Self {
        Self {
            attempt,
            provider: None,
            look_up: true,
        }
    }
}

/// A message as a worker receives it, with the W3C `traceparent` of the step that sent it, or of the job's root
/// where the sender exports no traces (absent from a sender that carried none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub message: Message,
    pub traceparent: Option<String>,
}

#[async_trait]
pub trait Dispatcher: Send + Sync + Debug {
    /// Hands the message to a worker, once `delay` has passed (a retry's wait; zero for everything else), with its
    /// job's trace context ([`crate::telemetry::trace::traceparent`]).
    async fn dispatch(&self, message: &Message, delay: Duration) -> Result<(), DispatchError>;
}
