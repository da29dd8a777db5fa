//! The embedded store: one SQLite file in WAL mode.
//!
//! One writer connection takes every write in a `BEGIN IMMEDIATE` transaction; a few reader connections serve
//! reads beside it. The database itself keeps the invariants that matter most: `UNIQUE(owner, idempotency_key)`
//! decides creates (an `INSERT … ON CONFLICT DO NOTHING`, never a read first), a partial unique index allows one
//! live attempt per job, and every update is guarded by the state it expects — a completion is
//! `UPDATE jobs … WHERE id = ? AND version = ? AND completed_by IS NULL` and must change exactly one row.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{Duration as Retention, TimeZone, Utc};
use rusqlite::{
    Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior, params,
};
use serde_json::Value;
use tokio::sync::Mutex;

use super::{CreateOutcome, Cursor, JobPage, JobStore, ListQuery, StoreError};
use crate::domain::{
    Attempt, AttemptCancel, AttemptRef, AttemptState, CallReport, Completion, ContractRef,
    ErrorInfo, Failover, Fingerprint, IdempotencyKey, Job, JobCancel, JobId, JobStatus, NewJob,
    Owner, ProviderName, Qualification, Refusal, Stamp, Timestamp, WriteToken,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id              TEXT PRIMARY KEY,
    owner           TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    contract        TEXT NOT NULL,
    input           TEXT NOT NULL,
    providers       TEXT NOT NULL,
    status          TEXT NOT NULL,
    version         INTEGER NOT NULL,
    completed_by    INTEGER,
    result          TEXT,
    error           TEXT,
    cancelled_at    INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    cancelled_by    TEXT,
    UNIQUE (owner, idempotency_key)
) STRICT;
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_by_expiry ON jobs (expires_at);
CREATE TABLE IF NOT EXISTS attempts (
    job_id           TEXT NOT NULL REFERENCES jobs (id),
    number           INTEGER NOT NULL,
    provider         TEXT NOT NULL,
    state            TEXT NOT NULL,
    seen_version     INTEGER,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    error            TEXT,
    report           TEXT,
    dispatched_at    INTEGER NOT NULL,
    origin           TEXT,
    writer           TEXT,
    PRIMARY KEY (job_id, number)
) STRICT;
CREATE UNIQUE INDEX IF NOT EXISTS one_live_attempt_per_job
    ON attempts (job_id) WHERE state IN ('queued', 'started', 'unknown');
CREATE INDEX IF NOT EXISTS started_by_lease ON attempts (lease_expires_at) WHERE state = 'started';
CREATE INDEX IF NOT EXISTS queued_by_dispatch ON attempts (dispatched_at) WHERE state = 'queued';
CREATE TABLE IF NOT EXISTS qualifications (
    contract_fingerprint TEXT NOT NULL,
    provider_fingerprint TEXT NOT NULL,
    evidence             TEXT NOT NULL,
    PRIMARY KEY (contract_fingerprint, provider_fingerprint)
) STRICT;
";

/// What version 2 added to version 1: what providers report about calls, and qualification evidence.
const SCHEMA_1_TO_2: &str = "
ALTER TABLE attempts ADD COLUMN report TEXT;
CREATE TABLE IF NOT EXISTS qualifications (
    contract_fingerprint TEXT NOT NULL,
    provider_fingerprint TEXT NOT NULL,
    evidence             TEXT NOT NULL,
    PRIMARY KEY (contract_fingerprint, provider_fingerprint)
) STRICT;
";

/// What version 3 added to version 2: retention (jobs made before keep the default 30 days), when a queued attempt
/// was last dispatched, and the tokens of the writes that made and moved each attempt and cancelled each job.
const SCHEMA_2_TO_3: &str = "
ALTER TABLE jobs ADD COLUMN expires_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN cancelled_by TEXT;
UPDATE jobs SET expires_at = ((created_at + 2592000000 + 999) / 1000) * 1000;
CREATE INDEX IF NOT EXISTS jobs_by_expiry ON jobs (expires_at);
ALTER TABLE attempts ADD COLUMN dispatched_at INTEGER NOT NULL DEFAULT 0;
UPDATE attempts SET dispatched_at = created_at;
ALTER TABLE attempts ADD COLUMN origin TEXT;
ALTER TABLE attempts ADD COLUMN writer TEXT;
DROP INDEX IF EXISTS queued_by_age;
CREATE INDEX IF NOT EXISTS queued_by_dispatch ON attempts (dispatched_at) WHERE state = 'queued';
";

