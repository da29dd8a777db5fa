//! Job contracts: named, versioned job kinds loaded from `contracts/*.toml` at start-up (data, not code).
//!
//! A contract holds the prompt template, the input and output JSON Schemas, the temperature, the output token
//! budget, the default provider chain and sample inputs. Loading checks everything a later request relies on:
//! the schemas compile, every sample satisfies the input schema, every provider of the chain is configured.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::domain::{ContractRef, Fingerprint, ProviderName};

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
    /// The chain used when a create names no providers.
    pub providers: Vec<ProviderName>,
    /// Inputs used to check a provider against this contract.
    pub samples: Vec<Value>,
    /// What a qualification is tied to: prompt, both schemas, temperature, output budget.
    pub fingerprint: Fingerprint,
    input_validator: jsonschema::Validator,
    output_validator: jsonschema::Validator,
}

/// One problem with a request's input, located by JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct InputError {
    /// JSON Pointer into `input` ("" is the input itself).
    pub pointer: String,
    pub message: String,
}

impl Contract {
    /// The prompt with each `{{ field }}` replaced by that input field: strings as they are, other values as JSON.
    /// A placeholder whose field is missing is an error, never an empty string.
    pub fn render(&self, input: &Value) -> Result<String, String> {
        let mut out = String::with_capacity(self.prompt.len());
        let mut rest = self.prompt.as_str();
        while let Some(start) = rest.find("{{") {
            let end = rest[start..]
                .find("}}")
                .ok_or_else(|| "the prompt has a '{{' without '}}'".to_owned())?;
            let name = rest[start + 2..start + end].trim();
            let value = input
                .get(name)
                .ok_or_else(|| format!("the input has no field {name:?} for the prompt"))?;
            out.push_str(&rest[..start]);
            match value {
                Value::String(text) => out.push_str(text),
                other => out.push_str(&other.to_string()),
            }
            rest = &rest[start + end + 2..];
        }
        out.push_str(rest);
        Ok(out)
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
}

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("cannot read the contracts folder {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// `contracts/*.toml`, as compiled into the binary (a test checks this list against the folder).
const SHIPPED: [(&str, &str); 2] = [
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
    /// Loads every `*.toml` file of `dir`; `is_provider` tells which provider names are configured.
    pub fn load(
        dir: &Path,
        is_provider: impl Fn(&ProviderName) -> bool,
    ) -> Result<Self, ContractError> {
        let read_err = |source| ContractError::Read {
            path: dir.to_owned(),
            source,
        };
        let mut paths = std::fs::read_dir(dir)
            .map_err(read_err)?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(read_err)?;
        paths.retain(|p| p.extension().is_some_and(|e| e == "toml"));
        paths.sort();
        let mut sources = Vec::with_capacity(paths.len());
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|e| ContractError::Invalid {
                path: path.clone(),
                message: e.to_string(),
            })?;
            sources.push((path, text));
        }
        Self::from_sources(dir, sources, is_provider)
    }

    /// The contracts of the repository's `contracts/` folder, compiled into the binary: a Lambda package holds
    /// nothing but its binary.
    pub fn shipped(is_provider: impl Fn(&ProviderName) -> bool) -> Result<Self, ContractError> {
        let sources = SHIPPED
            .iter()
            .map(|(name, text)| (PathBuf::from("contracts").join(name), (*text).to_owned()))
            .collect();
        Self::from_sources(Path::new("contracts"), sources, is_provider)
    }

    fn from_sources(
        dir: &Path,
        sources: Vec<(PathBuf, String)>,
        is_provider: impl Fn(&ProviderName) -> bool,
    ) -> Result<Self, ContractError> {
        let mut contracts = BTreeMap::new();
        for (path, text) in sources {
            let invalid = |message: String| ContractError::Invalid {
                path: path.clone(),
                message,
            };
            let contract = parse(&text, &is_provider).map_err(invalid)?;
            if contracts.contains_key(&contract.reference) {
                return Err(invalid(format!("{} is defined twice", contract.reference)));
            }
            contracts.insert(contract.reference.clone(), contract);
        }
        if contracts.is_empty() {
            return Err(ContractError::Invalid {
                path: dir.to_owned(),
                message: "no *.toml contract in this folder".into(),
            });
        }
        Ok(Self(contracts))
    }

