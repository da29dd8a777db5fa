//! The `anthropic` kind: the Messages API, `POST {base_url}/messages`. Structured output comes through a forced
//! tool: one tool, `answer`, whose `input_schema` is the contract's output schema, and `tool_choice` naming it; the
//! answer is that tool call's `input`. The key named by `api_key_env` (see [`crate::providers::keys`]) goes in
//! `x-api-key`. What each reply means is [`crate::providers::http::exchange`]'s, then [`read_answer`]'s for a 2xx
//! body.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{ClientParts, Connect, Kind, NoAws};
use crate::domain::CallReport;
use crate::providers::http::RequestDefaults;
use crate::providers::{
    HttpEndpoint, Provider, ProviderEndpoint, ProviderOutcome, ProviderRequest, Reply,
    SYSTEM_PROMPT, TokenLimitField, failed, snippet, unread,
};

endpoint_settings!(
    /// An Anthropic endpoint: the keys every HTTP kind takes (but `max_completion_tokens` and `reasoning_effort`,
    /// which are OpenAI's).
    AnthropicSettings
);

impl Kind for AnthropicSettings {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn endpoint(&self) -> Option<&ProviderEndpoint> {
        Some(&self.0)
    }

    fn check(&self) -> Result<(), String> {
        self.0.check()?;
        if (self.token_limit_field).is_some_and(|f| f != TokenLimitField::MaxTokens) {
            return Err("token_limit_field: anthropic takes max_tokens only".into());
        }
        if self.reasoning_effort.is_some()
            || self.store.is_some()
            || self.api.is_some()
            || self.background.is_some()
        {
            return Err("reasoning_effort, store, api and background are openai keys".into());
        }
        Ok(())
    }
}

impl Connect for AnthropicSettings {
    fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws> {
        let defaults = RequestDefaults {
            path: "messages",
            token_limit_field: TokenLimitField::MaxTokens,
            sends_temperature: true,
        };
        let endpoint = HttpEndpoint::new(&self.0, defaults, parts.keys, parts.http);
        Ok(Arc::new(AnthropicProvider::new(endpoint)))
    }
}

/// The API version this client speaks.
const API_VERSION: &str = "2023-06-01";
/// The one tool the model is made to call.
const TOOL: &str = "answer";

#[derive(Debug)]
pub struct AnthropicProvider {
    endpoint: HttpEndpoint,
}

impl AnthropicProvider {
    pub fn new(endpoint: HttpEndpoint) -> Self {
        let endpoint = endpoint.with_default_header("anthropic-version", API_VERSION);
        Self { endpoint }
    }

    fn body(&self, request: &ProviderRequest) -> Value {
        let own = json!({
            "model": self.endpoint.model,
            "system": SYSTEM_PROMPT,
            "messages": [{"role": "user", "content": request.prompt}],
            "tools": [{
                "name": TOOL,
                "description": format!("Give the answer for {}.", request.contract),
                "input_schema": request.output_schema,
            }],
            "tool_choice": {"type": "tool", "name": TOOL},
        });
        self.endpoint.body(own, request)
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    async fn call(&self, request: &ProviderRequest) -> Reply {
        let body = self.body(request);
        let x_api_key = |call: reqwest::RequestBuilder, key: &str| call.header("x-api-key", key);
        (self.endpoint)
            .call(&request.idempotency_key, &body, x_api_key, read_answer)
            .await
    }
}

/// The `input` of the `answer` tool call in a message, with the model and token usage the provider reports.
fn read_answer(text: &str) -> Reply {
    let Ok(body) = serde_json::from_str::<Value>(text) else {
        return Reply::failed("bad_response", format!("not a message: {}", unread(text)));
    };
    let usage = |field: &str| body["usage"][field].as_u64();
    let cached = usage("cache_read_input_tokens");
    // `input_tokens` leaves out what was read from the cache and what was written to it: the prompt is all three.
    let report = CallReport {
        model: body["model"].as_str().map(str::to_owned),
        input_tokens: usage("input_tokens").map(|fresh| {
            fresh + cached.unwrap_or(0) + usage("cache_creation_input_tokens").unwrap_or(0)
        }),
        output_tokens: usage("output_tokens"),
        cached_input_tokens: cached,
        ..CallReport::default()
    };
    let blocks = body["content"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let tool_input = blocks
        .iter()
        .find(|b| b["type"] == "tool_use" && b["name"] == TOOL)
        .map(|b| b["input"].clone());
    let outcome = match tool_input {
        _ if body["stop_reason"] == "max_tokens" => failed(
            "output_truncated",
            "the answer was cut off at the output token budget",
        ),
        Some(input) => ProviderOutcome::Answered(input),
        None if body["content"].is_array() => {
            let prose: String = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
            failed(
                "output_not_json",
                format!(
                    "the answer is prose, not a call of the {TOOL} tool: {}",
                    snippet(&prose)
                ),
            )
        }
        None => failed("bad_response", format!("not a message: {}", unread(text))),
    };
    Reply::new(outcome, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::failure_code as code;

    #[test]
    fn the_answer_is_the_forced_tool_calls_input() {
        let body = json!({
            "type": "message", "model": "claude-test-1",
            "content": [
                {"type": "text", "text": "Calling the tool."},
                {"type": "tool_use", "id": "toolu_1", "name": "answer", "input": {"summary": "s"}},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 40, "output_tokens": 12},
        });
        let reply = read_answer(&body.to_string());
        assert_eq!(
            reply.outcome,
            ProviderOutcome::Answered(json!({"summary": "s"}))
        );
        assert_eq!(reply.report.model.as_deref(), Some("claude-test-1"));
        assert_eq!(
            (reply.report.input_tokens, reply.report.output_tokens),
            (Some(40), Some(12))
        );
    }

    #[test]
    fn prose_cut_offs_and_garbage_fail_with_their_own_code() {
        let prose = json!({"content": [{"type": "text", "text": "A summary: s"}], "stop_reason": "end_turn"});
        assert_eq!(code(&read_answer(&prose.to_string())), "output_not_json");
        let cut = json!({"content": [{"type": "tool_use", "name": "answer", "input": {}}], "stop_reason": "max_tokens"});
        assert_eq!(code(&read_answer(&cut.to_string())), "output_truncated");
        assert_eq!(code(&read_answer("{}")), "bad_response");
        assert_eq!(code(&read_answer("<html>")), "bad_response");
    }
}
