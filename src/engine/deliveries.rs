//! Completion events as the engine keeps them: an owner's endpoint registered, and the deliverer, which takes each
//! due job's deliveries by compare-and-swap (so that two deliverers never send one event at once while a claim
//! holds), hands the settled job's event to each sink that has not taken it (`sinks`: the owner's endpoint, the
//! deployment's bus), and records what each try came to, backing off on its own per sink.
//!
//! Everything the deliverer knows is in the store (`EventStore`): a delivery that a crash interrupts is due again
//! when its claim runs out, and goes out then, from whichever process looks. Deliveries are armed by the write that
//! ends a job (`follow_up`).

use chrono::Duration;
use futures_util::future::join_all;
use futures_util::{StreamExt, stream};

use super::{Batch, Engine};
use crate::domain::event::{self, Due, body};
use crate::domain::{Deliveries, Endpoint, EventDelivery, Job, JobId, Owner, SinkKind, Timestamp};
use crate::sinks::Outcome;
use crate::sinks::endpoint::EndpointRefused;
use crate::store::StoreError;

/// How many deliveries one process makes at once.
const DELIVERIES_IN_FLIGHT: usize = 16;

/// How events are delivered.
#[derive(Debug, Clone)]
pub struct EventSettings {
    /// How long one try may take (a POST, its connection and its name's lookup; a `PutEvents`).
    pub timeout: std::time::Duration,
    /// The wait after a failed try: this, doubling, at most `backoff_cap`.
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    /// Whether endpoints may be on loopback, private or link-local addresses (a local setup's own receiver).
    pub allow_private: bool,
    /// The EventBridge bus (name or ARN) every settled job's event also goes to.
    pub bus: Option<String>,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            timeout: std::time::Duration::from_secs(5),
            backoff_base: Duration::seconds(1),
            backoff_cap: Duration::hours(1),
            allow_private: false,
            bus: None,
        }
    }
}

impl Engine {
    /// Checks `url` as an endpoint (the endpoint sink's guard: see `sinks::endpoint`).
    pub async fn check_endpoint(&self, url: &str) -> Result<reqwest::Url, EndpointRefused> {
        self.sinks.endpoint.check(url).await
    }

    /// The owner's endpoint, if one is registered.
    pub async fn endpoint(&self, owner: &Owner) -> Result<Option<Endpoint>, StoreError> {
        self.store.endpoint(owner).await
    }

    /// Removes the owner's endpoint: events not delivered yet are dropped.
    pub async fn remove_endpoint(&self, owner: &Owner) -> Result<(), StoreError> {
        self.store.put_endpoint(owner, None).await
    }

    /// The completion events of job `id` (`actor`'s to see) and where each delivery stands (`None`: no such job).
    pub async fn job_events(
        &self,
        actor: &super::Actor,
        id: &JobId,
    ) -> Result<Option<Vec<EventDelivery>>, StoreError> {
        if self.job_for(actor, id).await?.is_none() {
            return Ok(None);
        }
        let deliveries = self.store.deliveries(id).await?;
        Ok(Some(deliveries.map(|(d, _)| d.events).unwrap_or_default()))
    }

    /// Registers `url` as the owner's endpoint. The secret stays what it was if the owner had one (so a repeat of
    /// this call, or a move to another URL, does not invalidate the receiver's), else it is new.
    pub async fn put_endpoint(
        &self,
        owner: &Owner,
        url: reqwest::Url,
    ) -> Result<Endpoint, StoreError> {
        let now = self.clock.now();
        let endpoint = match self.store.endpoint(owner).await? {
            Some(old) => Endpoint {
                url: url.to_string(),
                updated_at: now,
                ..old
            },
            None => Endpoint::new(url.to_string(), now),
        };
        self.store.put_endpoint(owner, Some(&endpoint)).await?;
        Ok(endpoint)
    }

    /// Resolves when deliveries were armed in this process since the last call (or at once if they were before).
    pub async fn deliveries_armed(&self) {
        self.deliveries_due.notified().await;
    }

    /// Handles the deliveries due now, at most a sweep's batch; how many events were delivered.
    pub async fn deliver_due(&self) -> Result<usize, StoreError> {
        Ok(self.deliver_batch().await?.counted)
    }

    /// The longest a batch of deliveries may take: its rounds of tries side by side, each at most the tries'
    /// timeout (the scheduled sweeper starts one only if it would end in time).
    pub fn longest_delivery_batch(&self) -> Duration {
        let rounds = self.settings.sweep_batch.div_ceil(DELIVERIES_IN_FLIGHT);
        Duration::from_std(self.settings.events.timeout).unwrap_or_default()
            * i32::try_from(rounds).unwrap_or(i32::MAX)
    }

