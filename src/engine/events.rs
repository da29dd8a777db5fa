//! Completion events: registering an owner's endpoint, arming a job's deliveries when a write ends it, and the
//! deliverer, which POSTs each settled job's signed event until its endpoint answers 2xx, and puts it on the
//! deployment's EventBridge bus (if it names one) until the bus takes it.
//!
//! Everything the deliverer knows is in the store (`EventStore`): a delivery that a crash interrupts is due again
//! when its claim runs out, and goes out then, from whichever process looks. Two deliverers never POST one event at
//! once while a claim holds: each takes the deliveries by compare-and-swap before it sends.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use chrono::Duration;
use futures_util::future::join_all;
use futures_util::{StreamExt, stream};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::{Batch, Engine};
use crate::domain::event::{self, Due};
use crate::domain::{
    Deliveries, Endpoint, EventDelivery, Job, JobId, Owner, Sink, Timestamp, WriteToken,
};
use crate::metrics::EventTry;
use crate::store::StoreError;

/// How many deliveries one process makes at once.
const DELIVERIES_IN_FLIGHT: usize = 16;

/// How events are delivered.
#[derive(Debug, Clone)]
pub struct EventSettings {
    /// How long one POST may take.
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

/// Why an endpoint is refused.
#[derive(Debug, thiserror::Error)]
pub enum EndpointRefused {
    #[error("{0:?}: an endpoint is an http or https URL without a user or password")]
    Url(String),
    #[error(
        "{0} is a loopback, private or link-local address; endpoints must be public (allow_private_endpoints lets a local setup use its own)"
    )]
    Private(IpAddr),
}

/// Whether `ip` is somewhere a server-side request must not go: this host, a private network, link-local (cloud
/// metadata), shared, unspecified, broadcast or multicast.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_private(IpAddr::V4(v4)),
            None => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unique_local()
                    || v6.is_unicast_link_local()
            }
        },
    }
}

/// The deliverer's resolver: the system's, with every private address refused, so a public name that resolves
/// to one (or is made to, later) is not reached.
#[derive(Debug)]
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            if let Some(private) = found.iter().find(|a| is_private(a.ip())) {
                return Err(EndpointRefused::Private(private.ip()).into());
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}

/// The deliverer's HTTP client: no redirects (a redirect could lead anywhere), the settings' timeout, and unless
/// private endpoints are allowed, a resolver that refuses private addresses.
pub fn client(settings: &EventSettings) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(settings.timeout)
        .user_agent(concat!("onejob/", env!("CARGO_PKG_VERSION")));
    let builder = if settings.allow_private {
        builder
    } else {
        builder.dns_resolver(Arc::new(PublicOnly))
    };
    builder
        .build()
        .expect("a client with these settings builds")
}

/// What a try of one event came to: `None` if delivered, else why not.
type TryOutcome = Option<String>;

