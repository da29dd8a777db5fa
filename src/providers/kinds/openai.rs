//! The `openai` kind: any OpenAI-compatible server, with a bearer key named by `api_key_env` (see
//! [`crate::providers::keys`]) and `Idempotency-Key: <job id>:<attempt>`, through one of two APIs:
//!
//! - `POST {base_url}/chat/completions` with a JSON-schema response format (the default);
//! - `POST {base_url}/responses` (OpenAI's Responses API) with a JSON-schema text format, in background mode where
//!   `background = true`: the create answers at once with the response's id, which the call then reads until the
//!   response is done ([`OpenAiProvider::call_named`] leaves the id for the attempt, [`Provider::look_up`] reads it).
//!
//! What each reply means is [`crate::providers::http::exchange`]'s, then [`read_answer`]'s or
//! [`read_response`]'s for a 2xx body.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{ClientParts, Connect, Kind, NoAws};
use crate::clock::Clock;
use crate::domain::{CallReport, ErrorInfo};
use crate::providers::http::RequestDefaults;
use crate::providers::tokens::Encoding;
use crate::providers::{
    ATTEMPT_METADATA, CallName, HttpEndpoint, Lookup, OpenAiApi, Provider, ProviderEndpoint,
    ProviderOutcome, ProviderRequest, Reply, SYSTEM_PROMPT, TokenLimitField, failed, snippet,
    unread,
};

endpoint_settings!(
    /// An OpenAI-compatible endpoint: the keys every HTTP kind takes.
    OpenAiSettings
);

/// The longest response id kept (OpenAI's are about 50 characters).
const MAX_CALL_ID: usize = 256;

/// How long a background response is left before its read `n` (0 the first, after the create): a quarter of a
/// second, doubled each time up to two seconds.
fn poll_wait(n: u32) -> chrono::Duration {
    chrono::Duration::milliseconds((250_i64 << n.min(3)).min(2_000))
}

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
        let (path, token_limit_field) = match (self.api(), reasoning) {
            (OpenAiApi::Responses, _) => ("responses", TokenLimitField::MaxOutputTokens),
            (OpenAiApi::ChatCompletions, true) => {
                ("chat/completions", TokenLimitField::MaxCompletionTokens)
            }
            (OpenAiApi::ChatCompletions, false) => ("chat/completions", TokenLimitField::MaxTokens),
        };
        RequestDefaults {
            path,
            token_limit_field,
            sends_temperature: !reasoning,
        }
    }

    fn api(&self) -> OpenAiApi {
        self.0.api.unwrap_or_default()
    }

    /// Whether its calls are background responses, read by their id.
    fn in_background(&self) -> bool {
        self.api() == OpenAiApi::Responses && self.background == Some(true)
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
        self.0.check()?;
        let responses = self.api() == OpenAiApi::Responses;
        let budget = self.token_limit_field;
        if responses && budget.is_some_and(|f| f != TokenLimitField::MaxOutputTokens) {
            return Err("token_limit_field: the Responses API takes max_output_tokens".into());
        }
        if !responses && budget == Some(TokenLimitField::MaxOutputTokens) {
            return Err(
                "token_limit_field: max_output_tokens is the Responses API's (api = \"responses\")"
                    .into(),
            );
        }
        if self.background == Some(true) && !(responses && self.store == Some(true)) {
            return Err(
                "background = true is the Responses API's, and its responses are stored: set api = \"responses\" \
                 and store = true"
                    .into(),
            );
        }
        Ok(())
    }

    /// Stored chat completions are listed by the attempt's identity; background responses are read by their id.
    /// A response that is stored but not in background can be read by no name the attempt keeps.
    fn can_be_asked(&self) -> bool {
        match self.api() {
            OpenAiApi::ChatCompletions => self.store == Some(true),
            OpenAiApi::Responses => self.in_background(),
        }
    }

    fn asked_by_call_name(&self) -> bool {
        self.in_background()
    }
}

impl Connect for OpenAiSettings {
    fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws> {
        let endpoint = HttpEndpoint::new(&self.0, self.defaults(), parts.keys, parts.http);
        let shape = match (self.api(), self.in_background()) {
            (OpenAiApi::ChatCompletions, _) => Shape::Chat,
            (OpenAiApi::Responses, false) => Shape::Responses,
            (OpenAiApi::Responses, true) => Shape::Background,
        };
        let store = self.store == Some(true);
        Ok(Arc::new(OpenAiProvider {
            endpoint,
            shape,
            store,
            clock: parts.clock.clone(),
        }))
    }
}

