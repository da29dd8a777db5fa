//! The [`EventStore`] port on SQLite: `endpoints` (one row per owner) and `deliveries` (one row per job whose
//! owner had an endpoint when a write ended it, or per ended job if the store arms every job), due ones found through
//! `deliveries_by_due`.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, Row, Transaction, params};

use super::SqliteStore;
use super::rows::{corrupt, from_json, json_text, millis, parse_job_id};
use crate::domain::event::{event_id, fair_share};
use crate::domain::{Deliveries, Endpoint, Job, JobId, Owner, Timestamp};
use crate::store::{EventStore, StoreError};

const DELIVERIES_ROW: &str = "owner, job, due_at, expires_at, events, rev";

/// A `deliveries` row of [`DELIVERIES_ROW`], as it was read.
struct DeliveriesRow {
    owner: String,
    job: String,
    due_at: Option<i64>,
    expires_at: i64,
    events: String,
    rev: i64,
}

impl DeliveriesRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            owner: row.get(0)?,
            job: row.get(1)?,
            due_at: row.get(2)?,
            expires_at: row.get(3)?,
            events: row.get(4)?,
            rev: row.get(5)?,
        })
    }

    fn decode(self) -> Result<(Deliveries, u64), StoreError> {
        Ok((
            Deliveries {
                owner: Owner::parse(&self.owner).map_err(|e| corrupt("deliveries", e))?,
                job_id: parse_job_id(&self.job)?,
                due_at: self.due_at.map(millis).transpose()?,
                expires_at: millis(self.expires_at)?,
                events: from_json("deliveries", &self.events)?,
            },
            u64::try_from(self.rev).unwrap_or_default(),
        ))
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn endpoint(&self, owner: &Owner) -> Result<Option<Endpoint>, StoreError> {
        let owner = owner.clone();
        self.read(move |conn| {
            let text: Option<String> = conn
                .prepare_cached("SELECT endpoint FROM endpoints WHERE owner = ?1")?
                .query_row([owner.as_str()], |row| row.get(0))
                .optional()?;
            text.map(|t| from_json("endpoints", &t)).transpose()
        })
        .await
    }

    async fn put_endpoint(
        &self,
        owner: &Owner,
        endpoint: Option<&Endpoint>,
    ) -> Result<(), StoreError> {
        let (owner, text) = (owner.clone(), endpoint.map(json_text));
        self.write(move |tx| {
            match text {
                Some(text) => tx.execute(
                    "INSERT INTO endpoints (owner, endpoint) VALUES (?1, ?2) \
                     ON CONFLICT (owner) DO UPDATE SET endpoint = ?2",
                    params![owner.as_str(), text],
                )?,
                None => tx.execute("DELETE FROM endpoints WHERE owner = ?1", [owner.as_str()])?,
            };
            Ok(())
        })
        .await
    }

    async fn arm_deliveries(&self, job: &Job, settles_at: Timestamp) -> Result<bool, StoreError> {
        // Every write that ends a job arms its deliveries in its own transaction (`arm_in`): most calls find them
        // armed, or nowhere to go, and a reader says so without a turn of the writer.
        let (owner, id, event) = (
            job.owner.to_string(),
            job.id.to_string(),
            event_id(job, settles_at),
        );
        let (has_endpoint, armed): (bool, Option<String>) = self
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM endpoints WHERE owner = ?1),                          (SELECT armed FROM deliveries WHERE job = ?2)",
                    )?
                    .query_row([owner, id], |row| Ok((row.get(0)?, row.get(1)?)))?)
            })
            .await?;
        let goes = has_endpoint || self.every_job;
        if !goes || armed.as_deref() == Some(event.as_str()) {
            return Ok(goes);
        }
        let (job, every_job) = (job.clone(), self.every_job);
        self.write(move |tx| Ok(arm_in(tx, &job, settles_at, every_job)?))
            .await
    }

    async fn deliveries(&self, id: &JobId) -> Result<Option<(Deliveries, u64)>, StoreError> {
        let id = id.to_string();
        self.read(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {DELIVERIES_ROW} FROM deliveries WHERE job = ?1"
            ))?
            .query_row([id], DeliveriesRow::read)
            .optional()?
            .map(DeliveriesRow::decode)
            .transpose()
        })
        .await
    }

    async fn put_deliveries(&self, deliveries: &Deliveries, rev: u64) -> Result<bool, StoreError> {
        let row = (
            deliveries.job_id.to_string(),
            deliveries.due_at.map(|t| t.timestamp_millis()),
            json_text(&deliveries.events),
            rev as i64,
        );
        self.write(move |tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE deliveries SET due_at = ?2, events = ?3, rev = rev + 1 \
                     WHERE job = ?1 AND rev = ?4",
                )?
                .execute(params![row.0, row.1, row.2, row.3])?;
            Ok(changed == 1)
        })
        .await
    }

    async fn due_deliveries(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<(Deliveries, u64)>, StoreError> {
        let now = now.timestamp_millis();
        self.read(move |conn| {
            let owners: i64 = conn
                .prepare_cached(
                    "SELECT COUNT(DISTINCT owner) FROM deliveries WHERE due_at <= ?1 AND expires_at > ?1",
                )?
                .query_row([now], |row| row.get(0))?;
            let share = fair_share(limit, usize::try_from(owners).unwrap_or(usize::MAX));
            conn.prepare_cached(&format!(
                "SELECT {DELIVERIES_ROW} FROM ( \
                   SELECT {DELIVERIES_ROW}, \
                          ROW_NUMBER() OVER (PARTITION BY owner ORDER BY due_at, job) AS place \
                   FROM deliveries WHERE due_at <= ?1 AND expires_at > ?1) \
                 WHERE place <= ?3 ORDER BY place, due_at, job LIMIT ?2"
            ))?
            .query_map(params![now, limit as i64, share as i64], DeliveriesRow::read)?
            .map(|row| {
                row.map_err(StoreError::from)
                    .and_then(DeliveriesRow::decode)
            })
            .collect()
        })
        .await
    }
}

/// In the transaction of the write that ended `job` (to settle at `settles_at`): if its owner has an endpoint, or
/// `every_job` is armed, its deliveries are due then, once per settle (a write that leaves the settle as it was
/// changes nothing). So no crash comes between a job's end and its event. Whether its event goes anywhere.
pub(super) fn arm_in(
    tx: &Transaction<'_>,
    job: &Job,
    settles_at: Timestamp,
    every_job: bool,
) -> rusqlite::Result<bool> {
    let owner = job.owner.as_str();
    let goes = every_job
        || tx
            .prepare_cached("SELECT 1 FROM endpoints WHERE owner = ?1")?
            .exists([owner])?;
    if goes {
        // A new settle bumps the revision: a deliverer that read the row before does not write its older time
        // over this one.
        tx.prepare_cached(
            "INSERT INTO deliveries (owner, job, due_at, expires_at, events, rev, armed) \
             VALUES (?1, ?2, ?3, ?4, '[]', 1, ?5) \
             ON CONFLICT (job) DO UPDATE SET due_at = ?3, armed = ?5, rev = rev + 1 \
             WHERE armed IS NOT ?5",
        )?
        .execute(params![
            owner,
            job.id.as_str(),
            settles_at.timestamp_millis(),
            job.expires_at.timestamp_millis(),
            event_id(job, settles_at)
        ])?;
    }
    Ok(goes)
}
