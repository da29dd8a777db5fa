//! The sweeper step, run every few seconds by the local server (and by a scheduled Lambda): `started` attempts
//! whose lease expired become `unknown` (never `failed`: the provider may have done the work), and `queued`
//! attempts that nobody claimed are dispatched again (the claim drops any duplicate).

use std::sync::Arc;

use chrono::Duration;

use crate::domain::AttemptState;
use crate::engine::Engine;
use crate::store::StoreError;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// `started` attempts past their lease, now `unknown`.
    pub expired: usize,
    /// `queued` attempts dispatched again.
    pub redispatched: usize,
}

pub async fn sweep(engine: &Engine) -> Result<Swept, StoreError> {
    let now = engine.clock.now();
    let batch = engine.settings.sweep_batch;
    let mut swept = Swept::default();
    for attempt in engine.store.expired_leases(now, batch).await? {
        match engine
            .store
            .mark_unknown(&attempt.job_id, attempt.number, now)
            .await
        {
            Ok(job) => {
                tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, "lease expired: attempt unknown");
                engine.metrics.attempt(AttemptState::Unknown);
                engine.changed(&job);
                swept.expired += 1;
            }
            // Its worker got there first.
            Err(StoreError::Refused(_)) => {}
            Err(e) => return Err(e),
        }
    }
    let queued_before = now - engine.settings.redispatch_after;
    for attempt in engine.store.stale_queued(queued_before, batch).await? {
        match engine.dispatcher.dispatch(&attempt).await {
            Ok(()) => swept.redispatched += 1,
            Err(e) => {
                tracing::warn!(job_id = %attempt.job_id, attempt = attempt.number, error = %e, "re-dispatch failed")
            }
        }
    }
    if swept != Swept::default() {
        tracing::info!(
            expired = swept.expired,
            redispatched = swept.redispatched,
            "sweep"
        );
    }
    Ok(swept)
}

/// Sweeps every `interval` of the engine's clock, forever.
pub async fn run_local(engine: Arc<Engine>, interval: Duration) {
    loop {
        if let Err(e) = sweep(&engine).await {
            tracing::error!(error = %crate::telemetry::error_chain(&e), "sweep failed");
        }
        engine.clock.sleep(interval).await;
    }
}
