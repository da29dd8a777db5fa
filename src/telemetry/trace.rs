//! One trace per job. A job's trace id and its root span id are derived from its id (SHA-256 of the id: the first
//! 16 bytes, then the next 8), so every step of the job — the create, each dispatch, each worker step, the
//! sweeper's redispatch, a manual attempt — joins the one trace from the id alone, with nothing stored. A message
//! also carries the W3C `traceparent` of the step that sent it, so the worker's step hangs under that dispatch.
//!
//! The create that makes the job is the trace's root span (its ids pinned to the derived ones); every other step
//! is a child of the root or of the dispatch that sent it. Spans that name a job carry `trace_id` as a field, so
//! their log lines do too, whether or not traces are exported.

use std::cell::Cell;
use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use sha2::{Digest, Sha256};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::domain::JobId;

/// The name of the message attribute (SQS) and field that carries a step's trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The trace id and root span id of `job`'s trace.
pub fn ids(job: &JobId) -> (TraceId, SpanId) {
    let hash = Sha256::digest(job.as_str());
    let trace: [u8; 16] = hash[..16].try_into().expect("16 bytes");
    let root: [u8; 8] = hash[16..24].try_into().expect("8 bytes");
    (TraceId::from_bytes(trace), SpanId::from_bytes(root))
}

/// `job`'s trace id, as logs and trace viewers print it (32 hex digits).
pub fn trace_id(job: &JobId) -> String {
    ids(job).0.to_string()
}

