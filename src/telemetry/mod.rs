//! Logs as events with fields, through `tracing`: human-readable locally, JSON on Lambda, filtered by `RUST_LOG`;
//! and, when a collector is configured, the same spans exported as OpenTelemetry traces ([`otlp`]), one trace per
//! job ([`trace`]).

pub mod otlp;
pub mod trace;

use std::sync::OnceLock;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use otlp::Traces;

/// The process's span pipeline, when traces are exported.
static TRACES: OnceLock<Traces> = OnceLock::new();

fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,tower_http=info"))
}

/// Human-readable logs, for the local server.
pub fn init() {
    install(tracing_subscriber::fmt::layer().boxed(), "onejob");
}

/// One JSON object per event, with the current span's fields (job id, trace id, attempt, provider): for Lambda
/// and CloudWatch, which stamps the time itself.
pub fn init_json() {
    let logs = tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .without_time()
        .boxed();
    let function = std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_else(|_| "onejob".into());
    install(logs, &function);
}

/// Logs through `logs`, filtered by `RUST_LOG`, and spans to the configured collector if any, at `info` and above
/// whatever `RUST_LOG` says (a collector that cannot be set up is reported on stderr, and the process runs without
/// traces).
fn install(logs: Box<dyn Layer<Registry> + Send + Sync>, service: &str) {
    let traces = match Traces::from_env(service) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("traces are not exported: {e}");
            None
        }
    };
    let spans = traces
        .as_ref()
        .map(|t| t.layer().with_filter(LevelFilter::INFO));
    tracing_subscriber::registry()
        .with(logs.with_filter(filter()))
        .with(spans)
        .init();
    if let Some(traces) = traces {
        let _ = TRACES.set(traces);
    }
}

/// Exports the spans ended so far, if traces are exported (the end of a Lambda invocation, of the process).
pub async fn flush() {
    if let Some(traces) = TRACES.get() {
        traces.flush().await;
    }
}

/// An error and its sources, outermost first, joined by ": ".
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
