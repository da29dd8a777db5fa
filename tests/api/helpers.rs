//! `TestApp`: the real router on a real socket (port 0), on its own SQLite file, with one method per endpoint.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use chrono::{TimeZone, Utc};
use onejob::clock::ManualClock;
use onejob::config::Config;
use onejob::domain::Owner;
use onejob::engine::Engine;
use onejob::http::auth::Tokens;
use onejob::providers::keys::ProviderKeys;
use onejob::server::{self, Running};
use onejob::store::JobStore;
use onejob::store::dynamodb::DynamoStore;
use onejob::store::sqlite::SqliteStore;
use reqwest::{Client, Response, header};
use serde_json::Value;

use crate::support::faulty::FaultyStore;

pub(crate) const ALICE: &str = "token-alice";
pub(crate) const BOB: &str = "token-bob";
/// The operators' token, for `/metrics`.
pub(crate) const OPERATOR: &str = "token-metrics";

/// Where the app keeps its jobs: SQLite by default, DynamoDB (a fresh table on the test server) when
/// `ONEJOB_TEST_STORE=dynamodb`. `scripts/test` runs these tests once on each.
#[derive(Clone)]
enum Backend {
    Sqlite(Arc<tempfile::TempDir>),
    Dynamo(aws_sdk_dynamodb::Client, String),
}

impl Backend {
    async fn new() -> Self {
        if std::env::var("ONEJOB_TEST_STORE").as_deref() != Ok("dynamodb") {
            return Self::Sqlite(Arc::new(tempfile::tempdir().unwrap()));
        }
        let config = crate::support::aws::sdk_config()
            .await
            .expect("ONEJOB_TEST_STORE=dynamodb needs the test server: run scripts/test");
        let client = aws_sdk_dynamodb::Client::new(&config);
        let table = crate::support::aws::unique_name("onejob-api");
        crate::support::aws::table_for_test(&client, &table).await;
        Self::Dynamo(client, table)
    }

    fn open(&self) -> Arc<dyn JobStore> {
        match self {
            Self::Sqlite(dir) => {
                Arc::new(SqliteStore::open(&dir.path().join("onejob.db")).unwrap())
            }
            Self::Dynamo(client, table) => Arc::new(DynamoStore::new(client.clone(), table)),
        }
    }

    /// Jobs and attempts in the store, counted by the backend's own means (a test may scan).
    async fn row_counts(&self) -> (i64, i64) {
        match self {
            Self::Sqlite(dir) => {
                let conn = rusqlite::Connection::open(dir.path().join("onejob.db")).unwrap();
                let count = |table: &str| {
                    conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
                        .unwrap()
                };
                (count("jobs"), count("attempts"))
            }
            Self::Dynamo(client, table) => {
                let items: Vec<_> = client
                    .scan()
                    .table_name(table)
                    .consistent_read(true)
                    .into_paginator()
                    .items()
                    .send()
                    .collect::<Result<Vec<_>, _>>()
                    .await
                    .unwrap();
                let attempts = items
                    .iter()
                    .map(|item| item["attempts"].as_m().unwrap().len() as i64)
                    .sum();
                (items.len() as i64, attempts)
            }
        }
    }
}

pub(crate) struct TestApp {
    pub addr: SocketAddr,
    pub client: Client,
    /// The server's clock: it stands still until a test moves it.
    pub clock: Arc<ManualClock>,
    pub config: Config,
    /// The server's store, through which a test makes store calls fail (none unless it plans some).
    pub faults: Arc<FaultyStore>,
    backend: Backend,
    running: Option<Running>,
}

/// The test config: the built-in contracts and demo providers, two owners, an operator.
pub(crate) fn config() -> Config {
    Config {
        tokens: BTreeMap::from([
            (ALICE.to_owned(), Owner::parse("alice").unwrap()),
            (BOB.to_owned(), Owner::parse("bob").unwrap()),
        ]),
        metrics_token: Some(OPERATOR.to_owned()),
        ..Config::default()
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.crash();
        }
    }
}