/// The schema version this code writes; `PRAGMA user_version` of the file.
const SCHEMA_VERSION: i64 = 3;

const JOB_COLUMNS: &str = "id, owner, idempotency_key, fingerprint, contract, input, providers, version, \
                           completed_by, result, error, cancelled_at, created_at, updated_at, expires_at, cancelled_by";
const ATTEMPT_COLUMNS: &str = "number, provider, state, seen_version, lease_expires_at, created_at, started_at, \
                               finished_at, error, report, dispatched_at, origin, writer";

/// How many connections serve reads beside the writer.
const READERS: usize = 4;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<Mutex<Connection>>,
    readers: Arc<[Arc<Mutex<Connection>>]>,
    next_reader: Arc<AtomicUsize>,
}

/// What went wrong inside the adapter; it never leaves it except as a [`StoreError`].
#[derive(Debug, thiserror::Error)]
enum SqliteError {
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    #[error("row {0} holds a value this version cannot read: {1}")]
    Corrupt(&'static str, String),
    #[error("a guarded update of {0} changed no row: the row moved under the writer's lock")]
    GuardFailed(&'static str),
}

impl From<SqliteError> for StoreError {
    fn from(e: SqliteError) -> Self {
        StoreError::backend(e)
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        SqliteError::Sql(e).into()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and its schema.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(StoreError::backend)?;
        }
        let mut writer = Connection::open(path)?;
        configure(&writer)?;
        migrate(&mut writer)?;
        let readers = (0..READERS)
            .map(|_| {
                let conn = Connection::open_with_flags(
                    path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                configure(&conn)?;
                Ok(Arc::new(Mutex::new(conn)))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Self {
            writer: Arc::new(Mutex::new(writer)),
            readers: readers.into(),
            next_reader: Arc::default(),
        })
    }

    /// Runs `f` in one read transaction on a reader, so that all its queries see one snapshot: a job row and
    /// its attempts are never read from two sides of a write.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        let mut conn = self.readers[i].clone().lock_owned().await;
        tokio::task::spawn_blocking(move || {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await
        .map_err(StoreError::backend)?
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction on the writer; commits only if `f` succeeds.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let mut conn = self.writer.clone().lock_owned().await;
        tokio::task::spawn_blocking(move || {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
        .await
        .map_err(StoreError::backend)?
    }

    /// Loads a job (not expired by `now`), applies one domain transition and writes back exactly what it changed,
    /// in one transaction. A transition that finds its own write already applied changes nothing, so nothing is
    /// written.
    async fn transition<T: Send + 'static>(
        &self,
        owner: Option<Owner>,
        id: &JobId,
        now: Timestamp,
        apply: impl FnOnce(&mut Job) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<(T, Job), StoreError> {
        let id = id.clone();
        self.write(move |tx| {
            let before = load_job(tx, &id, now)?
                .filter(|job| owner.as_ref().is_none_or(|o| *o == job.owner))
                .ok_or(StoreError::NotFound)?;
            let mut after = before.clone();
            let out = apply(&mut after)?;
            write_back(tx, &before, &after)?;
            Ok((out, after))
        })
        .await
    }
}

/// Brings the file to [`SCHEMA_VERSION`] in one transaction: a new file gets the whole schema, an older file the
/// columns and tables added since its version. A newer file is refused rather than misread.
fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    match version {
        0 => tx.execute_batch(SCHEMA)?,
        1 | 2 => {
            if version == 1 {
                tx.execute_batch(SCHEMA_1_TO_2)?;
            }
            tx.execute_batch(SCHEMA_2_TO_3)?;
        }
        SCHEMA_VERSION => {}
        newer => {
            return Err(SqliteError::Corrupt(
                "user_version",
                format!("schema version {newer} is newer than this build's {SCHEMA_VERSION}"),
            )
            .into());
        }
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

fn configure(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.busy_timeout(Duration::from_secs(5))?;
    // WAL with synchronous=NORMAL: a commit survives a crash of the process; a power loss may take the last few.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create_job(
        &self,
        new: NewJob,
        retention: Retention,
        stamp: &Stamp,
    ) -> Result<CreateOutcome, StoreError> {
        let job = Job::new(new, retention, stamp);
        let token = stamp.token.clone();
        let now = stamp.now;
        self.write(move |tx| {
            if insert_job(tx, &job)? {
                return Ok(CreateOutcome::Created(job));
            }
            let existing = tx
                .query_row(
                    "SELECT id FROM jobs WHERE owner = ?1 AND idempotency_key = ?2",
                    params![job.owner.as_str(), job.idempotency_key.as_str()],
                    |row| row.get::<_, String>(0),
                )
                .optional()?
                .ok_or(SqliteError::GuardFailed(
                    "jobs (insert conflicted, yet no row)",
                ))?;
            let existing = parse_job_id(&existing)?;
            let Some(existing) = load_job(tx, &existing, now)? else {
                // Expired: gone, and its key is free again.
                delete_jobs(tx, &[existing])?;
                if !insert_job(tx, &job)? {
                    return Err(SqliteError::GuardFailed("jobs (expired row came back)").into());
                }
                return Ok(CreateOutcome::Created(job));
            };
            Ok(if existing.created_by(&token) {
                CreateOutcome::Created(existing)
            } else if existing.fingerprint == job.fingerprint {
                CreateOutcome::Replayed(existing)
            } else {
                CreateOutcome::Conflict(existing)
            })
        })
        .await
    }

    async fn get_job(
        &self,
        owner: &Owner,
        id: &JobId,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        let (owner, id) = (owner.clone(), id.clone());
        self.read(move |conn| Ok(load_job(conn, &id, now)?.filter(|job| job.owner == owner)))
            .await
    }

    async fn list_jobs(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        let (owner, query) = (owner.clone(), query.clone());
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {JOB_COLUMNS} FROM jobs \
                 WHERE owner = ?1 AND (?2 IS NULL OR status = ?2) \
                   AND (?3 IS NULL OR (created_at, id) < (?3, ?4)) AND expires_at > ?6 \
                 ORDER BY created_at DESC, id DESC LIMIT ?5"
            ))?;
            let rows = stmt
                .query_map(
                    params![
                        owner.as_str(),
                        query.status.map(JobStatus::as_str),
                        query.cursor.as_ref().map(|c| c.created_at_ms),
                        query.cursor.as_ref().map(|c| c.id.as_str().to_owned()),
                        query.limit as i64 + 1,
                        now.timestamp_millis(),
                    ],
                    JobRow::read,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            let mut jobs = rows
                .into_iter()
                .map(|row| {
                    let attempts = load_attempts(conn, &row.id)?;
                    row.into_job(attempts)
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            let next_cursor = (jobs.len() > query.limit).then(|| {
                jobs.truncate(query.limit);
                Cursor::after(jobs.last().expect("limit is at least 1"))
            });
            Ok(JobPage { jobs, next_cursor })
        })
        .await
    }

    async fn add_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        provider: Option<ProviderName>,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<(u32, Job), StoreError> {
        let (failover, stamp) = (failover.clone(), stamp.clone());
        self.transition(Some(owner.clone()), id, stamp.now, move |job| {
            job.add_attempt(provider, &failover, &stamp)
        })
        .await
    }

    async fn claim_attempt(
        &self,
        id: &JobId,
        number: u32,
        lease_expires_at: Timestamp,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let stamp = stamp.clone();
        let (_, job) = self
            .transition(None, id, stamp.now, move |job| {
                job.claim(number, lease_expires_at, &stamp)
            })
            .await?;
        Ok(job)
    }

    async fn mark_unknown(
        &self,
        id: &JobId,
        number: u32,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let stamp = stamp.clone();
        let (_, job) = self
            .transition(None, id, stamp.now, move |job| {
                job.mark_unknown(number, &stamp)
            })
            .await?;
        Ok(job)
    }

    async fn complete_attempt(
        &self,
        id: &JobId,
        number: u32,
        result: Value,
        report: CallReport,
        stamp: &Stamp,
    ) -> Result<(Completion, Job), StoreError> {
        let stamp = stamp.clone();
        self.transition(None, id, stamp.now, move |job| {
            job.complete(number, result, report, &stamp)
        })
        .await
    }

    async fn fail_attempt(
        &self,
        id: &JobId,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let (failover, stamp) = (failover.clone(), stamp.clone());
        let (_, job) = self
            .transition(None, id, stamp.now, move |job| {
                job.fail(number, error, report, &failover, &stamp)
            })
            .await?;
        Ok(job)
    }

    async fn cancel_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        number: u32,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<(AttemptCancel, Job), StoreError> {
        let (failover, stamp) = (failover.clone(), stamp.clone());
        self.transition(Some(owner.clone()), id, stamp.now, move |job| {
            job.cancel_attempt(number, &failover, &stamp)
        })
        .await
    }

    async fn redispatch(&self, id: &JobId, number: u32, now: Timestamp) -> Result<Job, StoreError> {
        let (_, job) = self
            .transition(None, id, now, move |job| job.redispatch(number, now))
            .await?;
        Ok(job)
    }

    async fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.read(move |conn| {
            attempt_refs(
                conn,
                "SELECT a.job_id, a.number FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE a.state = 'started' AND a.lease_expires_at < ?1 \
                   AND j.cancelled_at IS NULL AND j.expires_at > ?2 \
                 ORDER BY a.lease_expires_at LIMIT ?3",
                now,
                now,
                limit,
            )
        })
        .await
    }

    async fn stale_queued(
        &self,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.read(move |conn| {
            attempt_refs(
                conn,
                "SELECT a.job_id, a.number FROM attempts a JOIN jobs j ON j.id = a.job_id \
                 WHERE a.state = 'queued' AND a.dispatched_at < ?1 \
                   AND j.completed_by IS NULL AND j.cancelled_at IS NULL AND j.expires_at > ?2 \
                 ORDER BY a.dispatched_at LIMIT ?3",
                before,
                now,
                limit,
            )
        })
        .await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.write(move |tx| {
            let ids = tx
                .prepare_cached("SELECT id FROM jobs WHERE expires_at <= ?1 LIMIT ?2")?
                .query_map(params![now.timestamp_millis(), limit as i64], |row| {
                    row.get::<_, String>(0)
                })?
                .collect::<Result<Vec<_>, _>>()?
                .iter()
                .map(|id| parse_job_id(id))
                .collect::<Result<Vec<_>, _>>()?;
            delete_jobs(tx, &ids)?;
            Ok(ids.len())
        })
        .await
    }

    async fn cancel_job(
        &self,
        owner: &Owner,
        id: &JobId,
        stamp: &Stamp,
    ) -> Result<(JobCancel, Job), StoreError> {
        let stamp = stamp.clone();
        self.transition(Some(owner.clone()), id, stamp.now, move |job| {
            job.cancel(&stamp)
        })
        .await
    }

    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError> {
        let row = (
            evidence.contract_fingerprint.to_string(),
            evidence.provider_fingerprint.to_string(),
            json_text(evidence),
        );
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO qualifications (contract_fingerprint, provider_fingerprint, evidence) \
                 VALUES (?1, ?2, ?3) \
                 ON CONFLICT (contract_fingerprint, provider_fingerprint) DO UPDATE SET evidence = ?3",
                params![row.0, row.1, row.2],
            )?;
            Ok(())
        })
        .await
    }

    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError> {
        let key = (contract.to_string(), provider.to_string());
        self.read(move |conn| {
            let evidence: Option<String> = conn
                .prepare_cached(
                    "SELECT evidence FROM qualifications \
                     WHERE contract_fingerprint = ?1 AND provider_fingerprint = ?2",
                )?
                .query_row(params![key.0, key.1], |row| row.get(0))
                .optional()?;
            evidence.map(|e| from_json("evidence", &e)).transpose()
        })
        .await
    }
}

/// Inserts the job and its attempts unless (owner, key) is taken; whether it did.
fn insert_job(tx: &Transaction<'_>, job: &Job) -> Result<bool, StoreError> {
    let inserted = tx.execute(
        &format!(
            "INSERT INTO jobs ({JOB_COLUMNS}, status) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17) \
             ON CONFLICT DO NOTHING"
        ),
        params![
            job.id.as_str(),
            job.owner.as_str(),
            job.idempotency_key.as_str(),
            job.fingerprint.to_string(),
            job.contract.to_string(),
            job.input.to_string(),
            json_text(&job.providers),
            job.version as i64,
            job.completed_by,
            job.result.as_ref().map(Value::to_string),
            job.error.as_ref().map(json_text),
            job.cancelled_at.map(|t| t.timestamp_millis()),
            job.created_at.timestamp_millis(),
            job.updated_at.timestamp_millis(),
            job.expires_at.timestamp_millis(),
            job.cancelled_by.as_ref().map(WriteToken::as_str),
            job.status().as_str(),
        ],
    )?;
    if inserted == 1 {
        for attempt in &job.attempts {
            insert_attempt(tx, &job.id, attempt)?;
        }
    }
    Ok(inserted == 1)
}

fn delete_jobs(tx: &Transaction<'_>, ids: &[JobId]) -> Result<(), StoreError> {
    for id in ids {
        tx.execute("DELETE FROM attempts WHERE job_id = ?1", [id.as_str()])?;
        tx.execute("DELETE FROM jobs WHERE id = ?1", [id.as_str()])?;
    }
    Ok(())
}

/// Writes what a transition changed. Every statement is guarded by the state it replaces and must change exactly
/// one row; the job row's guard `version = ? AND completed_by IS ?` is the result slot's compare-and-swap.
fn write_back(tx: &Transaction<'_>, before: &Job, after: &Job) -> Result<(), StoreError> {
    // The status is derived from the attempts too: two transitions in one millisecond change it without
    // changing any other column of the row.
    let job_changed = (
        after.status(),
        after.version,
        after.completed_by,
        &after.result,
        &after.error,
        after.cancelled_at,
        after.updated_at,
        &after.cancelled_by,
    ) != (
        before.status(),
        before.version,
        before.completed_by,
        &before.result,
        &before.error,
        before.cancelled_at,
        before.updated_at,
        &before.cancelled_by,
    );
    if job_changed {
        let changed = tx.execute(
            "UPDATE jobs SET status = ?1, version = ?2, completed_by = ?3, result = ?4, error = ?5, \
                             cancelled_at = ?6, updated_at = ?7, cancelled_by = ?11 \
             WHERE id = ?8 AND version = ?9 AND completed_by IS ?10",
            params![
                after.status().as_str(),
                after.version as i64,
                after.completed_by,
                after.result.as_ref().map(Value::to_string),
                after.error.as_ref().map(json_text),
                after.cancelled_at.map(|t| t.timestamp_millis()),
                after.updated_at.timestamp_millis(),
                after.id.as_str(),
                before.version as i64,
                before.completed_by,
                after.cancelled_by.as_ref().map(WriteToken::as_str),
            ],
        )?;
        if changed != 1 {
            return Err(SqliteError::GuardFailed("jobs").into());
        }
    }
    for attempt in &after.attempts {
        match before.attempt(attempt.number) {
            None => insert_attempt(tx, &after.id, attempt)?,
            Some(old) if old != attempt => {
                let changed = tx.execute(
                    "UPDATE attempts SET state = ?1, seen_version = ?2, lease_expires_at = ?3, started_at = ?4, \
                                         finished_at = ?5, error = ?6, report = ?7, dispatched_at = ?8, \
                                         writer = ?9 \
                     WHERE job_id = ?10 AND number = ?11 AND state = ?12",
                    params![
                        attempt.state.as_str(),
                        attempt.seen_version.map(|v| v as i64),
                        attempt.lease_expires_at.map(|t| t.timestamp_millis()),
                        attempt.started_at.map(|t| t.timestamp_millis()),
                        attempt.finished_at.map(|t| t.timestamp_millis()),
                        attempt.error.as_ref().map(json_text),
                        attempt.report.as_ref().map(json_text),
                        attempt.dispatched_at.timestamp_millis(),
                        attempt.writer.as_ref().map(WriteToken::as_str),
                        after.id.as_str(),
                        attempt.number,
                        old.state.as_str(),
                    ],
                )?;
                if changed != 1 {
                    return Err(SqliteError::GuardFailed("attempts").into());
                }
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn insert_attempt(tx: &Transaction<'_>, job_id: &JobId, a: &Attempt) -> Result<(), StoreError> {
    tx.execute(
        &format!("INSERT INTO attempts (job_id, {ATTEMPT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"),
        params![
            job_id.as_str(),
            a.number,
            a.provider.as_str(),
            a.state.as_str(),
            a.seen_version.map(|v| v as i64),
            a.lease_expires_at.map(|t| t.timestamp_millis()),
            a.created_at.timestamp_millis(),
            a.started_at.map(|t| t.timestamp_millis()),
            a.finished_at.map(|t| t.timestamp_millis()),
            a.error.as_ref().map(json_text),
            a.report.as_ref().map(json_text),
            a.dispatched_at.timestamp_millis(),
            a.origin.as_ref().map(WriteToken::as_str),
            a.writer.as_ref().map(WriteToken::as_str),
        ],
    )?;
    Ok(())
}

fn attempt_refs(
    conn: &Connection,
    sql: &str,
    bound: Timestamp,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<AttemptRef>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let params = params![
        bound.timestamp_millis(),
        now.timestamp_millis(),
        limit as i64
    ];
    let rows = stmt
        .query_map(params, |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, u32>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(|(id, number)| {
            Ok(AttemptRef {
                job_id: parse_job_id(&id)?,
                number,
            })
        })
        .collect()
}

/// The job, unless it expired by `now` (then it is gone, though its row may wait for the next purge).
fn load_job(conn: &Connection, id: &JobId, now: Timestamp) -> Result<Option<Job>, StoreError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1 AND expires_at > ?2"
        ))?
        .query_row(params![id.as_str(), now.timestamp_millis()], JobRow::read)
        .optional()?;
    match row {
        None => Ok(None),
        Some(row) => {
            let attempts = load_attempts(conn, &row.id)?;
            row.into_job(attempts).map(Some)
        }
    }
}

fn load_attempts(conn: &Connection, job_id: &str) -> Result<Vec<Attempt>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ?1 ORDER BY number"
    ))?;
    let rows = stmt
        .query_map([job_id], AttemptRow::read)?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(AttemptRow::into_attempt).collect()
}

