//! What an operator watches, on the `metrics` facade. The methods of [`Metrics`] are the one set of call sites;
//! they record into the engine's own recorder, which is one of two exporters: Prometheus text at `GET /metrics`
//! for the local server ([`Metrics::prometheus`]), or CloudWatch Embedded Metric Format lines printed after each
//! Lambda invocation ([`Metrics::emf`], in `emf`), whose dimensions are the labels. The recorder belongs to the
//! engine, not to the process, so two engines in one process (as in the tests) count apart.
//!
//! The names, kinds and labels are the table [`METRICS`]; `docs/operations.md` lists them for operators.

mod emf;
mod prometheus;

use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Histogram, Key, Label, Level, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::domain::{
    AttemptState, Bound, ClearedBy, ContractRef, Job, JobStatus, Owner, ProviderName, SinkKind,
};
use prometheus::Prometheus;

/// One metric: its name, whether it is a histogram (else a counter) and its Prometheus buckets, its unit, its
/// labels, what it counts.
#[derive(Debug, Clone, Copy)]
pub struct MetricSpec {
    pub name: &'static str,
    pub histogram: bool,
    /// A histogram's bucket bounds (Prometheus; EMF sends the values themselves).
    pub buckets: &'static [f64],
    pub unit: Unit,
    pub labels: &'static [&'static str],
    /// The label subsets CloudWatch also aggregates over (EMF dimension sets besides all the labels): `[]` is the
    /// whole service, which alarms watch.
    pub rollups: &'static [&'static [&'static str]],
    pub help: &'static str,
}

/// The whole-service aggregate only.
const WHOLE: &[&[&str]] = &[&[]];

