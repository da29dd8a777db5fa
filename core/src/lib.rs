//! onejob's pure core: no I/O, no async, nothing that reaches a network or a disk.
//!
//! - [`domain`]: the types and rules the service promises — idempotency keys, job ids, the intent's fingerprint,
//!   jobs, attempts and every state transition, failover's decision, the writer's stamp, completion events.
//! - [`json`]: the strict JSON reader every request body goes through (nesting bounded before parsing, a member
//!   named twice refused, objects only).
//! - [`requests`]: the bodies of the API's requests, as the reader shapes them.
//!
//! The service (`onejob`) re-exports all three; the fuzz targets and the model checker build this crate alone.

pub mod domain;
pub mod json;
pub mod requests;
