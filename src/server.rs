//! The local server: config, contracts, providers, store and tokens wired into the engine and the router; the
//! in-process queue with its worker loop; the sweeper and the deliverer of completion events; all served until
//! shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::Config;
use crate::engine::Engine;
use crate::http::auth::{Auth, Tokens};
use crate::http::{AppState, router};
use crate::providers::keys::ProviderKeys;
use crate::startup::{self, Process, Role, StartError};
use crate::store::JobStore;
use crate::worker;

/// The tokens to accept on `addr`: the configured ones; with none, the dev tokens, on loopback only.
pub fn tokens(config: &Config, addr: SocketAddr) -> Result<Tokens, StartError> {
    if !config.tokens.is_empty() {
        Ok(Tokens::new(config.tokens.clone(), config.operator_tokens()))
    } else if addr.ip().is_loopback() {
        Ok(Tokens::dev())
    } else {
        Err(StartError::NoTokens(addr))
    }
}

pub async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

/// A running local server: the API, the worker loop and the sweeper.
#[derive(Debug)]
pub struct Running {
    pub engine: Arc<Engine>,
    pub addr: SocketAddr,
    stop: oneshot::Sender<()>,
    http: JoinHandle<std::io::Result<()>>,
    worker: JoinHandle<()>,
    sweeper: JoinHandle<()>,
}

/// Starts everything on `listener`, the engine of a process that does it all ([`Role::LOCAL`]): attempts run on
/// the in-process queue; the sweeper runs on `clock`, and delivers events to owners' endpoints and to the bus the
/// config names (with `keys`' AWS settings).
pub fn start(
    listener: TcpListener,
    config: &Config,
    keys: &ProviderKeys,
    store: Arc<dyn JobStore>,
    clock: Arc<dyn Clock>,
    tokens: Tokens,
) -> Result<Running, StartError> {
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let (process, messages) = Process::local(store, clock);
    let engine = Arc::new(startup::engine(config, Role::LOCAL, keys, process)?);
    let state = AppState {
        engine: engine.clone(),
        auth: Arc::new(Auth::Tokens(tokens)),
        body_limit: config.body_limit_bytes,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let http = tokio::spawn(async move {
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async {
                stopped.await.ok();
            })
            .await
    });
    let worker = tokio::spawn(worker::run_local(
        engine.clone(),
        messages,
        config.worker_concurrency,
    ));
    let interval = chrono::Duration::milliseconds(config.sweep_interval_ms as i64);
    // The sweeper and, between its sweeps, the deliverer of completion events: stopped together.
    let sweeper = tokio::spawn({
        let engine = engine.clone();
        async move {
            tokio::join!(
                worker::sweeper::run_local(engine.clone(), interval),
                worker::sweeper::deliver_local(engine),
            );
        }
    });
    Ok(Running {
        engine,
        addr,
        stop,
        http,
        worker,
        sweeper,
    })
}

impl Running {
    /// Serves until `shutdown` resolves, then stops.
    pub async fn serve_until(self, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
        shutdown.await;
        self.stop().await
    }

    /// Lets requests in flight finish, then stops the worker and the sweeper. Attempts still running stay
    /// `started`; after their lease the next sweeper makes them `unknown`.
    pub async fn stop(self) -> Result<(), StartError> {
        let _ = self.stop.send(());
        let served = self.http.await;
        self.worker.abort();
        self.sweeper.abort();
        match served {
            Ok(result) => result.map_err(StartError::Serve),
            Err(e) => Err(StartError::Serve(std::io::Error::other(e))),
        }
    }

    /// Stops everything at once, mid-request and mid-attempt, as a crash would.
    pub fn crash(self) {
        self.http.abort();
        self.worker.abort();
        self.sweeper.abort();
    }
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