/// A `jobs` row as SQLite hands it over, before the domain types check it.
struct JobRow {
    id: String,
    owner: String,
    idempotency_key: String,
    fingerprint: String,
    contract: String,
    input: String,
    providers: String,
    version: i64,
    completed_by: Option<u32>,
    result: Option<String>,
    error: Option<String>,
    cancelled_at: Option<i64>,
    created_at: i64,
    updated_at: i64,
    expires_at: i64,
    cancelled_by: Option<String>,
}

impl JobRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            id: row.get(0)?,
            owner: row.get(1)?,
            idempotency_key: row.get(2)?,
            fingerprint: row.get(3)?,
            contract: row.get(4)?,
            input: row.get(5)?,
            providers: row.get(6)?,
            version: row.get(7)?,
            completed_by: row.get(8)?,
            result: row.get(9)?,
            error: row.get(10)?,
            cancelled_at: row.get(11)?,
            created_at: row.get(12)?,
            updated_at: row.get(13)?,
            expires_at: row.get(14)?,
            cancelled_by: row.get(15)?,
        })
    }

    fn into_job(self, attempts: Vec<Attempt>) -> Result<Job, StoreError> {
        Ok(Job {
            id: parse_job_id(&self.id)?,
            owner: Owner::parse(&self.owner).map_err(|e| corrupt("owner", e))?,
            idempotency_key: IdempotencyKey::parse(&self.idempotency_key)
                .map_err(|e| corrupt("idempotency_key", e))?,
            fingerprint: Fingerprint::parse(&self.fingerprint)
                .map_err(|e| corrupt("fingerprint", e))?,
            contract: ContractRef::parse(&self.contract).map_err(|e| corrupt("contract", e))?,
            input: from_json("input", &self.input)?,
            providers: from_json("providers", &self.providers)?,
            version: u64::try_from(self.version).map_err(|e| corrupt("version", e))?,
            completed_by: self.completed_by,
            result: self.result.map(|r| from_json("result", &r)).transpose()?,
            error: self.error.map(|e| from_json("error", &e)).transpose()?,
            cancelled_at: self.cancelled_at.map(millis).transpose()?,
            attempts,
            created_at: millis(self.created_at)?,
            updated_at: millis(self.updated_at)?,
            expires_at: millis(self.expires_at)?,
            cancelled_by: self.cancelled_by.as_deref().map(token).transpose()?,
        })
    }
}

