//! The sweeper's writes and queries: `started` attempts past their lease become `unknown`, `queued` attempts nobody
//! claimed are dispatched again (recorded first, so that the next sweep waits its turn), jobs past their retention
//! go. The loop around them is `worker::sweeper`.

use super::Engine;
use crate::domain::{AttemptRef, WriteToken};
use crate::queue::Message;
use crate::store::StoreError;

impl Engine {
    /// The sweeper's time-out of a `started` attempt whose lease ended. Whether it wrote (its worker may have got
    /// there first).
    pub async fn expire_lease(&self, attempt: &AttemptRef) -> Result<bool, StoreError> {
        let token = WriteToken::new();
        let written = self
            .mark_unknown(attempt, None, &token, self.write_deadline())
            .await?;
        if written.is_some() {
            tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, "lease expired: attempt unknown");
        }
        Ok(written.is_some())
    }

    /// The sweeper's second dispatch of a `queued` attempt nobody claimed: recorded first, so the next sweep waits
    /// its turn, then sent. Whether it was sent.
    pub async fn redispatch(&self, attempt: &AttemptRef) -> Result<bool, StoreError> {
        self.dispatch_again(attempt, chrono::Duration::zero()).await
    }

    /// Sends a `queued` attempt's message again, delivered after `delay`, recorded first (at its sending time), so
    /// that the sweeper does not send it once more meanwhile. Whether it was sent.
    pub(super) async fn dispatch_again(
        &self,
        attempt: &AttemptRef,
        delay: chrono::Duration,
    ) -> Result<bool, StoreError> {
        let token = WriteToken::new();
        let recorded = self
            .persist(
                "re-dispatch",
                &token,
                self.write_deadline(),
                |stamp| async move {
                    self.store
                        .redispatch(&attempt.job_id, attempt.number, stamp.now)
                        .await
                },
            )
            .await;
        let job = match recorded {
            Ok(job) => job,
            Err(StoreError::Refused(_) | StoreError::NotFound) => return Ok(false),
            Err(e) => return Err(e),
        };
        let provider = job.attempt(attempt.number).map(|a| a.provider.clone());
        match self
            .dispatcher
            .dispatch(&Message::new(attempt.clone(), provider), delay)
            .await
        {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, error = %e, "re-dispatch failed; the next sweep tries again");
                Ok(false)
            }
        }
    }

    /// `started` attempts whose lease ended before now, oldest first, for the sweeper.
    pub async fn expired_leases(&self) -> Result<Vec<AttemptRef>, StoreError> {
        let now = self.clock.now();
        self.store
            .expired_leases(now, self.settings.sweep_batch)
            .await
    }

    /// `queued` attempts nobody claimed since `redispatch_after`, oldest first, for the sweeper.
    pub async fn stale_queued(&self) -> Result<Vec<AttemptRef>, StoreError> {
        let now = self.clock.now();
        self.store
            .stale_queued(
                now - self.settings.redispatch_after,
                now,
                self.settings.sweep_batch,
            )
            .await
    }

    /// Deletes a batch of jobs past their retention (where the store does not do it by itself); how many.
    pub async fn purge_expired(&self) -> Result<usize, StoreError> {
        self.store
            .purge_expired(self.clock.now(), self.settings.sweep_batch)
            .await
    }
}
