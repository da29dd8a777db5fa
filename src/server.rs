//! The local server: config, contracts, store and tokens wired into the router, served until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::contracts::{ContractError, Contracts};
use crate::http::auth::Tokens;
use crate::http::{AppState, router};
use crate::store::{JobStore, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Contracts(#[from] ContractError),
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

/// The tokens to accept on `addr`: the configured ones; with none, the dev tokens, on loopback only.
pub fn tokens(config: &Config, addr: SocketAddr) -> Result<Tokens, StartError> {
    if !config.tokens.is_empty() {
        Ok(Tokens::new(config.tokens.clone()))
    } else if addr.ip().is_loopback() {
        Ok(Tokens::dev())
    } else {
        Err(StartError::NoTokens(addr))
    }
}

/// Everything the handlers need, from the config and the parts chosen by the caller.
pub fn app_state(
    config: &Config,
    store: Arc<dyn JobStore>,
    clock: Arc<dyn Clock>,
    tokens: Tokens,
) -> Result<AppState, StartError> {
    let contracts = Contracts::load(&config.contracts_dir, |p| config.providers.contains_key(p))?;
    Ok(AppState {
        store,
        clock,
        contracts: Arc::new(contracts),
        providers: Arc::new(config.providers.clone()),
        tokens: Arc::new(tokens),
        body_limit: config.body_limit_bytes,
    })
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

/// Serves the API on `listener` until `shutdown` resolves, then lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tokens_only_loopback_is_allowed() {
        let config = Config::default();
        assert!(tokens(&config, "127.0.0.1:8080".parse().unwrap()).is_ok());
        assert!(tokens(&config, "[::1]:8080".parse().unwrap()).is_ok());
        let err = tokens(&config, "0.0.0.0:8080".parse().unwrap()).unwrap_err();
        assert!(matches!(err, StartError::NoTokens(_)));
        let configured = Config::load(None, Some("t=alice")).unwrap();
        assert!(tokens(&configured, "0.0.0.0:8080".parse().unwrap()).is_ok());
    }
}
