//! The HTTP plumbing the OpenAI and Anthropic kinds share: their settings ([`ProviderEndpoint`]), where a call goes
//! and how it is shaped ([`HttpEndpoint`]), and one exchange read into a [`Reply`], scrubbed of the key.

use serde::Deserialize;
use serde_json::Map;

use super::*;

/// An HTTP provider: where it is, which model, whose key, and how its requests are shaped where a server differs
/// from the kind's default (Azure OpenAI, OpenAI's reasoning models, Gemini's or Mistral's OpenAI-compatible
/// endpoints, vLLM, Ollama).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEndpoint {
    /// The API root, e.g. `https://api.openai.com/v1`, `https://api.anthropic.com/v1`.
    pub base_url: String,
    /// The model name sent with each request.
    pub model: String,
    /// The name of the key (a secret's member, else an environment variable): a bearer token (openai) or
    /// `x-api-key` (anthropic). Without one, requests carry no key.
    pub api_key_env: Option<String>,
    /// The header that carries the key as it is, instead of the kind's (Azure OpenAI: `api-key`).
    pub api_key_header: Option<String>,
    /// The path after `base_url`, instead of the kind's (`chat/completions`, `messages`).
    pub path: Option<String>,
    /// Query parameters every request carries (Azure OpenAI: `{ "api-version" = "2024-10-21" }`).
    #[serde(default)]
    pub query: BTreeMap<String, String>,
    /// Headers every request carries. Not for keys: those come from `api_key_env`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The field the contract's output budget goes in. openai: `max_tokens`, or `max_completion_tokens`, which
    /// OpenAI's reasoning families (o1, o3, o4, gpt-5) take instead and which is their default; anthropic:
    /// `max_tokens` only.
    pub token_limit_field: Option<TokenLimitField>,
    /// Whether the contract's temperature is sent. Default: yes, but not to OpenAI's reasoning families, which
    /// refuse any but their own.
    pub send_temperature: Option<bool>,
    /// openai: the `reasoning_effort` of a reasoning model (`minimal`, `low`, `medium`, `high`). Its reasoning is
    /// spent from the contract's output budget.
    pub reasoning_effort: Option<String>,
    /// openai: `true` has every call stored by the provider (`store`), under the attempt's identity
    /// (`metadata.onejob_attempt`), so that an attempt whose answer was lost is looked up instead of bought again.
    /// OpenAI keeps stored completions 30 days; a server that stores nothing must leave it unset. Not part of the
    /// request's shape: it changes no answer.
    pub store: Option<bool>,
    /// openai: the API its calls go through — `chat_completions` (the default) or `responses` (OpenAI's Responses
    /// API, `POST {base_url}/responses`).
    pub api: Option<OpenAiApi>,
    /// openai, with `api = "responses"` and `store = true`: each call is created in background mode — the create
    /// answers at once with the response's id, and the answer is waited on by reading that id. A wait lost on the
    /// wire is harmless (the next read), and an attempt that goes `unknown` keeps the id: the reconciler reads the
    /// call's fate by it. Not part of the request's shape: it changes no answer.
    pub background: Option<bool>,
    /// openai (`chat_completions` or `responses`, not in background) and anthropic: each call goes through the
    /// provider's batch API (OpenAI's Batch API, Anthropic's Message Batches) as a batch of its one request under
    /// the attempt's identity (`custom_id`): about half the price, minutes to hours. An attempt still in its batch
    /// at its time-out goes `unknown` with the batch's id, and the reconciler reads its result when the batch ends;
    /// a submit whose answer was lost is found by listing the provider's batches, never submitted again. Billed at
    /// half the price table's price. Not part of the request's shape: it changes no answer.
    pub batch: Option<bool>,
    /// Fields added as they are to every request's body (a server's own options). onejob's own fields (the model,
    /// the messages, the budget, the temperature, the output format) are set by the keys above, not here.
    #[serde(default)]
    pub body: Map<String, Value>,
}

/// Where an output budget goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenLimitField {
    MaxTokens,
    MaxCompletionTokens,
    /// The Responses API's, and only its.
    MaxOutputTokens,
}

impl TokenLimitField {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxTokens => "max_tokens",
            Self::MaxCompletionTokens => "max_completion_tokens",
            Self::MaxOutputTokens => "max_output_tokens",
        }
    }
}

/// The API an openai provider's calls go through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiApi {
    #[default]
    ChatCompletions,
    Responses,
}

/// The body fields onejob sets itself, which `body` may not name.
const OWN_BODY_FIELDS: [&str; 19] = [
    "model",
    "store",
    "metadata",
    "messages",
    "system",
    "input",
    "instructions",
    "text",
    "background",
    "reasoning",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "temperature",
    "reasoning_effort",
    "response_format",
    "tools",
    "tool_choice",
    "stream",
];

