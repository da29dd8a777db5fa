//! Where completion events go: the [`Sink`] port and its adapters, as `providers` is the port of model calls and
//! `queue` the port of messages.
//!
//! - [`endpoint`]: the owner's webhook — a signed POST through a client of its own, whose resolver reaches only
//!   globally routable addresses, that follows no redirect and takes no proxy from the environment; the address
//!   guard that registration applies too.
//! - [`bus`]: the deployment's EventBridge bus — one `PutEvents` entry.
//!
//! A try's [`Outcome`] says what happened on the wire, typed: the deliverer (`engine::deliveries`) records it and
//! decides what follows.

pub mod bus;
pub mod endpoint;

use std::fmt::Debug;

use async_trait::async_trait;

use crate::domain::{Endpoint, EventDelivery, SinkKind};
use crate::metrics::EventTry;

/// What one try of an event at one sink came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The endpoint answered 2xx; the bus took the entry. No more tries.
    Delivered,
    /// It answered, and did not take it (another status, the bus's error code): tried again after a backoff.
    Rejected(String),
    /// No answer: no connection, a name that does not resolve, nothing within the timeout.
    Unreachable(String),
    /// Not sent: the endpoint's address is not one onejob reaches (or this process has no client for the sink).
    Refused(String),
}

impl Outcome {
    /// Why the event was not delivered; `None` once it was.
    pub fn error(&self) -> Option<&str> {
        match self {
            Self::Delivered => None,
            Self::Rejected(why) | Self::Unreachable(why) | Self::Refused(why) => Some(why),
        }
    }

    /// The outcome's label on `onejob_event_tries_total`.
    pub fn metric(&self) -> EventTry {
        match self {
            Self::Delivered => EventTry::Delivered,
            Self::Rejected(_) => EventTry::Rejected,
            Self::Unreachable(_) => EventTry::Unreachable,
            Self::Refused(_) => EventTry::Refused,
        }
    }
}

/// One place completion events go.
#[async_trait]
pub trait Sink: Send + Sync + Debug {
    fn kind(&self) -> SinkKind;

    /// One try of `event`, whose JSON is `body`; `endpoint` is the owner's, for a sink that posts to it.
    async fn put(
        &self,
        event: &EventDelivery,
        body: &serde_json::Value,
        endpoint: Option<&Endpoint>,
    ) -> Outcome;
}

/// The sinks of a deployment: every owner's endpoint, and the bus if the config names one and this process delivers
/// to it (the sweeper, or the local server).
#[derive(Debug)]
pub struct Sinks {
    pub endpoint: endpoint::EndpointSink,
    pub bus: Option<bus::BusSink>,
}

impl Sinks {
    /// The sinks an event of a job whose owner has (or has not) an endpoint goes to.
    pub fn for_owner(&self, has_endpoint: bool) -> Vec<&dyn Sink> {
        let endpoint = has_endpoint.then_some(&self.endpoint as &dyn Sink);
        let bus = self.bus.as_ref().map(|bus| bus as &dyn Sink);
        endpoint.into_iter().chain(bus).collect()
    }

    /// The sink of `kind`, if this process has it.
    pub fn get(&self, kind: SinkKind) -> Option<&dyn Sink> {
        match kind {
            SinkKind::Endpoint => Some(&self.endpoint),
            SinkKind::Bus => self.bus.as_ref().map(|bus| bus as &dyn Sink),
        }
    }
}
