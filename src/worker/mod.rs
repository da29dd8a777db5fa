//! The worker is one step, [`process_attempt`], and thin loops around it: [`run_local`] for the local server
//! (a Lambda SQS handler wraps the same step). [`sweeper`] is the other step: expired leases and lost messages.
//!
//! A step is two engine calls around the provider's call: [`Engine::begin`] claims the attempt and prepares its
//! request, [`Engine::settle`] writes what came of it, in the engine's order. The worker keeps what is between: the
//! call, its time-out, the late window and its metrics.

pub mod sweeper;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tracing::Instrument;
use tracing::field::Empty;

use crate::domain::{AttemptRef, Timestamp};
pub use crate::engine::Processed;
use crate::engine::{Begun, Claimed, Engine, Heard};
use crate::providers::{ProviderOutcome, Reply};
use crate::queue::{Delivery, Message};
use crate::store::StoreError;
use crate::telemetry::trace;

/// Claims the attempt, calls its provider once, and records what happened:
/// - an answer that keeps the contract completes by compare-and-swap (the loser is discarded and logged);
/// - a definite failure fails the attempt, and failover queues the next qualified provider in the same write;
/// - no answer within `timeout_ms` makes the attempt `unknown`; the step keeps listening `late_result_ms` more and
///   completes by compare-and-swap if the answer comes.
///
/// Every write of the step carries one token, made by the engine: a claim whose answer was lost is found again as
/// this step's own, and an answer the step holds is written for as long as it can still matter (see [`Engine`]).
///
/// An `Err` is a store failure: the message should be delivered again. A redelivery is a new step with a new
/// token: if the claim had landed, it is refused, and after the lease the attempt is `unknown`.
pub async fn process_attempt(
    engine: &Engine,
    message: &AttemptRef,
) -> Result<Processed, StoreError> {
    process_message(engine, &Message::new(message.clone(), None), None).await
}

/// [`process_message`] for a message as it arrived: the step is a span of the job's trace, under the dispatch that
/// sent the message.
pub async fn process_delivery(
    engine: &Engine,
    delivery: &Delivery,
    deadline: Option<Timestamp>,
) -> Result<Processed, StoreError> {
    let message = &delivery.message.attempt;
    let span = tracing::info_span!("message", job_id = %message.job_id, attempt = message.number, trace_id = Empty);
    trace::join(&span, &message.job_id, delivery.traceparent.as_deref());
    process_message(engine, &delivery.message, deadline)
        .instrument(span)
        .await
}

/// [`process_attempt`] for a message that may name the attempt's provider (then, if its breaker lets no call
/// through and nothing else may take the job, the attempt waits unclaimed), listening for a late answer and
/// writing answers no later than `deadline` (a Lambda's remaining time).
pub async fn process_message(
    engine: &Engine,
    sent: &Message,
    deadline: Option<Timestamp>,
) -> Result<Processed, StoreError> {
    if sent.look_up {
        return engine.look_up(&sent.attempt, deadline).await;
    }
    let claimed = match engine.begin(sent, deadline).await? {
        Begun::Done(processed) => return Ok(processed),
        Begun::Claimed(claimed) => *claimed,
    };
    let (job, attempt) = (claimed.job(), claimed.attempt());
    let span = tracing::info_span!("attempt", job_id = %job.id, attempt = attempt.number, provider = %attempt.provider, trace_id = %trace::trace_id(&job.id));
    async {
        let heard = listen(engine, &claimed).await;
        engine.settle(claimed, heard).await
    }
    .instrument(span)
    .await
}