impl ProviderEndpoint {
    /// How the requests differ from the kind's default, as far as it is set: part of the provider's fingerprint
    /// (another shape is another provider, to be qualified again). `None` when nothing is set.
    pub fn request_shape(&self) -> Option<Value> {
        let mut shape = Map::new();
        let mut put = |key: &str, value: Value| {
            if !(value.is_null() || value == json!({})) {
                shape.insert(key.to_owned(), value);
            }
        };
        put("api_key_header", json!(self.api_key_header));
        put("path", json!(self.path));
        put("query", json!(self.query));
        put("headers", json!(self.headers));
        put("api", json!(self.api));
        put("token_limit_field", json!(self.token_limit_field));
        put("send_temperature", json!(self.send_temperature));
        put("reasoning_effort", json!(self.reasoning_effort));
        put("body", Value::Object(self.body.clone()));
        (!shape.is_empty()).then_some(Value::Object(shape))
    }

    /// What the fingerprint of an HTTP provider takes of its endpoint: the base URL, and the shape of its requests
    /// where the config sets it.
    pub fn identity(&self) -> Vec<(&'static str, Value)> {
        let mut identity = vec![("base_url", json!(self.base_url))];
        identity.extend(self.request_shape().map(|shape| ("request", shape)));
        identity
    }

    /// The checks serde cannot make that every HTTP kind shares.
    pub fn check(&self) -> Result<(), String> {
        if let Some(own) = self
            .body
            .keys()
            .find(|k| OWN_BODY_FIELDS.contains(&k.as_str()))
        {
            return Err(format!(
                "body.{own} is onejob's own field: use api, token_limit_field, send_temperature, reasoning_effort, store, background or batch"
            ));
        }
        for name in self.api_key_header.iter().chain(self.headers.keys()) {
            reqwest::header::HeaderName::try_from(name.as_str())
                .map_err(|_| format!("{name:?} is not a header name"))?;
        }
        for (name, value) in &self.headers {
            reqwest::header::HeaderValue::try_from(value.as_str())
                .map_err(|_| format!("headers.{name}: not a header value"))?;
        }
        reqwest::Url::parse(&self.base_url).map_err(|e| format!("base_url: {e}"))?;
        Ok(())
    }
}

/// How a kind shapes its requests where the endpoint's settings do not say.
#[derive(Debug, Clone, Copy)]
pub struct RequestDefaults {
    /// The path after `base_url`.
    pub path: &'static str,
    /// The field the output budget goes in.
    pub token_limit_field: TokenLimitField,
    /// Whether the contract's temperature is sent.
    pub sends_temperature: bool,
}

