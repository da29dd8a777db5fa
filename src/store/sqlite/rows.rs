//! Jobs and attempts as rows: reading them, inserting them, and writing back what a transition changed.

use chrono::{TimeZone, Utc};
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};
use serde_json::Value;

use super::SqliteError;
use crate::domain::{
    Attempt, AttemptRef, AttemptState, Cleared, ClearedBy, ContractRef, Fingerprint,
    IdempotencyKey, Job, JobId, Owner, ProviderName, Timestamp, WriteToken,
};
use crate::store::{Cursor, JobPage, StoreError};

pub(super) const JOB_COLUMNS: &str = "id, owner, idempotency_key, fingerprint, contract, input, providers, version, \
                           completed_by, result, error, cancelled_at, created_at, updated_at, expires_at, cancelled_by";
/// What reads a job row: its columns, its operators' acts, then its row number (`seq`), by which its attempts name
/// it.
pub(super) const JOB_ROW: &str = "id, owner, idempotency_key, fingerprint, contract, input, providers, version, \
                           completed_by, result, error, cancelled_at, created_at, updated_at, expires_at, cancelled_by, \
                           interventions, seq";
/// [`JOB_ROW`] without what no bill needs, and an owner's inputs weigh: its input and its result read as null.
pub(super) const JOB_ROW_BARE: &str = "id, owner, idempotency_key, fingerprint, contract, 'null', providers, \
                           version, completed_by, NULL, error, cancelled_at, created_at, updated_at, expires_at, \
                           cancelled_by, interventions, seq";
pub(super) const ATTEMPT_COLUMNS: &str = "number, provider, state, seen_version, lease_expires_at, created_at, started_at, \
                               finished_at, error, report, dispatched_at, origin, writer, not_before, retry_of, \
                               request, cancelled_by, cleared_by, cleared_at, call_id";

/// The condition that finds the job whose id is parameter `p`, through `jobs_by_id`: that index is ordered by how
/// the id ends — `_` and its job's creation time in base 36 (`substr(id, 37)`; empty for the ids from before
/// incarnations) — so a new job's entry goes to its end, not to a random page as the id's hash would send it.
pub(super) fn id_is(p: &str) -> String {
    format!("substr(id, 37) = substr({p}, 37) AND id = {p}")
}

pub(super) fn insert_job(tx: &Transaction<'_>, job: &Job) -> Result<bool, StoreError> {
    let inserted = tx
        .prepare_cached(&format!(
            "INSERT INTO jobs ({JOB_COLUMNS}, status, interventions) VALUES \
             (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18) \
             ON CONFLICT DO NOTHING"
        ))?
        .execute(params![
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
            interventions(job),
        ])?;
    if inserted == 1 {
        let seq = tx.last_insert_rowid();
        for attempt in &job.attempts {
            insert_attempt(tx, seq, attempt)?;
        }
    }
    Ok(inserted == 1)
}

/// The id of the job that holds `key` for `owner`, expired or not.
pub(super) fn key_holder(
    conn: &Connection,
    owner: &Owner,
    key: &IdempotencyKey,
) -> Result<Option<JobId>, StoreError> {
    conn.prepare_cached("SELECT id FROM jobs WHERE owner = ?1 AND idempotency_key = ?2")?
        .query_row(params![owner.as_str(), key.as_str()], |row| {
            row.get::<_, String>(0)
        })
        .optional()?
        .map(|id| parse_job_id(&id))
        .transpose()
}

/// The job that holds `key` for `owner`, unless it expired by `now`.
pub(super) fn job_for_key(
    conn: &Connection,
    owner: &Owner,
    key: &IdempotencyKey,
    now: Timestamp,
) -> Result<Option<Job>, StoreError> {
    match key_holder(conn, owner, key)? {
        Some(id) => Ok(load_job(conn, &id, now)?.map(|(_, job)| job)),
        None => Ok(None),
    }
}

pub(super) fn delete_jobs(tx: &Transaction<'_>, ids: &[JobId]) -> Result<(), StoreError> {
    for id in ids {
        tx.prepare_cached(&format!(
            "DELETE FROM attempts WHERE job = (SELECT seq FROM jobs WHERE {})",
            id_is("?1")
        ))?
        .execute([id.as_str()])?;
        tx.prepare_cached(&format!("DELETE FROM jobs WHERE {}", id_is("?1")))?
            .execute([id.as_str()])?;
    }
    Ok(())
}

