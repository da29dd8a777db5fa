//! The [`EventStore`] port on DynamoDB: an owner's endpoint is the item `endpoint#<owner>`, a job's deliveries (armed
//! when its owner has an endpoint, or for every job if the store arms every job) the item `events#<job id>`
//! (guarded by `rev`, kept until the job's `expires_at` by the table's TTL), listed while due in the sweep index
//! under `EVENTS#s` by when they are due.

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use chrono::serde::{ts_milliseconds_option, ts_seconds};
use serde::{Deserialize, Serialize};

use super::codec::{json_text, json_text_option as json_opt};
use super::item::read;
use super::update::{Sweep, sweep_key};
use super::{DynamoStore, n, s, sdk};
use crate::domain::event::event_id;
use crate::domain::{Deliveries, Endpoint, EventDelivery, Job, JobId, Owner, Timestamp};
use crate::store::{EventStore, StoreError};

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
        // Removing one writes the item without its endpoint: a put, not a `DeleteItem`, whose client code alone
        // would take the API function past its package budget.
        let item = serde_dynamo::to_item(EndpointItem {
            pk: endpoint_key(owner),
            endpoint: endpoint.cloned(),
        })
        .expect("an endpoint always encodes");
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(sdk)?;
        Ok(())
    }

    async fn arm_deliveries(&self, job: &Job, settles_at: Timestamp) -> Result<bool, StoreError> {
        if !self.every_job && self.get(&endpoint_key(&job.owner)).await?.is_none() {
            return Ok(false);
        }
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
            .expression_attribute_values(":spk", s(&sweep_key(Sweep::Events, &job.id)))
            .expression_attribute_values(":due", n(settles_at.timestamp_millis()))
            .expression_attribute_values(":exp", n(job.expires_at.timestamp()))
            .expression_attribute_values(":own", s(job.owner.as_str()))
            .expression_attribute_values(":job", s(job.id.as_str()))
            .expression_attribute_values(":none", s("[]"))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .send()
            .await;
        match armed {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                // Armed for this settle before.
                UpdateItemError::ConditionalCheckFailedException(_) => Ok(true),
                other => Err(StoreError::backend(other)),
            },
        }
    }

    async fn deliveries(&self, id: &JobId) -> Result<Option<(Deliveries, u64)>, StoreError> {
        let item = self.get(&deliveries_key(id)).await?;
        item.map(|item| read::<DeliveriesItem>(&item).map(DeliveriesItem::decode))
            .transpose()
    }

    async fn put_deliveries(&self, deliveries: &Deliveries, rev: u64) -> Result<bool, StoreError> {
        // An update, not a put: what the item was armed for stays.
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&deliveries_key(&deliveries.job_id)))
            .condition_expression("#rev = :rev")
            .expression_attribute_names("#rev", "rev")
            .expression_attribute_names("#ev", "events")
            .expression_attribute_names("#spk", "sweep_pk")
            .expression_attribute_names("#sat", "sweep_at")
            .expression_attribute_values(":rev", n(rev))
            .expression_attribute_values(":next", n(rev + 1))
            .expression_attribute_values(":ev", s(&json_text_of(&deliveries.events)));
        let update = match deliveries.due_at {
            Some(at) => update
                .update_expression("SET #ev = :ev, #rev = :next, #spk = :spk, #sat = :sat")
                .expression_attribute_values(
                    ":spk",
                    s(&sweep_key(Sweep::Events, &deliveries.job_id)),
                )
                .expression_attribute_values(":sat", n(at.timestamp_millis())),
            None => update.update_expression("SET #ev = :ev, #rev = :next REMOVE #spk, #sat"),
        };
        match update.send().await {
            Ok(_) => Ok(true),
            Err(e) => match e.into_service_error() {
                UpdateItemError::ConditionalCheckFailedException(_) => Ok(false),
                other => Err(StoreError::backend(other)),
            },
        }
    }

    async fn due_deliveries(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<(Deliveries, u64)>, StoreError> {
        let before = now + chrono::Duration::milliseconds(1);
        let keys = self.sweep_keys(Sweep::Events, before, limit).await?;
        let mut due = Vec::new();
        for item in self.read_items(&keys).await? {
            let (deliveries, rev) = read::<DeliveriesItem>(&item)?.decode();
            if deliveries.due_at.is_some_and(|at| at <= now) && deliveries.expires_at > now {
                due.push((deliveries, rev));
            }
        }
        due.sort_by_key(|(d, _)| d.due_at);
        due.truncate(limit);
        Ok(due)
    }
}