/// The provider's reply, or silence if none came within the timeout and the late window. After the timeout the
/// attempt is written `unknown` while listening goes on: a write that stalls never keeps an answer from being
/// heard, and an answer that is ready always wins over a timer (invariant 16).
async fn listen(engine: &Engine, claimed: &Claimed) -> Heard {
    let (clock, provider) = (&engine.clock, claimed.provider());
    let began = Instant::now();
    let span = tracing::info_span!("provider_call", outcome = Empty);
    // The provider's name of the call, if it gives one before its answer: kept with the attempt at its time-out.
    let named = crate::providers::CallName::new();
    let mut call = std::pin::pin!(
        provider
            .client
            .call_named(claimed.request(), &named)
            .instrument(span.clone())
    );
    tokio::select! {
        biased;
        reply = &mut call => {
            span.record("outcome", timed(engine, claimed, Some(&reply), began));
            return Heard::Reply(Box::new(reply));
        }
        () = clock.sleep(provider.config.timeout()) => {}
    }
    // The late window starts at the timeout, not when the store has answered, and ends by the deadline.
    let mut late = provider.config.late_result();
    if let Some(deadline) = claimed.deadline() {
        late = late
            .min(deadline - clock.now())
            .max(chrono::Duration::zero());
    }
    let late_end = clock.now() + late;
    let mut late_window = std::pin::pin!(clock.sleep(late));
    tracing::warn!(
        timeout_ms = provider.config.timeout_ms(),
        "no answer in time: attempt unknown"
    );
    // Written while the window runs; if the store will not take it, listening goes on all the same (an answer
    // that comes is worth more), and the sweeper makes the attempt unknown after its lease.
    let mut marking =
        std::pin::pin!(engine.time_out(claimed, named.get().map(String::as_str), late_end));
    let mut marked = None;
    loop {
        tokio::select! {
            biased;
            reply = &mut call => {
                span.record("outcome", timed(engine, claimed, Some(&reply), began));
                return Heard::Reply(Box::new(reply));
            }
            written = &mut marking, if marked.is_none() => marked = Some(written),
            () = &mut late_window => break,
        }
    }
    tracing::warn!(
        late_result_ms = provider.config.late_result_ms(),
        "no late answer either: attempt stays unknown"
    );
    span.record("outcome", timed(engine, claimed, None, began));
    let written = match marked {
        Some(written) => written,
        None => marking.await,
    };
    Heard::Silence {
        written,
        named: named.get().is_some(),
    }
}

/// Records a call begun at `began`: its reply, or `None` when listening ended without one; the outcome's name.
fn timed(
    engine: &Engine,
    claimed: &Claimed,
    reply: Option<&Reply>,
    began: Instant,
) -> &'static str {
    let outcome = match reply.map(|r| &r.outcome) {
        Some(ProviderOutcome::Answered(_)) => "answered",
        Some(ProviderOutcome::Failed(_)) => "failed",
        Some(ProviderOutcome::Lost(_)) => "lost",
        None => "no_answer",
    };
    // The configured model (what a demo provider reports for a demo): a remote provider's report could name
    // anything, and each name would be a series of its own.
    let model = (claimed.provider().config.model())
        .or_else(|| reply.and_then(|r| r.report.model.as_deref()))
        .unwrap_or("");
    let provider = &claimed.attempt().provider;
    (engine.metrics).provider_call(provider, model, outcome, began.elapsed());
    outcome
}

/// The local server's worker: runs each message from the in-process queue, up to `concurrency` at once, until the
/// queue closes. A store failure is logged; the sweeper dispatches the attempt again if it is still queued.
/// Aborting this task aborts the attempts it runs, as a crash would.
pub async fn run_local(
    engine: Arc<Engine>,
    mut queue: mpsc::UnboundedReceiver<Delivery>,
    concurrency: usize,
) {
    let slots = Arc::new(Semaphore::new(concurrency));
    let mut running = JoinSet::new();
    while let Some(message) = queue.recv().await {
        while running.try_join_next().is_some() {}
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let engine = engine.clone();
        running.spawn(async move {
            if let Err(e) = process_delivery(&engine, &message, None).await {
                let message = &message.message.attempt;
                tracing::error!(job_id = %message.job_id, attempt = message.number, error = %crate::telemetry::error_chain(&e), "attempt step failed");
            }
            drop(slot);
        });
    }
    running.join_all().await;
}
