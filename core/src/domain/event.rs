//! Completion events: an owner's endpoint, the event a settled job makes, and where each event's delivery stands.
//!
//! When a job settles (invariant 12), its owner's endpoint, if one is registered, hears of it once per settle: a
//! signed POST, tried again with backoff until the endpoint answers 2xx. If the deployment names an EventBridge bus
//! (`event_bus`), every settled job's event also goes there, tried on its own until the bus takes it: each sink's
//! delivery is its own record, so a failing endpoint never puts the event on the bus twice. The event's id is derived
//! from the job and the settle, so every try of one event, to either sink, carries the same id, and the receiver
//! drops the repeats. A failed job that is retried by hand and ends again settles again: a second event, with an id
//! of its own.

use chrono::Duration;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::bill::{Bill, amount};
use super::ids::{JobId, Owner};
use super::job::Job;
use super::status::JobStatus;
use super::time::Timestamp;

/// An owner's endpoint: where its completion events go, and the secret that signs them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub url: String,
    /// `whsec_` and 64 hex digits; the HMAC-SHA256 key of every event's signature.
    pub secret: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Endpoint {
    /// A new endpoint at `url` with a fresh secret: 256 bits from the operating system's random source.
    pub fn new(url: String, now: Timestamp) -> Self {
        let mut bits = [0u8; 32];
        getrandom::fill(&mut bits).expect("the operating system's random source answers");
        let secret = format!("whsec_{}", hex::encode(bits));
        Self {
            url,
            secret,
            created_at: now,
            updated_at: now,
        }
    }
}

/// One job's completion events and where their delivery stands: what the deliverer reads and writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deliveries {
    pub owner: Owner,
    pub job_id: JobId,
    /// When the deliverer looks at the job next; `None`: not until a write ends the job again.
    pub due_at: Option<Timestamp>,
    /// The job's: the deliveries go with it.
    pub expires_at: Timestamp,
    /// One per settle, oldest first.
    pub events: Vec<EventDelivery>,
}

/// Where an event goes.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    /// The owner's endpoint: a signed POST.
    #[default]
    Endpoint,
    /// The deployment's EventBridge bus: one `PutEvents` entry.
    Bus,
}

impl SinkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Endpoint => "endpoint",
            Self::Bus => "bus",
        }
    }
}

/// One event's delivery to one sink, and its tries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventDelivery {
    /// `evt_` and 32 hex digits; the same on every try, to every sink.
    pub id: String,
    /// Where this delivery goes (records from before the bus have none: the endpoint).
    #[serde(default)]
    pub sink: SinkKind,
    /// The job's status when it settled.
    pub status: JobStatus,
    #[schema(value_type = String, format = DateTime)]
    pub settled_at: Timestamp,
    /// Tries made so far.
    pub tries: u32,
    /// When the sink took it (the endpoint answered 2xx, the bus accepted the entry); then no more tries.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub delivered_at: Option<Timestamp>,
    /// Why the last try did not deliver: `HTTP 500`, a refused connection, a refused address, the bus's error.
    pub last_error: Option<String>,
    /// When the next try is due, while the event is not delivered.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_try_at: Option<Timestamp>,
}

/// The event a job makes when it settles: its id is the same for every try and every deliverer.
pub fn event_id(job: &Job, settled_at: Timestamp) -> String {
    let digest = Sha256::new()
        .chain_update(job.id.as_str())
        .chain_update(b"\0")
        .chain_update(job.status().as_str())
        .chain_update(b"\0")
        .chain_update(settled_at.timestamp_millis().to_be_bytes())
        .finalize();
    format!("evt_{}", hex::encode(&digest[..16]))
}

/// How long after try `tries` (1 for the first) the next one is due: `base`, doubling, at most `cap`.
pub fn backoff(base: Duration, cap: Duration, tries: u32) -> Duration {
    let factor = 1i32 << tries.saturating_sub(1).min(20);
    (base * factor).min(cap)
}

/// How many tries of one owner's endpoint run at once. Every owner's endpoint gets this many a batch at least,
/// however long another owner's backlog is: one slow or failing endpoint takes its own share of a batch, never the
/// others' (what the deliverer holds to: `engine::deliveries`).
pub const ENDPOINT_IN_FLIGHT: usize = 4;

