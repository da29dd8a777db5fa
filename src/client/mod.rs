//! The client half of "one job per intent", for any Rust program (no command line in it; `onejob jobs …` and
//! `onejob attempts …` are built on it).
//!
//! - An [`Intent`] owns its idempotency key for its whole life: made once (a UUIDv7), sent on every try, kept by
//!   the caller across restarts if it wants ([`Intent::resume`]).
//! - [`Client::submit`] retries connection errors, timeouts, 429 and 5xx (a gateway's HTML 504 too) with the same
//!   key, with exponential backoff and full jitter, never sooner than a `Retry-After`, a bounded number of times; a
//!   4xx other than 429 is the server's answer and is never retried. A give-up is an [`IntentError`] that carries
//!   the key: the job may exist, and submitting the same intent again finds it instead of making a second.
//! - [`Client::follow`] waits (long polls with the job's `ETag`) until the job is settled.
//!
//! Every request is retried: reads are safe to repeat, and every write goes under an `Idempotency-Key` (a create's
//! is its intent's; a manual attempt's and a cancel's, the caller's), so its repeat acts once.
//!
//! ```no_run
//! # async fn run() -> Result<(), onejob::client::IntentError> {
//! use onejob::client::{Client, Intent, JobSpec, Tries};
//!
//! let client = Client::new("http://127.0.0.1:8080", "dev-token-alice", Tries::default());
//! let intent = Intent::new(JobSpec {
//!     contract: "summarize@1".into(),
//!     input: serde_json::json!({"text": "The projector broke. The meeting moved."}),
//!     providers: None,
//! });
//! let created = client.submit(&intent).await?; // the same key on every try
//! let job = client.wait(&intent, &created, |_| {}).await?; // until nothing can change its outcome
//! println!("{} {}", job["status"], job["result"]);
//! # Ok(()) }
//! ```
//!
//! `examples/intent.rs` is the same as a program.

mod intent;
pub mod render;

pub use intent::{Intent, IntentError, JobSpec, new_key};

use std::time::Duration;

use reqwest::{Method, StatusCode, header};
use serde_json::{Value, json};

use crate::domain::JobStatus;

/// How hard the client tries.
#[derive(Debug, Clone, Copy)]
pub struct Tries {
    /// Tries after the first.
    pub retries: u32,
    /// The first backoff's ceiling; it doubles with each retry, up to `cap`.
    pub base: Duration,
    pub cap: Duration,
    /// One try's time limit.
    pub timeout: Duration,
}

impl Default for Tries {
    fn default() -> Self {
        Self {
            retries: 5,
            base: Duration::from_millis(200),
            cap: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
        }
    }
}

impl Tries {
    /// How long to wait before retry `n` (0-based): a random point in `0..=min(cap, base·2ⁿ)` ("full jitter"), but
    /// no less than the server's `Retry-After`, itself capped.
    fn backoff(&self, n: u32, retry_after: Option<Duration>) -> Duration {
        crate::retry::full_jitter(self.base, self.cap, n)
            .max(retry_after.unwrap_or_default().min(self.cap))
    }
}

/// Why a call did not give an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server refused the request with a problem document (RFC 9457).
    #[error("{code} (HTTP {status}): {detail}")]
    Refused {
        status: u16,
        code: String,
        detail: String,
        problem: Value,
    },
    /// No answer after every try: the server was unreachable, too slow, or kept failing (5xx, 429).
    #[error("gave up after {tries} tries: {last}")]
    GaveUp { tries: u32, last: String },
    /// An answer this client cannot read.
    #[error("unexpected answer: {0}")]
    Unexpected(String),
}

impl ClientError {
    /// The command line's exit status for this error: 3 refused, 4 gave up or unreadable.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Refused { .. } => 3,
            Self::GaveUp { .. } | Self::Unexpected(_) => 4,
        }
    }
}

/// What a create answered.
#[derive(Debug, Clone)]
pub struct Created {
    pub job: Value,
    /// The key had been used for this intent before (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// How many tries it took.
    pub tries: u32,
}

/// A long poll's answer.
#[derive(Debug, Clone)]
pub enum Poll {
    Changed { job: Value, etag: Option<String> },
    NotModified,
}

/// A client of one onejob server, as one owner (its bearer token).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    policy: Tries,
}

/// One answer: status, headers, body as JSON (`Null` when empty), and the number of tries it took.
struct Answer {
    status: StatusCode,
    headers: header::HeaderMap,
    body: Value,
    tries: u32,
}