/// An `attempts` row as SQLite hands it over.
struct AttemptRow {
    number: u32,
    provider: String,
    state: String,
    seen_version: Option<i64>,
    lease_expires_at: Option<i64>,
    created_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    error: Option<String>,
    report: Option<String>,
    dispatched_at: i64,
    origin: Option<String>,
    writer: Option<String>,
}

impl AttemptRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            number: row.get(0)?,
            provider: row.get(1)?,
            state: row.get(2)?,
            seen_version: row.get(3)?,
            lease_expires_at: row.get(4)?,
            created_at: row.get(5)?,
            started_at: row.get(6)?,
            finished_at: row.get(7)?,
            error: row.get(8)?,
            report: row.get(9)?,
            dispatched_at: row.get(10)?,
            origin: row.get(11)?,
            writer: row.get(12)?,
        })
    }

    fn into_attempt(self) -> Result<Attempt, StoreError> {
        Ok(Attempt {
            number: self.number,
            provider: ProviderName::parse(&self.provider).map_err(|e| corrupt("provider", e))?,
            state: AttemptState::parse(&self.state).ok_or_else(|| corrupt("state", &self.state))?,
            seen_version: self
                .seen_version
                .map(|v| u64::try_from(v).map_err(|e| corrupt("seen_version", e)))
                .transpose()?,
            lease_expires_at: self.lease_expires_at.map(millis).transpose()?,
            created_at: millis(self.created_at)?,
            started_at: self.started_at.map(millis).transpose()?,
            finished_at: self.finished_at.map(millis).transpose()?,
            error: self.error.map(|e| from_json("error", &e)).transpose()?,
            report: self.report.map(|r| from_json("report", &r)).transpose()?,
            dispatched_at: millis(self.dispatched_at)?,
            origin: self.origin.as_deref().map(token).transpose()?,
            writer: self.writer.as_deref().map(token).transpose()?,
        })
    }
}

fn corrupt(column: &'static str, detail: impl std::fmt::Display) -> StoreError {
    SqliteError::Corrupt(column, detail.to_string()).into()
}

fn parse_job_id(raw: &str) -> Result<JobId, StoreError> {
    JobId::parse(raw).map_err(|e| corrupt("id", e))
}

fn token(raw: &str) -> Result<WriteToken, StoreError> {
    WriteToken::parse(raw).map_err(|e| corrupt("token", e))
}

fn millis(ms: i64) -> Result<Timestamp, StoreError> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .ok_or_else(|| corrupt("timestamp", ms))
}

fn from_json<T: serde::de::DeserializeOwned>(
    column: &'static str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(column, e))
}

fn json_text(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("domain values always serialise")
}
