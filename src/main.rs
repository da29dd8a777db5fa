//! `onejob`: the local server and its tools.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use onejob::clock::SystemClock;
use onejob::config::Config;
use onejob::http::auth::Tokens;
use onejob::server::{self, StartError};
use onejob::store::JobStore;
use onejob::store::dynamodb::DynamoStore;
use onejob::store::sqlite::SqliteStore;
use onejob::telemetry::error_chain;

#[derive(Debug, Parser)]
#[command(name = "onejob", version, about = "One job per user intent.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API, the worker and the sweeper in one process: on the embedded SQLite store by default.
    Serve {
        /// Where jobs are kept.
        #[arg(long, value_enum, env = "ONEJOB_STORE", default_value = "sqlite")]
        store: StoreKind,
        /// The DynamoDB table, with `--store dynamodb`. The AWS SDK's usual settings apply, including
        /// AWS_ENDPOINT_URL_DYNAMODB / AWS_ENDPOINT_URL for a local server such as moto.
        #[arg(long, env = "ONEJOB_TABLE", required_if_eq("store", "dynamodb"))]
        table: Option<String>,
        /// Address to listen on. Without configured tokens, only a loopback address is allowed.
        #[arg(long, env = "ONEJOB_ADDR", default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
        /// The SQLite database file; created with its folder if missing.
        #[arg(long, env = "ONEJOB_DB", default_value = "./data/onejob.db")]
        db: PathBuf,
        /// A config file (see onejob.example.toml); built-in defaults without one.
        #[arg(long, env = "ONEJOB_CONFIG")]
        config: Option<PathBuf>,
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
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    DynamoStore::new(aws_sdk_dynamodb::Client::new(&config), table)
}

#[tokio::main]
async fn main() -> ExitCode {
    onejob::telemetry::init();
    let Cli { command } = Cli::parse();
    let outcome = match command {
        Command::Serve {
            store,
            table,
            addr,
            db,
            config,
        } => {
            let (store, place): (Arc<dyn JobStore>, String) = match (store, table) {
                (StoreKind::Dynamodb, Some(table)) => {
                    let place = format!("DynamoDB table {table}");
                    (Arc::new(dynamodb(table).await), place)
                }
                _ => match SqliteStore::open(&db) {
                    Ok(store) => (Arc::new(store), format!("SQLite {}", db.display())),
                    Err(e) => return fail(&StartError::from(e)),
                },
            };
            serve(addr, store, &place, config).await
        }
        Command::Table {
            command: TableCommand::Create { table },
        } => match dynamodb(table.clone()).await.create_table().await {
            Ok(created) => {
                let done = if created { "created" } else { "already exists" };
                println!("table {table}: {done}");
                Ok(())
            }
            Err(e) => Err(StartError::from(e)),
        },
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &StartError) -> ExitCode {
    eprintln!("onejob: {}", error_chain(e));
    ExitCode::FAILURE
}

async fn serve(
    addr: SocketAddr,
    store: Arc<dyn JobStore>,
    place: &str,
    config: Option<PathBuf>,
) -> Result<(), StartError> {
    let env_tokens = std::env::var("ONEJOB_TOKENS").ok();
    let config = Config::load(config.as_deref(), env_tokens.as_deref())?;
    let tokens = server::tokens(&config, addr)?;
    let listener = server::bind(addr).await?;
    let running = server::start(listener, &config, store, Arc::new(SystemClock), tokens)?;
    let addr = running.addr;
    tracing::info!(%addr, store = place, "onejob is listening");
    if config.tokens.is_empty() {
        println!("No tokens configured: accepting these dev tokens on {addr}:");
        for (token, owner) in Tokens::DEV {
            println!("  Authorization: Bearer {token}   (owner {owner})");
        }
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