/// Where an HTTP provider's calls go: the client (one connection pool for all), the full URL, the model, and the
/// key. Shared by the OpenAI and Anthropic clients, which differ only in what they send and read.
#[derive(Debug)]
pub struct HttpEndpoint {
    pub http: reqwest::Client,
    pub url: reqwest::Url,
    /// `base_url`, with the config's query: where the kind's other resources are (a batch API's).
    root: reqwest::Url,
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
    /// The endpoint at `{base_url}/{path}` (the config's path, else the kind's) with the config's query, its key
    /// from `keys` (else the environment), its requests shaped as the config says, else as the kind's `defaults`.
    pub fn new(
        endpoint: &ProviderEndpoint,
        defaults: RequestDefaults,
        keys: &ProviderKeys,
        http: &reqwest::Client,
    ) -> Self {
        let path = endpoint
            .path
            .as_deref()
            .unwrap_or(defaults.path)
            .trim_start_matches('/');
        let root = endpoint.base_url.trim_end_matches('/');
        // Checked when the config was read (`ProviderConfig::check`).
        let with_query = |mut url: reqwest::Url| {
            if !endpoint.query.is_empty() {
                url.query_pairs_mut().extend_pairs(&endpoint.query);
            }
            url
        };
        let url =
            with_query(reqwest::Url::parse(&format!("{root}/{path}")).expect("a checked base_url"));
        Self {
            http: http.clone(),
            url,
            root: with_query(reqwest::Url::parse(root).expect("a checked base_url")),
            model: endpoint.model.clone(),
            key: keys.source(endpoint.api_key_env.as_deref()),
            key_header: endpoint.api_key_header.clone(),
            headers: endpoint.headers.clone(),
            token_limit_field: (endpoint.token_limit_field).unwrap_or(defaults.token_limit_field),
            sends_temperature: (endpoint.send_temperature).unwrap_or(defaults.sends_temperature),
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
        let call = self.post(self.url.clone(), idempotency_key, body);
        let (sent, key) = self.send(call, kind_key).await;
        let reply = sent.map_or_else(|reply| reply, |text| read(&text));
        match &key {
            Some(key) => reply.scrubbed(key),
            None => reply,
        }
    }

    /// A question about a call made before: a `GET` of the call's URL with `query` added, sent as a call is (the
    /// config's headers, the key), its 2xx body read by `read`. What went wrong on the way is the lookup's failure,
    /// to be asked again later.
    pub async fn look_up(
        &self,
        query: &[(&str, &str)],
        kind_key: impl FnOnce(reqwest::RequestBuilder, &str) -> reqwest::RequestBuilder,
        read: fn(&str) -> Lookup,
    ) -> Lookup {
        let mut url = self.url.clone();
        url.query_pairs_mut().extend_pairs(query);
        let (sent, key) = self.send(self.http.get(url), kind_key).await;
        let looked = match sent {
            Ok(text) => read(&text),
            Err(reply) => Lookup::unanswered(reply),
        };
        match (looked, &key) {
            (Lookup::Found(reply), Some(key)) => Lookup::Found(Box::new(reply.scrubbed(key))),
            (Lookup::Failed(mut error), Some(key)) => {
                error.message = key.scrub(&error.message);
                Lookup::Failed(error)
            }
            (looked, _) => looked,
        }
    }

    /// `base_url`'s `segments` (each escaped as a path segment), with the config's query.
    pub(crate) fn at(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.root.clone();
        url.path_segments_mut()
            .expect("an http URL has a path")
            .pop_if_empty()
            .extend(segments);
        url
    }

    /// Sends `call` as [`Self::send`] does: its 2xx body as it came (an answer is never altered), or the reply
    /// anything else is, scrubbed of the key. What is read from the body is scrubbed by [`Self::scrubbed`].
    pub(crate) async fn fetch(
        &self,
        call: reqwest::RequestBuilder,
        kind_key: impl FnOnce(reqwest::RequestBuilder, &str) -> reqwest::RequestBuilder,
    ) -> Result<String, Reply> {
        let (sent, key) = self.send(call, kind_key).await;
        match &key {
            Some(key) => sent.map_err(|reply| reply.scrubbed(key)),
            None => sent,
        }
    }

    /// `reply` with the key scrubbed from its message (never from an answer), as a call's reply is.
    pub(crate) fn scrubbed(&self, reply: Reply) -> Reply {
        match self.key.current() {
            Some(key) => reply.scrubbed(&key),
            None => reply,
        }
    }

    /// `looked` with the key scrubbed from its messages (never from an answer found).
    pub(crate) fn scrubbed_lookup(&self, looked: Lookup) -> Lookup {
        let Some(key) = self.key.current() else {
            return looked;
        };
        match looked {
            Lookup::Found(reply) => Lookup::Found(Box::new(reply.scrubbed(&key))),
            Lookup::Failed(mut error) => {
                error.message = key.scrub(&error.message);
                Lookup::Failed(error)
            }
            looked => looked,
        }
    }

    /// `GET url`, sent as [`Self::fetch`] sends it: the 2xx body as JSON, or the reply that says why not (`what` was
    /// asked for, if the body is not JSON).
    pub(crate) async fn get_json(
        &self,
        url: reqwest::Url,
        kind_key: impl FnOnce(reqwest::RequestBuilder, &str) -> reqwest::RequestBuilder,
        what: &str,
    ) -> Result<Value, Reply> {
        let text = self.fetch(self.http.get(url), kind_key).await?;
        serde_json::from_str(&text)
            .map_err(|_| Reply::failed("bad_response", format!("not {what}: {}", unread(&text))))
    }

    /// A `POST` of `body` to `url`, carrying the attempt's idempotency key: a call's request, to be [sent](Self::send).
    pub fn post(
        &self,
        url: reqwest::Url,
        idempotency_key: &str,
        body: &Value,
    ) -> reqwest::RequestBuilder {
        (self.http.post(url))
            .header("Idempotency-Key", idempotency_key)
            .json(body)
    }

    /// Sends `call` with the config's headers and the key: its 2xx body, or the reply anything else already is
    /// ([`exchange`]), and the key it went with. A key refused has the secret read again before the next call.
    pub(crate) async fn send(
        &self,
        mut call: reqwest::RequestBuilder,
        kind_key: impl FnOnce(reqwest::RequestBuilder, &str) -> reqwest::RequestBuilder,
    ) -> (Result<String, Reply>, Option<Secret>) {
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
        let sent = exchange(call).await;
        if sent.as_ref().is_err_and(|reply| reply.key_refused) {
            self.key.refused();
        }
        (sent, key)
    }
}

/// Sends one HTTP call and reads the body of a 2xx answer. Anything else is already the reply:
/// - refused or unreachable: nothing was sent, so nothing was done → failed (`connection_failed`);
/// - lost after sending, or while reading the answer → lost (`connection_lost`): the attempt becomes unknown;
/// - an error status, by [`meaning`]: lost where the work may have been done (a gateway's time-out, a provider's
///   5xx), else failed, with the wait it asked for kept in the report (`retry-after-ms`, else `Retry-After`).
///   `rate_limited`, `provider_unavailable` and `connection_failed` say the work was not done: the engine may queue
///   a retry on the same provider, as a new attempt, never a hidden loop — unless the provider said
///   `x-should-retry: false` (OpenAI's, Anthropic's: an exhausted quota, say), which makes it `provider_refused`,
///   for failover, its effect on the breaker unchanged.
pub(crate) async fn exchange(call: reqwest::RequestBuilder) -> Result<String, Reply> {
    let response = match call.send().await {
        Ok(response) => response,
        Err(e) if e.is_connect() => {
            return Err(ProviderOutcome::Failed(transport_error("connection_failed", &e)).into());
        }
        Err(e) => return Err(ProviderOutcome::Lost(transport_error("connection_lost", &e)).into()),
    };
    let status = response.status();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
    let wait_ms = retry_wait_ms(header("retry-after"), header("retry-after-ms"));
    let no_retry = header("x-should-retry").is_some_and(|v| v.trim().eq_ignore_ascii_case("false"));
    let text = (response.text().await).map_err(|e| {
        Reply::from(ProviderOutcome::Lost(transport_error(
            "connection_lost",
            &e,
        )))
    })?;
    if status.is_success() {
        return Ok(text);
    }
    match meaning(status.as_u16()) {
        Meaning::MayBeDone(code) => Err(ProviderOutcome::Lost(ErrorInfo::new(
            code,
            format!("HTTP {status}: {}", error_text(&text)),
        ))
        .into()),
        Meaning::Failed(code) if no_retry && crate::domain::failover::NOT_DONE.contains(&code) => {
            let mut reply = refused(
                "provider_refused",
                status.as_u16(),
                &error_text(&text),
                wait_ms,
            );
            reply.health = Health::of_refusal(status.as_u16(), code);
            Err(reply)
        }
        Meaning::Failed(code) => Err(refused(code, status.as_u16(), &error_text(&text), wait_ms)),
    }
}

/// What an error status says of the work behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Meaning {
    /// It may have been done, and billed: the attempt becomes unknown (invariant 5).
    MayBeDone(&'static str),
    /// A definite failure, with its code.
    Failed(&'static str),
}

/// The rule for every kind's error status (the HTTP kinds', and Bedrock's errors its SDK does not name): a gateway
/// that stopped waiting (408, 502, 504, Cloudflare's 524: the provider behind it may still run) and a provider
/// failing while it had the request (500 and the other 5xx but those below) may have done the work; 429 is
/// `rate_limited`, 503 and Anthropic's 529 (`overloaded_error`) `provider_unavailable` — both not taken — and the
/// 4xx and 501 `provider_refused`. A redirect is never followed (it would take the key along): a 307 or 308 says
/// the request was not taken here (`provider_refused`); any other 3xx — 303 "see other" says it was done, a 301 or
/// 302 does not say — may have done the work (`redirected`).
pub(crate) fn meaning(status: u16) -> Meaning {
    match status {
        307 | 308 => Meaning::Failed("provider_refused"),
        300..=399 => Meaning::MayBeDone("redirected"),
        408 | 502 | 504 | 524 => Meaning::MayBeDone("gateway_timeout"),
        429 => Meaning::Failed("rate_limited"),
        503 | 529 => Meaning::Failed("provider_unavailable"),
        501 => Meaning::Failed("provider_refused"),
        500..=599 => Meaning::MayBeDone("provider_error"),
        _ => Meaning::Failed("provider_refused"),
    }
}

/// How long a provider asked to be left alone, in milliseconds, rounded up (never sooner than asked): its
/// `retry-after-ms` (OpenAI's and Anthropic's, to the millisecond), else its `Retry-After` (seconds, or a date).
pub(crate) fn retry_wait_ms(
    retry_after: Option<&str>,
    retry_after_ms: Option<&str>,
) -> Option<u64> {
    let precise = retry_after_ms
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| ms.ceil().min(u64::MAX as f64) as u64);
    precise.or_else(|| {
        let wait = crate::retry::retry_after(retry_after?, std::time::SystemTime::now())?;
        Some(u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX))
    })
}

