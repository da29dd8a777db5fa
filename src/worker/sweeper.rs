//! The sweeper step, run every few seconds by the local server (and by a scheduled Lambda): `started` attempts
//! whose lease expired become `unknown` (never `failed`: the provider may have done the work), `queued` attempts
//! that nobody claimed are dispatched again (the claim drops any duplicate), and jobs past their retention go.

use std::sync::Arc;

use chrono::Duration;

use crate::engine::Engine;
use crate::store::StoreError;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// `started` attempts past their lease, now `unknown`.
    pub expired: usize,
    /// `queued` attempts dispatched again (each at most once per `redispatch_after`).
    pub redispatched: usize,
    /// Jobs past their retention deleted (SQLite; DynamoDB's TTL deletes by itself).
    pub purged: usize,
}

pub async fn sweep(engine: &Engine) -> Result<Swept, StoreError> {
    let mut swept = Swept::default();
    for attempt in engine.expired_leases().await? {
        if engine.expire_lease(&attempt).await? {
            swept.expired += 1;
        }
    }
    for attempt in engine.stale_queued().await? {
        if engine.redispatch(&attempt).await? {
            swept.redispatched += 1;
        }
    }
    swept.purged = engine.purge_expired().await?;
    if swept != Swept::default() {
        tracing::info!(
            expired = swept.expired,
            redispatched = swept.redispatched,
            purged = swept.purged,
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
