//! Logs as events with fields, through `tracing`: human-readable locally, JSON on Lambda, filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,tower_http=info"))
}

/// Human-readable logs, for the local server.
pub fn init() {
    tracing_subscriber::fmt().with_env_filter(filter()).init();
}

/// One JSON object per event, with the current span's fields (job id, attempt, provider): for Lambda and
/// CloudWatch, which stamps the time itself.
pub fn init_json() {
    tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .without_time()
        .with_env_filter(filter())
        .init();
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
