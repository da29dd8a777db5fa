//! `onejob.toml`: every key, its default, and where it is used. `onejob.example.toml` at the repository root shows
//! them all with comments. Without a config file the defaults below apply: the demo providers, the built-in
//! contracts on their default chains, no tokens (dev tokens on loopback only). The same file drives `onejob serve`,
//! `onejob qualify` and the three Lambda functions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::contracts::{ContractError, Contracts};
use crate::domain::{
    ContractRef, Fingerprint, Limits, Owner, Price, PriceTable, ProviderName, RetryLimits,
};
use crate::providers::{DemoBehavior, ProviderConfig};

/// Every key is optional: a missing one takes its value from [`Config::default`].
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Contract files to load beside the built-in contracts (one may replace a built-in contract of the same
    /// name@version), relative to the config file's folder.
    pub contract_files: Vec<PathBuf>,
    /// The provider chain each contract runs on, primary first: `"summarize@1" = ["openai", "anthropic"]`. A
    /// contract the config names no chain for runs on its file's default chain.
    pub chains: BTreeMap<ContractRef, Vec<ProviderName>>,
    /// Largest request body accepted, in bytes; larger ones answer 413.
    pub body_limit_bytes: usize,
    /// Bearer token → owner. `ONEJOB_TOKENS="tokenA=alice,tokenB=bob"` adds to (and overrides) these.
    pub tokens: BTreeMap<String, Owner>,
    /// An operator's bearer token, named `operator` (`ONEJOB_METRICS_TOKEN` overrides it): it reads
    /// `GET /metrics` and everything an operator may. With the dev tokens, `dev-token-metrics` is it.
    pub metrics_token: Option<String>,
    /// Operators: who reads every owner's jobs that need a person, acts on them (each act recorded on the job with
    /// its operator's name), reads `/metrics`, the full provider view and any owner's usage.
    pub operators: Operators,
    /// How long a job, and the memory of its idempotency key, is kept; after it, the key makes a new job.
    pub retention_days: u32,
    /// The most attempts one job may have: failover stops there and a manual retry answers 409
    /// `attempt_limit_reached`. At most 25, so that a job always fits a DynamoDB item.
    pub max_attempts_per_job: u32,
    /// Retries of a provider in a row after answers that say the work was not done (429, 503 with
    /// `Retry-After`, a refused connection), each a new attempt not started before the `Retry-After` (or a
    /// backoff from 1 s, doubling, at most 30 s). 0 turns them off.
    pub provider_retries: u32,
    /// Failures of one provider that tell of its health within `breaker_window_ms` that open its breaker (0: no
    /// breakers): no call goes to it for `breaker_cooldown_ms` (a job fails over, or waits unclaimed), then one
    /// call probes it.
    pub breaker_threshold: u32,
    pub breaker_window_ms: u64,
    pub breaker_cooldown_ms: u64,
    /// How long a worker process goes on using a provider's breaker that it read clean, and the qualification
    /// evidence it read, instead of reading them for every attempt (anything that may change them is read
    /// first). A breaker opened by another process is seen this much later. 0: read for every attempt.
    pub provider_state_cache_ms: u64,
    /// The sweeper qualifies again, one pair per sweep, every provider whose qualification passed and that
    /// production suspects (a model it was not qualified as, answers that broke the contract) or that grew too old.
    /// Off by default: it calls the providers, and that costs money. Off, a suspicion only shows in the operators'
    /// view of `GET /v1/providers` until `onejob qualify` runs; it never takes a standing away.
    pub requalify_stale: bool,
    /// Qualification evidence older than this many days qualifies no more (`onejob qualify --stale` renews it).
    pub qualification_max_age_days: u32,
    /// A retry is queued only if it may start within this long of the first try of the run.
    pub provider_retry_within_ms: u64,
    /// The providers jobs may run on, by name.
    pub providers: BTreeMap<ProviderName, ProviderConfig>,
    /// What providers' calls cost (`[prices]`: a currency, and per million tokens by provider or model name).
    /// Without one, the built-in demo providers have illustrative prices and any other provider none: its
    /// attempts' tokens are counted, their cost is not.
    pub prices: Option<PriceTable>,
    /// What each owner may start: `[limits.default]` for every owner, `[limits.owners.NAME]` for one (live jobs at
    /// once, creates a minute, a budget a day or a month). None by default.
    pub limits: Limits,
    /// How many attempts the local worker runs at once.
    pub worker_concurrency: usize,
    /// How often the local server sweeps (expired leases, unclaimed attempts).
    pub sweep_interval_ms: u64,
    /// A `queued` attempt nobody claimed for this long is dispatched again.
    pub redispatch_after_ms: u64,
    /// A claim's lease is the longest provider timeout + late window, plus this.
    pub lease_margin_ms: u64,
    /// Whether owners may register endpoints for completion events on loopback, private or link-local addresses
    /// (a local setup's own receiver). Off by default: the server would otherwise send requests wherever an
    /// owner points it, its own network included. `ONEJOB_ALLOW_PRIVATE_ENDPOINTS=1` turns it on.
    pub allow_private_endpoints: bool,
    /// How long one delivery of a completion event may take.
    pub event_timeout_ms: u64,
    /// After a delivery that did not get a 2xx, the next is tried after this, doubling each time, at most
    /// `event_backoff_cap_ms`; until the endpoint takes it or the job expires.
    pub event_backoff_base_ms: u64,
    pub event_backoff_cap_ms: u64,
    /// An EventBridge bus (name or ARN) that hears of every settled job, its owner's endpoint or not: one entry per
    /// settle, source `onejob`, type `job.settled`, the endpoint's body as its detail. `ONEJOB_EVENT_BUS` sets it.
    pub event_bus: Option<String>,
    /// Whether the built-in contracts (`summarize@1`, `classify@1`) are served beside the config's own. A
    /// deployment with only its own contracts turns them off rather than name chains for them.
    pub built_in_contracts: bool,
    /// The file this config was read from, and the fingerprint of its text: what `/healthz` and each function's
    /// first log line show. Not a key.
    #[serde(skip)]
    pub origin: Option<Origin>,
}

