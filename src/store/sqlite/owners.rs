//! What owners may start and what providers may take, on SQLite: an owner's ledger (`owner_ledgers`, its rates,
//! its spend and the places that carry its reservations, as JSON text), its live jobs counted through
//! `jobs_live_by_owner` in the writer's transaction (no other write comes between the count and the insert), the
//! calls in flight to each provider (`call_slots`), and the jobs that need a person (`jobs_needing_a_person`).

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::rows::{JOB_ROW, JobRow, from_json, json_text, load_job};
use crate::domain::{
    Bound, Job, JobId, JobStatus, Live, Owner, OwnerLedger, OwnerLimits, Refusal, Timestamp, Within,
};
use crate::store::{CallSlot, Cursor, JobPage, ListQuery, StoreError};
use std::collections::BTreeMap;

/// How many of `owner`'s jobs are `queued`, `running` or `unknown` and not expired at `now`.
pub(super) fn live_jobs(
    tx: &Transaction<'_>,
    owner: &Owner,
    now: Timestamp,
) -> Result<u32, StoreError> {
    let count: i64 = tx
        .prepare_cached(
            "SELECT COUNT(*) FROM jobs \
             WHERE owner = ?1 AND status IN ('queued', 'running', 'unknown') AND expires_at > ?2",
        )?
        .query_row(params![owner.as_str(), now.timestamp_millis()], |row| {
            row.get(0)
        })?;
    Ok(u32::try_from(count).unwrap_or(u32::MAX))
}

/// Writes what `admit` makes of `owner`'s ledger at `now` in the writer's transaction, the places it asks about
/// checked against their jobs here first; beyond a limit, a refusal (and the transaction, checks and all, rolls
/// back).
pub(super) fn guarded(
    tx: &Transaction<'_>,
    owner: &Owner,
    now: Timestamp,
    admit: impl Fn(&OwnerLedger) -> Within,
) -> Result<(), StoreError> {
    let read = ledger(tx, owner)?;
    let mut ledger = read.clone();
    loop {
        match admit(&ledger) {
            Within::Check(intents) => {
                let jobs = jobs_of(tx, &intents, now)?;
                ledger = ledger.checked(&intents, &jobs, now);
            }
            Within::Yes(after) => {
                let after = after.unwrap_or(ledger);
                if after != read {
                    put_ledger(tx, owner, &after)?;
                }
                return Ok(());
            }
            Within::Beyond(limit) => return Err(Refusal::Limit(limit).into()),
        }
    }
}

/// The jobs of `intents` not expired at `now`, by intent.
fn jobs_of(
    tx: &Transaction<'_>,
    intents: &[String],
    now: Timestamp,
) -> Result<BTreeMap<String, Job>, StoreError> {
    let mut jobs = BTreeMap::new();
    for intent in intents {
        let ids: Vec<String> = tx
            .prepare_cached("SELECT id FROM jobs WHERE id >= ?1 AND id < ?1 || '~'")?
            .query_map([intent], |row| row.get(0))?
            .collect::<Result<_, _>>()?;
        for id in ids.iter().filter_map(|id| JobId::parse(id).ok()) {
            if let Some((_, job)) = load_job(tx, &id, now)? {
                jobs.insert(intent.clone(), job);
            }
        }
    }
    Ok(jobs)
}

/// `owner`'s live jobs as the limit counts them: counted here, if the limit applies.
pub(super) fn counted(
    tx: &Transaction<'_>,
    owner: &Owner,
    limits: &OwnerLimits,
    now: Timestamp,
) -> Result<Live, StoreError> {
    Ok(Live::Counted(match limits.live_jobs {
        Some(_) => live_jobs(tx, owner, now)?,
        None => 0,
    }))
}

