//! Completion events: registering an owner's endpoint, arming a job's deliveries when a write ends it, and the
//! deliverer, which POSTs each settled job's signed event until its endpoint answers 2xx, and puts it on the
//! deployment's EventBridge bus (if it names one) until the bus takes it.
//!
//! Everything the deliverer knows is in the store (`EventStore`): a delivery that a crash interrupts is due again
//! when its claim runs out, and goes out then, from whichever process looks. Two deliverers never POST one event at
//! once while a claim holds: each takes the deliveries by compare-and-swap before it sends.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
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

/// Whether `ip` is somewhere a server-side request must not go: anything but globally routable unicast. IPv4:
/// this network, private, shared (CGN), loopback, link-local (cloud metadata), IETF protocol assignments, the
/// documentation and benchmarking ranges, the 6to4 relay, multicast, reserved and broadcast. IPv6: everything
/// outside global unicast (`2000::/3`: loopback, unspecified, IPv4-compatible, unique and site local, link-local,
/// multicast, local-use NAT64), and inside it the IETF assignments (Teredo among them), documentation and ORCHID
/// ranges. An address that carries an IPv4 one (IPv4-mapped, NAT64's well-known prefix, 6to4) is judged by it.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !is_global_v4(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => !is_global_v4(v4),
            None => !is_global_v6(v6),
        },
    }
}

/// The IPv4 address an IPv6 one stands for: IPv4-mapped (`::ffff:0:0/96`), NAT64's well-known prefix
/// (`64:ff9b::/96`), 6to4 (`2002::/16`, the address in its next 32 bits).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    if let Some(v4) = v6.to_ipv4_mapped() {
        Some(v4)
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(Ipv4Addr::from(v6.to_bits() as u32))
    } else if s[0] == 0x2002 {
        Some(Ipv4Addr::from((u32::from(s[1]) << 16) | u32::from(s[2])))
    } else {
        None
    }
}

fn is_global_v4(v4: Ipv4Addr) -> bool {
    let bits = v4.to_bits();
    let within =
        |net: [u8; 4], len: u32| bits >> (32 - len) == u32::from(Ipv4Addr::from(net)) >> (32 - len);
    const NOT_GLOBAL: [([u8; 4], u32); 16] = [
        ([0, 0, 0, 0], 8),       // this network
        ([10, 0, 0, 0], 8),      // private
        ([100, 64, 0, 0], 10),   // shared address space (carrier-grade NAT)
        ([127, 0, 0, 0], 8),     // loopback
        ([169, 254, 0, 0], 16),  // link-local, cloud metadata
        ([172, 16, 0, 0], 12),   // private
        ([192, 0, 0, 0], 24),    // IETF protocol assignments
        ([192, 0, 2, 0], 24),    // documentation (TEST-NET-1)
        ([192, 88, 99, 0], 24),  // 6to4 relay anycast
        ([192, 168, 0, 0], 16),  // private
        ([198, 18, 0, 0], 15),   // benchmarking
        ([198, 51, 100, 0], 24), // documentation (TEST-NET-2)
        ([203, 0, 113, 0], 24),  // documentation (TEST-NET-3)
        ([224, 0, 0, 0], 4),     // multicast
        ([240, 0, 0, 0], 4),     // reserved, and the broadcast address
        ([255, 255, 255, 255], 32),
    ];
    !NOT_GLOBAL.iter().any(|&(net, len)| within(net, len))
}

fn is_global_v6(v6: Ipv6Addr) -> bool {
    let bits = v6.to_bits();
    let within = |net: u128, len: u32| bits >> (128 - len) == net >> (128 - len);
    const NOT_GLOBAL: [(u128, u32); 3] = [
        (0x2001_0000 << 96, 23), // IETF protocol assignments: Teredo, benchmarking, ORCHID, …
        (0x2001_0db8 << 96, 32), // documentation
        (0x3fff_0000 << 96, 20), // documentation (RFC 9637)
    ];
    within(0x2000 << 112, 3) && !NOT_GLOBAL.iter().any(|&(net, len)| within(net, len))
}