/// How an openai provider's calls are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `POST …/chat/completions`, answered when done.
    Chat,
    /// `POST …/responses`, answered when done.
    Responses,
    /// `POST …/responses` in background mode, then `GET …/responses/{id}` until done.
    Background,
}

#[derive(Debug)]
pub struct OpenAiProvider {
    endpoint: HttpEndpoint,
    shape: Shape,
    /// Whether each call is stored under the attempt's identity (`store`, `metadata`).
    store: bool,
    /// What a background response's reads wait on.
    clock: Arc<dyn Clock>,
}

/// The bearer key, as OpenAI takes it.
fn bearer(call: reqwest::RequestBuilder, key: &str) -> reqwest::RequestBuilder {
    call.bearer_auth(key)
}

impl OpenAiProvider {
    fn body(&self, request: &ProviderRequest) -> Value {
        let name = request.contract.name();
        let own = match self.shape {
            Shape::Chat => json!({
                "model": self.endpoint.model,
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": request.prompt},
                ],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": name, "schema": request.output_schema},
                },
            }),
            Shape::Responses | Shape::Background => json!({
                "model": self.endpoint.model,
                "instructions": SYSTEM_PROMPT,
                "input": request.prompt,
                "text": {"format": {"type": "json_schema", "name": name, "schema": request.output_schema}},
            }),
        };
        let mut body = self.endpoint.body(own, request);
        if self.shape != Shape::Chat
            && let Some(effort) = body
                .as_object_mut()
                .and_then(|b| b.remove("reasoning_effort"))
        {
            body["reasoning"] = json!({ "effort": effort });
        }
        if self.shape == Shape::Background {
            body["background"] = json!(true);
        }
        if self.store {
            body["store"] = json!(true);
            body["metadata"] = json!({ ATTEMPT_METADATA: request.idempotency_key });
        }
        body
    }

    /// The URL of the response named `id`, and of what follows it (`/cancel`).
    fn response_url(&self, id: &str) -> reqwest::Url {
        let mut url = self.endpoint.url.clone();
        url.path_segments_mut()
            .expect("an http URL has a path")
            .push(id);
        url
    }

    /// Reads the response named `id` once: what it is, or the reply that says why it could not be read.
    async fn read(&self, id: &str) -> Result<Value, Reply> {
        let (sent, key) = (self.endpoint)
            .send(self.endpoint.http.get(self.response_url(id)), bearer)
            .await;
        let scrub = |reply: Reply| match &key {
            Some(key) => reply.scrubbed(key),
            None => reply,
        };
        let text = sent.map_err(scrub)?;
        match serde_json::from_str::<Value>(&text) {
            Ok(response) if response["id"] == id => Ok(response),
            _ => Err(scrub(Reply::failed(
                "bad_response",
                format!("not the response asked for: {}", unread(&text)),
            ))),
        }
    }

    /// A background response: created, its id left in `named`, then read at once and after each [`poll_wait`] until it is done. A read
    /// that goes wrong is harmless — the work goes on at the provider, and the next read finds it —, so only the
    /// create decides whether the work may have been done without an answer (a create lost after sending).
    async fn in_background(&self, request: &ProviderRequest, named: &CallName) -> Reply {
        let create = (self.endpoint).post(
            self.endpoint.url.clone(),
            &request.idempotency_key,
            &self.body(request),
        );
        let (sent, key) = self.endpoint.send(create, bearer).await;
        let scrub = |reply: Reply| match &key {
            Some(key) => reply.scrubbed(key),
            None => reply,
        };
        let text = match sent {
            Ok(text) => text,
            Err(reply) => return scrub(reply),
        };
        let created = serde_json::from_str::<Value>(&text).ok();
        // An id is kept on the attempt: one longer than any provider's is not the API's.
        let id = created.as_ref().and_then(|r| r["id"].as_str());
        let Some(id) = id.filter(|id| !id.is_empty() && id.len() <= MAX_CALL_ID) else {
            return scrub(Reply::failed(
                "bad_response",
                format!("not a response: {}", unread(&text)),
            ));
        };
        let _ = named.set(id.to_owned());
        let mut response = created.clone().expect("parsed");
        let mut reads = 0;
        loop {
            if let Some(reply) = done(&response) {
                return scrub(reply);
            }
            if reads > 0 {
                self.clock.sleep(poll_wait(reads - 1)).await;
            }
            reads = reads.saturating_add(1);
            match self.read(id).await {
                Ok(read) => response = read,
                Err(reply) => {
                    tracing::info!(response = id, ?reply.outcome, "a background response's read went wrong: read again");
                }
            }
        }
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn call(&self, request: &ProviderRequest) -> Reply {
        self.call_named(request, &CallName::new()).await
    }

    async fn call_named(&self, request: &ProviderRequest, named: &CallName) -> Reply {
        match self.shape {
            Shape::Chat => {
                (self.endpoint)
                    .call(
                        &request.idempotency_key,
                        &self.body(request),
                        bearer,
                        read_answer,
                    )
                    .await
            }
            Shape::Responses => {
                (self.endpoint)
                    .call(
                        &request.idempotency_key,
                        &self.body(request),
                        bearer,
                        read_response,
                    )
                    .await
            }
            Shape::Background => self.in_background(request, named).await,
        }
    }

    /// Stored chat completions: the one the call made under the attempt's identity, `GET …/chat/completions`
    /// filtered by its metadata (OpenAI's list of stored chat completions). Background responses: the response
    /// the call named, `GET …/responses/{id}` — done (its answer), cancelled (ended without the work), or still
    /// running.
    async fn look_up(&self, request: &ProviderRequest, call_id: Option<&str>) -> Lookup {
        match (self.shape, call_id) {
            (Shape::Background, Some(id)) => match self.read(id).await {
                Ok(response) if response["status"] == "cancelled" => Lookup::Ended,
                Ok(response) => {
                    done(&response).map_or(Lookup::Running, |reply| Lookup::Found(Box::new(reply)))
                }
                Err(reply) => Lookup::Failed(match reply.outcome {
                    ProviderOutcome::Failed(error) | ProviderOutcome::Lost(error) => error,
                    ProviderOutcome::Answered(_) => {
                        ErrorInfo::new("bad_response", "no lookup answer")
                    }
                }),
            },
            (Shape::Background | Shape::Responses, _) => Lookup::Failed(ErrorInfo::new(
                "not_asked",
                "this call left no name to ask about it by",
            )),
            (Shape::Chat, _) => {
                let filter = format!("metadata[{ATTEMPT_METADATA}]");
                let query = [
                    (filter.as_str(), request.idempotency_key.as_str()),
                    ("limit", "1"),
                ];
                self.endpoint.look_up(&query, bearer, read_stored).await
            }
        }
    }
}