/// Who the operators are (`[operators]`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Operators {
    /// Locally: bearer token → the operator's name.
    pub tokens: BTreeMap<String, String>,
    /// On AWS: the JWT claim that makes a caller an operator, and the value it must hold (a scope's or a group's
    /// name); the operator is named by the token's `sub`.
    pub claim: Option<String>,
    pub value: Option<String>,
}

impl Operators {
    /// The claim rule, when both halves are set.
    pub fn claim(&self) -> Option<crate::http::auth::OperatorClaim> {
        Some(crate::http::auth::OperatorClaim {
            claim: self.claim.clone()?,
            value: self.value.clone()?,
        })
    }
}

/// Where a config came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub path: PathBuf,
    /// SHA-256 of the file's text.
    pub fingerprint: Fingerprint,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid onejob config")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("ONEJOB_TOKENS entry {0:?} is not token=owner with a valid owner")]
    Tokens(String),
    #[error("{0} is not set")]
    Missing(String),
    #[error("providers.{name}: {message}")]
    Provider { name: String, message: String },
    #[error("{0}")]
    Invalid(String),
    #[error(
        "{0} names no providers, and a deployed function serves none it does not name (no demo answers): add a \
         [providers.NAME] table for each provider (kind = \"openai\", \"anthropic\", or \"demo\" to ask for the demo \
         one), then sam build && sam deploy"
    )]
    NoProviders(PathBuf),
}

/// The largest `max_attempts_per_job`: with the largest input and result and every error message at its cap, a job
/// of this many attempts still fits a DynamoDB item.
pub const MAX_ATTEMPTS_LIMIT: u32 = 25;

