//! `onejob`: the local server and its tools.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use onejob::client::commands::{self, AttemptsCommand, CommandError, JobsCommand, Remote};
use onejob::clock::SystemClock;
use onejob::config::Config;
use onejob::domain::{ContractRef, ProviderName};
use onejob::engine::Engine;
use onejob::http::auth::Tokens;
use onejob::providers::keys::ProviderKeys;
use onejob::providers::qualify;
use onejob::queue::local::LocalQueue;
use onejob::server;
use onejob::startup::{self, SECRET_ARN_VAR, StartError};
use onejob::store::dynamodb::DynamoStore;
use onejob::store::sqlite::SqliteStore;
use onejob::store::{JobStore, StoreError};
use onejob::telemetry::error_chain;

#[derive(Debug, Parser)]
#[command(name = "onejob", version, about = "One job per user intent.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the ledger is, and the config: shared by every command that opens them.
#[derive(Debug, clap::Args)]
struct Ledger {
    /// Where jobs (and qualifications) are kept.
    #[arg(long, value_enum, env = "ONEJOB_STORE", default_value = "sqlite")]
    store: StoreKind,
    /// The DynamoDB table, with `--store dynamodb`. The AWS SDK's usual settings apply, including
    /// AWS_ENDPOINT_URL_DYNAMODB / AWS_ENDPOINT_URL for a local server such as moto.
    #[arg(long, env = "ONEJOB_TABLE", required_if_eq("store", "dynamodb"))]
    table: Option<String>,
    /// The SQLite database file; created with its folder if missing.
    #[arg(long, env = "ONEJOB_DB", default_value = "./data/onejob.db")]
    db: PathBuf,
    /// A config file (see onejob.example.toml); built-in defaults without one.
    #[arg(long, env = "ONEJOB_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API, the worker and the sweeper in one process: on the embedded SQLite store by default.
    Serve {
        #[command(flatten)]
        ledger: Ledger,
        /// Address to listen on. Without configured tokens, only a loopback address is allowed.
        #[arg(long, env = "ONEJOB_ADDR", default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
    },
    /// Check a provider against a contract: every sample input, --runs times, through the real client. The
    /// evidence is stored in the ledger; automatic failover goes only to a qualified provider.
    /// Exit status: 0 qualified, 1 not qualified, 2 could not run.
    Qualify {
        /// The contract, as name@version (e.g. summarize@1).
        contract: String,
        /// The provider's name in the config.
        provider: String,
        /// Runs of each sample input.
        #[arg(long, default_value_t = qualify::DEFAULT_RUNS, value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: u32,
        #[command(flatten)]
        ledger: Ledger,
    },
    /// List the configured providers with their qualification standing per contract.
    Providers {
        #[command(flatten)]
        ledger: Ledger,
    },
    /// Jobs on a running server: create (with retries under one key), get, list, cancel, watch.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// A job's attempts on a running server: retry by hand, cancel.
    Attempts {
        #[command(subcommand)]
        command: AttemptsCommand,
        #[command(flatten)]
        remote: Remote,
    },
    /// Manage the DynamoDB table.
    Table {
        #[command(subcommand)]
        command: TableCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TableCommand {
    /// Create the table with its indexes, TTL and point-in-time recovery; does nothing if it exists.
    Create {
        #[arg(long, env = "ONEJOB_TABLE")]
        table: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    Sqlite,
    Dynamodb,
}

async fn dynamodb(table: String) -> DynamoStore {
    let config = startup::aws_config().await;
    DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), table)
}

/// Why a command could not do its work; printed as one line, exit status 2 (1 is a failed qualification).
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("{0}")]
    Usage(String),
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

impl Ledger {
    async fn open(&self) -> Result<(Arc<dyn JobStore>, String), StoreError> {
        Ok(match (self.store, &self.table) {
            (StoreKind::Dynamodb, Some(table)) => {
                let place = format!("DynamoDB table {table}");
                (Arc::new(dynamodb(table.clone()).await), place)
            }
            _ => (
                Arc::new(SqliteStore::open(&self.db)?),
                format!("SQLite {}", self.db.display()),
            ),
        })
    }

    /// The config (with `ONEJOB_TOKENS` and `ONEJOB_METRICS_TOKEN` applied).
    fn config(&self) -> Result<Config, StartError> {
        let env_tokens = std::env::var("ONEJOB_TOKENS").ok();
        let mut config = Config::load(self.config.as_deref(), env_tokens.as_deref())?;
        if let Ok(token) = std::env::var("ONEJOB_METRICS_TOKEN") {
            config.metrics_token = Some(token);
        }
        Ok(config)
    }

    /// The engine the config describes, on the ledger, for the commands that qualify and report (nothing is
    /// dispatched); and where the ledger is.
    async fn engine(&self) -> Result<(Engine, String), StartError> {
        let config = self.config()?;
        let keys = provider_keys().await?;
        let (store, place) = self.open().await?;
        let (queue, _) = LocalQueue::new();
        let engine = startup::engine(
            &config,
            &keys,
            store,
            Arc::new(SystemClock),
            Arc::new(queue),
        )?;
        Ok((engine, place))
    }
}

