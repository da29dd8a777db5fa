//! Providers: where attempts run. One trait, [`Provider`] (one call), and the [`kinds`] of provider, one file each
//! behind the [`kinds::Kind`] trait: [`kinds::demo`] (built in), [`kinds::openai`] (any OpenAI-compatible endpoint),
//! [`kinds::anthropic`] (the Messages API) and [`kinds::bedrock`] (Amazon Bedrock's Converse API). A client only
//! reports what happened on the wire; [`checks`] holds the output to the contract, and the worker decides the
//! attempt's state.

pub mod batch;
pub mod checks;
pub mod http;
pub mod keys;
pub mod kinds;
pub mod qualify;
pub mod settings;
pub mod tokens;

pub use http::{OpenAiApi, ProviderEndpoint, TokenLimitField};
pub use kinds::demo::{DemoBehavior, DemoSettings};
pub use kinds::{Kind, ProviderKind};
pub use settings::{ProviderConfig, ProviderLimits};

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::clock::Clock;
use crate::domain::{
    CallReport, ContractRef, ErrorInfo, Fingerprint, Health, ProviderName, Timestamp,
};
pub use http::HttpEndpoint;
pub(crate) use http::{refused, retry_wait_ms, snippet, unread};
use keys::{KeySource, ProviderKeys, Secret};

/// The system prompt of every HTTP provider: the contract's prompt says what to do, this says how to answer.
pub const SYSTEM_PROMPT: &str =
    "Answer with one JSON object that matches the given JSON Schema, and nothing else.";

/// The metadata key a call carries the attempt's identity (`<job id>:<attempt>`) under, where its provider keeps
/// metadata: OpenAI's stored completions (listed by it), Bedrock's invocation log.
pub const ATTEMPT_METADATA: &str = "onejob_attempt";

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
    /// What the reply tells of the provider's health, rather than of the request (invariant 15): what its shared
    /// breaker takes. Failing: a 5xx, a 429, a key refused (401, 403), a refused or lost connection, a gateway's
    /// time-out, a body that is not what its API sends. Not a refusal the input caused (another 4xx: silent, it
    /// moves no breaker either way) nor an answer that broke the contract (answered): an owner's inputs must neither
    /// close a provider to every other owner nor hold a failing one open to them.
    pub health: Health,
    /// Whether the provider refused the key (401, 403): the secret is read again before the next call.
    pub key_refused: bool,
    /// The key the call was sent with: scrubbed from every message onejob writes of this reply
    /// ([`Reply::redacted`]), never from the answer.
    pub key: Option<Secret>,
}

impl Reply {
    /// `outcome` with `report`; what it tells of the provider's health is read off its code by the domain's rule
    /// (a lost answer always tells of a failing provider).
    pub fn new(outcome: ProviderOutcome, report: CallReport) -> Self {
        let health = match &outcome {
            ProviderOutcome::Answered(_) => Health::Answered,
            ProviderOutcome::Lost(_) => Health::Failing,
            ProviderOutcome::Failed(error) => Health::of_failure(&error.code),
        };
        Self {
            outcome,
            report,
            health,
            key_refused: false,
            key: None,
        }
    }

    pub fn failed(code: &str, message: impl Into<String>) -> Self {
        failed(code, message).into()
    }

    /// The reply as sent with `key`: its error message and the model id it reported (what onejob writes of it) are
    /// scrubbed of the key, and so is every message written of it later ([`Reply::redacted`]). The answer is left
    /// as the provider gave it (invariant 19).
    pub(crate) fn scrubbed(mut self, key: &Secret) -> Self {
        if let ProviderOutcome::Failed(error) | ProviderOutcome::Lost(error) = &mut self.outcome {
            error.message = key.scrub(&error.message);
        }
        if let Some(model) = &mut self.report.model {
            *model = key.scrub(model);
        }
        self.key = Some(key.clone());
        self
    }

    /// `error` — a message onejob writes of this reply, such as a check's that quotes the answer — scrubbed of the
    /// key the call was sent with.
    pub fn redacted(&self, mut error: ErrorInfo) -> ErrorInfo {
        if let Some(key) = &self.key {
            error.message = key.scrub(&error.message);
        }
        error
    }
}

impl From<ProviderOutcome> for Reply {
    fn from(outcome: ProviderOutcome) -> Self {
        Self::new(outcome, CallReport::default())
    }
}

