//! The file's schema, its migrations from every older version, and each connection's settings.

use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::SqliteError;
use crate::store::StoreError;

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

/// Brings the file to [`SCHEMA_VERSION`] in one transaction: a new file gets the whole schema, an older file the
/// columns and tables added since its version. A newer file is refused rather than misread.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
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

pub(super) fn configure(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.busy_timeout(Duration::from_secs(5))?;
    // WAL with synchronous=NORMAL: a commit survives a crash of the process; a power loss may take the last few.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}
