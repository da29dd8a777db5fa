//! Who in this process waits for which job: a change wakes only those watching that job, so a thousand long polls
//! cost nothing while other jobs move. A watch sees every change made after it began (a watch channel per job, never a
//! queue that can lag); changes made by other processes are not here — a waiter also looks again from time to time.
//!
//! A change that makes the job final (`Job::is_final`: no write can change it any more) carries the job as it then
//! is: that copy is what any later read would show until the job expires, so its waiters need not read it. Notices
//! of other changes may arrive out of order (each writer notifies after its own commit), so they carry nothing, and
//! a later notice never replaces the final copy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::domain::{Job, JobId};

#[derive(Debug, Default)]
pub(super) struct Changes {
    /// Per watched job, what its watchers were told: every change wakes them (`send_modify` always does), and the
    /// value is the job once a change made it final.
    watched: Mutex<HashMap<JobId, watch::Sender<Option<Arc<Job>>>>>,
}

/// One waiter on one job; dropping it stops watching.
#[derive(Debug)]
pub struct JobWatch<'a> {
    changes: &'a Changes,
    id: JobId,
    seen: Option<watch::Receiver<Option<Arc<Job>>>>,
}

impl Changes {
    pub(super) fn watch(&self, id: &JobId) -> JobWatch<'_> {
        let mut watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        let seen = watched
            .entry(id.clone())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        JobWatch {
            changes: self,
            id: id.clone(),
            seen: Some(seen),
        }
    }

    /// Job `id` changed; `last` is the job after the change if that made it final.
    pub(super) fn changed(&self, id: &JobId, last: impl FnOnce() -> Option<Job>) {
        let watched = self.watched.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notices) = watched.get(id) {
            notices.send_modify(|kept| {
                if kept.is_none() {
                    *kept = last().map(Arc::new);
                }
            });
        }
    }
}

impl JobWatch<'_> {
    /// Returns once the job changed in this process after the watch began, or after the last return: with the job
    /// as it is for good, if a change made it final (else the waiter reads the job itself).
    pub async fn changed(&mut self) -> Option<Arc<Job>> {
        let seen = self.seen.as_mut()?;
        // The sender stays in the map while any watch of the job lives: it cannot close.
        let _ = seen.changed().await;
        seen.borrow_and_update().clone()
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
            .is_some_and(|notices| notices.receiver_count() == 0)
        {
            watched.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;
    use crate::domain::fixtures::job;

    fn id(n: u8) -> JobId {
        JobId::parse(&format!("job_{n:0>32}")).unwrap()
    }

    /// The change that makes a job final brings it along; a notice that arrives after it (another writer's, sent
    /// late) wakes the waiters but never replaces it, and any other change brings nothing.
    #[tokio::test]
    async fn the_change_that_makes_a_job_final_brings_it_and_a_late_notice_keeps_it() {
        let changes = Changes::default();
        let done = job();
        let mut watch = changes.watch(&done.id);
        changes.changed(&done.id, || None);
        assert!(watch.changed().await.is_none(), "not final: read it");
        changes.changed(&done.id, || Some(done.clone()));
        assert_eq!(watch.changed().await.as_deref(), Some(&done));
        changes.changed(&done.id, || None);
        assert_eq!(watch.changed().await.as_deref(), Some(&done));
        // A watch that begins later starts from the copy too.
        let mut later = changes.watch(&done.id);
        changes.changed(&done.id, || None);
        assert_eq!(later.changed().await.as_deref(), Some(&done));
    }

    #[tokio::test]
    async fn a_change_wakes_the_watches_of_its_job_only_and_none_is_missed() {
        let changes = Changes::default();
        let (a, b) = (id(1), id(2));
        let mut on_a = changes.watch(&a);
        let mut also_on_a = changes.watch(&a);
        let mut on_b = changes.watch(&b);
        // Made before anyone waits, seen when they do.
        changes.changed(&a, || None);
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
        // With nobody watching, a change costs a lookup (and never makes the job's copy).
        changes.changed(&a, || unreachable!("nobody watches"));
    }
}
