//! The DynamoDB store: one table, one item per job, keyed by the intent part of the job's id (derived from owner and
//! idempotency key, so the item's existence *is* the (owner, key) uniqueness).
//!
//! # Item
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `pk` | S | the intent part of the job id, `job_<32 hex>` (table hash key); the id adds the creation time |
//! | `owner`, `created_key` | S, S | GSI `by_owner`: owner → `<created_at ms, 13 digits>#<id>`, newest first |
//! | `idempotency_key`, `fingerprint`, `contract` | S | the intent |
//! | `input` | S | the input, as JSON text |
//! | `providers` | L of S | the chain |
//! | `attempts` | M | attempt number → `{provider, state, seen_version?, lease_expires_at?, created_at, dispatched_at, started_at?, finished_at?, error?, report?, origin?, writer?}` |
//! | `status` | S | the status while the job is open (`queued`, `running`, `unknown`, `failed`) |
//! | `slot` | M | the result slot, absent while open: `{attempt, result?, at, token?}`; attempt 0 = the job was cancelled (by the write `token`) |
//! | `error` | S | the job's error, as JSON text |
//! | `rev` | N | bumped by every write; guards the writes that read first |
//! | `sweep_pk`, `sweep_at` | S, N | sparse GSI `sweep`: `QUEUED#s` / `STARTED#s` (s = shard 0–7) → last dispatch / lease end |
//! | `created_at`, `updated_at` | N | milliseconds |
//! | `expires_at` | N | seconds: the end of the retention, and the table's TTL attribute |
//!
//! Qualification evidence lives in the same table, one item per (contract fingerprint, provider fingerprint):
//! `pk = qualification#<contract fp>#<provider fp>`, `passed` (BOOL), `evidence` (S, JSON). It has no TTL.
//!
//! `version` is not stored: it is 1 once the slot is taken (by a result or a cancel) and 0 before, which is exactly
//! the spec's "bumped by job-level transitions only". An attempt that delivered a result is stored as `answered`;
//! it reads as `succeeded` if it holds the slot, else `discarded`. That lets a completion be one `UpdateItem`
//! (`SET slot = if_not_exists(slot, :mine)`) for the winner and the loser alike: the loser's payload is never
//! written. A live attempt of a cancelled job reads as `cancelled`.
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
//! and write it back guarded by `rev`. Listings and sweeps are `Query`s on the two indexes; nothing scans.
//! Listings read the `by_owner` index, which is eventually consistent: a job created a moment ago may be missing
//! from a listing for a moment (reading it by id is always consistent).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, GlobalSecondaryIndex, KeySchemaElement,
    KeyType, PointInTimeRecoverySpecification, Projection, ProjectionType, ReturnValue,
    ReturnValuesOnConditionCheckFailure, ScalarAttributeType, TimeToLiveSpecification,
};
use chrono::{Duration, TimeZone, Utc};
use serde_json::Value;

use super::{CreateOutcome, Cursor, JobPage, JobStore, ListQuery, StoreError};
use crate::domain::{
    Attempt, AttemptCancel, AttemptRef, AttemptState, CallReport, Completion, ContractRef,
    ErrorInfo, Failover, Fingerprint, IdempotencyKey, Job, JobCancel, JobId, JobStatus, NewJob,
    Owner, ProviderName, Qualification, Refusal, Stamp, Timestamp, WriteToken,
};

type Item = HashMap<String, AttributeValue>;

const OWNER_INDEX: &str = "by_owner";
const SWEEP_INDEX: &str = "sweep";
/// Sweep entries spread over this many partitions, so no index key grows hot.
const SWEEP_SHARDS: u32 = 8;
/// How often a read-then-write transition retries when another write slipped in between.
const RETRIES: usize = 8;

/// The two kinds of sweep entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sweep {
    /// A `queued` attempt of an open job, by when it was last dispatched.
    Queued,
    /// A `started` attempt of a job not cancelled, by the end of its lease.
    Started,
}

impl Sweep {
    fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Started => "STARTED",
        }
    }
}

#[derive(Debug, Clone)]
pub struct DynamoStore {
    client: Client,
    table: String,
}

/// What went wrong inside the adapter; it leaves only as [`StoreError::Backend`].
#[derive(Debug, thiserror::Error)]
enum DynamoError {
    #[error("the item of job {0} is not readable: {1}")]
    Corrupt(String, String),
    #[error("job {0} kept changing under a guarded write")]
    Contended(String),
}