const fn counter(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricSpec {
    MetricSpec {
        name,
        histogram: false,
        buckets: &[],
        unit: Unit::Count,
        labels,
        rollups: WHOLE,
        help,
    }
}

const fn histogram(
    name: &'static str,
    (unit, buckets): (Unit, &'static [f64]),
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricSpec {
    MetricSpec {
        name,
        histogram: true,
        buckets,
        unit,
        labels,
        rollups: WHOLE,
        help,
    }
}

const CREATES: MetricSpec = counter(
    "onejob_creates_total",
    &["contract", "outcome"],
    "Job creates by outcome (created, replayed, conflict).",
);
/// Also by state alone: the template's alarm watches `unknown` attempts of every contract and provider.
const ATTEMPTS: MetricSpec = MetricSpec {
    rollups: &[&["state"], &[]],
    ..counter(
        "onejob_attempts_total",
        &["contract", "provider", "state"],
        "Attempts that entered each state.",
    )
};
const RACES_LOST: MetricSpec = counter(
    "onejob_races_lost_total",
    &["contract", "provider"],
    "Completions that lost the result slot and were discarded.",
);
const RETRIES: MetricSpec = counter(
    "onejob_retries_total",
    &["contract", "provider"],
    "Attempts queued to try a provider again after it refused without doing the work.",
);
const STORE_RETRIES: MetricSpec = counter(
    "onejob_store_retries_total",
    &[],
    "Store writes tried again under their token after the store failed.",
);
const BREAKER_TRIPS: MetricSpec = counter(
    "onejob_breaker_trips_total",
    &["provider"],
    "Times a provider's breaker opened.",
);
const BREAKER_WAITS: MetricSpec = counter(
    "onejob_breaker_waits_total",
    &["provider"],
    "Messages put off, their attempt left queued without a try, while the provider's breaker let no call through.",
);
const SLOT_WAITS: MetricSpec = counter(
    "onejob_slot_waits_total",
    &["provider"],
    "Messages put off, their attempt left queued without a try, while every call slot of the provider was taken.",
);
const UNKNOWN_CLEARED: MetricSpec = counter(
    "onejob_unknown_cleared_total",
    &["provider", "by"],
    "Unknown attempts cleared: by a late answer, a lookup at the provider, the provider's retry policy (possibly paid twice), or a person.",
);
const CREATE_SECONDS: MetricSpec = histogram(
    "onejob_create_seconds",
    SECONDS,
    &["contract", "outcome"],
    "How long a create took in the engine, store write included.",
);
const QUEUE_WAIT_SECONDS: MetricSpec = histogram(
    "onejob_queue_wait_seconds",
    SECONDS,
    &["contract", "provider"],
    "From an attempt's queueing (or its retry's earliest start) to its claim.",
);
const PROVIDER_CALL_SECONDS: MetricSpec = histogram(
    "onejob_provider_call_seconds",
    SECONDS,
    &["provider", "model", "outcome"],
    "Provider calls by outcome (answered, failed, lost, no_answer): until the answer, or until listening ended.",
);
const ATTEMPTS_PER_JOB: MetricSpec = histogram(
    "onejob_attempts_per_job",
    (Unit::Count, &[1.0, 2.0, 3.0, 4.0, 6.0, 10.0]),
    &["contract", "outcome"],
    "Attempts a job took, counted when it ended (succeeded; failed; cancelled while open).",
);
const EVENT_TRIES: MetricSpec = counter(
    "onejob_event_tries_total",
    &["sink", "outcome"],
    "Completion event tries by sink (endpoint, bus) and outcome (delivered, rejected, unreachable, refused).",
);
const COST: MetricSpec = histogram(
    "onejob_attempt_cost",
    (
        Unit::Count,
        &[0.000_01, 0.000_1, 0.001, 0.01, 0.1, 1.0, 10.0],
    ),
    &["owner", "contract", "provider", "outcome"],
    "What each attempt's call cost, in the price table's currency, by what became of its answer (won; discarded: \
     paid for and thrown away; failed); its sum is the spend. Attempts with no price are not in it.",
);
const TOKENS: MetricSpec = counter(
    "onejob_tokens_total",
    &["owner", "contract", "provider", "kind"],
    "Tokens providers reported, by kind (input, output, cached_input, reasoning).",
);
const CALLS_AVOIDED: MetricSpec = counter(
    "onejob_calls_avoided_total",
    &["owner", "contract", "outcome"],
    "Creates answered from the job their key already named, with no provider call (replayed, conflict).",
);
const EVENT_DELIVERY_SECONDS: MetricSpec = histogram(
    "onejob_event_delivery_seconds",
    (
        Unit::Seconds,
        &[
            0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3_600.0, 21_600.0, 86_400.0,
        ],
    ),
    &["sink"],
    "From a job's settle to its event's delivery, by sink, the tries before included.",
);

const BUDGET: MetricSpec = counter(
    "onejob_budget_total",
    &["owner", "phase", "unit"],
    "Under a budget: each call's worst case, reserved before it was made (phase reserved), and what its \
     reservation settled to once its attempt ended (phase settled), in tokens and in billionths of the price \
     table's currency (unit tokens, nanos); reserved less settled is what calls not settled yet hold.",
);

/// Every metric onejob records.
pub const METRICS: [MetricSpec; 19] = [
    CREATES,
    ATTEMPTS,
    RACES_LOST,
    RETRIES,
    STORE_RETRIES,
    BREAKER_TRIPS,
    BREAKER_WAITS,
    SLOT_WAITS,
    UNKNOWN_CLEARED,
    CREATE_SECONDS,
    QUEUE_WAIT_SECONDS,
    PROVIDER_CALL_SECONDS,
    ATTEMPTS_PER_JOB,
    EVENT_TRIES,
    EVENT_DELIVERY_SECONDS,
    COST,
    TOKENS,
    CALLS_AVOIDED,
    BUDGET,
];

/// The durations of a request's parts, in seconds, with their bucket bounds: a create takes milliseconds, a
/// provider call seconds.
const SECONDS: (Unit, &[f64]) = (
    Unit::Seconds,
    &[
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    ],
);

static METADATA: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, None);

/// What a create did, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateKind {
    Created,
    Replayed,
    Conflict,
}

/// What one try of a completion event came to, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventTry {
    /// The endpoint answered 2xx; the bus took the entry.
    Delivered,
    /// It answered something else; the bus refused the entry.
    Rejected,
    /// No answer: no connection, or none within the timeout.
    Unreachable,
    /// Not sent: the endpoint's address is private.
    Refused,
}

impl EventTry {
    fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Rejected => "rejected",
            Self::Unreachable => "unreachable",
            Self::Refused => "refused",
        }
    }
}

impl CreateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
        }
    }
}

/// A recorder and what it exports.
trait Exporter: Recorder + Send + Sync + std::fmt::Debug {
    /// Everything counted so far, as Prometheus text; `None` when this exporter does not keep it.
    fn prometheus(&self) -> Option<String>;
    /// What was recorded since the last call, as EMF lines; none when this exporter does not print them.
    fn drain_emf(&self, timestamp_ms: i64) -> Vec<String>;
    /// Folds what was recorded into what is kept, so that memory stays bounded between reads.
    fn upkeep(&self);
}

/// The engine's metrics: where every call site records.
#[derive(Debug, Clone)]
pub struct Metrics(Arc<dyn Exporter>);

