//! The store conformance suite on each store — the embedded SQLite store (`sqlite`) and DynamoDB (`dynamodb`,
//! against moto, started by `scripts/test`) — in one test binary, so the suite is built once; beside it, what only
//! each store can show.

#[path = "../conformance/mod.rs"]
mod conformance;
mod dynamodb;
mod sqlite;
#[path = "../support/mod.rs"]
mod support;
mod two_processes;