    /// Handles the deliveries due now, at most a sweep's batch: done are those handled (tried, or put off; the
    /// rest stay due, the store failed on them), counted those of which a sink took the event. A batch already in
    /// progress in this process is waited for, and what it handled is no longer due.
    pub async fn deliver_batch(&self) -> Result<Batch, StoreError> {
        let _one_at_a_time = self.delivering.lock().await;
        let due = self
            .store
            .due_deliveries(self.clock.now(), self.settings.sweep_batch)
            .await?;
        let listed = due.len();
        let tries = due.into_iter().map(|(deliveries, rev)| async move {
            let id = deliveries.job_id.clone();
            self.deliver(deliveries, rev).await.inspect_err(|e| {
                tracing::warn!(job_id = %id, error = %crate::telemetry::error_chain(e), "a delivery could not be handled; it stays due");
            })
        });
        // Side by side: a sweep's batch of slow endpoints fits in a scheduled function's minute.
        let outcomes: Vec<Result<bool, StoreError>> = stream::iter(tries)
            .buffer_unordered(DELIVERIES_IN_FLIGHT)
            .collect()
            .await;
        Ok(Batch {
            listed,
            done: outcomes.iter().filter(|o| o.is_ok()).count(),
            counted: outcomes.iter().filter(|o| matches!(o, Ok(true))).count(),
        })
    }

    /// Looks at one job's due deliveries: delivers its event to each sink that has not taken it if it settled,
    /// else puts them off. Whether an event was delivered.
    async fn deliver(&self, mut deliveries: Deliveries, rev: u64) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let job = self
            .store
            .get_job(&deliveries.owner, &deliveries.job_id, now)
            .await?;
        // A job gone with its retention has nothing more to say.
        let Some(job) = job else {
            return self.put_off(deliveries, rev, None).await;
        };
        // The endpoint hears of the jobs that settle from its registration on, whatever armed the deliveries (a
        // late message arms a job that ended before it, and the endpoint may be newer than that).
        let endpoint = self
            .store
            .endpoint(&deliveries.owner)
            .await?
            .filter(|e| job.settles_at().is_none_or(|at| at >= e.created_at));
        let sinks: Vec<SinkKind> = self
            .sinks
            .for_owner(endpoint.is_some())
            .iter()
            .map(|sink| sink.kind())
            .collect();
        let events = match deliveries.due(&job, now, &sinks) {
            Due::Deliver(events) => events,
            Due::Later(at) => return self.put_off(deliveries, rev, at).await,
            Due::Done => {
                if sinks.is_empty() {
                    tracing::info!(job_id = %job.id, "no endpoint for this settle: the event is dropped");
                }
                return self.put_off(deliveries, rev, None).await;
            }
        };
        // Claimed for these tries: nobody else sends them before they could have ended (the timeout, and a
        // second).
        let claim = now
            + Duration::from_std(self.settings.events.timeout).unwrap_or_default()
            + Duration::seconds(1);
        deliveries.due_at = Some(claim);
        if !self.store.put_deliveries(&deliveries, rev).await? {
            return Ok(false);
        }
        let tried = join_all(events.into_iter().map(|event| async {
            let outcome = match self.sinks.get(event.sink) {
                Some(sink) => {
                    let body = body(&job, &event, self.currency());
                    sink.put(&event, &body, endpoint.as_ref()).await
                }
                None => Outcome::Refused("this process does not deliver to this sink".into()),
            };
            self.tried(&job, &event, &outcome);
            (event, outcome.error().map(str::to_owned))
        }))
        .await;
        self.record(deliveries, rev + 1, claim, tried).await
    }

    /// Nothing to send now: the deliveries are next due at `at` (`None`: when a write ends the job again).
    async fn put_off(
        &self,
        mut deliveries: Deliveries,
        rev: u64,
        at: Option<Timestamp>,
    ) -> Result<bool, StoreError> {
        deliveries.due_at = at;
        self.store.put_deliveries(&deliveries, rev).await?;
        Ok(false)
    }

    /// Counts a try of `event` and logs what it came to.
    fn tried(&self, job: &Job, event: &EventDelivery, outcome: &Outcome) {
        let since_settle = (self.clock.now() - event.settled_at)
            .to_std()
            .unwrap_or_default();
        self.metrics
            .event_try(event.sink, outcome.metric(), since_settle);
        let (sink, tries) = (event.sink.as_str(), event.tries + 1);
        match outcome.error() {
            None => {
                tracing::info!(job_id = %job.id, event_id = %event.id, sink, tries, "event delivered")
            }
            Some(why) => {
                tracing::warn!(job_id = %job.id, event_id = %event.id, sink, tries, error = %why, "event not delivered; it will be tried again")
            }
        }
    }

    /// Writes what the tries came to. If the deliveries moved since the claim (a write armed them again), the
    /// tries are recorded on what they are now, and the sooner of the two times stays. Whether one delivered.
    async fn record(
        &self,
        mut deliveries: Deliveries,
        mut rev: u64,
        claim: Timestamp,
        tried: Vec<(EventDelivery, Option<String>)>,
    ) -> Result<bool, StoreError> {
        let delivered = tried.iter().any(|(_, error)| error.is_none());
        let now = self.clock.now();
        let events = &self.settings.events;
        let retry_after = |tries| event::backoff(events.backoff_base, events.backoff_cap, tries);
        loop {
            let armed = deliveries.due_at.filter(|at| *at != claim);
            deliveries.record(&tried, now, retry_after);
            if let Some(armed) = armed {
                deliveries.due_at = Some(deliveries.due_at.map_or(armed, |at| at.min(armed)));
            }
            if self.store.put_deliveries(&deliveries, rev).await? {
                return Ok(delivered);
            }
            match self.store.deliveries(&deliveries.job_id).await? {
                Some((now_stored, now_rev)) => (deliveries, rev) = (now_stored, now_rev),
                None => return Ok(delivered),
            }
        }
    }
}
