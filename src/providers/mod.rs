//! Providers: where attempts run. One trait, [`Provider`], and its clients: [`demo`] (built in), [`openai`] (any
//! OpenAI-compatible endpoint), [`anthropic`] (the Messages API) and [`bedrock`] (Amazon Bedrock's Converse API). A client only reports what happened on the
//! wire; [`checks`] holds the output to the contract, and the worker decides the attempt's state.

pub mod anthropic;
pub mod bedrock;
pub mod checks;
pub mod demo;
pub mod keys;
pub mod openai;
pub mod qualify;
pub mod settings;
pub mod tokens;

pub use settings::{
    DemoBehavior, DemoSettings, ProviderConfig, ProviderEndpoint, ProviderKind, ProviderLimits,
    TokenLimitField,
};

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::clock::Clock;
use crate::domain::{CallReport, ContractRef, ErrorInfo, Fingerprint, ProviderName};
use keys::{KeySource, ProviderKeys, Secret};

/// The system prompt of every HTTP provider: the contract's prompt says what to do, this says how to answer.
pub const SYSTEM_PROMPT: &str =
    "Answer with one JSON object that matches the given JSON Schema, and nothing else.";

/// Everything a provider needs for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderRequest {
    /// `<job id>:<attempt number>`, sent as `Idempotency-Key` to providers that honour it.
    pub idempotency_key: String,
    pub contract: ContractRef,
    /// The contract's prompt, rendered with the input.
    pub prompt: String,
    pub input: Value,
    pub output_schema: Value,
    pub temperature: f64,
    pub max_output_tokens: u32,
}

/// What came back, in the three classes that decide an attempt's state (invariant 5, `docs/design.md`).
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderOutcome {
    /// An answer, as JSON; the checks still hold it to the contract.
    Answered(Value),
    /// A definite answer that is not a result: an error response, an unusable answer, or a connection refused
    /// before anything was sent. The attempt becomes `failed`.
    Failed(ErrorInfo),
    /// The request may have reached the provider and no answer will come (connection lost after sending): the
    /// work may have been done. The attempt becomes `unknown`, never `failed`.
    Lost(ErrorInfo),
}

/// An outcome and what the provider reported beside it (model, usage, `Retry-After`).
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub outcome: ProviderOutcome,
    pub report: CallReport,
    /// Whether the reply tells of the provider failing, rather than of the request (invariant 15): what its shared
    /// breaker counts. A 5xx, a 429, a key refused (401, 403), a refused or lost connection, a gateway's time-out,
    /// a body that is not what its API sends. Not a refusal the input caused (another 4xx, `model_refused`) nor an
    /// answer that broke the contract: an owner's inputs must not close a provider to every other owner.
    pub provider_failing: bool,
    /// Whether the provider refused the key (401, 403): the secret is read again before the next call.
    pub key_refused: bool,
}

/// The failure codes that tell of the provider's own state, whatever was asked of it.
const PROVIDER_FAILURES: [&str; 6] = [
    "connection_failed",
    "connection_lost",
    "gateway_timeout",
    "provider_error",
    "provider_unavailable",
    "rate_limited",
];

impl Reply {
    /// `outcome` with `report`; whether it tells of the provider failing is read off its code (a lost answer
    /// always does).
    pub fn new(outcome: ProviderOutcome, report: CallReport) -> Self {
        let provider_failing = match &outcome {
            ProviderOutcome::Answered(_) => false,
            ProviderOutcome::Lost(_) => true,
            ProviderOutcome::Failed(error) => {
                PROVIDER_FAILURES.contains(&error.code.as_str()) || error.code == "bad_response"
            }
        };
        Self {
            outcome,
            report,
            provider_failing,
            key_refused: false,
        }
    }

    pub fn failed(code: &str, message: impl Into<String>) -> Self {
        failed(code, message).into()
    }

    /// The reply with `key` scrubbed from everything it keeps (the answer, error messages, the model id): a
    /// provider may echo the key it was sent, and what it says ends up in results, in the messages of the checks
    /// that quote it, in the store and in the logs.
    fn scrubbed(mut self, key: &Secret) -> Self {
        match &mut self.outcome {
            ProviderOutcome::Answered(answer) => key.scrub_value(answer),
            ProviderOutcome::Failed(error) | ProviderOutcome::Lost(error) => {
                error.message = key.scrub(&error.message);
            }
        }
        if let Some(model) = &mut self.report.model {
            *model = key.scrub(model);
        }
        self
    }
}

