//! One job's trace across the functions: the api function's spans and the worker's, under the traceparent the SQS
//! message carries, at an OTLP collector stand-in.

use super::*;

/// Where the functions' JSON log lines go in the trace test.
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One trace per job across the functions: the api function's create is the root (its ids derived from the job's
/// id), its dispatch puts the `traceparent` on the SQS message, the worker's step hangs under that dispatch, and the
/// claim, the provider call and the completion under the step; the duplicate's step is in the same trace; the log
/// lines of job spans carry the trace id.
#[tokio::test]
async fn the_api_and_worker_functions_of_one_job_are_one_trace() {
    let Some(f) = functions().await else { return };
    every_callsite_asks_its_thread();
    let collector = Collector::start().await;
    let traces = Traces::to(&collector.traces_url(), "onejob-test").unwrap();
    let lines = Lines::default();
    let logs = lines.clone();
    let _subscriber = tracing_subscriber::registry()
        .with(traces.layer())
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(move || logs.clone()),
        )
        .set_default();

    let (status, created) = f.api("api-create.json").await;
    assert_eq!(status, 201, "{created}");
    let id = JobId::parse(created["id"].as_str().unwrap()).unwrap();
    let (trace, root) = trace::ids(&id);
    let batch = f.received_with_duplicates().await;
    let carried = batch.records[0].message_attributes["traceparent"]
        .string_value
        .clone()
        .expect("the message carries its sender's trace context");
    assert!(
        carried.starts_with(&format!("00-{trace}-")),
        "{carried} is not in the job's trace {trace}"
    );
    assert!(
        lambda::worker(&f.engine, batch, None)
            .await
            .batch_item_failures
            .is_empty()
    );
    traces.flush().await;

    let spans = collector.spans();
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let hex = |bytes: &[u8]| hex::encode(bytes);
    let [create] = named("create")[..] else {
        panic!("one create span: {spans:#?}")
    };
    assert_eq!(
        (
            hex(&create.trace_id),
            hex(&create.span_id),
            hex(&create.parent_span_id)
        ),
        (trace.to_string(), root.to_string(), String::new()),
        "the create is the job trace's root, with the ids derived from the job's id"
    );
    let [dispatch] = named("dispatch")[..] else {
        panic!("one dispatch: {spans:#?}")
    };
    assert_eq!(dispatch.parent_span_id, create.span_id);
    assert!(
        carried.contains(&hex(&dispatch.span_id)),
        "{carried}: the dispatch's span"
    );
    let steps = named("message");
    assert_eq!(steps.len(), 2, "the message and its duplicate");
    for step in &steps {
        assert_eq!(step.parent_span_id, dispatch.span_id, "under the dispatch");
    }
    let parent = |span: &Span| -> String {
        let parent = spans.iter().find(|s| s.span_id == span.parent_span_id);
        parent.map_or_else(String::new, |p| p.name.clone())
    };
    let claims = named("claim");
    assert_eq!(claims.len(), 2, "the duplicate's refused claim too");
    assert!(claims.iter().all(|c| parent(c) == "message"));
    for name in ["provider_call", "complete"] {
        let [span] = named(name)[..] else {
            panic!("no single {name}: {spans:#?}")
        };
        assert_eq!(parent(span), "attempt", "{name}");
    }
    let [attempt] = named("attempt")[..] else {
        panic!("one attempt: {spans:#?}")
    };
    assert_eq!(parent(attempt), "message");
    let in_trace: Vec<_> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace.to_string())
        .map(|s| s.name.as_str())
        .collect();
    for name in [
        "create",
        "dispatch",
        "message",
        "claim",
        "attempt",
        "provider_call",
        "complete",
    ] {
        assert!(
            in_trace.contains(&name),
            "{name} not in the job's trace: {in_trace:?}"
        );
    }

    let logs = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let dropped: Value = logs
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["fields"]["message"] == "message dropped: attempt not queued")
        .expect("the duplicate's drop is logged");
    assert_eq!(dropped["span"]["trace_id"], trace.to_string());
}

/// tracing caches whether a span or event is wanted once per callsite for the whole process, asking only the
/// subscriber of the thread that reaches the callsite first while at most one subscriber exists. Another test of
/// this binary, on a thread with none, would then cache "never" for the product's spans, and a test's own
/// (thread-scoped) subscriber would see none of them: the trace test failed so about once in 20 runs of the binary.
/// A global subscriber that records nothing but answers "sometimes" makes every callsite ask the current thread's
/// subscriber each time. The one test that captures calls this before setting its own.
fn every_callsite_asks_its_thread() {
    let nothing = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::dynamic_filter_fn(|_, _| false));
    tracing::subscriber::set_global_default(nothing)
        .expect("only the trace test sets a global subscriber in this binary");
}
