//! Job contracts: named, versioned job kinds, written as data in `contracts/*.toml` and compiled into every binary,
//! so they work from any directory and in a Lambda package. A config may add contract files of its own.
//!
//! A contract holds the prompt template, the input and output JSON Schemas, the temperature, the output token
//! budget, sample inputs and a default provider chain. The chain belongs to the deployment: a config names the
//! chain each contract runs on (`[chains]`), and the file's chain is only the default. Loading checks everything a
//! later request relies on: the schemas compile, every sample satisfies the input schema, every provider of every
//! chain is configured (or start-up stops, saying how to fix it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::domain::{ContractRef, Fingerprint, ProviderName, RetryLimits};

#[derive(Debug)]
pub struct Contract {
    pub reference: ContractRef,
    pub description: String,
    /// The prompt, with `{{ field }}` placeholders filled from the input.
    pub prompt: String,
    pub input_schema: Value,
    pub output_schema: Value,
    pub temperature: f64,
    /// The most tokens a provider may spend on the answer.
    pub max_output_tokens: u32,
    /// The chain used when a create names no providers: the config's for this contract, else the file's.
    pub providers: Vec<ProviderName>,
    /// Inputs used to check a provider against this contract.
    pub samples: Vec<Value>,
    /// What a qualification is tied to: prompt, both schemas, temperature, output budget.
    pub fingerprint: Fingerprint,
    /// The most retries of a provider it allows (its `retries`, `retry_within_ms`); unset: no limit of its own.
    pub retry: RetryLimits,
    /// What clears its jobs' `unknown` attempts where the provider cannot be asked, if it says: else the
    /// provider's own policy (`unknown_retry_after_ms`).
    pub unknown: Option<UnknownPolicy>,
    input_validator: jsonschema::Validator,
    output_validator: jsonschema::Validator,
}

/// What clears an `unknown` attempt whose provider cannot be asked about its call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnknownPolicy {
    /// A person: the work may have been done, and another call would pay for it again.
    Hold,
    /// The reconciler, this many milliseconds after the attempt's time-out: its provider is tried again, accepting
    /// a possible second paid call.
    RetryAfterMs(u64),
}

/// The one value a contract's `unknown` key takes: `"hold"`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Hold {
    Hold,
}

/// One problem with a request's input, located by JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct InputError {
    /// JSON Pointer into `input` ("" is the input itself).
    pub pointer: String,
    pub message: String,
}