impl From<ProviderOutcome> for Reply {
    fn from(outcome: ProviderOutcome) -> Self {
        Self::new(outcome, CallReport::default())
    }
}

#[async_trait]
pub trait Provider: Send + Sync + Debug {
    /// One call. It may take forever: the caller bounds it with the provider's timeout.
    async fn call(&self, request: &ProviderRequest) -> Reply;
}

/// A configured provider: its settings, its client, and its fingerprint.
#[derive(Debug, Clone)]
pub struct ConfiguredProvider {
    pub config: ProviderConfig,
    pub client: Arc<dyn Provider>,
    /// What a qualification is tied to: kind, base URL, model, context window, timeout (a demo's behaviour, delay).
    pub fingerprint: Fingerprint,
}

/// The fingerprint of what a provider is, as far as keeping a contract goes: kind, base URL (a Bedrock provider's
/// region), model, the two limits a qualification checks against (context window, timeout), and how its requests
/// are shaped where the config says. A demo provider's behaviour and delay are its "model".
pub fn fingerprint(config: &ProviderConfig) -> Fingerprint {
    let endpoint = config.endpoint();
    let mut identity = json!({
        "kind": config.kind(),
        "base_url": endpoint.map(|e| &e.base_url),
        "model": config.model(),
        "context_window": config.context_window(),
        "timeout_ms": config.timeout_ms(),
    });
    match &config.kind {
        ProviderKind::Demo(demo) => {
            identity["behavior"] = json!(demo.behavior.as_str());
            identity["delay_ms"] = json!(demo.delay_ms);
        }
        ProviderKind::Bedrock(bedrock) => {
            identity["region"] = json!(bedrock.region);
            identity["base_url"] = json!(bedrock.endpoint_url);
            identity["request"] = json!({
                "send_temperature": bedrock.send_temperature,
                "additional_model_request_fields": bedrock.additional_model_request_fields,
            });
        }
        ProviderKind::Openai(_) | ProviderKind::Anthropic(_) => {}
    }
    if let Some(shape) = endpoint.and_then(ProviderEndpoint::request_shape) {
        identity["request"] = shape;
    }
    Fingerprint::of_value(&identity)
}

/// A Bedrock provider was configured where the process has no AWS settings to sign its calls with.
#[derive(Debug, thiserror::Error)]
#[error(
    "provider {0} is a Bedrock provider, and this process has no AWS settings to sign its calls with"
)]
pub struct NoAwsSettings(pub ProviderName);

/// Every configured provider, by name.
#[derive(Debug, Default)]
pub struct Providers(BTreeMap<ProviderName, ConfiguredProvider>);

impl Providers {
    /// Builds a client for each configured provider, its key from `keys` (else the environment), a Bedrock
    /// provider's AWS settings from them too; HTTP clients share one connection pool. Refused when a Bedrock
    /// provider is configured and `keys` carry no AWS settings.
    pub fn from_config(
        configs: &BTreeMap<ProviderName, ProviderConfig>,
        keys: &ProviderKeys,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, NoAwsSettings> {
        let http = reqwest::Client::new();
        Ok(Self(
            configs
                .iter()
                .map(|(name, config)| {
                    let client: Arc<dyn Provider> = match &config.kind {
                        ProviderKind::Demo(demo) => {
                            Arc::new(demo::DemoProvider::new(demo, clock.clone()))
                        }
                        ProviderKind::Openai(endpoint) => Arc::new(openai::OpenAiProvider::new(
                            HttpEndpoint::new(endpoint, "chat/completions", true, keys, &http),
                        )),
                        ProviderKind::Anthropic(endpoint) => {
                            Arc::new(anthropic::AnthropicProvider::new(HttpEndpoint::new(
                                endpoint, "messages", false, keys, &http,
                            )))
                        }
                        ProviderKind::Bedrock(bedrock) => {
                            let aws = keys.aws().ok_or_else(|| NoAwsSettings(name.clone()))?;
                            Arc::new(bedrock::BedrockProvider::new(bedrock, aws))
                        }
                    };
                    let configured = ConfiguredProvider {
                        config: config.clone(),
                        client,
                        fingerprint: fingerprint(config),
                    };
                    Ok((name.clone(), configured))
                })
                .collect::<Result<_, _>>()?,
        ))
    }

    /// Each configured provider's settings and fingerprint, with no client: for a process that calls no provider
    /// (the api function), whose package then carries no client's code and which needs no key. A call answers
    /// `not_called`.
    pub fn described(configs: &BTreeMap<ProviderName, ProviderConfig>) -> Self {
        let client: Arc<dyn Provider> = Arc::new(NotCalled);
        Self(
            configs
                .iter()
                .map(|(name, config)| {
                    let configured = ConfiguredProvider {
                        config: config.clone(),
                        client: client.clone(),
                        fingerprint: fingerprint(config),
                    };
                    (name.clone(), configured)
                })
                .collect(),
        )
    }

    pub fn get(&self, name: &ProviderName) -> Option<&ConfiguredProvider> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ProviderName, &ConfiguredProvider)> {
        self.0.iter()
    }

