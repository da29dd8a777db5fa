//! Spans exported over OTLP/HTTP (protobuf) in batches, when a collector is configured by the standard variables.
//! On Lambda that is the ADOT layer's collector (`http://localhost:4318`), which forwards to X-Ray; anywhere else,
//! any OTLP endpoint.

use std::time::Duration;

use async_trait::async_trait;
use opentelemetry::trace::TracerProvider;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use super::trace::JobIds;

/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the end of an invocation waits for its spans' export: a collector that hangs delays an answer by this
/// much at most (the export goes on behind it).
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// The variables that name a collector: either turns traces on.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The span pipeline: a batch processor on its own thread, exporting with this process's runtime.
#[derive(Debug, Clone)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Traces to the collector that `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (with `/v1/traces`) names, headers from `OTEL_EXPORTER_OTLP_HEADERS`, the
    /// service named by `OTEL_SERVICE_NAME` or else `service`; `None` when no collector is named. Must be called
    /// on a Tokio runtime, which the exports then use.
    pub fn from_env(service: &str) -> Result<Option<Self>, String> {
        let named = ENDPOINT_VARIABLES
            .iter()
            .any(|name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty()));
        if !named {
            return Ok(None);
        }
        Self::build(SpanExporter::builder().with_http(), service).map(Some)
    }

    /// Traces to `endpoint` (the whole URL, `…/v1/traces`). Must be called on a Tokio runtime.
    pub fn to(endpoint: &str, service: &str) -> Result<Self, String> {
        Self::build(
            SpanExporter::builder().with_http().with_endpoint(endpoint),
            service,
        )
    }

    fn build(
        exporter: opentelemetry_otlp::SpanExporterBuilder<
            opentelemetry_otlp::HttpExporterBuilderSet,
        >,
        service: &str,
    ) -> Result<Self, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "traces need a Tokio runtime to export on".to_owned())?;
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        let exporter = exporter
            .with_timeout(EXPORT_TIMEOUT)
            .with_http_client(OnRuntime { client, runtime })
            .build()
            .map_err(|e| format!("the OTLP exporter: {e}"))?;
        let mut resource = Resource::builder();
        if std::env::var("OTEL_SERVICE_NAME").is_err() {
            resource = resource.with_service_name(service.to_owned());
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_id_generator(JobIds::default())
            .with_resource(resource.build())
            .build();
        Ok(Self { provider })
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans of this pipeline.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("onejob"))
    }

    /// Exports every span ended so far, and waits for the collector's answer, `FLUSH_WAIT` at most (a Lambda
    /// invocation's end: the process may be frozen next). Failures are the exporter's to log.
    pub async fn flush(&self) {
        let provider = self.provider.clone();
        // The batch thread exports on this runtime: wait for it off the runtime's threads.
        let flushed = tokio::task::spawn_blocking(move || provider.force_flush());
        let _ = tokio::time::timeout(FLUSH_WAIT, flushed).await;
    }
}

/// The exporter's HTTP client: reqwest on the process's Tokio runtime (the batch processor's thread has none).
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let (status, headers, body) = self
            .runtime
            .spawn(async move {
                let response = client.execute(request).await?;
                let (status, headers) = (response.status(), response.headers().clone());
                Ok::<_, reqwest::Error>((status, headers, response.bytes().await?))
            })
            .await??;
        let mut response = Response::builder().status(status).body(body)?;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