impl Engine {
    /// Checks `url` as an endpoint: http or https, no credentials in it, and (unless allowed) not a private
    /// address, as written or as its name resolves now (a name that does not resolve now is checked at each
    /// delivery).
    pub async fn check_endpoint(&self, url: &str) -> Result<reqwest::Url, EndpointRefused> {
        let refuse = || EndpointRefused::Url(url.to_owned());
        let parsed = reqwest::Url::parse(url).map_err(|_| refuse())?;
        if !matches!(parsed.scheme(), "http" | "https")
            || !parsed.username().is_empty()
            || parsed.password().is_some()
            || url.len() > 2048
        {
            return Err(refuse());
        }
        if self.settings.events.allow_private {
            return Ok(parsed);
        }
        let host = parsed.host_str().ok_or_else(refuse)?;
        let private = match host.trim_start_matches('[').trim_end_matches(']').parse() {
            Ok(ip) => Some(ip).filter(|ip| is_private(*ip)),
            Err(_) => tokio::net::lookup_host((host, 0))
                .await
                .map(|found| found.map(|a| a.ip()).find(|ip| is_private(*ip)))
                .unwrap_or(None),
        };
        match private {
            Some(ip) => Err(EndpointRefused::Private(ip)),
            None => Ok(parsed),
        }
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

    /// After a write: if it ended the job, its owner's endpoint (if any) is to hear of it once it settles. Tried
    /// again like a write while the store fails (arming twice is arming once); logged, and an `Err`, if it never
    /// lands.
    pub(super) async fn arm_deliveries(&self, job: &Job) -> Result<(), StoreError> {
        let Some(settles_at) = job.settles_at() else {
            return Ok(());
        };
        let armed = self
            .persist(
                "arm deliveries",
                &WriteToken::new(),
                self.write_deadline(),
                |_| self.store.arm_deliveries(job, settles_at),
            )
            .await;
        match armed {
            Ok(true) => self.deliveries_due.notify_one(),
            Ok(false) => {}
            Err(ref e) => {
                tracing::error!(job_id = %job.id, error = %crate::telemetry::error_chain(e), "the job's completion event could not be scheduled; failing the step so that it comes back");
            }
        }
        armed.map(|_| ())
    }

    /// For a message whose attempt is over: if its job ended, the deliveries are armed again. The step that ended
    /// it may have stopped between its write and the arming (a Lambda out of time), and left its message to come
    /// back: this is what is left of that step. Arming twice is arming once.
    pub async fn rearm_deliveries(&self, id: &JobId) -> Result<(), StoreError> {
        match self.store.read_job(id, self.clock.now()).await? {
            Some(job) => self.arm_deliveries(&job).await,
            None => Ok(()),
        }
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
    /// rest stay due, the store failed on them), counted those of which a sink took the event.
    pub async fn deliver_batch(&self) -> Result<Batch, StoreError> {
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
        let endpoint = self.store.endpoint(&deliveries.owner).await?;
        let sinks: Vec<Sink> = [
            endpoint.as_ref().map(|_| Sink::Endpoint),
            self.settings.events.bus.as_ref().map(|_| Sink::Bus),
        ]
        .into_iter()
        .flatten()
        .collect();
        let events = match deliveries.due(&job, now, &sinks) {
            Due::Deliver(events) => events,
            Due::Later(at) => return self.put_off(deliveries, rev, at).await,
            Due::Done => {
                if sinks.is_empty() {
                    tracing::info!(job_id = %job.id, "no endpoint any more: the event is dropped");
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
            let outcome = match (event.sink, &endpoint) {
                (Sink::Endpoint, Some(endpoint)) => self.post(endpoint, &job, &event).await,
                (Sink::Endpoint, None) => Some("no endpoint".to_owned()),
                (Sink::Bus, _) => self.put_on_bus(&job, &event).await,
            };
            (event, outcome)
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
    fn tried(&self, job: &Job, event: &EventDelivery, outcome: EventTry, error: Option<&str>) {
        let since_settle = (self.clock.now() - event.settled_at)
            .to_std()
            .unwrap_or_default();
        self.metrics.event_try(event.sink, outcome, since_settle);
        let (sink, tries) = (event.sink.as_str(), event.tries + 1);
        match error {
            None => {
                tracing::info!(job_id = %job.id, event_id = %event.id, sink, tries, "event delivered")
            }
            Some(why) => {
                tracing::warn!(job_id = %job.id, event_id = %event.id, sink, tries, error = %why, "event not delivered; it will be tried again")
            }
        }
    }

    /// One POST of `event` to `endpoint`.
    async fn post(&self, endpoint: &Endpoint, job: &Job, event: &EventDelivery) -> TryOutcome {
        // Checked again as it is now: an address written in the URL never reaches the resolver, which refuses
        // what a name resolves to at the connection itself.
        if let Err(refused) = self.check_endpoint(&endpoint.url).await {
            let refused = refused.to_string();
            self.tried(job, event, EventTry::Refused, Some(&refused));
            return Some(refused);
        }
        let body = serde_json::to_vec(&event::body(job, event)).expect("JSON always serialises");
        let signature = event::signature(&endpoint.secret, self.clock.now(), &body);
        let sent = self
            .event_client
            .get_or_init(|| client(&self.settings.events))
            .post(&endpoint.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("onejob-event-id", &event.id)
            .header("onejob-signature", signature)
            .body(body)
            .send()
            .await;
        let (outcome, error) = match sent {
            Ok(answer) if answer.status().is_success() => (EventTry::Delivered, None),
            Ok(answer) => (
                EventTry::Rejected,
                Some(format!("HTTP {}", answer.status().as_u16())),
            ),
            Err(e) => (
                EventTry::Unreachable,
                Some(crate::telemetry::error_chain(&e).to_string()),
            ),
        };
        self.tried(job, event, outcome, error.as_deref());
        error
    }

    /// One `PutEvents` of `event` on the settings' bus: source `onejob`, type `job.settled`, the POST's body as the
    /// detail (a result is at most 64 KiB, so it always fits the entry's 256 KiB), the settle as its time. A lost
    /// answer makes a second entry with the same event id: the receiver drops it, as it drops an endpoint's
    /// repeats.
    async fn put_on_bus(&self, job: &Job, event: &EventDelivery) -> TryOutcome {
        use aws_sdk_eventbridge::types::PutEventsRequestEntry;
        let (Some(bus), Some(client)) = (&self.settings.events.bus, &self.bus) else {
            let why = "this process has no EventBridge client (the sweeper puts events on the bus)";
            self.tried(job, event, EventTry::Unreachable, Some(why));
            return Some(why.to_owned());
        };
        let entry = PutEventsRequestEntry::builder()
            .event_bus_name(bus)
            .source("onejob")
            .detail_type("job.settled")
            .detail(event::body(job, event).to_string())
            .time(aws_sdk_eventbridge::primitives::DateTime::from_millis(
                event.settled_at.timestamp_millis(),
            ))
            .build();
        let put = tokio::time::timeout(
            self.settings.events.timeout,
            client.put_events().entries(entry).send(),
        )
        .await;
        let (outcome, error) = match put {
            Err(_) => (EventTry::Unreachable, Some("no answer in time".to_owned())),
            Ok(Err(e)) => (
                EventTry::Unreachable,
                Some(crate::telemetry::error_chain(&e).to_string()),
            ),
            Ok(Ok(answer)) => match answer.entries().first() {
                Some(entry) if entry.error_code().is_some() => (
                    EventTry::Rejected,
                    Some(format!(
                        "{}: {}",
                        entry.error_code().unwrap_or_default(),
                        entry.error_message().unwrap_or_default()
                    )),
                ),
                _ if answer.failed_entry_count() > 0 => (
                    EventTry::Rejected,
                    Some("the bus refused the entry".to_owned()),
                ),
                _ => (EventTry::Delivered, None),
            },
        };
        self.tried(job, event, outcome, error.as_deref());
        error
    }

    /// Writes what the tries came to. If the deliveries moved since the claim (a write armed them again), the
    /// tries are recorded on what they are now, and the sooner of the two times stays. Whether one delivered.
    async fn record(
        &self,
        mut deliveries: Deliveries,
        mut rev: u64,
        claim: Timestamp,
        tried: Vec<(EventDelivery, TryOutcome)>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_public_and_internal_addresses() {
        for private in [
            "127.0.0.1",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd12::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in ["8.8.8.8", "100.128.0.1", "172.32.0.1", "2606:4700::1111"] {
            assert!(!is_private(public.parse().unwrap()), "{public}");
        }
    }

    /// The deliverer's own resolver refuses a name that resolves to a private address: the connection is never
    /// made, whatever the name resolved to when the endpoint was registered.
    #[tokio::test]
    async fn the_deliverers_client_does_not_connect_to_a_name_that_resolves_privately() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let refused = client(&EventSettings::default())
            .post(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap_err();
        let chain = crate::telemetry::error_chain(&refused).to_string();
        assert!(chain.contains("private"), "{chain}");
        let allowed = client(&EventSettings {
            allow_private: true,
            ..EventSettings::default()
        });
        let accepted = tokio::spawn(async move { listener.accept().await.is_ok() });
        // Allowed, the same name connects (the listener takes the connection; no answer is needed).
        let _ = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            allowed.post(format!("http://localhost:{port}/")).send(),
        )
        .await;
        assert!(accepted.await.unwrap());
    }
}
