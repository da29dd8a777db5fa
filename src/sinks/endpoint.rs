//! The owner's endpoint: a signed POST of each event (`onejob-event-id`, and `onejob-signature`, Stripe's scheme),
//! and the guard on where it may go. Only globally routable unicast addresses are reached — checked at
//! registration (as written, and as the name resolves then), before each try (as written) and at the connection
//! itself (the client's own resolver judges every address a name resolves to). The client follows no redirect
//! (a redirect could lead anywhere) and takes no proxy from the environment (a proxy would resolve the name itself,
//! past the guard); a name that does not resolve is not sent to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::{Outcome, Sink};
use crate::clock::Clock;
use serde_json::Value;

use crate::domain::event::signature;
use crate::domain::{Endpoint, EventDelivery, SinkKind};

/// Why an endpoint is refused.
#[derive(Debug, thiserror::Error)]
pub enum EndpointRefused {
    #[error("{0:?}: an endpoint is an http or https URL without a user, a password or port 0")]
    Url(String),
    #[error(
        "{0} is a loopback, private, link-local or otherwise internal address; endpoints must be public \
         (allow_private_endpoints lets a local setup use its own)"
    )]
    Private(IpAddr),
}

/// The endpoint sink: its client is made when it first posts (the API and worker functions never do).
#[derive(Debug)]
pub struct EndpointSink {
    /// How long one POST may take, the connection and its name's lookup included.
    timeout: Duration,
    /// Whether endpoints may be on any address (a local setup's own receiver).
    allow_private: bool,
    /// What a signature's time is read from.
    clock: Arc<dyn Clock>,
    client: OnceLock<reqwest::Client>,
}

impl EndpointSink {
    pub fn new(timeout: Duration, allow_private: bool, clock: Arc<dyn Clock>) -> Self {
        Self {
            timeout,
            allow_private,
            clock,
            client: OnceLock::new(),
        }
    }

    /// Checks `url` as an endpoint: `EndpointSink::vet`, and (unless allowed) its name must not resolve to a
    /// private address now (a name that does not resolve now is checked at each delivery's connection).
    pub async fn check(&self, url: &str) -> Result<reqwest::Url, EndpointRefused> {
        let parsed = self.vet(url)?;
        if !self.allow_private
            && let Some(host) = parsed.host_str()
            && let Ok(found) = lookup(host).await
            && let Some(ip) = found.iter().map(|a| a.ip()).find(|ip| is_private(*ip))
        {
            return Err(EndpointRefused::Private(ip));
        }
        Ok(parsed)
    }

    /// `url`'s own rules, without a lookup: http or https, no credentials in it, no port 0, and (unless allowed) not
    /// a private address as written.
    fn vet(&self, url: &str) -> Result<reqwest::Url, EndpointRefused> {
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
            Some(ip) if !self.allow_private && is_private(ip) => Err(EndpointRefused::Private(ip)),
            _ => Ok(parsed),
        }
    }
}

#[async_trait]
impl Sink for EndpointSink {
    fn kind(&self) -> SinkKind {
        SinkKind::Endpoint
    }

    async fn put(
        &self,
        event: &EventDelivery,
        body: &Value,
        endpoint: Option<&Endpoint>,
    ) -> Outcome {
        let Some(endpoint) = endpoint else {
            return Outcome::Refused("no endpoint".into());
        };
        // Checked again as it is now: an address written in the URL never reaches the resolver, which refuses
        // what a name resolves to at the connection itself (within the try's timeout).
        if let Err(refused) = self.vet(&endpoint.url) {
            return Outcome::Refused(refused.to_string());
        }
        let body = serde_json::to_vec(body).expect("JSON always serialises");
        let signed = signature(&endpoint.secret, self.clock.now(), &body);
        let sent = self
            .client
            .get_or_init(|| client(self.timeout, self.allow_private))
            .post(&endpoint.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("onejob-event-id", &event.id)
            .header("onejob-signature", signed)
            .body(body)
            .send()
            .await;
        match sent {
            Ok(answer) if answer.status().is_success() => Outcome::Delivered,
            Ok(answer) => Outcome::Rejected(format!("HTTP {}", answer.status().as_u16())),
            Err(e) => Outcome::Unreachable(crate::telemetry::error_chain(&e).to_string()),
        }
    }
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

/// The endpoint sink's HTTP client: no redirects, no proxy from the environment, `timeout` for the whole try, and
/// unless private endpoints are allowed, a resolver that refuses private addresses.
fn client(timeout: Duration, allow_private: bool) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .user_agent(concat!("onejob/", env!("CARGO_PKG_VERSION")));
    let builder = if allow_private {
        builder
    } else {
        builder.dns_resolver(Arc::new(PublicOnly))
    };
    builder
        .build()
        .expect("a client with these settings builds")
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
        let refused = client(Duration::from_secs(5), false)
            .post(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap_err();
        let chain = crate::telemetry::error_chain(&refused).to_string();
        assert!(chain.contains("private"), "{chain}");
        let allowed = client(Duration::from_secs(5), true);
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
