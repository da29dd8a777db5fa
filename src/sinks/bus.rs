//! The EventBridge bus (`event_bus`): every settled job's event, as one `PutEvents` entry — source `onejob`,
//! detail-type `job.settled`, the endpoint's body as the detail (a result is at most 64 KiB, so it always fits the
//! entry's 256 KiB), the settle as its time. A lost answer makes a second entry with the same event id: the
//! receiver drops it, as it drops an endpoint's repeats.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;

use super::{Outcome, Sink};
use serde_json::Value;

use crate::domain::{Endpoint, EventDelivery, SinkKind};

#[derive(Debug)]
pub struct BusSink {
    /// The bus, by name or ARN.
    name: String,
    /// `None` in a process that does not deliver (the API and worker functions): a try there is refused.
    client: Option<aws_sdk_eventbridge::Client>,
    /// How long one `PutEvents` may take.
    timeout: Duration,
}

impl BusSink {
    pub fn new(
        name: String,
        client: Option<aws_sdk_eventbridge::Client>,
        timeout: Duration,
    ) -> Self {
        Self {
            name,
            client,
            timeout,
        }
    }
}

#[async_trait]
impl Sink for BusSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Bus
    }

    async fn put(&self, event: &EventDelivery, body: &Value, _: Option<&Endpoint>) -> Outcome {
        let Some(client) = &self.client else {
            return Outcome::Refused(
                "this process has no EventBridge client (the sweeper puts events on the bus)"
                    .into(),
            );
        };
        let entry = PutEventsRequestEntry::builder()
            .event_bus_name(&self.name)
            .source("onejob")
            .detail_type("job.settled")
            .detail(body.to_string())
            .time(aws_sdk_eventbridge::primitives::DateTime::from_millis(
                event.settled_at.timestamp_millis(),
            ))
            .build();
        let put =
            tokio::time::timeout(self.timeout, client.put_events().entries(entry).send()).await;
        match put {
            Err(_) => Outcome::Unreachable("no answer in time".into()),
            Ok(Err(e)) => Outcome::Unreachable(crate::telemetry::error_chain(&e).to_string()),
            Ok(Ok(answer)) => match answer.entries().first() {
                Some(entry) if entry.error_code().is_some() => Outcome::Rejected(format!(
                    "{}: {}",
                    entry.error_code().unwrap_or_default(),
                    entry.error_message().unwrap_or_default()
                )),
                _ if answer.failed_entry_count() > 0 => {
                    Outcome::Rejected("the bus refused the entry".into())
                }
                _ => Outcome::Delivered,
            },
        }
    }
}
