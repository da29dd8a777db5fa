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
use crate::providers::batch::{self, BatchApi, Ours, Page};
use crate::providers::http::RequestDefaults;
use crate::providers::tokens::Encoding;
use crate::providers::{
    ATTEMPT_METADATA, Asked, CallName, HttpEndpoint, Lookup, OpenAiApi, Provider, ProviderEndpoint,
    ProviderOutcome, ProviderRequest, Reply, SYSTEM_PROMPT, TokenLimitField, failed, refused,
    snippet, unread,
};

endpoint_settings!(
    /// An OpenAI-compatible endpoint: the keys every HTTP kind takes.
    OpenAiSettings
);

/// How long a batch's output and error files are kept (OpenAI's longest: 30 days).
const OUTPUT_KEPT_S: u64 = 30 * 24 * 3600;

/// The longest wait between two reads of a background response.
const BACKGROUND_POLL_CAP_MS: i64 = 2_000;

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

    /// How its calls are made.
    fn mode(&self) -> Mode {
        match (self.api(), self.background, self.batch) {
            (OpenAiApi::Responses, Some(true), _) => Mode::Background,
            (_, _, Some(true)) => Mode::Batch,
            _ => Mode::Direct,
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
        if self.background == Some(true) && self.batch == Some(true) {
            return Err(
                "batch = true and background = true are two ways to make a call: choose one".into(),
            );
        }
        Ok(())
    }

    /// Stored chat completions are listed by the attempt's identity; background responses are read by their id;
    /// batches are read by their id, or found by listing. A response that is stored but not in background can be
    /// read by no name the attempt keeps.
    fn can_be_asked(&self) -> bool {
        match (self.mode(), self.api()) {
            (Mode::Background | Mode::Batch, _) => true,
            (Mode::Direct, OpenAiApi::ChatCompletions) => self.store == Some(true),
            (Mode::Direct, OpenAiApi::Responses) => false,
        }
    }

    fn asked_by_call_name(&self) -> bool {
        self.mode() == Mode::Background
    }

    fn in_batch(&self) -> bool {
        self.mode() == Mode::Batch
    }
}

impl Connect for OpenAiSettings {
    fn client(&self, parts: ClientParts<'_>) -> Result<Arc<dyn Provider>, NoAws> {
        let endpoint = HttpEndpoint::new(&self.0, self.defaults(), parts.keys, parts.http);
        Ok(Arc::new(OpenAiProvider {
            endpoint,
            api: self.api(),
            mode: self.mode(),
            store: self.store == Some(true),
            clock: parts.clock.clone(),
        }))
    }
}

/// How an openai provider's calls are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `POST` to the API, answered when done.
    Direct,
    /// `POST …/responses` in background mode, then `GET …/responses/{id}` until done.
    Background,
    /// Through the Batch API: the request uploaded as a file of one line, a batch of it created, read until it
    /// ends, and its result read from the batch's output (or error) file.
    Batch,
}

#[derive(Debug)]
pub struct OpenAiProvider {
    endpoint: HttpEndpoint,
    api: OpenAiApi,
    mode: Mode,
    /// Whether each call is stored under the attempt's identity (`store`, `metadata`).
    store: bool,
    /// What a background response's and a batch's reads wait on.
    clock: Arc<dyn Clock>,
}

/// The bearer key, as OpenAI takes it.
fn bearer(call: reqwest::RequestBuilder, key: &str) -> reqwest::RequestBuilder {
    call.bearer_auth(key)
}

