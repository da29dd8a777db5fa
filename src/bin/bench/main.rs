//! `cargo run --profile fast --bin bench -- <scenario>`: the figures of BENCHMARKS.md. It prints numbers and never fails
//! on one; the tests stay deterministic.
//!
//! - `storm`: K intents, each sent as D concurrent duplicates, over C connections, against the local server on
//!   SQLite (a child process, so its memory is its own) and against the floor (a bare axum endpoint doing one SQLite
//!   INSERT under a UNIQUE constraint, one transaction each) and the machine's limit (the same INSERTs batched many
//!   to a transaction) under the same load; requests/s, latency percentiles, the ratios, a check that exactly K
//!   rows exist, and each server's peak resident memory.
//! - `lifecycle`: create → the demo provider answers at once → `succeeded`, in process: jobs/s and create-to-result
//!   latency, the orchestration overhead.
//! - `dynamo-cost`: store requests per operation on DynamoDB (moto at `AWS_ENDPOINT_URL`), beside the design's request budget.
//! - `aws-cost`: onejob's own AWS cost per million jobs, from the requests its functions make on moto, at list
//!   prices, beside Step Functions Standard.
//! - `write-units`: DynamoDB write capacity units of one job's lifecycle at a 1 KiB and a 64 KiB input of prose
//!   and of base64, by the documented sizing rules (`onejob::store::dynamodb::write_units`).
//! - `faults`: per provider fault (healthy, slow, a 500 or a dropped connection after the work, a 429), billed calls
//!   per intent, intents answered, jobs left for a person and time to an answer, for each way onejob clears an
//!   `unknown` (hold, lookup, policy) and for the OpenAI SDK's default retries, against one stand-in on loopback.
//! - Each takes `--preload N`: that many jobs in the store before measuring (scale of cost).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use onejob::config::Config;
use onejob::domain::{
    ContractRef, Fingerprint, IdempotencyKey, NewJob, Owner, ProviderName, Stamp,
};
use onejob::providers::{DemoBehavior, ProviderConfig};
use onejob::store::JobStore;
use serde_json::json;

mod aws_cost;
mod dynamo_cost;
mod faults;
mod lambda_init;
mod lifecycle;
mod storm;

use dynamo_cost::dynamo_cost;
use lifecycle::lifecycle;
use storm::{serve, storm};

/// The allocator of the local server (`src/bin/onejob/main.rs`), so that the server measured here is the one users
/// run; the floors in this process run on it too.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(about = "onejob's benchmarks: figures, never verdicts.")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// The double-click storm against the local server and against the floor.
    Storm {
        /// Distinct intents.
        #[arg(long, default_value_t = 2000)]
        intents: usize,
        /// Concurrent duplicates of each intent.
        #[arg(long, default_value_t = 2)]
        dups: usize,
        /// Client connections (requests in flight).
        #[arg(long, default_value_t = 32)]
        conns: usize,
        /// Jobs in the store before the storm.
        #[arg(long, default_value_t = 0)]
        preload: usize,
    },
    /// Create → demo answers at once → succeeded, in process.
    Lifecycle {
        #[arg(long, default_value_t = 2000)]
        jobs: usize,
        /// Jobs in flight.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long, default_value_t = 0)]
        preload: usize,
    },
    /// Store requests per operation on DynamoDB (moto at AWS_ENDPOINT_URL).
    DynamoCost {
        #[arg(long, default_value_t = 0)]
        preload: usize,
        /// Repetitions of each operation.
        #[arg(long, default_value_t = 20)]
        reps: usize,
    },
    /// Write capacity units of one job's lifecycle on DynamoDB, by its sizing rules (no server needed).
    WriteUnits,
    /// onejob's own AWS cost per million jobs, from the requests its functions make on moto (AWS_ENDPOINT_URL), at
    /// list prices, beside Step Functions Standard.
    AwsCost {
        #[arg(long, default_value_t = 200)]
        jobs: usize,
        /// How long a worker waits on the model, in seconds (its invocation lasts as long).
        #[arg(long, default_value_t = 2.0)]
        model_seconds: f64,
    },
    /// Provider faults side by side: onejob's ways to clear an unknown (hold, lookup, policy) and the OpenAI
    /// SDK's default retries, against one stand-in provider on loopback.
    Faults {
        /// Intents per cell.
        #[arg(long, default_value_t = 20)]
        intents: usize,
    },
    /// Cold starts of Lambda bootstraps against a runtime API stand-in: size and init time of each.
    LambdaInit {
        /// The `bootstrap` binaries (e.g. target/lambda/*/bootstrap, built for this machine).
        #[arg(required = true)]
        bootstraps: Vec<PathBuf>,
        #[arg(long, default_value_t = 20)]
        runs: usize,
    },
    /// (internal) Serve the onejob server, the floor or the batched floor for `storm`, printing `ready <addr>`.
    #[command(hide = true)]
    Serve {
        #[arg(long, value_enum)]
        target: storm::Target,
        #[arg(long)]
        db: PathBuf,
    },
}

