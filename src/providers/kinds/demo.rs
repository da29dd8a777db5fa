//! The built-in `demo` kind: in process, deterministic, its behaviour set in the config. It answers with an output
//! made from the contract's output schema and the input, so it keeps any contract.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{ClientParts, Connect, Kind, NoAws};
use crate::clock::Clock;
use crate::domain::{CallReport, ErrorInfo};
use crate::providers::{Provider, ProviderOutcome, ProviderRequest, Reply};

/// The demo provider: what it does and how fast.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoSettings {
    /// What the provider does.
    pub behavior: DemoBehavior,
    /// How long it takes to answer (or to fail).
    pub delay_ms: u64,
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

impl Kind for DemoSettings {
    fn name(&self) -> &'static str {
        "demo"
    }

    /// Unbounded, unless the config names one.
    fn default_context_window(&self) -> Option<u64> {
        None
    }

    /// Its behaviour and delay are its "model".
    fn identity(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("behavior", json!(self.behavior.as_str())),
            ("delay_ms", json!(self.delay_ms)),
        ]
    }
}

impl Connect for DemoSettings {
    fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws> {
        Ok(Arc::new(DemoProvider::new(self, parts.clock.clone())))
    }
}

#[derive(Debug)]
pub struct DemoProvider {
    behavior: DemoBehavior,
    delay: chrono::Duration,
    clock: Arc<dyn Clock>,
}

impl DemoProvider {
    pub fn new(config: &DemoSettings, clock: Arc<dyn Clock>) -> Self {
        Self {
            behavior: config.behavior,
            delay: chrono::Duration::milliseconds(config.delay_ms as i64),
            clock,
        }
    }
}

#[async_trait]
impl Provider for DemoProvider {
    async fn call(&self, request: &ProviderRequest) -> Reply {
        self.clock.sleep(self.delay).await;
        let output = answer(&request.output_schema, &request.input);
        let outcome = match self.behavior {
            DemoBehavior::Answer => ProviderOutcome::Answered(output),
            DemoBehavior::Fail => ProviderOutcome::Failed(ErrorInfo::new(
                "provider_error",
                "the demo provider is configured to fail",
            )),
            DemoBehavior::Hang => std::future::pending().await,
            DemoBehavior::ExtraKey => {
                let mut output = output;
                if let Some(fields) = output.as_object_mut() {
                    fields.insert(
                        "note".into(),
                        json!("an extra key the contract does not have"),
                    );
                }
                ProviderOutcome::Answered(output)
            }
        };
        // Usage as a model would report it, a token for every four bytes (an average), for an answer only: a
        // refusal says no work was done.
        let tokens = |bytes: usize| Some(bytes.div_ceil(4) as u64);
        let (input_tokens, output_tokens) = match &outcome {
            ProviderOutcome::Answered(output) => (
                tokens(request.prompt.len()),
                tokens(output.to_string().len()),
            ),
            _ => (None, None),
        };
        Reply::new(
            outcome,
            CallReport {
                model: Some(format!("demo/{}", self.behavior.as_str())),
                input_tokens,
                output_tokens,
                ..CallReport::default()
            },
        )
    }
}

/// An output that keeps `schema`: strings are the first sentence of the input's text, arrays take the first item
/// of the input field of the same name, numbers are their minimum (or 0).
fn answer(schema: &Value, input: &Value) -> Value {
    answer_field(schema, input, None)
}

fn answer_field(schema: &Value, input: &Value, name: Option<&str>) -> Value {
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let fields: Map<String, Value> = properties
                .into_iter()
                .flatten()
                .map(|(key, sub)| (key.clone(), answer_field(sub, input, Some(key))))
                .collect();
            Value::Object(fields)
        }
        Some("array") => {
            let same = name.and_then(|n| input.get(n)).and_then(Value::as_array);
            Value::Array(same.into_iter().flatten().take(1).cloned().collect())
        }
        Some("integer" | "number") => schema.get("minimum").cloned().unwrap_or(json!(0)),
        Some("boolean") => json!(false),
        _ => json!(first_sentence(input)),
    }
}

fn first_sentence(input: &Value) -> String {
    let text = input
        .get("text")
        .and_then(Value::as_str)
        .unwrap_or("demo answer");
    let end = text.find(". ").map_or(text.len(), |i| i + 1);
    text[..end].chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_answers_keep_the_shipped_output_schemas() {
        let summary_schema =
            json!({"type": "object", "properties": {"summary": {"type": "string"}}});
        let input = json!({"text": "First things first. Then the rest."});
        assert_eq!(
            answer(&summary_schema, &input),
            json!({"summary": "First things first."})
        );
        let labels_schema = json!({"type": "object", "properties": {"labels": {"type": "array"}}});
        let input = json!({"text": "x", "labels": ["billing", "praise"]});
        assert_eq!(
            answer(&labels_schema, &input),
            json!({"labels": ["billing"]})
        );
    }
}