    pub fn contains(&self, name: &ProviderName) -> bool {
        self.0.contains_key(name)
    }

    /// The longest a worker may listen to one attempt: its timeout plus its late-result window.
    pub fn longest_listen(&self) -> chrono::Duration {
        self.0
            .values()
            .map(|p| p.config.timeout() + p.config.late_result())
            .max()
            .unwrap_or_default()
    }
}

/// The client of a process that calls no provider ([`Providers::described`]).
#[derive(Debug)]
struct NotCalled;

#[async_trait]
impl Provider for NotCalled {
    async fn call(&self, _: &ProviderRequest) -> Reply {
        Reply::failed("not_called", "this process calls no provider")
    }
}

/// Where an HTTP provider's calls go: the client (one connection pool for all), the full URL, the model, and the
/// key. Shared by the OpenAI and Anthropic clients, which differ only in what they send and read.
#[derive(Debug)]
pub struct HttpEndpoint {
    pub http: reqwest::Client,
    pub url: reqwest::Url,
    pub model: String,
    pub key: KeySource,
    /// The header the key goes in as it is, if the config names one (else the kind's own).
    pub key_header: Option<String>,
    headers: BTreeMap<String, String>,
    token_limit_field: TokenLimitField,
    sends_temperature: bool,
    reasoning_effort: Option<String>,
    body: serde_json::Map<String, Value>,
}

