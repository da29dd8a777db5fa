//! `cargo run --release --bin bench -- <scenario>`: the figures of BENCHMARKS.md. It prints numbers and never fails
//! on one; the tests stay deterministic.
//!
//! - `storm`: K intents, each sent as D concurrent duplicates, over C connections, against the local server on
//!   SQLite (a child process, so its memory is its own) and against the floor (a bare axum endpoint doing one SQLite
//!   INSERT under a UNIQUE constraint) under the same load; requests/s, latency percentiles, the ratio, a check that
//!   exactly K jobs exist, and the server's peak resident memory.
//! - `lifecycle`: create → the demo provider answers at once → `succeeded`, in process: jobs/s and create-to-result
//!   latency, the orchestration overhead.
//! - `dynamo-cost`: store requests per operation on DynamoDB (moto at `AWS_ENDPOINT_URL`), beside the design's request budget.
//! - Each takes `--preload N`: that many jobs in the store before measuring (scale of cost).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use clap::{Parser, Subcommand};
use onejob::clock::SystemClock;
use onejob::config::{Config, DemoBehavior, ProviderConfig};
use onejob::domain::{
    CallReport, ContractRef, Fingerprint, IdempotencyKey, JobId, JobStatus, NewJob, Owner,
    ProviderName, Stamp, WriteToken,
};
use onejob::http::auth::Tokens;
use onejob::providers::keys::ProviderKeys;
use onejob::queue::local::LocalQueue;
use onejob::store::JobStore;
use onejob::store::dynamodb::DynamoStore;
use onejob::store::sqlite::SqliteStore;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

mod lambda_init;

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
    /// Cold starts of Lambda bootstraps against a runtime API stand-in: size and init time of each.
    LambdaInit {
        /// The `bootstrap` binaries (e.g. target/lambda/*/bootstrap, built for this machine).
        #[arg(required = true)]
        bootstraps: Vec<PathBuf>,
        #[arg(long, default_value_t = 20)]
        runs: usize,
    },
    /// (internal) Serve the onejob server or the floor for `storm`, printing `ready <addr>`.
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        floor: bool,
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
        Scenario::LambdaInit { bootstraps, runs } => lambda_init::measure(&bootstraps, runs).await,
        Scenario::Serve { floor, db } => serve(floor, &db).await,
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

/// A fresh, empty folder under the system's temporary folder, for one run.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("onejob-bench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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

/// p50, p99 and p99.9 of `samples`, in milliseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99), at(0.999))
}

// ---- storm --------------------------------------------------------------------------------------------------

/// What one storm run measured.
struct StormRun {
    requests: usize,
    seconds: f64,
    p: (f64, f64, f64),
}

async fn storm(intents: usize, dups: usize, conns: usize, preload_n: usize) {
    println!(
        "storm: {intents} intents x {dups} duplicates over {conns} connections; {preload_n} jobs preloaded"
    );
    let mut runs = Vec::new();
    for floor in [false, true] {
        let dir = scratch(if floor { "floor" } else { "storm" });
        let db = dir.join("bench.db");
        if floor {
            preload_floor(&db, preload_n);
        } else {
            preload(&SqliteStore::open(&db).unwrap(), preload_n).await;
        }
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["serve", "--db"])
            .arg(&db)
            .args(if floor { vec!["--floor"] } else { vec![] })
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut ready,
        )
        .unwrap();
        let addr = ready
            .trim()
            .strip_prefix("ready ")
            .expect("the server says where it listens")
            .to_owned();
        let path = if floor { "/floor" } else { "/v1/jobs" };
        let run = load(&format!("http://{addr}{path}"), intents, dups, conns).await;
        let peak_rss_kib = peak_rss(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        let rows: i64 = rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                if floor {
                    "SELECT COUNT(*) FROM intents WHERE owner = 'alice'"
                } else {
                    "SELECT COUNT(*) FROM jobs WHERE owner = 'alice'"
                },
                [],
                |r| r.get(0),
            )
            .unwrap();
        let name = if floor { "floor" } else { "onejob" };
        let ok = if rows as usize == intents {
            "ok"
        } else {
            "WRONG"
        };
        println!(
            "  {name:<7} {:>8.0} req/s   p50 {:>6.2} ms   p99 {:>7.2} ms   p99.9 {:>7.2} ms   rows {rows} ({ok}: {intents} expected)   server peak RSS {} MiB",
            run.requests as f64 / run.seconds,
            run.p.0,
            run.p.1,
            run.p.2,
            peak_rss_kib / 1024
        );
        runs.push(run);
    }
    let (ours, floor) = (&runs[0], &runs[1]);
    println!(
        "  ratio onejob/floor: throughput {:.2}, p50 {:.2}, p99 {:.2}",
        (ours.requests as f64 / ours.seconds) / (floor.requests as f64 / floor.seconds),
        ours.p.0 / floor.p.0,
        ours.p.1 / floor.p.1
    );
}

