//! onejob keeps one job per user intent: however often a request is sent, however many providers are tried.
//!
//! # Layout
//!
//! From the pure core outwards; no module imports one listed above it that imports it back.
//!
//! - [`domain`], [`json`], [`requests`] (the `onejob-core` crate, `core/`): pure types and rules — idempotency
//!   keys, job ids, the intent's fingerprint, jobs and every transition (`domain/job.rs`), their status and settle
//!   (`domain/status.rs`), failover's decision, the writer's stamp, events, an intent's bill and the price table
//!   (`domain/bill.rs`), owners' limits and ledgers (`domain/limits/`); the strict JSON reader; the request bodies. No I/O, no async. Start here to learn what the service promises.
//! - [`contracts`]: job contracts (`contracts/*.toml`, compiled in; a config may add files and names their chains):
//!   input checks, prompt rendering, output checks.
//! - Ports, each a trait and its adapters: [`store`] (`JobStore`, with its `EventStore` and `ProviderStore` sides;
//!   [`store::sqlite`] the embedded default, [`store::dynamodb`]); [`queue`] (a message names one attempt: in
//!   process, SQS); [`providers`] (the `Provider` trait; [`providers::kinds`], one file per kind behind the `Kind`
//!   trait — demo, OpenAI-compatible, Anthropic, Bedrock —; keys, token counting, [`providers::checks`] every call
//!   must pass, [`providers::qualify`]); [`sinks`] (where
//!   completion events go: the owner's endpoint, the EventBridge bus).
//! - [`engine`]: every write of a job's life, by concept — a caller's (`writes`), a worker's (`attempts`, in the
//!   order `step` keeps: `begin` before the call, `settle` after it), the sweeper's (`sweep`) — each followed by
//!   the one `follow_up`; the create's rules (`intake`); breakers
//!   (`breakers`), the qualification evidence (`qualification`), completion events (`deliveries`), a provider's
//!   calls in flight (`slots`), spend and usage (`usage`). The store, the
//!   queue and the sinks are the engine's own: nothing else reaches them.
//! - [`worker`]: one step, `process_attempt` (the engine's `begin`, the provider's call with its time-out and late
//!   window, the engine's `settle`), the sweeper step, and the local loops around both.
//! - [`http`]: the one axum router: extractors for the request's rules, handlers per resource, problem+json errors,
//!   the OpenAPI document, the page.
//! - [`lambda`], [`server`], [`startup`]: the api, worker and sweeper functions; the local server; one wiring of an
//!   engine from a config for every entry point.
//! - [`client`]: the client library over HTTP (an `Intent` owns its key for its whole life) and the terminal view;
//!   `onejob jobs …` / `onejob attempts …` are built on it.
//! - [`config`] (`onejob.toml`, every key documented), [`metrics`], [`telemetry`], [`clock`] (injected time),
//!   [`retry`] (backoff and `Retry-After`).
//!
//! # Where each rule lives
//!
//! The invariants of `docs/design.md`, and the one place that decides each (the stores apply the domain's rules
//! inside their atomic writes; their guards are in their adapters):
//!
//! | rule | file |
//! |---|---|
//! | 1–3 one job per (owner, key), one 201, a changed payload conflicts | `domain/ids.rs` (the id from owner and key), `domain/fingerprint.rs`, `store/sqlite/schema.rs` (`UNIQUE`), `store/dynamodb/adapter.rs` (conditional put) |
//! | 4 one live attempt; every transition and its refusals | `domain/job.rs`, `domain/transition.rs` (each as the value every store applies) |
//! | 5 not knowing is not failing | `providers/http.rs` (what an answer means), `worker/mod.rs` (timeout, late window) |
//! | 6–7 the result slot by compare-and-swap, losers discarded | `domain/job.rs` (`complete`), `engine/attempts.rs` (logged, counted) |
//! | 8 one provider call per attempt | `engine/attempts.rs` (`claim`), `engine/step.rs` (`begin`) |
//! | 9 failover only to a qualified provider | `domain/failover.rs` (the decision), `engine/qualification.rs` (the evidence read) |
//! | 10 owners kept apart | `http/auth.rs` (owners and operators), every store read by owner, `engine` (`Actor`: an operator's act recorded on the job) |
//! | owners' limits held in the create's write | `domain/limits/` (`OwnerLedger::admit_create`, `admit_attempt`), `store/sqlite/owners.rs`, `store/dynamodb/owners.rs` |
//! | 11 own writes repeated safely, answers kept, caps | `domain/write.rs`, `engine/mod.rs` (`persist`), `domain/report.rs`, `domain/job.rs` (`MAX_INPUT_BYTES`) |
//! | 12 settled | `domain/status.rs` (`settles_at`) |
//! | 13 retention | `domain/job.rs` (`expiry`), each store's reads and `purge_expired` |
//! | 14 one settle, one event id | `domain/status.rs` (`settles_at`), `domain/event.rs` (`event_id`), `engine/follow_up.rs` (armed once per settle) |
//! | 15 shared state moved only by evidence no owner makes | `domain/breaker.rs` (`Health`: what a reply tells of a provider), `providers/mod.rs` (`Reply::health`), `domain/qualification.rs` (suspicion), `http/catalogue.rs` (what owners see) |
//! | 16 an answer outranks timers and advisory writes | `worker/mod.rs` (`listen`), `engine/step.rs` (`settle`: the answer, then `advise`) |
//! | 17 every caller-driven write is one intent | `domain/ids.rs` (`WriteToken::for_request`), `domain/job.rs` (`add_attempt`, `cancel_attempt`), `http/body.rs` (the key) |
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
