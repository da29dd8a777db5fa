//! Start-up: one wiring of an [`Engine`] from a config, for every entry point — `onejob serve`, `onejob qualify` and
//! `onejob providers`, the three Lambda functions and the bench — so that one config file means the same thing
//! everywhere: the same contracts on the same chains, the same providers with the same keys.

use std::net::SocketAddr;
use std::sync::Arc;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};

use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::contracts::ContractError;
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::providers::Providers;
use crate::providers::keys::{KeysError, ProviderKeys};
use crate::queue::Dispatcher;
use crate::sinks::Sinks;
use crate::sinks::bus::BusSink;
use crate::sinks::endpoint::EndpointSink;
use crate::store::{JobStore, StoreError};

/// The environment variable naming the Secrets Manager secret that holds the provider keys.
pub const SECRET_ARN_VAR: &str = "ONEJOB_SECRET_ARN";

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

/// The engine `config` describes, on `store`, with `clock`, `dispatcher` and `metrics` (the exporter): its contracts
/// (built in, and its own files) on the chains it names, its `providers` (their clients, as [`providers`] makes
/// them, in a process that calls them), its sinks (the owners' endpoints; the bus it names, put on with `bus` in a
/// process that delivers), its limits.
pub fn engine(
    config: &Config,
    providers: Providers,
    store: Arc<dyn JobStore>,
    clock: Arc<dyn Clock>,
    dispatcher: Arc<dyn Dispatcher>,
    bus: Option<aws_sdk_eventbridge::Client>,
    metrics: Metrics,
) -> Result<Engine, StartError> {
    let contracts = config.contracts()?;
    let settings = config.engine_settings();
    let events = &settings.events;
    let sinks = Sinks {
        endpoint: EndpointSink::new(events.timeout, events.allow_private, clock.clone()),
        bus: (events.bus.clone()).map(|name| BusSink::new(name, bus, events.timeout)),
    };
    Ok(Engine::new(
        store,
        clock,
        Arc::new(contracts),
        Arc::new(providers),
        dispatcher,
        sinks,
        settings,
        metrics,
    ))
}

/// The clients of `config`'s providers, with `keys`, on `clock`: for a process that calls them.
pub fn providers(
    config: &Config,
    keys: &ProviderKeys,
    clock: Arc<dyn Clock>,
) -> Result<Providers, StartError> {
    Ok(Providers::from_config(&config.providers, keys, clock)?)
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
