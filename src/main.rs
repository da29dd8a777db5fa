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
    /// Run the API on the embedded SQLite store.
    Serve {
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
}

#[tokio::main]
async fn main() -> ExitCode {
    onejob::telemetry::init();
    let Cli { command } = Cli::parse();
    let outcome = match command {
        Command::Serve { addr, db, config } => serve(addr, db, config).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onejob: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

async fn serve(addr: SocketAddr, db: PathBuf, config: Option<PathBuf>) -> Result<(), StartError> {
    let env_tokens = std::env::var("ONEJOB_TOKENS").ok();
    let config = Config::load(config.as_deref(), env_tokens.as_deref())?;
    let tokens = server::tokens(&config, addr)?;
    let store = Arc::new(SqliteStore::open(&db)?);
    let listener = server::bind(addr).await?;
    let running = server::start(listener, &config, store, Arc::new(SystemClock), tokens)?;
    let addr = running.addr;
    tracing::info!(%addr, db = %db.display(), "onejob is listening");
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
