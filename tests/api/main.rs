//! HTTP-level tests: the real router on a socket bound to port 0, real concurrency, counted rows.

mod bad_input;
mod create;
mod helpers;
mod read;