impl Client {
    pub fn new(base: &str, token: &str, policy: Tries) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            policy,
        }
    }

    /// Creates the intent's job, retrying with its key until the server answers; a replay (the key made the job
    /// before) answers with that job.
    pub async fn submit(&self, intent: &Intent) -> Result<Created, IntentError> {
        let new = &intent.job;
        let mut body = json!({"contract": new.contract, "input": new.input});
        if let Some(providers) = &new.providers {
            body["providers"] = json!(providers);
        }
        let answer = self
            .send(
                Method::POST,
                "/v1/jobs",
                Some(&body),
                &[("idempotency-key", intent.key())],
                true,
            )
            .await
            .map_err(|source| intent.error(source))?;
        let replayed = answer
            .headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        Ok(Created {
            job: answer.body,
            replayed,
            tries: answer.tries,
        })
    }

    pub async fn get_job(&self, id: &str) -> Result<Value, ClientError> {
        let path = format!("/v1/jobs/{id}");
        Ok(self.send(Method::GET, &path, None, &[], true).await?.body)
    }

    /// The caller's job that `key` names, if any: found by the key alone, nothing resent.
    pub async fn find_job(&self, key: &str) -> Result<Option<Value>, ClientError> {
        let mut url = reqwest::Url::parse("http://onejob/v1/jobs").expect("a valid URL");
        url.query_pairs_mut().append_pair("idempotency_key", key);
        let path = format!("/v1/jobs?{}", url.query().unwrap_or_default());
        let mut page = self.send(Method::GET, &path, None, &[], true).await?.body;
        Ok(page["jobs"].as_array_mut().and_then(|jobs| jobs.pop()))
    }

    pub async fn list_jobs(
        &self,
        status: Option<JobStatus>,
        limit: u32,
    ) -> Result<Value, ClientError> {
        let mut path = format!("/v1/jobs?limit={limit}");
        if let Some(status) = status {
            path.push_str(&format!("&status={}", status.as_str()));
        }
        Ok(self.send(Method::GET, &path, None, &[], true).await?.body)
    }

    /// Cancels a job under `key`, retried with it until the server answers.
    pub async fn cancel_job(&self, id: &str, key: &str) -> Result<Value, ClientError> {
        let path = format!("/v1/jobs/{id}/cancel");
        let key = [("idempotency-key", key)];
        Ok(self.send(Method::POST, &path, None, &key, true).await?.body)
    }

    /// Queues a new attempt by hand under `key`, retried with it until the server answers: a repeat after a lost
    /// answer (or a second click) answers with the attempt the first queued.
    pub async fn add_attempt(
        &self,
        id: &str,
        provider: Option<&str>,
        key: &str,
    ) -> Result<Value, ClientError> {
        let path = format!("/v1/jobs/{id}/attempts");
        let body = provider.map(|p| json!({"provider": p}));
        let key = [("idempotency-key", key)];
        Ok(self
            .send(Method::POST, &path, body.as_ref(), &key, true)
            .await?
            .body)
    }

    /// Cancels attempt `number` under `key`, retried with it until the server answers.
    pub async fn cancel_attempt(
        &self,
        id: &str,
        number: u32,
        key: &str,
    ) -> Result<Value, ClientError> {
        let path = format!("/v1/jobs/{id}/attempts/{number}/cancel");
        let key = [("idempotency-key", key)];
        Ok(self.send(Method::POST, &path, None, &key, true).await?.body)
    }

    /// The caller's usage by day and contract, `from` to `to` (days, `YYYY-MM-DD`, both included).
    pub async fn usage(&self, from: &str, to: &str) -> Result<Value, ClientError> {
        let path = format!("/v1/usage?from={from}&to={to}");
        Ok(self.send(Method::GET, &path, None, &[], true).await?.body)
    }

    /// The job's completion events and where each delivery stands.
    pub async fn job_events(&self, id: &str) -> Result<Value, ClientError> {
        let path = format!("/v1/jobs/{id}/events");
        Ok(self.send(Method::GET, &path, None, &[], true).await?.body)
    }

    /// Registers `url` as the caller's endpoint (its secret kept if it had one): safe to repeat.
    pub async fn put_endpoint(&self, url: &str) -> Result<Value, ClientError> {
        let body = json!({ "url": url });
        Ok(self
            .send(Method::PUT, "/v1/endpoint", Some(&body), &[], true)
            .await?
            .body)
    }

    pub async fn endpoint(&self) -> Result<Value, ClientError> {
        Ok(self
            .send(Method::GET, "/v1/endpoint", None, &[], true)
            .await?
            .body)
    }

    /// Removes the caller's endpoint: safe to repeat.
    pub async fn remove_endpoint(&self) -> Result<(), ClientError> {
        self.send(Method::DELETE, "/v1/endpoint", None, &[], true)
            .await?;
        Ok(())
    }

    /// Waits up to `wait_s` seconds for the job to differ from the version `etag` names.
    pub async fn poll(
        &self,
        id: &str,
        etag: Option<String>,
        wait_s: u32,
    ) -> Result<Poll, ClientError> {
        let path = format!("/v1/jobs/{id}?wait={wait_s}");
        let headers: Vec<(&str, &str)> = etag
            .as_deref()
            .map(|e| ("if-none-match", e))
            .into_iter()
            .collect();
        let answer = self.send(Method::GET, &path, None, &headers, true).await?;
        if answer.status == StatusCode::NOT_MODIFIED {
            return Ok(Poll::NotModified);
        }
        let etag = answer
            .headers
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok(Poll::Changed {
            job: answer.body,
            etag,
        })
    }

    /// Waits until the intent's job is settled, calling `changed` with each new version; returns the last.
    pub async fn wait(
        &self,
        intent: &Intent,
        created: &Created,
        changed: impl FnMut(&Value),
    ) -> Result<Value, IntentError> {
        if is_settled(&created.job) {
            return Ok(created.job.clone());
        }
        let id = created.job["id"].as_str().unwrap_or_default();
        self.follow(id, None, changed)
            .await
            .map_err(|source| intent.error(source))
    }

    /// Follows the job until it is settled, calling `changed` with each version that differs from the one `etag`
    /// names (`None`: from the job as it is now); returns the last.
    pub async fn follow(
        &self,
        id: &str,
        mut etag: Option<String>,
        mut changed: impl FnMut(&Value),
    ) -> Result<Value, ClientError> {
        loop {
            match self.poll(id, etag.clone(), 20).await? {
                Poll::NotModified => {}
                Poll::Changed { job, etag: new } => {
                    changed(&job);
                    if is_settled(&job) {
                        return Ok(job);
                    }
                    etag = new;
                }
            }
        }
    }

    /// Sends one request, retrying (if `retry`) on connection errors, timeouts, 429 and 5xx.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
        retry: bool,
    ) -> Result<Answer, ClientError> {
        let tries = if retry { self.policy.retries + 1 } else { 1 };
        let mut last = String::new();
        let mut asked_to_wait = None;
        for n in 0..tries {
            if n > 0 {
                tokio::time::sleep(self.policy.backoff(n - 1, asked_to_wait.take())).await;
            }
            let mut request = self
                .http
                .request(method.clone(), format!("{}{path}", self.base))
                .bearer_auth(&self.token)
                .timeout(self.policy.timeout);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) => {
                    last = crate::telemetry::error_chain(&e);
                    continue;
                }
            };
            let status = response.status();
            let headers = response.headers().clone();
            let text = match response.text().await {
                Ok(text) => text,
                Err(e) => {
                    last = crate::telemetry::error_chain(&e);
                    continue;
                }
            };
            // A 429 or 5xx is tried again whatever its body says: a load balancer's 504 is an HTML page, and the
            // request behind it may or may not have landed (the key makes the repeat safe).
            if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                last = match serde_json::from_str::<Value>(&text) {
                    Ok(body) => refusal(status, &body).to_string(),
                    Err(_) => format!("HTTP {status}: {}", snippet(&text)),
                };
                asked_to_wait = retry_after(&headers);
                continue;
            }
            let body: Value = if text.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).map_err(|_| {
                    ClientError::Unexpected(format!("HTTP {status}: {}", snippet(&text)))
                })?
            };
            if status.is_success() || status == StatusCode::NOT_MODIFIED {
                return Ok(Answer {
                    status,
                    headers,
                    body,
                    tries: n + 1,
                });
            }
            return Err(refusal(status, &body));
        }
        Err(ClientError::GaveUp { tries, last })
    }
}

