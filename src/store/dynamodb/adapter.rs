//! The [`JobStore`] port on DynamoDB: each method one request where the budget says one (see the module's
//! documentation), its condition explicit, the domain deciding on the item a failed condition returns.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};

use super::item::{Decoded, created_key, decode_item, encode, encode_input};
use super::owners::Holding;
use super::transitions;
use super::update::Sweep;
use super::{DynamoError, DynamoStore, Item, OWNER_INDEX, n, s, sdk_failure};
use crate::domain::{
    Applied, AttemptRef, Bound, Completion, IdempotencyKey, Job, JobCancel, JobId, Owner,
    OwnerLedger, OwnerLimits, Refusal, Stamp, Timestamp, Transition, Within,
};
use crate::store::{
    CreateOutcome, CreateTerms, Cursor, Held, JobPage, JobStore, JobWrite, ListQuery, StoreError,
};

impl DynamoStore {
    /// Before a manual attempt on the job `id` names: if the domain would add a new attempt to the job as read (it
    /// is open, has no live attempt, and the request is not one it took before: a replay is never held to the
    /// limits), the attempt makes the job live again, and is held to its owner's `limits` first
    /// ([`DynamoStore::hold`]: its place taken in the ledger, or the limit it would pass). The item read, for the
    /// write to start from.
    async fn held_attempt(
        &self,
        id: &JobId,
        owner: Option<&Owner>,
        held: Held<'_>,
        now: Timestamp,
        domain: &(dyn Fn(&mut Job) -> Result<Applied, Refusal> + Sync),
    ) -> Result<Option<Item>, StoreError> {
        let Some(item) = self.read_item(id).await? else {
            return Ok(None);
        };
        let job = &decode_item(&item)?.job;
        let next = job.attempts.iter().map(|a| a.number).max().unwrap_or(0) + 1;
        let adds = matches!(domain(&mut job.clone()), Ok(Applied::Added(n)) if n == next);
        let makes_live =
            job.id == *id && !job.is_expired(now) && owner.is_none_or(|o| *o == job.owner) && adds;
        if makes_live && held.limits.any() {
            let holding = Holding::Attempt(job, next);
            (self.hold(&job.owner, id.intent(), holding, held, now)).await?;
        }
        Ok(Some(item))
    }