/// The context whose span is `job`'s root: the parent of a step that has no closer one.
fn root(job: &JobId) -> Context {
    let (trace, span) = ids(job);
    Context::new().with_remote_span_context(SpanContext::new(
        trace,
        span,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

/// Puts `span` (made with an empty `trace_id` field, and not yet entered) in `job`'s trace: under `carried` (a
/// message's `traceparent`) if that names a span of this trace, else under the span it was made in if that is of
/// this trace, else under the job's root.
pub fn join(span: &Span, job: &JobId, carried: Option<&str>) {
    let (trace, _) = ids(job);
    span.record("trace_id", tracing::field::display(trace));
    let parent = carried
        .map(extract)
        .filter(|cx| cx.span().span_context().trace_id() == trace)
        .or_else(|| {
            let current = Span::current().context();
            (current.span().span_context().trace_id() == trace).then_some(current)
        })
        .unwrap_or_else(|| root(job));
    // No layer (traces not exported): nothing to join, and the field above is what the logs need.
    let _ = span.set_parent(parent);
}

/// Makes `span` (made with an empty `trace_id` field, not yet entered) the root of `job`'s trace: the span of the
/// create that made the job.
pub fn join_as_root(span: &Span, job: &JobId) {
    let (trace, root_span) = ids(job);
    span.record("trace_id", tracing::field::display(trace));
    let _ = span.set_parent(Context::new());
    PINNED.with(|pin| pin.set(Some((trace, root_span))));
    // The span is built now, on this thread, by the layer's tracer, whose id generator takes the pinned ids.
    let _ = span.context();
    PINNED.with(|pin| pin.set(None));
}

/// The `traceparent` a message about `job` carries: the current span's if it is of the job's trace, else the job's
/// root (traces not exported here, or a step outside the job's spans) — so a worker that exports joins the trace.
pub fn traceparent(job: &JobId) -> String {
    let (trace, _) = ids(job);
    let current = Span::current().context();
    let context = if current.span().span_context().trace_id() == trace {
        current
    } else {
        root(job)
    };
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier
        .remove(TRACEPARENT)
        .expect("a valid span context is always written")
}

fn extract(traceparent: &str) -> Context {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

thread_local! {
    /// The ids the next span built on this thread takes (set by [`join_as_root`] around one build).
    static PINNED: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// Random ids, except for a job's root span, whose ids are the job's (see [`join_as_root`]).
#[derive(Debug, Default)]
pub(super) struct JobIds(RandomIdGenerator);

impl IdGenerator for JobIds {
    fn new_trace_id(&self) -> TraceId {
        PINNED
            .with(Cell::get)
            .map_or_else(|| self.0.new_trace_id(), |(trace, _)| trace)
    }

    fn new_span_id(&self) -> SpanId {
        PINNED
            .with(Cell::get)
            .map_or_else(|| self.0.new_span_id(), |(_, span)| span)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opentelemetry::trace::TracerProvider;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::clock::SystemClock;
    use crate::domain::AttemptRef;
    use crate::queue::local::LocalQueue;
    use crate::queue::{Dispatcher, Message};

    /// A job's create is its trace's root, with the derived ids; a dispatch under it puts its own span, in that
    /// trace, on the local queue's message; a step under that message is the dispatch's child. With no layer, a
    /// message carries the job's root.
    #[tokio::test]
    async fn the_local_queue_carries_the_dispatching_span_of_the_jobs_trace() {
        let job = JobId::parse("job_c93ad8e3d05dd0142f00a17c6f511a74_mx3xkao0").unwrap();
        let (trace, root) = ids(&job);
        let (queue, mut messages) = LocalQueue::new(Arc::new(SystemClock));
        let attempt = AttemptRef {
            job_id: job.clone(),
            number: 1,
        };
        queue
            .dispatch(
                &Message::new(attempt.clone(), None),
                chrono::Duration::zero(),
            )
            .await
            .unwrap();
        assert_eq!(
            messages.recv().await.unwrap().traceparent,
            Some(format!("00-{trace}-{root}-01")),
            "without traces exported here, the job's root"
        );

        let provider = SdkTracerProvider::builder()
            .with_id_generator(JobIds::default())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let _subscriber =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        let create = tracing::info_span!("create", trace_id = tracing::field::Empty);
        join_as_root(&create, &job);
        let created = create.context().span().span_context().clone();
        assert_eq!((created.trace_id(), created.span_id()), (trace, root));

        let dispatch =
            create.in_scope(|| tracing::info_span!("dispatch", trace_id = tracing::field::Empty));
        join(&dispatch, &job, None);
        let sent = dispatch.context().span().span_context().span_id();
        let message = Message::new(attempt, None);
        let dispatched = async { queue.dispatch(&message, chrono::Duration::zero()).await };
        tracing::Instrument::instrument(dispatched, dispatch.clone())
            .await
            .unwrap();
        let carried = messages.recv().await.unwrap().traceparent.unwrap();
        assert_eq!(carried, format!("00-{trace}-{sent}-01"));

        // A step elsewhere (no current span) under what the message carried.
        let step = tracing::info_span!(parent: None, "message", trace_id = tracing::field::Empty);
        join(&step, &job, Some(&carried));
        let step_parent = step.context();
        assert_eq!(step_parent.span().span_context().trace_id(), trace);
        // A carried context of another trace is not followed: the job's root is.
        let stranger =
            tracing::info_span!(parent: None, "message", trace_id = tracing::field::Empty);
        join(
            &stranger,
            &job,
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        assert_eq!(stranger.context().span().span_context().trace_id(), trace);
    }

    #[test]
    fn a_jobs_ids_are_its_ids_hash_and_differ_between_jobs() {
        let a = JobId::parse("job_c93ad8e3d05dd0142f00a17c6f511a74_mx3xkao0").unwrap();
        let b = JobId::parse("job_c93ad8e3d05dd0142f00a17c6f511a74_mx3xkao1").unwrap();
        let hash = hex::encode(Sha256::digest(a.as_str()));
        assert_eq!(trace_id(&a), hash[..32]);
        assert_eq!(ids(&a).1.to_string(), hash[32..48]);
        assert_ne!(ids(&a), ids(&b));
    }

    #[test]
    fn a_carried_traceparent_is_read_back() {
        let job = JobId::parse("job_c93ad8e3d05dd0142f00a17c6f511a74_mx3xkao0").unwrap();
        let (trace, _) = ids(&job);
        let cx = extract(&format!("00-{trace}-00f067aa0ba902b7-01"));
        let carried = cx.span().span_context().clone();
        assert_eq!(carried.trace_id(), trace);
        assert_eq!(carried.span_id().to_string(), "00f067aa0ba902b7");
        assert!(carried.is_remote() && carried.is_sampled());
        assert!(!extract("garbage").span().span_context().is_valid());
    }
}
