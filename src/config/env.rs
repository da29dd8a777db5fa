//! The one reader of onejob's environment: every `ONEJOB_*` variable, named here and read here once per process. The
//! command line's flags that a variable may set (`--store`, `--db`, `--addr`, `--url`, `--token`, `--config`) name
//! theirs from here too, for clap to read.

use std::path::PathBuf;

use super::Config;

/// The config file (`onejob.toml`): on Lambda, the config layer's `/opt/onejob.toml`.
pub const CONFIG: &str = "ONEJOB_CONFIG";
/// The DynamoDB table.
pub const TABLE: &str = "ONEJOB_TABLE";
/// The SQS queue of attempts (Lambda).
pub const QUEUE_URL: &str = "ONEJOB_QUEUE_URL";
/// The Secrets Manager secret holding the provider keys.
pub const SECRET_ARN: &str = "ONEJOB_SECRET_ARN";
/// The EventBridge bus every settled job's event goes to (empty: none).
pub const EVENT_BUS: &str = "ONEJOB_EVENT_BUS";
/// The owners' bearer tokens, `token=owner,…` (local).
pub const TOKENS: &str = "ONEJOB_TOKENS";
/// The operators' token for `/metrics` and the operators' views (local).
pub const METRICS_TOKEN: &str = "ONEJOB_METRICS_TOKEN";
/// `1` or `true`: completion events may go to private addresses (a local setup's own receiver).
pub const ALLOW_PRIVATE_ENDPOINTS: &str = "ONEJOB_ALLOW_PRIVATE_ENDPOINTS";
/// `sqlite` or `dynamodb` (the command line's `--store`).
pub const STORE: &str = "ONEJOB_STORE";
/// The SQLite file (`--db`).
pub const DB: &str = "ONEJOB_DB";
/// Where `onejob serve` listens (`--addr`).
pub const ADDR: &str = "ONEJOB_ADDR";
/// The server the command line talks to (`--url`), and the bearer token it sends (`--token`).
pub const URL: &str = "ONEJOB_URL";
pub const TOKEN: &str = "ONEJOB_TOKEN";

/// What the environment says of a process's config and its place in a deployment, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    pub config: Option<PathBuf>,
    pub table: Option<String>,
    pub queue_url: Option<String>,
    pub secret_arn: Option<String>,
    /// `Some("")` turns a bus the config names off.
    pub event_bus: Option<String>,
    pub tokens: Option<String>,
    pub metrics_token: Option<String>,
    pub allow_private_endpoints: bool,
}

impl Env {
    /// The process's environment.
    pub fn read() -> Self {
        Self::from(|name| std::env::var(name).ok())
    }

    /// The environment as `var` reads each variable.
    pub fn from(var: impl Fn(&str) -> Option<String>) -> Self {
        Self {
            config: var(CONFIG).map(PathBuf::from),
            table: var(TABLE),
            queue_url: var(QUEUE_URL),
            secret_arn: var(SECRET_ARN).filter(|arn| !arn.is_empty()),
            event_bus: var(EVENT_BUS),
            tokens: var(TOKENS),
            metrics_token: var(METRICS_TOKEN),
            allow_private_endpoints: var(ALLOW_PRIVATE_ENDPOINTS)
                .is_some_and(|v| v == "1" || v == "true"),
        }
    }

    /// `config` with what the environment sets in its place: the bus (empty: none), the operators' token, private
    /// endpoints allowed.
    pub fn apply(&self, config: &mut Config) {
        if let Some(bus) = &self.event_bus {
            config.event_bus = Some(bus.clone()).filter(|b| !b.is_empty());
        }
        if let Some(token) = &self.metrics_token {
            config.metrics_token = Some(token.clone());
        }
        config.allow_private_endpoints |= self.allow_private_endpoints;
    }
}