/// Writes what a transition changed to the job in row `seq` (read in the same transaction). Every statement is
/// guarded by the state it replaces and must change exactly one row; the job row's guard
/// `version = ? AND completed_by IS ?` is the result slot's compare-and-swap.
pub(super) fn write_back(
    tx: &Transaction<'_>,
    seq: i64,
    before: &Job,
    after: &Job,
) -> Result<(), StoreError> {
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
        &after.interventions,
    ) != (
        before.status(),
        before.version,
        before.completed_by,
        &before.result,
        &before.error,
        before.cancelled_at,
        before.updated_at,
        &before.cancelled_by,
        &before.interventions,
    );
    if job_changed {
        let changed = tx.prepare_cached(
            "UPDATE jobs SET status = ?1, version = ?2, completed_by = ?3, result = ?4, error = ?5, \
                             cancelled_at = ?6, updated_at = ?7, cancelled_by = ?11, interventions = ?12 \
             WHERE seq = ?8 AND version = ?9 AND completed_by IS ?10")?
        .execute(params![
                after.status().as_str(),
                after.version as i64,
                after.completed_by,
                after.result.as_ref().map(Value::to_string),
                after.error.as_ref().map(json_text),
                after.cancelled_at.map(|t| t.timestamp_millis()),
                after.updated_at.timestamp_millis(),
                seq,
                before.version as i64,
                before.completed_by,
                after.cancelled_by.as_ref().map(WriteToken::as_str),
                interventions(after),
            ])?;
        if changed != 1 {
            return Err(SqliteError::GuardFailed("jobs").into());
        }
    }
    for attempt in &after.attempts {
        match before.attempt(attempt.number) {
            None => insert_attempt(tx, seq, attempt)?,
            Some(old) if old != attempt => {
                let changed = tx.prepare_cached(
                    "UPDATE attempts SET state = ?1, seen_version = ?2, lease_expires_at = ?3, started_at = ?4, \
                                         finished_at = ?5, error = ?6, report = ?7, dispatched_at = ?8, \
                                         writer = ?9, not_before = ?13, cancelled_by = ?14, \
                                         cleared_by = ?15, cleared_at = ?16, call_id = ?17 \
                     WHERE job = ?10 AND number = ?11 AND state = ?12")?
        .execute(params![
                        attempt.state.as_str(),
                        attempt.seen_version.map(|v| v as i64),
                        attempt.lease_expires_at.map(|t| t.timestamp_millis()),
                        attempt.started_at.map(|t| t.timestamp_millis()),
                        attempt.finished_at.map(|t| t.timestamp_millis()),
                        attempt.error.as_ref().map(json_text),
                        attempt.report.as_ref().map(json_text),
                        attempt.dispatched_at.timestamp_millis(),
                        attempt.writer.as_ref().map(WriteToken::as_str),
                        seq,
                        attempt.number,
                        old.state.as_str(),
                        attempt.not_before.map(|t| t.timestamp_millis()),
                        attempt.cancelled_by.as_ref().map(WriteToken::as_str),
                        attempt.cleared.map(|c| c.by.as_str()),
                        attempt.cleared.map(|c| c.at.timestamp_millis()),
                        attempt.call_id.as_deref(),
                    ])?;
                if changed != 1 {
                    return Err(SqliteError::GuardFailed("attempts").into());
                }
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A job's operators' acts as stored: JSON text, none while there are none.
fn interventions(job: &Job) -> Option<String> {
    (!job.interventions.is_empty()).then(|| json_text(&job.interventions))
}

fn insert_attempt(tx: &Transaction<'_>, seq: i64, a: &Attempt) -> Result<(), StoreError> {
    tx.prepare_cached(
        &format!("INSERT INTO attempts (job, {ATTEMPT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)"))?
        .execute(params![
            seq,
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
            a.not_before.map(|t| t.timestamp_millis()),
            a.retry_of,
            a.request.as_ref().map(WriteToken::as_str),
            a.cancelled_by.as_ref().map(WriteToken::as_str),
            a.cleared.map(|c| c.by.as_str()),
            a.cleared.map(|c| c.at.timestamp_millis()),
            a.call_id.as_deref(),
        ])?;
    Ok(())
}

pub(super) fn attempt_refs(
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

/// The job and its row number, unless it expired by `now` (then it is gone, though its row may wait for the next
/// purge).
pub(super) fn load_job(
    conn: &Connection,
    id: &JobId,
    now: Timestamp,
) -> Result<Option<(i64, Job)>, StoreError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT {JOB_ROW} FROM jobs WHERE {} AND expires_at > ?2",
            id_is("?1")
        ))?
        .query_row(params![id.as_str(), now.timestamp_millis()], JobRow::read)
        .optional()?;
    row.map(|row| row.with_attempts(conn)).transpose()
}

/// The attempts of the job in row `seq`, in order.
fn load_attempts(conn: &Connection, seq: i64) -> Result<Vec<Attempt>, StoreError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE job = ?1 ORDER BY number"
    ))?;
    let rows = stmt
        .query_map([seq], AttemptRow::read)?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(AttemptRow::into_attempt).collect()
}