/// What one process's batches of deliveries hold, side by side: each job's deliveries (`J`) in one batch's hand at a
/// time — another batch that lists them leaves them — and each owner's (`O`) endpoint tried at most `cap` times at
/// once ([`ENDPOINT_IN_FLIGHT`]), whichever batch started the tries. A slow endpoint then holds its own tries only:
/// a batch that comes while they run leaves its owner's deliveries due and sends everyone else's (what the deliverer
/// holds to: `engine::in_hand`; the fairness model checks it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hand<J: Ord, O: Ord> {
    jobs: std::collections::BTreeSet<J>,
    /// Tries in flight, by owner; an owner with none has no entry.
    tries: std::collections::BTreeMap<O, usize>,
}

impl<J: Ord, O: Ord> Default for Hand<J, O> {
    fn default() -> Self {
        Self {
            jobs: Default::default(),
            tries: Default::default(),
        }
    }
}

impl<J: Ord + Clone, O: Ord + Clone> Hand<J, O> {
    /// Takes `job`'s deliveries for a batch, unless another batch has them.
    pub fn take(&mut self, job: &J) -> bool {
        self.jobs.insert(job.clone())
    }

    /// The batch is done with `job`'s deliveries.
    pub fn release(&mut self, job: &J) {
        self.jobs.remove(job);
    }

    /// Starts a try at `owner`'s endpoint, unless `cap` of them are in flight already.
    pub fn start(&mut self, owner: &O, cap: usize) -> bool {
        let tries = self.tries.entry(owner.clone()).or_default();
        let started = *tries < cap;
        *tries += usize::from(started);
        if *tries == 0 {
            self.tries.remove(owner);
        }
        started
    }

    /// A try at `owner`'s endpoint ended.
    pub fn end(&mut self, owner: &O) {
        if let Some(tries) = self.tries.get_mut(owner) {
            *tries -= 1;
            if *tries == 0 {
                self.tries.remove(owner);
            }
        }
    }

    /// Whether nothing is held (no job, no try).
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.tries.is_empty()
    }
}

/// Each owner's share of a batch of `limit` deliveries when `owners` owners have some due: an equal part, and at
/// least [`ENDPOINT_IN_FLIGHT`] — a lone owner gets the whole batch, a crowd gets a few each. The stores list at
/// most this many of each owner's due deliveries, soonest first, taken in rounds ([`fair_batch`]): one owner's
/// backlog never stands before another owner's event.
pub fn fair_share(limit: usize, owners: usize) -> usize {
    (limit / owners.max(1))
        .max(ENDPOINT_IN_FLIGHT)
        .min(limit.max(1))
}

/// Of the deliveries due, named by their owner and when each is due, those a batch of `limit` takes: each owner's
/// soonest, up to its [`fair_share`], taken in rounds — every owner's soonest first, then every owner's next —
/// at most `limit` in all, so that every owner with something due (up to `limit` of them) has its soonest in the
/// batch, however much another has due. What every store lists (`EventStore::due_deliveries`). The indexes of
/// `due` taken, by round, then by when due.
pub fn fair_batch<O: Ord>(due: &[(O, Timestamp)], limit: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..due.len()).collect();
    order.sort_by(|a, b| (&due[*a].0, due[*a].1, a).cmp(&(&due[*b].0, due[*b].1, b)));
    let owners = order
        .windows(2)
        .filter(|w| due[w[0]].0 != due[w[1]].0)
        .count()
        + usize::from(!due.is_empty());
    let share = fair_share(limit, owners);
    let mut ranked = Vec::new();
    let mut rank = 0;
    for (place, i) in order.iter().enumerate() {
        rank = if place > 0 && due[order[place - 1]].0 == due[*i].0 {
            rank + 1
        } else {
            0
        };
        if rank < share {
            ranked.push((rank, *i));
        }
    }
    ranked.sort_by_key(|(rank, i)| (*rank, due[*i].1, *i));
    ranked.truncate(limit);
    ranked.into_iter().map(|(_, i)| i).collect()
}

/// What the deliverer does with a job's deliveries when they are due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// The job is open, or settles later: look again at `at` (`None`: when a write ends it).
    Later(Option<Timestamp>),
    /// Deliver (or try again) this event, to each of these sinks.
    Deliver(Vec<EventDelivery>),
    /// Its event for this settle was delivered to every sink: nothing to do.
    Done,
}

