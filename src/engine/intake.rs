//! The rules a create must pass before anything is written, in the order a client should learn of its mistakes:
//! the input's size as it will be kept, the contract, the provider chain (each provider configured, none twice),
//! the input schema; then the intent's fingerprint over what was sent. The attempts endpoint names its provider
//! through the same check.

use serde_json::{Value, json};

use super::Engine;
use crate::contracts::InputError;
use crate::domain::{
    ContractRef, Fingerprint, IdempotencyKey, MAX_INPUT_BYTES, NewJob, Owner, ProviderName,
};

/// A create as it was sent: what the owner asked for under `key`.
#[derive(Debug, Clone)]
pub struct Intake {
    pub owner: Owner,
    pub key: IdempotencyKey,
    pub contract: String,
    pub input: Value,
    /// The chain as sent; `None`: the contract's.
    pub providers: Option<Vec<String>>,
}

/// Why a create, or a provider named by hand, is refused. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the input is {size} bytes of JSON as kept; at most {limit} are")]
    InputTooLarge { size: usize, limit: usize },
    #[error("no contract {0} is configured")]
    UnknownContract(String),
    #[error("no provider {0} is configured")]
    UnknownProvider(String),
    #[error("{0}")]
    Chain(String),
    #[error("the input does not keep the contract's input schema")]
    InvalidInput(Vec<InputError>),
}

impl Engine {
    /// The job a create asks for, or why it is refused.
    pub fn intake(&self, sent: Intake) -> Result<NewJob, Refused> {
        // What is stored is the input's own JSON text, which may be longer than it was sent (`1e5` is kept as
        // `100000.0`): it must fit what every store keeps of a job.
        let size = sent.input.to_string().len();
        if size > MAX_INPUT_BYTES {
            return Err(Refused::InputTooLarge {
                size,
                limit: MAX_INPUT_BYTES,
            });
        }
        let contract = ContractRef::parse(&sent.contract)
            .ok()
            .and_then(|r| self.contracts.get(&r))
            .ok_or_else(|| Refused::UnknownContract(sent.contract.clone()))?;
        let providers = match &sent.providers {
            None => contract.providers.clone(),
            Some(names) => self.chain(names)?,
        };
        let input_errors = contract.input_errors(&sent.input);
        if !input_errors.is_empty() {
            return Err(Refused::InvalidInput(input_errors));
        }
        let fingerprint = Fingerprint::of_intent(
            &sent.contract,
            &sent.input,
            sent.providers.as_ref().map(|p| json!(p)).as_ref(),
        );
        Ok(NewJob {
            owner: sent.owner,
            idempotency_key: sent.key,
            fingerprint,
            contract: contract.reference.clone(),
            input: sent.input,
            providers,
        })
    }

    /// The configured provider `name` names.
    pub fn provider(&self, name: &str) -> Result<ProviderName, Refused> {
        ProviderName::parse(name)
            .ok()
            .filter(|p| self.providers.contains(p))
            .ok_or_else(|| Refused::UnknownProvider(name.to_owned()))
    }

    /// The providers a create names, each configured, none twice.
    fn chain(&self, names: &[String]) -> Result<Vec<ProviderName>, Refused> {
        if names.is_empty() {
            return Err(Refused::Chain(
                "providers: name at least one provider, or leave the field out for the contract's default chain"
                    .into(),
            ));
        }
        let mut chain: Vec<ProviderName> = Vec::with_capacity(names.len());
        for name in names {
            let provider = self.provider(name)?;
            if chain.contains(&provider) {
                return Err(Refused::Chain(format!("providers: {name} is named twice")));
            }
            chain.push(provider);
        }
        Ok(chain)
    }
}
