//! The Lambda functions' exporter: a recorder that keeps, per metric and label set, the count or the values
//! recorded since the last drain, and prints them as CloudWatch Embedded Metric Format documents: one per label
//! set, whose labels are its dimensions; a histogram as an array of at most 100 values (CloudWatch's limit per
//! document; more go to further documents), from which CloudWatch draws its percentiles.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use serde_json::{Value, json};

use super::{Exporter, METRICS};

/// CloudWatch takes at most this many values of one metric in one document.
const VALUES_PER_DOCUMENT: usize = 100;

#[derive(Debug, Default)]
pub(super) struct Emf {
    series: Mutex<HashMap<Key, Series>>,
}

#[derive(Debug, Clone)]
enum Series {
    Counter(Arc<AtomicU64>),
    Histogram(Arc<Values>),
}

/// A histogram's values since the last drain.
#[derive(Debug, Default)]
struct Values(Mutex<Vec<f64>>);

impl HistogramFn for Values {
    fn record(&self, value: f64) {
        lock(&self.0).push(value);
    }
}

/// A label set: (label, value) in the order the metric names them.
type Labels = Vec<(String, String)>;

/// What a drain took of one series.
enum Drained {
    Count(u64),
    Values(Vec<f64>),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Emf {
    fn series(&self, key: &Key, new: impl FnOnce() -> Series) -> Series {
        lock(&self.series)
            .entry(key.clone())
            .or_insert_with(new)
            .clone()
    }
}

impl Recorder for Emf {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.series(key, || Series::Counter(Arc::default())) {
            Series::Counter(count) => Counter::from_arc(count),
            Series::Histogram(_) => Counter::noop(),
        }
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        match self.series(key, || Series::Histogram(Arc::default())) {
            Series::Histogram(values) => Histogram::from_arc(values),
            Series::Counter(_) => Histogram::noop(),
        }
    }
}

impl Exporter for Emf {
    fn prometheus(&self) -> Option<String> {
        None
    }

    fn drain_emf(&self, timestamp_ms: i64) -> Vec<String> {
        // By label set (each is one set of dimensions), in a stable order.
        let mut groups: BTreeMap<Labels, Vec<(String, Drained)>> = BTreeMap::new();
        for (key, series) in lock(&self.series).iter() {
            let drained = match series {
                Series::Counter(count) => match count.swap(0, Ordering::Relaxed) {
                    0 => continue,
                    n => Drained::Count(n),
                },
                Series::Histogram(values) => match std::mem::take(&mut *lock(&values.0)) {
                    values if values.is_empty() => continue,
                    values => Drained::Values(values),
                },
            };
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            groups
                .entry(labels)
                .or_default()
                .push((key.name().to_owned(), drained));
        }
        let mut lines = Vec::new();
        for (labels, mut drained) in groups {
            drained.sort_by(|a, b| a.0.cmp(&b.0));
            // The first document carries the counts and each histogram's first 100 values; further ones the rest.
            for round in 0.. {
                let mut document = serde_json::Map::new();
                let mut names = Vec::new();
                for (name, taken) in &drained {
                    let value = match taken {
                        Drained::Count(n) if round == 0 => json!(n),
                        Drained::Values(values) if values.len() > round * VALUES_PER_DOCUMENT => {
                            json!(
                                values
                                    .iter()
                                    .skip(round * VALUES_PER_DOCUMENT)
                                    .take(VALUES_PER_DOCUMENT)
                                    .collect::<Vec<_>>()
                            )
                        }
                        _ => continue,
                    };
                    names.push(name.as_str());
                    document.insert(name.clone(), value);
                }
                if names.is_empty() {
                    break;
                }
                for (label, value) in &labels {
                    document.insert(label.clone(), json!(value));
                }
                document.insert(
                    "_aws".into(),
                    json!({"Timestamp": timestamp_ms, "CloudWatchMetrics": directives(&labels, names)}),
                );
                lines.push(Value::Object(document).to_string());
            }
        }
        lines
    }

    fn upkeep(&self) {}
}

/// The document's metric directives: one per list of dimension sets (all the labels, then the metric's
/// rollups), naming its metrics with their units.
fn directives(labels: &Labels, names: Vec<&str>) -> Vec<Value> {
    let all: Vec<&str> = labels.iter().map(|(label, _)| label.as_str()).collect();
    let mut by_dimensions: BTreeMap<Vec<Vec<&str>>, Vec<Value>> = BTreeMap::new();
    for name in names {
        let spec = METRICS.iter().find(|spec| spec.name == name);
        let mut dimensions = vec![all.clone()];
        for rollup in spec.map_or(&[][..], |s| s.rollups) {
            if !dimensions.iter().any(|d| d == rollup) {
                dimensions.push(rollup.to_vec());
            }
        }
        let unit = match spec.map(|s| s.unit) {
            Some(Unit::Seconds) => "Seconds",
            Some(Unit::Count) => "Count",
            _ => "None",
        };
        by_dimensions
            .entry(dimensions)
            .or_default()
            .push(json!({"Name": name, "Unit": unit}));
    }
    by_dimensions
        .into_iter()
        .map(|(dimensions, metrics)| {
            json!({"Namespace": "onejob", "Dimensions": dimensions, "Metrics": metrics})
        })
        .collect()
}
