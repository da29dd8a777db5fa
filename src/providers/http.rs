//! The HTTP plumbing the OpenAI and Anthropic clients share: where a call goes and how it is shaped
//! ([`HttpEndpoint`]), and one exchange read into a [`Reply`], scrubbed of the key.

use super::*;

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
        Err(e) if e.is_connect() => {
            return Err(ProviderOutcome::Failed(transport_error("connection_failed", &e)).into());
        }
        Err(e) => return Err(ProviderOutcome::Lost(transport_error("connection_lost", &e)).into()),
    };
    let status = response.status();
    let retry_after_s = retry_after_s(response.headers().get(reqwest::header::RETRY_AFTER));
    let text = (response.text().await).map_err(|e| {
        Reply::from(ProviderOutcome::Lost(transport_error(
            "connection_lost",
            &e,
        )))
    })?;
    if status.is_success() {
        return Ok(text);
    }
    if is_gateway_timeout(status.as_u16()) {
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
    reply.health = Health::of_refusal(status, code);
    reply
}

/// A gateway that stopped waiting for the provider behind it: 408 Request Timeout, 502 Bad Gateway, 504 Gateway
/// Timeout, and Cloudflare's 524 A Timeout Occurred.
pub(crate) fn is_gateway_timeout(status: u16) -> bool {
    matches!(status, 408 | 502 | 504 | 524)
}

/// The start of a text, for error messages.
pub(crate) fn snippet(text: &str) -> String {
    text.chars().take(300).collect()
}

/// One call of an HTTP provider, sent with `key`: the exchange, then `read` on a 2xx body; the reply scrubbed of
/// the key.
async fn answer(
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
