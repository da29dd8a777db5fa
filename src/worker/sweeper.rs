//! The sweeper step, run every few seconds by the local server (and by a scheduled Lambda): `started` attempts
//! whose lease expired become `unknown` (never `failed`: the provider may have done the work), `queued` attempts
//! that nobody claimed are dispatched again (the claim drops any duplicate), and jobs past their retention go. If the
//! deployment asks for it (`requalify_stale`), one provider whose qualification passed once and no longer stands is
//! qualified again per sweep. Completion events that are due go out.

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
    /// Qualifications run again (at most one per sweep, and only with `requalify_stale`).
    pub requalified: usize,
    /// Completion events delivered (the local server also delivers between sweeps, [`deliver_local`]).
    pub delivered: usize,
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
    swept.delivered = engine.deliver_due().await?;
    if engine.settings.requalify_stale
        && let Some((provider, contract, why)) =
            engine.needing_requalification().await?.into_iter().next()
    {
        tracing::info!(%provider, %contract, code = %why.code, "qualifying again: {}", why.message);
        let runs = crate::providers::qualify::DEFAULT_RUNS;
        if let Some(evidence) = engine
            .requalify(&contract, &provider, runs, |_, _, _| {})
            .await?
        {
            tracing::info!(%provider, %contract, passed = evidence.passed, "qualified again");
            swept.requalified += 1;
        }
    }
    if swept != Swept::default() {
        tracing::info!(
            expired = swept.expired,
            redispatched = swept.redispatched,
            purged = swept.purged,
            requalified = swept.requalified,
            delivered = swept.delivered,
            "sweep"
        );
    }
    Ok(swept)
}

/// Sweeps every `interval` of the engine's clock, forever; each turn also folds the metrics' recent samples in.
pub async fn run_local(engine: Arc<Engine>, interval: Duration) {
    loop {
        if let Err(e) = sweep(&engine).await {
            tracing::error!(error = %crate::telemetry::error_chain(&e), "sweep failed");
        }
        engine.metrics.upkeep();
        engine.clock.sleep(interval).await;
    }
}

/// The local server's deliverer: delivers what is due whenever this process arms deliveries, and every second of
/// the engine's clock for what came due meanwhile (a retry's backoff, a job that settles later).
pub async fn deliver_local(engine: Arc<Engine>) {
    loop {
        if let Err(e) = engine.deliver_due().await {
            tracing::error!(error = %crate::telemetry::error_chain(&e), "delivering events failed");
        }
        tokio::select! {
            () = engine.deliveries_armed() => {}
            () = engine.clock.sleep(Duration::seconds(1)) => {}
        }
    }
}
