//! Providers: where attempts run. One trait, [`Provider`], and its clients: [`demo`] (built in) and [`openai`]
//! (any OpenAI-compatible endpoint). A client only reports what happened on the wire; the worker checks the output
//! against the contract and decides the attempt's state.

pub mod demo;
pub mod openai;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::clock::Clock;
use crate::config::{ProviderConfig, ProviderKind};
use crate::domain::{ContractRef, ErrorInfo, ProviderName};

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

/// What came back, in the three classes that decide an attempt's state (SPEC invariant 5).
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderOutcome {
    /// An answer, as JSON; the worker still checks it against the contract.
    Answered(Value),
    /// A definite answer that is not a result: an error response, an unusable answer, or a connection refused
    /// before anything was sent. The attempt becomes `failed`.
    Failed(ErrorInfo),
    /// The request may have reached the provider and no answer will come (connection lost after sending): the
    /// work may have been done. The attempt becomes `unknown`, never `failed`.
    Lost(ErrorInfo),
}

#[async_trait]
pub trait Provider: Send + Sync + Debug {
    /// One call. It may take forever: the worker bounds it with the provider's timeout.
    async fn call(&self, request: &ProviderRequest) -> ProviderOutcome;
}

/// A configured provider: its settings and its client.
#[derive(Debug, Clone)]
pub struct ConfiguredProvider {
    pub config: ProviderConfig,
    pub client: Arc<dyn Provider>,
}

/// Every configured provider, by name.
#[derive(Debug, Default)]
pub struct Providers(BTreeMap<ProviderName, ConfiguredProvider>);

impl Providers {
    /// Builds a client for each configured provider; HTTP clients share one connection pool.
    pub fn from_config(
        configs: &BTreeMap<ProviderName, ProviderConfig>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let http = reqwest::Client::new();
        Self(
            configs
                .iter()
                .map(|(name, config)| {
                    let client: Arc<dyn Provider> = match config.kind {
                        ProviderKind::Demo => {
                            Arc::new(demo::DemoProvider::new(config, clock.clone()))
                        }
                        ProviderKind::Openai => {
                            Arc::new(openai::OpenAiProvider::new(config, http.clone()))
                        }
                    };
                    let configured = ConfiguredProvider {
                        config: config.clone(),
                        client,
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

    /// May automatic failover go to `name`? For now the config's `qualified` switch says so.
    pub fn is_qualified(&self, name: &ProviderName) -> bool {
        self.0.get(name).is_some_and(|p| p.config.qualified)
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