/// The deliverer's resolver: the system's, with every private address refused, so a public name that resolves
/// to one (or is made to, later) is not reached.
#[derive(Debug)]
struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let found = lookup(name.as_str()).await?;
            if let Some(private) = found.iter().find(|a| is_private(a.ip())) {
                return Err(EndpointRefused::Private(private.ip()).into());
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}

/// How long one name may take to resolve, at registration and at each delivery's connection.
const DNS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The addresses `host` resolves to now, within [`DNS_TIMEOUT`].
async fn lookup(host: &str) -> std::io::Result<Vec<SocketAddr>> {
    match tokio::time::timeout(DNS_TIMEOUT, tokio::net::lookup_host((host, 0))).await {
        Ok(found) => Ok(found?.collect()),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{host} did not resolve within {DNS_TIMEOUT:?}"),
        )),
    }
}

/// The deliverer's HTTP client: no redirects (a redirect could lead anywhere), no proxy from the environment (a
/// proxy would resolve the endpoint's name itself, past the vetted resolver), the settings' timeout, and unless
/// private endpoints are allowed, a resolver that refuses private addresses.
pub fn client(settings: &EventSettings) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .no_proxy()
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
    /// Checks `url` as an endpoint: [`Engine::vet_endpoint`], and (unless allowed) its name must not resolve to a
    /// private address now (a name that does not resolve now is checked at each delivery's connection).
    pub async fn check_endpoint(&self, url: &str) -> Result<reqwest::Url, EndpointRefused> {
        let parsed = self.vet_endpoint(url)?;
        if !self.settings.events.allow_private
            && let Some(host) = parsed.host_str()
            && let Ok(found) = lookup(host).await
            && let Some(ip) = found.iter().map(|a| a.ip()).find(|ip| is_private(*ip))
        {
            return Err(EndpointRefused::Private(ip));
        }
        Ok(parsed)
    }

    /// `url`'s own rules, without a lookup: http or https, no credentials in it, no port 0, and (unless allowed) not
    /// a private address as written. Every delivery checks this again; the deliverer's resolver judges a name's
    /// addresses at the connection itself.
    fn vet_endpoint(&self, url: &str) -> Result<reqwest::Url, EndpointRefused> {
        let refuse = || EndpointRefused::Url(url.to_owned());
        let parsed = reqwest::Url::parse(url).map_err(|_| refuse())?;
        if !matches!(parsed.scheme(), "http" | "https")
            || !parsed.username().is_empty()
            || parsed.password().is_some()
            || parsed.port() == Some(0)
            || url.len() > 2048
        {
            return Err(refuse());
        }
        let host = parsed.host_str().ok_or_else(refuse)?;
        let written: Option<IpAddr> = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .ok();
        match written {
            Some(ip) if !self.settings.events.allow_private && is_private(ip) => {
                Err(EndpointRefused::Private(ip))
            }
            _ => Ok(parsed),
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
        // what a name resolves to at the connection itself (within the try's timeout, so inside its claim).
        if let Err(refused) = self.vet_endpoint(&endpoint.url) {
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
            // IETF assignments, benchmarking, reserved and documentation ranges.
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "240.0.0.1",
            "192.0.2.1",
            "198.51.100.1",
            "203.0.113.1",
            "192.88.99.1",
            // NAT64 (well-known and local-use), 6to4 and IPv4-compatible carrying a private address; Teredo,
            // site-local, documentation.
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::808:808",
            "2002:a00:1::1",
            "2002:7f00:1::",
            "::127.0.0.1",
            "::8.8.8.8",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fec0::1",
            "2001:db8::1",
            "3fff::1",
            "ff02::1",
        ] {
            assert!(is_private(private.parse().unwrap()), "{private}");
        }
        for public in [
            "8.8.8.8",
            "100.128.0.1",
            "172.32.0.1",
            "198.20.0.1",
            "2606:4700::1111",
            "2001:4860:4860::8888",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "::ffff:8.8.8.8",
        ] {
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