/// The built-in providers: all demo, each showing one behaviour of the engine (see `docs/tour.md`). None is qualified
/// until `onejob qualify` says so.
fn default_providers() -> BTreeMap<ProviderName, ProviderConfig> {
    let slow = ProviderConfig::demo(DemoBehavior::Answer, 20_000).with_timings(3_000, 30_000);
    [
        ("demo", ProviderConfig::demo(DemoBehavior::Answer, 300)),
        (
            "demo-backup",
            ProviderConfig::demo(DemoBehavior::Answer, 100),
        ),
        ("demo-fail", ProviderConfig::demo(DemoBehavior::Fail, 100)),
        ("demo-slow", slow),
        (
            "demo-sloppy",
            ProviderConfig::demo(DemoBehavior::ExtraKey, 100),
        ),
    ]
    .into_iter()
    .map(|(name, config)| {
        (
            ProviderName::parse(name).expect("a valid built-in name"),
            config,
        )
    })
    .collect()
}

/// Illustrative prices of the built-in demo providers, so that a first run shows bills.
fn demo_prices() -> PriceTable {
    let price = Price {
        input: 0.15,
        output: 0.60,
        cached_input: None,
    };
    PriceTable {
        per_million: (default_providers().into_keys())
            .map(|name| (name.to_string(), price))
            .collect(),
        ..PriceTable::default()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            contract_files: Vec::new(),
            chains: BTreeMap::new(),
            body_limit_bytes: 256 * 1024,
            tokens: BTreeMap::new(),
            metrics_token: None,
            operators: Operators::default(),
            retention_days: 30,
            max_attempts_per_job: crate::domain::Failover::DEFAULT_MAX_ATTEMPTS,
            provider_retries: 2,
            qualification_max_age_days: 30,
            requalify_stale: false,
            breaker_threshold: 5,
            breaker_window_ms: 60_000,
            breaker_cooldown_ms: 30_000,
            provider_state_cache_ms: 100,
            provider_retry_within_ms: 60_000,
            providers: default_providers(),
            prices: None,
            limits: Limits::default(),
            worker_concurrency: 64,
            sweep_interval_ms: 5_000,
            redispatch_after_ms: 30_000,
            lease_margin_ms: 30_000,
            allow_private_endpoints: false,
            event_timeout_ms: 5_000,
            event_backoff_base_ms: 1_000,
            event_backoff_cap_ms: 3_600_000,
            event_bus: None,
            built_in_contracts: true,
            origin: None,
        }
    }
}

impl Config {
    /// The price table: the configured one; without one, the demo providers' illustrative prices if they are the
    /// providers, else none.
    pub fn prices(&self) -> PriceTable {
        match &self.prices {
            Some(prices) => prices.clone(),
            None if self.providers == default_providers() => demo_prices(),
            None => PriceTable::default(),
        }
    }

    /// The operators' tokens and their names: `[operators] tokens`, and `metrics_token` as `operator`.
    pub fn operator_tokens(&self) -> BTreeMap<String, String> {
        let mut tokens = self.operators.tokens.clone();
        if let Some(token) = &self.metrics_token {
            tokens.insert(token.clone(), "operator".into());
        }
        tokens
    }

    /// The built-in contracts and the config's contract files, each on its chain; every provider of every chain
    /// must be configured.
    pub fn contracts(&self) -> Result<Contracts, ContractError> {
        let built_in = self.built_in_contracts;
        Contracts::load(&self.contract_files, &self.chains, built_in, |p| {
            self.providers.contains_key(p)
        })
    }

    pub fn engine_settings(&self) -> crate::engine::EngineSettings {
        crate::engine::EngineSettings {
            lease_margin: chrono::Duration::milliseconds(self.lease_margin_ms as i64),
            redispatch_after: chrono::Duration::milliseconds(self.redispatch_after_ms as i64),
            retention: chrono::Duration::days(i64::from(self.retention_days)),
            max_attempts: self.max_attempts_per_job,
            qualification_max_age: chrono::Duration::days(i64::from(
                self.qualification_max_age_days,
            )),
            requalify_stale: self.requalify_stale,
            breaker_threshold: self.breaker_threshold,
            breaker_window: chrono::Duration::milliseconds(self.breaker_window_ms as i64),
            breaker_cooldown: chrono::Duration::milliseconds(self.breaker_cooldown_ms as i64),
            provider_state_cache: std::time::Duration::from_millis(self.provider_state_cache_ms),
            retry: crate::domain::RetryPolicy {
                max_retries: self.provider_retries,
                within: chrono::Duration::milliseconds(self.provider_retry_within_ms as i64),
                ..crate::engine::EngineSettings::default().retry
            },
            events: crate::engine::EventSettings {
                timeout: std::time::Duration::from_millis(self.event_timeout_ms),
                backoff_base: chrono::Duration::milliseconds(self.event_backoff_base_ms as i64),
                backoff_cap: chrono::Duration::milliseconds(self.event_backoff_cap_ms as i64),
                allow_private: self.allow_private_endpoints,
                bus: self.event_bus.clone(),
            },
            config: self.origin.as_ref().map(|o| o.fingerprint),
            prices: self.prices(),
            limits: self.limits.clone(),
            ..Default::default()
        }
    }

