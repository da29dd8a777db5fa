//! Start-up: one wiring of an [`Engine`] from a config, for every entry point — `onejob serve`, `onejob qualify` and
//! `onejob providers`, the three Lambda functions and the bench — so that one config file means the same thing
//! everywhere: the same contracts on the same chains, the same providers with the same keys. What differs between
//! the processes is said once, by their [`Role`]: whether they call the providers, and whether they deliver
//! completion events.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::contracts::ContractError;
use crate::domain::ProviderName;
use crate::engine::{Engine, Parts};
use crate::metrics::Metrics;
use crate::providers::keys::{KeysError, ProviderKeys};
use crate::providers::{ProviderConfig, Providers};
use crate::queue::local::LocalQueue;
use crate::queue::{Delivery, Dispatcher};
use crate::sinks::Sinks;
use crate::sinks::bus::BusSink;
use crate::sinks::endpoint::EndpointSink;
use crate::store::{JobStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Contracts(#[from] ContractError),
    #[error(transparent)]
    Keys(#[from] KeysError),
    #[error(transparent)]
    Providers(#[from] crate::providers::NoAwsSettings),
    #[error(
        "the config names the event bus {0}, and this process has no AWS settings to put events on it"
    )]
    NoAwsForBus(String),
    #[error("cannot open the job store")]
    Store(#[from] StoreError),
    #[error(
        "no tokens are configured, so the server may only listen on a loopback address, not {0}; \
         set ONEJOB_TOKENS=\"token=owner,...\" or [tokens] in the config"
    )]
    NoTokens(SocketAddr),
    #[error("the server stopped with an error")]
    Serve(#[source] std::io::Error),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A process's part in a deployment, said once: how it makes its providers (their clients, or described), the bus
/// it puts events on (with EventBridge's client where it delivers: every process arms the events, and the
/// deliverer's claim sends each once), and how it reads its provider keys on AWS. Each is a function, not a flag,
/// so a binary links only the code its role names: the api function carries no provider client's code, no
/// Secrets Manager's and no EventBridge's (BENCHMARKS.md, section 5).
#[derive(Clone, Copy)]
pub struct Role {
    name: &'static str,
    providers: MakeProviders,
    bus: MakeBus,
    keys: ReadKeys,
}

/// A role's providers, from the config's, with `keys`, on the clock.
type MakeProviders = fn(
    &BTreeMap<ProviderName, ProviderConfig>,
    &ProviderKeys,
    Arc<dyn Clock>,
) -> Result<Providers, StartError>;

/// A role's sink for the bus the config names, with `keys`' AWS settings, each put timed out after the duration.
type MakeBus = fn(&str, &ProviderKeys, Duration) -> Result<BusSink, StartError>;

/// A role's provider keys on AWS: those of the secret the ARN names ([`provider_keys`]), or none.
type ReadKeys = for<'a> fn(&'a SdkConfig, Option<&'a str>) -> KeysRead<'a>;

/// The reading of a role's provider keys.
type KeysRead<'a> = Pin<Box<dyn Future<Output = Result<ProviderKeys, StartError>> + Send + 'a>>;

impl Role {
    /// The api function: it describes the providers and calls none (no key read, no client's code), and delivers
    /// nothing.
    pub const API: Self = Self {
        name: "api",
        providers: described,
        bus: not_delivered,
        keys: no_keys,
    };
    /// The worker function: it calls the providers, and delivers nothing.
    pub const WORKER: Self = Self {
        name: "worker",
        providers: called,
        bus: not_delivered,
        keys: secret_keys,
    };
    /// The sweeper function: it calls the providers (qualifying again) and delivers, to endpoints and the bus.
    pub const SWEEPER: Self = Self {
        name: "sweeper",
        providers: called,
        bus: delivered,
        keys: secret_keys,
    };
    /// `onejob serve`: the api, the worker and the sweeper in one process.
    pub const LOCAL: Self = Self {
        name: "local",
        providers: called,
        bus: delivered,
        keys: secret_keys,
    };
    /// A command that qualifies or reports (`onejob qualify`, `onejob providers`, the bench): it calls the
    /// providers, and delivers nothing.
    pub const COMMAND: Self = Self {
        name: "command",
        providers: called,
        bus: not_delivered,
        keys: secret_keys,
    };

    /// The provider keys this role reads on AWS, `aws`'s settings with them: those of the secret `arn` names where
    /// it calls the providers, else none.
    pub async fn keys(
        self,
        aws: &SdkConfig,
        arn: Option<&str>,
    ) -> Result<ProviderKeys, StartError> {
        (self.keys)(aws, arn).await
    }
}

impl std::fmt::Debug for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

fn called(
    configs: &BTreeMap<ProviderName, ProviderConfig>,
    keys: &ProviderKeys,
    clock: Arc<dyn Clock>,
) -> Result<Providers, StartError> {
    Ok(Providers::from_config(configs, keys, clock)?)
}

fn described(
    configs: &BTreeMap<ProviderName, ProviderConfig>,
    _: &ProviderKeys,
    _: Arc<dyn Clock>,
) -> Result<Providers, StartError> {
    Ok(Providers::described(configs))
}

/// The bus's sink without a client: this process arms its events, and never puts one.
fn not_delivered(name: &str, _: &ProviderKeys, timeout: Duration) -> Result<BusSink, StartError> {
    Ok(BusSink::new(name.to_owned(), None, timeout))
}

fn delivered(name: &str, keys: &ProviderKeys, timeout: Duration) -> Result<BusSink, StartError> {
    let aws = keys
        .aws()
        .ok_or_else(|| StartError::NoAwsForBus(name.to_owned()))?;
    let client = aws_sdk_eventbridge::Client::new(aws);
    Ok(BusSink::new(name.to_owned(), Some(client), timeout))
}

fn no_keys<'a>(aws: &'a SdkConfig, _: Option<&'a str>) -> KeysRead<'a> {
    Box::pin(std::future::ready(Ok(
        ProviderKeys::default().with_aws(aws.clone())
    )))
}

fn secret_keys<'a>(aws: &'a SdkConfig, arn: Option<&'a str>) -> KeysRead<'a> {
    Box::pin(provider_keys(aws, arn))
}

/// Where a process keeps its jobs, sends its attempts and tells the time, and how it exports its metrics.
#[derive(Debug)]
pub struct Process {
    pub store: Arc<dyn JobStore>,
    pub queue: Arc<dyn Dispatcher>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Metrics,
}

impl Process {
    /// A process on `store` whose attempts go to the in-process queue (their messages come out of the receiver),
    /// on `clock`, its metrics for Prometheus: the local server, a command, a test's engine.
    pub fn local(
        store: Arc<dyn JobStore>,
        clock: Arc<dyn Clock>,
    ) -> (Self, UnboundedReceiver<Delivery>) {
        let (queue, messages) = LocalQueue::new(clock.clone());
        let process = Self {
            store,
            queue: Arc::new(queue),
            clock,
            metrics: Metrics::prometheus(),
        };
        (process, messages)
    }
}

/// The parts of the engine `config` describes for a process of `role` on `process`: its contracts (built in, and
/// its own files) on the chains it names, loaded once; its providers — their clients with `keys` where the role
/// calls them, else described —; its sinks — the owners' endpoints, and the bus it names, with a client made from
/// `keys`' AWS settings where the role delivers.
pub fn parts(
    config: &Config,
    role: Role,
    keys: &ProviderKeys,
    process: Process,
) -> Result<Parts, StartError> {
    let contracts = config.contracts()?;
    let providers = (role.providers)(&config.providers, keys, process.clock.clone())?;
    let events = config.engine_settings().events;
    let bus = (events.bus.as_deref())
        .map(|name| (role.bus)(name, keys, events.timeout))
        .transpose()?;
    let endpoint = EndpointSink::new(events.timeout, events.allow_private, process.clock.clone());
    Ok(Parts {
        store: process.store,
        queue: process.queue,
        clock: process.clock,
        contracts: Arc::new(contracts),
        providers: Arc::new(providers),
        sinks: Sinks { endpoint, bus },
        metrics: process.metrics,
    })
}

/// The engine [`parts`] makes, with `config`'s settings (its timings, limits, prices).
pub fn engine(
    config: &Config,
    role: Role,
    keys: &ProviderKeys,
    process: Process,
) -> Result<Engine, StartError> {
    let parts = parts(config, role, keys, process)?;
    Ok(Engine::new(parts, config.engine_settings()))
}

/// The provider keys of the secret `arn` names (read now, and again after a key is refused), or none: each
/// provider's key then comes from the environment variable its `api_key_env` names. Bedrock providers sign with
/// `aws`.
pub async fn provider_keys(aws: &SdkConfig, arn: Option<&str>) -> Result<ProviderKeys, StartError> {
    let Some(arn) = arn.filter(|a| !a.is_empty()) else {
        return Ok(ProviderKeys::default().with_aws(aws.clone()));
    };
    let client = aws_sdk_secretsmanager::Client::new(aws);
    let keys = ProviderKeys::from_secrets_manager(&client, arn).await?;
    tracing::info!(secret = arn, names = ?keys.names(), "provider keys read");
    Ok(keys.with_aws(aws.clone()))
}

/// The AWS SDK's config, its usual sources (credentials, region, `AWS_ENDPOINT_URL…`) with onejob's one HTTP
/// client: rustls on ring, the TLS stack reqwest uses too, so the binaries carry one.
pub async fn aws_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(https_client())
        .load()
        .await
}

/// The HTTPS client every AWS SDK client of onejob uses.
pub fn https_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
        .build_https()
}
