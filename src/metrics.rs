//! Counters of what matters for "one job per intent", served as Prometheus text at `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::domain::AttemptState;

#[derive(Debug, Default)]
pub struct Metrics {
    created: AtomicU64,
    replayed: AtomicU64,
    conflicts: AtomicU64,
    /// Attempts that entered each state, indexed like [`AttemptState::ALL`].
    attempts: [AtomicU64; AttemptState::ALL.len()],
    races_lost: AtomicU64,
    /// Store writes tried again, with the same token, after the store failed (whether they had landed unknown).
    store_retries: AtomicU64,
}

/// What a create did, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateKind {
    Created,
    Replayed,
    Conflict,
}

impl Metrics {
    pub fn create(&self, kind: CreateKind) {
        let counter = match kind {
            CreateKind::Created => &self.created,
            CreateKind::Replayed => &self.replayed,
            CreateKind::Conflict => &self.conflicts,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn attempt(&self, state: AttemptState) {
        let index = AttemptState::ALL
            .iter()
            .position(|s| *s == state)
            .expect("every state is in ALL");
        self.attempts[index].fetch_add(1, Ordering::Relaxed);
    }

    /// A completion lost the compare-and-swap on the result slot.
    pub fn race_lost(&self) {
        self.races_lost.fetch_add(1, Ordering::Relaxed);
        self.attempt(AttemptState::Discarded);
    }

    pub fn attempts_in(&self, state: AttemptState) -> u64 {
        let index = AttemptState::ALL
            .iter()
            .position(|s| *s == state)
            .unwrap_or(0);
        self.attempts[index].load(Ordering::Relaxed)
    }

    pub fn races_lost(&self) -> u64 {
        self.races_lost.load(Ordering::Relaxed)
    }

    /// A store write failed and is tried again under its token.
    pub fn store_retry(&self) {
        self.store_retries.fetch_add(1, Ordering::Relaxed);
    }

    pub fn store_retries(&self) -> u64 {
        self.store_retries.load(Ordering::Relaxed)
    }

    /// The counts since the last call, as one CloudWatch Embedded Metric Format line (namespace `onejob`), and the
    /// counters back at zero: a Lambda container prints one after each invocation.
    pub fn drain_emf(&self, timestamp_ms: i64) -> String {
        let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
        let mut values = serde_json::Map::new();
        for (name, counter) in [
            ("JobsCreated", &self.created),
            ("CreatesReplayed", &self.replayed),
            ("CreateConflicts", &self.conflicts),
            ("RacesLost", &self.races_lost),
            ("StoreRetries", &self.store_retries),
        ] {
            values.insert(name.into(), take(counter).into());
        }
        for (state, counter) in AttemptState::ALL.iter().zip(&self.attempts) {
            values.insert(format!("Attempts_{}", state.as_str()), take(counter).into());
        }
        let metrics: Vec<serde_json::Value> = values
            .keys()
            .map(|name| serde_json::json!({"Name": name, "Unit": "Count"}))
            .collect();
        values.insert(
            "_aws".into(),
            serde_json::json!({
                "Timestamp": timestamp_ms,
                "CloudWatchMetrics": [{"Namespace": "onejob", "Dimensions": [[]], "Metrics": metrics}],
            }),
        );
        serde_json::Value::Object(values).to_string()
    }

    /// Prometheus text exposition format 0.0.4.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str("# HELP onejob_creates_total Job creates by outcome.\n# TYPE onejob_creates_total counter\n");
        for (outcome, counter) in [
            ("created", &self.created),
            ("replayed", &self.replayed),
            ("conflict", &self.conflicts),
        ] {
            let _ = writeln!(
                out,
                "onejob_creates_total{{outcome=\"{outcome}\"}} {}",
                load(counter)
            );
        }
        out.push_str(
            "# HELP onejob_attempts_total Attempts that entered each state.\n# TYPE onejob_attempts_total counter\n",
        );
        for (state, counter) in AttemptState::ALL.iter().zip(&self.attempts) {
            let _ = writeln!(
                out,
                "onejob_attempts_total{{state=\"{}\"}} {}",
                state.as_str(),
                load(counter)
            );
        }
        out.push_str(
            "# HELP onejob_races_lost_total Completions that lost the result slot and were discarded.\n\
             # TYPE onejob_races_lost_total counter\n",
        );
        let _ = writeln!(out, "onejob_races_lost_total {}", load(&self.races_lost));
        out.push_str(
            "# HELP onejob_store_retries_total Store writes tried again under their token after the store failed.\n\
             # TYPE onejob_store_retries_total counter\n",
        );
        let _ = writeln!(
            out,
            "onejob_store_retries_total {}",
            load(&self.store_retries)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emf_line_carries_the_counts_since_the_last_one() {
        let metrics = Metrics::default();
        metrics.race_lost();
        metrics.create(CreateKind::Replayed);
        let line: serde_json::Value = serde_json::from_str(&metrics.drain_emf(1_000)).unwrap();
        assert_eq!(
            (
                line["RacesLost"].as_u64(),
                line["Attempts_discarded"].as_u64()
            ),
            (Some(1), Some(1))
        );
        assert_eq!(line["CreatesReplayed"], 1);
        assert_eq!(line["_aws"]["CloudWatchMetrics"][0]["Namespace"], "onejob");
        let names = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(names, 5 + AttemptState::ALL.len());
        let next: serde_json::Value = serde_json::from_str(&metrics.drain_emf(2_000)).unwrap();
        assert_eq!(next["RacesLost"], 0);
    }
}
