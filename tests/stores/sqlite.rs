//! The store conformance suite on the embedded SQLite store, plus what only a file-backed store can show.

use std::sync::Arc;

use crate::conformance::{Fixture, RETENTION, at, by, later, new_job};
use onejob::domain::{Endpoint, Owner};
use onejob::store::sqlite::SqliteStore;
use onejob::store::{CreateOutcome, EventStore, JobStore};
use serde_json::json;

async fn sqlite() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("onejob.db")).unwrap();
    Some(Fixture {
        store: Arc::new(store),
        model_cases: 96,
        long_owner_creates: 10_000,
        _keep: Box::new(dir),
    })
}

crate::conformance_suite!(sqlite());

/// The first column of every row `sql` selects, as text.
fn strings(conn: &rusqlite::Connection, sql: &str) -> Vec<String> {
    conn.prepare(sql)
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A write that ends a job arms its deliveries in its own transaction, so no crash comes between a job's end and
/// its event; one that leaves it open arms nothing.
#[tokio::test]
async fn a_write_that_ends_a_job_arms_its_deliveries_in_its_own_transaction() {
    let Fixture { store, _keep, .. } = sqlite().await.unwrap();
    let endpoint = Endpoint::new("https://hooks.example.com/".into(), at(0));
    let alice = Owner::parse("alice").unwrap();
    store.put_endpoint(&alice, Some(&endpoint)).await.unwrap();
    let claimed = crate::conformance::claimed_job(store.as_ref()).await;
    assert_eq!(claimed.owner, alice);
    assert_eq!(store.deliveries(&claimed.id).await.unwrap(), None);

    let (_, ended) = store
        .cancel_job(&claimed.owner, &claimed.id, &by(2))
        .await
        .unwrap();
    let settles_at = ended.settles_at().unwrap();
    let (armed, rev) = store
        .deliveries(&ended.id)
        .await
        .unwrap()
        .expect("armed by the write that ended the job");
    assert_eq!(armed.due_at, Some(settles_at));
    // The engine's arming after the write finds it done, and the write's repeat too: nothing moves.
    assert!(store.arm_deliveries(&ended, settles_at).await.unwrap());
    store
        .cancel_job(&claimed.owner, &claimed.id, &by(2))
        .await
        .unwrap();
    assert_eq!(store.deliveries(&ended.id).await.unwrap().unwrap().1, rev);
}

/// A store that arms every job (a deployment with a bus) arms, in the write that ends it, a job whose owner has no
/// endpoint; one that does not, does not.
#[tokio::test]
async fn a_store_arming_every_job_arms_in_the_write_that_ends_it() {
    for every_job in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("onejob.db"))
            .unwrap()
            .arming_every_job(every_job);
        let claimed = crate::conformance::claimed_job(&store).await;
        let (_, ended) = store
            .cancel_job(&claimed.owner, &claimed.id, &by(2))
            .await
            .unwrap();
        let armed = store.deliveries(&ended.id).await.unwrap();
        assert_eq!(
            armed.map(|(d, _)| d.due_at),
            every_job.then(|| ended.settles_at())
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("onejob.db")).unwrap();
    crate::conformance::a_store_arming_every_job_arms_without_an_endpoint(Arc::new(
        store.arming_every_job(true),
    ))
    .await;
}

#[tokio::test]
async fn jobs_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/folder/onejob.db");
    let job = {
        let store = SqliteStore::open(&path).unwrap();
        let new = new_job("alice", "k", json!({"text": "kept"}));
        let CreateOutcome::Created(job) = store.create_job(new, RETENTION, &by(0)).await.unwrap()
        else {
            panic!("expected a new job");
        };
        job
    };
    let reopened = SqliteStore::open(&path).unwrap();
    assert_eq!(
        reopened
            .get_job(&job.owner, &job.id, later())
            .await
            .unwrap(),
        Some(job.clone())
    );
    let again = reopened
        .create_job(
            new_job("alice", "k", json!({"text": "kept"})),
            RETENTION,
            &by(9),
        )
        .await
        .unwrap();
    assert_eq!(again, CreateOutcome::Replayed(job));
}

