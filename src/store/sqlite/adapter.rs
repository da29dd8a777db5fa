//! The [`JobStore`] port on SQLite: each method one transaction, its guard in the SQL.

use async_trait::async_trait;
use rusqlite::params;

use super::rows::{
    JOB_ROW, JOB_ROW_BARE, JobRow, attempt_refs, delete_jobs, insert_job, job_for_key, key_holder,
    load_job, parse_job_id,
};
use super::{SqliteError, SqliteStore, owners};
use crate::domain::{
    Applied, AttemptRef, Bound, IdempotencyKey, Job, JobId, JobStatus, Owner, OwnerLedger,
    OwnerLimits, Timestamp, Within,
};
use crate::store::{
    CreateOutcome, CreateTerms, Cursor, JobPage, JobStore, JobWrite, ListQuery, StoreError,
};

/// `started` attempts whose lease ended before ?1, in jobs not cancelled and not expired at ?2.
const EXPIRED_LEASES: &str = "SELECT j.id, a.number FROM attempts a JOIN jobs j ON j.seq = a.job \
     WHERE a.state = 'started' AND a.lease_expires_at < ?1 \
       AND j.cancelled_at IS NULL AND j.expires_at > ?2 \
     ORDER BY a.lease_expires_at LIMIT ?3";

/// `queued` attempts last dispatched before ?1, in open jobs not expired at ?2.
const STALE_QUEUED: &str = "SELECT j.id, a.number FROM attempts a JOIN jobs j ON j.seq = a.job \
     WHERE a.state = 'queued' AND a.dispatched_at < ?1 \
       AND j.completed_by IS NULL AND j.cancelled_at IS NULL AND j.expires_at > ?2 \
     ORDER BY a.dispatched_at LIMIT ?3";

impl SqliteStore {
    /// The attempts a sweep query finds (see [`attempt_refs`]), oldest first, at most `limit`.
    async fn sweep(
        &self,
        sql: &'static str,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.read(move |conn| attempt_refs(conn, sql, before, now, limit))
            .await
    }
}

impl SqliteStore {
    /// The owner's jobs not expired by `now`, newest first, a page of `query`, each job read as `columns` says.
    async fn listing(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
        columns: &'static str,
    ) -> Result<JobPage, StoreError> {
        let (owner, query) = (owner.clone(), query.clone());
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {columns} FROM jobs \
                 WHERE owner = ?1 AND (?2 IS NULL OR status = ?2) \
                   AND (?3 IS NULL OR (created_at, id) < (?3, ?4)) AND expires_at > ?6 \
                   AND (?7 IS NULL OR created_at < ?7) \
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
                        query.created_before.map(|t| t.timestamp_millis()),
                    ],
                    JobRow::read,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            JobRow::page(rows, conn, query.limit, Cursor::after)
        })
        .await
    }
}

#[async_trait]
impl JobStore for SqliteStore {
    async fn create_within(
        &self,
        job: Job,
        CreateTerms {
            stamp,
            limits,
            bound,
        }: CreateTerms<'_>,
    ) -> Result<CreateOutcome, StoreError> {
        let (token, now, limits) = (stamp.token.clone(), stamp.now, *limits);
        // Straight to the writer, whose insert the key's unique index decides: most creates are a key's first,
        // and a duplicate in flight in this process already waits for the first's answer (`engine::in_flight`),
        // so a read ahead of the insert cost every create more than it saved the later duplicates. Within limits,
        // the key's job is looked for first (a replay is never refused), then the owner's live jobs counted and
        // its ledger read, all in the writer's transaction: no other create comes between them and the insert.
        self.write(move |tx| {
            if limits.any() {
                if let Some(existing) = job_for_key(tx, &job.owner, &job.idempotency_key, now)? {
                    return Ok(CreateOutcome::of_existing(
                        existing,
                        &job.fingerprint,
                        &token,
                    ));
                }
                let live = owners::counted(tx, &job.owner, &limits, now)?;
                owners::guarded(tx, &job.owner, now, |ledger| {
                    ledger.admit_create(job.id.intent(), &limits, now, live, bound)
                })?;
            }
            if insert_job(tx, &job)? {
                return Ok(CreateOutcome::Created(job));
            }
            if let Some(existing) = job_for_key(tx, &job.owner, &job.idempotency_key, now)? {
                return Ok(CreateOutcome::of_existing(
                    existing,
                    &job.fingerprint,
                    &token,
                ));
            }
            // Expired: gone, and its key is free again.
            let expired = key_holder(tx, &job.owner, &job.idempotency_key)?.ok_or(
                SqliteError::GuardFailed("jobs (insert conflicted, yet no row)"),
            )?;
            delete_jobs(tx, &[expired])?;
            if !insert_job(tx, &job)? {
                return Err(SqliteError::GuardFailed("jobs (expired row came back)").into());
            }
            Ok(CreateOutcome::Created(job))
        })
        .await
    }

    async fn reserve(
        &self,
        job: &Job,
        attempt: u32,
        limits: &OwnerLimits,
        bound: Bound,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let (job, limits) = (job.clone(), *limits);
        self.write(move |tx| {
            owners::guarded(tx, &job.owner, now, |ledger| {
                ledger.reserve(&job, attempt, &limits, now, bound)
            })
        })
        .await
    }

    async fn owner_ledger(&self, owner: &Owner) -> Result<OwnerLedger, StoreError> {
        let owner = owner.clone();
        self.read(move |conn| owners::ledger(conn, &owner)).await
    }

    async fn settle_place(&self, job: &Job, now: Timestamp) -> Result<(), StoreError> {
        let job = job.clone();
        self.write(move |tx| {
            owners::guarded(tx, &job.owner, now, |ledger| {
                Within::Yes(ledger.settle(&job, now))
            })
        })
        .await
    }

    async fn needing_a_person(
        &self,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        let query = query.clone();
        self.read(move |conn| owners::needing_a_person(conn, &query, now))
            .await
    }

    async fn read_job(&self, id: &JobId, now: Timestamp) -> Result<Option<Job>, StoreError> {
        let id = id.clone();
        self.read(move |conn| Ok(load_job(conn, &id, now)?.map(|(_, job)| job)))
            .await
    }

    async fn find_job(
        &self,
        owner: &Owner,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        let (owner, key) = (owner.clone(), key.clone());
        self.read(move |conn| job_for_key(conn, &owner, &key, now))
            .await
    }

    async fn list_jobs(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        self.listing(owner, query, now, JOB_ROW).await
    }

    async fn list_bills(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        self.listing(owner, query, now, JOB_ROW_BARE).await
    }

    async fn apply(&self, id: &JobId, write: JobWrite<'_>) -> Result<(Applied, Job), StoreError> {
        let (owner, stamp, transition) =
            (write.owner.cloned(), write.stamp.clone(), write.transition);
        let held = write.held.map(|held| (*held.limits, held.bound));
        self.transition(owner, id, stamp.now, held, move |job| {
            transition.apply(job, &stamp)
        })
        .await
    }

    async fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.sweep(EXPIRED_LEASES, now, now, limit).await
    }

    async fn stale_queued(
        &self,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.sweep(STALE_QUEUED, before, now, limit).await
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
            // Their deliveries go with them.
            tx.prepare_cached("DELETE FROM deliveries WHERE expires_at <= ?1")?
                .execute([now.timestamp_millis()])?;
            Ok(ids.len())
        })
        .await
    }
}
