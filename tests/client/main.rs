//! `onejob jobs …` / `onejob attempts …` run as a user would (the real binary), and the library's `Intent` and
//! `Client` as a Rust program uses them, against the real local server behind a scripted TCP proxy on loopback that
//! can drop a connection after the server answered, answer a gateway's HTML 504 after passing the request on, or
//! answer 503 or 429 itself. The server's own counters say how many jobs were made.

mod commands;
mod library;
#[path = "../support/mod.rs"]
mod support;
mod terminal;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onejob::client::{Client, ClientError, Intent, JobSpec, Tries};
use onejob::clock::SystemClock;
use onejob::config::Config;
use onejob::domain::ProviderName;
use onejob::http::auth::Tokens;
use onejob::providers::keys::ProviderKeys;
use onejob::providers::{DemoBehavior, ProviderConfig};
use onejob::server::{self, Running};
use onejob::store::sqlite::SqliteStore;
use serde_json::Value;
use support::stand_in::{self, Gate, Reply, StandIn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Passes the request on, waits for the server to start answering, then hangs up: the work was done, the
    /// client never hears of it.
    DropAnswer,
    /// Answers 503 itself and closes.
    Unavailable,
    /// Answers 429 with `Retry-After: 1` itself and closes: not done, ask again in a second.
    RateLimited,
    /// A load balancer that gave up: passes the request on, and while the server answers, answers the client 504
    /// with an HTML page. The work was done; the client cannot know.
    GatewayTimeout,
    /// Passes everything through.
    Forward,
}

/// A proxy in front of `upstream`, following `script` connection by connection, then forwarding.
struct Proxy {
    url: String,
    /// The `Idempotency-Key` of each request it saw (`None` when there was none).
    keys: Arc<Mutex<Vec<Option<String>>>>,
}

