//! The embedded store: one SQLite file in WAL mode.
//!
//! One writer thread takes every write, many to a `BEGIN IMMEDIATE` transaction, each in a savepoint of its own
//! (`writer`); a few reader connections serve reads beside it. The database itself keeps the invariants that
//! matter most: `UNIQUE(owner, idempotency_key)` decides creates (an `INSERT … ON CONFLICT DO NOTHING`, never a
//! read first), a partial unique index allows one live attempt per job, and every update is guarded by the state
//! it expects — a completion is `UPDATE jobs … WHERE seq = ? AND version = ? AND completed_by IS NULL` (the row
//! read with the job in the same transaction, found by its id through `jobs_by_id`, `rows::id_is`) and must change
//! exactly one row.
//!
//! - `schema`: the tables, indexes and migrations, and how each connection is configured.
//! - `rows`: jobs and attempts as rows: reading, inserting and writing back a transition's changes.
//! - `writer`: the one writer, committing many writes per transaction (group commit).
//! - `adapter`: the [`JobStore`](crate::store::JobStore) port on them, each write whole or not at all.
//! - `events`: the [`EventStore`](crate::store::EventStore) port: endpoints and deliveries.
//! - `providers`: the [`ProviderStore`](crate::store::ProviderStore) port: qualification evidence and breakers.
//! - `owners`: owners' ledgers and live jobs (their limits), providers' call slots, the jobs that need a person.

mod adapter;
mod events;
mod owners;
mod providers;
mod rows;
mod schema;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rusqlite::{Connection, OpenFlags, Transaction, TransactionBehavior};
use tokio::sync::Mutex;

use super::StoreError;
use crate::domain::{Bound, Job, JobId, Owner, OwnerLimits, Refusal, Timestamp};
use rows::{load_job, write_back};
use schema::{configure, migrate};
use writer::Writer;

/// How many connections serve reads beside the writer.
const READERS: usize = 4;

#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: Arc<Writer>,
    readers: Arc<[Arc<Mutex<Connection>>]>,
    next_reader: Arc<AtomicUsize>,
    /// Whether every job that ends has its deliveries armed, its owner's endpoint or not ([`Self::arming_every_job`]).
    every_job: bool,
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
    #[error("the transaction holding the write did not commit: {0}")]
    Commit(String),
    #[error(
        "the write did not finish: the writer stopped, or the write panicked and was rolled back"
    )]
    WriterGone,
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
            writer: Arc::new(Writer::start(writer)?),
            readers: readers.into(),
            next_reader: Arc::default(),
            every_job: false,
        })
    }

    /// This store, arming the deliveries of every job that ends, whether or not its owner has an endpoint, if
    /// `every_job` (a deployment whose events also go to a bus).
    pub fn arming_every_job(self, every_job: bool) -> Self {
        Self { every_job, ..self }
    }

    /// Runs `f` in one read transaction on a reader, so that all its queries see one snapshot: a job row and
    /// its attempts are never read from two sides of a write. A read in WAL mode never waits for the writer and
    /// takes microseconds from the page cache, so it runs in place: a hand-off to the blocking pool cost more than
    /// the read (the lifecycle bench measured it).
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        let mut conn = self.readers[i].lock().await;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    /// Runs `f` on the writer, whole or not at all; answers once the transaction that holds it committed.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.writer.write(f).await
    }

    /// Loads a job (not expired by `now`), applies one domain transition and writes back exactly what it changed,
    /// in one transaction, with the job's deliveries if it ended (`events::arm_in`). A transition that finds its own write already applied changes nothing, so nothing is
    /// written.
    async fn transition<T: Send + 'static>(
        &self,
        owner: Option<Owner>,
        id: &JobId,
        now: Timestamp,
        held: Option<(OwnerLimits, Bound)>,
        apply: impl FnOnce(&mut Job) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<(T, Job), StoreError> {
        let (id, every_job) = (id.clone(), self.every_job);
        self.write(move |tx| {
            let (seq, before) = load_job(tx, &id, now)?
                .filter(|(_, job)| owner.as_ref().is_none_or(|o| *o == job.owner))
                .ok_or(StoreError::NotFound)?;
            let mut after = before.clone();
            let out = apply(&mut after)?;
            // A write that makes the job live again is held to its owner's limits, counted in this transaction
            // (the job itself is not live yet, so not counted).
            if let Some(held) = held
                && before.live_attempt().is_none()
                && let Some(live) = after.live_attempt()
            {
                owners::hold_live(tx, &after, live.number, held, now)?;
            }
            write_back(tx, seq, &before, &after)?;
            if let Some(settles_at) = after.settles_at() {
                events::arm_in(tx, &after, settles_at, every_job)?;
            }
            Ok((out, after))
        })
        .await
    }
}
