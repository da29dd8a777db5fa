//! `onejob jobs …` / `onejob attempts …` run as a user would (the real binary), and the library's `Intent` and
//! `Client` as a Rust program uses them, against the real local server behind a scripted TCP proxy on loopback that
//! can drop a connection after the server answered, answer a gateway's HTML 504 after passing the request on, or
//! answer 503 or 429 itself. The server's own counters say how many jobs were made.

mod support;

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

/// `onejob endpoint set` registers where completion events go and prints the secret; `onejob jobs events` shows
/// the job's event delivered; `onejob endpoint remove` removes it, and `show` then says there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_an_endpoint_and_shows_the_event_a_job_made() {
    let app = App::start().await;
    let url = app.url();
    let receiver = StandIn::answering(serde_json::json!({})).await;
    let hook = format!("{}/chat/completions", receiver.base_url());
    let set = onejob(&url, &["endpoint", "set", &hook]).await;
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    let secret = set
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("secret  "))
        .unwrap_or_else(|| panic!("no secret in {}", set.stdout))
        .to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let shown = onejob(&url, &["endpoint", "show", "--json"]).await;
    let shown: Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(
        (&shown["url"], &shown["secret"]),
        (&Value::from(hook), &Value::from(secret))
    );

    let done = onejob(&url, &[&CREATE[..], &["--wait", "--json"]].concat()).await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    let job: Value = serde_json::from_str(&done.stdout).unwrap();
    let id = job["id"].as_str().unwrap();
    receiver.received(1).await;
    // The deliverer writes what the try came to just after the receiver answered.
    let started = Instant::now();
    let events = loop {
        let events = onejob(&url, &["jobs", "events", id]).await;
        assert_eq!(events.code, Some(0), "{}", events.stderr);
        if events.stdout.contains("delivered") || started.elapsed() > Duration::from_secs(20) {
            break events.stdout;
        }
    };
    let line = events.lines().next().unwrap();
    assert!(
        line.starts_with("evt_") && line.contains("succeeded") && line.contains("(1 tries)"),
        "{events}"
    );
    assert_eq!(events.lines().count(), 1, "{events}");

    let removed = onejob(&url, &["endpoint", "remove"]).await;
    assert_eq!(removed.code, Some(0), "{}", removed.stderr);
    let none = onejob(&url, &["endpoint", "show"]).await;
    assert_eq!(none.code, Some(3), "{}", none.stdout);
    assert!(
        none.stderr.contains("endpoint_not_found"),
        "{}",
        none.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_say_what_happened() {
    let app = App::start().await;
    let url = app.url();
    let done = onejob(&url, &[&CREATE[..], &["--wait"]].concat()).await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(done.stdout.contains("SUCCEEDED"), "{}", done.stdout);
    assert!(done.stdout.contains("* winner"), "{}", done.stdout);
    assert!(
        done.stdout
            .contains(r#"result: {"summary":"The projector broke."}"#),
        "{}",
        done.stdout
    );

    let failing = [
        &CREATE[..],
        &["--providers", "demo-fail", "--wait", "--json"],
    ]
    .concat();
    let failed = onejob(&url, &failing).await;
    assert_eq!(failed.code, Some(1), "{}", failed.stderr);
    let job: Value = serde_json::from_str(&failed.stdout).unwrap();
    assert_eq!(job["error"]["code"], "providers_exhausted");

    let id = job["id"].as_str().unwrap();
    let retried = onejob(&url, &["attempts", "retry", id, "--provider", "demo"]).await;
    assert_eq!(retried.code, Some(0), "{}", retried.stderr);
    let watched = onejob(&url, &["jobs", "watch", id]).await;
    assert_eq!(watched.code, Some(0), "{}", watched.stderr);
    assert!(watched.stdout.contains("#2 demo"), "{}", watched.stdout);
    let cancel = onejob(&url, &["jobs", "cancel", id]).await;
    assert_eq!(cancel.code, Some(3), "a succeeded job cannot be cancelled");
    assert!(cancel.stderr.contains("job_finished"), "{}", cancel.stderr);

    let listed = onejob(&url, &["jobs", "list", "--json"]).await;
    let page: Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2);

    let bad_input = onejob(
        &url,
        &[
            "jobs",
            "create",
            "--contract",
            "summarize@1",
            "--input",
            "{not json",
        ],
    )
    .await;
    assert_eq!(bad_input.code, Some(2));
    assert!(
        bad_input.stderr.contains("--input is not JSON"),
        "{}",
        bad_input.stderr
    );

    let missing = onejob(
        &url,
        &["jobs", "get", "job_00000000000000000000000000000000"],
    )
    .await;
    assert_eq!(missing.code, Some(3));
    assert!(
        missing.stderr.contains("job_not_found (HTTP 404)"),
        "{}",
        missing.stderr
    );

    let nobody = support::stand_in::refusing().await;
    let nobody = nobody.trim_end_matches("/v1");
    let unreachable = onejob(nobody, &[&CREATE[..], &["--retries", "1"]].concat()).await;
    assert_eq!(unreachable.code, Some(4), "{}", unreachable.stderr);
    assert!(
        unreachable.stderr.contains("gave up after 2 tries"),
        "{}",
        unreachable.stderr
    );

    let bad_status = tokio::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["jobs", "list", "--status", "done", "--url", &url])
        .output()
        .await
        .unwrap();
    assert_eq!(bad_status.status.code(), Some(2));
    let said = String::from_utf8_lossy(&bad_status.stderr);
    assert!(
        said.contains("succeeded") && said.contains("cancelled"),
        "{said}"
    );

    let no_token = tokio::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["jobs", "list", "--url", &url])
        .env_remove("ONEJOB_TOKEN")
        .output()
        .await
        .unwrap();
    assert_eq!(no_token.status.code(), Some(2));
}