impl OpenAiProvider {
    fn body(&self, request: &ProviderRequest) -> Value {
        let name = request.contract.name();
        let own = match self.api {
            OpenAiApi::ChatCompletions => json!({
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
            OpenAiApi::Responses => json!({
                "model": self.endpoint.model,
                "instructions": SYSTEM_PROMPT,
                "input": request.prompt,
                "text": {"format": {"type": "json_schema", "name": name, "schema": request.output_schema}},
            }),
        };
        let mut body = self.endpoint.body(own, request);
        if self.api == OpenAiApi::Responses
            && let Some(effort) = body
                .as_object_mut()
                .and_then(|b| b.remove("reasoning_effort"))
        {
            body["reasoning"] = json!({ "effort": effort });
        }
        if self.mode == Mode::Background {
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
        self.get_named(self.response_url(id), id, "the response asked for")
            .await
    }

    /// `GET url`, the object named `id` (a response, a batch).
    async fn get_named(&self, url: reqwest::Url, id: &str, what: &str) -> Result<Value, Reply> {
        let object = self.endpoint.get_json(url, bearer, what).await?;
        match object["id"] == id {
            true => Ok(object),
            false => Err(Reply::failed(
                "bad_response",
                format!("not {what}: {}", unread(&object.to_string())),
            )),
        }
    }

    /// Reads a 2xx answer's body as the API answers it: a chat completion, or a response.
    fn read_as_called(&self) -> fn(&str) -> Reply {
        match self.api {
            OpenAiApi::ChatCompletions => read_answer,
            OpenAiApi::Responses => read_response,
        }
    }

    /// A background response: created, its id left in `named`, then read at once and after each
    /// [`batch::poll_wait`] until it is done. A read that goes wrong is harmless — the work goes on at the provider,
    /// and the next read finds it —, so only the create decides whether the work may have been done without an
    /// answer (a create lost after sending).
    async fn in_background(&self, request: &ProviderRequest, named: &CallName) -> Reply {
        let create = (self.endpoint).post(
            self.endpoint.url.clone(),
            &request.idempotency_key,
            &self.body(request),
        );
        let text = match self.endpoint.fetch(create, bearer).await {
            Ok(text) => text,
            Err(reply) => return reply,
        };
        // An id is kept on the attempt: one longer than any provider's is not the API's.
        let Some(id) = batch::batch_id(&text) else {
            return batch::unnamed(&text);
        };
        let _ = named.set(id.clone());
        let mut response = serde_json::from_str::<Value>(&text).expect("read by batch_id");
        let mut reads = 0;
        loop {
            if let Some(reply) = done(&response) {
                return reply;
            }
            if reads > 0 {
                (self.clock)
                    .sleep(batch::poll_wait(reads - 1, BACKGROUND_POLL_CAP_MS))
                    .await;
            }
            reads = reads.saturating_add(1);
            match self.read(&id).await {
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
        match self.mode {
            Mode::Direct => {
                (self.endpoint)
                    .call(
                        &request.idempotency_key,
                        &self.body(request),
                        bearer,
                        self.read_as_called(),
                    )
                    .await
            }
            Mode::Background => {
                let reply = self.in_background(request, named).await;
                self.endpoint.scrubbed(reply)
            }
            Mode::Batch => {
                let reply = batch::call(self, self.clock.as_ref(), request, named).await;
                self.endpoint.scrubbed(reply)
            }
        }
    }

    /// Stored chat completions: the one the call made under the attempt's identity, `GET …/chat/completions`
    /// filtered by its metadata (OpenAI's list of stored chat completions). Background responses: the response
    /// the call named, `GET …/responses/{id}` — done (its answer), cancelled (ended without the work), or still
    /// running. Batches: [`batch::look_up`].
    async fn look_up(&self, request: &ProviderRequest, asked: Asked<'_>) -> Lookup {
        match (self.mode, self.api, asked.call_id) {
            (Mode::Batch, ..) => {
                let looked = batch::look_up(self, request, asked).await;
                self.endpoint.scrubbed_lookup(looked)
            }
            (Mode::Background, _, Some(id)) => match self.read(id).await {
                Ok(response) if response["status"] == "cancelled" => Lookup::Ended,
                Ok(response) => self.endpoint.scrubbed_lookup(
                    done(&response).map_or(Lookup::Running, |reply| Lookup::Found(Box::new(reply))),
                ),
                Err(reply) => Lookup::unanswered(reply),
            },
            (Mode::Background, ..) | (Mode::Direct, OpenAiApi::Responses, _) => Lookup::Failed(
                ErrorInfo::new("not_asked", "this call left no name to ask about it by"),
            ),
            (Mode::Direct, OpenAiApi::ChatCompletions, _) => {
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

/// OpenAI's Batch API: a file of one request uploaded (`POST …/files`, purpose `batch`), a batch of it created
/// (`POST …/batches`, with the attempt's identity in its `metadata`), read (`GET …/batches/{id}`) and listed
/// (`GET …/batches`, newest first), its result read from its output or error file (`GET …/files/{id}/content`).
#[async_trait]
impl BatchApi for OpenAiProvider {
    async fn submit(&self, request: &ProviderRequest, custom_id: &str) -> Result<String, Reply> {
        let endpoint = self.endpoint.url.path();
        let line = json!({
            "custom_id": custom_id, "method": "POST", "url": endpoint, "body": self.body(request),
        });
        let boundary = format!("onejob-{:016x}", fastrand::u64(..));
        let form = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{custom_id}.jsonl\"\r\n\
             Content-Type: application/jsonl\r\n\r\n{line}\n\r\n--{boundary}--\r\n"
        );
        let upload = (self.endpoint.http.post(self.endpoint.at(&["files"])))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(form);
        let uploaded =
            (self.endpoint.fetch(upload, bearer).await).map_err(batch::nothing_submitted)?;
        let file = serde_json::from_str::<Value>(&uploaded).ok();
        let Some(file) = file.as_ref().and_then(|f| f["id"].as_str()) else {
            return Err(Reply::failed(
                "bad_response",
                format!("not a file: {}", unread(&uploaded)),
            ));
        };
        let create = json!({
            "input_file_id": file,
            "endpoint": endpoint,
            "completion_window": "24h",
            "metadata": { ATTEMPT_METADATA: request.idempotency_key },
            // Its result kept as long as OpenAI keeps stored calls, whatever the account's default.
            "output_expires_after": {"anchor": "created_at", "seconds": OUTPUT_KEPT_S},
        });
        let created = (self.endpoint).post(
            self.endpoint.at(&["batches"]),
            &request.idempotency_key,
            &create,
        );
        let text = self.endpoint.fetch(created, bearer).await?;
        batch::batch_id(&text).ok_or_else(|| batch::unnamed(&text))
    }

    async fn read(&self, id: &str) -> Result<Value, Reply> {
        (self.get_named(
            self.endpoint.at(&["batches", id]),
            id,
            "the batch asked for",
        ))
        .await
    }

    fn ended(&self, batch: &Value) -> bool {
        matches!(
            batch["status"].as_str(),
            Some("completed" | "failed" | "expired" | "cancelled")
        )
    }

    async fn result(&self, batch: &Value, custom_id: &str) -> Lookup {
        for file in ["output_file_id", "error_file_id"] {
            let Some(file) = batch[file].as_str() else {
                continue;
            };
            let url = self.endpoint.at(&["files", file, "content"]);
            let results = self.endpoint.fetch(self.endpoint.http.get(url), bearer);
            match results.await {
                Ok(results) => {
                    if let Some(line) = batch::line_of(&results, custom_id) {
                        return Lookup::Found(Box::new(self.read_line(&line)));
                    }
                }
                Err(reply) => return Lookup::unanswered(reply),
            }
        }
        match batch["status"].as_str() {
            Some("cancelled") => Lookup::Ended,
            Some("expired") => batch::not_run(
                "batch_expired",
                "the batch expired before the request was run",
            ),
            Some("failed") => batch::not_run(
                "provider_refused",
                format!(
                    "the batch failed: {}",
                    snippet(&batch["errors"].to_string())
                ),
            ),
            _ => batch::no_result(),
        }
    }

    async fn page(&self, after: Option<&str>) -> Result<Page, Reply> {
        let mut url = self.endpoint.at(&["batches"]);
        url.query_pairs_mut().append_pair("limit", "100");
        if let Some(after) = after {
            url.query_pairs_mut().append_pair("after", after);
        }
        let listed = (self.endpoint.get_json(url, bearer, "a list of batches")).await?;
        Page::of(&listed).map_err(|error| ProviderOutcome::Failed(error).into())
    }

    fn created_at(&self, batch: &Value) -> Option<crate::domain::Timestamp> {
        chrono::DateTime::from_timestamp(batch["created_at"].as_i64()?, 0)
    }

    async fn is_ours(
        &self,
        batch: &Value,
        request: &ProviderRequest,
        _custom_id: &str,
    ) -> Result<Ours, Reply> {
        Ok(
            match batch["metadata"][ATTEMPT_METADATA] == request.idempotency_key.as_str() {
                true => Ours::Yes,
                false => Ours::No,
            },
        )
    }
}

impl OpenAiProvider {
    /// A line of a batch's output or error file: the request's response (a 2xx body read as the call's would be;
    /// any other status a definite failure: the batch has ended, nothing more is done), or its error.
    fn read_line(&self, line: &Value) -> Reply {
        let response = &line["response"];
        let status = response["status_code"].as_u64().unwrap_or(0);
        match u16::try_from(status) {
            Ok(200..=299) => (self.read_as_called())(&response["body"].to_string()),
            Ok(status) if status >= 400 => {
                let code = match status {
                    429 => "rate_limited",
                    500.. => "provider_error",
                    _ => "provider_refused",
                };
                refused(
                    code,
                    status,
                    &crate::providers::http::error_text(&response["body"].to_string()),
                    None,
                )
            }
            _ => Reply::failed(
                "provider_refused",
                format!(
                    "the batch did not run the request: {}",
                    snippet(&line["error"].to_string())
                ),
            ),
        }
    }
}

/// What a response that is done answered (completed, failed, cut short, or cancelled at the provider); `None`
/// while it is queued or in progress.
fn done(response: &Value) -> Option<Reply> {
    match response["status"].as_str() {
        Some("queued" | "in_progress") => None,
        Some("cancelled") => Some(crate::providers::cancelled_at_provider("response")),
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

    /// A batch provider on `api`, not to be called.
    fn provider(api: OpenAiApi) -> OpenAiProvider {
        let settings = OpenAiSettings(ProviderEndpoint {
            base_url: "https://api.openai.com/v1".into(),
            model: "gpt-5-mini".into(),
            api: Some(api),
            batch: Some(true),
            ..ProviderEndpoint::default()
        });
        let keys = crate::providers::keys::ProviderKeys::default();
        let endpoint = HttpEndpoint::new(
            &settings.0,
            settings.defaults(),
            &keys,
            &reqwest::Client::new(),
        );
        OpenAiProvider {
            endpoint,
            api,
            mode: settings.mode(),
            store: false,
            clock: Arc::new(crate::clock::SystemClock),
        }
    }

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
    fn a_batch_provider_is_asked_by_listing_and_is_not_also_in_background() {
        let batch = |api, background: Option<bool>| {
            OpenAiSettings(ProviderEndpoint {
                base_url: "https://api.openai.com/v1".into(),
                model: "gpt-5-mini".into(),
                api,
                store: background.map(|_| true),
                background,
                batch: Some(true),
                ..ProviderEndpoint::default()
            })
        };
        for api in [None, Some(OpenAiApi::Responses)] {
            let lane = batch(api, None);
            assert_eq!(lane.check(), Ok(()));
            // Found by listing where its submit's answer was lost: no name needed.
            assert!(lane.in_batch() && lane.can_be_asked() && !lane.asked_by_call_name());
        }
        let both = batch(Some(OpenAiApi::Responses), Some(true));
        assert!(both.check().unwrap_err().contains("choose one"));
    }

    #[test]
    fn a_batch_line_is_read_as_its_api_answers_and_any_other_status_is_definite() {
        let chat = provider(OpenAiApi::ChatCompletions);
        let completion = json!({
            "model": "m", "choices": [{"message": {"content": "{\"summary\": \"s\"}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        });
        let line = |status: u16, body: Value| json!({"custom_id": "j_1", "response": {"status_code": status, "body": body}, "error": null});
        let reply = chat.read_line(&line(200, completion));
        assert_eq!(
            reply.outcome,
            ProviderOutcome::Answered(json!({"summary": "s"}))
        );
        let refused = json!({"error": {"message": "bad request"}});
        assert_eq!(
            code(&chat.read_line(&line(400, refused.clone()))),
            "provider_refused"
        );
        assert_eq!(
            code(&chat.read_line(&line(429, refused.clone()))),
            "rate_limited"
        );
        let failed = chat.read_line(&line(500, refused));
        assert!(
            matches!(failed.outcome, ProviderOutcome::Failed(_)),
            "the batch has ended: nothing more is done"
        );
        let no_response =
            json!({"custom_id": "j_1", "response": null, "error": {"code": "x", "message": "y"}});
        assert_eq!(code(&chat.read_line(&no_response)), "provider_refused");
        let responses = provider(OpenAiApi::Responses);
        let response = json!({"status": "completed", "output": [{"type": "message", "content": [{"type": "output_text", "text": "{\"summary\": \"r\"}"}]}]});
        assert_eq!(
            responses.read_line(&line(200, response)).outcome,
            ProviderOutcome::Answered(json!({"summary": "r"}))
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