/// The database, not the adapter's code, refuses a second live attempt: a row written behind the adapter's back
/// hits the partial unique index.
#[tokio::test]
async fn the_schema_itself_allows_one_live_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.db");
    let store = SqliteStore::open(&path).unwrap();
    let new = new_job("alice", "k", json!({"text": "x"}));
    let job = store
        .create_job(new, RETENTION, &by(0))
        .await
        .unwrap()
        .job()
        .clone();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let second_live = conn.execute(
        "INSERT INTO attempts (job, number, provider, state, created_at, dispatched_at) \
         VALUES ((SELECT seq FROM jobs WHERE id = ?1), 2, 'fallback', 'queued', 0, 0)",
        [job.id.as_str()],
    );
    let err = second_live.unwrap_err();
    assert!(err.to_string().contains("UNIQUE"), "{err}");
    let dup_key = conn.execute(
        "INSERT INTO jobs (id, owner, idempotency_key, fingerprint, contract, input, providers, status, version, \
         created_at, updated_at, expires_at) VALUES ('other', 'alice', 'k', '', '', '{}', '[]', 'queued', 0, 0, 0, 0)",
        [],
    );
    assert!(dup_key.unwrap_err().to_string().contains("UNIQUE"));
    let dup_id = conn.execute(
        "INSERT INTO jobs (id, owner, idempotency_key, fingerprint, contract, input, providers, status, version, \
         created_at, updated_at, expires_at) VALUES (?1, 'alice', 'other', '', '', '{}', '[]', 'queued', 0, 0, 0, 0)",
        [job.id.as_str()],
    );
    assert!(dup_id.unwrap_err().to_string().contains("UNIQUE"));
}

/// The file's schema version, and how many of the attempts' columns `names` (an SQL list) it has.
fn version_and_attempt_columns(conn: &rusqlite::Connection, names: &str) -> (i64, usize) {
    let version = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    let sql = format!("SELECT name FROM pragma_table_info('attempts') WHERE name IN {names}");
    (version, strings(conn, &sql).len())
}

/// A file with one job (key `k` of alice), then taken back to an older schema by `downgrade`; the job as created.
async fn a_file_made_older(downgrade: &str) -> (tempfile::TempDir, CreateOutcome) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.db");
    let store = SqliteStore::open(&path).unwrap();
    let created = store
        .create_job(
            new_job("alice", "k", json!({"text": "x"})),
            RETENTION,
            &by(1),
        )
        .await
        .unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(downgrade).unwrap();
    (dir, created)
}

/// A file made older by `downgrade` ([`a_file_made_older`]), opened again: its job reads as it was written. The
/// folder (kept while it lives), the file's path, the store, the job and its owner.
async fn reopened(
    downgrade: &str,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    SqliteStore,
    onejob::domain::Job,
    onejob::domain::Owner,
) {
    let (dir, created) = a_file_made_older(downgrade).await;
    let path = dir.path().join("onejob.db");
    let store = SqliteStore::open(&path).unwrap();
    let job = created.job().clone();
    let owner = onejob::domain::Owner::parse("alice").unwrap();
    let read = store.get_job(&owner, &job.id, later()).await.unwrap();
    assert_eq!(read.as_ref(), Some(&job));
    (dir, path, store, job, owner)
}

/// A file of schema 4 (no retries yet) gains the retry columns on open, and keeps its jobs; on the way through
/// version 5 its tables are made again with jobs found by `jobs_by_id`, and the jobs move on.
#[tokio::test]
async fn a_version_4_file_gains_the_retry_columns() {
    let (_dir, path, store, job, owner) = reopened(
        "ALTER TABLE attempts DROP COLUMN not_before;
         ALTER TABLE attempts DROP COLUMN retry_of;
         PRAGMA user_version = 4;",
    )
    .await;
    assert_eq!(job.attempt(1).unwrap().not_before, None);
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(
        version_and_attempt_columns(&conn, "('not_before', 'retry_of')"),
        (11, 2)
    );
    let indexes = strings(
        &conn,
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs' ORDER BY name",
    );
    assert_eq!(
        indexes,
        [
            "jobs_by_expiry",
            "jobs_by_id",
            "jobs_by_owner",
            "jobs_live_by_owner",
            "jobs_needing_a_person",
            "sqlite_autoindex_jobs_1"
        ]
    );
    let (outcome, cancelled) = store.cancel_job(&owner, &job.id, &by(2)).await.unwrap();
    assert_eq!(outcome, onejob::domain::JobCancel::Cancelled);
    assert_eq!(
        store.get_job(&owner, &job.id, later()).await.unwrap(),
        Some(cancelled)
    );
}

