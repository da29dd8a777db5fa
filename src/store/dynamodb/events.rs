//! The [`EventStore`] port on DynamoDB: an owner's endpoint is the item `endpoint#<owner>`, a job's deliveries
//! (armed when its owner has an endpoint, or for every job if the store arms every job) the item `events#<job id>`
//! (guarded by `rev`, kept until the job's `expires_at` by the table's TTL), listed while due in the sweep index.
//!
//! Each owner with an endpoint has a lane: its deliveries are listed under `LANE#<owner>`, and its endpoint's item
//! is the lane's head, listed under `LANES#s` by when the lane is next due (an arm, and every recorded try, bring
//! it forward; a conditional update, so that it only moves earlier). A batch lists the heads that are due, then up
//! to each owner's fair share of its lane: one owner's backlog, however long, never stands before another owner's
//! events. A head the deliverer moves on (to the lane's next due delivery, or to a recheck) is written on the
//! condition that no arm moved it meanwhile; a lane found empty twice, a recheck apart — longer than the index
//! takes to show a new delivery — loses its head until the next arm. Deliveries of owners without an endpoint (the
//! bus alone hears of them) and those armed before lanes are listed under `EVENTS#s`, each owner's share of them
//! too.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use chrono::serde::{ts_milliseconds_option, ts_seconds};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use chrono::Duration;

use super::codec::{json_text, json_text_option as json_opt};
use super::item::read;
use super::update::{Sweep, sharded, sweep_key};
use super::{DynamoStore, Item, SWEEP_INDEX, n, s, sdk_failure};
use crate::domain::event::{event_id, fair_share};
use crate::domain::{Deliveries, Endpoint, EventDelivery, Job, JobId, Owner, Timestamp};
use crate::store::{EventStore, StoreError};

/// How long after a lane looked empty it is looked at again before its head goes: far longer than the index takes
/// to show a delivery just armed.
const RECHECK: Duration = Duration::seconds(10);

/// `endpoint` is absent once the owner removed it.
#[derive(Debug, Serialize, Deserialize)]
struct EndpointItem {
    pk: String,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_opt")]
    endpoint: Option<Endpoint>,
}

/// A job's deliveries' item as read (it is only ever written by update expressions).
#[derive(Debug, Deserialize)]
struct DeliveriesItem {
    rev: u64,
    event_owner: Owner,
    event_job: JobId,
    #[serde(with = "ts_seconds")]
    expires_at: Timestamp,
    #[serde(with = "json_text")]
    events: Vec<EventDelivery>,
    /// When they are due (the sweep index's time), absent when nothing is.
    #[serde(default, with = "ts_milliseconds_option")]
    sweep_at: Option<Timestamp>,
}

impl DeliveriesItem {
    fn decode(self) -> (Deliveries, u64) {
        (
            Deliveries {
                owner: self.event_owner,
                job_id: self.event_job,
                due_at: self.sweep_at,
                expires_at: self.expires_at,
                events: self.events,
            },
            self.rev,
        )
    }
}

fn json_text_of(events: &[EventDelivery]) -> String {
    serde_json::to_string(events).expect("events always serialise")
}

fn endpoint_key(owner: &Owner) -> String {
    format!("endpoint#{owner}")
}

fn deliveries_key(id: &JobId) -> String {
    format!("events#{id}")
}

/// The sweep partition of `owner`'s lane of deliveries.
fn lane_key(owner: &Owner) -> String {
    format!("LANE#{owner}")
}

/// A lane's head as read: its endpoint's item key, when it is due, and whether the deliverer set that time (a
/// recheck, or the lane's next delivery) rather than an arm.
struct Head {
    owner: Owner,
    due: i64,
    set_by_deliverer: bool,
}

impl Head {
    fn of(item: &Item) -> Option<Self> {
        let pk = match item.get("pk") {
            Some(AttributeValue::S(pk)) => pk,
            _ => return None,
        };
        let owner = Owner::parse(pk.strip_prefix("endpoint#")?).ok()?;
        let due = match item.get("sweep_at") {
            Some(AttributeValue::N(at)) => at.parse().ok()?,
            _ => return None,
        };
        Some(Self {
            owner,
            due,
            set_by_deliverer: item.contains_key("lane_set"),
        })
    }
}

