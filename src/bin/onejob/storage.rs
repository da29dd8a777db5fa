//! Where jobs and evidence are kept (SQLite or DynamoDB), the config, the provider keys, and an engine on them.

use std::path::PathBuf;
use std::sync::Arc;

use onejob::clock::SystemClock;
use onejob::config::Config;
use onejob::config::env::{self, Env};
use onejob::engine::Engine;
use onejob::providers::keys::ProviderKeys;
use onejob::startup::{self, Process, Role, StartError};
use onejob::store::dynamodb::DynamoStore;
use onejob::store::sqlite::SqliteStore;
use onejob::store::{JobStore, StoreError};

/// Where jobs and evidence are kept, and the config: shared by every command that opens them.
#[derive(Debug, clap::Args)]
pub(crate) struct Storage {
    /// Where jobs (and qualifications) are kept.
    #[arg(long, value_enum, env = env::STORE, default_value = "sqlite")]
    pub store: StoreKind,
    /// The DynamoDB table, with `--store dynamodb`. The AWS SDK's usual settings apply, including
    /// AWS_ENDPOINT_URL_DYNAMODB / AWS_ENDPOINT_URL for a local server such as moto.
    #[arg(long, env = env::TABLE, required_if_eq("store", "dynamodb"))]
    pub table: Option<String>,
    /// The SQLite database file; created with its folder if missing.
    #[arg(long, env = env::DB, default_value = "./data/onejob.db")]
    pub db: PathBuf,
    /// A config file (see onejob.example.toml); built-in defaults without one.
    #[arg(long, env = env::CONFIG)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StoreKind {
    Sqlite,
    Dynamodb,
}

pub(crate) async fn dynamodb(table: String) -> DynamoStore {
    let config = startup::aws_config().await;
    DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), table)
}

impl Storage {
    /// The store, arming every ended job's deliveries if `config` names a bus; and where it is.
    pub(crate) async fn open(
        &self,
        config: &Config,
    ) -> Result<(Arc<dyn JobStore>, String), StoreError> {
        let every_job = config.event_bus.is_some();
        Ok(match (self.store, &self.table) {
            (StoreKind::Dynamodb, Some(table)) => {
                let place = format!("DynamoDB table {table}");
                let store = dynamodb(table.clone()).await.arming_every_job(every_job);
                (Arc::new(store), place)
            }
            _ => {
                let store = SqliteStore::open(&self.db)?.arming_every_job(every_job);
                (Arc::new(store), format!("SQLite {}", self.db.display()))
            }
        })
    }

    /// The config, with what the environment sets in its place (`ONEJOB_TOKENS`, `ONEJOB_METRICS_TOKEN`,
    /// `ONEJOB_ALLOW_PRIVATE_ENDPOINTS`, `ONEJOB_EVENT_BUS`).
    pub(crate) fn config(&self) -> Result<Config, StartError> {
        let env = Env::read();
        let mut config = Config::load(self.config.as_deref(), env.tokens.as_deref())?;
        env.apply(&mut config);
        Ok(config)
    }

    /// The engine the config describes, on that store, for the commands that qualify and report (nothing is
    /// dispatched); and where the store is.
    pub(crate) async fn engine(&self) -> Result<(Engine, String), StartError> {
        let config = self.config()?;
        let keys = provider_keys(&config).await?;
        let (store, place) = self.open(&config).await?;
        let (process, _) = Process::local(store, Arc::new(SystemClock));
        let engine = startup::engine(&config, Role::COMMAND, &keys, process)?;
        Ok((engine, place))
    }
}

/// The provider keys: from the Secrets Manager secret `ONEJOB_SECRET_ARN` names, if it is set; else none, and each
/// provider's key comes from its environment variable. Where the secret is read, a provider is on Bedrock or the
/// config names an event bus, the AWS SDK's usual settings (credentials, region, `AWS_ENDPOINT_URL…`) are loaded
/// for them.
pub(crate) async fn provider_keys(config: &Config) -> Result<ProviderKeys, StartError> {
    let arn = Env::read().secret_arn;
    let on_aws = config.event_bus.is_some()
        || (config.providers.values()).any(|p| p.kind.kind().signs_with_aws());
    if arn.is_none() && !on_aws {
        return Ok(ProviderKeys::default());
    }
    let aws = startup::aws_config().await;
    startup::provider_keys(&aws, arn.as_deref()).await
}