/// What a provider said when asked about a call made before under `request`'s identity.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// The call was made and answered: its answer, already paid for, read as a call's reply is.
    Found(Box<Reply>),
    /// The provider keeps no call under that identity — yet: whether that means the work was not done is the
    /// reconciler's to judge, by how long ago the call started.
    NotFound,
    /// The call is still running at the provider (a background response queued or in progress): asked again at a
    /// later sweep.
    Running,
    /// The provider ended the call without its work (a background response cancelled): definitively not done.
    Ended,
    /// The question went unanswered (a key refused, a 5xx, a lost connection, a body not the API's): asked again
    /// at a later sweep.
    Failed(ErrorInfo),
}

/// A call the provider cancelled before its work (a background response, a batch: cancelled there, by a person or
/// its own rules): definitively not done, so tried again on the same provider; nothing of the provider's health.
pub(crate) fn cancelled_at_provider(what: &str) -> Reply {
    let mut reply = Reply::failed(
        "cancelled_at_provider",
        format!("the {what} was cancelled at the provider before its work"),
    );
    reply.health = Health::Silent;
    reply
}

impl Lookup {
    /// The question went unanswered, as `reply` (an error status, a connection lost, a body not the API's) says.
    pub(crate) fn unanswered(reply: Reply) -> Self {
        Self::Failed(match reply.outcome {
            ProviderOutcome::Failed(error) | ProviderOutcome::Lost(error) => error,
            ProviderOutcome::Answered(_) => ErrorInfo::new("bad_response", "no lookup answer"),
        })
    }
}

/// What an attempt kept of its call, to ask its provider about it ([`Provider::look_up`]).
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// The provider's own name of the call, if it gave one before the attempt went `unknown`
    /// ([`Provider::call_named`]).
    pub call_id: Option<&'a str>,
    /// When the call started, at the latest: nothing older can be the call.
    pub since: Timestamp,
    /// When its worker's listening ended at the latest (the attempt's lease): nothing newer can be the call.
    pub until: Option<Timestamp>,
}

/// Where a call that names itself before its answer (a background response's id) leaves that name, for the worker
/// to keep with the attempt when it goes `unknown` ([`Provider::call_named`]).
pub type CallName = std::sync::OnceLock<String>;

#[async_trait]
pub trait Provider: Send + Sync + Debug {
    /// One call. It may take forever: the caller bounds it with the provider's timeout.
    async fn call(&self, request: &ProviderRequest) -> Reply;

    /// One call, as [`Provider::call`], that leaves the provider's name of it in `named` as soon as the provider
    /// gives one, before its answer (a background response's id). A kind whose calls have no such name just calls.
    async fn call_named(&self, request: &ProviderRequest, _named: &CallName) -> Reply {
        self.call(request).await
    }

    /// Asks the provider about the call made before under `request`'s identity (its idempotency key), or under its
    /// own name of it ([`Asked::call_id`], [`Provider::call_named`]), for a kind that
    /// [can be asked](Kind::can_be_asked). It never makes the call: at most one paid call per attempt. It may take
    /// forever too: the caller bounds it with the provider's timeout.
    async fn look_up(&self, _request: &ProviderRequest, _asked: Asked<'_>) -> Lookup {
        Lookup::Failed(ErrorInfo::new(
            "not_asked",
            "this provider cannot be asked about its calls",
        ))
    }
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
    let mut identity = json!({
        "kind": config.kind(),
        "base_url": null,
        "model": config.model(),
        "context_window": config.context_window(),
        "timeout_ms": config.timeout_ms(),
    });
    for (field, value) in config.kind.kind().identity() {
        identity[field] = value;
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
        // A redirect is never followed: it would take the key (a header of the kind's or the config's) and the
        // prompt to wherever it points. A 3xx is the provider's refusal of the request.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("a client with no redirects");
        let parts = kinds::ClientParts {
            keys,
            http: &http,
            clock: &clock,
        };
        Ok(Self(
            configs
                .iter()
                .map(|(name, config)| {
                    let client = (config.kind.client(parts))
                        .map_err(|kinds::NoAws| NoAwsSettings(name.clone()))?;
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

/// What a call that went wrong on the wire keeps: its kind, said for whoever reads the attempt (its owner, an event's
/// receiver), and nothing of the transport's own text — an address, a host, a path, a query. That detail goes to the
/// operators' log only.
pub(crate) fn transport_error(code: &str, detail: &dyn std::fmt::Display) -> ErrorInfo {
    tracing::warn!(code, detail = %detail, "provider call went wrong on the wire");
    let message = match code {
        "connection_failed" => "no connection to the provider could be made: nothing was sent",
        "connection_lost" => {
            "the connection to the provider was lost after the request went out: the work may have been done"
        }
        _ => "the provider's answer could not be read",
    };
    ErrorInfo::new(code, message)
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
mod tests;