/// Sends every intent `dups` times at once, at most `conns` requests in flight; returns what it measured.
async fn load(url: &str, intents: usize, dups: usize, conns: usize) -> StormRun {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(conns)
        .build()
        .unwrap();
    let slots = Arc::new(Semaphore::new(conns));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(intents * dups)));
    let failures = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..intents {
        for _ in 0..dups {
            let (http, url, slots, latencies, failures) = (
                http.clone(),
                url.to_owned(),
                slots.clone(),
                latencies.clone(),
                failures.clone(),
            );
            tasks.spawn(async move {
                let _slot = slots.acquire_owned().await.unwrap();
                let sent = Instant::now();
                let answer = http
                    .post(&url)
                    .bearer_auth("dev-token-alice")
                    .header("Idempotency-Key", format!("storm-{i}"))
                    .json(&json!({"contract": "summarize@1", "input": {"text": format!("Intent {i}.")}}))
                    .send()
                    .await;
                let ok = answer.is_ok_and(|a| a.status() == 201 || a.status() == 200);
                if !ok {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                latencies.lock().unwrap().push(sent.elapsed());
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    let failed = failures.load(Ordering::Relaxed);
    if failed > 0 {
        println!("  ({failed} requests failed)");
    }
    let mut samples = std::mem::take(&mut *latencies.lock().unwrap());
    StormRun {
        requests: samples.len(),
        seconds,
        p: percentiles(&mut samples),
    }
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The child of `storm`: the real local server (instant demo providers), or the floor.
async fn serve(floor: bool, db: &Path) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    if floor {
        let conn = floor_db(db);
        let app = axum::Router::new()
            .route("/floor", post(floor_insert))
            .with_state(Arc::new(tokio::sync::Mutex::new(conn)));
        println!("ready {addr}");
        axum::serve(listener, app).await.unwrap();
    } else {
        let store = Arc::new(SqliteStore::open(db).unwrap());
        let running = onejob::server::start(
            listener,
            &instant_config(),
            &ProviderKeys::default(),
            store,
            Arc::new(SystemClock),
            Tokens::dev(),
        )
        .unwrap();
        println!("ready {addr}");
        running.serve_until(std::future::pending()).await.unwrap();
    }
}

/// The floor's database: one table, one UNIQUE constraint, the store's durability settings.
fn floor_db(db: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS intents \
         (owner TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL, UNIQUE (owner, key)) STRICT",
    )
    .unwrap();
    conn
}

/// Fills the floor's table with `n` rows of another owner.
fn preload_floor(db: &Path, n: usize) {
    let mut conn = floor_db(db);
    let tx = conn.transaction().unwrap();
    for i in 0..n {
        tx.execute(
            "INSERT INTO intents (owner, key, body) VALUES ('preload', ?1, '{}')",
            [format!("p{i}")],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

/// The floor: one INSERT under a UNIQUE constraint, on one connection, as the store's writer does.
async fn floor_insert(
    State(conn): State<Arc<tokio::sync::Mutex<rusqlite::Connection>>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let conn = conn.lock_owned().await;
    let inserted = tokio::task::spawn_blocking(move || {
        conn.execute(
            "INSERT INTO intents (owner, key, body) VALUES ('alice', ?1, ?2) ON CONFLICT DO NOTHING",
            rusqlite::params![key, body.to_string()],
        )
        .unwrap()
    })
    .await
    .unwrap();
    if inserted == 1 {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

// ---- lifecycle ----------------------------------------------------------------------------------------------

async fn lifecycle(jobs: usize, concurrency: usize, preload_n: usize) {
    let dir = scratch("lifecycle");
    let store = Arc::new(SqliteStore::open(&dir.join("bench.db")).unwrap());
    preload(store.as_ref(), preload_n).await;
    let config = instant_config();
    let (queue, messages) = LocalQueue::new();
    let engine = Arc::new(
        onejob::startup::engine(
            &config,
            &ProviderKeys::default(),
            store,
            Arc::new(SystemClock),
            Arc::new(queue),
        )
        .unwrap(),
    );
    let worker = tokio::spawn(onejob::worker::run_local(
        engine.clone(),
        messages,
        config.worker_concurrency,
    ));
    let owner = Owner::parse("alice").unwrap();
    let slots = Arc::new(Semaphore::new(concurrency));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(jobs)));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..jobs {
        let (engine, owner, slots, latencies) = (
            engine.clone(),
            owner.clone(),
            slots.clone(),
            latencies.clone(),
        );
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await.unwrap();
            let mut changes = engine.subscribe();
            let sent = Instant::now();
            let job = engine
                .create_job(intent(&owner, &format!("life-{i}"), "The projector broke."))
                .await
                .unwrap()
                .job()
                .clone();
            loop {
                let now = engine.get_job(&owner, &job.id).await.unwrap().unwrap();
                if now.status() == JobStatus::Succeeded {
                    break;
                }
                // A change of any job wakes us; ours is read again.
                while changes.recv().await.map(|id| id != job.id).unwrap_or(false) {}
            }
            latencies.lock().unwrap().push(sent.elapsed());
        });
    }
    while tasks.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    worker.abort();
    let mut samples = std::mem::take(&mut *latencies.lock().unwrap());
    let (p50, p99, _) = percentiles(&mut samples);
    println!(
        "lifecycle: {jobs} jobs, {concurrency} in flight, {preload_n} preloaded: {:.0} jobs/s   create→succeeded p50 {p50:.2} ms   p99 {p99:.2} ms",
        jobs as f64 / seconds
    );
}

/// Runs one store call; answers how many requests it sent and how long it took. It must succeed.
async fn counted<T, E: std::fmt::Debug>(
    counter: &Counter,
    call: impl Future<Output = Result<T, E>>,
) -> (usize, Duration) {
    let before = counter.0.load(Ordering::Relaxed);
    let started = Instant::now();
    call.await.unwrap();
    (
        counter.0.load(Ordering::Relaxed) - before,
        started.elapsed(),
    )
}

// ---- DynamoDB cost ------------------------------------------------------------------------------------------

/// Counts the requests the SDK sends.
#[derive(Debug, Clone, Default)]
struct Counter(Arc<AtomicUsize>);

impl aws_sdk_dynamodb::config::Intercept for Counter {
    fn name(&self) -> &'static str {
        "bench-request-counter"
    }

    fn read_before_transmit(
        &self,
        _: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

async fn dynamo_cost(preload_n: usize, reps: usize) {
    let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") else {
        eprintln!("dynamo-cost needs AWS_ENDPOINT_URL (moto: see BENCHMARKS.md)");
        std::process::exit(2);
    };
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(onejob::startup::https_client())
        .endpoint_url(&endpoint)
        .load()
        .await;
    let counter = Counter::default();
    let config = aws_sdk_dynamodb::config::Builder::from(&shared)
        .interceptor(counter.clone())
        .build();
    let table = format!("bench-{}", std::process::id());
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::from_conf(config), &table);
    store.create_table().await.unwrap();
    preload(&store, preload_n).await;

    let owner = Owner::parse("alice").unwrap();
    let now = chrono::Utc::now();
    let lease = now + chrono::Duration::minutes(5);
    let mut costs: Vec<(&str, &str, Vec<usize>)> = vec![
        ("create", "1 write", vec![]),
        ("replay", "1 request", vec![]),
        ("conflict", "1 request", vec![]),
        ("claim", "1 conditional write", vec![]),
        ("completion (winner)", "1 conditional write", vec![]),
        ("completion (race loss)", "1 conditional write", vec![]),
        ("job cancel", "1 conditional write", vec![]),
        ("create, repeated", "(answer lost: +1)", vec![]),
        ("claim, repeated", "(answer lost: +1)", vec![]),
        ("completion, repeated", "(answer lost: +1)", vec![]),
    ];
    let mut timings: Vec<Vec<Duration>> = vec![Vec::new(); costs.len()];
    let mut record = |i: usize, (requests, took): (usize, Duration)| {
        costs[i].2.push(requests);
        timings[i].push(took);
    };
    let at = |token: &WriteToken| Stamp::new(token.clone(), now);
    let fresh = async |key: String| {
        let new = intent(&owner, &key, "x");
        let id = JobId::derive(&owner, &new.idempotency_key, now);
        store
            .create_job(new, RETENTION, &Stamp::fresh(now))
            .await
            .unwrap();
        id
    };
    for r in 0..reps {
        let new = intent(&owner, &format!("cost-{r}"), "x");
        let id = JobId::derive(&owner, &new.idempotency_key, now);
        let create = WriteToken::new();
        record(
            0,
            counted(
                &counter,
                store.create_job(new.clone(), RETENTION, &at(&create)),
            )
            .await,
        );
        record(
            7,
            counted(
                &counter,
                store.create_job(new.clone(), RETENTION, &at(&create)),
            )
            .await,
        );
        record(
            1,
            counted(
                &counter,
                store.create_job(new, RETENTION, &Stamp::fresh(now)),
            )
            .await,
        );
        let other = intent(&owner, &format!("cost-{r}"), "y");
        record(
            2,
            counted(
                &counter,
                store.create_job(other, RETENTION, &Stamp::fresh(now)),
            )
            .await,
        );
        let claim = WriteToken::new();
        record(
            3,
            counted(&counter, store.claim_attempt(&id, 1, lease, &at(&claim))).await,
        );
        record(
            8,
            counted(&counter, store.claim_attempt(&id, 1, lease, &at(&claim))).await,
        );

        let win = fresh(format!("win-{r}")).await;
        let step = WriteToken::new();
        store
            .claim_attempt(&win, 1, lease, &at(&step))
            .await
            .unwrap();
        let result = json!({"summary": "w"});
        let stamp = at(&step);
        let completion =
            store.complete_attempt(&win, 1, result.clone(), CallReport::default(), &stamp);
        record(4, counted(&counter, completion).await);
        let completion = store.complete_attempt(&win, 1, result, CallReport::default(), &stamp);
        record(9, counted(&counter, completion).await);

        // The loser: its job was cancelled (the slot taken) while it ran.
        let lose = fresh(format!("lose-{r}")).await;
        let step = WriteToken::new();
        store
            .claim_attempt(&lose, 1, lease, &at(&step))
            .await
            .unwrap();
        store
            .cancel_job(&owner, &lose, &Stamp::fresh(now))
            .await
            .unwrap();
        let result = json!({"summary": "l"});
        let stamp = at(&step);
        let completion = store.complete_attempt(&lose, 1, result, CallReport::default(), &stamp);
        record(5, counted(&counter, completion).await);

        let cancel = fresh(format!("cancel-{r}")).await;
        record(
            6,
            counted(
                &counter,
                store.cancel_job(&owner, &cancel, &Stamp::fresh(now)),
            )
            .await,
        );
    }
    println!(
        "dynamo-cost: {reps} repetitions each, {preload_n} jobs preloaded, moto at {endpoint}"
    );
    println!(
        "  {:<24} {:>9} {:>22} {:>10}",
        "operation", "requests", "budget", "p50 ms"
    );
    for ((name, budget, counts), mut times) in costs.into_iter().zip(timings) {
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        let requests = if min == max {
            min.to_string()
        } else {
            format!("{min}-{max}")
        };
        let (p50, _, _) = percentiles(&mut times);
        println!("  {name:<24} {requests:>9} {budget:>22} {p50:>10.2}");
    }
}
