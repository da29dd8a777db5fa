//! The `bedrock` kind: Amazon Bedrock's Converse API (`POST /model/{model}/converse` on `bedrock-runtime`) through the AWS
//! SDK, signed (SigV4) with the process's AWS credentials — on Lambda, the function's execution role; no key.
//! Structured output comes through a forced tool, as with [`super::anthropic`]: one tool, `answer`, whose input
//! schema is the contract's output schema, and the answer is that tool call's input.
//!
//! The SDK's own retries and timeouts are off: a retry is a new attempt (never a hidden loop that may pay twice),
//! and the worker bounds every call with the provider's timeout. What each answer means (invariant 5):
//!
//! | answer | code | meaning |
//! |---|---|---|
//! | `ThrottlingException` (429), `ServiceUnavailableException` (503), `ModelNotReadyException` | `rate_limited`, `provider_unavailable` | not done: retried as a new attempt |
//! | no connection, no credentials (nothing was sent) | `connection_failed` | not done: retried |
//! | a connection lost after sending, a timeout, `ModelTimeoutException` (408), a gateway's 502, 504, 524 | `connection_lost`, `gateway_timeout` | may be done: `unknown` |
//! | an answer cut off or unreadable (the SDK's `ResponseError`: the request went out) | `connection_lost` | may be done: `unknown` |
//! | `InternalServerException` (500), `ModelErrorException` (424): the model may have run | `provider_error` | may be done: `unknown` |
//! | another 5xx | `provider_error` | definite |
//! | `AccessDeniedException` (403) | `provider_refused` | definite; the deployment's trouble, counted by the breaker |
//! | `ValidationException` (400), `ResourceNotFoundException` (404) | `provider_refused` | definite, the request's |
//! | stop reason `max_tokens`, `model_context_window_exceeded` | `output_truncated`, `context_window_exceeded` | definite |
//! | stop reason `guardrail_intervened`, `content_filtered` | `model_refused` | definite, the input's |

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use aws_config::SdkConfig;
use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::config::{Region, StalledStreamProtectionConfig};
use aws_sdk_bedrockruntime::error::{DisplayErrorContext, SdkError};
use aws_sdk_bedrockruntime::operation::converse::{ConverseError, ConverseOutput};
use aws_sdk_bedrockruntime::types::{
    ContentBlock, ConversationRole, InferenceConfiguration, Message, SpecificToolChoice,
    StopReason, SystemContentBlock, Tool, ToolChoice, ToolConfiguration, ToolInputSchema,
    ToolSpecification,
};
use aws_smithy_types::retry::RetryConfig;
use aws_smithy_types::timeout::TimeoutConfig;
use aws_smithy_types::{Document, Number};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{ClientParts, Connect, Kind, NoAws};
use crate::domain::{CallReport, ErrorInfo};
use crate::providers::http::{Meaning, meaning};
use crate::providers::{
    Provider, ProviderOutcome, ProviderRequest, Reply, SYSTEM_PROMPT, failed, snippet,
    transport_error,
};

/// The one tool the model is made to call.
const TOOL: &str = "answer";

/// A model on Amazon Bedrock.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BedrockSettings {
    /// A model id (`anthropic.claude-haiku-4-5-20251001-v1:0`), a cross-region inference profile id
    /// (`us.anthropic.claude-haiku-4-5-20251001-v1:0`, `global.…`), or the ARN of either.
    pub model: String,
    /// The region whose Bedrock endpoint is called; default: the process's (`AWS_REGION`).
    pub region: Option<String>,
    /// Another endpoint than the region's public one: a VPC interface endpoint
    /// (`https://vpce-….bedrock-runtime.us-east-1.vpce.amazonaws.com`) or a gateway. Default: the region's, or
    /// `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` where that is set.
    pub endpoint_url: Option<String>,
    /// Whether the contract's temperature is sent (`inferenceConfig.temperature`). Default: yes.
    pub send_temperature: Option<bool>,
    /// The model's own fields, sent as they are in `additionalModelRequestFields` (`{ top_k = 50 }`).
    #[serde(default)]
    pub additional_model_request_fields: Map<String, Value>,
}

/// The prefixes of Bedrock's cross-region inference profiles, before the model id they route.
const INFERENCE_PROFILE_GEOGRAPHIES: [&str; 8] =
    ["us", "us-gov", "eu", "apac", "jp", "au", "ca", "global"];

