//! One `[providers.NAME]` table of `onejob.toml`: what a provider is, by `kind`, and how long to wait for it. Each
//! kind takes only its own keys (serde refuses the others, and a missing `base_url` or `model`), so a settings value
//! is always whole.

use std::collections::BTreeMap;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value, json};

use super::bedrock::BedrockSettings;
use crate::domain::RetryLimits;

/// A provider's settings: what it is, by `kind`, and the limits every kind has. In `onejob.toml` one flat table.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub limits: ProviderLimits,
}

/// What a provider is, with its kind's own keys.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProviderKind {
    /// Built in, in process, deterministic: for local runs and demos.
    Demo(DemoSettings),
    /// Any OpenAI-compatible `POST {base_url}/chat/completions` endpoint.
    Openai(ProviderEndpoint),
    /// Anthropic's Messages API, `POST {base_url}/messages`, structured output through a forced tool.
    Anthropic(ProviderEndpoint),
    /// Amazon Bedrock's Converse API, signed (SigV4) with the process's AWS credentials (a function's execution
    /// role), structured output through a forced tool.
    Bedrock(BedrockSettings),
}

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
}

impl TokenLimitField {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxTokens => "max_tokens",
            Self::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// The body fields onejob sets itself, which `body` may not name.
const OWN_BODY_FIELDS: [&str; 11] = [
    "model",
    "messages",
    "system",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "reasoning_effort",
    "response_format",
    "tools",
    "tool_choice",
    "stream",
];

/// OpenAI's reasoning families: they take `max_completion_tokens` and no temperature but their default.
fn is_reasoning_model(model: &str) -> bool {
    let name = model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .to_ascii_lowercase();
    ["o1", "o3", "o4", "gpt-5"]
        .iter()
        .any(|family| name.starts_with(family))
}

impl ProviderEndpoint {
    /// The field the output budget goes in, as set or by the kind and model's default.
    pub fn token_limit_field(&self, openai: bool) -> TokenLimitField {
        self.token_limit_field
            .unwrap_or(if openai && is_reasoning_model(&self.model) {
                TokenLimitField::MaxCompletionTokens
            } else {
                TokenLimitField::MaxTokens
            })
    }

    /// Whether the temperature is sent, as set or by the kind and model's default.
    pub fn sends_temperature(&self, openai: bool) -> bool {
        self.send_temperature
            .unwrap_or(!(openai && is_reasoning_model(&self.model)))
    }

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
        put("token_limit_field", json!(self.token_limit_field));
        put("send_temperature", json!(self.send_temperature));
        put("reasoning_effort", json!(self.reasoning_effort));
        put("body", Value::Object(self.body.clone()));
        (!shape.is_empty()).then_some(Value::Object(shape))
    }