impl Contract {
    /// The prompt with each `{{ field }}` replaced by that input field — or, where the input leaves an optional
    /// field out, the input schema's `default` for it: strings as they are, other values as JSON. Every placeholder
    /// names a required field or one with a default (checked when the contract is loaded), so a valid input always
    /// renders.
    pub fn render(&self, input: &Value) -> Result<String, String> {
        let mut out = String::with_capacity(self.prompt.len());
        let mut rest = self.prompt.as_str();
        let defaults = self.input_schema.get("properties");
        for (before, name, after) in placeholders(&self.prompt)? {
            let value = input
                .get(name)
                .or_else(|| defaults?.get(name)?.get("default"))
                .ok_or_else(|| format!("the input has no field {name:?} for the prompt"))?;
            out.push_str(&rest[..before]);
            match value {
                Value::String(text) => out.push_str(text),
                other => out.push_str(&other.to_string()),
            }
            rest = &rest[after..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// The most tokens one call on `input` can take, prompt and answer ([`crate::domain::Bound`]): a token is at
    /// least a byte, so the rendered prompt's bytes and the output schema's, with the messages' framing
    /// ([`crate::domain::Bound::FRAMING_TOKENS`]); and the output budget, reasoning included.
    pub fn worst_case_tokens(&self, input: &Value) -> (u64, u64) {
        let prompt = self.render(input).map_or(0, |p| p.len());
        let schema = self.output_schema.to_string().len();
        let framing = crate::domain::Bound::FRAMING_TOKENS;
        (
            (prompt + schema) as u64 + framing,
            u64::from(self.max_output_tokens),
        )
    }

    /// Every way a provider's output breaks the contract: its schema, and any top-level key the schema does not
    /// name (even where the schema forgot `additionalProperties: false`). Empty when it keeps it.
    pub fn output_problems(&self, output: &Value) -> Vec<String> {
        let mut problems: Vec<String> = self
            .output_validator
            .iter_errors(output)
            .map(|e| format!("{} (at {:?})", e, e.instance_path().to_string()))
            .collect();
        // Where the schema closes itself, its validator has said so already.
        let closed = self.output_schema.get("additionalProperties") == Some(&Value::Bool(false));
        if let (false, Some(fields), Some(known)) = (
            closed,
            output.as_object(),
            self.output_schema
                .get("properties")
                .and_then(Value::as_object),
        ) {
            problems.extend(fields.keys().filter(|k| !known.contains_key(*k)).map(|k| {
                format!("the output has a top-level key the contract does not name: {k:?}")
            }));
        }
        problems
    }

    /// Every way `input` breaks the input schema; empty when it keeps it.
    pub fn input_errors(&self, input: &Value) -> Vec<InputError> {
        self.input_validator
            .iter_errors(input)
            .map(|e| InputError {
                pointer: e.instance_path().to_string(),
                message: e.to_string(),
            })
            .collect()
    }
}

/// The file format of a contract.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContractFile {
    name: String,
    version: u32,
    #[serde(default)]
    description: String,
    prompt: String,
    input_schema: Value,
    output_schema: Value,
    temperature: f64,
    max_output_tokens: u32,
    providers: Vec<ProviderName>,
    #[serde(default)]
    samples: Vec<Value>,
    /// Retries of a provider in a row this contract allows at most (not part of its fingerprint).
    retries: Option<u32>,
    /// How long after the first try a retry may still start, at most.
    retry_within_ms: Option<u64>,
    /// `"hold"`: its jobs' `unknown` attempts wait for a person, whatever their provider's policy.
    unknown: Option<Hold>,
    /// Its jobs' `unknown` attempts are retried this long after their time-out, whatever their provider's policy,
    /// where the provider cannot be asked.
    unknown_retry_after_ms: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("cannot read the contract file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{0}")]
    Chain(String),
}

/// `contracts/*.toml`, as compiled into the binary (a test checks this list against the folder).
const BUILT_IN: [(&str, &str); 2] = [
    ("classify.toml", include_str!("../contracts/classify.toml")),
    (
        "summarize.toml",
        include_str!("../contracts/summarize.toml"),
    ),
];

/// The loaded contracts, by reference.
#[derive(Debug, Default)]
pub struct Contracts(BTreeMap<ContractRef, Contract>);

impl Contracts {
    /// The built-in contracts (unless `built_in` is false), then the contract `files` (a file may replace a built-in contract of the same
    /// name@version; two files may not define one twice), each on the chain `chains` names for it, else on the
    /// chain its file names. `is_provider` tells which provider names are configured: a chain naming another one
    /// stops the load, with the fix in the message.
    pub fn load(
        files: &[PathBuf],
        chains: &BTreeMap<ContractRef, Vec<ProviderName>>,
        built_in: bool,
        is_provider: impl Fn(&ProviderName) -> bool,
    ) -> Result<Self, ContractError> {
        let mut contracts = BTreeMap::new();
        for (name, text) in BUILT_IN.iter().filter(|_| built_in) {
            let contract = parse(text).map_err(|message| ContractError::Invalid {
                path: Path::new("contracts").join(name),
                message,
            })?;
            contracts.insert(contract.reference.clone(), contract);
        }
        let mut from_files = BTreeMap::new();
        for path in files {
            let invalid = |message: String| ContractError::Invalid {
                path: path.clone(),
                message,
            };
            let text = std::fs::read_to_string(path).map_err(|source| ContractError::Read {
                path: path.clone(),
                source,
            })?;
            let contract = parse(&text).map_err(invalid)?;
            if let Some(first) = from_files.insert(contract.reference.clone(), path.clone()) {
                return Err(invalid(format!(
                    "{} is defined in {} already",
                    contract.reference,
                    first.display()
                )));
            }
            contracts.insert(contract.reference.clone(), contract);
        }
        let mut loaded = Self(contracts);
        loaded.choose_chains(chains, is_provider)?;
        Ok(loaded)
    }