fn summarize_intent() -> Intent {
    Intent::new(JobSpec {
        contract: "summarize@1".into(),
        input: serde_json::json!({"text": "The projector broke. The meeting moved."}),
        providers: None,
    })
}

/// The library against every way an answer goes missing, one after the other: the first answer dropped after the
/// server made the job, a gateway's HTML 504, a 429 asking for a second. One key on every try, one job, the last
/// try a replay that came no sooner than the `Retry-After` (the backoff itself is at most a few milliseconds here),
/// and the wait ends with the job settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_keeps_its_key_through_a_lost_answer_a_gateway_504_and_a_429() {
    let app = App::start().await;
    let proxy = Proxy::spawn(
        app.running.addr,
        vec![Act::DropAnswer, Act::GatewayTimeout, Act::RateLimited],
    )
    .await;
    let policy = Tries {
        base: Duration::from_millis(1),
        ..Tries::default()
    };
    let client = Client::new(&proxy.url, "dev-token-alice", policy);
    let intent = summarize_intent();
    let started = Instant::now();
    let created = client.submit(&intent).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured: {:?}",
        started.elapsed()
    );
    assert_eq!(created.tries, 4);
    assert!(created.replayed, "the first try made the job");
    assert_eq!(proxy.keys(), vec![Some(intent.key().to_owned()); 4]);
    assert_eq!(app.creates("created"), 1.0);
    let job = client.wait(&intent, &created, |_| {}).await.unwrap();
    assert_eq!(job["status"], "succeeded");
    assert_eq!(job["id"], created.job["id"]);
}

/// A give-up hands back the intent's key; the same intent submitted again (here resumed from the key alone, as a
/// program that kept it would) finds the job the lost tries made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intent_that_gives_up_returns_its_key_and_resuming_it_finds_the_job() {
    let app = App::start().await;
    let proxy = Proxy::spawn(app.running.addr, vec![Act::DropAnswer, Act::DropAnswer]).await;
    let policy = Tries {
        retries: 1,
        base: Duration::from_millis(1),
        ..Tries::default()
    };
    let client = Client::new(&proxy.url, "dev-token-alice", policy);
    let intent = summarize_intent();
    let gave_up = client.submit(&intent).await.unwrap_err();
    assert_eq!(gave_up.key, intent.key());
    assert!(gave_up.may_exist(), "{gave_up}");
    assert!(matches!(
        gave_up.source,
        ClientError::GaveUp { tries: 2, .. }
    ));
    let resumed = Intent::resume(gave_up.key, intent.job().clone());
    let created = client.submit(&resumed).await.unwrap();
    assert!(created.replayed);
    assert_eq!(app.creates("created"), 1.0, "one job for the intent");
    assert_eq!(proxy.keys().len(), 3);
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

