//! The store conformance suite on the embedded SQLite store, plus what only a file-backed store can show.

mod conformance;
mod support;

use std::sync::Arc;

use conformance::{Fixture, RETENTION, by, later, new_job};
use onejob::store::sqlite::SqliteStore;
use onejob::store::{CreateOutcome, JobStore};
use serde_json::json;

async fn sqlite() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("onejob.db")).unwrap();
    Some(Fixture {
        store: Arc::new(store),
        _keep: Box::new(dir),
    })
}

conformance_suite!(sqlite());

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
        "INSERT INTO attempts (job_id, number, provider, state, created_at, dispatched_at) \
         VALUES (?1, 2, 'fallback', 'queued', 0, 0)",
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
}