impl Kind for BedrockSettings {
    fn name(&self) -> &'static str {
        "bedrock"
    }

    fn model(&self) -> Option<&str> {
        Some(&self.model)
    }

    /// The endpoint it names, else the region's.
    fn address(&self) -> Option<String> {
        Some(self.endpoint_url.clone().unwrap_or_else(|| {
            let region = self.region.as_deref().unwrap_or("the process's region");
            format!("bedrock-runtime ({region})")
        }))
    }

    fn identity(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("region", json!(self.region)),
            ("base_url", json!(self.endpoint_url)),
            (
                "request",
                json!({
                    "send_temperature": self.send_temperature,
                    "additional_model_request_fields": self.additional_model_request_fields,
                }),
            ),
        ]
    }

    fn signs_with_aws(&self) -> bool {
        true
    }

    /// What `bedrock:InvokeModel` must be granted on for this model, with `region` where the settings name none
    /// and `*` for the account: the model itself, or an inference profile and its model in every region the
    /// profile routes to. An ARN in the settings is granted as it is.
    fn invoke_arns(&self, region: &str) -> Vec<String> {
        let region = self.region.as_deref().unwrap_or(region);
        if self.model.starts_with("arn:") {
            return vec![self.model.clone()];
        }
        let routed = (self.model.split_once('.'))
            .filter(|(geography, _)| INFERENCE_PROFILE_GEOGRAPHIES.contains(geography));
        match routed {
            Some((_, model)) => vec![
                format!(
                    "arn:aws:bedrock:{region}:*:inference-profile/{}",
                    self.model
                ),
                format!("arn:aws:bedrock:*::foundation-model/{model}"),
            ],
            None => vec![format!(
                "arn:aws:bedrock:{region}::foundation-model/{}",
                self.model
            )],
        }
    }

    /// The checks serde cannot make.
    fn check(&self) -> Result<(), String> {
        if self.model.trim().is_empty() {
            return Err("model: name a Bedrock model id, inference profile id or ARN".into());
        }
        let is_region = |r: &str| {
            !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if let Some(region) = self.region.as_deref().filter(|r| !is_region(r)) {
            return Err(format!(
                "region: {region:?} is not an AWS region (like us-east-1)"
            ));
        }
        if let Some(url) = &self.endpoint_url {
            reqwest::Url::parse(url).map_err(|e| format!("endpoint_url: {e}"))?;
        }
        Ok(())
    }
}

impl Connect for BedrockSettings {
    fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws> {
        let aws = parts.keys.aws().ok_or(NoAws)?;
        Ok(Arc::new(BedrockProvider::new(self, aws)))
    }
}

#[derive(Debug)]
pub struct BedrockProvider {
    client: Client,
    model: String,
    send_temperature: bool,
    fields: Option<Document>,
}

impl BedrockProvider {
    /// A client of `settings`' model with `aws`'s credentials and endpoint (`AWS_ENDPOINT_URL_BEDROCK_RUNTIME`
    /// where set), in the settings' region if they name one.
    pub fn new(settings: &BedrockSettings, aws: &SdkConfig) -> Self {
        let mut config = aws_sdk_bedrockruntime::config::Builder::from(aws)
            .retry_config(RetryConfig::disabled())
            .timeout_config(TimeoutConfig::disabled())
            .stalled_stream_protection(StalledStreamProtectionConfig::disabled());
        if let Some(region) = &settings.region {
            config = config.region(Region::new(region.clone()));
        }
        if let Some(url) = &settings.endpoint_url {
            config = config.endpoint_url(url);
        }
        let fields = &settings.additional_model_request_fields;
        Self {
            client: Client::from_conf(config.build()),
            model: settings.model.clone(),
            send_temperature: settings.send_temperature.unwrap_or(true),
            fields: (!fields.is_empty()).then(|| document(&Value::Object(fields.clone()))),
        }
    }
}