#[async_trait]
impl EventStore for DynamoStore {
    async fn endpoint(&self, owner: &Owner) -> Result<Option<Endpoint>, StoreError> {
        let item = self.get(&endpoint_key(owner)).await?;
        Ok(item
            .map(|item| read::<EndpointItem>(&item))
            .transpose()?
            .and_then(|e| e.endpoint))
    }

    async fn put_endpoint(
        &self,
        owner: &Owner,
        endpoint: Option<&Endpoint>,
    ) -> Result<(), StoreError> {
        // An update, not a put: the item is also its owner's lane head, which stays. Removing one removes the
        // endpoint attribute (no `DeleteItem`, whose client code alone would take the API function past its package
        // budget).
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&endpoint_key(owner)))
            .expression_attribute_names("#ep", "endpoint");
        let update = match endpoint {
            Some(endpoint) => update
                .update_expression("SET #ep = :ep")
                .expression_attribute_values(
                    ":ep",
                    s(&serde_json::to_string(endpoint).expect("an endpoint")),
                ),
            None => update.update_expression("REMOVE #ep"),
        };
        update.send().await.map_err(sdk_failure)?;
        Ok(())
    }

    async fn arm_deliveries(&self, job: &Job, settles_at: Timestamp) -> Result<bool, StoreError> {
        let has_endpoint = (self.get(&endpoint_key(&job.owner)).await?)
            .is_some_and(|item| item.contains_key("endpoint"));
        if !self.every_job && !has_endpoint {
            return Ok(false);
        }
        let lane = match has_endpoint {
            true => lane_key(&job.owner),
            false => sweep_key(Sweep::Events, &job.id),
        };
        // A new settle bumps the revision: a deliverer that read the item before does not write its older time over
        // this one.
        let armed = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&deliveries_key(&job.id)))
            .update_expression(
                "SET #spk = :spk, #sat = :due, #arm = :arm, #exp = :exp, #own = :own, #job = :job, \
                 #ev = if_not_exists(#ev, :none), #rev = if_not_exists(#rev, :zero) + :one",
            )
            .condition_expression("attribute_not_exists(#arm) OR #arm <> :arm")
            .expression_attribute_names("#arm", "armed")
            .expression_attribute_values(":arm", s(&event_id(job, settles_at)))
            .expression_attribute_names("#spk", "sweep_pk")
            .expression_attribute_names("#sat", "sweep_at")
            .expression_attribute_names("#exp", "expires_at")
            .expression_attribute_names("#own", "event_owner")
            .expression_attribute_names("#job", "event_job")
            .expression_attribute_names("#ev", "events")
            .expression_attribute_names("#rev", "rev")
            .expression_attribute_values(":spk", s(&lane))
            .expression_attribute_values(":due", n(settles_at.timestamp_millis()))
            .expression_attribute_values(":exp", n(job.expires_at.timestamp()))
            .expression_attribute_values(":own", s(job.owner.as_str()))
            .expression_attribute_values(":job", s(job.id.as_str()))
            .expression_attribute_values(":none", s("[]"))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .send()
            .await;
        match armed.map_err(|e| e.into_service_error()) {
            // Armed for this settle before (its head was brought forward then, and is again: arming twice is
            // arming once).
            Ok(_) | Err(UpdateItemError::ConditionalCheckFailedException(_)) => {}
            Err(other) => return Err(StoreError::backend(other)),
        }
        if has_endpoint {
            self.bring_forward(&job.owner, settles_at, true).await?;
        }
        Ok(true)
    }

    async fn deliveries(&self, id: &JobId) -> Result<Option<(Deliveries, u64)>, StoreError> {
        let item = self.get(&deliveries_key(id)).await?;
        item.map(|item| read::<DeliveriesItem>(&item).map(DeliveriesItem::decode))
            .transpose()
    }

    async fn put_deliveries(&self, deliveries: &Deliveries, rev: u64) -> Result<bool, StoreError> {
        // An update, not a put: what the item was armed for, and its lane, stay. A delivery with nothing due leaves
        // the index (its time goes; its partition stays, for the next time it is due).
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&deliveries_key(&deliveries.job_id)))
            .condition_expression("#rev = :rev")
            .expression_attribute_names("#rev", "rev")
            .expression_attribute_names("#ev", "events")
            .expression_attribute_names("#sat", "sweep_at")
            .expression_attribute_values(":rev", n(rev))
            .expression_attribute_values(":next", n(rev + 1))
            .expression_attribute_values(":ev", s(&json_text_of(&deliveries.events)))
            .return_values(ReturnValue::AllNew);
        let update = match deliveries.due_at {
            Some(at) => update
                .update_expression(
                    "SET #ev = :ev, #rev = :next, #spk = if_not_exists(#spk, :spk), #sat = :sat",
                )
                .expression_attribute_names("#spk", "sweep_pk")
                .expression_attribute_values(
                    ":spk",
                    s(&sweep_key(Sweep::Events, &deliveries.job_id)),
                )
                .expression_attribute_values(":sat", n(at.timestamp_millis())),
            None => update.update_expression("SET #ev = :ev, #rev = :next REMOVE #sat"),
        };
        let written = match update.send().await {
            Ok(written) => written,
            Err(e) => {
                return match e.into_service_error() {
                    UpdateItemError::ConditionalCheckFailedException(_) => Ok(false),
                    other => Err(StoreError::backend(other)),
                };
            }
        };
        let in_lane = (written.attributes)
            .and_then(|item| item.get("sweep_pk").cloned())
            .is_some_and(|pk| pk.as_s().is_ok_and(|pk| pk.starts_with("LANE#")));
        if let (true, Some(at)) = (in_lane, deliveries.due_at) {
            self.bring_forward(&deliveries.owner, at, false).await?;
        }
        Ok(true)
    }

    async fn due_deliveries(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<(Deliveries, u64)>, StoreError> {
        let before = now + Duration::milliseconds(1);
        let heads: Vec<Head> = (self
            .read_items(&self.sweep_keys(Sweep::Lanes, before, limit).await?)
            .await?)
            .iter()
            .filter_map(Head::of)
            .filter(|head| head.due <= now.timestamp_millis())
            .collect();
        let mut shared: BTreeMap<Owner, Vec<(Deliveries, u64)>> = BTreeMap::new();
        for item in self
            .read_items(&self.sweep_keys(Sweep::Events, before, limit).await?)
            .await?
        {
            let (deliveries, rev) = read::<DeliveriesItem>(&item)?.decode();
            if deliveries.due_at.is_some_and(|at| at <= now) && deliveries.expires_at > now {
                shared
                    .entry(deliveries.owner.clone())
                    .or_default()
                    .push((deliveries, rev));
            }
        }
        let share = fair_share(limit, heads.len() + shared.len());
        // Each owner's soonest first, in rounds, as `fair_batch` takes them.
        let mut due = Vec::new();
        for head in heads {
            due.extend(self.lane(head, share, now).await?.into_iter().enumerate());
        }
        for (_, mut owned) in shared {
            owned.sort_by_key(|(d, _)| d.due_at);
            due.extend(owned.into_iter().take(share).enumerate());
        }
        due.sort_by_key(|(rank, (d, _))| (*rank, d.due_at));
        due.truncate(limit);
        Ok(due.into_iter().map(|(_, due)| due).collect())
    }
}

