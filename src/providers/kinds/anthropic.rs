//! The `anthropic` kind: the Messages API, `POST {base_url}/messages`. Structured output comes through a forced
//! tool: one tool, `answer`, whose `input_schema` is the contract's output schema, and `tool_choice` naming it; the
//! answer is that tool call's `input`. The key named by `api_key_env` (see [`crate::providers::keys`]) goes in
//! `x-api-key`. What each reply means is [`crate::providers::http::exchange`]'s, then [`read_answer`]'s for a 2xx
//! body. With `batch = true`, each call goes through the Message Batches API ([`BatchApi`]).

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{ClientParts, Connect, Kind, NoAws};
use crate::clock::Clock;
use crate::domain::{CallReport, ErrorInfo, Timestamp};
use crate::providers::batch::{self, BatchApi, Ours, Page};
use crate::providers::http::RequestDefaults;
use crate::providers::{
    Asked, CallName, HttpEndpoint, Lookup, Provider, ProviderEndpoint, ProviderOutcome,
    ProviderRequest, Reply, SYSTEM_PROMPT, TokenLimitField, failed, snippet, unread,
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

    /// Batches are read by their id, or found by listing.
    fn can_be_asked(&self) -> bool {
        self.in_batch()
    }

    fn in_batch(&self) -> bool {
        self.batch == Some(true)
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
        let endpoint = endpoint.with_default_header("anthropic-version", API_VERSION);
        Ok(Arc::new(AnthropicProvider {
            endpoint,
            batch: self.in_batch(),
            clock: parts.clock.clone(),
        }))
    }
}

/// The API version this client speaks.
const API_VERSION: &str = "2023-06-01";
/// The one tool the model is made to call.
const TOOL: &str = "answer";

#[derive(Debug)]
pub struct AnthropicProvider {
    endpoint: HttpEndpoint,
    /// Whether its calls go through the Message Batches API.
    batch: bool,
    /// What a batch's reads wait on.
    clock: Arc<dyn Clock>,
}

/// The key, as Anthropic takes it.
fn x_api_key(call: reqwest::RequestBuilder, key: &str) -> reqwest::RequestBuilder {
    call.header("x-api-key", key)
}

impl AnthropicProvider {
    /// The results of the ended `batch` (JSONL), read at its `results_url` if that is on `base_url`'s origin (the
    /// key goes nowhere else), else at `…/messages/batches/{id}/results`.
    async fn results(&self, batch: &Value) -> Result<String, Reply> {
        let id = batch["id"].as_str().unwrap_or_default();
        let given = (batch["results_url"].as_str()).and_then(|url| reqwest::Url::parse(url).ok());
        let url = match given {
            Some(url) if url.origin() == self.endpoint.url.origin() => url,
            _ => (self.endpoint).at(&["messages", "batches", id, "results"]),
        };
        (self.endpoint)
            .fetch(self.endpoint.http.get(url), x_api_key)
            .await
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
        self.call_named(request, &CallName::new()).await
    }

    async fn call_named(&self, request: &ProviderRequest, named: &CallName) -> Reply {
        if self.batch {
            let reply = batch::call(self, self.clock.as_ref(), request, named).await;
            return self.endpoint.scrubbed(reply);
        }
        let body = self.body(request);
        (self.endpoint)
            .call(&request.idempotency_key, &body, x_api_key, read_answer)
            .await
    }

    /// A batch: [`batch::look_up`]. A call made directly leaves nothing to ask about.
    async fn look_up(&self, request: &ProviderRequest, asked: Asked<'_>) -> Lookup {
        match self.batch {
            true => {
                let looked = batch::look_up(self, request, asked).await;
                self.endpoint.scrubbed_lookup(looked)
            }
            false => Lookup::Failed(ErrorInfo::new(
                "not_asked",
                "this provider cannot be asked about its calls",
            )),
        }
    }
}

/// Anthropic's Message Batches: a batch of the one request created (`POST …/messages/batches`), read
/// (`GET …/messages/batches/{id}`) and listed (`GET …/messages/batches`, newest first), its result read from its
/// results (`GET …/messages/batches/{id}/results`, JSONL) once it has ended. A batch keeps no metadata: one listed is
/// told to be a call's by its results, so a batch not yet ended that holds one request may be it.
#[async_trait]
impl BatchApi for AnthropicProvider {
    async fn submit(&self, request: &ProviderRequest, custom_id: &str) -> Result<String, Reply> {
        let create = json!({"requests": [{"custom_id": custom_id, "params": self.body(request)}]});
        let url = self.endpoint.at(&["messages", "batches"]);
        let sent = (self.endpoint).post(url, &request.idempotency_key, &create);
        let text = self.endpoint.fetch(sent, x_api_key).await?;
        batch::batch_id(&text).ok_or_else(|| batch::unnamed(&text))
    }

    async fn read(&self, id: &str) -> Result<Value, Reply> {
        let url = self.endpoint.at(&["messages", "batches", id]);
        let batch = self.endpoint.get_json(url, x_api_key, "a batch").await?;
        match batch["id"] == id {
            true => Ok(batch),
            false => Err(Reply::failed(
                "bad_response",
                format!("not the batch asked for: {}", unread(&batch.to_string())),
            )),
        }
    }

    fn ended(&self, batch: &Value) -> bool {
        batch["processing_status"] == "ended"
    }

    async fn result(&self, batch: &Value, custom_id: &str) -> Lookup {
        let results = match self.results(batch).await {
            Ok(results) => results,
            Err(reply) => return Lookup::unanswered(reply),
        };
        let Some(line) = batch::line_of(&results, custom_id) else {
            return batch::no_result();
        };
        let result = &line["result"];
        match result["type"].as_str() {
            Some("succeeded") => {
                Lookup::Found(Box::new(read_answer(&result["message"].to_string())))
            }
            Some("canceled") => Lookup::Ended,
            Some("expired") => batch::not_run(
                "batch_expired",
                "the batch expired before the request was run",
            ),
            _ => batch::not_run(
                "provider_refused",
                format!(
                    "the batch did not run the request: {}",
                    snippet(&result["error"].to_string())
                ),
            ),
        }
    }

    async fn page(&self, after: Option<&str>) -> Result<Page, Reply> {
        let mut url = self.endpoint.at(&["messages", "batches"]);
        url.query_pairs_mut().append_pair("limit", "100");
        if let Some(after) = after {
            url.query_pairs_mut().append_pair("after_id", after);
        }
        let listed = (self.endpoint.get_json(url, x_api_key, "a list of batches")).await?;
        Page::of(&listed).map_err(|error| ProviderOutcome::Failed(error).into())
    }

    fn created_at(&self, batch: &Value) -> Option<Timestamp> {
        let created = chrono::DateTime::parse_from_rfc3339(batch["created_at"].as_str()?).ok()?;
        Some(created.to_utc())
    }

    async fn is_ours(
        &self,
        batch: &Value,
        _request: &ProviderRequest,
        custom_id: &str,
    ) -> Result<Ours, Reply> {
        let counts = batch["request_counts"].as_object();
        let requests: u64 = counts
            .into_iter()
            .flatten()
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        if requests != 1 {
            return Ok(Ours::No);
        }
        if !self.ended(batch) {
            return Ok(Ours::Maybe);
        }
        let results = self.results(batch).await?;
        Ok(match batch::line_of(&results, custom_id) {
            Some(_) => Ours::Yes,
            None => Ours::No,
        })
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
