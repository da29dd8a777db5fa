//! The local server's exporter: Prometheus text at `GET /metrics`.

use metrics::{Counter, Histogram, Key, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

use super::Exporter;

/// The local server's exporter: `metrics-exporter-prometheus`'s recorder, rendered on request.
pub(super) struct Prometheus {
    pub(super) recorder: PrometheusRecorder,
    pub(super) handle: PrometheusHandle,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus").finish_non_exhaustive()
    }
}

impl Recorder for Prometheus {
    fn describe_counter(&self, key: metrics::KeyName, unit: Option<Unit>, help: SharedString) {
        self.recorder.describe_counter(key, unit, help);
    }
    fn describe_gauge(&self, key: metrics::KeyName, unit: Option<Unit>, help: SharedString) {
        self.recorder.describe_gauge(key, unit, help);
    }
    fn describe_histogram(&self, key: metrics::KeyName, unit: Option<Unit>, help: SharedString) {
        self.recorder.describe_histogram(key, unit, help);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.recorder.register_counter(key, metadata)
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> metrics::Gauge {
        self.recorder.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.recorder.register_histogram(key, metadata)
    }
}

impl Exporter for Prometheus {
    fn prometheus(&self) -> Option<String> {
        self.handle.run_upkeep();
        Some(self.handle.render())
    }

    fn drain_emf(&self, _timestamp_ms: i64) -> Vec<String> {
        Vec::new()
    }

    fn upkeep(&self) {
        self.handle.run_upkeep();
    }
}