impl Proxy {
    async fn spawn(upstream: std::net::SocketAddr, script: Vec<Act>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let keys = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let seen = keys.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let act = script.lock().unwrap().pop_front().unwrap_or(Act::Forward);
                let seen = seen.clone();
                tokio::spawn(async move { relay(client, upstream, act, seen).await });
            }
        });
        Self { url, keys }
    }

    fn keys(&self) -> Vec<Option<String>> {
        self.keys.lock().unwrap().clone()
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: std::net::SocketAddr,
    act: Act,
    seen: Arc<Mutex<Vec<Option<String>>>>,
) {
    let request = read_request(&mut client).await;
    let head = String::from_utf8_lossy(&request).to_lowercase();
    let key = head
        .lines()
        .find_map(|l| l.strip_prefix("idempotency-key:"))
        .map(|k| k.trim().to_owned());
    seen.lock().unwrap().push(key);
    match act {
        Act::Unavailable => {
            let body = r#"{"type":"about:blank","title":"Service Unavailable","status":503,"code":"unavailable","detail":"proxy says no"}"#;
            let answer = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
        }
        Act::RateLimited => {
            let body = r#"{"type":"about:blank","title":"Too Many Requests","status":429,"code":"rate_limited","detail":"slow down"}"#;
            let answer = format!(
                "HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
        }
        Act::DropAnswer => {
            let mut server = TcpStream::connect(upstream).await.unwrap();
            server.write_all(&request).await.unwrap();
            let mut first = [0u8; 1];
            let _ = server.read(&mut first).await;
            // Both ends close here: the server answered, the client gets nothing.
        }
        Act::GatewayTimeout => {
            let mut server = TcpStream::connect(upstream).await.unwrap();
            server.write_all(&request).await.unwrap();
            let mut first = [0u8; 1];
            let _ = server.read(&mut first).await;
            let body = "<html><body><h1>504 Gateway Time-out</h1></body></html>";
            let answer = format!(
                "HTTP/1.1 504 Gateway Time-out\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(answer.as_bytes()).await;
        }
        Act::Forward => {
            let mut server = TcpStream::connect(upstream).await.unwrap();
            server.write_all(&request).await.unwrap();
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
    }
}

/// One HTTP/1.1 request: its head and a `content-length` body.
async fn read_request(client: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return buf;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + length {
                return buf;
            }
        }
    }
}

/// The local server on port 0 with instant demo providers, on a fresh SQLite file.
struct App {
    running: Running,
    _dir: tempfile::TempDir,
}

impl App {
    async fn start() -> Self {
        Self::with(Vec::new()).await
    }

    /// The app with more providers than the demos.
    async fn with(providers: Vec<(&str, ProviderConfig)>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(&dir.path().join("onejob.db")).unwrap());
        let mut config = Config::default();
        for (name, behavior) in [
            ("demo", DemoBehavior::Answer),
            ("demo-fail", DemoBehavior::Fail),
        ] {
            config.providers.insert(
                ProviderName::parse(name).unwrap(),
                ProviderConfig::demo(behavior, 0),
            );
        }
        for (name, provider) in providers {
            config
                .providers
                .insert(ProviderName::parse(name).unwrap(), provider);
        }
        // The events' receiver stand-in is on loopback.
        config.allow_private_endpoints = true;
        let listener = server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let running = server::start(
            listener,
            &config,
            &ProviderKeys::default(),
            store,
            Arc::new(SystemClock),
            Tokens::dev(),
        )
        .unwrap();
        Self { running, _dir: dir }
    }

    fn url(&self) -> String {
        format!("http://{}", self.running.addr)
    }

    /// `onejob_creates_total{outcome="…"}` from the server's counters.
    fn creates(&self, outcome: &str) -> f64 {
        let metrics = self.running.engine.metrics.render().unwrap();
        support::metric(&metrics, "onejob_creates_total", &[("outcome", outcome)])
    }
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `onejob <args> --url <url>` with alice's dev token, the way a user runs it.
async fn onejob(url: &str, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(args)
        .args(["--url", url])
        .env("ONEJOB_TOKEN", "dev-token-alice")
        .output()
        .await
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

const CREATE: [&str; 6] = [
    "jobs",
    "create",
    "--contract",
    "summarize@1",
    "--input",
    r#"{"text": "The projector broke. The meeting moved."}"#,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_answer_is_retried_with_the_same_key_and_makes_one_job() {
    let app = App::start().await;
    let proxy = Proxy::spawn(app.running.addr, vec![Act::DropAnswer]).await;
    let run = onejob(&proxy.url, &CREATE).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("replayed (this key already made it) after 2 tries"),
        "{}",
        run.stderr
    );
    let keys = proxy.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys[0].is_some());
    assert_eq!(keys[0], keys[1], "the retry carries the same key");
    assert_eq!(
        (app.creates("created"), app.creates("replayed")),
        (1.0, 1.0)
    );
    // Each invocation is a new intent: a new key, a new job.
    let again = onejob(&proxy.url, &CREATE).await;
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert_ne!(proxy.keys()[2], keys[0]);
    assert_eq!(app.creates("created"), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_and_a_4xx_is_not() {
    let app = App::start().await;
    let proxy = Proxy::spawn(app.running.addr, vec![Act::Unavailable, Act::Unavailable]).await;
    let run = onejob(&proxy.url, &[&CREATE[..], &["--key", "fixed-key"]].concat()).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stderr.contains("created after 3 tries; key fixed-key"),
        "{}",
        run.stderr
    );
    assert_eq!(app.creates("created"), 1.0);

    let unknown = onejob(
        &proxy.url,
        &["jobs", "create", "--contract", "nope@1", "--input", "{}"],
    )
    .await;
    assert_eq!(unknown.code, Some(3), "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .lines()
            .any(|l| l.starts_with("onejob: unknown_contract (HTTP 422): ")),
        "{}",
        unknown.stderr
    );
    assert_eq!(proxy.keys().len(), 4, "the 422 was sent once");

    let conflict = onejob(
        &proxy.url,
        &[
            "jobs",
            "create",
            "--contract",
            "summarize@1",
            "--input",
            r#"{"text": "other"}"#,
            "--key",
            "fixed-key",
        ],
    )
    .await;
    assert_eq!(conflict.code, Some(3));
    assert!(
        conflict
            .stderr
            .contains("idempotency_key_reused (HTTP 409)"),
        "{}",
        conflict.stderr
    );
    assert_eq!(proxy.keys().len(), 5, "the 409 was sent once");
}

/// A load balancer's HTML 504 is not the server's refusal: the create is tried again with the same key, and finds
/// the job the first try made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_504_in_html_is_retried_with_the_same_key() {
    let app = App::start().await;
    let proxy = Proxy::spawn(app.running.addr, vec![Act::GatewayTimeout]).await;
    let run = onejob(&proxy.url, &CREATE).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(run.stderr.contains("replayed"), "{}", run.stderr);
    let keys = proxy.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "one key for the intent");
    assert_eq!(app.creates("created"), 1.0);
}

/// A create that gives up prints its key before it sends anything and in its error; a rerun with that key finds
/// the job the lost tries made, instead of making a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_gives_up_names_the_key_to_rerun_with() {
    let app = App::start().await;
    let proxy = Proxy::spawn(app.running.addr, vec![Act::DropAnswer, Act::DropAnswer]).await;
    let gave_up = onejob(&proxy.url, &[&CREATE[..], &["--retries", "1"]].concat()).await;
    assert_eq!(gave_up.code, Some(4), "{}", gave_up.stderr);
    let first = gave_up.stderr.lines().next().unwrap();
    let key = first.strip_prefix("key ").expect("the key comes first");
    assert!(
        gave_up
            .stderr
            .contains(&format!("the job may exist: rerun with --key {key}")),
        "{}",
        gave_up.stderr
    );
    let rerun = onejob(&proxy.url, &[&CREATE[..], &["--key", key]].concat()).await;
    assert_eq!(rerun.code, Some(0), "{}", rerun.stderr);
    assert!(rerun.stderr.contains("replayed"), "{}", rerun.stderr);
    assert_eq!(app.creates("created"), 1.0, "one job for the intent");
}

/// `tmux` on a private socket, for one test.
struct Tmux {
    socket: String,
    started: Instant,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("tmux is installed");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What the pane shows now, row by row.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "watch"])
    }

    /// A terminal is watched by looking at it: the next look comes 50 ms on, and none after the test's 30 s, so
    /// a view that never shows what is awaited fails instead of hanging.
    async fn next_look(&self) {
        assert!(
            self.started.elapsed() < Duration::from_secs(30),
            "{}",
            self.screen()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}
