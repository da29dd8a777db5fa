//! onejob keeps one job per user intent: however often a request is sent, however many providers are tried.
//!
//! # Layout
//!
//! - [`domain`]: pure types and rules — idempotency keys, job ids, the intent's fingerprint, jobs, attempts and
//!   every state transition (all in `domain/job.rs`), failover's decision, the writer's stamp. No I/O, no async.
//!   Start here to learn what the service promises.
//! - [`store`]: the `JobStore` port (each method one atomic operation), with its `EventStore` (endpoints,
//!   deliveries) and `ProviderStore` (breakers, qualification evidence) sides, and their adapters;
//!   [`store::sqlite`] is the embedded default.
//! - [`contracts`]: job contracts (`contracts/*.toml`, compiled in; a config may add files and names their chains):
//!   input checks, prompt rendering, output checks.
//! - [`engine`]: the parts an attempt's life touches, and every write of a job's life — the API's, the worker's
//!   and the sweeper's, each followed by its dispatch, count and change notice — plus the ledger's standings, and
//!   what one process keeps for a moment (creates in flight that duplicates wait for; breakers and evidence read).
//! - [`providers`]: the `Provider` trait and its clients (built-in `demo`, OpenAI-compatible `openai`, Anthropic's
//!   Messages API `anthropic`), their keys (a secret, else the environment) and token counting;
//!   [`providers::checks`], what every call of a contract on a provider must pass, before and after the call; and
//!   [`providers::qualify`], `onejob qualify`: a contract's samples through a provider, the evidence the failover
//!   gate reads.
//! - [`queue`]: the dispatch port (a message names one attempt) and its in-process adapter.
//! - [`worker`]: one step, `process_attempt` (claim, call, complete by compare-and-swap, fail with failover,
//!   time out into `unknown`), the sweeper step, and the local loops around both.
//! - [`metrics`]: counters and histograms on the `metrics` facade: Prometheus text locally, CloudWatch EMF lines on
//!   Lambda.
//! - [`lambda`]: the api, worker and sweeper Lambda functions, as library code the `src/bin/onejob-*` mains run.
//! - [`http`]: the one axum router (handlers, auth, request reading, problem+json errors, OpenAPI document).
//! - [`client`]: the client library over HTTP, without the command line: an `Intent` owns its key for its whole
//!   life, retries with backoff and jitter, a give-up returns the key, waiting ends when the job is settled; and
//!   the terminal view of a job. `onejob jobs …` / `onejob attempts …` are built on it.
//! - [`startup`]: one wiring of an engine from a config (and the provider keys), for every entry point.
//! - [`server`]: the local server: everything above wired together, with the worker and the sweeper running.
//! - [`config`]: `onejob.toml`, every key documented.
//! - [`clock`]: injected time, so timeouts and leases are tested without sleeping.
//! - [`telemetry`]: `tracing` set-up.
//!
//! # Where each rule lives
//!
//! The invariants of `docs/design.md`, and the one place that decides each (the stores apply the domain's rules
//! inside their atomic writes; their guards are in their adapters):
//!
//! | rule | file |
//! |---|---|
//! | 1–3 one job per (owner, key), one 201, a changed payload conflicts | `domain/ids.rs` (the id from owner and key), `domain/fingerprint.rs`, `store/sqlite/schema.rs` (`UNIQUE`), `store/dynamodb/adapter.rs` (conditional put) |
//! | 4 one live attempt; every transition and its refusals | `domain/job.rs` |
//! | 5 not knowing is not failing | `providers/mod.rs` (what an answer means), `worker/mod.rs` (timeout, late window) |
//! | 6–7 the result slot by compare-and-swap, losers discarded | `domain/job.rs` (`complete`), `engine/worker.rs` (logged, counted) |
//! | 8 one provider call per attempt | `engine/worker.rs` (`claim`), `worker/mod.rs` |
//! | 9 failover only to a qualified provider | `domain/failover.rs` (the decision), `engine/mod.rs` (the ledger read) |
//! | 10 owners kept apart | `http/auth.rs`, every store read by owner |
//! | 11 own writes repeated safely, answers kept, caps | `domain/write.rs`, `engine/mod.rs` (`persist`), `domain/report.rs`, `domain/job.rs` (`MAX_INPUT_BYTES`) |
//! | 12 settled | `domain/job.rs` (`settles_at`) |
//! | 13 retention | `domain/job.rs` (`expiry`), each store's reads and `purge_expired` |
//! | 14 one settle, one event id | `domain/job.rs` (`settles_at`), `domain/event.rs` (`event_id`) |
//! | 15 shared state moved only by evidence no owner makes | `providers/mod.rs` (`Reply::provider_failing`), `domain/qualification.rs` (suspicion), `http/providers.rs` (what owners see) |
//! | 16 an answer outranks timers and advisory writes | `worker/mod.rs` (`call`, `settle`, `advise`) |
//! | 17 every caller-driven write is one intent | `domain/ids.rs` (`WriteToken::for_request`), `domain/job.rs` (`add_attempt`, `cancel_attempt`) |
//! | statuses and `code`s of every error | `http/error.rs` |
//!
//! The binary `onejob` (in `src/bin/onejob/`) is a thin command line over these; `src/bin/onejob-{api,worker,sweeper}.rs`
//! are the Lambda mains.

pub mod client;
pub mod clock;
pub mod config;
pub mod contracts;
pub mod engine;
pub mod http;
pub mod lambda;
pub mod metrics;
pub mod providers;
pub mod queue;
pub mod retry;
pub mod server;
pub mod sinks;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod worker;

pub use onejob_core::{domain, json, requests};
