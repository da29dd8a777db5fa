//! Creates in flight in this process, by intent (owner, key): a create whose intent is already being written waits
//! for that write and answers from the job it made or found — a double click costs the store one write, not two.
//! Its answer comes after the commit it waited for, so nothing is acknowledged before it is durable; if the first
//! create fails (or its caller goes away), the ones waiting write for themselves.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::domain::{IdempotencyKey, Job, Owner};

type Intent = (Owner, IdempotencyKey);

#[derive(Debug, Default)]
pub(super) struct InFlight {
    creates: Mutex<HashMap<Intent, watch::Receiver<Option<Job>>>>,
}

/// A create's turn: to write (and tell the others), or to wait for the one writing.
pub(super) enum Turn<'a> {
    Lead(Lead<'a>),
    Follow(watch::Receiver<Option<Job>>),
}

/// The create that writes for its intent; the intent is free again when it is dropped.
pub(super) struct Lead<'a> {
    flight: &'a InFlight,
    intent: Intent,
    done: watch::Sender<Option<Job>>,
}

impl InFlight {
    pub(super) fn join(&self, owner: &Owner, key: &IdempotencyKey) -> Turn<'_> {
        let intent = (owner.clone(), key.clone());
        let mut creates = self.creates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(leader) = creates.get(&intent) {
            return Turn::Follow(leader.clone());
        }
        let (done, seen) = watch::channel(None);
        creates.insert(intent.clone(), seen);
        Turn::Lead(Lead {
            flight: self,
            intent,
            done,
        })
    }
}

impl Lead<'_> {
    /// The job the write made or found under the intent: the waiting creates answer from it.
    pub(super) fn finish(self, job: &Job) {
        self.done.send_replace(Some(job.clone()));
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        let mut creates = self
            .flight
            .creates
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        creates.remove(&self.intent);
    }
}

/// The job the leading create made or found; `None` if it ended without one.
pub(super) async fn led_by(mut leader: watch::Receiver<Option<Job>>) -> Option<Job> {
    leader
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|job| job.clone())
}