/// What a response that is done answered (completed, failed, cut short, or cancelled at the provider); `None`
/// while it is queued or in progress.
fn done(response: &Value) -> Option<Reply> {
    match response["status"].as_str() {
        Some("queued" | "in_progress") => None,
        Some("cancelled") => Some(Reply::failed(
            "provider_refused",
            "the response was cancelled at the provider before its answer",
        )),
        _ => Some(read_response(&response.to_string())),
    }
}

/// A Responses API response: its JSON output (the `output_text` of its message, itself JSON text), with the model
/// and the token usage the provider reports; a failed one's error, a cut short one's reason.
pub(crate) fn read_response(text: &str) -> Reply {
    let Ok(body) = serde_json::from_str::<Value>(text) else {
        return Reply::failed("bad_response", format!("not a response: {}", unread(text)));
    };
    let usage = |path: &str| body.pointer(path).and_then(Value::as_u64);
    let report = CallReport {
        model: body["model"].as_str().map(str::to_owned),
        input_tokens: usage("/usage/input_tokens"),
        output_tokens: usage("/usage/output_tokens"),
        cached_input_tokens: usage("/usage/input_tokens_details/cached_tokens"),
        reasoning_tokens: usage("/usage/output_tokens_details/reasoning_tokens"),
        ..CallReport::default()
    };
    let content = (body["output"].as_array().into_iter().flatten())
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().into_iter().flatten())
        .collect::<Vec<_>>();
    let text_of = |kind: &str, field: &str| {
        (content.iter())
            .find(|part| part["type"] == kind)
            .and_then(|part| part[field].as_str())
    };
    let outcome = match body["status"].as_str() {
        Some("failed") => failed(
            "provider_error",
            format!(
                "the response failed: {}",
                snippet(
                    body.pointer("/error/message")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason given")
                )
            ),
        ),
        Some("incomplete")
            if body.pointer("/incomplete_details/reason") == Some(&json!("max_output_tokens")) =>
        {
            failed(
                "output_truncated",
                "the answer was cut off at the output token budget",
            )
        }
        Some("incomplete") => failed(
            "output_truncated",
            format!(
                "the answer was cut short: {}",
                body["incomplete_details"]["reason"]
            ),
        ),
        _ => match (
            text_of("refusal", "refusal"),
            text_of("output_text", "text"),
        ) {
            (Some(refusal), _) => failed(
                "model_refused",
                format!("the model refused: {}", snippet(refusal)),
            ),
            (None, Some(output)) => match serde_json::from_str(output) {
                Ok(output) => ProviderOutcome::Answered(output),
                Err(_) => failed(
                    "output_not_json",
                    format!("the answer is not JSON: {}", snippet(output)),
                ),
            },
            (None, None) => failed("bad_response", format!("not a response: {}", unread(text))),
        },
    };
    Reply::new(outcome, report)
}

