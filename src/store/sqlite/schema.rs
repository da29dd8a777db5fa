//! The file's schema, its migrations from every older version, and each connection's settings.

use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::SqliteError;
use super::rows::{JOB_COLUMNS, id_is};
use crate::store::StoreError;

/// The tables of a new file. A job's attempts name it by `seq`, the job's row number, which grows with each new
/// job: the attempts of recent jobs sit together at the end of their table and of its indexes, so a write touches
/// the same few pages however many jobs the file holds (keyed by the random job id, every attempt landed on a page
/// of its own). For the same reason a job is found by its id through `jobs_by_id` (in [`INDEXES`]), ordered first
/// by the creation time the id ends with (`rows::id_is`).
const TABLES: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL,
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
    interventions   TEXT,
    UNIQUE (owner, idempotency_key)
) STRICT;
CREATE TABLE IF NOT EXISTS attempts (
    job              INTEGER NOT NULL REFERENCES jobs (seq),
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
    not_before       INTEGER,
    retry_of         INTEGER,
    request          TEXT,
    cancelled_by     TEXT,
    cleared_by       TEXT,
    cleared_at       INTEGER,
    call_id          TEXT,
    PRIMARY KEY (job, number)
) STRICT;
CREATE TABLE IF NOT EXISTS qualifications (
    contract_fingerprint TEXT NOT NULL,
    provider_fingerprint TEXT NOT NULL,
    evidence             TEXT NOT NULL,
    PRIMARY KEY (contract_fingerprint, provider_fingerprint)
) STRICT;
CREATE TABLE IF NOT EXISTS breakers (
    provider TEXT PRIMARY KEY,
    state    TEXT NOT NULL,
    rev      INTEGER NOT NULL
) STRICT;
";

