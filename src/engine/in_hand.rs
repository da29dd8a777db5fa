//! The deliveries this process's batches hold (the domain's rule, [`Hand`]), so that the batches run side by side:
//! a job's deliveries are held by one batch at a time, an owner's endpoint is tried at most [`ENDPOINT_IN_FLIGHT`]
//! times at once across the batches, and the process sends at most [`DELIVERIES_IN_FLIGHT`] at once.

use std::sync::Mutex;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::domain::event::{ENDPOINT_IN_FLIGHT, Hand};
use crate::domain::{JobId, Owner};

/// How many deliveries one process makes at once.
pub(super) const DELIVERIES_IN_FLIGHT: usize = 64;

#[derive(Debug)]
pub(super) struct InHand {
    hand: Mutex<Hand<JobId, Owner>>,
    sends: Semaphore,
}

impl Default for InHand {
    fn default() -> Self {
        Self {
            hand: Mutex::default(),
            sends: Semaphore::new(DELIVERIES_IN_FLIGHT),
        }
    }
}

/// A job's deliveries in a batch's hand until this is dropped.
pub(super) struct Job<'a> {
    in_hand: &'a InHand,
    id: JobId,
}

/// A try at an owner's endpoint, counted until this is dropped.
pub(super) struct Try<'a> {
    in_hand: &'a InHand,
    owner: Owner,
}

impl InHand {
    fn hand(&self) -> std::sync::MutexGuard<'_, Hand<JobId, Owner>> {
        self.hand.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Job `id`'s deliveries for this batch, unless another batch has them.
    pub(super) fn take(&self, id: &JobId) -> Option<Job<'_>> {
        self.hand().take(id).then(|| Job {
            in_hand: self,
            id: id.clone(),
        })
    }

    /// A try at `owner`'s endpoint, unless [`ENDPOINT_IN_FLIGHT`] of them are in flight already, and then a turn
    /// among the process's sends.
    pub(super) async fn try_endpoint(
        &self,
        owner: &Owner,
    ) -> Option<(Try<'_>, SemaphorePermit<'_>)> {
        if !self.hand().start(owner, ENDPOINT_IN_FLIGHT) {
            return None;
        }
        let counted = Try {
            in_hand: self,
            owner: owner.clone(),
        };
        let send = self.sends.acquire().await.expect("never closed");
        Some((counted, send))
    }
}

impl Drop for Job<'_> {
    fn drop(&mut self) {
        self.in_hand.hand().release(&self.id);
    }
}

impl Drop for Try<'_> {
    fn drop(&mut self) {
        self.in_hand.hand().end(&self.owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_is_one_batchs_and_an_endpoint_takes_its_tries_at_most() {
        let in_hand = InHand::default();
        let (bob, alice) = (Owner::parse("bob").unwrap(), Owner::parse("alice").unwrap());
        let key = crate::domain::IdempotencyKey::parse("k").unwrap();
        let id = JobId::derive(&bob, &key, chrono::Utc::now());
        let first = in_hand.take(&id).expect("free");
        assert!(in_hand.take(&id).is_none(), "another batch holds it");
        drop(first);
        assert!(in_hand.take(&id).is_some(), "free again");

        let mut tries = Vec::new();
        for _ in 0..ENDPOINT_IN_FLIGHT {
            tries.push(in_hand.try_endpoint(&bob).await.expect("within its tries"));
        }
        assert!(
            in_hand.try_endpoint(&bob).await.is_none(),
            "bob's are all out"
        );
        assert!(
            in_hand.try_endpoint(&alice).await.is_some(),
            "alice's are hers"
        );
        tries.pop();
        assert!(in_hand.try_endpoint(&bob).await.is_some(), "one came back");
        drop(tries);
        assert!(in_hand.hand().is_empty(), "nothing kept once all is done");
    }
}
