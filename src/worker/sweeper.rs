//! The sweeper step, run every few seconds by the local server (and by a scheduled Lambda): `started` attempts
//! whose lease expired become `unknown` (never `failed`: the provider may have done the work), `unknown` attempts are
//! cleared where their provider can be asked or has a retry policy (`engine::reconcile`), `queued` attempts
//! that nobody claimed are dispatched again (the claim drops any duplicate), and jobs past their retention go. If the
//! deployment asks for it (`requalify_stale`), one provider whose qualification passed and that production suspects,
//! or that grew too old, is qualified again per sweep, if it can end by the sweep's deadline. Completion events that are due go out.

use std::future::Future;
use std::sync::Arc;

use chrono::Duration;

use crate::domain::{AttemptRef, Timestamp};
use crate::engine::{Batch, Engine};
use crate::store::StoreError;

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// `started` attempts past their lease, now `unknown`.
    pub expired: usize,
    /// `unknown` attempts whose provider a worker was sent to ask about their call (`Message::look_up`).
    pub asked: usize,
    /// `unknown` attempts cleared by their provider's retry policy.
    pub cleared: usize,
    /// `queued` attempts dispatched again (each at most once per `redispatch_after`).
    pub redispatched: usize,
    /// Jobs past their retention deleted (SQLite; DynamoDB's TTL deletes by itself).
    pub purged: usize,
    /// Qualifications run again (at most one per sweep, and only with `requalify_stale`).
    pub requalified: usize,
    /// Completion events delivered (the local server also delivers between sweeps, [`deliver_local`]).
    pub delivered: usize,
}

/// One sweep. Without a `deadline` (the local server's, every few seconds) it takes one batch of each kind of work;
/// with one (the scheduled function's, once a minute, less a margin) each kind goes on batch after batch while
/// there is more and time for it: at one batch a minute, a backlog — the leases of every attempt in flight when a
/// provider hung, the events of a busy hour — would take hours to clear.
pub async fn sweep(engine: &Engine, deadline: Option<Timestamp>) -> Result<Swept, StoreError> {
    let mut swept = Swept::default();
    let no_floor = Duration::zero();
    // Attempts first, leaving the time a batch of deliveries may take: a backlog of leases does not starve events.
    let for_attempts = deadline.map(|deadline| deadline - engine.longest_delivery_batch());
    swept.expired = in_batches(engine, for_attempts, no_floor, || {
        one_by_one(engine.expired_leases(), |attempt| async move {
            engine.expire_lease(&attempt).await
        })
    })
    .await?;
    (swept.asked, swept.cleared) = reconcile(engine, for_attempts).await?;
    swept.redispatched = in_batches(engine, for_attempts, no_floor, || {
        one_by_one(engine.stale_queued(), |attempt| async move {
            engine.redispatch(&attempt).await
        })
    })
    .await?;
    swept.purged = engine.purge_expired().await?;
    swept.delivered = in_batches(engine, deadline, engine.longest_delivery_batch(), || {
        engine.deliver_batch()
    })
    .await?;
    if engine.settings.requalify_stale
        && let Some((provider, contract, why)) =
            engine.needing_requalification().await?.into_iter().next()
    {
        let runs = crate::providers::qualify::DEFAULT_RUNS;
        // Every run is bounded by the provider's timeout: a qualification that might not end by the deadline is
        // left for a sweep with the time for it.
        let longest = engine.longest_qualification(&contract, &provider, runs);
        if deadline.is_some_and(|deadline| engine.clock.now() + longest > deadline) {
            tracing::info!(%provider, %contract, longest_ms = longest.num_milliseconds(), "no time left to qualify again in this sweep");
        } else {
            tracing::info!(%provider, %contract, code = %why.code, "qualifying again: {}", why.message);
            if let Some(evidence) = engine
                .requalify(&contract, &provider, runs, |_, _, _| {})
                .await?
            {
                tracing::info!(%provider, %contract, passed = evidence.passed, "qualified again");
                swept.requalified += 1;
            }
        }
    }
    if swept != Swept::default() {
        tracing::info!(
            expired = swept.expired,
            asked = swept.asked,
            cleared = swept.cleared,
            redispatched = swept.redispatched,
            purged = swept.purged,
            requalified = swept.requalified,
            delivered = swept.delivered,
            "sweep"
        );
    }
    Ok(swept)
}

