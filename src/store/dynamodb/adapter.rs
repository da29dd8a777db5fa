//! The [`JobStore`] port on DynamoDB: each method one request where the budget says one (see the module's
//! documentation), its condition explicit, the domain deciding on the item a failed condition returns.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use chrono::Duration;
use serde_json::Value;

use super::item::{
    ANSWERED, Decoded, Slot, created_key, decode_item, encode, encode_input, json_attribute,
};
use super::update::{Sweep, Update};
use super::{DynamoError, DynamoStore, OWNER_INDEX, n, s, sdk};
use crate::domain::{
    AttemptCancel, AttemptRef, AttemptState, CallReport, Completion, ErrorInfo, Failover,
    IdempotencyKey, Job, JobCancel, JobId, NewJob, Owner, ProviderName, Stamp, Timestamp,
};
use crate::store::{CreateOutcome, Cursor, JobPage, JobStore, ListQuery, StoreError};

impl DynamoStore {
    /// What a create finds when the intent already has a live job: that job answers — created (by this very
    /// write, repeated), replayed or in conflict. The same fingerprint means the same input, so only a conflict
    /// reads an input kept apart.
    async fn of_existing(
        &self,
        mut existing: Decoded,
        new: &Job,
        stamp: &Stamp,
    ) -> Result<CreateOutcome, StoreError> {
        if existing.input_apart && existing.job.fingerprint == new.fingerprint {
            existing.job.input = new.input.clone();
            existing.input_apart = false;
        }
        let existing = self.with_input(existing).await?.job;
        Ok(CreateOutcome::of_existing(
            existing,
            &new.fingerprint,
            &stamp.token,
        ))
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
        if let Some(input) = encode_input(&job) {
            // A job that is there answers without a write: a replay would otherwise pay for its input again.
            if let Some(item) = self.read_item(&job.id).await? {
                let existing = decode_item(&item)?;
                if !existing.job.is_expired(stamp.now) {
                    return self.of_existing(existing, &job, stamp).await;
                }
            }
            // Written before the job, so a job never lacks its input; the same intent writes the same item.
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(input))
                .send()
                .await
                .map_err(sdk)?;
        }
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
                    let old = failed.item.ok_or_else(|| {
                        DynamoError::Corrupt(
                            job.id.to_string(),
                            "the existing item was not returned".into(),
                        )
                    })?;
                    self.of_existing(decode_item(&old)?, &job, stamp).await
                }
                other => Err(StoreError::backend(other)),
            },
        }
    }

    async fn read_job(&self, id: &JobId, now: Timestamp) -> Result<Option<Job>, StoreError> {
        let Some(item) = self.read_item(id).await? else {
            return Ok(None);
        };
        let decoded = decode_item(&item)?;
        let job = &decoded.job;
        if job.id != *id || job.is_expired(now) {
            return Ok(None);
        }
        Ok(Some(self.with_input(decoded).await?.job))
    }

    async fn find_job(
        &self,
        owner: &Owner,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        let Some(item) = self.get(&JobId::intent_of(owner, key)).await? else {
            return Ok(None);
        };
        let decoded = decode_item(&item)?;
        if decoded.job.owner != *owner || decoded.job.is_expired(now) {
            return Ok(None);
        }
        Ok(Some(self.with_input(decoded).await?.job))
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
        // The index holds keys only: the items of each page of keys are read, and the status is the job's own.
        // A filter may leave pages short: keep reading until the page is full or the owner has no more.
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(OWNER_INDEX)
                .key_condition_expression("#owner = :owner")
                .expression_attribute_names("#owner", "owner")
                .expression_attribute_values(":owner", s(owner.as_str()))
                .scan_index_forward(false)
                .limit((query.limit + 1) as i32)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(sdk)?;
            let entries: Vec<(String, String)> = out
                .items()
                .iter()
                .filter_map(|entry| match (entry.get("pk"), entry.get("created_key")) {
                    (Some(AttributeValue::S(pk)), Some(AttributeValue::S(key))) => {
                        Some((pk.clone(), key.clone()))
                    }
                    _ => None,
                })
                .collect();
            let keys: Vec<String> = entries.iter().map(|(pk, _)| pk.clone()).collect();
            for item in self.read_items(&keys).await? {
                let decoded = decode_item(&item)?;
                let job = &decoded.job;
                // The entry names the incarnation it was made for; the item may hold a later one by now.
                let listed = entries.iter().any(|(pk, key)| {
                    *pk == job.id.intent()
                        && *key == created_key(job.created_at.timestamp_millis(), &job.id)
                });
                if listed
                    && job.owner == *owner
                    && !job.is_expired(now)
                    && query.status.is_none_or(|status| job.status() == status)
                {
                    jobs.push(decoded);
                }
            }
            match out.last_evaluated_key {
                Some(key) if jobs.len() <= query.limit => start = Some(key),
                _ => break,
            }
        }
        let next_cursor = (jobs.len() > query.limit).then(|| {
            jobs.truncate(query.limit);
            Cursor::after(&jobs.last().expect("limit is at least 1").job)
        });
        let jobs = self.with_inputs(jobs).await?;
        Ok(JobPage {
            jobs: jobs.into_iter().map(|d| d.job).collect(),
            next_cursor,
        })
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
        // A retry waits for its time: past `not_before`, or none (the condition fails, and the domain says why).
        u.condition(
            "#attempts.#n.#state = :queued AND attribute_not_exists(slot) \
             AND (attribute_not_exists(#attempts.#n.not_before) OR #attempts.#n.not_before <= :now)",
        );
        u.value(":queued", s(AttemptState::Queued.as_str()));
        u.set("#attempts.#n.#state = :started");
        u.value(":started", s(AttemptState::Started.as_str()));
        u.set("#attempts.#n.seen_version = :zero");
        u.set("#attempts.#n.started_at = :now");
        u.set("#attempts.#n.lease_expires_at = :lease");
        u.value(":lease", n(lease_expires_at.timestamp_millis()));
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
        u.value(":started", s(AttemptState::Started.as_str()));
        u.set("#attempts.#n.#state = :unknown");
        u.value(":unknown", s(AttemptState::Unknown.as_str()));
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
        u.value(":started", s(AttemptState::Started.as_str()));
        u.value(":unknown", s(AttemptState::Unknown.as_str()));
        // The compare-and-swap: the slot is taken only if it is free; a loser leaves it as it was.
        u.set("slot = if_not_exists(slot, :mine)");
        u.value(":mine", Slot::result(number, result.clone(), now));
        u.set("#attempts.#n.#state = :answered");
        u.value(":answered", s(ANSWERED));
        u.set("#attempts.#n.finished_at = :now");
        if let Some(report) = report.clone().into_option() {
            u.set("#attempts.#n.report = :report");
            u.value(":report", json_attribute(&report));
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
        // A retry waits for its time: past `not_before`, or none (the condition fails, and the domain says why).
        u.condition(
            "#attempts.#n.#state = :queued AND attribute_not_exists(slot) \
             AND (attribute_not_exists(#attempts.#n.not_before) OR #attempts.#n.not_before <= :now)",
        );
        u.value(":queued", s(AttemptState::Queued.as_str()));
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
        u.value(":closed", Slot::cancelled(&stamp.token, stamp.now));
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
