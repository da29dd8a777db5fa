//! The double-click storm: onejob's server and the floor under the same load, and the floor itself — one INSERT
//! per transaction, and (the machine's limit) the same INSERTs batched many to a transaction.

use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use onejob::clock::SystemClock;
use onejob::http::auth::Tokens;
use onejob::providers::keys::ProviderKeys;
use onejob::store::sqlite::SqliteStore;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::{Scratch, checkpoint, instant_config, percentiles, preload};

/// What one storm run measured.
struct StormRun {
    requests: usize,
    seconds: f64,
    p: (f64, f64, f64),
}

pub(super) async fn storm(intents: usize, dups: usize, conns: usize, preload_n: usize) {
    println!(
        "storm: {intents} intents x {dups} duplicates over {conns} connections; {preload_n} jobs preloaded"
    );
    let mut runs = Vec::new();
    for target in [Target::Onejob, Target::Floor, Target::FloorBatched] {
        let floor = target != Target::Onejob;
        let dir = Scratch::new(target.name());
        let db = dir.join("bench.db");
        if floor {
            preload_floor(&db, preload_n);
        } else {
            preload(&SqliteStore::open(&db).unwrap(), preload_n).await;
        }
        checkpoint(&db);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["serve", "--target", target.name(), "--db"])
            .arg(&db)
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
        let path = match target {
            Target::Onejob => "/v1/jobs",
            Target::Floor => "/floor",
            Target::FloorBatched => "/floor-batched",
        };
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
        let name = target.name();
        let ok = if rows as usize == intents {
            "ok"
        } else {
            "WRONG"
        };
        println!(
            "  {name:<13} {:>8.0} req/s   p50 {:>6.2} ms   p99 {:>7.2} ms   p99.9 {:>7.2} ms   rows {rows} ({ok}: {intents} expected)   server peak RSS {} MiB",
            run.requests as f64 / run.seconds,
            run.p.0,
            run.p.1,
            run.p.2,
            peak_rss_kib / 1024
        );
        runs.push(run);
    }
    let (ours, floor, limit) = (&runs[0], &runs[1], &runs[2]);
    let rate = |run: &StormRun| run.requests as f64 / run.seconds;
    println!(
        "  ratio onejob/floor: throughput {:.2}, p50 {:.2}, p99 {:.2}",
        rate(ours) / rate(floor),
        ours.p.0 / floor.p.0,
        ours.p.1 / floor.p.1
    );
    println!(
        "  share of the machine's limit (floor-batched): onejob {:.2}, floor {:.2}",
        rate(ours) / rate(limit),
        rate(floor) / rate(limit)
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

/// What a `storm` child serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Target {
    /// The real local server (instant demo providers).
    Onejob,
    /// A bare endpoint doing one INSERT under a UNIQUE constraint, one transaction each.
    Floor,
    /// The same INSERTs, many to a transaction: what SQLite can do here.
    FloorBatched,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Self::Onejob => "onejob",
            Self::Floor => "floor",
            Self::FloorBatched => "floor-batched",
        }
    }
}

/// The child of `storm`: serves `target` on a port of its own, printing `ready <addr>`.
pub(super) async fn serve(target: Target, db: &Path) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = match target {
        Target::Onejob => {
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
            return;
        }
        Target::Floor => axum::Router::new()
            .route("/floor", post(floor_insert))
            .with_state(Arc::new(tokio::sync::Mutex::new(floor_db(db)))),
        Target::FloorBatched => axum::Router::new()
            .route("/floor-batched", post(batched_insert))
            .with_state(batcher(floor_db(db))),
    };
    println!("ready {addr}");
    axum::serve(listener, app).await.unwrap();
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
    let key = key_of(&headers);
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
    status_for(inserted == 1)
}

/// One insert waiting for the batched floor's writer, and where its answer goes.
type Insert = (String, String, tokio::sync::oneshot::Sender<bool>);

/// The batched floor's writer: a thread that inserts every waiting row in one transaction, then answers each.
fn batcher(mut conn: rusqlite::Connection) -> std::sync::mpsc::Sender<Insert> {
    let (send, inserts) = std::sync::mpsc::channel::<Insert>();
    std::thread::spawn(move || {
        while let Ok(first) = inserts.recv() {
            let batch: Vec<Insert> = std::iter::once(first)
                .chain(inserts.try_iter().take(255))
                .collect();
            let tx = conn.transaction().unwrap();
            let done: Vec<_> = batch
                .into_iter()
                .map(|(key, body, answer)| {
                    let inserted = tx
                        .prepare_cached(
                            "INSERT INTO intents (owner, key, body) VALUES ('alice', ?1, ?2) ON CONFLICT DO NOTHING",
                        )
                        .unwrap()
                        .execute(rusqlite::params![key, body])
                        .unwrap();
                    (answer, inserted == 1)
                })
                .collect();
            tx.commit().unwrap();
            for (answer, inserted) in done {
                let _ = answer.send(inserted);
            }
        }
    });
    send
}

/// The batched floor: the floor's INSERT, answered after the commit of the batch that holds it.
async fn batched_insert(
    State(writer): State<std::sync::mpsc::Sender<Insert>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    let key = key_of(&headers);
    let (answer, inserted) = tokio::sync::oneshot::channel();
    writer.send((key, body.to_string(), answer)).unwrap();
    status_for(inserted.await.unwrap())
}

/// The floor's view of the request: its idempotency key.
fn key_of(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// 201 for a new row, 200 for a key already there.
fn status_for(inserted: bool) -> StatusCode {
    if inserted {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}