/// A definite failure the provider answered with `status` and `text`: the code, the wait it asked for (kept in the
/// report, in whole seconds rounded up and in milliseconds, and said in the message), and whether it refused the
/// key.
pub(crate) fn refused(code: &str, status: u16, text: &str, wait_ms: Option<u64>) -> Reply {
    let mut message = format!("HTTP {status}: {text}");
    match wait_ms {
        Some(ms) if ms % 1000 == 0 => message.push_str(&format!(" (Retry-After: {} s)", ms / 1000)),
        Some(ms) => message.push_str(&format!(" (retry after {ms} ms)")),
        None => {}
    }
    let mut reply = Reply::new(
        ProviderOutcome::Failed(ErrorInfo::new(code, message)),
        CallReport {
            retry_after_s: wait_ms.map(|ms| ms.div_ceil(1000)),
            retry_after_ms: wait_ms,
            ..CallReport::default()
        },
    );
    // A key refused is the deployment's trouble, not the request's: every call fails alike, until the key is
    // rotated.
    reply.key_refused = matches!(status, 401 | 403);
    reply.health = Health::of_refusal(status, code);
    reply
}

/// What onejob keeps of an error body a provider, or a gateway or proxy before it, answered with — what an owner
/// reads on its attempt, its events and the providers' view: the provider's own error message where the body is its
/// API's JSON error, with every address cut out (a URL, an IP address); of any other body (a proxy's HTML page, a
/// load balancer's text, which name internal hosts and paths) only its size. The whole body goes to the operators'
/// log.
pub(crate) fn error_text(body: &str) -> String {
    if body.trim().is_empty() {
        return "no body".into();
    }
    let json = serde_json::from_str::<Value>(body).ok();
    let error = json.as_ref().map(|v| v.get("error").unwrap_or(v));
    let message = error.and_then(|e| match e {
        Value::String(message) => Some(message.as_str()),
        e => (e.get("message").or_else(|| e.get("detail"))).and_then(Value::as_str),
    });
    match message {
        Some(message) => snippet(&without_addresses(message)),
        None => format!("{}, not the provider's JSON error", unread(body)),
    }
}