    pub fn get(&self, reference: &ContractRef) -> Option<&Contract> {
        self.0.get(reference)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Contract> {
        self.0.values()
    }
}

fn parse(text: &str, is_provider: &impl Fn(&ProviderName) -> bool) -> Result<Contract, String> {
    let file: ContractFile = toml::from_str(text).map_err(|e| e.to_string())?;
    let reference = ContractRef::new(&file.name, file.version).map_err(|e| e.to_string())?;
    let input_validator = jsonschema::validator_for(&file.input_schema)
        .map_err(|e| format!("input_schema does not compile: {e}"))?;
    let output_validator = jsonschema::validator_for(&file.output_schema)
        .map_err(|e| format!("output_schema does not compile: {e}"))?;
    if file.providers.is_empty() {
        return Err("providers: the default chain needs at least one provider".into());
    }
    if let Some(missing) = file.providers.iter().find(|p| !is_provider(p)) {
        return Err(format!("providers: {missing} is not a configured provider"));
    }
    if !(0.0..=2.0).contains(&file.temperature) {
        return Err(format!("temperature {} is outside 0..=2", file.temperature));
    }
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
mod tests {
    use super::*;
    use serde_json::json;

    fn shipped() -> Contracts {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts");
        Contracts::load(&dir, |p| ["demo", "demo-backup"].contains(&p.as_str())).unwrap()
    }

    #[test]
    fn the_shipped_summarize_contract_loads_and_checks_input() {
        let contracts = shipped();
        let summarize = contracts
            .get(&ContractRef::parse("summarize@1").unwrap())
            .unwrap();
        assert_eq!(summarize.temperature, 0.0);
        assert_eq!(summarize.providers.len(), 2);
        assert!(!summarize.samples.is_empty());
        assert!(summarize.input_errors(&json!({"text": "hello"})).is_empty());
        let errors = summarize.input_errors(&json!({"text": 3, "extra": true}));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.pointer == "/text"));
    }

    #[test]
    fn the_compiled_in_contracts_are_the_folder() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".toml"))
            .collect();
        files.sort();
        let shipped: Vec<&str> = SHIPPED.iter().map(|(name, _)| *name).collect();
        assert_eq!(files, shipped, "add the new contract to SHIPPED");
        for (name, text) in SHIPPED {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), text);
        }
        let any = |_: &ProviderName| true;
        let shipped = Contracts::shipped(any).unwrap();
        assert_eq!(
            shipped.iter().count(),
            Contracts::load(&dir, any).unwrap().iter().count()
        );
    }

    #[test]
    fn prompts_render_strictly() {
        let contracts = shipped();
        let classify = contracts
            .get(&ContractRef::parse("classify@1").unwrap())
            .unwrap();
        let input =
            json!({"text": "charged twice", "labels": ["billing", "praise"], "max_labels": 1});
        let prompt = classify.render(&input).unwrap();
        assert!(
            prompt.contains(r#"From these labels: ["billing","praise"], pick at most 1"#),
            "{prompt}"
        );
        assert!(prompt.contains("Text:\ncharged twice"), "{prompt}");
        let err = classify
            .render(&json!({"text": "x", "labels": ["a"]}))
            .unwrap_err();
        assert!(err.contains("max_labels"), "{err}");
    }

    #[test]
    fn outputs_must_keep_the_schema_and_add_no_top_level_key() {
        let contracts = shipped();
        let summarize = contracts
            .get(&ContractRef::parse("summarize@1").unwrap())
            .unwrap();
        assert!(
            summarize
                .output_problems(&json!({"summary": "short"}))
                .is_empty()
        );
        assert_eq!(summarize.output_problems(&json!({"summary": ""})).len(), 1);
        assert_eq!(summarize.output_problems(&json!("prose")).len(), 1);
        let lenient = parse(
            r#"
            name = "x"
            version = 1
            prompt = "{{ text }}"
            temperature = 0.0
            max_output_tokens = 10
            providers = ["demo"]
            input_schema = { type = "object" }
            output_schema = { type = "object", properties = { a = { type = "string" } } }
        "#,
            &|_: &ProviderName| true,
        )
        .unwrap();
        let problems = lenient.output_problems(&json!({"a": "x", "b": 1}));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("\"b\""));
    }

    #[test]
    fn a_contract_naming_an_unconfigured_provider_is_refused() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts");
        let err = Contracts::load(&dir, |p| p.as_str() == "demo").unwrap_err();
        assert!(
            err.to_string()
                .contains("demo-backup is not a configured provider"),
            "{err}"
        );
    }

    #[test]
    fn a_sample_that_breaks_the_input_schema_is_refused() {
        let text = r#"
            name = "x"
            version = 1
            prompt = "{{ text }}"
            temperature = 0.0
            max_output_tokens = 10
            providers = ["demo"]
            input_schema = { type = "object", required = ["text"] }
            output_schema = { type = "object" }
            samples = [{ nottext = 1 }]
        "#;
        let err = parse(text, &|_: &ProviderName| true).unwrap_err();
        assert!(err.contains("samples[0]"), "{err}");
    }
}
