//! What owners may start and what providers may take, on DynamoDB, with the operations the store already has
//! (`GetItem`, `UpdateItem`, `PutItem`, `Query`: no transactions, whose client code alone would not fit a
//! function's package):
//!
//! - an owner's ledger, the item `limits#<owner>`: its window of creates, its period's spend (added to by
//!   `UpdateItem … ADD`, apart from the rest), and `live`, the jobs it may have live, each with when it was
//!   reserved. A create within limits reserves its job there first (guarded by `rev`), then puts the job: a list
//!   shorter than the limit admits at once; at the limit, the listed jobs are read, and those that are no longer
//!   live (or, reserved over [`RESERVATION`] ago, never came to be) leave the list. The list never holds fewer than
//!   the owner's live jobs, so a limit of N admits at most N, however many functions create at once.
//! - a provider's call slots, the item `slots#<provider>`: its holders, each until when (guarded by `rev`).
//! - the jobs that need a person: the sweep index lists a job `unknown` or `failed` under `UNKNOWN#s` or
//!   `FAILED#s` by when it came to be so.
//!
//! Costs, in requests: a create under limits reads the ledger and writes it (its job's put as ever); at the
//! live-jobs limit, it also reads each listed job. Recording spend is one `UpdateItem` (two when a period turns).
//! Taking or freeing a slot reads the item and writes it.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Duration;

use super::item::decode_item;
use super::update::Sweep;
use super::{DynamoError, DynamoStore, Item, RETRIES, SWEEP_INDEX, SWEEP_SHARDS, n, s, sdk};
use crate::domain::{
    JobId, JobStatus, Owner, OwnerLedger, OwnerLimits, ProviderName, Spend, Timestamp,
};
use crate::store::{CallSlot, Cursor, JobPage, ListQuery, StoreError};

/// How many times a guarded write of an owner's ledger or a provider's slots is tried while other writers win: a
/// burst of one owner's creates from many functions meets here.
const TRIES: u32 = 24;

/// A pause before try `n` again, with full jitter: 5 ms doubling, at most 200 ms.
async fn contended(tries: u32) {
    let cap = (5u64 << tries.min(6)).min(200);
    tokio::time::sleep(std::time::Duration::from_millis(fastrand::u64(0..=cap))).await;
}

/// How long a reservation stands without its job: longer than any create's write takes (a caller's write budget
/// is seconds), after which a reservation whose job is missing is a create that failed.
const RESERVATION: Duration = Duration::seconds(60);

fn ledger_key(owner: &Owner) -> String {
    format!("limits#{owner}")
}

fn slots_key(provider: &ProviderName) -> String {
    format!("slots#{provider}")
}

/// A number attribute, 0 when absent.
fn number(item: &Item, name: &str) -> u64 {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().unwrap_or_default(),
        _ => 0,
    }
}

fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Some(v),
        _ => None,
    }
}

/// A map kept as JSON text (`{"<key>": <ms>}`), empty when absent.
fn times(item: &Item, name: &str, key: &str) -> Result<BTreeMap<String, i64>, StoreError> {
    text(item, name)
        .map(|t| {
            serde_json::from_str(t)
                .map_err(|e| DynamoError::Corrupt(key.to_owned(), format!("{name}: {e}")).into())
        })
        .transpose()
        .map(Option::unwrap_or_default)
}

/// An owner's ledger item as read: the ledger, the reserved jobs, and its revision.
struct Ledger {
    ledger: OwnerLedger,
    live: BTreeMap<String, i64>,
    rev: u64,
}

impl DynamoStore {
    async fn ledger(&self, owner: &Owner) -> Result<Ledger, StoreError> {
        let key = ledger_key(owner);
        let Some(item) = self.get(&key).await? else {
            return Ok(Ledger {
                ledger: OwnerLedger::default(),
                live: BTreeMap::new(),
                rev: 0,
            });
        };
        Ok(Ledger {
            ledger: OwnerLedger {
                window_ms: number(&item, "window_ms") as i64,
                window_creates: number(&item, "window_creates") as u32,
                period: text(&item, "spend_period").unwrap_or_default().to_owned(),
                spent_tokens: number(&item, "spent_tokens"),
                spent_nanos: number(&item, "spent_nanos"),
            },
            live: times(&item, "live", &key)?,
            rev: number(&item, "rev"),
        })
    }