/// A `jobs` row as SQLite hands it over ([`JOB_ROW`]), before the domain types check it.
pub(super) struct JobRow {
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
    interventions: Option<String>,
    seq: i64,
}

impl JobRow {
    pub(super) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
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
            interventions: row.get(16)?,
            seq: row.get(17)?,
        })
    }

    /// A page of at most `limit` jobs from `rows` (one more than the page, when there is a next page), each with its
    /// attempts; the next page's cursor made by `cursor` from the page's last job.
    pub(super) fn page(
        rows: Vec<Self>,
        conn: &Connection,
        limit: usize,
        cursor: impl FnOnce(&Job) -> Cursor,
    ) -> Result<JobPage, StoreError> {
        let mut jobs = rows
            .into_iter()
            .map(|row| Ok(row.with_attempts(conn)?.1))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next_cursor = (jobs.len() > limit).then(|| {
            jobs.truncate(limit);
            cursor(jobs.last().expect("limit is at least 1"))
        });
        Ok(JobPage { jobs, next_cursor })
    }

    /// The job with its attempts, read on the same connection; and its row number.
    pub(super) fn with_attempts(self, conn: &Connection) -> Result<(i64, Job), StoreError> {
        let seq = self.seq;
        let attempts = load_attempts(conn, seq)?;
        Ok((seq, self.into_job(attempts)?))
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
            interventions: (self.interventions)
                .map(|i| from_json("interventions", &i))
                .transpose()?
                .unwrap_or_default(),
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
    not_before: Option<i64>,
    retry_of: Option<u32>,
    request: Option<String>,
    cancelled_by: Option<String>,
    cleared_by: Option<String>,
    cleared_at: Option<i64>,
    call_id: Option<String>,
}

impl AttemptRow {
    pub(super) fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
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
            not_before: row.get(13)?,
            retry_of: row.get(14)?,
            request: row.get(15)?,
            cancelled_by: row.get(16)?,
            cleared_by: row.get(17)?,
            cleared_at: row.get(18)?,
            call_id: row.get(19)?,
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
            not_before: self.not_before.map(millis).transpose()?,
            retry_of: self.retry_of,
            origin: self.origin.as_deref().map(token).transpose()?,
            writer: self.writer.as_deref().map(token).transpose()?,
            request: self.request.as_deref().map(token).transpose()?,
            cancelled_by: self.cancelled_by.as_deref().map(token).transpose()?,
            cleared: match (self.cleared_by, self.cleared_at) {
                (Some(by), Some(at)) => Some(Cleared {
                    by: ClearedBy::parse(&by).ok_or_else(|| corrupt("cleared_by", &by))?,
                    at: millis(at)?,
                }),
                _ => None,
            },
            call_id: self.call_id,
        })
    }
}

pub(super) fn corrupt(column: &'static str, detail: impl std::fmt::Display) -> StoreError {
    SqliteError::Corrupt(column, detail.to_string()).into()
}

pub(super) fn parse_job_id(raw: &str) -> Result<JobId, StoreError> {
    JobId::parse(raw).map_err(|e| corrupt("id", e))
}

pub(super) fn token(raw: &str) -> Result<WriteToken, StoreError> {
    WriteToken::parse(raw).map_err(|e| corrupt("token", e))
}

pub(super) fn millis(ms: i64) -> Result<Timestamp, StoreError> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .ok_or_else(|| corrupt("timestamp", ms))
}

pub(super) fn from_json<T: serde::de::DeserializeOwned>(
    column: &'static str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(column, e))
}

pub(super) fn json_text(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("domain values always serialise")
}

#[cfg(test)]
mod tests;