#[tokio::main]
async fn main() {
    match Cli::parse().scenario {
        Scenario::Storm {
            intents,
            dups,
            conns,
            preload,
        } => storm(intents, dups, conns, preload).await,
        Scenario::Lifecycle {
            jobs,
            concurrency,
            preload,
        } => lifecycle(jobs, concurrency, preload).await,
        Scenario::DynamoCost { preload, reps } => dynamo_cost(preload, reps).await,
        Scenario::WriteUnits => dynamo_cost::write_units_per_lifecycle(),
        Scenario::AwsCost {
            jobs,
            model_seconds,
        } => aws_cost::aws_cost(jobs, model_seconds).await,
        Scenario::Faults { intents } => faults::faults(intents).await,
        Scenario::LambdaInit { bootstraps, runs } => lambda_init::measure(&bootstraps, runs).await,
        Scenario::Serve { target, db } => serve(target, &db).await,
    }
}

// ---- shared -------------------------------------------------------------------------------------------------

/// Demo providers that answer at once, so that the figures are onejob's own.
fn instant_config() -> Config {
    let mut config = Config::default();
    for name in ["demo", "demo-backup"] {
        config.providers.insert(
            ProviderName::parse(name).unwrap(),
            ProviderConfig::demo(DemoBehavior::Answer, 0),
        );
    }
    config
}

fn intent(owner: &Owner, key: &str, text: &str) -> NewJob {
    let input = json!({"text": text});
    NewJob {
        owner: owner.clone(),
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
        contract: ContractRef::parse("summarize@1").unwrap(),
        input,
        providers: vec![
            ProviderName::parse("demo").unwrap(),
            ProviderName::parse("demo-backup").unwrap(),
        ],
    }
}

/// A fresh, empty folder under the system's temporary folder for one run, removed with what it holds when the run
/// drops it (a 100,000-job preload leaves tens of megabytes).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("onejob-bench-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn join(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How long the bench's jobs are kept.
const RETENTION: chrono::Duration = chrono::Duration::days(30);

/// Fills the store with `n` jobs of another owner.
async fn preload(store: &dyn JobStore, n: usize) {
    let owner = Owner::parse("preload").unwrap();
    let now = chrono::Utc::now();
    let mut done = 0;
    while done < n {
        let batch: Vec<_> = (done..(done + 64).min(n))
            .map(|i| {
                let (stamp, owner) = (Stamp::fresh(now), &owner);
                async move {
                    store
                        .create_job(intent(owner, &format!("p{i}"), "x"), RETENTION, &stamp)
                        .await
                }
            })
            .collect();
        for outcome in futures_util::future::join_all(batch).await {
            outcome.unwrap();
        }
        done = (done + 64).min(n);
    }
}

/// Folds the write-ahead log into the database file, so that a measurement does not pay for the preload's
/// checkpoint (both sides of a comparison get the same).
fn checkpoint(db: &std::path::Path) {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

/// p50, p99 and p99.9 of `samples`, in milliseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99), at(0.999))
}