impl From<DynamoError> for StoreError {
    fn from(e: DynamoError) -> Self {
        StoreError::backend(e)
    }
}

fn sdk<E, R>(e: SdkError<E, R>) -> StoreError
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
        }
    }

    /// Creates the table with its indexes, TTL and point-in-time recovery; does nothing if it exists.
    pub async fn create_table(&self) -> Result<bool, StoreError> {
        let exists = self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await;
        match exists {
            Ok(_) => return Ok(false),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_resource_not_found_exception()) => {}
            Err(e) => return Err(sdk(e)),
        }
        let attribute = |name: &str, kind: ScalarAttributeType| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(kind)
                .build()
                .expect("name and type are set")
        };
        let key = |name: &str, kind: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kind)
                .build()
                .expect("name and type are set")
        };
        let index = |name: &str, hash: &str, range: &str| {
            GlobalSecondaryIndex::builder()
                .index_name(name)
                .key_schema(key(hash, KeyType::Hash))
                .key_schema(key(range, KeyType::Range))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::All)
                        .build(),
                )
                .build()
                .expect("index fields are set")
        };
        self.client
            .create_table()
            .table_name(&self.table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attribute("pk", ScalarAttributeType::S))
            .attribute_definitions(attribute("owner", ScalarAttributeType::S))
            .attribute_definitions(attribute("created_key", ScalarAttributeType::S))
            .attribute_definitions(attribute("sweep_pk", ScalarAttributeType::S))
            .attribute_definitions(attribute("sweep_at", ScalarAttributeType::N))
            .key_schema(key("pk", KeyType::Hash))
            .global_secondary_indexes(index(OWNER_INDEX, "owner", "created_key"))
            .global_secondary_indexes(index(SWEEP_INDEX, "sweep_pk", "sweep_at"))
            .send()
            .await
            .map_err(sdk)?;
        self.client
            .update_time_to_live()
            .table_name(&self.table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name("expires_at")
                    .enabled(true)
                    .build()
                    .expect("ttl fields are set"),
            )
            .send()
            .await
            .map_err(sdk)?;
        self.client
            .update_continuous_backups()
            .table_name(&self.table)
            .point_in_time_recovery_specification(
                PointInTimeRecoverySpecification::builder()
                    .point_in_time_recovery_enabled(true)
                    .build()
                    .expect("pitr field is set"),
            )
            .send()
            .await
            .map_err(sdk)?;
        Ok(true)
    }

    async fn read_item(&self, id: &JobId) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(id.intent()))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?;
        Ok(out.item)
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
        update: Update,
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
                let item = out
                    .attributes
                    .as_ref()
                    .ok_or_else(|| corrupt(id, "no item returned"))?;
                Ok((None, decode(item)?))
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
            let job = decode(&item)?;
            if job.id != *id || job.is_expired(now) || owner.is_some_and(|o| *o != job.owner) {
                return Err(StoreError::NotFound);
            }
            let mut after = job.clone();
            let out = apply(&mut after)?;
            if after == job {
                return Ok((out, job));
            }
            let rev = number(&item, "rev").unwrap_or(0);
            let written = self
                .client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(encode(&after, rev + 1)))
                .condition_expression("rev = :rev")
                .expression_attribute_values(":rev", n(rev))
                .send()
                .await;
            match written {
                Ok(_) => return Ok((out, after)),
                Err(e)
                    if matches!(
                        e.as_service_error(),
                        Some(PutItemError::ConditionalCheckFailedException(_))
                    ) => {}
                Err(e) => return Err(sdk(e)),
            }
        }
        Err(DynamoError::Contended(id.to_string()).into())
    }

    async fn sweep_query(
        &self,
        kind: Sweep,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        let mut found = Vec::new();
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
                .map_err(sdk)?;
            for item in out.items() {
                let job = decode(item)?;
                if job.is_expired(now) {
                    continue;
                }
                let at = number(item, "sweep_at").unwrap_or_default();
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
        }
        found.sort_by_key(|(at, _)| *at);
        Ok(found.into_iter().take(limit).map(|(_, r)| r).collect())
    }
}

