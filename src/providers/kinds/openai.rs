//! The `openai` kind: any OpenAI-compatible server, `POST {base_url}/chat/completions` with a JSON-schema response
//! format, a bearer key named by `api_key_env` (see [`crate::providers::keys`]), and
//! `Idempotency-Key: <job id>:<attempt>`. What each reply means is [`crate::providers::http::exchange`]'s, then
//! [`read_answer`]'s for a 2xx body.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{ClientParts, Connect, Kind, NoAws};
use crate::domain::CallReport;
use crate::providers::http::RequestDefaults;
use crate::providers::tokens::Encoding;
use crate::providers::{
    ATTEMPT_METADATA, HttpEndpoint, Lookup, Provider, ProviderEndpoint, ProviderOutcome,
    ProviderRequest, Reply, SYSTEM_PROMPT, TokenLimitField, failed, snippet, unread,
};

endpoint_settings!(
    /// An OpenAI-compatible endpoint: the keys every HTTP kind takes.
    OpenAiSettings
);

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

impl OpenAiSettings {
    /// The request's shape where the settings do not say: a reasoning model's budget goes in
    /// `max_completion_tokens`, and it is sent no temperature.
    fn defaults(&self) -> RequestDefaults {
        let reasoning = is_reasoning_model(&self.model);
        RequestDefaults {
            path: "chat/completions",
            token_limit_field: match reasoning {
                true => TokenLimitField::MaxCompletionTokens,
                false => TokenLimitField::MaxTokens,
            },
            sends_temperature: !reasoning,
        }
    }
}

impl Kind for OpenAiSettings {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn endpoint(&self) -> Option<&ProviderEndpoint> {
        Some(&self.0)
    }

    fn encoding(&self) -> Encoding {
        Encoding::of_openai_model(&self.model)
    }

    fn check(&self) -> Result<(), String> {
        self.0.check()
    }

    fn can_be_asked(&self) -> bool {
        self.store == Some(true)
    }
}

impl Connect for OpenAiSettings {
    fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws> {
        let endpoint = HttpEndpoint::new(&self.0, self.defaults(), parts.keys, parts.http);
        Ok(Arc::new(OpenAiProvider::new(endpoint, self.can_be_asked())))
    }
}

#[derive(Debug)]
pub struct OpenAiProvider {
    endpoint: HttpEndpoint,
    /// Whether each call is stored under the attempt's identity, to be looked up ([`Kind::can_be_asked`]).
    store: bool,
}

impl OpenAiProvider {
    pub fn new(endpoint: HttpEndpoint, store: bool) -> Self {
        Self { endpoint, store }
    }

    fn body(&self, request: &ProviderRequest) -> Value {
        let own = json!({
            "model": self.endpoint.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": request.prompt},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": request.contract.name(), "schema": request.output_schema},
            },
        });
        let mut body = self.endpoint.body(own, request);
        if self.store {
            body["store"] = json!(true);
            body["metadata"] = json!({ ATTEMPT_METADATA: request.idempotency_key });
        }
        body
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn call(&self, request: &ProviderRequest) -> Reply {
        let body = self.body(request);
        let bearer = |call: reqwest::RequestBuilder, key: &str| call.bearer_auth(key);
        (self.endpoint)
            .call(&request.idempotency_key, &body, bearer, read_answer)
            .await
    }

    /// The stored completion the call made under the attempt's identity: `GET …/chat/completions` filtered by its
    /// metadata (OpenAI's list of stored chat completions).
    async fn look_up(&self, request: &ProviderRequest) -> Lookup {
        let filter = format!("metadata[{ATTEMPT_METADATA}]");
        let query = [
            (filter.as_str(), request.idempotency_key.as_str()),
            ("limit", "1"),
        ];
        let bearer = |call: reqwest::RequestBuilder, key: &str| call.bearer_auth(key);
        self.endpoint.look_up(&query, bearer, read_stored).await
    }
}