impl TestApp {
    pub(crate) async fn spawn() -> Self {
        Self::spawn_with(config()).await
    }

    pub(crate) async fn spawn_with(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new(
            Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap(),
        ));
        Self::spawn_on(Backend::new().await, config, clock).await
    }

    async fn spawn_on(backend: Backend, config: Config, clock: Arc<ManualClock>) -> Self {
        let faults = FaultyStore::new(backend.open(), Vec::new());
        let store = faults.clone();
        let tokens = Tokens::new(config.tokens.clone(), config.operator_tokens());
        let listener = server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let keys = ProviderKeys::default();
        let running =
            server::start(listener, &config, &keys, store, clock.clone(), tokens).unwrap();
        Self {
            addr: running.addr,
            client: Client::new(),
            clock,
            config,
            faults,
            backend,
            running: Some(running),
        }
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.running.as_ref().unwrap().engine
    }

    /// Stops the server gracefully and starts a new one on the same database file and clock.
    pub(crate) async fn restart(mut self) -> Self {
        self.running.take().unwrap().stop().await.unwrap();
        Self::spawn_on(
            self.backend.clone(),
            self.config.clone(),
            self.clock.clone(),
        )
        .await
    }

    /// Kills the server mid-flight (no graceful anything); `downtime` passes; a new one starts on the same file.
    pub(crate) async fn crash_and_restart(mut self, downtime: chrono::Duration) -> Self {
        self.running.take().unwrap().crash();
        self.clock.advance(downtime);
        Self::spawn_on(
            self.backend.clone(),
            self.config.clone(),
            self.clock.clone(),
        )
        .await
    }

    /// Long-polls the job until `ready` holds: each poll names the version last seen (`If-None-Match`) and the
    /// server's clock stands still, so a poll returns only when the job changed. The real-time bound only turns a
    /// hang into a failure.
    pub(crate) async fn wait_until(
        &self,
        token: &str,
        id: &str,
        ready: impl Fn(&Value) -> bool,
    ) -> Value {
        let last = std::sync::Mutex::new(Value::Null);
        let poll = async {
            let mut etag = String::new();
            loop {
                let response = self
                    .client
                    .get(self.url(&format!("/v1/jobs/{id}?wait=25")))
                    .bearer_auth(token)
                    .header("if-none-match", &etag)
                    .send()
                    .await
                    .unwrap();
                if response.status() == 304 {
                    continue;
                }
                etag = response.headers()["etag"].to_str().unwrap().to_owned();
                let job = json_with_status(response, 200).await;
                if ready(&job) {
                    return job;
                }
                *last.lock().unwrap() = job;
            }
        };
        match tokio::time::timeout(std::time::Duration::from_secs(20), poll).await {
            Ok(job) => job,
            Err(_) => panic!(
                "job {id} never got there; last seen: {}",
                last.lock().unwrap()
            ),
        }
    }

    pub(crate) async fn post(&self, token: &str, path: &str) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    }

    pub(crate) async fn post_json(&self, token: &str, path: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `POST /v1/jobs` with a JSON body.
    pub(crate) async fn create(&self, token: &str, key: &str, body: &Value) -> Response {
        self.client
            .post(self.url("/v1/jobs"))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// `POST /v1/jobs` exactly as given: raw headers and body bytes.
    pub(crate) async fn create_raw(
        &self,
        headers: &[(&str, &[u8])],
        body: impl Into<reqwest::Body>,
    ) -> Response {
        let mut request = self.client.post(self.url("/v1/jobs"));
        for (name, value) in headers {
            request = request.header(*name, header::HeaderValue::from_bytes(value).unwrap());
        }
        request.body(body).send().await.unwrap()
    }

    pub(crate) async fn get_job(&self, token: &str, id: &str) -> Response {
        self.get(token, &format!("/v1/jobs/{id}")).await
    }

    /// Starts a long poll (`?wait=25`) that names the version `etag` the client has; its answer comes once the
    /// job changed from it.
    pub(crate) fn long_poll(
        self: &Arc<Self>,
        token: &'static str,
        id: &str,
        etag: String,
    ) -> tokio::task::JoinHandle<Response> {
        let (app, url) = (self.clone(), self.url(&format!("/v1/jobs/{id}?wait=25")));
        tokio::spawn(async move {
            app.client
                .get(url)
                .bearer_auth(token)
                .header("if-none-match", etag)
                .send()
                .await
                .unwrap()
        })
    }

    pub(crate) async fn list_jobs(&self, token: &str, query: &str) -> Response {
        self.get(token, &format!("/v1/jobs{query}")).await
    }

    pub(crate) async fn cancel_job(&self, token: &str, id: &str) -> Response {
        self.post(token, &format!("/v1/jobs/{id}/cancel")).await
    }

    pub(crate) async fn get(&self, token: &str, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    }

    /// The counters, as the operators read them.
    pub(crate) async fn metrics(&self) -> String {
        let response = self.get(OPERATOR, "/metrics").await;
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    }

    /// The metrics once `ready` holds of them: what a worker records after its write commits may trail a read
    /// that already shows the write by a moment. The real-time bound only turns a hang into a failure.
    pub(crate) async fn metrics_when(&self, ready: impl Fn(&str) -> bool) -> String {
        let last = std::sync::Mutex::new(String::new());
        let poll = async {
            loop {
                let text = self.metrics().await;
                if ready(&text) {
                    return text;
                }
                *last.lock().unwrap() = text;
            }
        };
        match tokio::time::timeout(std::time::Duration::from_secs(20), poll).await {
            Ok(text) => text,
            Err(_) => panic!("the metrics never got there:\n{}", last.lock().unwrap()),
        }
    }

    /// The operator's `GET /v1/providers`, read until `ready` holds of provider `name`'s entry, which it answers
    /// (twenty seconds at most). What an answer told of its provider is written after the answer (invariant 16):
    /// a test that saw a job end waits here to see that too.
    pub(crate) async fn provider_when(&self, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let last = std::sync::Mutex::new(Value::Null);
        let poll = async {
            loop {
                let list = json_with_status(self.get(OPERATOR, "/v1/providers").await, 200).await;
                let entry = (list["providers"].as_array().unwrap().iter())
                    .find(|p| p["name"] == name)
                    .cloned()
                    .unwrap_or_default();
                if ready(&entry) {
                    return entry;
                }
                *last.lock().unwrap() = entry;
            }
        };
        match tokio::time::timeout(std::time::Duration::from_secs(20), poll).await {
            Ok(entry) => entry,
            Err(_) => panic!("provider {name} never got there: {}", last.lock().unwrap()),
        }
    }

    /// Jobs and attempts in the store: (jobs, attempts).
    pub(crate) async fn row_counts(&self) -> (i64, i64) {
        self.backend.row_counts().await
    }
}

pub(crate) fn summarize(text: &str) -> Value {
    serde_json::json!({"contract": "summarize@1", "input": {"text": text}})
}

/// The body of a response as JSON, after checking its status.
pub(crate) async fn json_with_status(response: Response, status: u16) -> Value {
    let actual = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(actual, status, "body: {body}");
    body
}

/// Checks a problem+json answer: status, content type and code.
pub(crate) async fn assert_problem(response: Response, status: u16, code: &str) -> Value {
    let content_type = response.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    let body = json_with_status(response, status).await;
    assert_eq!(content_type, "application/problem+json");
    assert_eq!(body["code"], code, "body: {body}");
    assert_eq!(body["status"], status);
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
    body
}

/// The parts of a job that no worker changes: what the intent was and when it was made.
pub(crate) fn intent(job: &Value) -> Value {
    let keep = [
        "id",
        "idempotency_key",
        "fingerprint",
        "contract",
        "input",
        "providers",
        "created_at",
    ];
    keep.iter()
        .map(|k| (k.to_string(), job[*k].clone()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}
