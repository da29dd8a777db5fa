//! Who in this process waits for which job: a change wakes only those watching that job, so a thousand long polls
//! cost nothing while other jobs move. A watch sees every change made after it began (a counter per job, never a
//! queue that can lag); changes made by other processes are not here — a waiter also looks again from time to time.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

use crate::domain::JobId;

#[derive(Debug, Default)]
pub(super) struct Changes {
    watched: Mutex<HashMap<JobId, watch::Sender<u64>>>,
}

/// One waiter on one job; dropping it stops watching.
#[derive(Debug)]
pub struct JobWatch<'a> {
    changes: &'a Changes,
    id: JobId,
    seen: Option<watch::Receiver<u64>>,
}

impl Changes {
    pub(super) fn watch(&self, id: &JobId) -> JobWatch<'_> {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let seen = watched
            .entry(id.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        JobWatch {
            changes: self,
            id: id.clone(),
            seen: Some(seen),
        }
    }

    pub(super) fn changed(&self, id: &JobId) {
        let watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counter) = watched.get(id) {
            counter.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl JobWatch<'_> {
    /// Returns once the job changed in this process after the watch began, or after the last return.
    pub async fn changed(&mut self) {
        if let Some(seen) = &mut self.seen {
            // The sender stays in the map while any watch of the job lives: it cannot close.
            let _ = seen.changed().await;
        }
    }
}

impl Drop for JobWatch<'_> {
    fn drop(&mut self) {
        drop(self.seen.take());
        let mut watched = self
            .changes
            .watched
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if watched
            .get(&self.id)
            .is_some_and(|counter| counter.receiver_count() == 0)
        {
            watched.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    fn id(n: u8) -> JobId {
        JobId::parse(&format!("job_{n:0>32}")).unwrap()
    }

    #[tokio::test]
    async fn a_change_wakes_the_watches_of_its_job_only_and_none_is_missed() {
        let changes = Changes::default();
        let (a, b) = (id(1), id(2));
        let mut on_a = changes.watch(&a);
        let mut also_on_a = changes.watch(&a);
        let mut on_b = changes.watch(&b);
        // Made before anyone waits, seen when they do.
        changes.changed(&a);
        on_a.changed().await;
        also_on_a.changed().await;
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        {
            let waiting = std::pin::pin!(on_b.changed());
            assert!(
                waiting.poll(&mut cx).is_pending(),
                "a change of another job wakes nobody here"
            );
        }
        drop((on_a, also_on_a, on_b));
        assert!(
            changes.watched.lock().unwrap().is_empty(),
            "no watch, no entry"
        );
        // With nobody watching, a change costs a lookup.
        changes.changed(&a);
    }
}