    /// The owner's jobs not expired by `now`, newest first, a page of `query`, as their items hold them (an input
    /// kept apart not read), and the next page's cursor.
    async fn listed(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<(Vec<Decoded>, Option<Cursor>), StoreError> {
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
        // Before a moment: a key made at it (`<ms>#<id>`) sorts after its bare time.
        let before = (query.created_before).map(|t| s(&format!("{:013}", t.timestamp_millis())));
        let condition = match before {
            Some(_) => "#owner = :owner AND created_key < :before",
            None => "#owner = :owner",
        };
        loop {
            let mut request = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(OWNER_INDEX)
                .key_condition_expression(condition)
                .expression_attribute_names("#owner", "owner")
                .expression_attribute_values(":owner", s(owner.as_str()));
            if let Some(before) = &before {
                request = request.expression_attribute_values(":before", before.clone());
            }
            let out = request
                .scan_index_forward(false)
                .limit((query.limit + 1) as i32)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(sdk_failure)?;
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
        Ok((jobs, next_cursor))
    }

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
    async fn create_within(
        &self,
        job: Job,
        CreateTerms {
            stamp,
            limits,
            bound,
        }: CreateTerms<'_>,
    ) -> Result<CreateOutcome, StoreError> {
        let input = encode_input(&job);
        // A job that is there answers without a write: a replay would otherwise pay for its input again, and is
        // never refused by a limit.
        if (input.is_some() || limits.any())
            && let Some(item) = self.read_item(&job.id).await?
        {
            let existing = decode_item(&item)?;
            if !existing.job.is_expired(stamp.now) {
                return self.of_existing(existing, &job, stamp).await;
            }
        }
        if limits.any() {
            let terms = Held { limits, bound };
            let intent = job.id.intent();
            let held = (self.hold(&job.owner, intent, Holding::Create, terms, stamp.now)).await;
            match held {
                // A create of this very key by another function may have landed since the read above (and its job
                // ended already, its place freed).
                Err(StoreError::Refused(refusal)) => {
                    return match self.read_item(&job.id).await? {
                        Some(item) => self.of_existing(decode_item(&item)?, &job, stamp).await,
                        None => Err(StoreError::Refused(refusal)),
                    };
                }
                reserved => reserved?,
            }
        }
        if let Some(input) = input {
            // Written before the job, so a job never lacks its input; the same intent writes the same item.
            self.client
                .put_item()
                .table_name(&self.table)
                .set_item(Some(input))
                .send()
                .await
                .map_err(sdk_failure)?;
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

    async fn reserve(
        &self,
        job: &Job,
        attempt: u32,
        limits: &OwnerLimits,
        bound: Bound,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let admit = |ledger: &OwnerLedger| ledger.reserve(job, attempt, limits, now, bound);
        self.guarded(&job.owner, now, admit).await
    }

    async fn owner_ledger(&self, owner: &Owner) -> Result<OwnerLedger, StoreError> {
        self.owner_ledger_of(owner).await
    }

    async fn settle_place(&self, job: &Job, now: Timestamp) -> Result<(), StoreError> {
        let settle = |ledger: &OwnerLedger| Within::Yes(ledger.settle(job, now));
        self.guarded(&job.owner, now, settle).await
    }

    async fn needing_a_person(
        &self,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        self.people_needed(query, now).await
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
        let (listed, next_cursor) = self.listed(owner, query, now).await?;
        let jobs = self.with_inputs(listed).await?;
        Ok(JobPage {
            jobs: jobs.into_iter().map(|d| d.job).collect(),
            next_cursor,
        })
    }

    async fn list_bills(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        let (listed, next_cursor) = self.listed(owner, query, now).await?;
        let bare = |mut job: Job| {
            (job.input, job.result) = (serde_json::Value::Null, None);
            job
        };
        Ok(JobPage {
            jobs: listed.into_iter().map(|d| bare(d.job)).collect(),
            next_cursor,
        })
    }

    async fn apply(&self, id: &JobId, write: JobWrite<'_>) -> Result<(Applied, Job), StoreError> {
        let JobWrite {
            owner,
            transition,
            stamp,
            held,
        } = write;
        let domain = |job: &mut Job| transition.apply(job, stamp);
        // One conditional update where it says all, with the answer a write that lands gives.
        let (update, landed) = match &transition {
            Transition::Claim {
                number,
                lease_expires_at,
            } => (
                transitions::claim(id, *number, *lease_expires_at, stamp),
                Applied::Claimed,
            ),
            Transition::MarkUnknown { number, call_id } => (
                transitions::mark_unknown(id, *number, call_id.as_deref(), stamp),
                Applied::MarkedUnknown,
            ),
            Transition::Complete {
                number,
                result,
                report,
            } => (
                transitions::complete(*number, result, report, stamp),
                Applied::Completed(Completion::Won),
            ),
            Transition::Redispatch { number } => (
                transitions::redispatch(*number, stamp),
                Applied::Redispatched,
            ),
            // Cancelled before: the domain calls that an answer, not an error, and nothing is written. An
            // operator's cancel is recorded on the job: written in full.
            Transition::CancelJob if stamp.operator.is_none() => (
                transitions::cancel_job(stamp),
                Applied::JobCancelled(JobCancel::Cancelled),
            ),
            Transition::AddAttempt { .. } if let Some(held) = held => {
                let first = (self.held_attempt(id, owner, held, stamp.now, &domain)).await?;
                return (self.read_then_write(id, owner, stamp.now, first, domain)).await;
            }
            Transition::AddAttempt { .. }
            | Transition::Fail { .. }
            | Transition::CancelAttempt { .. }
            | Transition::ClearUnknown { .. }
            | Transition::CancelJob => {
                return self
                    .read_then_write(id, owner, stamp.now, None, domain)
                    .await;
            }
        };
        let (applied, job) = self.update(id, owner, stamp.now, update, domain).await?;
        let applied = match transition {
            // Whoever holds the slot now says who won, whichever way this write went.
            Transition::Complete { number, .. } => Applied::Completed(match job.completed_by {
                Some(winner) if winner == number => Completion::Won,
                winner => Completion::Lost { winner },
            }),
            _ => applied.unwrap_or(landed),
        };
        Ok((applied, job))
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
}