/// `onejob jobs watch` in a real terminal 80 columns wide, on a job whose `unknown` attempt's line (with its
/// advice) is wider than that: every screen shows the job's header at most once — exactly once from the first
/// frame on — while the view redraws itself, after the window shrinks to 60 columns, and when the job ends (the
/// provider, held until then, answers late and wins).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_holds_in_a_terminal_narrower_than_its_lines() {
    let gate = Gate::new();
    let provider = StandIn::spawn(vec![Reply::Held(gate.clone())], Reply::Status(500, "")).await;
    // `unknown` after its 1 s timeout; a late answer still counts for a minute.
    let slow = stand_in::openai(provider.base_url()).with_timings(stand_in::TIMEOUT_MS, 60_000);
    let app = App::with(vec![("slow", slow)]).await;
    let client = Client::new(&app.url(), "dev-token-alice", Tries::default());
    let intent = Intent::new(JobSpec {
        providers: Some(vec!["slow".into()]),
        ..summarize_intent().job().clone()
    });
    let created = client.submit(&intent).await.unwrap();
    let id = created.job["id"].as_str().unwrap().to_owned();
    let tmux = Tmux {
        socket: format!("onejob-test-{}", std::process::id()),
        started: Instant::now(),
    };
    // After the view, its exit status, and the pane stays open (waiting for a line) so its screen can be read.
    let command = format!(
        "ONEJOB_TOKEN=dev-token-alice {} jobs watch {id} --url {}; echo \"exit $?\"; read line",
        env!("CARGO_BIN_EXE_onejob"),
        app.url()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-x",
        "80",
        "-y",
        "24",
        "-s",
        "watch",
        &command,
    ]);
    let headers = |screen: &str| screen.lines().filter(|l| l.starts_with(&id)).count();
    let spinner = |screen: &str| {
        screen
            .lines()
            .find(|l| l.contains(" #1 slow"))
            .and_then(|l| l.chars().next())
    };

    // Frames go by while the attempt is `unknown`: the spinner turns at least three times.
    let mut turns = std::collections::BTreeSet::new();
    let mut drawn = false;
    while turns.len() < 3 {
        let screen = tmux.screen();
        drawn |= headers(&screen) == 1;
        let limit = usize::from(drawn);
        assert!(
            headers(&screen) <= 1 && headers(&screen) >= limit,
            "{screen}"
        );
        assert!(screen.lines().all(|l| l.chars().count() <= 80), "{screen}");
        if screen.contains("unknown") {
            assert!(screen.contains('…'), "the wide line is cut: {screen}");
            turns.extend(spinner(&screen));
        }
        tmux.next_look().await;
    }

    // A narrower window: the view follows it.
    tmux.run(&["resize-window", "-t", "watch", "-x", "60"]);
    let mut narrow = 0;
    while narrow < 3 {
        let screen = tmux.screen();
        assert!(headers(&screen) <= 1, "{screen}");
        if screen.lines().all(|l| l.chars().count() < 60) && headers(&screen) == 1 {
            narrow += 1;
        }
        tmux.next_look().await;
    }

    // The late answer wins; the job ends and the view with it: its last frame.
    gate.open(serde_json::json!({"summary": "The projector broke."}));
    let screen = loop {
        let screen = tmux.screen();
        assert!(headers(&screen) <= 1, "{screen}");
        if screen.contains("exit ") {
            break screen;
        }
        tmux.next_look().await;
    };
    assert_eq!(headers(&screen), 1, "{screen}");
    assert!(screen.contains("SUCCEEDED"), "{screen}");
    assert!(screen.contains("* winner"), "{screen}");
    assert!(screen.contains("exit 0"), "the job succeeded: {screen}");
}

/// `onejob completions SHELL` and `onejob man DIR` come from the same clap definition as the commands: the
/// scripts complete the subcommands and their flags, and every subcommand has its page.
#[test]
fn completions_and_manual_pages_cover_every_command() {
    let onejob = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(args)
            .output()
            .unwrap()
    };
    let bash = onejob(&["completions", "bash"]);
    assert!(bash.status.success());
    let bash = String::from_utf8(bash.stdout).unwrap();
    for word in ["watch", "attempts", "--contract", "--wait", "--key"] {
        assert!(bash.contains(word), "bash completes {word}");
    }
    let zsh = String::from_utf8(onejob(&["completions", "zsh"]).stdout).unwrap();
    assert!(zsh.starts_with("#compdef onejob"), "{zsh}");
    assert_eq!(onejob(&["completions", "tcsh"]).status.code(), Some(2));

    let dir = tempfile::tempdir().unwrap();
    let man = onejob(&["man", dir.path().to_str().unwrap()]);
    assert!(
        man.status.success(),
        "{}",
        String::from_utf8_lossy(&man.stderr)
    );
    for page in [
        "onejob.1",
        "onejob-serve.1",
        "onejob-jobs-watch.1",
        "onejob-attempts-retry.1",
    ] {
        assert!(dir.path().join(page).exists(), "{page}");
    }
    let create = std::fs::read_to_string(dir.path().join("onejob-jobs-create.1")).unwrap();
    assert!(create.starts_with(".ie"), "roff");
    assert!(create.contains(r"\-\-contract"), "{create}");
    assert!(create.contains("idempotency key"), "{create}");
}
