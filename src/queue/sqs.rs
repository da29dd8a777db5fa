//! The SQS adapter: one message per attempt, its body the JSON of a [`Message`]
//! (`{"job_id": "job_…", "attempt": 1, "provider": "openai"}`), the sender's trace context in its `traceparent`
//! attribute. The queue's visibility timeout must exceed the worker's longest listen;
//! a message delivered twice is dropped by the claim.

use async_trait::async_trait;
use chrono::Duration;

use super::{DispatchError, Dispatcher, Message};
use crate::telemetry::trace;

/// The longest delay SQS gives one message.
const MAX_DELAY_SECONDS: i64 = 900;

#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsQueue {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        Self {
            client,
            queue_url: queue_url.into(),
        }
    }

    /// The message a body holds.
    pub fn parse(body: &str) -> Result<Message, serde_json::Error> {
        serde_json::from_str(body)
    }
}

#[async_trait]
impl Dispatcher for SqsQueue {
    async fn dispatch(&self, message: &Message, delay: Duration) -> Result<(), DispatchError> {
        let attempt = &message.attempt;
        let body = serde_json::to_string(message).expect("a message always serialises");
        // Whole seconds, rounded up (never sooner than asked), at most SQS's 15 minutes: a message that comes
        // earlier than its attempt may run is sent again by the worker with the time that is left.
        let millis = delay.num_milliseconds().max(0);
        let seconds = ((millis + 999) / 1000).min(MAX_DELAY_SECONDS);
        let traceparent = aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(trace::traceparent(&attempt.job_id))
            .build()
            .expect("data type set");
        self.client
            .send_message()
            .queue_url(&self.queue_url)
            .message_body(body)
            .message_attributes(trace::TRACEPARENT, traceparent)
            .delay_seconds(i32::try_from(seconds).expect("at most 900"))
            .send()
            .await
            .map_err(|e| DispatchError(Box::new(e)))?;
        Ok(())
    }
}