/// A file of schema 7 (no `Idempotency-Key` on manual attempts and cancels yet) gains the attempts' `request` and
/// `cancelled_by` on open, and on the way through version 8 the jobs' `interventions` and the owners' and call
/// slots' tables; it keeps its jobs, and a keyed cancel of one of its attempts answers as it did when sent again.
#[tokio::test]
async fn a_version_7_file_gains_the_keyed_requests_columns() {
    let (_dir, path, store, job, owner) = reopened(
        "ALTER TABLE attempts DROP COLUMN call_id;
         ALTER TABLE attempts DROP COLUMN cleared_by;
         ALTER TABLE attempts DROP COLUMN cleared_at;
         ALTER TABLE attempts DROP COLUMN request;
         ALTER TABLE attempts DROP COLUMN cancelled_by;
         ALTER TABLE jobs DROP COLUMN interventions;
         DROP TABLE owner_ledgers;
         DROP TABLE call_slots;
         DROP INDEX jobs_live_by_owner;
         DROP INDEX jobs_needing_a_person;
         PRAGMA user_version = 7;",
    )
    .await;
    let nowhere = nowhere();
    let stamp = by(2);
    for _ in 0..2 {
        let (cancel, after) = store
            .cancel_attempt(&owner, &job.id, 1, &nowhere, &stamp)
            .await
            .unwrap();
        assert_eq!(cancel, onejob::domain::AttemptCancel::Cancelled);
        assert_eq!(
            after.attempt(1).unwrap().cancelled_by,
            Some(stamp.token.clone())
        );
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(
        version_and_attempt_columns(&conn, "('request', 'cancelled_by')"),
        (11, 2)
    );
}

fn nowhere() -> onejob::domain::Failover {
    onejob::domain::Failover {
        qualified: Default::default(),
        max_attempts: 10,
        retry: None,
        jitter_permille: 0,
        budget: None,
    }
}

/// A file of schema 9 (attempts do not say how an `unknown` cleared, nor the provider's name of their call) gains
/// `cleared_by`, `cleared_at` and `call_id` on open, keeps its jobs as they were, and records from then on the
/// call's name at its time-out and how its attempts clear.
#[tokio::test]
async fn a_version_9_file_gains_how_unknowns_cleared_and_their_calls_names() {
    let (_dir, path, store, job, owner) = reopened(
        "ALTER TABLE attempts DROP COLUMN call_id;
         ALTER TABLE attempts DROP COLUMN cleared_by;
         ALTER TABLE attempts DROP COLUMN cleared_at;
         PRAGMA user_version = 9;",
    )
    .await;
    store
        .claim_attempt(&job.id, 1, later(), &by(2))
        .await
        .unwrap();
    let unknown = (store.mark_unknown(&job.id, 1, Some("resp_1"), &by(3)))
        .await
        .unwrap();
    assert_eq!(
        unknown.attempt(1).unwrap().call_id.as_deref(),
        Some("resp_1")
    );
    let (cancel, after) = store
        .cancel_attempt(&owner, &job.id, 1, &nowhere(), &by(4))
        .await
        .unwrap();
    assert_eq!(cancel, onejob::domain::AttemptCancel::Cancelled);
    let cleared = after.attempt(1).unwrap().cleared.unwrap();
    assert_eq!(cleared.by, onejob::domain::ClearedBy::Person);
    let conn = rusqlite::Connection::open(&path).unwrap();
    assert_eq!(
        version_and_attempt_columns(&conn, "('cleared_by', 'cleared_at', 'call_id')"),
        (11, 3)
    );
}

/// A file of schema 5 — the job id a unique column of its own — is made again on open with jobs found by
/// `jobs_by_id`: every job and attempt as it was, the key still unique, the id still unique, and its jobs move on.
#[tokio::test]
async fn a_version_5_file_finds_its_jobs_through_the_index_in_creation_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.db");
    let store = SqliteStore::open(&path).unwrap();
    let mut jobs = Vec::new();
    for (key, ms) in [("k1", 1), ("k2", 2)] {
        let created = store
            .create_job(
                new_job("alice", key, json!({"text": key})),
                RETENTION,
                &by(ms),
            )
            .await
            .unwrap();
        jobs.push(created.job().clone());
    }
    let done = store
        .claim_attempt(&jobs[0].id, 1, crate::conformance::at(60_000), &by(3))
        .await
        .unwrap();
    let (_, done) = store
        .complete_attempt(
            &done.id,
            1,
            json!({"summary": "ok"}),
            Default::default(),
            &by(4),
        )
        .await
        .unwrap();
    jobs[0] = done;
    drop(store);
    // The jobs table as version 5 made it.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA foreign_keys = OFF;
         CREATE TABLE jobs_5 (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL,
             idempotency_key TEXT NOT NULL, fingerprint TEXT NOT NULL, contract TEXT NOT NULL, input TEXT NOT NULL,
             providers TEXT NOT NULL, status TEXT NOT NULL, version INTEGER NOT NULL, completed_by INTEGER,
             result TEXT, error TEXT, cancelled_at INTEGER, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
             expires_at INTEGER NOT NULL, cancelled_by TEXT, UNIQUE (owner, idempotency_key)) STRICT;
         INSERT INTO jobs_5 SELECT seq, id, owner, idempotency_key, fingerprint, contract, input, providers, status,
             version, completed_by, result, error, cancelled_at, created_at, updated_at, expires_at, cancelled_by
             FROM jobs;
         DROP TABLE jobs;
         ALTER TABLE jobs_5 RENAME TO jobs;
         CREATE INDEX jobs_by_owner ON jobs (owner, created_at DESC, id DESC);
         CREATE INDEX jobs_by_expiry ON jobs (expires_at);
         PRAGMA user_version = 5;",
    )
    .unwrap();
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let owner = onejob::domain::Owner::parse("alice").unwrap();
    for job in &jobs {
        let read = store.get_job(&owner, &job.id, later()).await.unwrap();
        assert_eq!(read.as_ref(), Some(job));
    }
    let (outcome, _) = store.cancel_job(&owner, &jobs[1].id, &by(5)).await.unwrap();
    assert_eq!(outcome, onejob::domain::JobCancel::Cancelled);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    assert_eq!(version, 11);
    let events = strings(
        &conn,
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('endpoints', 'deliveries') ORDER BY name",
    );
    assert_eq!(
        events,
        ["deliveries", "endpoints"],
        "added by the migration"
    );
    let unique = strings(
        &conn,
        "SELECT i.name || ':' || group_concat(c.name) FROM pragma_index_list('jobs') i, \
             pragma_index_info(i.name) c WHERE i.[unique] GROUP BY i.name ORDER BY i.name",
    );
    // `jobs_by_id`'s first column is the expression `substr(id, 37)`, which has no name.
    assert_eq!(
        unique,
        [
            "jobs_by_id:id",
            "sqlite_autoindex_jobs_1:owner,idempotency_key"
        ]
    );
}