impl Deliveries {
    /// Deliveries for `job`, due at `due_at`.
    pub fn new(job: &Job, due_at: Timestamp) -> Self {
        Self {
            owner: job.owner.clone(),
            job_id: job.id.clone(),
            due_at: Some(due_at),
            expires_at: job.expires_at,
            events: Vec::new(),
        }
    }

    /// What is due for `job` as it stands at `now`, its event going to `sinks`: each sink that has not taken it and
    /// is not waiting out a backoff.
    pub fn due(&self, job: &Job, now: Timestamp, sinks: &[SinkKind]) -> Due {
        let Some(settled_at) = job.settles_at() else {
            return Due::Later(None);
        };
        if settled_at > now {
            return Due::Later(Some(settled_at));
        }
        let id = event_id(job, settled_at);
        let mut deliver = Vec::new();
        let mut later = None;
        for &sink in sinks {
            match self.events.iter().find(|e| e.id == id && e.sink == sink) {
                Some(e) if e.delivered_at.is_some() => {}
                Some(EventDelivery {
                    next_try_at: Some(at),
                    ..
                }) if *at > now => later = Some(later.map_or(*at, |l: Timestamp| l.min(*at))),
                Some(e) => deliver.push(e.clone()),
                None => deliver.push(EventDelivery {
                    id: id.clone(),
                    sink,
                    status: job.status(),
                    settled_at,
                    tries: 0,
                    delivered_at: None,
                    last_error: None,
                    next_try_at: None,
                }),
            }
        }
        match (deliver.is_empty(), later) {
            (false, _) => Due::Deliver(deliver),
            (true, Some(at)) => Due::Later(Some(at)),
            (true, None) => Due::Done,
        }
    }

    /// Records the tries made at `now`, each event delivered, or not (its error) and then due again after
    /// `retry_after(tries so far)`. The deliveries are next due when the first of the event's sinks still
    /// waiting for it is (`None` once every one took it).
    pub fn record(
        &mut self,
        tried: &[(EventDelivery, Option<String>)],
        now: Timestamp,
        retry_after: impl Fn(u32) -> Duration,
    ) {
        for (event, error) in tried {
            let mut event = event.clone();
            event.tries += 1;
            event.delivered_at = error.is_none().then_some(now);
            event.next_try_at = error.is_some().then(|| now + retry_after(event.tries));
            event.last_error = error.clone();
            match self
                .events
                .iter_mut()
                .find(|e| e.id == event.id && e.sink == event.sink)
            {
                Some(kept) => *kept = event,
                None => self.events.push(event),
            }
        }
        self.due_at = self
            .events
            .iter()
            .filter(|e| e.delivered_at.is_none() && tried.iter().any(|(t, _)| t.id == e.id))
            .filter_map(|e| e.next_try_at)
            .min();
    }
}

/// The body of `event`'s POST (and the bus entry's detail): what settled, and how; the job itself is one
/// authorised `GET` away.
pub fn body(job: &Job, event: &EventDelivery, currency: &str) -> serde_json::Value {
    let bill = Bill::of(job);
    let total = bill.total();
    serde_json::json!({
        "id": event.id,
        "type": "job.settled",
        "settled_at": event.settled_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "job": {
            "id": job.id,
            "contract": job.contract.to_string(),
            "status": event.status,
            "result": job.result,
            "error": job.error,
            "attempts": job.attempts.len(),
            "usage": {
                "currency": currency,
                "cost": amount(total.cost_nanos),
                "input_tokens": total.input_tokens,
                "output_tokens": total.output_tokens,
                "discarded_cost": amount(bill.discarded.cost_nanos),
                "unknown_attempts": bill.unknown,
                "possibly_paid_attempts": bill.possibly_paid,
                "complete": bill.complete(),
            },
        },
    })
}