/// A list of stored chat completions: the first one's answer, read as a call's, or none.
fn read_stored(text: &str) -> Lookup {
    let listed = serde_json::from_str::<Value>(text).ok();
    match listed.as_ref().and_then(|l| l["data"].as_array()) {
        Some(data) => match data.first() {
            Some(completion) => Lookup::Found(Box::new(read_answer(&completion.to_string()))),
            None => Lookup::NotFound,
        },
        None => Lookup::Failed(ErrorInfo::new(
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
    fn responses_are_read_from_their_message_with_model_usage_and_status() {
        let answered = json!({
            "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5-mini",
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "content": [{"type": "output_text", "text": "{\"summary\": \"s\"}"}]},
            ],
            "usage": {"input_tokens": 31, "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 4}},
        });
        let reply = read_response(&answered.to_string());
        assert_eq!(
            reply.outcome,
            ProviderOutcome::Answered(json!({"summary": "s"}))
        );
        assert_eq!(
            (
                reply.report.input_tokens,
                reply.report.output_tokens,
                reply.report.reasoning_tokens
            ),
            (Some(31), Some(7), Some(4))
        );
        let failed = json!({"id": "resp_1", "status": "failed", "error": {"code": "server_error", "message": "boom"}});
        assert_eq!(code(&read_response(&failed.to_string())), "provider_error");
        let cut = json!({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": []});
        assert_eq!(code(&read_response(&cut.to_string())), "output_truncated");
        let refused = json!({"status": "completed", "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "no"}]}]});
        assert_eq!(code(&read_response(&refused.to_string())), "model_refused");
        let prose = json!({"status": "completed", "output": [{"type": "message", "content": [{"type": "output_text", "text": "s"}]}]});
        assert_eq!(code(&read_response(&prose.to_string())), "output_not_json");
        assert_eq!(code(&read_response("<html>")), "bad_response");
        assert!(done(&json!({"status": "in_progress"})).is_none());
        assert!(done(&json!({"status": "queued"})).is_none());
    }

    #[test]
    fn background_needs_the_responses_api_and_storage() {
        let settings = |api, store, background| {
            OpenAiSettings(ProviderEndpoint {
                base_url: "https://api.openai.com/v1".into(),
                model: "gpt-5-mini".into(),
                api,
                store,
                background,
                ..ProviderEndpoint::default()
            })
        };
        let responses = Some(OpenAiApi::Responses);
        assert!(settings(None, Some(true), Some(true)).check().is_err());
        assert!(settings(responses, None, Some(true)).check().is_err());
        let background = settings(responses, Some(true), Some(true));
        assert_eq!(background.check(), Ok(()));
        assert!(background.can_be_asked() && background.asked_by_call_name());
        // Stored, not in background: no name the attempt keeps to read it by.
        assert!(!settings(responses, Some(true), None).can_be_asked());
        assert!(settings(None, Some(true), None).can_be_asked());
        assert_eq!(background.defaults().path, "responses");
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