/// A list of stored chat completions: the first one's answer, read as a call's, or none.
fn read_stored(text: &str) -> Lookup {
    let listed = serde_json::from_str::<Value>(text).ok();
    match listed.as_ref().and_then(|l| l["data"].as_array()) {
        Some(data) => match data.first() {
            Some(completion) => Lookup::Found(Box::new(read_answer(&completion.to_string()))),
            None => Lookup::NotFound,
        },
        None => Lookup::Failed(crate::domain::ErrorInfo::new(
            "bad_response",
            format!("not a list of chat completions: {}", unread(text)),
        )),
    }
}

/// The JSON output inside a chat completion (`choices[0].message.content`, itself JSON text), with the model and
/// token usage the provider reports.
fn read_answer(text: &str) -> Reply {
    let Ok(body) = serde_json::from_str::<Value>(text) else {
        return Reply::failed(
            "bad_response",
            format!("not a chat completion: {}", unread(text)),
        );
    };
    let usage = |path: &str| body.pointer(path).and_then(Value::as_u64);
    // `prompt_tokens` counts the cached ones too, `completion_tokens` the reasoning ones.
    let report = CallReport {
        model: body["model"].as_str().map(str::to_owned),
        input_tokens: usage("/usage/prompt_tokens"),
        output_tokens: usage("/usage/completion_tokens"),
        cached_input_tokens: usage("/usage/prompt_tokens_details/cached_tokens"),
        reasoning_tokens: usage("/usage/completion_tokens_details/reasoning_tokens"),
        ..CallReport::default()
    };
    let choice = &body["choices"][0];
    let outcome = if let Some(refusal) = choice.pointer("/message/refusal").and_then(Value::as_str)
    {
        failed(
            "model_refused",
            format!("the model refused: {}", snippet(refusal)),
        )
    } else if choice["finish_reason"] == "length" {
        failed(
            "output_truncated",
            "the answer was cut off at the output token budget",
        )
    } else if let Some(content) = choice.pointer("/message/content").and_then(Value::as_str) {
        match serde_json::from_str(content) {
            Ok(output) => ProviderOutcome::Answered(output),
            Err(_) => failed(
                "output_not_json",
                format!("the answer is not JSON: {}", snippet(content)),
            ),
        }
    } else {
        failed(
            "bad_response",
            format!("not a chat completion: {}", unread(text)),
        )
    };
    Reply::new(outcome, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::failure_code as code;

    #[test]
    fn answers_are_read_from_the_first_choice_with_model_and_usage() {
        let body = json!({
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "{\"summary\": \"s\"}"}}],
            "usage": {"prompt_tokens": 31, "completion_tokens": 7},
        });
        let reply = read_answer(&body.to_string());
        assert_eq!(
            reply.outcome,
            ProviderOutcome::Answered(json!({"summary": "s"}))
        );
        assert_eq!(
            reply.report,
            CallReport {
                model: Some("gpt-4o-mini-2024-07-18".into()),
                input_tokens: Some(31),
                output_tokens: Some(7),
                ..CallReport::default()
            }
        );
    }

    #[test]
    fn unusable_answers_fail_with_their_own_code() {
        let prose = json!({"choices": [{"message": {"content": "Here is a summary: s"}}]});
        assert_eq!(code(&read_answer(&prose.to_string())), "output_not_json");
        let cut =
            json!({"choices": [{"finish_reason": "length", "message": {"content": "{\"summ"}}]});
        assert_eq!(code(&read_answer(&cut.to_string())), "output_truncated");
        let refusal =
            json!({"choices": [{"message": {"content": null, "refusal": "I can't help"}}]});
        assert_eq!(code(&read_answer(&refusal.to_string())), "model_refused");
        assert_eq!(code(&read_answer("<html>")), "bad_response");
        assert_eq!(code(&read_answer("{}")), "bad_response");
    }
}