/// A file written by an older version (schema 2: no retention, no tokens, no dispatch record; attempts keyed by
/// the job's id) opens, keeps its jobs with the default 30 days of retention and their attempts, numbers the jobs
/// in the order they were made, and its jobs move on.
#[tokio::test]
async fn a_version_2_file_is_brought_up_to_date() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, idempotency_key TEXT NOT NULL,
             fingerprint TEXT NOT NULL, contract TEXT NOT NULL, input TEXT NOT NULL, providers TEXT NOT NULL,
             status TEXT NOT NULL, version INTEGER NOT NULL, completed_by INTEGER, result TEXT, error TEXT,
             cancelled_at INTEGER, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
             UNIQUE (owner, idempotency_key)) STRICT;
         CREATE INDEX jobs_by_owner ON jobs (owner, created_at DESC, id DESC);
         CREATE TABLE attempts (job_id TEXT NOT NULL REFERENCES jobs (id), number INTEGER NOT NULL,
             provider TEXT NOT NULL, state TEXT NOT NULL, seen_version INTEGER, lease_expires_at INTEGER,
             created_at INTEGER NOT NULL, started_at INTEGER, finished_at INTEGER, error TEXT, report TEXT,
             PRIMARY KEY (job_id, number)) STRICT;
         CREATE UNIQUE INDEX one_live_attempt_per_job ON attempts (job_id)
             WHERE state IN ('queued', 'started', 'unknown');
         CREATE INDEX started_by_lease ON attempts (lease_expires_at) WHERE state = 'started';
         CREATE INDEX queued_by_age ON attempts (created_at) WHERE state = 'queued';
         CREATE TABLE qualifications (contract_fingerprint TEXT NOT NULL, provider_fingerprint TEXT NOT NULL,
             evidence TEXT NOT NULL, PRIMARY KEY (contract_fingerprint, provider_fingerprint)) STRICT;
         PRAGMA user_version = 2;",
    )
    .unwrap();
    let created = crate::conformance::at(0).timestamp_millis();
    let fingerprint =
        onejob::domain::Fingerprint::of_intent("summarize@1", &json!({"text": "old"}), None);
    conn.execute(
        "INSERT INTO jobs VALUES ('job_00000000000000000000000000000001', 'alice', 'k', ?1, 'summarize@1',
             '{\"text\":\"old\"}', '[\"primary\",\"fallback\"]', 'queued', 0, NULL, NULL, NULL, NULL, ?2, ?2)",
        rusqlite::params![fingerprint.to_string(), created],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO attempts (job_id, number, provider, state, created_at)
             VALUES ('job_00000000000000000000000000000001', 1, 'primary', 'queued', ?1)",
        [created],
    )
    .unwrap();
    // An older job (by creation time, though a larger id), whose first attempt failed over to a second.
    conn.execute(
        "INSERT INTO jobs VALUES ('job_ffffffffffffffffffffffffffffffff', 'alice', 'k2', ?1, 'summarize@1',
             '{\"text\":\"old\"}', '[\"primary\",\"fallback\"]', 'queued', 0, NULL, NULL, NULL, NULL, ?2, ?2)",
        rusqlite::params![fingerprint.to_string(), created - 1],
    )
    .unwrap();
    conn.execute_batch(
        "INSERT INTO attempts (job_id, number, provider, state, created_at, error)
             VALUES ('job_ffffffffffffffffffffffffffffffff', 1, 'primary', 'failed', 0,
                     '{\"code\":\"provider_error\",\"message\":\"down\"}');
         INSERT INTO attempts (job_id, number, provider, state, created_at)
             VALUES ('job_ffffffffffffffffffffffffffffffff', 2, 'fallback', 'queued', 0);",
    )
    .unwrap();
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let owner = onejob::domain::Owner::parse("alice").unwrap();
    let id = onejob::domain::JobId::parse("job_00000000000000000000000000000001").unwrap();
    let job = store.get_job(&owner, &id, later()).await.unwrap().unwrap();
    assert_eq!(
        job.expires_at,
        crate::conformance::at(0) + chrono::Duration::days(30)
    );
    let attempt = job.attempt(1).unwrap();
    assert_eq!(
        (attempt.dispatched_at, &attempt.origin),
        (crate::conformance::at(0), &None)
    );
    let older = onejob::domain::JobId::parse("job_ffffffffffffffffffffffffffffffff").unwrap();
    let failed_over = store
        .get_job(&owner, &older, later())
        .await
        .unwrap()
        .unwrap();
    let states: Vec<_> = failed_over.attempts.iter().map(|a| a.state).collect();
    assert_eq!(
        states,
        [
            onejob::domain::AttemptState::Failed,
            onejob::domain::AttemptState::Queued
        ]
    );
    // Version 4 numbers the jobs in the order they were made, and the schema still allows one live attempt.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let order = strings(&conn, "SELECT id FROM jobs ORDER BY seq");
    assert_eq!(order, [older.as_str(), id.as_str()]);
    let second_live = conn.execute(
        "INSERT INTO attempts (job, number, provider, state, created_at, dispatched_at) \
         VALUES ((SELECT seq FROM jobs WHERE id = ?1), 3, 'primary', 'queued', 0, 0)",
        [older.as_str()],
    );
    assert!(second_live.unwrap_err().to_string().contains("UNIQUE"));
    drop(conn);
    let claimed = store.claim_attempt(&id, 1, later(), &by(1)).await.unwrap();
    assert_eq!(claimed.status(), onejob::domain::JobStatus::Running);
    // The key still names the old job: a create with it replays.
    let replay = store
        .create_job(
            new_job("alice", "k", json!({"text": "old"})),
            RETENTION,
            &by(2),
        )
        .await
        .unwrap();
    assert!(matches!(replay, CreateOutcome::Replayed(_)), "{replay:?}");
    assert_eq!(
        SqliteStore::open(&path)
            .unwrap()
            .get_job(&owner, &id, later())
            .await
            .unwrap(),
        Some(claimed)
    );
}