    /// The checks serde cannot make, for a provider of the kind `openai` says.
    fn check(&self, openai: bool) -> Result<(), String> {
        if let Some(own) = self
            .body
            .keys()
            .find(|k| OWN_BODY_FIELDS.contains(&k.as_str()))
        {
            return Err(format!(
                "body.{own} is onejob's own field: use token_limit_field, send_temperature or reasoning_effort"
            ));
        }
        if !openai {
            if self.token_limit_field == Some(TokenLimitField::MaxCompletionTokens) {
                return Err("token_limit_field: anthropic takes max_tokens only".into());
            }
            if self.reasoning_effort.is_some() {
                return Err("reasoning_effort is an openai key".into());
            }
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

/// The demo provider: what it does and how fast.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoSettings {
    /// What the provider does.
    pub behavior: DemoBehavior,
    /// How long it takes to answer (or to fail).
    pub delay_ms: u64,
}

/// The limits every kind of provider takes.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderLimits {
    /// The model's context window in tokens: the prompt plus the contract's output budget must fit in it. A remote
    /// provider that names none has 8192 (set it to your model's); a demo provider, no limit.
    pub context_window: Option<u64>,
    /// Without an answer after this long, the attempt becomes `unknown`.
    pub timeout_ms: u64,
    /// After the timeout, how much longer the worker keeps listening for a late answer.
    pub late_result_ms: u64,
    /// Retries of this provider in a row after answers that say the work was not done, in place of the
    /// deployment's `provider_retries` (a contract may lower it).
    pub retries: Option<u32>,
    /// How long after the first try a retry may still start, in place of `provider_retry_within_ms`.
    pub retry_within_ms: Option<u64>,
    /// The most calls in flight to this provider at once, across every worker and function: beyond it an attempt
    /// waits, queued, without a try (a burst queues instead of earning 429s). None: no cap.
    pub max_in_flight: Option<u32>,
}

impl ProviderLimits {
    /// The table keys that are limits; the others belong to the kind.
    const KEYS: [&str; 6] = [
        "context_window",
        "timeout_ms",
        "late_result_ms",
        "retries",
        "retry_within_ms",
        "max_in_flight",
    ];
}

impl Default for ProviderLimits {
    fn default() -> Self {
        Self {
            context_window: None,
            timeout_ms: 30_000,
            late_result_ms: 60_000,
            retries: None,
            retry_within_ms: None,
            max_in_flight: None,
        }
    }
}

/// One table, split: the limits to [`ProviderLimits`], the rest (with `kind`) to the kind's own settings. Each part
/// refuses a key it does not know, so a key of another kind is refused.
impl<'de> Deserialize<'de> for ProviderConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut table = Map::<String, Value>::deserialize(deserializer)?;
        let limits: Map<String, Value> = ProviderLimits::KEYS
            .iter()
            .filter_map(|key| table.remove_entry(*key))
            .collect();
        let limits =
            ProviderLimits::deserialize(Value::Object(limits)).map_err(D::Error::custom)?;
        let kind = ProviderKind::deserialize(Value::Object(table)).map_err(D::Error::custom)?;
        Ok(Self { kind, limits })
    }
}

/// What a demo provider does with a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DemoBehavior {
    /// Answers with an output that keeps the contract's output schema.
    #[default]
    Answer,
    /// Answers with an error.
    Fail,
    /// Never answers.
    Hang,
    /// Answers, adding a top-level key the contract does not have.
    ExtraKey,
}

impl DemoBehavior {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Answer => "answer",
            Self::Fail => "fail",
            Self::Hang => "hang",
            Self::ExtraKey => "extra_key",
        }
    }
}

/// The context window of an HTTP provider that names none.
const DEFAULT_CONTEXT_WINDOW: u64 = 8_192;

impl ProviderConfig {
    /// A demo provider with the given behaviour and delay, and default limits.
    pub fn demo(behavior: DemoBehavior, delay_ms: u64) -> Self {
        let kind = ProviderKind::Demo(DemoSettings { behavior, delay_ms });
        Self::of(kind)
    }

    /// A provider of this kind with default limits.
    pub fn of(kind: ProviderKind) -> Self {
        let limits = ProviderLimits::default();
        Self { kind, limits }
    }

