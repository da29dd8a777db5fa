//! A wire proxy in front of the AWS test server: every request of the clients pointed at it goes through it, and a
//! test names the requests it holds back (a slow write: it lands when the test lets it go) or whose answers it
//! loses (the request lands, its client gets a 500 and tries again). Two stores behind one proxy on one table are
//! two processes meeting on the table, with the faults of the wire between them and it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

/// What the proxy does to the first request a rule matches.
#[derive(Debug, Clone)]
enum Fate {
    /// Held until [`Held::release`], then sent on.
    Hold(Held),
    /// Sent on, and its answer replaced by a 500.
    LoseAnswer,
}

#[derive(Debug)]
struct Rule {
    /// The operation (`PutItem`), as the `X-Amz-Target` header ends.
    operation: &'static str,
    /// Text the request's body holds.
    marker: String,
    fate: Fate,
}

/// A request held at the proxy: the test waits for it to arrive, then lets it go.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    arrived: watch::Sender<bool>,
    released: watch::Sender<bool>,
}

impl Held {
    /// Waits (on the proxy, not on time) until the held request has arrived.
    pub(crate) async fn arrived(&self) {
        let mut arrived = self.arrived.subscribe();
        tokio::time::timeout(std::time::Duration::from_secs(20), arrived.wait_for(|a| *a))
            .await
            .expect("the held request never came")
            .unwrap();
    }

    /// Sends the held request on.
    pub(crate) fn release(&self) {
        self.released.send_replace(true);
    }
}

#[derive(Debug, Default)]
struct Rules {
    armed: Mutex<Vec<Rule>>,
    /// Each request's operation, as it passed.
    seen: Mutex<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Upstream {
    url: String,
    http: reqwest::Client,
    rules: Arc<Rules>,
}

pub(crate) struct WireProxy {
    pub addr: SocketAddr,
    rules: Arc<Rules>,
}

impl WireProxy {
    /// A proxy on loopback in front of `upstream` (`http://127.0.0.1:PORT`).
    pub(crate) async fn start(upstream: &str) -> Self {
        let rules = Arc::new(Rules::default());
        let state = Upstream {
            url: upstream.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
            rules: rules.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, rules }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds the next `operation` whose body holds `marker` until the test releases it.
    pub(crate) fn hold(&self, operation: &'static str, marker: &str) -> Held {
        let held = Held {
            arrived: watch::Sender::new(false),
            released: watch::Sender::new(false),
        };
        self.arm(operation, marker, Fate::Hold(held.clone()));
        held
    }

    /// Loses the answer of the next `operation` whose body holds `marker`: it lands, its client hears a 500.
    pub(crate) fn lose_answer(&self, operation: &'static str, marker: &str) {
        self.arm(operation, marker, Fate::LoseAnswer);
    }

    fn arm(&self, operation: &'static str, marker: &str, fate: Fate) {
        self.rules.armed.lock().unwrap().push(Rule {
            operation,
            marker: marker.to_owned(),
            fate,
        });
    }

    /// Whether every rule armed has struck.
    pub(crate) fn spent(&self) -> bool {
        self.rules.armed.lock().unwrap().is_empty()
    }

    /// How many requests of `operation` passed.
    pub(crate) fn count(&self, operation: &str) -> usize {
        let seen = self.rules.seen.lock().unwrap();
        seen.iter().filter(|o| o.as_str() == operation).count()
    }
}

async fn forward(
    State(up): State<Upstream>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let operation = headers
        .get("x-amz-target")
        .and_then(|t| t.to_str().ok())
        .and_then(|t| t.rsplit('.').next())
        .unwrap_or_default()
        .to_owned();
    up.rules.seen.lock().unwrap().push(operation.clone());
    let fate = {
        let mut armed = up.rules.armed.lock().unwrap();
        let text = String::from_utf8_lossy(&body);
        let hit = armed
            .iter()
            .position(|r| r.operation == operation && text.contains(&r.marker));
        hit.map(|i| armed.remove(i).fate)
    };
    if let Some(Fate::Hold(held)) = &fate {
        held.arrived.send_replace(true);
        let mut released = held.released.subscribe();
        let _ = released.wait_for(|r| *r).await;
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = up.http.request(method, format!("{}{path}", up.url));
    for (name, value) in &headers {
        if !matches!(name.as_str(), "host" | "content-length" | "connection") {
            request = request.header(name, value);
        }
    }
    let answer = request.body(body).send().await.unwrap();
    if matches!(fate, Some(Fate::LoseAnswer)) {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    let status = answer.status();
    let mut out = HeaderMap::new();
    for (name, value) in answer.headers() {
        if !matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection"
        ) {
            out.insert(name, value.clone());
        }
    }
    let bytes = answer.bytes().await.unwrap();
    (status, out, bytes).into_response()
}
