//! The DynamoDB store: one table, one item per job, keyed by the intent part of the job's id (derived from owner and
//! idempotency key, so the item's existence *is* the (owner, key) uniqueness).
//!
//! - `item`: the items' stored shapes (on `serde_dynamo`) and how a job is read back from one; `codec`: how a
//!   value is kept in an attribute (JSON text, deflated, bytes).
//! - `update`: the conditional update expressions of the one-request transitions, and the sweep index's keys.
//! - `capacity`: what each write costs in write units, by DynamoDB's sizing rules.
//! - `table`: the table itself: key schema, both indexes, TTL, point-in-time recovery.
//! - `adapter`: the [`JobStore`](crate::store::JobStore) port on all of it.
//! - `events`: the [`EventStore`](crate::store::EventStore) port: endpoints' and deliveries' items.
//! - `providers`: the [`ProviderStore`](crate::store::ProviderStore) port: qualification evidence and breakers.
//! - `owners`: owners' ledgers (their limits), providers' call slots, the jobs that need a person.
//!
//! # Retention
//!
//! DynamoDB's TTL deletes an item within about two days of `expires_at`; until then it is still there. So every
//! request treats it as gone itself: a create's condition lets it be overwritten (`attribute_not_exists(pk) OR
//! expires_at <= :now`), every write's condition asks `expires_at > :now`, and reads drop what they find expired.
//! Every write's condition also names the incarnation (`created_at` from the id), so a message for an expired job's
//! attempt never touches the job that took its key afterwards.
//!
//! # Writes that may be repeated
//!
//! Each write carries its writer's token into the attempt it makes (`origin`) or moves (`writer`). The SDK retries a
//! request whose answer was lost; the retry's condition then fails, the item comes back, and the domain, seeing its
//! own token there, answers as the first write did (invariant 11).
//!
//! # Requests
//!
//! create, replay and conflict: one `PutItem` (the old item returned on a failed condition). claim, time-out,
//! completion, re-dispatch and job cancel: one conditional `UpdateItem` each; when its condition fails, the old
//! item comes back with the error and the domain's own rules say why — a refusal, a repeat of a write that landed,
//! or (rarely: the late answer of a cancelled attempt) a case the one-request form does not cover, written in full
//! from that returned item and guarded by `rev`. fail, attempt cancel and add attempt read the item (consistently)
//! and write it back guarded by `rev`. Listings and sweeps are a `Query` on one of the two indexes, then a
//! consistent `GetItem` for each item it names (16 at a time); nothing scans. Both indexes hold keys only, so no write
//! after the create touches the `by_owner` entry, and a transition pays for the small sweep entry, not a copy of
//! the job (see `capacity`). The indexes are eventually consistent: a job created a moment ago may be missing
//! from a listing for a moment (reading it by id is always consistent), and what a listing shows of each job is
//! read from the job's item.

mod adapter;
mod capacity;
mod codec;
mod events;
mod item;
mod owners;
mod providers;
mod table;
mod transitions;
mod update;

pub use capacity::{WriteUnits, item_size, write_units};

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use futures_util::{StreamExt, TryStreamExt, stream};

use super::StoreError;
use crate::domain::{AttemptRef, Job, JobId, Owner, Refusal, Timestamp};
use item::{Decoded, decode_input, decode_item, encode, input_key};
use update::{AttemptUpdate, Sweep, sweep_kind};

type Item = HashMap<String, AttributeValue>;

const OWNER_INDEX: &str = "by_owner";
const SWEEP_INDEX: &str = "sweep";
/// Sweep entries spread over this many partitions, so no index key grows hot.
const SWEEP_SHARDS: u32 = 8;
/// How many items a listing or a sweep reads at once.
const READS_IN_FLIGHT: usize = 16;
/// How often a read-then-write transition retries when another write slipped in between.
const RETRIES: usize = 8;

#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
    /// Whether every job that ends has its deliveries armed, its owner's endpoint or not ([`Self::arming_every_job`]).
    every_job: bool,
}

/// What went wrong inside the adapter; it leaves only as [`StoreError::Backend`].
#[derive(Debug, thiserror::Error)]
enum DynamoError {
    #[error("the item of job {0} is not readable: {1}")]
    Corrupt(String, String),
}

impl From<DynamoError> for StoreError {
    fn from(e: DynamoError) -> Self {
        StoreError::backend(e)
    }
}

/// A call of the AWS SDK that failed: the store failed (the write may or may not have landed), kept typed.
fn sdk_failure<E, R>(e: SdkError<E, R>) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    StoreError::backend(e)
}

