//! The in-process queue of the local server: an unbounded channel read by the local worker loop. A delayed
//! message is held on the engine's clock, then sent.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::Duration;
use tokio::sync::mpsc;

use super::{Delivery, DispatchError, Dispatcher, Message};
use crate::clock::Clock;
use crate::telemetry::trace;

#[derive(Debug, Clone)]
pub struct LocalQueue {
    sender: mpsc::UnboundedSender<Delivery>,
    clock: Arc<dyn Clock>,
}

impl LocalQueue {
    /// The queue, delaying on `clock`, and the receiving end the worker loop reads.
    pub fn new(clock: Arc<dyn Clock>) -> (Self, mpsc::UnboundedReceiver<Delivery>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Self { sender, clock }, receiver)
    }
}

#[async_trait]
impl Dispatcher for LocalQueue {
    async fn dispatch(&self, message: &Message, delay: Duration) -> Result<(), DispatchError> {
        let delivery = Delivery {
            message: message.clone(),
            traceparent: Some(trace::traceparent(&message.attempt.job_id)),
        };
        if delay <= Duration::zero() {
            return self
                .sender
                .send(delivery)
                .map_err(|e| DispatchError(Box::new(e)));
        }
        // Held in memory, as a broker holds a delayed message: lost with the process, and then found again by the
        // sweeper (a `queued` attempt nobody claimed since its time).
        let (sender, wait) = (self.sender.clone(), self.clock.sleep(delay));
        tokio::spawn(async move {
            wait.await;
            let _ = sender.send(delivery);
        });
        Ok(())
    }
}
