//! kill -9 mid-storm: the real `onejob serve` process on SQLite takes a storm of creates (each intent sent twice)
//! and is killed with SIGKILL while jobs are being created and attempts are running. After a restart on the same
//! file: every acknowledged create is there exactly once, the file passes `PRAGMA integrity_check`, and the sweeper
//! leaves no attempt `started` past its lease.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use chrono::{Duration, Utc};
use onejob::clock::ManualClock;
use onejob::config::Config;
use onejob::domain::AttemptState;
use onejob::providers::keys::ProviderKeys;
use onejob::startup::{self, Process, Role};
use onejob::store::JobStore;
use onejob::store::sqlite::SqliteStore;
use onejob::worker::sweeper::sweep;
use serde_json::json;

use tokio::process::Child;

const CONFIG: &str = r#"
sweep_interval_ms = 60000
[providers.demo]
kind = "demo"
delay_ms = 150
timeout_ms = 2000
late_result_ms = 1000
[providers.demo-backup]
kind = "demo"
"#;

/// Starts `onejob serve` on a free port with the files of `dir`; returns the process and its base URL.
async fn serve(dir: &Path) -> (Child, String) {
    let db = dir.join("onejob.db");
    let config = dir.join("onejob.toml");
    let args = [
        "--db".as_ref(),
        db.as_os_str(),
        "--config".as_ref(),
        config.as_os_str(),
    ];
    support::process::serve(Path::new(env!("CARGO_MANIFEST_DIR")), &args)
        .await
        .unwrap_or_else(|stderr| panic!("the server exited before listening: {stderr}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_mid_storm_loses_no_acknowledged_create_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("onejob.toml"), CONFIG).unwrap();
    let (mut server, url) = serve(dir.path()).await;

    // The storm: 8 clients, each sending every intent twice under its key, until the server dies.
    // Key → the job id its answer named.
    let acknowledged = Arc::new(Mutex::new(BTreeMap::new()));
    let (count, mut counted) = tokio::sync::watch::channel(0usize);
    let count = Arc::new(count);
    let http = reqwest::Client::new();
    let mut clients = Vec::new();
    for c in 0..8 {
        let (http, url, acknowledged, count) = (
            http.clone(),
            url.clone(),
            acknowledged.clone(),
            count.clone(),
        );
        clients.push(tokio::spawn(async move {
            for i in 0.. {
                let key = format!("storm-{c}-{i}");
                for _ in 0..2 {
                    let sent = http
                        .post(format!("{url}/v1/jobs"))
                        .bearer_auth("dev-token-alice")
                        .header("Idempotency-Key", &key)
                        .json(&json!({"contract": "summarize@1", "input": {"text": format!("Intent {c}-{i}.")}}))
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status() == 201 || r.status() == 200 => {
                            let Ok(job) = r.json::<serde_json::Value>().await else {
                                return i;
                            };
                            let id = job["id"].as_str().unwrap().to_owned();
                            let mut acked = acknowledged.lock().unwrap();
                            acked.insert(key.clone(), id);
                            count.send_replace(acked.len());
                        }
                        Ok(r) => panic!("{key}: HTTP {}", r.status()),
                        Err(_) => return i,
                    }
                }
            }
            unreachable!()
        }));
    }
    // Kill once a good number of creates were acknowledged, while clients keep sending.
    counted.wait_for(|n| *n >= 150).await.unwrap();
    server.start_kill().unwrap(); // SIGKILL
    server.wait().await.unwrap();
    for client in clients {
        client.await.unwrap();
    }
    let acknowledged = acknowledged.lock().unwrap().clone();

    // The file survived whole.
    let db = dir.path().join("onejob.db");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let (jobs, keys): (i64, i64) = conn
            .query_row(
                "SELECT COUNT(*), COUNT(DISTINCT idempotency_key) FROM jobs",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(jobs, keys, "one job per key");
        assert!(jobs as usize >= acknowledged.len());
    }

    // After a restart, every acknowledged create is there, once.
    let (mut restarted, url) = serve(dir.path()).await;
    for (key, id) in &acknowledged {
        let job: serde_json::Value = http
            .get(format!("{url}/v1/jobs/{id}"))
            .bearer_auth("dev-token-alice")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(job["idempotency_key"], key.as_str(), "{key}: {job}");
    }
    restarted.start_kill().unwrap();
    restarted.wait().await.unwrap();

    // The sweeper of the next start, once every lease has passed: nothing stays `started`.
    let store: Arc<dyn JobStore> = Arc::new(SqliteStore::open(&db).unwrap());
    // Past every lease, well within the retention.
    let far = Utc::now() + Duration::hours(1);
    let clock = Arc::new(ManualClock::new(far));
    let config = Config::parse(CONFIG, "test").unwrap();
    let (process, _messages) = Process::local(store.clone(), clock.clone());
    let keys = ProviderKeys::default();
    let mut engine = startup::engine(&config, Role::COMMAND, &keys, process).unwrap();
    engine.settings.sweep_batch = 100_000;
    let conn = rusqlite::Connection::open(&db).unwrap();
    let started_past_lease = || -> i64 {
        conn.query_row(
            "SELECT COUNT(*) FROM attempts WHERE state = ?1 AND lease_expires_at < ?2",
            rusqlite::params![
                AttemptState::Started.as_str(),
                (far - Duration::seconds(1)).timestamp_millis()
            ],
            |r| r.get(0),
        )
        .unwrap()
    };
    // Killed mid-attempt: some attempts were left `started` (each takes 150 ms; the kill came mid-storm).
    let left = started_past_lease();
    eprintln!("attempts left started by the kill: {left}");
    assert!(
        left > 0,
        "the kill came between attempts; the test proved nothing"
    );
    sweep(&engine, None).await.unwrap();
    assert_eq!(started_past_lease(), 0);
}
