//! onejob keeps one job per user intent: however often a request is sent, however many providers are tried.
//!
//! # Layout
//!
//! - [`domain`]: pure types and rules — idempotency keys, job ids, the intent's fingerprint, jobs, attempts and
//!   every state transition. No I/O, no async. Start here to learn what the service promises.
//! - [`store`]: the `JobStore` port (each method one atomic operation) and its adapters; [`store::sqlite`] is the
//!   embedded default.
//! - [`contracts`]: job contracts loaded from `contracts/*.toml`, and input checks against their schemas.
//! - [`http`]: the one axum router (handlers, auth, request reading, problem+json errors, OpenAPI document).
//! - [`server`]: wiring for the local server: config, contracts, store and tokens into the router.
//! - [`config`]: `onejob.toml`, every key documented.
//! - [`clock`]: injected time, so timeouts and leases are tested without sleeping.
//! - [`telemetry`]: `tracing` set-up.
//!
//! The binary `onejob` (in `src/main.rs`) is a thin command line over these.

pub mod clock;
pub mod config;
pub mod contracts;
pub mod domain;
pub mod http;
pub mod server;
pub mod store;
pub mod telemetry;
