//! The one error a command stops with: what it prints, and its exit status.

use onejob::client::{ClientError, IntentError};
use onejob::startup::StartError;
use onejob::store::StoreError;
use onejob::telemetry::error_chain;

/// Why a command stopped. Printed as one line; the exit status says which kind: 2 for a start or usage problem,
/// the client's own statuses for a request that failed (see `onejob jobs --help`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A create (or the following of its job) that stopped: the key is the only way to ask for the same intent
    /// again, so it is part of the message.
    #[error("{}", create_failure(key, source))]
    Create {
        key: String,
        #[source]
        source: ClientError,
    },
}

impl From<IntentError> for CliError {
    fn from(e: IntentError) -> Self {
        Self::Create {
            key: e.key,
            source: e.source,
        }
    }
}

/// What a stopped create says: when no answer came, the job may exist, and a rerun with the same key finds it
/// instead of making a second one.
fn create_failure(key: &str, source: &ClientError) -> String {
    match source {
        ClientError::Refused { .. } => format!("{source} (key {key})"),
        ClientError::GaveUp { .. } | ClientError::Unexpected(_) => format!(
            "{source}; the job may exist: rerun with --key {key} to ask for this same intent"
        ),
    }
}

impl CliError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Start(_) | Self::Usage(_) => 2,
            Self::Client(e) | Self::Create { source: e, .. } => e.exit_code(),
        }
    }

    /// The line printed: a start problem with its causes; a client's error as it says itself (a refusal with the
    /// problem's code and detail).
    pub(crate) fn message(&self) -> String {
        match self {
            Self::Start(_) | Self::Usage(_) => error_chain(self),
            Self::Client(_) | Self::Create { .. } => self.to_string(),
        }
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        StartError::from(e).into()
    }
}

impl From<onejob::config::ConfigError> for CliError {
    fn from(e: onejob::config::ConfigError) -> Self {
        StartError::from(e).into()
    }
}

impl From<onejob::contracts::ContractError> for CliError {
    fn from(e: onejob::contracts::ContractError) -> Self {
        StartError::from(e).into()
    }
}
