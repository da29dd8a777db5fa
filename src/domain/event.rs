//! Completion events: an owner's endpoint, the event a settled job makes, and where each event's delivery stands.
//!
//! When a job settles (invariant 12), its owner's endpoint, if one is registered, hears of it once per settle: a
//! signed POST, tried again with backoff until the endpoint answers 2xx. The event's id is derived from the job and
//! the settle, so every try of one event carries the same id, and the receiver drops the repeats. A failed job that
//! is retried by hand and ends again settles again: a second event, with an id of its own.

use chrono::Duration;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ids::{JobId, Owner};
use super::job::{Job, JobStatus, Timestamp};

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
    /// A new endpoint at `url` with a fresh random secret.
    pub fn new(url: String, now: Timestamp) -> Self {
        let secret = format!(
            "whsec_{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
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

/// One event and its tries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventDelivery {
    /// `evt_` and 32 hex digits; the same on every try.
    pub id: String,
    /// The job's status when it settled.
    pub status: JobStatus,
    #[schema(value_type = String, format = DateTime)]
    pub settled_at: Timestamp,
    /// POSTs made so far.
    pub tries: u32,
    /// When the endpoint answered 2xx; then no more tries.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub delivered_at: Option<Timestamp>,
    /// Why the last try did not deliver: `HTTP 500`, a refused connection, a refused address.
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

/// What the deliverer does with a job's deliveries when they are due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// The job is open, or settles later: look again at `at` (`None`: when a write ends it).
    Later(Option<Timestamp>),
    /// Deliver (or try again) this event.
    Deliver(EventDelivery),
    /// Its event for this settle was delivered: nothing to do.
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

    /// What is due for `job` as it stands at `now`.
    pub fn due(&self, job: &Job, now: Timestamp) -> Due {
        let Some(settled_at) = job.settles_at() else {
            return Due::Later(None);
        };
        if settled_at > now {
            return Due::Later(Some(settled_at));
        }
        let id = event_id(job, settled_at);
        match self.events.iter().find(|e| e.id == id) {
            Some(e) if e.delivered_at.is_some() => Due::Done,
            Some(e) => Due::Deliver(e.clone()),
            None => Due::Deliver(EventDelivery {
                id,
                status: job.status(),
                settled_at,
                tries: 0,
                delivered_at: None,
                last_error: None,
                next_try_at: None,
            }),
        }
    }

    /// Records a try of `event` at `now`: delivered, or not (`error`), and then due again after the backoff.
    pub fn record(
        &mut self,
        mut event: EventDelivery,
        now: Timestamp,
        error: Option<String>,
        retry_after: Duration,
    ) {
        event.tries += 1;
        match error {
            None => {
                event.delivered_at = Some(now);
                event.last_error = None;
                event.next_try_at = None;
                self.due_at = None;
            }
            Some(error) => {
                let next = now + retry_after;
                event.last_error = Some(error);
                event.next_try_at = Some(next);
                self.due_at = Some(next);
            }
        }
        match self.events.iter_mut().find(|e| e.id == event.id) {
            Some(kept) => *kept = event,
            None => self.events.push(event),
        }
    }
}

/// The body of `event`'s POST: what settled, and how; the job itself is one authorised `GET` away.
pub fn body(job: &Job, event: &EventDelivery) -> serde_json::Value {
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
