//! An OTLP/HTTP collector stand-in on loopback: it keeps every span it is sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::sync::Notify;

pub(crate) struct Collector {
    /// `http://127.0.0.1:PORT`, what `OTEL_EXPORTER_OTLP_ENDPOINT` names.
    pub base_url: String,
    spans: Arc<Mutex<Vec<Span>>>,
    /// Told of each export received.
    received: Arc<Notify>,
}

impl Collector {
    pub(crate) async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let received = Arc::new(Notify::new());
        let (kept, told) = (spans.clone(), received.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                kept.lock().unwrap().extend(
                    request
                        .resource_spans
                        .into_iter()
                        .flat_map(|r| r.scope_spans)
                        .flat_map(|s| s.spans),
                );
                told.notify_waiters();
                std::future::ready(())
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base_url,
            spans,
            received,
        }
    }

    /// The traces endpoint's whole URL.
    pub(crate) fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.base_url)
    }

    /// Every span received so far.
    pub(crate) fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans received once `done` holds of them, looked at after each export, for at most 20 s.
    pub(crate) async fn until(&self, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let next = self.received.notified();
            let spans = self.spans();
            if done(&spans) || tokio::time::timeout_at(deadline, next).await.is_err() {
                return spans;
            }
        }
    }
}