/// `message` with every word that names or holds an address replaced by `[address]`: what an owner may read of a
/// provider's or a gateway's message. A word is cut out whole (`node_10.2.3.4`, `my_svc.corp.local:9000`), so
/// no part of an address is left beside it.
fn without_addresses(message: &str) -> String {
    WORD.replace_all(message, |word: &regex::Captures<'_>| {
        if ADDRESS.is_match(&word[0]) {
            "[address]".to_owned()
        } else {
            word[0].to_owned()
        }
    })
    .into_owned()
}

/// A body that is not what the provider's API sends, as an owner reads of it: its size only (its text, which may
/// name internal hosts and paths, goes to the operators' log).
pub(crate) fn unread(body: &str) -> String {
    tracing::warn!(body = %snippet(body), "a body that is not the provider's API's: not kept on the attempt");
    format!("a body of {} bytes (in the operators' log)", body.len())
}

/// A word of a message: what lies between spaces, quotes, brackets of prose and separators.
static WORD: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(r#"[^\s"'<>(),;]+"#).expect("the word pattern compiles")
});

/// A word that names or holds an address: a URL (percent-encoded too), an IPv4 address anywhere in it, an IPv6 one
/// (two colons between hex digits: bare, bracketed, with a zone or mapped), a name with its port (`redis:6379`,
/// `proxy.corp.internal:3128`), a host name of three labels or more, `localhost`.
static ADDRESS: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(
        r"(?i)://|%3a%2f%2f|\d{1,3}(?:\.\d{1,3}){3}|[0-9a-f]*:[0-9a-f]*:|\w:\d{1,5}\b|^(?:[\w-]+\.){2,}[a-z]{2,}\.?$|\blocalhost\b",
    )
    .expect("the address pattern compiles")
});

/// The start of a text, for error messages: its first 300 characters, less a word cut in two (the start of a key
/// or of an address is never kept: what scrubs them finds them whole, or not at all).
pub(crate) fn snippet(text: &str) -> String {
    let Some((end, _)) = text.char_indices().nth(300) else {
        return text.to_owned();
    };
    let cut = &text[..end];
    if text[end..].starts_with(char::is_whitespace) {
        return cut.to_owned();
    }
    cut.trim_end_matches(|c: char| !c.is_whitespace())
        .trim_end()
        .to_owned()
}