    /// The reserved jobs of `live` that still count at `now`: live, or reserved too recently to have been written.
    async fn still_live(
        &self,
        live: &BTreeMap<String, i64>,
        now: Timestamp,
    ) -> Result<BTreeMap<String, i64>, StoreError> {
        let ids: Vec<JobId> = live.keys().filter_map(|id| JobId::parse(id).ok()).collect();
        let keys: Vec<String> = ids.iter().map(|id| id.intent().to_owned()).collect();
        let mut found: BTreeMap<String, bool> = BTreeMap::new();
        for item in self.read_items(&keys).await? {
            let job = decode_item(&item)?.job;
            let counts = !job.is_expired(now)
                && matches!(
                    job.status(),
                    JobStatus::Queued | JobStatus::Running | JobStatus::Unknown
                );
            found.insert(job.id.to_string(), counts);
        }
        let fresh = (now - RESERVATION).timestamp_millis();
        Ok(live
            .iter()
            .filter(|(id, at)| found.get(*id).copied().unwrap_or(**at > fresh))
            .map(|(id, at)| (id.clone(), *at))
            .collect())
    }

    /// Reserves `job`'s place within `owner`'s limits at `now`, or says which limit it would pass.
    pub(super) async fn reserve(
        &self,
        owner: &Owner,
        job: &JobId,
        limits: &OwnerLimits,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        for tries in 0..TRIES {
            if tries > 0 {
                contended(tries).await;
            }
            let Ledger {
                ledger,
                mut live,
                rev,
            } = self.ledger(owner).await?;
            live.remove(job.as_str());
            if limits
                .live_jobs
                .is_some_and(|limit| live.len() >= limit as usize)
            {
                live = self.still_live(&live, now).await?;
            }
            let after = limits
                .admit(live.len() as u32, &ledger, now)
                .map_err(|limit| StoreError::Refused(limit.into()))?;
            live.insert(job.to_string(), now.timestamp_millis());
            let written = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&ledger_key(owner)))
                .update_expression(
                    "SET live = :live, window_ms = :window, window_creates = :creates, rev = :next",
                )
                .condition_expression("attribute_not_exists(rev) OR rev = :rev")
                .expression_attribute_values(
                    ":live",
                    s(&serde_json::to_string(&live).expect("a map")),
                )
                .expression_attribute_values(":window", n(after.window_ms))
                .expression_attribute_values(":creates", n(after.window_creates))
                .expression_attribute_values(":next", n(rev + 1))
                .expression_attribute_values(":rev", n(rev))
                .send()
                .await;
            match written {
                Ok(_) => return Ok(()),
                Err(e) => match e.into_service_error() {
                    UpdateItemError::ConditionalCheckFailedException(_) => continue,
                    other => return Err(StoreError::backend(other)),
                },
            }
        }
        Err(DynamoError::Contended(ledger_key(owner)).into())
    }

    /// Adds `spend` to `owner`'s spend: to what it holds if it counts that period, else from 0.
    pub(super) async fn add_spend(&self, owner: &Owner, spend: &Spend) -> Result<(), StoreError> {
        let (period, tokens, nanos) = (&spend.period, spend.tokens, spend.nanos);
        let key = ledger_key(owner);
        for _ in 0..RETRIES {
            let added = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&key))
                .update_expression("ADD spent_tokens :tokens, spent_nanos :nanos")
                .condition_expression("spend_period = :period")
                .expression_attribute_values(":tokens", n(tokens))
                .expression_attribute_values(":nanos", n(nanos))
                .expression_attribute_values(":period", s(period))
                .send()
                .await;
            match added.map_err(|e| e.into_service_error()) {
                Ok(_) => return Ok(()),
                Err(UpdateItemError::ConditionalCheckFailedException(_)) => {}
                Err(other) => return Err(StoreError::backend(other)),
            }
            // Another period (or none yet): start this one, unless another writer just did.
            let started = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&key))
                .update_expression(
                    "SET spend_period = :period, spent_tokens = :tokens, spent_nanos = :nanos",
                )
                .condition_expression(
                    "attribute_not_exists(spend_period) OR spend_period < :period",
                )
                .expression_attribute_values(":tokens", n(tokens))
                .expression_attribute_values(":nanos", n(nanos))
                .expression_attribute_values(":period", s(period))
                .send()
                .await;
            match started.map_err(|e| e.into_service_error()) {
                Ok(_) => return Ok(()),
                Err(UpdateItemError::ConditionalCheckFailedException(_)) => {}
                Err(other) => return Err(StoreError::backend(other)),
            }
        }
        Err(DynamoError::Contended(key).into())
    }

    /// Takes or frees `holder`'s slot of `provider`: `take` is `Some(slot)` to take one.
    pub(super) async fn slot(
        &self,
        provider: &ProviderName,
        holder: &str,
        take: Option<CallSlot>,
    ) -> Result<bool, StoreError> {
        let key = slots_key(provider);
        for tries in 0..TRIES {
            if tries > 0 {
                contended(tries).await;
            }
            let item = self.get(&key).await?.unwrap_or_default();
            let rev = number(&item, "rev");
            let mut holders = times(&item, "holders", &key)?;
            match take {
                Some(CallSlot { cap, until, now }) => {
                    holders.retain(|h, end| h != holder && *end > now.timestamp_millis());
                    if holders.len() >= cap as usize {
                        return Ok(false);
                    }
                    holders.insert(holder.to_owned(), until.timestamp_millis());
                }
                None if holders.remove(holder).is_none() => return Ok(true),
                None => {}
            }
            let written = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&key))
                .update_expression("SET holders = :holders, rev = :next")
                .condition_expression("attribute_not_exists(rev) OR rev = :rev")
                .expression_attribute_values(
                    ":holders",
                    s(&serde_json::to_string(&holders).expect("a map")),
                )
                .expression_attribute_values(":next", n(rev + 1))
                .expression_attribute_values(":rev", n(rev))
                .send()
                .await;
            match written.map_err(|e| e.into_service_error()) {
                Ok(_) => return Ok(true),
                Err(UpdateItemError::ConditionalCheckFailedException(_)) => {}
                Err(other) => return Err(StoreError::backend(other)),
            }
        }
        Err(DynamoError::Contended(key).into())
    }

    /// Every owner's jobs that need a person, the latest first: each shard of the sweep index's `UNKNOWN` and
    /// `FAILED` entries (or `status`'s), read and merged; an entry whose job moved on since is left out.
    pub(super) async fn people_needed(
        &self,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        let (status, limit, cursor) = (query.status, query.limit, query.cursor.as_ref());
        let kinds = match status {
            Some(JobStatus::Unknown) => vec![Sweep::Unknown],
            Some(JobStatus::Failed) => vec![Sweep::Failed],
            Some(_) => vec![],
            None => vec![Sweep::Unknown, Sweep::Failed],
        };
        let mut keys = Vec::new();
        for kind in kinds {
            for shard in 0..SWEEP_SHARDS {
                let mut request = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(SWEEP_INDEX)
                    .expression_attribute_values(":pk", s(&format!("{}#{shard}", kind.as_str())))
                    .scan_index_forward(false)
                    .limit(limit as i32 + 1);
                request = match cursor {
                    Some(c) => request
                        .key_condition_expression("sweep_pk = :pk AND sweep_at <= :at")
                        .expression_attribute_values(":at", n(c.created_at_ms)),
                    None => request.key_condition_expression("sweep_pk = :pk"),
                };
                let out = request.send().await.map_err(sdk)?;
                keys.extend(
                    out.items()
                        .iter()
                        .filter_map(|entry| text(entry, "pk").map(str::to_owned)),
                );
            }
        }
        let mut found = Vec::new();
        for item in self.read_items(&keys).await? {
            let decoded = decode_item(&item)?;
            let job = &decoded.job;
            let needs = matches!(job.status(), JobStatus::Unknown | JobStatus::Failed)
                && status.is_none_or(|s| s == job.status());
            let Some(at) = decoded.sweep_at.filter(|_| needs && !job.is_expired(now)) else {
                continue;
            };
            let place = (at.timestamp_millis(), job.id.clone());
            if cursor.is_none_or(|c| place < (c.created_at_ms, c.id.clone())) {
                found.push((place, decoded));
            }
        }
        found.sort_by(|(a, _), (b, _)| b.cmp(a));
        let next_cursor = (found.len() > limit).then(|| {
            found.truncate(limit);
            let ((ms, id), _) = found.last().expect("limit is at least 1");
            Cursor {
                created_at_ms: *ms,
                id: id.clone(),
            }
        });
        let decoded = self
            .with_inputs(found.into_iter().map(|(_, d)| d).collect())
            .await?;
        Ok(JobPage {
            jobs: decoded.into_iter().map(|d| d.job).collect(),
            next_cursor,
        })
    }
}