impl HttpEndpoint {
    /// The endpoint at `{base_url}/{path}` (the config's path, else the kind's `path`) with the config's query,
    /// its key from `keys` (else the environment), its requests shaped as the config says for a provider of the
    /// kind `openai` says.
    pub fn new(
        endpoint: &ProviderEndpoint,
        path: &str,
        openai: bool,
        keys: &ProviderKeys,
        http: &reqwest::Client,
    ) -> Self {
        let path = endpoint
            .path
            .as_deref()
            .unwrap_or(path)
            .trim_start_matches('/');
        let root = endpoint.base_url.trim_end_matches('/');
        // Checked when the config was read (`ProviderConfig::check`).
        let mut url = reqwest::Url::parse(&format!("{root}/{path}")).expect("a checked base_url");
        if !endpoint.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&endpoint.query);
        }
        Self {
            http: http.clone(),
            url,
            model: endpoint.model.clone(),
            key: keys.source(endpoint.api_key_env.as_deref()),
            key_header: endpoint.api_key_header.clone(),
            headers: endpoint.headers.clone(),
            token_limit_field: endpoint.token_limit_field(openai),
            sends_temperature: endpoint.sends_temperature(openai),
            reasoning_effort: endpoint.reasoning_effort.clone(),
            body: endpoint.body.clone(),
        }
    }

    /// With `name: value` among the headers every call carries, unless the config sets that header.
    pub fn with_default_header(mut self, name: &str, value: &str) -> Self {
        let set = self.headers.keys().any(|h| h.eq_ignore_ascii_case(name));
        if !set {
            self.headers.insert(name.to_owned(), value.to_owned());
        }
        self
    }

    /// A request body: `body` (the kind's own fields, an object), with the output budget under the field the
    /// server takes, the temperature if it is sent, the reasoning effort, and the config's extra fields.
    pub fn body(&self, mut body: Value, request: &ProviderRequest) -> Value {
        body[self.token_limit_field.as_str()] = json!(request.max_output_tokens);
        if self.sends_temperature {
            body["temperature"] = json!(request.temperature);
        }
        if let Some(effort) = &self.reasoning_effort {
            body["reasoning_effort"] = json!(effort);
        }
        for (field, value) in &self.body {
            body[field] = value.clone();
        }
        body
    }

    /// One call: a JSON `POST` of `body`, carrying the attempt's idempotency key, the config's headers and the
    /// key (in the config's key header if it names one, else as `kind_key` puts it), answered as `read` reads a
    /// 2xx body. A key refused has the secret read again before the next call.
    pub async fn call(
        &self,
        idempotency_key: &str,
        body: &Value,
        kind_key: impl FnOnce(reqwest::RequestBuilder, &str) -> reqwest::RequestBuilder,
        read: fn(&str) -> Reply,
    ) -> Reply {
        let mut call = self
            .http
            .post(self.url.clone())
            .header("Idempotency-Key", idempotency_key)
            .json(body);
        for (name, value) in &self.headers {
            call = call.header(name, value);
        }
        let key = self.key.for_call().await;
        if let Some(secret) = &key {
            call = match &self.key_header {
                Some(header) => call.header(header, secret.expose()),
                None => kind_key(call, secret.expose()),
            };
        }
        let reply = answer(call, key.as_ref(), read).await;
        if reply.key_refused {
            self.key.refused();
        }
        reply
    }
}

/// Sends one HTTP call and reads the body of a 2xx answer. Anything else is already the reply:
/// - refused or unreachable: nothing was sent, so nothing was done → failed (`connection_failed`);
/// - lost after sending, or while reading the answer → lost (`connection_lost`): the attempt becomes unknown;
/// - a gateway's timeout (408, 502, 504, 524) → lost (`gateway_timeout`): a proxy or load balancer gave up waiting,
///   the provider behind it may still run and bill the call, so the attempt becomes unknown (invariant 5);
/// - another error status, said by the provider's own API → failed: `rate_limited` (429), `provider_unavailable`
///   (503 with `Retry-After`), `provider_error` (500, a 503 without `Retry-After`, the other 5xx),
///   `provider_refused` (other 4xx), with `Retry-After` kept in the report. The first two and
///   `connection_failed` say the work was not done: the engine may queue a retry on the same provider, as a new
///   attempt, never a hidden loop.
pub(crate) async fn exchange(call: reqwest::RequestBuilder) -> Result<String, Reply> {
    let response = match call.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Err(Reply::failed("connection_failed", e.to_string())),
        Err(e) => {
            return Err(
                ProviderOutcome::Lost(ErrorInfo::new("connection_lost", e.to_string())).into(),
            );
        }
    };
    let status = response.status();
    let retry_after_s = retry_after_s(response.headers().get(reqwest::header::RETRY_AFTER));
    let text = response.text().await.map_err(|e| {
        Reply::from(ProviderOutcome::Lost(ErrorInfo::new(
            "connection_lost",
            e.to_string(),
        )))
    })?;
    if status.is_success() {
        return Ok(text);
    }
    if is_gateway_timeout(status) {
        return Err(ProviderOutcome::Lost(ErrorInfo::new(
            "gateway_timeout",
            format!("HTTP {status} from a gateway: {}", snippet(&text)),
        ))
        .into());
    }
    let code = if status == StatusCode::TOO_MANY_REQUESTS {
        "rate_limited"
    } else if status == StatusCode::SERVICE_UNAVAILABLE && retry_after_s.is_some() {
        // Unavailable, and saying when to come back: the request was not taken.
        "provider_unavailable"
    } else if status.is_server_error() {
        "provider_error"
    } else {
        "provider_refused"
    };
    Err(refused(
        code,
        status.as_u16(),
        &snippet(&text),
        retry_after_s,
    ))
}

