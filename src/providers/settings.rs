//! One `[providers.NAME]` table of `onejob.toml`: what a provider is, by `kind`, and how long to wait for it. Each
//! kind takes only its own keys (serde refuses the others, and a missing `base_url` or `model`), so a settings value
//! is always whole.

use serde::Deserialize;

use crate::domain::RetryLimits;

/// A provider's settings, by `kind`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProviderConfig {
    /// Built in, in process, deterministic: for local runs and demos.
    Demo(DemoSettings),
    /// Any OpenAI-compatible `POST {base_url}/chat/completions` endpoint.
    Openai(ProviderEndpoint),
    /// Anthropic's Messages API, `POST {base_url}/messages`, structured output through a forced tool.
    Anthropic(ProviderEndpoint),
}

/// An HTTP provider: where it is, which model, whose key, and its limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderEndpoint {
    /// The API root, e.g. `https://api.openai.com/v1`, `https://api.anthropic.com/v1`.
    pub base_url: String,
    /// The model name sent with each request.
    pub model: String,
    /// The name of the key (a secret's member, else an environment variable): a bearer token (openai) or
    /// `x-api-key` (anthropic). Without one, requests carry no key.
    pub api_key_env: Option<String>,
    /// The model's context window in tokens: the prompt plus the contract's output budget must fit in it.
    /// Default: 8192 (set it to your model's).
    pub context_window: Option<u64>,
    /// Without an answer after this long, the attempt becomes `unknown`.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// After the timeout, how much longer the worker keeps listening for a late answer.
    #[serde(default = "default_late_result_ms")]
    pub late_result_ms: u64,
    /// Retries of this provider in a row after answers that say the work was not done, in place of the
    /// deployment's `provider_retries` (a contract may lower it).
    pub retries: Option<u32>,
    /// How long after the first try a retry may still start, in place of `provider_retry_within_ms`.
    pub retry_within_ms: Option<u64>,
}

/// The demo provider: what it does, how fast, and its limits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoSettings {
    /// What the provider does.
    #[serde(default)]
    pub behavior: DemoBehavior,
    /// How long it takes to answer (or to fail).
    #[serde(default)]
    pub delay_ms: u64,
    /// A context window to check prompts against; default: unbounded.
    pub context_window: Option<u64>,
    /// Without an answer after this long, the attempt becomes `unknown`.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// After the timeout, how much longer the worker keeps listening for a late answer.
    #[serde(default = "default_late_result_ms")]
    pub late_result_ms: u64,
    /// Retries of this provider in a row after answers that say the work was not done, in place of the
    /// deployment's `provider_retries` (a contract may lower it).
    pub retries: Option<u32>,
    /// How long after the first try a retry may still start, in place of `provider_retry_within_ms`.
    pub retry_within_ms: Option<u64>,
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

fn default_timeout_ms() -> u64 {
    30_000
}

fn default_late_result_ms() -> u64 {
    60_000
}

impl ProviderConfig {
    /// A demo provider with the given behaviour and delay, and default timings.
    pub fn demo(behavior: DemoBehavior, delay_ms: u64) -> Self {
        Self::Demo(DemoSettings {
            behavior,
            delay_ms,
            context_window: None,
            timeout_ms: default_timeout_ms(),
            late_result_ms: default_late_result_ms(),
            retries: None,
            retry_within_ms: None,
        })
    }

    /// The `kind` key.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Demo(_) => "demo",
            Self::Openai(_) => "openai",
            Self::Anthropic(_) => "anthropic",
        }
    }

    /// The endpoint of an HTTP provider.
    pub fn endpoint(&self) -> Option<&ProviderEndpoint> {
        match self {
            Self::Demo(_) => None,
            Self::Openai(endpoint) | Self::Anthropic(endpoint) => Some(endpoint),
        }
    }

    /// (timeout, late window) in milliseconds.
    fn timings(&self) -> (u64, u64) {
        match self {
            Self::Demo(d) => (d.timeout_ms, d.late_result_ms),
            Self::Openai(e) | Self::Anthropic(e) => (e.timeout_ms, e.late_result_ms),
        }
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timings().0
    }

    pub fn late_result_ms(&self) -> u64 {
        self.timings().1
    }

    pub fn timeout(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.timeout_ms() as i64)
    }

    pub fn late_result(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.late_result_ms() as i64)
    }

    /// The context window in tokens, with the kind's default; `None` is unbounded.
    pub fn context_window(&self) -> Option<u64> {
        match self {
            Self::Demo(d) => d.context_window,
            Self::Openai(e) | Self::Anthropic(e) => {
                Some(e.context_window.unwrap_or(DEFAULT_CONTEXT_WINDOW))
            }
        }
    }

    /// Sets both timings, in milliseconds.
    pub fn with_timings(mut self, timeout_ms: u64, late_result_ms: u64) -> Self {
        let (timeout, late) = match &mut self {
            Self::Demo(d) => (&mut d.timeout_ms, &mut d.late_result_ms),
            Self::Openai(e) | Self::Anthropic(e) => (&mut e.timeout_ms, &mut e.late_result_ms),
        };
        (*timeout, *late) = (timeout_ms, late_result_ms);
        self
    }

    /// Its own retry limits.
    pub fn retry_limits(&self) -> RetryLimits {
        let (retries, retry_within_ms) = match self {
            Self::Demo(d) => (d.retries, d.retry_within_ms),
            Self::Openai(e) | Self::Anthropic(e) => (e.retries, e.retry_within_ms),
        };
        RetryLimits {
            retries,
            retry_within_ms,
        }
    }

    /// The value checks serde cannot make: limits above zero, retry limits within bounds.
    pub fn check(&self) -> Result<(), String> {
        self.retry_limits().check()?;
        if self.timeout_ms() == 0 {
            return Err("timeout_ms must be above 0".into());
        }
        if self.context_window() == Some(0) {
            return Err("context_window must be above 0".into());
        }
        Ok(())
    }
}