    /// Puts each contract on its chain: the one `chains` names, else its file's; every provider must be
    /// configured.
    fn choose_chains(
        &mut self,
        chains: &BTreeMap<ContractRef, Vec<ProviderName>>,
        is_provider: impl Fn(&ProviderName) -> bool,
    ) -> Result<(), ContractError> {
        let known = || {
            self.0
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(unknown) = chains.keys().find(|c| !self.0.contains_key(*c)) {
            return Err(ContractError::Chain(format!(
                "chains: there is no contract {unknown} (the contracts are {})",
                known()
            )));
        }
        for (reference, contract) in &mut self.0 {
            let named = chains.get(reference);
            let chain = named.unwrap_or(&contract.providers);
            if chain.is_empty() {
                return Err(ContractError::Chain(format!(
                    "chains: {reference} needs at least one provider"
                )));
            }
            if let Some(missing) = chain.iter().find(|p| !is_provider(p)) {
                let whose = if named.is_some() {
                    "the chain the config names for it"
                } else {
                    "its default chain (the config names none for it)"
                };
                return Err(ContractError::Chain(format!(
                    "{reference}: {whose} runs on {missing}, which is not a configured provider; name its chain in \
                     the config with configured providers: [chains] \"{reference}\" = [\"primary\", \"fallback\"]"
                )));
            }
            contract.providers = chain.clone();
        }
        Ok(())
    }

    /// The fingerprint of them all: SHA-256 of each one's fingerprint, by name@version.
    pub fn fingerprint(&self) -> Fingerprint {
        let each: serde_json::Map<String, Value> = (self.0.iter())
            .map(|(reference, c)| {
                (
                    reference.to_string(),
                    Value::String(c.fingerprint.to_string()),
                )
            })
            .collect();
        Fingerprint::of_value(&Value::Object(each))
    }

    pub fn get(&self, reference: &ContractRef) -> Option<&Contract> {
        self.0.get(reference)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Contract> {
        self.0.values()
    }
}

/// The prompt's placeholders, in order: each one's start and end in what is left of the prompt after the one before
/// (so that a renderer walks it once), and the field it names.
fn placeholders(prompt: &str) -> Result<Vec<(usize, &str, usize)>, String> {
    let mut found = Vec::new();
    let mut rest = prompt;
    while let Some(start) = rest.find("{{") {
        let end = rest[start..]
            .find("}}")
            .ok_or_else(|| "the prompt has a '{{' without '}}'".to_owned())?;
        found.push((start, rest[start + 2..start + end].trim(), start + end + 2));
        rest = &rest[start + end + 2..];
    }
    Ok(found)
}

/// Every placeholder of `prompt` names a field the input schema requires, or one it gives a `default`: a valid
/// input then always renders (a contract that would take an input it cannot render is refused at load).
fn check_placeholders(prompt: &str, input_schema: &Value) -> Result<(), String> {
    let required: Vec<&str> = (input_schema.get("required"))
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (_, name, _) in placeholders(prompt)? {
        let defaulted = (input_schema.get("properties"))
            .and_then(|p| p.get(name)?.get("default"))
            .is_some();
        if !required.contains(&name) && !defaulted {
            return Err(format!(
                "prompt: {{{{ {name} }}}} names a field the input schema neither requires nor gives a default: \
                 a valid input without it could not be rendered"
            ));
        }
    }
    Ok(())
}

/// A schema of a JSON object: a contract's input is one (its prompt's placeholders name its fields), and so is its
/// output (every provider's structured output — a JSON schema response format, a tool's input — takes an object).
fn check_object(which: &str, schema: &Value) -> Result<(), String> {
    match schema.get("type") {
        Some(Value::String(kind)) if kind == "object" => Ok(()),
        _ => Err(format!(
            "{which}: the {} is a JSON object: say type = \"object\" at the top of the schema",
            which.trim_end_matches("_schema")
        )),
    }
}

fn parse(text: &str) -> Result<Contract, String> {
    let file: ContractFile = toml::from_str(text).map_err(|e| e.to_string())?;
    let reference = ContractRef::new(&file.name, file.version).map_err(|e| e.to_string())?;
    let input_validator = jsonschema::validator_for(&file.input_schema)
        .map_err(|e| format!("input_schema does not compile: {e}"))?;
    let output_validator = jsonschema::validator_for(&file.output_schema)
        .map_err(|e| format!("output_schema does not compile: {e}"))?;
    if file.providers.is_empty() {
        return Err("providers: the default chain needs at least one provider".into());
    }
    check_object("input_schema", &file.input_schema)?;
    check_object("output_schema", &file.output_schema)?;
    check_placeholders(&file.prompt, &file.input_schema)?;
    if !(0.0..=2.0).contains(&file.temperature) {
        return Err(format!("temperature {} is outside 0..=2", file.temperature));
    }
    let retry = RetryLimits {
        retries: file.retries,
        retry_within_ms: file.retry_within_ms,
    };
    retry.check()?;
    let unknown = match (file.unknown, file.unknown_retry_after_ms) {
        (Some(_), Some(_)) => {
            return Err(
                "unknown = \"hold\" and unknown_retry_after_ms are two policies: choose one".into(),
            );
        }
        (Some(Hold::Hold), None) => Some(UnknownPolicy::Hold),
        (None, Some(ms)) if ms > RetryLimits::MAX_WITHIN_MS => {
            return Err("unknown_retry_after_ms: at most a day (86400000)".into());
        }
        (None, Some(ms)) => Some(UnknownPolicy::RetryAfterMs(ms)),
        (None, None) => None,
    };
    let fingerprint = Fingerprint::of_value(&serde_json::json!({
        "prompt": file.prompt,
        "input_schema": file.input_schema,
        "output_schema": file.output_schema,
        "temperature": file.temperature,
        "max_output_tokens": file.max_output_tokens,
    }));
    let contract = Contract {
        reference,
        fingerprint,
        description: file.description,
        prompt: file.prompt,
        input_schema: file.input_schema,
        output_schema: file.output_schema,
        temperature: file.temperature,
        max_output_tokens: file.max_output_tokens,
        providers: file.providers,
        samples: file.samples,
        retry,
        unknown,
        input_validator,
        output_validator,
    };
    for (i, sample) in contract.samples.iter().enumerate() {
        if let Some(e) = contract.input_errors(sample).first() {
            return Err(format!(
                "samples[{i}] breaks the input schema at {:?}: {}",
                e.pointer, e.message
            ));
        }
    }
    Ok(contract)
}

#[cfg(test)]
mod tests;