impl DynamoStore {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            every_job: false,
        }
    }

    /// This store, arming the deliveries of every job that ends, whether or not its owner has an endpoint, if
    /// `every_job` (a deployment whose events also go to a bus).
    pub fn arming_every_job(self, every_job: bool) -> Self {
        Self { every_job, ..self }
    }

    async fn read_item(&self, id: &JobId) -> Result<Option<Item>, StoreError> {
        self.get(id.intent()).await
    }

    /// The item under `pk`, read consistently.
    async fn get(&self, pk: &str) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(pk))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk_failure)?;
        Ok(out.item)
    }

    /// Puts `item` if `condition` holds of the stored one (with its one placeholder's value); whether it did.
    async fn put_if(
        &self,
        item: Item,
        condition: &str,
        (placeholder, value): (&str, AttributeValue),
    ) -> Result<bool, StoreError> {
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .expression_attribute_values(placeholder, value)
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                PutItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(StoreError::backend(other)),
            },
        }
    }

    /// One conditional `UpdateItem` on the job `id` names (that incarnation, not expired at `now`), answering the
    /// job after it. When the condition failed, the domain decides on the item as it was (and its answer comes
    /// back too): a refusal; nothing to write (a no-op, or this very write landed before); or, when the domain
    /// would still change the item, the write done in full from that item, guarded by `rev`.
    async fn update<T>(
        &self,
        id: &JobId,
        owner: Option<&Owner>,
        now: Timestamp,
        update: AttemptUpdate,
        apply: impl Fn(&mut Job) -> Result<T, Refusal>,
    ) -> Result<(Option<T>, Job), StoreError> {
        let created_at = id.created_at_ms().ok_or(StoreError::NotFound)?;
        let (expression, condition, names, values) = update.finish();
        let mut request = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(id.intent()))
            .update_expression(expression)
            .condition_expression(format!(
                "({condition}) AND created_at = :created AND expires_at > :now_s"
            ))
            .return_values(ReturnValue::AllNew)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .expression_attribute_values(":created", n(created_at))
            .expression_attribute_values(":now_s", n(now.timestamp()));
        if let Some(owner) = owner {
            request = request.expression_attribute_values(":owner", s(owner.as_str()));
        }
        match request.send().await {
            Ok(out) => {
                let item = out.attributes.as_ref().ok_or_else(|| {
                    DynamoError::Corrupt(id.to_string(), "no item returned".into())
                })?;
                Ok((None, self.with_input(decode_item(item)?).await?.job))
            }
            Err(e) => match e.into_service_error() {
                UpdateItemError::ConditionalCheckFailedException(failed) => {
                    let Some(old) = failed.item else {
                        return Err(StoreError::NotFound);
                    };
                    let (out, job) = self
                        .read_then_write(id, owner, now, Some(old), apply)
                        .await?;
                    Ok((Some(out), job))
                }
                other => Err(StoreError::backend(other)),
            },
        }
    }

    /// Reads the job (or starts from `first`, an item already in hand), applies a domain transition and, if it
    /// changed the job, writes the whole item back guarded by `rev`; retries if another write slipped in between.
    /// A transition that changes nothing (a repeat of a write that landed, a no-op) writes nothing.
    async fn read_then_write<T>(
        &self,
        id: &JobId,
        owner: Option<&Owner>,
        now: Timestamp,
        mut first: Option<Item>,
        apply: impl Fn(&mut Job) -> Result<T, Refusal>,
    ) -> Result<(T, Job), StoreError> {
        for _ in 0..RETRIES {
            let item = match first.take() {
                Some(item) => item,
                None => self.read_item(id).await?.ok_or(StoreError::NotFound)?,
            };
            let decoded = decode_item(&item)?;
            let job = &decoded.job;
            if job.id != *id || job.is_expired(now) || owner.is_some_and(|o| *o != job.owner) {
                return Err(StoreError::NotFound);
            }
            // The whole item is written back, so the job must be whole: its input read if it is kept apart.
            let Decoded { job, rev, .. } = self.with_input(decoded).await?;
            let mut after = job.clone();
            let out = apply(&mut after)?;
            if after == job {
                return Ok((out, job));
            }
            // Guarded by the incarnation as well as the revision: a later job under the same key (this one past
            // its retention) counts its revisions from 1 again.
            let written = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(encode(&after, rev + 1)))
                .condition_expression("rev = :rev AND created_at = :created")
                .expression_attribute_values(":rev", n(rev))
                .expression_attribute_values(":created", n(job.created_at.timestamp_millis()))
                .send()
                .await;
            match written {
                Ok(_) => return Ok((out, after)),
                Err(e)
                    if matches!(
                        e.as_service_error(),
                        Some(PutItemError::ConditionalCheckFailedException(_))
                    ) => {}
                Err(e) => return Err(sdk_failure(e)),
            }
        }
        Err(StoreError::Contended(format!("job {id}")))
    }

    /// The jobs `decoded` holds, each with its input: the inputs kept apart are read (each once, together).
    async fn with_inputs(&self, mut decoded: Vec<Decoded>) -> Result<Vec<Decoded>, StoreError> {
        let mut keys: Vec<String> = decoded
            .iter()
            .filter(|d| d.input_apart)
            .map(|d| input_key(&d.job))
            .collect();
        if keys.is_empty() {
            return Ok(decoded);
        }
        keys.sort();
        keys.dedup();
        let mut inputs = HashMap::with_capacity(keys.len());
        for item in self.read_items(&keys).await? {
            let (key, input) = decode_input(&item)?;
            inputs.insert(key, input);
        }
        for d in decoded.iter_mut().filter(|d| d.input_apart) {
            d.job.input = inputs.get(&input_key(&d.job)).cloned().ok_or_else(|| {
                DynamoError::Corrupt(d.job.id.to_string(), "its input's item is missing".into())
            })?;
            d.input_apart = false;
        }
        Ok(decoded)
    }

    async fn with_input(&self, decoded: Decoded) -> Result<Decoded, StoreError> {
        Ok(self
            .with_inputs(vec![decoded])
            .await?
            .pop()
            .expect("one in, one out"))
    }

    /// The items of `keys` (table keys), read consistently, [`READS_IN_FLIGHT`] at a time, in the order of `keys`;
    /// a key without an item is left out, a key named twice is read once. (`GetItem`s, not `BatchGetItem`: the
    /// same read units, and the batch operation's client code alone would take each function past its 8 MiB
    /// package budget.)
    async fn read_items(&self, keys: &[String]) -> Result<Vec<Item>, StoreError> {
        let mut unique: Vec<&String> = keys.iter().collect();
        unique.sort();
        unique.dedup();
        let reads = unique.into_iter().cloned().map(|key| async move {
            let item = self.get(&key).await?;
            Ok::<_, StoreError>(item.map(|item| (key, item)))
        });
        let read: Vec<Option<(String, Item)>> = stream::iter(reads)
            .buffer_unordered(READS_IN_FLIGHT)
            .try_collect()
            .await?;
        let mut found: HashMap<String, Item> = read.into_iter().flatten().collect();
        Ok(keys.iter().filter_map(|k| found.remove(k)).collect())
    }

    /// The table keys the sweep index lists under `kind` with a time before `before`, at most `limit` per shard.
    async fn sweep_keys(
        &self,
        kind: Sweep,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut keys = Vec::new();
        for shard in 0..SWEEP_SHARDS {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(SWEEP_INDEX)
                .key_condition_expression("sweep_pk = :pk AND sweep_at < :before")
                .expression_attribute_values(":pk", s(&format!("{}#{shard}", kind.as_str())))
                .expression_attribute_values(":before", n(before.timestamp_millis()))
                .limit(limit as i32)
                .send()
                .await
                .map_err(sdk_failure)?;
            keys.extend(
                out.items()
                    .iter()
                    .filter_map(|entry| match entry.get("pk") {
                        Some(AttributeValue::S(pk)) => Some(pk.clone()),
                        _ => None,
                    }),
            );
        }
        Ok(keys)
    }

    /// The live attempts the sweep index lists under `kind` with a time before `before`, oldest first: the index
    /// holds keys only, so the items are read (consistently) and an entry the index still shows after its item
    /// moved on is left out.
    async fn sweep_query(
        &self,
        kind: Sweep,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        let keys = self.sweep_keys(kind, before, limit).await?;
        let mut found = Vec::new();
        for item in self.read_items(&keys).await? {
            let Decoded { job, sweep_at, .. } = decode_item(&item)?;
            let Some(at) = sweep_at.filter(|at| *at < before) else {
                continue;
            };
            if job.is_expired(now) {
                continue;
            }
            if let Some(live) = job
                .live_attempt()
                .filter(|a| sweep_kind(&job, a) == Some(kind))
            {
                found.push((
                    at,
                    AttemptRef {
                        job_id: job.id.clone(),
                        number: live.number,
                    },
                ));
            }
        }
        found.sort_by_key(|(at, _)| *at);
        Ok(found.into_iter().take(limit).map(|(_, r)| r).collect())
    }
}

fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_owned())
}

fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}