/// Attempt `number` makes `job` live again: held to its owner's live jobs and budget in this transaction, its call
/// (worst case `bound`) reserved, refused beyond one ([`OwnerLedger::admit_attempt`]).
pub(super) fn hold_live(
    tx: &Transaction<'_>,
    job: &Job,
    number: u32,
    (limits, bound): (OwnerLimits, Bound),
    now: Timestamp,
) -> Result<(), StoreError> {
    let live = counted(tx, &job.owner, &limits, now)?;
    guarded(tx, &job.owner, now, |ledger| {
        ledger.admit_attempt(job, number, &limits, now, live, bound)
    })
}

/// `owner`'s ledger (an empty one if it has none yet).
pub(super) fn ledger(conn: &Connection, owner: &Owner) -> Result<OwnerLedger, StoreError> {
    let text: Option<String> = conn
        .prepare_cached("SELECT ledger FROM owner_ledgers WHERE owner = ?1")?
        .query_row([owner.as_str()], |row| row.get(0))
        .optional()?;
    Ok(text
        .map(|t| from_json("ledger", &t))
        .transpose()?
        .unwrap_or_default())
}

pub(super) fn put_ledger(
    tx: &Transaction<'_>,
    owner: &Owner,
    ledger: &OwnerLedger,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO owner_ledgers (owner, ledger) VALUES (?1, ?2) \
         ON CONFLICT (owner) DO UPDATE SET ledger = ?2",
    )?
    .execute(params![owner.as_str(), json_text(ledger)])?;
    Ok(())
}

/// Takes a slot of `provider` for `holder` unless `slot.cap` unexpired ones are held by others.
pub(super) fn take_slot(
    tx: &Transaction<'_>,
    provider: &str,
    holder: &str,
    CallSlot { cap, until, now }: CallSlot,
) -> Result<bool, StoreError> {
    tx.prepare_cached("DELETE FROM call_slots WHERE provider = ?1 AND until <= ?2")?
        .execute(params![provider, now.timestamp_millis()])?;
    let others: i64 = tx
        .prepare_cached("SELECT COUNT(*) FROM call_slots WHERE provider = ?1 AND holder <> ?2")?
        .query_row(params![provider, holder], |row| row.get(0))?;
    if others >= i64::from(cap) {
        return Ok(false);
    }
    tx.prepare_cached(
        "INSERT INTO call_slots (provider, holder, until) VALUES (?1, ?2, ?3) \
         ON CONFLICT (provider, holder) DO UPDATE SET until = ?3",
    )?
    .execute(params![provider, holder, until.timestamp_millis()])?;
    Ok(true)
}

pub(super) fn free_slot(
    tx: &Transaction<'_>,
    provider: &str,
    holder: &str,
) -> Result<(), StoreError> {
    tx.prepare_cached("DELETE FROM call_slots WHERE provider = ?1 AND holder = ?2")?
        .execute(params![provider, holder])?;
    Ok(())
}

/// Every owner's jobs with status `unknown` or `failed` (or only `query.status`), not expired at `now`, the latest
/// changed first, a page of `query`.
pub(super) fn needing_a_person(
    conn: &Connection,
    query: &ListQuery,
    now: Timestamp,
) -> Result<JobPage, StoreError> {
    let (status, limit, cursor) = (query.status, query.limit, query.cursor.as_ref());
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {JOB_ROW} FROM jobs \
         WHERE status IN ('unknown', 'failed') AND (?1 IS NULL OR status = ?1) \
           AND (?2 IS NULL OR (updated_at, id) < (?2, ?3)) AND expires_at > ?4 \
         ORDER BY updated_at DESC, id DESC LIMIT ?5"
    ))?;
    let rows = stmt
        .query_map(
            params![
                status.map(JobStatus::as_str),
                cursor.map(|c| c.created_at_ms),
                cursor.map(|c| c.id.as_str().to_owned()),
                now.timestamp_millis(),
                limit as i64 + 1,
            ],
            JobRow::read,
        )?
        .collect::<Result<Vec<_>, _>>()?;
    JobRow::page(rows, conn, limit, |last| Cursor {
        created_at_ms: last.updated_at.timestamp_millis(),
        id: last.id.clone(),
    })
}
