//! The in-process queue of the local server: an unbounded channel read by the local worker loop.

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{DispatchError, Dispatcher};
use crate::domain::AttemptRef;

#[derive(Debug, Clone)]
pub struct LocalQueue(mpsc::UnboundedSender<AttemptRef>);

impl LocalQueue {
    /// The queue and the receiving end the worker loop reads.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<AttemptRef>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (Self(sender), receiver)
    }
}

#[async_trait]
impl Dispatcher for LocalQueue {
    async fn dispatch(&self, attempt: &AttemptRef) -> Result<(), DispatchError> {
        self.0
            .send(attempt.clone())
            .map_err(|e| DispatchError(Box::new(e)))
    }
}