/// A `Retry-After` header's wait in whole seconds, rounded up: never sooner than asked.
pub(crate) fn retry_after_s(header: Option<&reqwest::header::HeaderValue>) -> Option<u64> {
    header
        .and_then(|v| v.to_str().ok())
        .and_then(|v| crate::retry::retry_after(v, std::time::SystemTime::now()))
        .map(|wait| wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
}

/// A definite failure the provider answered with `status` and `text`: the code, the `Retry-After` it asked for
/// (kept in the report and said in the message), and whether it refused the key.
pub(crate) fn refused(code: &str, status: u16, text: &str, retry_after_s: Option<u64>) -> Reply {
    let mut message = format!("HTTP {status}: {text}");
    if let Some(seconds) = retry_after_s {
        message.push_str(&format!(" (Retry-After: {seconds} s)"));
    }
    let mut reply = Reply::new(
        ProviderOutcome::Failed(ErrorInfo::new(code, message)),
        CallReport {
            retry_after_s,
            ..CallReport::default()
        },
    );
    // A key refused is the deployment's trouble, not the request's: every call fails alike, until the key is
    // rotated.
    reply.key_refused = matches!(status, 401 | 403);
    reply.provider_failing |= reply.key_refused;
    reply
}

/// A gateway that stopped waiting for the provider behind it: 408 Request Timeout, 502 Bad Gateway, 504 Gateway
/// Timeout, and Cloudflare's 524 A Timeout Occurred.
fn is_gateway_timeout(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 502 | 504 | 524)
}

/// The start of a text, for error messages.
pub(crate) fn snippet(text: &str) -> String {
    text.chars().take(300).collect()
}

/// One call of an HTTP provider, sent with `key`: the exchange, then `read` on a 2xx body; the reply scrubbed of
/// the key.
pub(crate) async fn answer(
    call: reqwest::RequestBuilder,
    key: Option<&Secret>,
    read: fn(&str) -> Reply,
) -> Reply {
    let reply = match exchange(call).await {
        Ok(text) => read(&text),
        Err(reply) => reply,
    };
    match key {
        Some(key) => reply.scrubbed(key),
        None => reply,
    }
}

/// A definite failure with this code.
pub(crate) fn failed(code: &str, message: impl Into<String>) -> ProviderOutcome {
    ProviderOutcome::Failed(ErrorInfo::new(code, message))
}

/// The code of a failed reply; panics on any other.
#[cfg(test)]
pub(crate) fn failure_code(reply: &Reply) -> &str {
    match &reply.outcome {
        ProviderOutcome::Failed(e) => &e.code,
        other => panic!("not a failure: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariant 15: what a breaker counts is what tells of the provider, never of the request.
    #[test]
    fn a_reply_tells_of_the_providers_health_only_when_the_provider_failed() {
        for code in PROVIDER_FAILURES.into_iter().chain(["bad_response"]) {
            assert!(Reply::failed(code, "x").provider_failing, "{code}");
        }
        for code in [
            "provider_refused",
            "model_refused",
            "output_invalid",
            "output_not_json",
            "output_truncated",
            "prompt_truncated",
        ] {
            assert!(!Reply::failed(code, "x").provider_failing, "{code}");
        }
        let lost = Reply::from(ProviderOutcome::Lost(ErrorInfo::new(
            "connection_lost",
            "x",
        )));
        assert!(lost.provider_failing);
        assert!(!Reply::from(ProviderOutcome::Answered(json!({}))).provider_failing);
    }

    /// A key the provider refuses says the deployment is broken for every caller: counted, though its code is the
    /// 4xx's; any other 4xx is the request's.
    #[tokio::test]
    async fn a_refused_key_is_the_providers_health_and_a_bad_request_is_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/{status}",
            axum::routing::post(
                |axum::extract::Path(status): axum::extract::Path<u16>| async move {
                    StatusCode::from_u16(status).unwrap()
                },
            ),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = reqwest::Client::new();
        for (status, failing) in [
            (401, true),
            (403, true),
            (400, false),
            (422, false),
            (404, false),
        ] {
            let reply = exchange(http.post(format!("http://{addr}/{status}")))
                .await
                .unwrap_err();
            assert_eq!(failure_code(&reply), "provider_refused", "{status}");
            assert_eq!(reply.provider_failing, failing, "{status}");
        }
    }
}