fn refusal(status: StatusCode, body: &Value) -> ClientError {
    ClientError::Refused {
        status: status.as_u16(),
        code: body["code"].as_str().unwrap_or("unknown").to_owned(),
        detail: body["detail"]
            .as_str()
            .or_else(|| body["title"].as_str())
            .unwrap_or_default()
            .to_owned(),
        problem: body.clone(),
    }
}

fn retry_after(headers: &header::HeaderMap) -> Option<Duration> {
    crate::retry::retry_after(
        headers.get(header::RETRY_AFTER)?.to_str().ok()?,
        std::time::SystemTime::now(),
    )
}

fn snippet(text: &str) -> String {
    text.chars().take(200).collect()
}

/// Nothing can change the job's outcome any more without someone asking: the server's `settled`. (A failed job
/// whose cancelled attempt may still answer is not settled yet.)
pub fn is_settled(job: &Value) -> bool {
    job["settled"].as_bool().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_full_jitter_up_to_the_cap_and_honours_retry_after() {
        let policy = Tries::default();
        for n in 0..10 {
            let ceiling = (policy.base * 2u32.pow(n)).min(policy.cap);
            for _ in 0..50 {
                assert!(policy.backoff(n, None) <= ceiling);
            }
        }
        let waits: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| policy.backoff(3, None)).collect();
        assert!(waits.len() > 10, "jittered: {waits:?}");
        assert!(policy.backoff(0, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
        assert_eq!(
            policy.backoff(0, Some(Duration::from_secs(600))),
            policy.cap
        );
    }

    #[test]
    fn keys_are_uuid_v7() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.get_version_num(), 7);
    }
}