impl DynamoStore {
    /// Brings `owner`'s lane head forward to `at`, unless it is due sooner already. An arm (`armed`) also marks the
    /// head as an arm's, whether or not it moved it: a lane looked at for an arm's delivery is not taken for empty
    /// on one look (the index may show the delivery a moment after its write).
    async fn bring_forward(
        &self,
        owner: &Owner,
        at: Timestamp,
        armed: bool,
    ) -> Result<(), StoreError> {
        let head = || {
            self.client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&endpoint_key(owner)))
                .expression_attribute_names("#set", "lane_set")
        };
        let moved = head()
            .update_expression("SET #spk = :lanes, #sat = :at REMOVE #set")
            .condition_expression("attribute_not_exists(#sat) OR #sat > :at")
            .expression_attribute_names("#spk", "sweep_pk")
            .expression_attribute_names("#sat", "sweep_at")
            .expression_attribute_values(":lanes", s(&sharded(Sweep::Lanes, owner.as_str())))
            .expression_attribute_values(":at", n(at.timestamp_millis()))
            .send()
            .await;
        match moved.map_err(|e| e.into_service_error()) {
            Ok(_) => return Ok(()),
            Err(UpdateItemError::ConditionalCheckFailedException(_)) => {}
            Err(other) => return Err(StoreError::backend(other)),
        }
        if armed {
            head()
                .update_expression("REMOVE #set")
                .send()
                .await
                .map_err(sdk_failure)?;
        }
        Ok(())
    }

    /// The due deliveries of `head`'s lane, at most `share`, soonest first; the head then moves to the lane's next
    /// due delivery (or, with nothing else listed, a recheck; or, found empty at its own recheck, it goes), unless
    /// an arm moved it meanwhile.
    async fn lane(
        &self,
        head: Head,
        share: usize,
        now: Timestamp,
    ) -> Result<Vec<(Deliveries, u64)>, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(SWEEP_INDEX)
            .key_condition_expression("sweep_pk = :pk")
            .expression_attribute_values(":pk", s(&lane_key(&head.owner)))
            .limit(i32::try_from(share + 1).unwrap_or(i32::MAX))
            .send()
            .await
            .map_err(sdk_failure)?;
        let keys: Vec<String> = (out.items().iter())
            .filter_map(|entry| entry.get("pk")?.as_s().ok().cloned())
            .collect();
        let mut listed = Vec::new();
        for item in self.read_items(&keys).await? {
            let (deliveries, rev) = read::<DeliveriesItem>(&item)?.decode();
            if deliveries.expires_at > now
                && let Some(at) = deliveries.due_at
            {
                listed.push((at, deliveries, rev));
            }
        }
        listed.sort_by_key(|(at, d, _)| (*at, d.job_id.clone()));
        let (due, later): (Vec<_>, Vec<_>) = listed.into_iter().partition(|(at, _, _)| *at <= now);
        let mut due: Vec<(Deliveries, u64)> = due.into_iter().map(|(_, d, rev)| (d, rev)).collect();
        let unlisted = due.split_off(due.len().min(share));
        let next = (unlisted.iter().filter_map(|(d, _)| d.due_at))
            .chain(later.iter().map(|(at, _, _)| *at))
            .min();
        let head_key = endpoint_key(&head.owner);
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&head_key))
            .expression_attribute_names("#sat", "sweep_at")
            .expression_attribute_names("#set", "lane_set")
            .expression_attribute_values(":read", n(head.due));
        let update = match (next, due.is_empty(), head.set_by_deliverer) {
            // Empty when the deliverer looked last, a recheck ago, and empty still: the head goes, until the next arm.
            (None, true, true) => update
                .update_expression("REMOVE #spk, #sat, #set")
                .expression_attribute_names("#spk", "sweep_pk")
                .condition_expression("#sat = :read AND attribute_exists(#set)"),
            _ => {
                let at = next.unwrap_or(now + RECHECK);
                let condition = match head.set_by_deliverer {
                    true => "#sat = :read AND attribute_exists(#set)",
                    false => "#sat = :read AND attribute_not_exists(#set)",
                };
                update
                    .update_expression("SET #sat = :at, #set = :one")
                    .condition_expression(condition)
                    .expression_attribute_values(":at", n(at.timestamp_millis()))
                    .expression_attribute_values(":one", n(1))
            }
        };
        match update.send().await.map_err(|e| e.into_service_error()) {
            // An arm moved the head meanwhile: it stands as the arm left it.
            Ok(_) | Err(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(due),
            Err(other) => Err(StoreError::backend(other)),
        }
    }
}