impl Metrics {
    /// Prometheus text for `GET /metrics`, histograms as buckets (the local server).
    pub fn prometheus() -> Self {
        let mut builder = PrometheusBuilder::new();
        for spec in METRICS.iter().filter(|s| s.histogram) {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(spec.name.into()), spec.buckets)
                .expect("the bucket lists are not empty");
        }
        let recorder = builder.build_recorder();
        describe(&recorder);
        let handle = recorder.handle();
        let metrics = Self(Arc::new(Prometheus { recorder, handle }));
        // The one series without labels is there from the start, at 0: a scrape before any activity finds it.
        metrics.counter(&STORE_RETRIES, &[]).absolute(0);
        metrics.upkeep();
        metrics
    }

    /// EMF lines, one per label set, printed after each invocation (a Lambda function).
    pub fn emf() -> Self {
        Self(Arc::new(emf::Emf::default()))
    }

    /// Everything counted so far as Prometheus text, or `None` on an exporter that prints EMF instead.
    pub fn render(&self) -> Option<String> {
        self.0.prometheus()
    }

    /// What was recorded since the last call as EMF lines (namespace `onejob`), or none on a Prometheus exporter.
    pub fn drain_emf(&self, timestamp_ms: i64) -> Vec<String> {
        self.0.drain_emf(timestamp_ms)
    }

    /// Folds recent histogram samples into their buckets: the local server calls it every sweep, so that memory
    /// stays bounded however rarely `GET /metrics` is read.
    pub fn upkeep(&self) {
        self.0.upkeep();
    }

    fn counter(&self, spec: &MetricSpec, values: &[&str]) -> Counter {
        self.0.register_counter(&key(spec, values), &METADATA)
    }

    fn histogram(&self, spec: &MetricSpec, values: &[&str]) -> Histogram {
        self.0.register_histogram(&key(spec, values), &METADATA)
    }

    /// `owner`'s create answered `kind` after `took`; one answered from an existing job avoided a call.
    pub fn create(&self, owner: &Owner, contract: &ContractRef, kind: CreateKind, took: Duration) {
        let labels = [contract.name(), kind.as_str()];
        self.counter(&CREATES, &labels).increment(1);
        self.histogram(&CREATE_SECONDS, &labels)
            .record(took.as_secs_f64());
        if kind != CreateKind::Created {
            let labels = [owner.as_str(), contract.name(), kind.as_str()];
            self.counter(&CALLS_AVOIDED, &labels).increment(1);
        }
    }

    /// What attempt `number` of `job` reported when its answer was written as `outcome` (won, discarded, failed):
    /// its tokens, and its cost if it was priced.
    pub fn billed(&self, job: &Job, number: u32, outcome: &str) {
        let Some(report) = job.attempt(number).and_then(|a| a.report.as_ref()) else {
            return;
        };
        let (owner, contract, provider) = (
            job.owner.as_str(),
            job.contract.name(),
            provider_of(job, number),
        );
        let kinds = [
            ("input", report.input_tokens),
            ("output", report.output_tokens),
            ("cached_input", report.cached_input_tokens),
            ("reasoning", report.reasoning_tokens),
        ];
        for (kind, tokens) in kinds {
            if let Some(tokens) = tokens {
                self.counter(&TOKENS, &[owner, contract, provider, kind])
                    .increment(tokens);
            }
        }
        if let Some(nanos) = report.cost_nanos {
            self.histogram(&COST, &[owner, contract, provider, outcome])
                .record(crate::domain::amount(nanos));
        }
    }

    /// Under `owner`'s budget, a call's worst case reserved (`phase` reserved) or a reservation settled to what its
    /// call cost (`phase` settled).
    pub fn budget(&self, owner: &Owner, phase: &str, amount: Bound) {
        for (unit, value) in [("tokens", amount.tokens), ("nanos", amount.nanos)] {
            (self.counter(&BUDGET, &[owner.as_str(), phase, unit])).increment(value);
        }
    }

    /// Attempt `number` of `job` (as the write left it) entered `state`; a queued retry counts as one, a claim
    /// records how long the attempt waited.
    pub fn attempt(&self, job: &Job, number: u32, state: AttemptState) {
        let provider = provider_of(job, number);
        let contract = job.contract.name();
        self.counter(&ATTEMPTS, &[contract, provider, state.as_str()])
            .increment(1);
        if state == AttemptState::Queued
            && job.attempt(number).is_some_and(|a| a.retry_of.is_some())
        {
            self.counter(&RETRIES, &[contract, provider]).increment(1);
        }
        if state == AttemptState::Started
            && let Some(attempt) = job.attempt(number)
            && let Some(started) = attempt.started_at
        {
            let queued = attempt
                .not_before
                .map_or(attempt.created_at, |t| t.max(attempt.created_at));
            let wait = (started - queued).to_std().unwrap_or_default();
            self.histogram(&QUEUE_WAIT_SECONDS, &[contract, provider])
                .record(wait.as_secs_f64());
        }
    }

    /// Attempt `number`'s completion lost the compare-and-swap on the result slot.
    pub fn race_lost(&self, job: &Job, number: u32) {
        self.counter(
            &RACES_LOST,
            &[job.contract.name(), provider_of(job, number)],
        )
        .increment(1);
        self.attempt(job, number, AttemptState::Discarded);
    }

    /// A store write failed and is tried again under its token.
    pub fn store_retry(&self) {
        self.counter(&STORE_RETRIES, &[]).increment(1);
    }

    /// `provider`'s breaker opened.
    pub fn breaker_trip(&self, provider: &ProviderName) {
        self.counter(&BREAKER_TRIPS, &[provider.as_str()])
            .increment(1);
    }

    /// An attempt on `provider` was left queued, its message put off, while its breaker let no call through.
    pub fn breaker_wait(&self, provider: &ProviderName) {
        self.counter(&BREAKER_WAITS, &[provider.as_str()])
            .increment(1);
    }

    /// An attempt on `provider` was left queued, its message put off, while every call slot was taken.
    pub fn slot_wait(&self, provider: &ProviderName) {
        self.counter(&SLOT_WAITS, &[provider.as_str()]).increment(1);
    }

    /// Attempt `number` of `job` left `unknown`, `by` what.
    pub fn unknown_cleared(&self, job: &Job, number: u32, by: ClearedBy) {
        self.counter(&UNKNOWN_CLEARED, &[provider_of(job, number), by.as_str()])
            .increment(1);
    }

    /// A call to `provider` (model `model`, as configured) ended `outcome` after `took`.
    pub fn provider_call(
        &self,
        provider: &ProviderName,
        model: &str,
        outcome: &str,
        took: Duration,
    ) {
        self.histogram(&PROVIDER_CALL_SECONDS, &[provider.as_str(), model, outcome])
            .record(took.as_secs_f64());
    }

    /// A completion event's POST came to `outcome`; delivered, `since_settle` after its job settled.
    pub fn event_try(&self, sink: SinkKind, outcome: EventTry, since_settle: Duration) {
        self.counter(&EVENT_TRIES, &[sink.as_str(), outcome.as_str()])
            .increment(1);
        if outcome == EventTry::Delivered {
            self.histogram(&EVENT_DELIVERY_SECONDS, &[sink.as_str()])
                .record(since_settle.as_secs_f64());
        }
    }

    /// A write that changed `job` left it as it stands: if that ended it, how many attempts it took. A job ends
    /// when it succeeds (once: the slot is taken once), each time its last live attempt ends with no failover
    /// left (`failed`; a manual retry reopens it), and when its owner cancels it while it is open. Cancelling a
    /// failed job ends nothing: it ended when it failed, and was counted then (it keeps its error through the
    /// cancel, which is how this tells). A failed job that a cancelled attempt's answer wins within its lease
    /// ends twice, failed and then succeeded, and is counted under both.
    pub fn ended(&self, job: &Job) {
        let status = job.status();
        let ended = match status {
            JobStatus::Succeeded | JobStatus::Failed => true,
            JobStatus::Cancelled => job.error.is_none(),
            JobStatus::Queued | JobStatus::Running | JobStatus::Unknown => false,
        };
        if ended {
            let attempts = job.attempts.len() as f64;
            self.histogram(&ATTEMPTS_PER_JOB, &[job.contract.name(), status.as_str()])
                .record(attempts);
        }
    }
}

fn provider_of(job: &Job, number: u32) -> &str {
    job.attempt(number).map_or("", |a| a.provider.as_str())
}

fn key(spec: &MetricSpec, values: &[&str]) -> Key {
    debug_assert_eq!(spec.labels.len(), values.len(), "{}", spec.name);
    let labels: Vec<Label> = spec
        .labels
        .iter()
        .zip(values)
        .map(|(name, value)| Label::new(*name, (*value).to_owned()))
        .collect();
    Key::from_parts(spec.name, labels)
}

fn describe(recorder: &dyn Recorder) {
    for spec in &METRICS {
        let help = SharedString::const_str(spec.help);
        if spec.histogram {
            recorder.describe_histogram(spec.name.into(), Some(spec.unit), help);
        } else {
            recorder.describe_counter(spec.name.into(), Some(spec.unit), help);
        }
    }
}

#[cfg(test)]
mod tests;
