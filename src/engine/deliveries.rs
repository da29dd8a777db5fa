//! Completion events as the engine keeps them: an owner's endpoint registered, and the deliverer, which takes each
//! due job's deliveries by compare-and-swap (so that two deliverers never send one event at once while a claim
//! holds), hands the settled job's event to each sink that has not taken it (`sinks`: the owner's endpoint, the
//! deployment's bus), and records what each try came to, backing off on its own per sink.
//!
//! Everything the deliverer knows is in the store (`EventStore`): a delivery that a crash interrupts is due again
//! when its claim runs out, and goes out then, from whichever process looks. Deliveries are armed by the write that
//! ends a job (`follow_up`).
//!
//! Owners share the deliverer fairly: the store lists each owner's fair share of a batch
//! ([`crate::domain::event::fair_share`]), a process tries at most [`ENDPOINT_IN_FLIGHT`] of one owner's at once
//! (across its batches, which run side by side: `in_hand`), and an owner whose endpoint fails or is slow (a try that
//! did not deliver, or took over [`SLOW`]) starts no more tries in that batch — they stay due for the next. A slow
//! endpoint holds its own tries only: every other owner's events go out in the batches that run meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::Duration;
use futures_util::future::join_all;

use super::in_hand::DELIVERIES_IN_FLIGHT;
use super::{Batch, Engine};
use crate::domain::event::{self, Due, ENDPOINT_IN_FLIGHT, body};
use crate::domain::{Deliveries, Endpoint, EventDelivery, Job, JobId, Owner, SinkKind, Timestamp};
use crate::sinks::Outcome;
use crate::sinks::endpoint::EndpointRefused;
use crate::store::StoreError;

/// A try that takes longer than this tells of a slow endpoint: its owner's other tries wait for the next batch.
const SLOW: std::time::Duration = std::time::Duration::from_secs(1);

/// What looking at one job's due deliveries came to, and how long its sinks took to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// A sink took the event.
    Delivered(std::time::Duration),
    /// It was tried, and no sink took it.
    Failed,
    /// Nothing was sent: not due yet, done already, or another deliverer claimed it.
    Nothing,
}

/// One owner's tries in a batch: a few at once, and none more once one failed or was slow.
#[derive(Debug)]
struct Lane {
    in_flight: tokio::sync::Semaphore,
    struggling: std::sync::atomic::AtomicBool,
}

impl Default for Lane {
    fn default() -> Self {
        Self {
            in_flight: tokio::sync::Semaphore::new(ENDPOINT_IN_FLIGHT),
            struggling: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

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

    /// The longest a batch of deliveries may take: one owner's share of it, the whole batch at worst, goes
    /// [`ENDPOINT_IN_FLIGHT`] at a time — the first round as long as the tries' timeout, each later one no longer
    /// than [`SLOW`] (a slower try ends its owner's part of the batch) — beside everyone else's, and the rounds of
    /// the process's tries side by side likewise (the scheduled sweeper starts a batch only if it would end in time).
    pub fn longest_delivery_batch(&self) -> Duration {
        let batch = self.settings.sweep_batch;
        let rounds = batch
            .div_ceil(ENDPOINT_IN_FLIGHT)
            .max(batch.div_ceil(DELIVERIES_IN_FLIGHT));
        let timeout = Duration::from_std(self.settings.events.timeout).unwrap_or_default();
        let slow = Duration::from_std(SLOW).unwrap_or_default();
        timeout + slow * i32::try_from(rounds.saturating_sub(1)).unwrap_or(i32::MAX)
    }

    /// Handles the deliveries due now, at most a sweep's batch: done are those handled (tried, or put off; the
    /// rest stay due: the store failed on them, their endpoint was struggling or had its tries in flight), counted
    /// those of which a sink took the event. Batches run side by side: deliveries another batch of this process
    /// holds are left to it (listed, not done).
    pub async fn deliver_batch(&self) -> Result<Batch, StoreError> {
        self.deliver_batch_and(|| ()).await
    }

    /// [`Self::deliver_batch`], calling `taken` once the batch holds its deliveries: a batch started after that
    /// lists the same due deliveries and leaves them to this one.
    pub async fn deliver_batch_and(&self, taken: impl FnOnce()) -> Result<Batch, StoreError> {
        let due = self
            .store
            .due_deliveries(self.clock.now(), self.settings.sweep_batch)
            .await?;
        let listed = due.len();
        let due: Vec<_> = (due.into_iter())
            .filter_map(|(deliveries, rev)| {
                let held = self.in_hand.take(&deliveries.job_id)?;
                Some((held, deliveries, rev))
            })
            .collect();
        taken();
        let lanes: HashMap<Owner, Arc<Lane>> = (due.iter())
            .map(|(_, d, _)| (d.owner.clone(), Arc::default()))
            .collect();
        // Side by side, a few of each owner's at once: a sweep's batch of slow endpoints fits in a scheduled
        // function's minute.
        let tries = due.into_iter().map(|(_held, deliveries, rev)| {
            let lane = lanes[&deliveries.owner].clone();
            async move {
                let _turn = lane.in_flight.acquire().await.expect("never closed");
                if lane.struggling.load(Ordering::Acquire) {
                    // Its endpoint failed or was slow in this batch: the rest of its owner's tries wait for the
                    // next, while other owners' go on.
                    return Err(None);
                }
                // Its endpoint has its tries in flight in another batch: they are enough.
                let Some(_sending) = self.in_hand.try_endpoint(&deliveries.owner).await else {
                    return Err(None);
                };
                let id = deliveries.job_id.clone();
                let tried = self.deliver(deliveries, rev).await;
                let fine = match tried {
                    Ok(Tried::Delivered(took)) => took <= SLOW,
                    Ok(Tried::Nothing) => true,
                    Ok(Tried::Failed) | Err(_) => false,
                };
                if !fine {
                    lane.struggling.store(true, Ordering::Release);
                }
                tried.map(|t| matches!(t, Tried::Delivered(_))).map_err(|e| {
                    tracing::warn!(job_id = %id, error = %crate::telemetry::error_chain(&e), "a delivery could not be handled; it stays due");
                    Some(e)
                })
            }
        });
        let outcomes: Vec<Result<bool, Option<StoreError>>> = join_all(tries).await;
        Ok(Batch {
            listed,
            done: outcomes.iter().filter(|o| o.is_ok()).count(),
            counted: outcomes.iter().filter(|o| matches!(o, Ok(true))).count(),
        })
    }

    /// Looks at one job's due deliveries: delivers its event to each sink that has not taken it if it settled,
    /// else puts them off. What the tries came to.
    async fn deliver(&self, mut deliveries: Deliveries, rev: u64) -> Result<Tried, StoreError> {
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
            return Ok(Tried::Nothing);
        }
        let began = std::time::Instant::now();
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
        let took = began.elapsed();
        let delivered = self.record(deliveries, rev + 1, claim, tried).await?;
        Ok(if delivered {
            Tried::Delivered(took)
        } else {
            Tried::Failed
        })
    }

    /// Nothing to send now: the deliveries are next due at `at` (`None`: when a write ends the job again).
    async fn put_off(
        &self,
        mut deliveries: Deliveries,
        rev: u64,
        at: Option<Timestamp>,
    ) -> Result<Tried, StoreError> {
        deliveries.due_at = at;
        self.store.put_deliveries(&deliveries, rev).await?;
        Ok(Tried::Nothing)
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
