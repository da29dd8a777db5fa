//! One user intent as a client holds it: the job it asks for and the idempotency key it owns for its whole life.

use serde_json::Value;

use super::ClientError;

/// A create's body.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub contract: String,
    pub input: Value,
    pub providers: Option<Vec<String>>,
}

/// One user intent: the job it asks for and the idempotency key it owns for its whole life. Every try of
/// [`Client::submit`](super::Client::submit) sends that key, so however many times the intent is submitted — after a timeout, a give-up,
/// a restart with a key kept elsewhere — it makes one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Intent {
    key: String,
    pub(super) job: JobSpec,
}

impl Intent {
    /// A new intent, with a fresh key (a UUIDv7: time-ordered, so keys sort by when they were made).
    pub fn new(job: JobSpec) -> Self {
        Self::resume(new_key(), job)
    }

    /// The intent an earlier run made under `key` (from an [`IntentError`], or a key the program kept): submitting
    /// it answers with the job that run made, if it made one.
    pub fn resume(key: impl Into<String>, job: JobSpec) -> Self {
        Self {
            key: key.into(),
            job,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn job(&self) -> &JobSpec {
        &self.job
    }

    pub(super) fn error(&self, source: ClientError) -> IntentError {
        IntentError {
            key: self.key.clone(),
            source,
        }
    }
}

/// An intent's request that stopped, with the intent's key: after a give-up or an unreadable answer the job may
/// exist, and only this key finds it.
#[derive(Debug, thiserror::Error)]
#[error("{source} (key {key})")]
pub struct IntentError {
    pub key: String,
    #[source]
    pub source: ClientError,
}

impl IntentError {
    /// Whether the server may hold a job for the intent though no answer said so: every error but a refusal.
    pub fn may_exist(&self) -> bool {
        !matches!(self.source, ClientError::Refused { .. })
    }
}

/// A fresh idempotency key for one intent: a UUIDv7 (time-ordered, so keys sort by when they were made).
pub fn new_key() -> String {
    uuid::Uuid::now_v7().to_string()
}