#[async_trait]
impl Provider for BedrockProvider {
    async fn call(&self, request: &ProviderRequest) -> Reply {
        let message = Message::builder()
            .role(ConversationRole::User)
            .content(ContentBlock::Text(request.prompt.clone()))
            .build()
            .expect("a message with its role and content");
        let tool = ToolSpecification::builder()
            .name(TOOL)
            .description(format!("Give the answer for {}.", request.contract))
            .input_schema(ToolInputSchema::Json(document(&request.output_schema)))
            .build()
            .expect("a tool with its name and schema");
        let choice = SpecificToolChoice::builder()
            .name(TOOL)
            .build()
            .expect("a choice with its name");
        let tools = ToolConfiguration::builder()
            .tools(Tool::ToolSpec(tool))
            .tool_choice(ToolChoice::Tool(choice))
            .build()
            .expect("a tool configuration with its tool");
        let budget = i32::try_from(request.max_output_tokens).unwrap_or(i32::MAX);
        let mut inference = InferenceConfiguration::builder().max_tokens(budget);
        if self.send_temperature {
            inference = inference.temperature(request.temperature as f32);
        }
        let sent = self
            .client
            .converse()
            .model_id(&self.model)
            .system(SystemContentBlock::Text(SYSTEM_PROMPT.to_owned()))
            .messages(message)
            .inference_config(inference.build())
            .tool_config(tools)
            .set_additional_model_request_fields(self.fields.clone())
            // The attempt's identity, in the invocation log (where the deployment keeps one): Converse keeps no
            // call to be asked about.
            .request_metadata(crate::providers::ATTEMPT_METADATA, &request.idempotency_key)
            .send()
            .await;
        match sent {
            Ok(output) => read_answer(&output, &self.model),
            Err(e) => refusal(e),
        }
    }
}

/// The `answer` tool call's input, with the usage Bedrock reports (the model is the configured one: Converse does
/// not name it).
fn read_answer(output: &ConverseOutput, model: &str) -> Reply {
    let count = |n: i32| u64::try_from(n).unwrap_or_default();
    let usage = output.usage();
    let cached = usage.and_then(|u| u.cache_read_input_tokens()).map(count);
    // `inputTokens` leaves out what was read from the cache and what was written to it: the prompt is all three.
    let report = CallReport {
        model: Some(model.to_owned()),
        input_tokens: usage.map(|u| {
            count(u.input_tokens())
                + cached.unwrap_or(0)
                + u.cache_write_input_tokens().map_or(0, count)
        }),
        output_tokens: usage.map(|u| count(u.output_tokens())),
        cached_input_tokens: cached,
        ..CallReport::default()
    };
    let blocks = match output.output() {
        Some(aws_sdk_bedrockruntime::types::ConverseOutput::Message(message)) => message.content(),
        _ => &[],
    };
    let tool_input = blocks.iter().find_map(|block| match block {
        ContentBlock::ToolUse(call) if call.name() == TOOL => Some(value(call.input())),
        _ => None,
    });
    let outcome = match (output.stop_reason(), tool_input) {
        (StopReason::MaxTokens, _) => failed(
            "output_truncated",
            "the answer was cut off at the output token budget",
        ),
        (StopReason::ModelContextWindowExceeded, _) => failed(
            "context_window_exceeded",
            "the prompt and the output budget do not fit in the model's context window",
        ),
        (reason @ (StopReason::GuardrailIntervened | StopReason::ContentFiltered), _) => failed(
            "model_refused",
            format!("the model did not answer: {}", reason.as_str()),
        ),
        (_, Some(input)) => ProviderOutcome::Answered(input),
        (reason, None) => {
            let prose: String = blocks
                .iter()
                .filter_map(|b| b.as_text().ok().map(String::as_str))
                .collect();
            failed(
                "output_not_json",
                format!(
                    "the answer ({}) is not a call of the {TOOL} tool: {}",
                    reason.as_str(),
                    snippet(&prose)
                ),
            )
        }
    };
    Reply::new(outcome, report)
}