/// The provider keys: from the Secrets Manager secret `ONEJOB_SECRET_ARN` names, if it is set (then the AWS SDK's
/// usual settings apply); else none, and each provider's key comes from its environment variable.
async fn provider_keys() -> Result<ProviderKeys, StartError> {
    match std::env::var(SECRET_ARN_VAR) {
        Ok(arn) if !arn.is_empty() => {
            let aws = startup::aws_config().await;
            startup::provider_keys(&aws, Some(&arn)).await
        }
        _ => Ok(ProviderKeys::default()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    onejob::telemetry::init();
    let Cli { command } = Cli::parse();
    let outcome = match command {
        Command::Serve { ledger, addr } => serve(addr, &ledger)
            .await
            .map(|()| ExitCode::SUCCESS)
            .map_err(CliError::from),
        Command::Qualify {
            contract,
            provider,
            runs,
            ledger,
        } => run_qualify(&contract, &provider, runs, &ledger).await,
        Command::Providers { ledger } => list_providers(&ledger).await.map(|()| ExitCode::SUCCESS),
        Command::Jobs { command, remote } => {
            return client_exit(commands::jobs(command, &remote).await);
        }
        Command::Attempts { command, remote } => {
            return client_exit(commands::attempts(command, &remote).await);
        }
        Command::Table {
            command: TableCommand::Create { table },
        } => match dynamodb(table.clone()).await.create_table().await {
            Ok(created) => {
                let done = if created { "created" } else { "already exists" };
                println!("table {table}: {done}");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => Err(e.into()),
        },
    };
    outcome.unwrap_or_else(|e| {
        eprintln!("onejob: {}", error_chain(&e));
        ExitCode::from(2)
    })
}

/// A client command's exit status; its error printed as one line (a refusal with the problem's code and detail).
fn client_exit(outcome: Result<u8, CommandError>) -> ExitCode {
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("onejob: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run_qualify(
    contract: &str,
    provider: &str,
    runs: u32,
    ledger: &Ledger,
) -> Result<ExitCode, CliError> {
    let (engine, place) = ledger.engine().await?;
    let (contracts, providers) = (&engine.contracts, &engine.providers);
    let reference = ContractRef::parse(contract).map_err(|e| CliError::Usage(e.to_string()))?;
    let contract = contracts.get(&reference).ok_or_else(|| {
        let known: Vec<String> = contracts.iter().map(|c| c.reference.to_string()).collect();
        CliError::Usage(format!(
            "no contract {reference}; known: {}",
            known.join(", ")
        ))
    })?;
    let name = ProviderName::parse(provider).map_err(|e| CliError::Usage(e.to_string()))?;
    let configured = providers.get(&name).ok_or_else(|| {
        let known: Vec<String> = providers.iter().map(|(n, _)| n.to_string()).collect();
        CliError::Usage(format!(
            "no provider {name}; configured: {}",
            known.join(", ")
        ))
    })?;
    if contract.samples.is_empty() {
        return Err(CliError::Usage(format!(
            "{reference} has no samples to qualify with; add [[samples]] to its file"
        )));
    }
    eprintln!(
        "qualifying {name} for {reference}: {} samples x {runs} runs at temperature {}",
        contract.samples.len(),
        contract.temperature
    );
    let evidence = qualify::qualify(
        contract,
        &name,
        configured,
        runs,
        &SystemClock,
        |run, done, total| {
            eprintln!("{}", qualify::progress_line(run, done, total));
        },
    )
    .await;
    engine.record_qualification(&evidence).await?;
    print!("{}", qualify::summary(&evidence));
    println!("evidence stored in {place}");
    Ok(if evidence.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn list_providers(ledger: &Ledger) -> Result<(), CliError> {
    let (engine, _) = ledger.engine().await?;
    let providers = &engine.providers;
    let standings = engine.standings().await?;
    println!(
        "{:<16} {:<10} {:<14} {:<12} {:<25} problem",
        "provider", "kind", "contract", "standing", "checked at"
    );
    for (name, rows) in standings {
        let kind = providers.get(&name).map_or("", |p| p.config.kind());
        for row in rows {
            let checked = row.evidence.as_ref().map_or_else(
                || "-".to_owned(),
                |q| {
                    q.checked_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                },
            );
            let problem = row
                .evidence
                .as_ref()
                .and_then(|q| q.first_problem())
                .map_or_else(|| "-".to_owned(), |p| format!("{}: {}", p.code, p.message));
            println!(
                "{:<16} {:<10} {:<14} {:<12} {:<25} {problem}",
                name.as_str(),
                kind,
                row.contract.to_string(),
                row.standing.as_str(),
                checked
            );
        }
    }
    Ok(())
}

async fn serve(addr: SocketAddr, ledger: &Ledger) -> Result<(), StartError> {
    let config = ledger.config()?;
    let keys = provider_keys().await?;
    let (store, place) = ledger.open().await?;
    let tokens = server::tokens(&config, addr)?;
    let listener = server::bind(addr).await?;
    let running = server::start(
        listener,
        &config,
        &keys,
        store,
        Arc::new(SystemClock),
        tokens,
    )?;
    let addr = running.addr;
    tracing::info!(%addr, store = %place, "onejob is listening");
    if config.tokens.is_empty() {
        println!("No tokens configured: accepting these dev tokens on {addr}:");
        for (token, owner) in Tokens::DEV {
            println!("  Authorization: Bearer {token}   (owner {owner})");
        }
        println!(
            "  Authorization: Bearer {}   (operators: GET /metrics)",
            Tokens::DEV_METRICS
        );
    }
    running.serve_until(shutdown_signal()).await?;
    tracing::info!("onejob stopped");
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        tokio::signal::ctrl_c().await.expect("Ctrl-C handler");
    };
    let terminate = async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler")
            .recv()
            .await;
    };
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down; letting requests in flight finish");
}