    /// Reads the file if one is named, else the defaults; then adds the tokens of `ONEJOB_TOKENS` if given.
    pub fn load(path: Option<&Path>, env_tokens: Option<&str>) -> Result<Self, ConfigError> {
        let mut config = match path {
            None => Self::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                let mut config = Self::parse(&text, &path.display().to_string())?;
                let folder = path.parent().unwrap_or(Path::new(""));
                for file in &mut config.contract_files {
                    *file = folder.join(&*file);
                }
                config.origin = Some(Origin {
                    path: path.to_owned(),
                    fingerprint: Fingerprint::of_value(&Value::String(text)),
                });
                config
            }
        };
        for entry in env_tokens.unwrap_or_default().split(',').map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            let (token, owner) = entry
                .split_once('=')
                .filter(|(token, _)| !token.is_empty())
                .ok_or_else(|| ConfigError::Tokens(entry.to_owned()))?;
            let owner = Owner::parse(owner).map_err(|_| ConfigError::Tokens(entry.to_owned()))?;
            config.tokens.insert(token.to_owned(), owner);
        }
        Ok(config)
    }

    /// A config from its TOML text; `origin` names where the text came from, for errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::from(origin),
            source: Box::new(source),
        })?;
        for (name, provider) in &config.providers {
            provider.check().map_err(|message| ConfigError::Provider {
                name: name.to_string(),
                message,
            })?;
        }
        if let Some(prices) = &config.prices {
            prices.check().map_err(ConfigError::Invalid)?;
        }
        config.limits.check().map_err(ConfigError::Invalid)?;
        if config.operators.claim.is_some() != config.operators.value.is_some() {
            return Err(ConfigError::Invalid(
                "operators: set both claim and value (the JWT claim, and what it must hold), or neither".into(),
            ));
        }
        let day = RetryLimits::MAX_WITHIN_MS;
        if config.breaker_window_ms > day || config.breaker_cooldown_ms > day {
            return Err(ConfigError::Invalid(format!(
                "breaker_window_ms and breaker_cooldown_ms must be at most {day} (a day)"
            )));
        }
        if config.provider_state_cache_ms > 60_000 {
            return Err(ConfigError::Invalid(
                "provider_state_cache_ms must be at most 60000 (a minute)".into(),
            ));
        }
        if config.qualification_max_age_days == 0 {
            return Err(ConfigError::Invalid(
                "qualification_max_age_days must be at least 1".into(),
            ));
        }
        if config.retention_days == 0 {
            return Err(ConfigError::Invalid(
                "retention_days must be at least 1".into(),
            ));
        }
        let deployment = RetryLimits {
            retries: Some(config.provider_retries),
            retry_within_ms: Some(config.provider_retry_within_ms),
        };
        deployment.check().map_err(|e| {
            ConfigError::Invalid(format!("provider_retries, provider_retry_within_ms: {e}"))
        })?;
        if !(1..=MAX_ATTEMPTS_LIMIT).contains(&config.max_attempts_per_job) {
            return Err(ConfigError::Invalid(format!(
                "max_attempts_per_job must be 1 to {MAX_ATTEMPTS_LIMIT}, so that a job fits every store"
            )));
        }
        Ok(config)
    }
}

mod deployed;
pub mod env;

#[cfg(test)]
mod tests;
