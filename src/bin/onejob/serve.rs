//! `onejob serve`: the API, the worker and the sweeper in one process.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::storage::{Storage, provider_keys};
use onejob::clock::SystemClock;
use onejob::http::auth::Tokens;
use onejob::server;
use onejob::startup::StartError;

pub(crate) async fn serve(addr: SocketAddr, storage: &Storage) -> Result<(), StartError> {
    let config = storage.config()?;
    let keys = provider_keys(&config).await?;
    let (store, place) = storage.open(&config).await?;
    let tokens = server::tokens(&config, addr)?;
    let listener = server::bind(addr).await?;
    let clock = Arc::new(SystemClock);
    let running = server::start(listener, &config, &keys, store, clock, tokens)?;
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