/// Runs `batch` once and, with a `deadline`, again while the last one listed a whole sweep's batch and was done with
/// all of it, and the next would end by the deadline (taking as long as the longest so far, or `floor` if longer,
/// and a second). A batch that leaves anything for later (a store that failed on one, a send that failed, a row
/// another writer moved on, or an index not yet caught up) ends the run: the next sweep takes it up, so a store
/// that keeps failing is not asked again and again. What the batches counted.
async fn in_batches<F, Fut>(
    engine: &Engine,
    deadline: Option<Timestamp>,
    floor: Duration,
    mut batch: F,
) -> Result<usize, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Batch, StoreError>>,
{
    let mut longest = floor;
    let mut counted = 0;
    loop {
        let started = engine.clock.now();
        let done = batch().await?;
        counted += done.counted;
        let now = engine.clock.now();
        longest = longest.max(now - started);
        let more = done.listed == engine.settings.sweep_batch && done.done == done.listed;
        match deadline {
            Some(deadline) if more && now + longest + Duration::seconds(1) <= deadline => {}
            _ => return Ok(counted),
        }
    }
}

/// The reconciler's pages of `unknown` jobs: one without a `deadline`, else page after page while there are more
/// and time is left. How many lookups it sent, and how many attempts it cleared by policy.
async fn reconcile(
    engine: &Engine,
    deadline: Option<Timestamp>,
) -> Result<(usize, usize), StoreError> {
    let (mut cursor, mut asked, mut cleared) = (None, 0, 0);
    loop {
        let page = engine.reconcile_page(cursor.as_ref(), deadline).await?;
        (asked, cleared) = (asked + page.asked, cleared + page.cleared);
        match (page.next, deadline) {
            (Some(next), Some(deadline)) if engine.clock.now() < deadline => cursor = Some(next),
            _ => return Ok((asked, cleared)),
        }
    }
}

/// A batch of attempts, `listed`, each `act`ed on in turn; done and counted are those acted on.
async fn one_by_one<L, A, F>(listed: L, act: A) -> Result<Batch, StoreError>
where
    L: Future<Output = Result<Vec<AttemptRef>, StoreError>>,
    A: Fn(AttemptRef) -> F,
    F: Future<Output = Result<bool, StoreError>>,
{
    let listed = listed.await?;
    let mut batch = Batch {
        listed: listed.len(),
        ..Batch::default()
    };
    for attempt in listed {
        batch.done += usize::from(act(attempt).await?);
    }
    batch.counted = batch.done;
    Ok(batch)
}

/// Sweeps every `interval` of the engine's clock, forever; each turn also folds the metrics' recent samples in.
pub async fn run_local(engine: Arc<Engine>, interval: Duration) {
    loop {
        if let Err(e) = sweep(&engine, None).await {
            tracing::error!(error = %crate::telemetry::error_chain(&e), "sweep failed");
        }
        engine.metrics.upkeep();
        engine.clock.sleep(interval).await;
    }
}

/// The local server's deliverer: a batch of what is due whenever this process arms deliveries, and every second of
/// the engine's clock for what came due meanwhile (a retry's backoff, a job that settles later). One batch lists at
/// a time, and the next starts once it holds what it listed: the batches send side by side, so one slow
/// endpoint's tries hold up their own batch, never the next one (whose other owners' events go out at once).
pub async fn deliver_local(engine: Arc<Engine>) {
    // Ended with the deliverer (the server stopping): what they held stays due in the store.
    let mut batches = tokio::task::JoinSet::new();
    loop {
        let (taken, listed) = tokio::sync::oneshot::channel();
        let batch = engine.clone();
        batches.spawn(async move {
            let taken = || _ = taken.send(());
            if let Err(e) = batch.deliver_batch_and(taken).await {
                tracing::error!(error = %crate::telemetry::error_chain(&e), "delivering events failed");
            }
        });
        // Sent, or the batch failed before it held anything.
        _ = listed.await;
        while batches.try_join_next().is_some() {}
        tokio::select! {
            () = engine.deliveries_armed() => {}
            () = engine.clock.sleep(Duration::seconds(1)) => {}
        }
    }
}
