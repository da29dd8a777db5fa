//! HTTP-level tests: the real router on a socket bound to port 0, real concurrency, counted rows.

mod bad_input;
mod bills;
mod create;
mod engine;
mod events;
mod helpers;
mod intents;
mod limits;
mod operators;
mod own_faults;
mod read;
#[path = "../support/mod.rs"]
mod support;