/// The signature header's value for `body` sent at `at`: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`,
/// keyed by the endpoint's secret (as Stripe's webhooks sign).
pub fn signature(secret: &str, at: Timestamp, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let t = at.timestamp();
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::tests::{at, by, job};

    /// A failing sink backs off alone: the one that took the event is not tried again, and the deliveries are due
    /// when the failing one's next try is.
    #[test]
    fn each_sink_takes_the_event_once_and_backs_off_on_its_own() {
        let mut cancelled = job();
        cancelled.cancel(&by(1)).unwrap();
        let settled = cancelled.settles_at().unwrap();
        let mut deliveries = Deliveries::new(&cancelled, settled);
        let both = [SinkKind::Endpoint, SinkKind::Bus];
        assert_eq!(
            deliveries.due(&cancelled, settled - Duration::milliseconds(1), &both),
            Due::Later(Some(settled))
        );
        let Due::Deliver(first) = deliveries.due(&cancelled, at(5), &both) else {
            panic!("due at once");
        };
        assert_eq!(
            first.iter().map(|e| e.sink).collect::<Vec<_>>(),
            both,
            "both sinks, one event"
        );
        assert!(first.iter().all(|e| e.id == first[0].id));
        let wait = |tries: u32| Duration::seconds(10 * i64::from(tries));
        deliveries.record(
            &[
                (first[0].clone(), Some("HTTP 500".into())),
                (first[1].clone(), None),
            ],
            at(5),
            wait,
        );
        assert_eq!(deliveries.due_at, Some(at(10_005)));
        assert_eq!(
            deliveries.due(&cancelled, at(6), &both),
            Due::Later(Some(at(10_005))),
            "the endpoint waits out its backoff; the bus is done"
        );
        let Due::Deliver(second) = deliveries.due(&cancelled, at(10_005), &both) else {
            panic!("the endpoint's next try is due");
        };
        assert_eq!(second.len(), 1);
        assert_eq!((second[0].sink, second[0].tries), (SinkKind::Endpoint, 1));
        deliveries.record(
            &[(second[0].clone(), Some("HTTP 503".into()))],
            at(10_005),
            wait,
        );
        assert_eq!(deliveries.due_at, Some(at(30_005)), "doubled: 2 tries");
        let Due::Deliver(third) = deliveries.due(&cancelled, at(30_005), &both) else {
            panic!("due again");
        };
        deliveries.record(&[(third[0].clone(), None)], at(30_005), wait);
        assert_eq!(deliveries.due_at, None);
        assert_eq!(deliveries.due(&cancelled, at(40_000), &both), Due::Done);
        let tries: Vec<_> = deliveries
            .events
            .iter()
            .map(|e| (e.sink, e.tries))
            .collect();
        assert_eq!(tries, [(SinkKind::Endpoint, 3), (SinkKind::Bus, 1)]);
        // A record from before sinks were kept is the endpoint's.
        let old: EventDelivery = serde_json::from_value(serde_json::json!({
            "id": "evt_0", "status": "cancelled", "settled_at": "2027-01-15T08:00:00Z", "tries": 1,
            "delivered_at": null, "last_error": null, "next_try_at": null,
        }))
        .unwrap();
        assert_eq!(old.sink, SinkKind::Endpoint);
    }

    #[test]
    fn backoff_doubles_from_its_base_up_to_its_cap() {
        let (base, cap) = (Duration::seconds(1), Duration::seconds(60));
        let waits: Vec<i64> = (1..=8)
            .map(|t| backoff(base, cap, t).num_seconds())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(backoff(base, cap, 1_000), cap);
    }

    /// Checked against `printf '1700000000.{}' | openssl dgst -sha256 -hmac key`.
    #[test]
    fn the_signature_is_hmac_sha256_of_the_time_and_the_body() {
        let at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        assert_eq!(
            signature("key", at, b"{}"),
            "t=1700000000,v1=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
        );
    }
}

#[cfg(test)]
mod fairness {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn a_batch_takes_every_owners_soonest_before_anyones_second() {
        let at = |s: i64| Utc.timestamp_opt(1_800_000_000 + s, 0).unwrap();
        // Bob has five due, sooner than alice's one; a batch of two takes one of each.
        let mut due: Vec<(&str, Timestamp)> = (0..5).map(|i| ("bob", at(i))).collect();
        due.push(("alice", at(10)));
        assert_eq!(fair_batch(&due, 2), [0, 5]);
        // A lone owner gets the whole batch, soonest first.
        assert_eq!(fair_batch(&due[..5], 3), [0, 1, 2]);
        assert_eq!(fair_share(100, 1), 100);
        assert_eq!(fair_share(100, 50), ENDPOINT_IN_FLIGHT);
        assert!(fair_batch::<&str>(&[], 10).is_empty());
    }
}