/// What version 7 added to version 6 (and every newer file has): owners' endpoints and jobs' deliveries of
/// completion events (`store::EventStore`).
const EVENTS: &str = "
CREATE TABLE IF NOT EXISTS endpoints (
    owner    TEXT PRIMARY KEY,
    endpoint TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS deliveries (
    job        TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    due_at     INTEGER,
    expires_at INTEGER NOT NULL,
    events     TEXT NOT NULL,
    rev        INTEGER NOT NULL,
    armed      TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS deliveries_by_due ON deliveries (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS deliveries_by_expiry ON deliveries (expires_at);
";

/// The indexes of [`TABLES`] (besides their keys and unique constraints).
const INDEXES: &str = "
CREATE UNIQUE INDEX IF NOT EXISTS jobs_by_id ON jobs (substr(id, 37), id);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_by_expiry ON jobs (expires_at);
CREATE UNIQUE INDEX IF NOT EXISTS one_live_attempt_per_job
    ON attempts (job) WHERE state IN ('queued', 'started', 'unknown');
CREATE INDEX IF NOT EXISTS started_by_lease ON attempts (lease_expires_at) WHERE state = 'started';
CREATE INDEX IF NOT EXISTS queued_by_dispatch ON attempts (dispatched_at) WHERE state = 'queued';
";

/// The columns a job and an attempt have had since version 3.
const V3_JOB_COLUMNS: &str = "id, owner, idempotency_key, fingerprint, contract, input, providers, status, version, \
                              completed_by, result, error, cancelled_at, created_at, updated_at, expires_at, \
                              cancelled_by";
const V3_ATTEMPT_COLUMNS: &str = "number, provider, state, seen_version, lease_expires_at, created_at, started_at, \
                                  finished_at, error, report, dispatched_at, origin, writer";

/// What version 2 added to version 1: what providers report about calls, and qualification evidence (its table
/// comes with the rebuild to version 4, which makes every missing table as it is now).
const SCHEMA_1_TO_2: &str = "ALTER TABLE attempts ADD COLUMN report TEXT;";

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

/// What version 4 changed in version 3: attempts name their job by its row number (`seq`, new in `jobs`) instead of
/// its id. Both tables are made again, jobs numbered in the order they were created.
fn schema_3_to_4(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    set_aside(tx, "v3")?;
    tx.execute_batch(&format!(
        "INSERT INTO jobs ({V3_JOB_COLUMNS}) SELECT {V3_JOB_COLUMNS} FROM jobs_v3 ORDER BY created_at, id;
         INSERT INTO attempts (job, {V3_ATTEMPT_COLUMNS})
             SELECT (SELECT seq FROM jobs WHERE {}), {V3_ATTEMPT_COLUMNS} FROM attempts_v3;
         DROP TABLE attempts_v3;
         DROP TABLE jobs_v3;",
        id_is("job_id")
    ))
}

/// Renames the jobs and attempts tables to `jobs_{old}` and `attempts_{old}`, drops their indexes (their names are
/// today's), and makes today's tables and indexes in their place: a migration then copies the rows over and drops
/// the old tables.
fn set_aside(tx: &rusqlite::Transaction<'_>, old: &str) -> rusqlite::Result<()> {
    tx.execute_batch(&format!(
        "ALTER TABLE attempts RENAME TO attempts_{old}; ALTER TABLE jobs RENAME TO jobs_{old};"
    ))?;
    let named: Vec<String> = tx
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL AND tbl_name IN (?1, ?2)",
        )?
        .query_map([format!("jobs_{old}"), format!("attempts_{old}")], |row| {
            row.get(0)
        })?
        .collect::<Result<_, _>>()?;
    for name in named {
        tx.execute_batch(&format!("DROP INDEX \"{name}\""))?;
    }
    tx.execute_batch(TABLES)?;
    tx.execute_batch(INDEXES)
}

/// What version 5 added to version 4: a retry's earliest start and the attempt it retries, and the providers'
/// breakers.
const SCHEMA_4_TO_5: &str = "
ALTER TABLE attempts ADD COLUMN not_before INTEGER;
ALTER TABLE attempts ADD COLUMN retry_of INTEGER;
CREATE TABLE IF NOT EXISTS breakers (
    provider TEXT PRIMARY KEY,
    state    TEXT NOT NULL,
    rev      INTEGER NOT NULL
) STRICT;
";

/// What version 6 changed in version 5: a job is found by its id through `jobs_by_id` (see [`TABLES`] and
/// `rows::id_is`) instead of the unique index on the id alone, which every new job's random id sent to a page of its own. Both tables are
/// made again (the old index belongs to the table), with every row as it was.
fn schema_5_to_6(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    set_aside(tx, "v5")?;
    tx.execute_batch(&format!(
        "INSERT INTO jobs (seq, status, {JOB_COLUMNS}) SELECT seq, status, {JOB_COLUMNS} FROM jobs_v5;
         INSERT INTO attempts (job, {V5_ATTEMPT_COLUMNS}) SELECT job, {V5_ATTEMPT_COLUMNS} FROM attempts_v5;
         DROP TABLE attempts_v5;
         DROP TABLE jobs_v5;"
    ))
}

/// The columns an attempt had from version 5 to 7.
const V5_ATTEMPT_COLUMNS: &str = "number, provider, state, seen_version, lease_expires_at, created_at, started_at, \
                                  finished_at, error, report, dispatched_at, origin, writer, not_before, retry_of";

/// What version 8 added to version 7: the caller's request a manual attempt served, and the cancel that cancelled
/// an attempt by hand (`Idempotency-Key` on those calls).
const SCHEMA_7_TO_8: &str = "
ALTER TABLE attempts ADD COLUMN request TEXT;
ALTER TABLE attempts ADD COLUMN cancelled_by TEXT;
";

/// What version 9 added to version 8 (and every newer file has): what owners may start and spend (`owner_ledgers`,
/// the live jobs counted by `jobs_live_by_owner`), the calls in flight to a provider (`call_slots`), and the jobs
/// that need a person, every owner's, by when they came to need one (`jobs_needing_a_person`).
const OWNERS: &str = "
CREATE TABLE IF NOT EXISTS owner_ledgers (
    owner  TEXT PRIMARY KEY,
    ledger TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS call_slots (
    provider TEXT NOT NULL,
    holder   TEXT NOT NULL,
    until    INTEGER NOT NULL,
    PRIMARY KEY (provider, holder)
) STRICT;
CREATE INDEX IF NOT EXISTS jobs_live_by_owner ON jobs (owner) WHERE status IN ('queued', 'running', 'unknown');
CREATE INDEX IF NOT EXISTS jobs_needing_a_person ON jobs (updated_at DESC, id DESC)
    WHERE status IN ('unknown', 'failed');
";

/// What version 9 changed in version 8: operators' acts on a job are kept with it.
const SCHEMA_8_TO_9: &str = "ALTER TABLE jobs ADD COLUMN interventions TEXT;";

/// What version 10 added to version 9: how an `unknown` attempt cleared, and when.
const SCHEMA_9_TO_10: &str = "
ALTER TABLE attempts ADD COLUMN cleared_by TEXT;
ALTER TABLE attempts ADD COLUMN cleared_at INTEGER;
";

/// What version 11 added to version 10: the provider's name of an attempt's call (a background response's id).
const SCHEMA_10_TO_11: &str = "ALTER TABLE attempts ADD COLUMN call_id TEXT;";

/// The schema version this code writes; `PRAGMA user_version` of the file.
const SCHEMA_VERSION: i64 = 11;

/// Brings the file to [`SCHEMA_VERSION`] in one transaction: a new file gets the whole schema, an older file the
/// columns and tables added since its version. A newer file is refused rather than misread.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    match version {
        0 => {
            tx.execute_batch(TABLES)?;
            tx.execute_batch(INDEXES)?;
            tx.execute_batch(EVENTS)?;
        }
        // Up to version 5 the tables are made again, as they are now; versions 6 to 10 gain the columns since.
        1..=5 => from_before_events(&tx, version)?,
        6..=10 => {
            if version == 6 {
                from_before_events(&tx, version)?;
            }
            if version <= 7 {
                tx.execute_batch(SCHEMA_7_TO_8)?;
            }
            if version <= 8 {
                tx.execute_batch(SCHEMA_8_TO_9)?;
            }
            if version <= 9 {
                tx.execute_batch(SCHEMA_9_TO_10)?;
            }
            tx.execute_batch(SCHEMA_10_TO_11)?;
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
    if version < SCHEMA_VERSION {
        tx.execute_batch(OWNERS)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

/// Brings a file of version 1 to 6 to version 6, then adds [`EVENTS`].
fn from_before_events(tx: &rusqlite::Transaction<'_>, version: i64) -> rusqlite::Result<()> {
    match version {
        1..=3 => {
            if version == 1 {
                tx.execute_batch(SCHEMA_1_TO_2)?;
            }
            if version <= 2 {
                tx.execute_batch(SCHEMA_2_TO_3)?;
            }
            // The rebuild makes the tables as they are now.
            schema_3_to_4(tx)?;
        }
        4 => {
            tx.execute_batch(SCHEMA_4_TO_5)?;
            schema_5_to_6(tx)?;
        }
        5 => schema_5_to_6(tx)?,
        _ => {}
    }
    tx.execute_batch(EVENTS)
}

pub(super) fn configure(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.busy_timeout(Duration::from_secs(5))?;
    // WAL with synchronous=NORMAL: a commit survives a crash of the process; a power loss may take the last few.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // A savepoint's undo log (each write of a group commit has one) in memory, not a temporary file: the writer
    // otherwise made, wrote and deleted a file every few dozen writes, a quarter of its `pwrite`s.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection keeps its temporary structures in memory: the writer's savepoints (one per write of a group
    /// commit) otherwise keep their undo log in a file that is made, written and deleted every few dozen writes.
    #[test]
    fn a_savepoints_undo_log_is_kept_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("t.db")).unwrap();
        configure(&conn).unwrap();
        let temp_store: i64 = conn
            .query_row("PRAGMA temp_store", [], |row| row.get(0))
            .unwrap();
        assert_eq!(temp_store, 2, "2 is MEMORY");
    }
}
