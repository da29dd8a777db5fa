//! Provider kinds, one file each, behind one trait, [`Kind`]: what a kind's settings are (`[providers.NAME]`'s keys
//! beside `kind`), what they are checked for, what a qualification is tied to, how prompts are counted, and its
//! client — how it builds a request from the contract and the settings, and what every reply means about the work
//! (invariant 5) and about the provider's health (invariant 15).
//!
//! - [`demo`]: built in, in process, deterministic.
//! - [`openai`]: any OpenAI-compatible `POST {base_url}/chat/completions`.
//! - [`anthropic`]: Anthropic's Messages API.
//! - [`bedrock`]: Amazon Bedrock's Converse API, signed with the process's AWS credentials.
//!
//! [`ProviderKind`] is the one place that names them all: `onejob.toml`'s `kind` key, and [`ProviderKind::kind`],
//! which every other part of onejob asks. Adding a kind is a file here and a variant there (docs/layout.md).

/// A kind's settings that are the keys every HTTP kind takes ([`ProviderEndpoint`]), its own checks aside: a
/// newtype that reads (and writes) through to the endpoint.
macro_rules! endpoint_settings {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub crate::providers::ProviderEndpoint);

        impl std::ops::Deref for $name {
            type Target = crate::providers::ProviderEndpoint;

            fn deref(&self) -> &crate::providers::ProviderEndpoint {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut crate::providers::ProviderEndpoint {
                &mut self.0
            }
        }
    };
}

pub mod anthropic;
pub mod bedrock;
pub mod demo;
pub mod openai;

use std::fmt::Debug;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::keys::ProviderKeys;
use super::tokens::Encoding;
use super::{Provider, ProviderEndpoint};
use crate::clock::Clock;

/// What a provider is, with its kind's own keys.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProviderKind {
    /// Built in, in process, deterministic: for local runs and demos.
    Demo(demo::DemoSettings),
    /// Any OpenAI-compatible `POST {base_url}/chat/completions` endpoint.
    Openai(openai::OpenAiSettings),
    /// Anthropic's Messages API, `POST {base_url}/messages`, structured output through a forced tool.
    Anthropic(anthropic::AnthropicSettings),
    /// Amazon Bedrock's Converse API, signed (SigV4) with the process's AWS credentials (a function's execution
    /// role), structured output through a forced tool.
    Bedrock(bedrock::BedrockSettings),
}

impl ProviderKind {
    /// The kind, to ask what it is and does.
    pub fn kind(&self) -> &dyn Kind {
        match self {
            Self::Demo(settings) => settings,
            Self::Openai(settings) => settings,
            Self::Anthropic(settings) => settings,
            Self::Bedrock(settings) => settings,
        }
    }
}

impl ProviderKind {
    /// Its client, for a process that calls it (see [`Connect`]).
    pub fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws> {
        match self {
            Self::Demo(settings) => settings.client(parts),
            Self::Openai(settings) => settings.client(parts),
            Self::Anthropic(settings) => settings.client(parts),
            Self::Bedrock(settings) => settings.client(parts),
        }
    }
}

/// What a process gives a kind to make its client with.
#[derive(Debug, Clone, Copy)]
pub struct ClientParts<'a> {
    /// The keys (a secret's, else the environment's), and the AWS settings calls are signed with, if any.
    pub keys: &'a ProviderKeys,
    /// One HTTP connection pool for every HTTP provider.
    pub http: &'a reqwest::Client,
    pub clock: &'a Arc<dyn Clock>,
}

/// A kind needs the process's AWS settings to sign its calls, and the process has none.
#[derive(Debug, Clone, Copy)]
pub struct NoAws;

/// One kind of provider, as its settings say it.
pub trait Kind: Debug + Send + Sync {
    /// Its `kind` key.
    fn name(&self) -> &'static str;

    /// The model it is configured with (a demo provider has none): an HTTP provider's endpoint's.
    fn model(&self) -> Option<&str> {
        self.endpoint().map(|endpoint| endpoint.model.as_str())
    }

    /// The endpoint of an HTTP provider.
    fn endpoint(&self) -> Option<&ProviderEndpoint> {
        None
    }

    /// Where its calls go, for operators: an HTTP provider's base URL, a Bedrock provider's region.
    fn address(&self) -> Option<String> {
        self.endpoint().map(|endpoint| endpoint.base_url.clone())
    }

    /// Its context window where the config names none; `None` is unbounded.
    fn default_context_window(&self) -> Option<u64> {
        Some(DEFAULT_CONTEXT_WINDOW)
    }

    /// How its prompts are counted in tokens, as far as its model's encoding is known.
    fn encoding(&self) -> Encoding {
        Encoding::Unknown
    }

    /// What a qualification is tied to beyond its kind, model and limits: where its calls go and how its requests
    /// are shaped where the config says (another shape is another provider, to be qualified again). Fields of its
    /// fingerprint's identity, by name: an HTTP provider's endpoint's.
    fn identity(&self) -> Vec<(&'static str, Value)> {
        self.endpoint()
            .map(ProviderEndpoint::identity)
            .unwrap_or_default()
    }

    /// The checks serde cannot make of its settings.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }

    /// Whether the provider keeps each call under the attempt's identity and can be asked about it afterwards
    /// ([`crate::providers::Provider::look_up`]): the reconciler clears its `unknown` attempts by asking, never
    /// by calling again.
    fn can_be_asked(&self) -> bool {
        false
    }

    /// Whether it is asked about a call by the name it gave the call ([`crate::providers::Provider::call_named`]),
    /// not by the attempt's identity: an attempt whose call was never named (its create's answer lost, its worker
    /// gone before its time-out) cannot be asked about, and waits for its policy or a person.
    fn asked_by_call_name(&self) -> bool {
        false
    }

    /// Whether its calls go through the provider's batch API ([`crate::providers::batch`]): billed at half the
    /// price table's price.
    fn in_batch(&self) -> bool {
        false
    }

    /// Whether its calls are signed with the process's AWS credentials.
    fn signs_with_aws(&self) -> bool {
        false
    }

    /// What a function's role must be granted `bedrock:InvokeModel` on to call it, in `region` unless the settings
    /// name one (none for a kind that is not on Bedrock).
    fn invoke_arns(&self, _region: &str) -> Vec<String> {
        Vec::new()
    }
}

/// How a kind's client is made, for a process that calls it: a trait of its own, reached by [`ProviderKind::client`]'s
/// static match, never through [`Kind`]'s vtable — so a binary that calls no provider (the api function) links no
/// kind's client code (Bedrock's is the AWS SDK's: a Lambda package's size is its cold start).
pub trait Connect {
    /// Its client.
    fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws>;
}

/// The context window of a remote provider that names none.
const DEFAULT_CONTEXT_WINDOW: u64 = 8_192;