    /// The `kind` key.
    pub fn kind(&self) -> &'static str {
        match self.kind {
            ProviderKind::Demo(_) => "demo",
            ProviderKind::Openai(_) => "openai",
            ProviderKind::Anthropic(_) => "anthropic",
            ProviderKind::Bedrock(_) => "bedrock",
        }
    }

    /// The endpoint of an HTTP provider.
    pub fn endpoint(&self) -> Option<&ProviderEndpoint> {
        match &self.kind {
            ProviderKind::Demo(_) | ProviderKind::Bedrock(_) => None,
            ProviderKind::Openai(endpoint) | ProviderKind::Anthropic(endpoint) => Some(endpoint),
        }
    }

    /// The model it is configured with (a demo provider has none).
    pub fn model(&self) -> Option<&str> {
        match &self.kind {
            ProviderKind::Demo(_) => None,
            ProviderKind::Openai(endpoint) | ProviderKind::Anthropic(endpoint) => {
                Some(&endpoint.model)
            }
            ProviderKind::Bedrock(bedrock) => Some(&bedrock.model),
        }
    }

    /// Where its calls go, for operators: an HTTP provider's base URL, a Bedrock provider's region.
    pub fn address(&self) -> Option<String> {
        match &self.kind {
            ProviderKind::Demo(_) => None,
            ProviderKind::Openai(endpoint) | ProviderKind::Anthropic(endpoint) => {
                Some(endpoint.base_url.clone())
            }
            ProviderKind::Bedrock(bedrock) => {
                Some(bedrock.endpoint_url.clone().unwrap_or_else(|| {
                    let region = bedrock.region.as_deref().unwrap_or("the process's region");
                    format!("bedrock-runtime ({region})")
                }))
            }
        }
    }

    pub fn timeout_ms(&self) -> u64 {
        self.limits.timeout_ms
    }

    pub fn late_result_ms(&self) -> u64 {
        self.limits.late_result_ms
    }

    pub fn timeout(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.timeout_ms() as i64)
    }

    pub fn late_result(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.late_result_ms() as i64)
    }

    /// The context window in tokens, with the kind's default; `None` is unbounded.
    pub fn context_window(&self) -> Option<u64> {
        match self.kind {
            ProviderKind::Demo(_) => self.limits.context_window,
            ProviderKind::Openai(_) | ProviderKind::Anthropic(_) | ProviderKind::Bedrock(_) => {
                Some(self.limits.context_window.unwrap_or(DEFAULT_CONTEXT_WINDOW))
            }
        }
    }

    /// Sets both timings, in milliseconds.
    pub fn with_timings(mut self, timeout_ms: u64, late_result_ms: u64) -> Self {
        (self.limits.timeout_ms, self.limits.late_result_ms) = (timeout_ms, late_result_ms);
        self
    }

    /// Its own retry limits.
    pub fn retry_limits(&self) -> RetryLimits {
        RetryLimits {
            retries: self.limits.retries,
            retry_within_ms: self.limits.retry_within_ms,
        }
    }

    /// The value checks serde cannot make: limits above zero, retry limits within bounds, request settings that
    /// fit the kind.
    pub fn check(&self) -> Result<(), String> {
        self.retry_limits().check()?;
        match &self.kind {
            ProviderKind::Demo(_) => {}
            ProviderKind::Openai(endpoint) => endpoint.check(true)?,
            ProviderKind::Anthropic(endpoint) => endpoint.check(false)?,
            ProviderKind::Bedrock(bedrock) => bedrock.check()?,
        }
        if self.timeout_ms() == 0 {
            return Err("timeout_ms must be above 0".into());
        }
        if self.context_window() == Some(0) {
            return Err("context_window must be above 0".into());
        }
        if self.limits.max_in_flight == Some(0) {
            return Err("max_in_flight of 0 lets no call through: leave it out for no cap".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(table: &str) -> Result<ProviderConfig, toml::de::Error> {
        toml::from_str(table)
    }

    #[test]
    fn every_kind_takes_every_limit_and_only_its_own_keys() {
        let limits = "context_window = 100\ntimeout_ms = 1\nlate_result_ms = 2\nretries = 3\nretry_within_ms = 4";
        let expected = ProviderLimits {
            context_window: Some(100),
            timeout_ms: 1,
            late_result_ms: 2,
            retries: Some(3),
            retry_within_ms: Some(4),
            max_in_flight: None,
        };
        for kind in [
            "kind = \"demo\"\nbehavior = \"fail\"",
            "kind = \"openai\"\nbase_url = \"http://x\"\nmodel = \"m\"",
            "kind = \"anthropic\"\nbase_url = \"http://x\"\nmodel = \"m\"",
            "kind = \"bedrock\"\nmodel = \"m\"\nregion = \"eu-west-1\"",
        ] {
            let config = parse(&format!("{kind}\n{limits}")).unwrap();
            assert_eq!(config.limits, expected, "{kind}");
            assert_eq!(parse(kind).unwrap().limits, ProviderLimits::default());
            let foreign = if kind.contains("demo") {
                "model = \"m\""
            } else {
                "delay_ms = 1"
            };
            let err = parse(&format!("{kind}\n{foreign}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("unknown field"), "{kind}: {err}");
        }
        let err = parse("kind = \"openai\"\nbase_url = \"http://x\"").unwrap_err();
        assert!(err.to_string().contains("missing field `model`"), "{err}");
        assert!(parse("kind = \"nope\"").is_err());
        assert!(
            parse("timeout_ms = 5")
                .unwrap_err()
                .to_string()
                .contains("kind")
        );
    }
}