#[async_trait]
impl JobStore for DynamoStore {
    async fn create_job(
        &self,
        new: NewJob,
        retention: Duration,
        stamp: &Stamp,
    ) -> Result<CreateOutcome, StoreError> {
        let job = Job::new(new, retention, stamp);
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(encode(&job, 1)))
            // No job under this key, or only one past its retention (which DynamoDB's TTL has yet to delete).
            .condition_expression("attribute_not_exists(pk) OR expires_at <= :now_s")
            .expression_attribute_values(":now_s", n(stamp.now.timestamp()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match put {
            Ok(_) => Ok(CreateOutcome::Created(job)),
            Err(e) => match e.into_service_error() {
                PutItemError::ConditionalCheckFailedException(failed) => {
                    let old = failed
                        .item
                        .ok_or_else(|| corrupt(&job.id, "the existing item was not returned"))?;
                    let existing = decode(&old)?;
                    Ok(if existing.created_by(&stamp.token) {
                        CreateOutcome::Created(existing)
                    } else if existing.fingerprint == job.fingerprint {
                        CreateOutcome::Replayed(existing)
                    } else {
                        CreateOutcome::Conflict(existing)
                    })
                }
                other => Err(StoreError::backend(other)),
            },
        }
    }

    async fn get_job(
        &self,
        owner: &Owner,
        id: &JobId,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        match self.read_item(id).await? {
            None => Ok(None),
            Some(item) => Ok(Some(decode(&item)?)
                .filter(|job| job.id == *id && job.owner == *owner && !job.is_expired(now))),
        }
    }

    async fn list_jobs(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        let mut jobs = Vec::new();
        let mut start = query.cursor.as_ref().map(|c| {
            HashMap::from([
                ("pk".to_owned(), s(c.id.intent())),
                ("owner".to_owned(), s(owner.as_str())),
                (
                    "created_key".to_owned(),
                    s(&created_key(c.created_at_ms, &c.id)),
                ),
            ])
        });
        let (filter, status) = match query.status {
            Some(status) => {
                let (filter, value) = status_filter(status);
                (format!("expires_at > :now_s AND {filter}"), Some(value))
            }
            None => ("expires_at > :now_s".to_owned(), None),
        };
        // A filter may leave pages short: keep reading until the page is full or the owner has no more.
        loop {
            let mut request = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(OWNER_INDEX)
                .key_condition_expression("#owner = :owner")
                .expression_attribute_names("#owner", "owner")
                .expression_attribute_values(":owner", s(owner.as_str()))
                .filter_expression(&filter)
                .expression_attribute_values(":now_s", n(now.timestamp()))
                .scan_index_forward(false)
                .limit((query.limit + 1) as i32)
                .set_exclusive_start_key(start.take());
            if let Some(value) = &status {
                request = request.expression_attribute_values(":status", value.clone());
                if filter.contains("#status") {
                    request = request.expression_attribute_names("#status", "status");
                }
            }
            let out = request.send().await.map_err(sdk)?;
            for item in out.items() {
                jobs.push(decode(item)?);
            }
            match out.last_evaluated_key {
                Some(key) if jobs.len() <= query.limit => start = Some(key),
                _ => break,
            }
        }
        let next_cursor = (jobs.len() > query.limit).then(|| {
            jobs.truncate(query.limit);
            Cursor::after(jobs.last().expect("limit is at least 1"))
        });
        Ok(JobPage { jobs, next_cursor })
    }

    async fn add_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        provider: Option<ProviderName>,
        failover: &Failover,
        stamp: &Stamp,
    ) -> Result<(u32, Job), StoreError> {
        self.read_then_write(id, Some(owner), stamp.now, None, |job| {
            job.add_attempt(provider.clone(), failover, stamp)
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
        let mut u = Update::new(number, stamp);
        u.condition("#attempts.#n.#state = :queued AND attribute_not_exists(slot)");
        u.value(":queued", s("queued"));
        u.set("#attempts.#n.#state = :started");
        u.value(":started", s("started"));
        u.set("#attempts.#n.seen_version = :zero");
        u.set("#attempts.#n.started_at = :now");
        u.set("#attempts.#n.lease_expires_at = :lease");
        u.value(":lease", n(lease_expires_at.timestamp_millis()));
        u.set("#status = :running");
        u.value(":running", s("running"));
        u.sweep(Sweep::Started, id, lease_expires_at);
        Ok(self
            .update(id, None, stamp.now, u, |job| {
                job.claim(number, lease_expires_at, stamp)
            })
            .await?
            .1)
    }

    async fn mark_unknown(
        &self,
        id: &JobId,
        number: u32,
        stamp: &Stamp,
    ) -> Result<Job, StoreError> {
        let mut u = Update::new(number, stamp);
        // A started attempt, unless the job was cancelled (a slot held by attempt 0).
        u.condition(
            "#attempts.#n.#state = :started AND (attribute_not_exists(slot) OR slot.attempt > :zero)",
        );
        u.value(":started", s("started"));
        u.set("#attempts.#n.#state = :unknown");
        u.value(":unknown", s("unknown"));
        u.set("#status = :unknown");
        u.remove("sweep_pk");
        u.remove("sweep_at");
        Ok(self
            .update(id, None, stamp.now, u, |job| {
                job.mark_unknown(number, stamp)
            })
            .await?
            .1)
    }

    async fn complete_attempt(
        &self,
        id: &JobId,
        number: u32,
        result: Value,
        report: CallReport,
        stamp: &Stamp,
    ) -> Result<(Completion, Job), StoreError> {
        let now = stamp.now;
        let mut u = Update::new(number, stamp);
        // A claimed attempt that is still live: no other attempt is, so the job's sweep entry is this attempt's
        // own. Any other case (an attempt cancelled meanwhile, never claimed, or this write landed before) is
        // decided by the domain on the item the failed condition returns.
        u.condition(
            "attribute_exists(#attempts.#n.seen_version) AND #attempts.#n.#state IN (:started, :unknown)",
        );
        u.value(":started", s("started"));
        u.value(":unknown", s("unknown"));
        // The compare-and-swap: the slot is taken only if it is free; a loser leaves it as it was.
        u.set("slot = if_not_exists(slot, :mine)");
        u.value(
            ":mine",
            AttributeValue::M(HashMap::from([
                ("attempt".to_owned(), n(number)),
                ("result".to_owned(), s(&result.to_string())),
                ("at".to_owned(), n(now.timestamp_millis())),
            ])),
        );
        u.set("#attempts.#n.#state = :answered");
        u.value(":answered", s("answered"));
        u.set("#attempts.#n.finished_at = :now");
        if let Some(report) = report.clone().into_option() {
            u.set("#attempts.#n.report = :report");
            u.value(":report", s(&json_text(&report)));
        }
        u.remove("sweep_pk");
        u.remove("sweep_at");
        u.no_updated_at();
        let (_, job) = self
            .update(id, None, now, u, |job| {
                job.complete(number, result.clone(), report.clone(), stamp)
            })
            .await?;
        let outcome = match job.completed_by {
            Some(winner) if winner == number => Completion::Won,
            winner => Completion::Lost { winner },
        };
        Ok((outcome, job))
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
        let (_, job) = self
            .read_then_write(id, None, stamp.now, None, |job| {
                job.fail(number, error.clone(), report.clone(), failover, stamp)
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
        self.read_then_write(id, Some(owner), stamp.now, None, |job| {
            job.cancel_attempt(number, failover, stamp)
        })
        .await
    }

    async fn redispatch(&self, id: &JobId, number: u32, now: Timestamp) -> Result<Job, StoreError> {
        let mut u = Update::new(number, &Stamp::fresh(now));
        u.condition("#attempts.#n.#state = :queued AND attribute_not_exists(slot)");
        u.value(":queued", s("queued"));
        u.set("#attempts.#n.dispatched_at = :now");
        u.set("sweep_at = :now");
        u.no_updated_at();
        u.no_writer();
        Ok(self
            .update(id, None, now, u, |job| job.redispatch(number, now))
            .await?
            .1)
    }

    async fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.sweep_query(Sweep::Started, now, now, limit).await
    }

    async fn stale_queued(
        &self,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.sweep_query(Sweep::Queued, before, now, limit).await
    }

    async fn purge_expired(&self, _now: Timestamp, _limit: usize) -> Result<usize, StoreError> {
        // DynamoDB's TTL deletes expired items; until it does, every request here treats them as gone.
        Ok(0)
    }

    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError> {
        let key = qualification_key(
            &evidence.contract_fingerprint,
            &evidence.provider_fingerprint,
        );
        self.client
            .put_item()
            .table_name(&self.table)
            .item("pk", s(&key))
            .item("passed", AttributeValue::Bool(evidence.passed))
            .item("evidence", s(&json_text(evidence)))
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError> {
        let key = qualification_key(contract, provider);
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key("pk", s(&key))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk)?;
        let Some(item) = out.item else {
            return Ok(None);
        };
        let evidence = item
            .get("evidence")
            .and_then(|v| v.as_s().ok())
            .and_then(|text| serde_json::from_str(text).ok())
            .ok_or_else(|| DynamoError::Corrupt(key, "evidence".into()))?;
        Ok(Some(evidence))
    }

    async fn cancel_job(
        &self,
        owner: &Owner,
        id: &JobId,
        stamp: &Stamp,
    ) -> Result<(JobCancel, Job), StoreError> {
        let mut u = Update::new(0, stamp);
        u.condition("#owner = :owner AND attribute_not_exists(slot)");
        u.name("#owner", "owner");
        u.set("slot = :closed");
        u.value(
            ":closed",
            AttributeValue::M(HashMap::from([
                ("attempt".to_owned(), n(0)),
                ("at".to_owned(), n(stamp.now.timestamp_millis())),
                ("token".to_owned(), s(stamp.token.as_str())),
            ])),
        );
        u.remove("sweep_pk");
        u.remove("sweep_at");
        u.no_writer();
        // Cancelled before: the domain calls that an answer, not an error, and nothing is written.
        let (outcome, job) = self
            .update(id, Some(owner), stamp.now, u, |job| job.cancel(stamp))
            .await?;
        Ok((outcome.unwrap_or(JobCancel::Cancelled), job))
    }
}

/// An `UpdateItem`'s expressions, built one clause at a time.
struct Update {
    sets: Vec<String>,
    removes: Vec<String>,
    condition: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
    touch: bool,
    writer: bool,
}

impl Update {
    /// An update of attempt `number` by the write `stamp`, bumping `rev` and (unless told otherwise) `updated_at`
    /// and the attempt's `writer`.
    fn new(number: u32, stamp: &Stamp) -> Self {
        Self {
            sets: vec!["rev = rev + :one".into()],
            removes: Vec::new(),
            condition: String::new(),
            names: HashMap::from([
                ("#attempts".to_owned(), "attempts".to_owned()),
                ("#n".to_owned(), number.to_string()),
                ("#state".to_owned(), "state".to_owned()),
                ("#status".to_owned(), "status".to_owned()),
            ]),
            values: HashMap::from([
                (":one".to_owned(), n(1)),
                (":zero".to_owned(), n(0)),
                (":now".to_owned(), n(stamp.now.timestamp_millis())),
                (":token".to_owned(), s(stamp.token.as_str())),
            ]),
            touch: true,
            writer: true,
        }
    }

    fn condition(&mut self, condition: &str) {
        self.condition = condition.to_owned();
    }

    fn set(&mut self, clause: &str) {
        self.sets.push(clause.to_owned());
    }

    fn remove(&mut self, path: &str) {
        self.removes.push(path.to_owned());
    }

    fn value(&mut self, name: &str, value: AttributeValue) {
        self.values.insert(name.to_owned(), value);
    }

    fn name(&mut self, placeholder: &str, name: &str) {
        self.names.insert(placeholder.to_owned(), name.to_owned());
    }

    /// Leaves `updated_at` alone (a completion's time is kept in the slot).
    fn no_updated_at(&mut self) {
        self.touch = false;
    }

    /// Leaves the attempt's `writer` alone: the write does not move an attempt.
    fn no_writer(&mut self) {
        self.writer = false;
    }

    fn sweep(&mut self, kind: Sweep, id: &JobId, at: Timestamp) {
        self.set("sweep_pk = :sweep_pk, sweep_at = :sweep_at");
        self.value(":sweep_pk", s(&sweep_key(kind, id)));
        self.value(":sweep_at", n(at.timestamp_millis()));
    }

    fn finish(
        mut self,
    ) -> (
        String,
        String,
        HashMap<String, String>,
        HashMap<String, AttributeValue>,
    ) {
        if self.touch {
            self.sets.push("updated_at = :now".into());
        }
        if self.writer {
            self.sets.push("#attempts.#n.writer = :token".into());
        }
        let mut expression = format!("SET {}", self.sets.join(", "));
        if !self.removes.is_empty() {
            expression.push_str(&format!(" REMOVE {}", self.removes.join(", ")));
        }
        // DynamoDB refuses placeholders that the expressions do not use.
        let used = format!("{expression} {}", self.condition);
        self.names.retain(|k, _| used.contains(k.as_str()));
        self.values.retain(|k, _| contains_placeholder(&used, k));
        (expression, self.condition, self.names, self.values)
    }
}

fn contains_placeholder(text: &str, placeholder: &str) -> bool {
    text.match_indices(placeholder).any(|(i, _)| {
        text[i + placeholder.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

fn sweep_key(kind: Sweep, id: &JobId) -> String {
    let shard = id
        .intent()
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
        % SWEEP_SHARDS;
    format!("{}#{shard}", kind.as_str())
}

/// The sweep entry a live attempt of `job` has, if any: a queued attempt of an open job (its message may be
/// lost), a started attempt of a job not cancelled (its worker may have died; also after another attempt won).
fn sweep_kind(job: &Job, live: &Attempt) -> Option<Sweep> {
    match live.state {
        AttemptState::Queued if job.completed_by.is_none() && job.cancelled_at.is_none() => {
            Some(Sweep::Queued)
        }
        AttemptState::Started if job.cancelled_at.is_none() => Some(Sweep::Started),
        _ => None,
    }
}

fn created_key(created_at_ms: i64, id: &JobId) -> String {
    format!("{created_at_ms:013}#{id}")
}

/// A filter on the `by_owner` index for one status: settled ones live in the slot, open ones in `status`.
fn status_filter(status: JobStatus) -> (&'static str, AttributeValue) {
    match status {
        JobStatus::Succeeded => ("slot.attempt > :status", n(0)),
        JobStatus::Cancelled => ("slot.attempt = :status", n(0)),
        open => (
            "attribute_not_exists(slot) AND #status = :status",
            s(open.as_str()),
        ),
    }
}

fn s(text: &str) -> AttributeValue {
    AttributeValue::S(text.to_owned())
}

fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

fn number(item: &Item, name: &str) -> Option<i64> {
    item.get(name)?.as_n().ok()?.parse().ok()
}

fn corrupt(id: &JobId, detail: impl std::fmt::Display) -> StoreError {
    DynamoError::Corrupt(id.to_string(), detail.to_string()).into()
}

fn millis(ms: i64) -> Timestamp {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn seconds(s: i64) -> Timestamp {
    Utc.timestamp_opt(s, 0).single().unwrap_or_default()
}

/// The size DynamoDB counts for the item that holds `job`, by its documented rules: attribute names and values in
/// bytes (UTF-8 strings; numbers about one byte per two significant digits, plus one; 3 bytes per map or list and 1
/// per element). An item may be at most 400 KB.
pub fn item_size(job: &Job) -> usize {
    encode(job, 1)
        .iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::N(number) => {
            let digits = number.trim_start_matches('-').trim_start_matches('0');
            digits
                .chars()
                .filter(char::is_ascii_digit)
                .count()
                .div_ceil(2)
                + 1
        }
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(name, value)| name.len() + value_size(value) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(list) => 3 + list.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        _ => 1,
    }
}

/// The item for a job as the domain sees it. Attempt states are written as they are.
fn encode(job: &Job, rev: i64) -> Item {
    let mut item = Item::new();
    let mut put = |k: &str, v: AttributeValue| {
        item.insert(k.to_owned(), v);
    };
    put("pk", s(job.id.intent()));
    put("owner", s(job.owner.as_str()));
    put(
        "created_key",
        s(&created_key(job.created_at.timestamp_millis(), &job.id)),
    );
    put("idempotency_key", s(job.idempotency_key.as_str()));
    put("fingerprint", s(&job.fingerprint.to_string()));
    put("contract", s(&job.contract.to_string()));
    put("input", s(&job.input.to_string()));
    put(
        "providers",
        AttributeValue::L(job.providers.iter().map(|p| s(p.as_str())).collect()),
    );
    put("created_at", n(job.created_at.timestamp_millis()));
    put("updated_at", n(job.updated_at.timestamp_millis()));
    put("expires_at", n(job.expires_at.timestamp()));
    put("rev", n(rev));
    put("status", s(job.status().as_str()));
    put(
        "attempts",
        AttributeValue::M(
            job.attempts
                .iter()
                .map(|a| (a.number.to_string(), encode_attempt(a)))
                .collect(),
        ),
    );
    if let Some(error) = &job.error {
        put("error", s(&json_text(error)));
    }
    if let Some(live) = job.live_attempt() {
        let at = match sweep_kind(job, live) {
            Some(Sweep::Queued) => Some((Sweep::Queued, live.dispatched_at)),
            Some(Sweep::Started) => Some((
                Sweep::Started,
                live.lease_expires_at.unwrap_or(job.updated_at),
            )),
            None => None,
        };
        if let Some((kind, at)) = at {
            put("sweep_pk", s(&sweep_key(kind, &job.id)));
            put("sweep_at", n(at.timestamp_millis()));
        }
    }
    if job.version > 0 {
        let mut slot = HashMap::from([("attempt".to_owned(), n(job.completed_by.unwrap_or(0)))]);
        if let Some(result) = &job.result {
            slot.insert("result".to_owned(), s(&result.to_string()));
        }
        let at = job.cancelled_at.unwrap_or(job.updated_at);
        slot.insert("at".to_owned(), n(at.timestamp_millis()));
        if let Some(token) = &job.cancelled_by {
            slot.insert("token".to_owned(), s(token.as_str()));
        }
        put("slot", AttributeValue::M(slot));
    }
    item
}

fn encode_attempt(a: &Attempt) -> AttributeValue {
    let mut m = HashMap::from([
        ("provider".to_owned(), s(a.provider.as_str())),
        ("state".to_owned(), s(a.state.as_str())),
        ("created_at".to_owned(), n(a.created_at.timestamp_millis())),
        (
            "dispatched_at".to_owned(),
            n(a.dispatched_at.timestamp_millis()),
        ),
    ]);
    let mut opt = |k: &str, v: Option<AttributeValue>| {
        if let Some(v) = v {
            m.insert(k.to_owned(), v);
        }
    };
    opt("seen_version", a.seen_version.map(n));
    opt(
        "lease_expires_at",
        a.lease_expires_at.map(|t| n(t.timestamp_millis())),
    );
    opt("started_at", a.started_at.map(|t| n(t.timestamp_millis())));
    opt(
        "finished_at",
        a.finished_at.map(|t| n(t.timestamp_millis())),
    );
    opt("error", a.error.as_ref().map(|e| s(&json_text(e))));
    opt("report", a.report.as_ref().map(|r| s(&json_text(r))));
    opt("origin", a.origin.as_ref().map(|t| s(t.as_str())));
    opt("writer", a.writer.as_ref().map(|t| s(t.as_str())));
    AttributeValue::M(m)
}

/// The job an item holds, with `version`, result, cancellation and derived attempt states read from the slot.
fn decode(item: &Item) -> Result<Job, StoreError> {
    let text = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).map(String::as_str);
    let raw_id = text("pk").unwrap_or_default();
    let intent = JobId::parse(raw_id)
        .map_err(|e| StoreError::backend(DynamoError::Corrupt(raw_id.into(), e.to_string())))?;
    let bad = |what: &str| corrupt(&intent, what);
    let created_at = number(item, "created_at").ok_or_else(|| bad("created_at"))?;
    let id = JobId::incarnation(intent.intent(), created_at);
    let field = |k: &str| text(k).ok_or_else(|| bad(k));
    let slot = item.get("slot").and_then(|v| v.as_m().ok());
    let slot_attempt = slot.and_then(|m| number(m, "attempt")).map(|a| a as u32);
    let slot_at = slot.and_then(|m| number(m, "at")).map(millis);
    let cancelled_at = slot_attempt.filter(|a| *a == 0).and(slot_at);
    let completed_by = slot_attempt.filter(|a| *a > 0);
    let result = slot
        .and_then(|m| m.get("result"))
        .and_then(|v| v.as_s().ok())
        .map(|r| serde_json::from_str(r).map_err(|_| bad("slot.result")))
        .transpose()?;
    let mut attempts = item
        .get("attempts")
        .and_then(|v| v.as_m().ok())
        .ok_or_else(|| bad("attempts"))?
        .iter()
        .map(|(k, v)| {
            decode_attempt(k, v, completed_by, cancelled_at).ok_or_else(|| bad("attempts"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    attempts.sort_by_key(|a| a.number);
    let updated_at = millis(number(item, "updated_at").ok_or_else(|| bad("updated_at"))?);
    let providers = item
        .get("providers")
        .and_then(|v| v.as_l().ok())
        .ok_or_else(|| bad("providers"))?
        .iter()
        .map(|p| {
            p.as_s()
                .ok()
                .and_then(|p| ProviderName::parse(p).ok())
                .ok_or_else(|| bad("providers"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Job {
        owner: Owner::parse(field("owner")?).map_err(|_| bad("owner"))?,
        idempotency_key: IdempotencyKey::parse(field("idempotency_key")?)
            .map_err(|_| bad("idempotency_key"))?,
        fingerprint: Fingerprint::parse(field("fingerprint")?).map_err(|_| bad("fingerprint"))?,
        contract: ContractRef::parse(field("contract")?).map_err(|_| bad("contract"))?,
        input: serde_json::from_str(field("input")?).map_err(|_| bad("input"))?,
        providers,
        version: u64::from(slot.is_some()),
        completed_by,
        result,
        // A job that has its result has no error (a late winner after a failure leaves the old one behind).
        error: text("error")
            .filter(|_| completed_by.is_none())
            .map(|e| serde_json::from_str(e).map_err(|_| bad("error")))
            .transpose()?,
        cancelled_at,
        cancelled_by: match slot.filter(|_| cancelled_at.is_some()) {
            Some(slot) => token(slot, "token").ok_or_else(|| bad("slot.token"))?,
            None => None,
        },
        attempts,
        created_at: millis(created_at),
        updated_at: slot_at.map_or(updated_at, |at| at.max(updated_at)),
        expires_at: seconds(number(item, "expires_at").ok_or_else(|| bad("expires_at"))?),
        id,
    })
}

fn decode_attempt(
    key: &str,
    value: &AttributeValue,
    completed_by: Option<u32>,
    cancelled_at: Option<Timestamp>,
) -> Option<Attempt> {
    let m = value.as_m().ok()?;
    let number_of = |k: &str| number(m, k);
    let at = |k: &str| number_of(k).map(millis);
    let number: u32 = key.parse().ok()?;
    let stored = m.get("state")?.as_s().ok()?;
    let mut finished_at = at("finished_at");
    let state = match stored.as_str() {
        "answered" if completed_by == Some(number) => AttemptState::Succeeded,
        "answered" => AttemptState::Discarded,
        other => {
            let state = AttemptState::parse(other)?;
            match cancelled_at {
                // The job was cancelled while this attempt was live.
                Some(when) if state.is_live() => {
                    finished_at = Some(when);
                    AttemptState::Cancelled
                }
                _ => state,
            }
        }
    };
    Some(Attempt {
        number,
        provider: ProviderName::parse(m.get("provider")?.as_s().ok()?).ok()?,
        state,
        seen_version: number_of("seen_version").map(|v| v as u64),
        lease_expires_at: at("lease_expires_at"),
        created_at: at("created_at")?,
        dispatched_at: at("dispatched_at").or(at("created_at"))?,
        started_at: at("started_at"),
        finished_at,
        error: match m.get("error") {
            Some(e) => Some(serde_json::from_str::<ErrorInfo>(e.as_s().ok()?).ok()?),
            None => None,
        },
        report: match m.get("report") {
            Some(r) => Some(serde_json::from_str::<CallReport>(r.as_s().ok()?).ok()?),
            None => None,
        },
        origin: token(m, "origin")?,
        writer: token(m, "writer")?,
    })
}

/// An optional token attribute of an attempt: `Some(None)` when absent, `None` when unreadable.
fn token(m: &Item, name: &str) -> Option<Option<WriteToken>> {
    match m.get(name) {
        None => Some(None),
        Some(v) => WriteToken::parse(v.as_s().ok()?).ok().map(Some),
    }
}

fn json_text(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("domain values always serialise")
}

/// The key of the item holding qualification evidence for a pair of fingerprints. It cannot be a job id (those
/// start `job_`), and it carries neither `owner` nor `sweep_pk`, so no index sees it.
fn qualification_key(contract: &Fingerprint, provider: &Fingerprint) -> String {
    format!("qualification#{contract}#{provider}")
}