/// What an error of the call means about the work (the table in the module's doc).
fn refusal(error: SdkError<ConverseError, aws_smithy_runtime_api::http::Response>) -> Reply {
    let wire = |code: &str| transport_error(code, &DisplayErrorContext(&error));
    match &error {
        SdkError::ConstructionFailure(_) => {
            ProviderOutcome::Failed(wire("connection_failed")).into()
        }
        SdkError::DispatchFailure(failure)
            if failure.as_connector_error().is_some_and(nothing_sent) =>
        {
            ProviderOutcome::Failed(wire("connection_failed")).into()
        }
        SdkError::ServiceError(service) => {
            let e = service.err();
            // The service's own code and message: what Bedrock said, not where it was reached.
            let message = format!(
                "{}: {}",
                e.meta().code().unwrap_or("an AWS error"),
                e.meta().message().unwrap_or_default()
            );
            let raw = service.raw();
            let status = raw.status().as_u16();
            let lost = |code: &str| {
                let message = format!("HTTP {status}: {message}");
                Reply::from(ProviderOutcome::Lost(ErrorInfo::new(code, message)))
            };
            let code = match e {
                ConverseError::ModelTimeoutException(_) => return lost("gateway_timeout"),
                // The model ran, or may have: its work may be billed.
                ConverseError::InternalServerException(_)
                | ConverseError::ModelErrorException(_) => return lost("provider_error"),
                ConverseError::ThrottlingException(_) => "rate_limited",
                ConverseError::ServiceUnavailableException(_)
                | ConverseError::ModelNotReadyException(_) => "provider_unavailable",
                // The rest by its status, as for the HTTP kinds (a gateway in front of Bedrock, a VPC endpoint or
                // a proxy, that stopped waiting is one).
                _ => match meaning(status) {
                    Meaning::MayBeDone(code) => return lost(code),
                    Meaning::Failed(code) => code,
                },
            };
            let wait_ms = crate::providers::retry_wait_ms(raw.headers().get("retry-after"), None);
            crate::providers::refused(code, status, &message, wait_ms)
        }
        // Anything after the request went out may have been done, whatever the SDK calls it: a timeout, a
        // connection lost, an answer cut off or unreadable (`ResponseError`).
        _ => ProviderOutcome::Lost(wire("connection_lost")).into(),
    }
}

/// Whether a dispatch failed before anything was sent: the connection was never made (refused, unreachable, a
/// name that does not resolve, a TLS handshake that failed).
fn nothing_sent(failure: &aws_sdk_bedrockruntime::error::ConnectorError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(failure);
    while let Some(error) = source {
        if error
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(hyper_util::client::legacy::Error::is_connect)
        {
            return true;
        }
        source = error.source();
    }
    false
}

/// A JSON value as the SDK's document.
fn document(value: &Value) -> Document {
    match value {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Number::PosInt(u),
            (None, Some(i)) => Number::NegInt(i),
            _ => Number::Float(n.as_f64().unwrap_or_default()),
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(items) => Document::Array(items.iter().map(document).collect()),
        Value::Object(members) => Document::Object(
            members
                .iter()
                .map(|(k, v)| (k.clone(), document(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

/// The SDK's document as a JSON value (a float JSON cannot hold is `null`).
fn value(document: &Document) -> Value {
    match document {
        Document::Null => Value::Null,
        Document::Bool(b) => Value::Bool(*b),
        Document::Number(Number::PosInt(u)) => Value::from(*u),
        Document::Number(Number::NegInt(i)) => Value::from(*i),
        Document::Number(Number::Float(f)) => Value::from(*f),
        Document::String(s) => Value::String(s.clone()),
        Document::Array(items) => Value::Array(items.iter().map(value).collect()),
        Document::Object(members) => {
            Value::Object(members.iter().map(|(k, v)| (k.clone(), value(v))).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_document_and_its_json_are_one_value() {
        let original = json!({"a": [1, -2, 2.5, "x", null, true], "b": {"c": {}}, "d": 18446744073709551615u64});
        assert_eq!(value(&document(&original)), original);
    }

    #[test]
    fn an_inference_profile_is_granted_with_the_model_in_every_region_it_routes_to() {
        let settings = |model: &str, region: Option<&str>| BedrockSettings {
            model: model.into(),
            region: region.map(str::to_owned),
            ..BedrockSettings::default()
        };
        assert_eq!(
            settings("us.anthropic.claude-haiku-4-5-20251001-v1:0", None).invoke_arns("us-east-1"),
            [
                "arn:aws:bedrock:us-east-1:*:inference-profile/us.anthropic.claude-haiku-4-5-20251001-v1:0",
                "arn:aws:bedrock:*::foundation-model/anthropic.claude-haiku-4-5-20251001-v1:0",
            ]
        );
        assert_eq!(
            settings("amazon.nova-pro-v1:0", Some("eu-west-1")).invoke_arns("us-east-1"),
            ["arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-pro-v1:0"]
        );
        let arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc";
        assert_eq!(settings(arn, None).invoke_arns("us-east-1"), [arn]);
        assert!(settings(" ", None).check().is_err());
        assert!(settings("m", Some("US East")).check().is_err());
        assert!(settings("m", Some("ap-southeast-2")).check().is_ok());
    }
}
