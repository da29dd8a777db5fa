//! Provider stand-ins: real HTTP servers on loopback that speak the OpenAI chat-completions, the Anthropic Messages
//! and Amazon Bedrock's Converse wire formats, scripted per call, counting what they get. A Converse call must be
//! signed (SigV4, by [`aws_identity`]'s secret, for service `bedrock`) or it is refused as Bedrock refuses it.

mod batches;
mod faults;
pub(crate) use faults::*;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use onejob::providers::kinds::anthropic::AnthropicSettings;
use onejob::providers::kinds::openai::OpenAiSettings;
use onejob::providers::{ProviderConfig, ProviderEndpoint, ProviderKind};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

/// The timings of every [`openai`] stand-in provider.
pub(crate) const TIMEOUT_MS: u64 = 1_000;
pub(crate) const LATE_MS: u64 = 10_000;

/// The endpoint of an openai stand-in at `base_url`, with short, known timings; its key is read from
/// `CARGO_PKG_NAME`.
pub(crate) fn endpoint(base_url: String) -> ProviderEndpoint {
    ProviderEndpoint {
        base_url,
        model: "gpt-4o-mini".into(),
        api_key_env: Some("CARGO_PKG_NAME".into()),
        ..ProviderEndpoint::default()
    }
}

/// A provider of `kind`, with the stand-ins' short, known timings.
pub(crate) fn timed(kind: ProviderKind) -> ProviderConfig {
    ProviderConfig::of(kind).with_timings(TIMEOUT_MS, LATE_MS)
}

/// An openai provider at `base_url`, timed as [`timed`] says.
pub(crate) fn openai(base_url: String) -> ProviderConfig {
    timed(ProviderKind::Openai(OpenAiSettings(endpoint(base_url))))
}

/// The AWS identity calls to a Bedrock stand-in are signed with, and checked against: the process's
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, as a function's role gives them) or the stand-ins' own.
pub(crate) fn aws_identity() -> (String, String) {
    let var =
        |name: &str, otherwise: &str| std::env::var(name).unwrap_or_else(|_| otherwise.into());
    (
        var("AWS_ACCESS_KEY_ID", "AKIDSTANDIN"),
        var("AWS_SECRET_ACCESS_KEY", "stand-in-secret"),
    )
}

/// AWS settings that sign with [`aws_identity`] in `us-east-1`, as a process's own.
pub(crate) fn aws() -> aws_config::SdkConfig {
    let (id, secret) = aws_identity();
    let credentials =
        aws_sdk_dynamodb::config::Credentials::new(id, secret, None, None, "stand-in");
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            credentials,
        ))
        .http_client(onejob::startup::https_client())
        .build()
}

/// The cross-region inference profile every Bedrock stand-in provider names.
pub(crate) const BEDROCK_MODEL: &str = "us.anthropic.claude-haiku-4-5-20251001-v1:0";

/// A Bedrock provider whose calls go to the stand-in at `base_url` (its root: a stand-in's `/v1` is left out),
/// timed like [`openai`].
pub(crate) fn bedrock(base_url: String) -> ProviderConfig {
    timed(ProviderKind::Bedrock(
        onejob::providers::kinds::bedrock::BedrockSettings {
            model: BEDROCK_MODEL.into(),
            endpoint_url: Some(base_url.trim_end_matches("/v1").to_owned()),
            ..Default::default()
        },
    ))
}

/// An anthropic provider at `base_url`, timed like [`openai`].
pub(crate) fn anthropic(base_url: String) -> ProviderConfig {
    timed(ProviderKind::Anthropic(AnthropicSettings(
        ProviderEndpoint {
            model: "claude-stand-in".into(),
            ..endpoint(base_url)
        },
    )))
}

/// How the stand-in answers one call.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// 200 with this JSON as the structured answer, and honest usage.
    Answer(Value),
    /// 200 with this text as the answer, where JSON belongs.
    Prose(&'static str),
    /// 200 with this JSON as the answer, reporting 1 prompt token (it read a fraction of the prompt).
    Truncated(Value),
    /// 200 with a summary that quotes the `Authorization` header it was sent, padded to this many characters
    /// (longer than the contract allows: the check's message quotes it).
    EchoKey(usize),
    /// 200 with this JSON as the answer, reporting a prompt token for every this many bytes of what it was sent
    /// (an honest count of text that packs many bytes a token: separator lines, runs of spaces).
    Packed(Value, u64),
    /// This status, with this body (to a Bedrock call, with this exception name: `ThrottlingException`).
    Status(u16, &'static str),
    /// 429 with `Retry-After: <seconds>`.
    RateLimited(u64),
    /// 503 with `Retry-After: <seconds>`.
    Unavailable(u64),
    /// This status with these headers (OpenAI's and Anthropic's `retry-after-ms`, `x-should-retry`).
    Headed(u16, &'static [(&'static str, &'static str)]),
    /// Nothing until the gate opens, then the gate's answer.
    Held(Gate),
    /// Does the work — answers this JSON, kept as a stored completion when the call asked for `store` — then
    /// loses the answer on the way back, as the [`Loss`] says.
    AfterWork(Value, Loss),
    /// Loses the call before doing any work (nothing is stored), as the [`Loss`] says.
    BeforeWork(Loss),
    /// A batch's submit: the batch is made and runs until the gate opens, the submit's answer lost as the [`Loss`]
    /// says.
    Accepted(Gate, Loss),
    /// A batch's submit: the batch is made and done with this JSON as its answer, and the submit answered 200 with
    /// an empty `id`.
    Unnamed(Value),

    /// As OpenAI's reasoning models answer: 400 `unsupported_parameter` to a body with `max_tokens`, 400
    /// `unsupported_value` to a temperature other than 1, else this JSON.
    Reasoning(Value),
}

/// How an answer is lost on its way back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// The connection closes without a word.
    Dropped,
    /// A 500 instead of the answer.
    ServerError,
    /// No answer ever: the call hangs until the caller gives up.
    Never,
    /// A 303 "see other" to another origin instead of the answer.
    SeeOther,
}

/// Holds a [`Reply::Held`] answer back until the test opens it.
#[derive(Debug, Clone)]
pub(crate) struct Gate(Arc<watch::Sender<Option<Value>>>);

impl Gate {
    pub(crate) fn new() -> Self {
        Self(Arc::new(watch::Sender::new(None)))
    }

    /// Lets the held call answer with `output`.
    pub(crate) fn open(&self, output: Value) {
        self.0.send_replace(Some(output));
    }

    /// The answer the gate was opened with, once it is.
    async fn opened(&self) -> Value {
        let mut open = self.0.subscribe();
        let output = open.wait_for(Option::is_some).await.unwrap();
        output.clone().unwrap()
    }
}

/// A call as the stand-in received it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// The path and query it was sent to.
    pub uri: axum::http::Uri,
    pub headers: HeaderMap,
    pub body: Value,
}

#[derive(Debug)]
struct Script {
    replies: Mutex<VecDeque<Reply>>,
    /// Used once the script is spent.
    otherwise: Reply,
    calls: watch::Sender<Vec<Call>>,
    /// The chat completions done for calls that asked for `store`, as OpenAI keeps them (with their `metadata`).
    stored: Mutex<Vec<Value>>,
    /// The queries of the stored completions it was asked (`GET /v1/chat/completions`): never calls.
    lookups: Mutex<Vec<String>>,
    /// Whether a lookup, or a background response's read, is answered 500.
    lookups_fail: std::sync::atomic::AtomicBool,
    /// The Responses API's responses made in background mode, by their id, as OpenAI keeps them: read by
    /// `GET /v1/responses/{id}`.
    responses: Arc<Mutex<Vec<Value>>>,
    /// The files uploaded to OpenAI's Files API, by their id.
    files: Mutex<Vec<(String, String)>>,
    /// The batches made through either batch API.
    batches: Arc<Mutex<Vec<batches::Batch>>>,
    /// Where it listens (what its batches' `results_url` name).
    addr: std::sync::OnceLock<SocketAddr>,
    /// The clock its batches are stamped by (`created_at`), if not the system's: a test's, as the provider's clock
    /// agrees with the caller's.
    clock: std::sync::OnceLock<Arc<dyn onejob::clock::Clock>>,
}

#[derive(Debug, Clone)]
pub(crate) struct StandIn {
    pub addr: SocketAddr,
    script: Arc<Script>,
}

/// Which wire format a call came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    OpenAi,
    /// OpenAI's Responses API.
    Responses,
    Anthropic,
    Bedrock,
}

/// What the stand-in answers: the answer (JSON or prose) and the prompt tokens it reports.
fn answer(wire: Wire, content: Answer, prompt_tokens: u64) -> Value {
    match wire {
        Wire::OpenAi => {
            let text = match content {
                Answer::Json(output) => output.to_string(),
                Answer::Prose(text) => text.to_owned(),
            };
            json!({
                "id": "chatcmpl-stand-in",
                "object": "chat.completion",
                "model": "stand-in-model",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 10},
            })
        }
        Wire::Responses => {
            let part = match content {
                Answer::Json(output) => json!({"type": "output_text", "text": output.to_string()}),
                Answer::Prose(text) => json!({"type": "output_text", "text": text}),
            };
            json!({
                "id": "resp_stand_in",
                "object": "response",
                "status": "completed",
                "model": "stand-in-model",
                "output": [{"type": "message", "role": "assistant", "content": [part]}],
                "usage": {"input_tokens": prompt_tokens, "output_tokens": 10},
            })
        }
        Wire::Anthropic => {
            let block = match content {
                Answer::Json(output) => {
                    json!({"type": "tool_use", "id": "toolu_stand_in", "name": "answer", "input": output})
                }
                Answer::Prose(text) => json!({"type": "text", "text": text}),
            };
            json!({
                "id": "msg_stand_in",
                "type": "message",
                "role": "assistant",
                "model": "stand-in-model",
                "content": [block],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": prompt_tokens, "output_tokens": 10},
            })
        }
        Wire::Bedrock => {
            let (block, stop) = match content {
                Answer::Json(output) => (
                    json!({"toolUse": {"toolUseId": "tooluse_stand_in", "name": "answer", "input": output}}),
                    "tool_use",
                ),
                Answer::Prose(text) => (json!({"text": text}), "end_turn"),
            };
            json!({
                "output": {"message": {"role": "assistant", "content": [block]}},
                "stopReason": stop,
                "usage": {"inputTokens": prompt_tokens, "outputTokens": 10, "totalTokens": prompt_tokens + 10},
                "metrics": {"latencyMs": 1},
            })
        }
    }
}

enum Answer {
    Json(Value),
    Prose(&'static str),
}

/// Honest usage: the prompt's bytes, which is never fewer than its tokens.
fn honest_prompt_tokens(wire: Wire, body: &Value) -> u64 {
    let texts = match wire {
        Wire::OpenAi => body["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["content"].as_str().unwrap_or_default().len())
            .sum::<usize>(),
        Wire::Responses => {
            body["instructions"].as_str().unwrap_or_default().len()
                + body["input"].as_str().unwrap_or_default().len()
        }
        Wire::Anthropic => {
            body["system"].as_str().unwrap_or_default().len()
                + body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .len()
        }
        Wire::Bedrock => {
            let text = |v: &Value| v[0]["text"].as_str().unwrap_or_default().len();
            text(&body["system"]) + text(&body["messages"][0]["content"])
        }
    };
    texts as u64
}

impl StandIn {
    /// Answers the calls with `replies` in order, then with `otherwise`.
    pub(crate) async fn spawn(replies: Vec<Reply>, otherwise: Reply) -> Self {
        let script = Arc::new(Script {
            replies: Mutex::new(replies.into()),
            otherwise,
            calls: watch::Sender::new(Vec::new()),
            stored: Mutex::new(Vec::new()),
            lookups: Mutex::new(Vec::new()),
            lookups_fail: std::sync::atomic::AtomicBool::new(false),
            responses: Arc::new(Mutex::new(Vec::new())),
            files: Mutex::new(Vec::new()),
            batches: Arc::new(Mutex::new(Vec::new())),
            addr: std::sync::OnceLock::new(),
            clock: std::sync::OnceLock::new(),
        });
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                post(|state, uri, headers, body| respond(Wire::OpenAi, state, uri, headers, body))
                    .get(list_stored),
            )
            .route(
                "/v1/responses",
                post(|state, uri, headers, body| {
                    respond(Wire::Responses, state, uri, headers, body)
                }),
            )
            .route("/v1/responses/{id}", get(read_response))
            .merge(batches::routes(axum::Router::new()))
            .route(
                "/v1/messages",
                post(|state, uri, headers, body| {
                    respond(Wire::Anthropic, state, uri, headers, body)
                }),
            )
            // Bedrock's Converse, signed.
            .route("/model/{model}/converse", post(converse))
            // An Azure OpenAI deployment's path.
            .route(
                "/openai/deployments/{deployment}/chat/completions",
                post(|state, uri, headers, body| respond(Wire::OpenAi, state, uri, headers, body)),
            )
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        script.addr.set(addr).unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, script }
    }

    /// Always answers with `output`.
    pub(crate) async fn answering(output: Value) -> Self {
        Self::spawn(vec![], Reply::Answer(output)).await
    }

    pub(crate) fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.script.calls.borrow().clone()
    }

    pub(crate) fn call_count(&self) -> usize {
        self.script.calls.borrow().len()
    }

    /// The calls whose work was done and stored (what the provider billed, where the call asked for `store`): chat
    /// completions stored, background responses completed, batches' requests done.
    pub(crate) fn stored_count(&self) -> usize {
        let responses = self.script.responses.lock().unwrap();
        let completed = (responses.iter()).filter(|r| r["status"] == "completed");
        self.script.stored.lock().unwrap().len() + completed.count() + self.batches_done()
    }

    /// The lookups it was asked, by their query.
    pub(crate) fn lookups(&self) -> Vec<String> {
        self.script.lookups.lock().unwrap().clone()
    }

    /// From now on every lookup is answered 500 (`false`: answered again).
    pub(crate) fn fail_lookups(&self, fail: bool) {
        (self.script.lookups_fail).store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    /// Cancels every background response still queued or in progress, as a person might at the provider.
    pub(crate) fn cancel_responses(&self) {
        for response in self.script.responses.lock().unwrap().iter_mut() {
            if response["status"] == "queued" || response["status"] == "in_progress" {
                response["status"] = json!("cancelled");
            }
        }
    }

    /// Waits (on the stand-in's own notice, not on time) until it has received `n` calls.
    pub(crate) async fn received(&self, n: usize) {
        let mut calls = self.script.calls.subscribe();
        tokio::time::timeout(Duration::from_secs(20), calls.wait_for(|c| c.len() >= n))
            .await
            .unwrap_or_else(|_| panic!("the stand-in never received {n} calls"))
            .unwrap();
    }
}

/// OpenAI's list of stored chat completions, filtered by every `metadata[KEY]=VALUE` of the query, oldest first,
/// at most `limit` (default 20).
async fn list_stored(
    State(script): State<Arc<Script>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    script.lookups.lock().unwrap().push(query.clone());
    if script
        .lookups_fail
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        return (StatusCode::INTERNAL_SERVER_ERROR, "lookups are down").into_response();
    }
    let url = reqwest::Url::parse(&format!("http://stand-in/?{query}")).unwrap();
    let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
    let wanted: Vec<(&str, &str)> = (pairs.iter())
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("metadata[")?.strip_suffix(']')?;
            Some((key, v.as_str()))
        })
        .collect();
    let limit = (pairs.iter())
        .find(|(k, _)| k == "limit")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(20);
    let stored = script.stored.lock().unwrap();
    let found: Vec<&Value> = (stored.iter())
        .filter(|c| wanted.iter().all(|(k, v)| c["metadata"][*k] == *v))
        .collect();
    let data: Vec<&Value> = found.iter().take(limit).copied().collect();
    Json(json!({
        "object": "list",
        "data": data,
        "first_id": data.first().map(|c| c["id"].clone()),
        "last_id": data.last().map(|c| c["id"].clone()),
        "has_more": found.len() > limit,
    }))
    .into_response()
}

/// `GET /v1/responses/{id}`: a background response as it is now (500 while lookups fail; 404 for no such id).
async fn read_response(
    State(script): State<Arc<Script>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    script
        .lookups
        .lock()
        .unwrap()
        .push(format!("responses/{id}"));
    if script
        .lookups_fail
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        return (StatusCode::INTERNAL_SERVER_ERROR, "reads are down").into_response();
    }
    let responses = script.responses.lock().unwrap();
    match responses.iter().find(|r| r["id"] == id.as_str()) {
        Some(response) => Json(response.clone()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": {"message": "No response found"}})),
        )
            .into_response(),
    }
}

/// A background response is made (as OpenAI makes one: `background` and `store`): kept under a new id with
/// `status` and, once done, `answer`'s output; what the create answers, `queued`.
fn in_background(script: &Script, sent: &Value, status: &str, answer: Option<Value>) -> Value {
    let mut responses = script.responses.lock().unwrap();
    let id = format!("resp_stand_in_{}", responses.len() + 1);
    let mut kept = answer.unwrap_or_else(|| json!({"object": "response", "output": []}));
    kept["id"] = json!(id);
    kept["status"] = json!(status);
    kept["metadata"] = sent["metadata"].clone();
    responses.push(kept.clone());
    kept["status"] = json!("queued");
    kept["output"] = json!([]);
    kept
}

/// The call's answer, kept as a stored completion (with the call's `metadata`) if it was an OpenAI call that asked
/// for `store`, as OpenAI keeps it.
fn done(script: &Script, wire: Wire, sent: &Value, mut answer: Value) -> Value {
    if wire == Wire::OpenAi && sent["store"] == true {
        let mut stored = script.stored.lock().unwrap();
        answer["id"] = json!(format!("chatcmpl-stand-in-{}", stored.len() + 1));
        let mut kept = answer.clone();
        kept["metadata"] = sent["metadata"].clone();
        stored.push(kept);
    }
    answer
}

/// The answer lost on its way back, as `loss` says.
async fn lost(loss: Loss) -> Response {
    match loss {
        // The connection's task ends without a response: hyper closes it, and the caller reads no answer. (No panic
        // message: the unwind carries none.)
        Loss::Dropped => std::panic::resume_unwind(Box::new("the connection is dropped")),
        Loss::ServerError => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server failed after the work",
        )
            .into_response(),
        Loss::Never => std::future::pending().await,
        Loss::SeeOther => (
            StatusCode::SEE_OTHER,
            [("location", "http://127.0.0.1:9/elsewhere")],
        )
            .into_response(),
    }
}

/// A Converse call: refused as Bedrock refuses it (403 `InvalidSignatureException`) unless its SigV4 signature is
/// [`aws_identity`]'s over exactly what arrived, then answered as the script says.
async fn converse(
    state: State<Arc<Script>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Err(why) = sigv4::verify(&uri, &headers, &body) {
        let refusal = json!({"message": why});
        return (
            StatusCode::FORBIDDEN,
            [("x-amzn-errortype", "InvalidSignatureException")],
            Json(refusal),
        )
            .into_response();
    }
    let Ok(body) = serde_json::from_slice(&body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    respond(Wire::Bedrock, state, uri, headers, Json(body)).await
}

async fn respond(
    wire: Wire,
    State(script): State<Arc<Script>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let honest = honest_prompt_tokens(wire, &body);
    let sent = body.clone();
    script
        .calls
        .send_modify(|calls| calls.push(Call { uri, headers, body }));
    let reply = script
        .replies
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| script.otherwise.clone());
    let made_in_background = matches!(
        reply,
        Reply::Answer(_) | Reply::AfterWork(..) | Reply::BeforeWork(_) | Reply::Held(_)
    );
    if wire == Wire::Responses && sent["background"] == true && made_in_background {
        return background(&script, &sent, reply, honest).await;
    }
    // The answer, as the work done (and stored, if the call asked for it).
    let answered = |output| {
        Json(done(
            &script,
            wire,
            &sent,
            answer(wire, Answer::Json(output), honest),
        ))
        .into_response()
    };
    match reply {
        Reply::Answer(output) => answered(output),
        Reply::AfterWork(output, loss) => {
            done(
                &script,
                wire,
                &sent,
                answer(wire, Answer::Json(output), honest),
            );
            lost(loss).await
        }
        Reply::BeforeWork(loss) => lost(loss).await,
        Reply::Headed(status, headers) => {
            let mut response =
                (StatusCode::from_u16(status).unwrap(), "told how to retry").into_response();
            for (name, value) in headers {
                response.headers_mut().insert(*name, value.parse().unwrap());
            }
            response
        }
        Reply::Prose(text) => Json(answer(wire, Answer::Prose(text), honest)).into_response(),
        Reply::Truncated(output) => Json(answer(wire, Answer::Json(output), 1)).into_response(),
        Reply::EchoKey(width) => {
            let sent = headers_of(&script)["authorization"]
                .to_str()
                .unwrap()
                .to_owned();
            let summary = format!("{sent:<width$}");
            Json(answer(
                wire,
                Answer::Json(json!({"summary": summary})),
                honest,
            ))
            .into_response()
        }
        Reply::Packed(output, bytes) => {
            Json(answer(wire, Answer::Json(output), honest.div_ceil(bytes))).into_response()
        }
        Reply::Status(status, exception) if wire == Wire::Bedrock => {
            aws_error(status, exception, None)
        }
        Reply::Status(status, body) => {
            (StatusCode::from_u16(status).unwrap(), body).into_response()
        }
        Reply::RateLimited(seconds) if wire == Wire::Bedrock => {
            aws_error(429, "ThrottlingException", Some(seconds))
        }
        Reply::RateLimited(seconds) => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", seconds.to_string())],
            "rate limited",
        )
            .into_response(),
        Reply::Unavailable(seconds) if wire == Wire::Bedrock => {
            aws_error(503, "ServiceUnavailableException", Some(seconds))
        }
        Reply::Unavailable(seconds) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", seconds.to_string())],
            "down for maintenance",
        )
            .into_response(),
        Reply::Reasoning(output) => {
            let refused = |param: &str, code: &str, message: &str| {
                let error = json!({"error": {
                    "message": message, "type": "invalid_request_error", "param": param, "code": code,
                }});
                (StatusCode::BAD_REQUEST, Json(error)).into_response()
            };
            if sent.get("max_tokens").is_some() {
                return refused(
                    "max_tokens",
                    "unsupported_parameter",
                    "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                );
            }
            if sent.get("temperature").is_some_and(|t| t != 1.0) {
                return refused(
                    "temperature",
                    "unsupported_value",
                    "Unsupported value: 'temperature' does not support 0 with this model. Only the default (1) value is supported.",
                );
            }
            Json(answer(wire, Answer::Json(output), honest)).into_response()
        }
        Reply::Held(gate) => {
            let output = gate.opened().await;
            answered(output)
        }
        Reply::Accepted(..) | Reply::Unnamed(_) => unreachable!("a batch's reply, to a call"),
    }
}

/// A background response's create, as the script says: the work done at once (`Answer`), when the gate opens
/// (`Held`: in progress until then), done and the create's answer lost (`AfterWork`), or lost before any work
/// (`BeforeWork`). Any other reply answers the create as it answers a call.
async fn background(script: &Arc<Script>, sent: &Value, reply: Reply, honest: u64) -> Response {
    let completed = |output| answer(Wire::Responses, Answer::Json(output), honest);
    match reply {
        Reply::Answer(output) => Json(in_background(
            script,
            sent,
            "completed",
            Some(completed(output)),
        ))
        .into_response(),
        Reply::AfterWork(output, loss) => {
            in_background(script, sent, "completed", Some(completed(output)));
            lost(loss).await
        }
        Reply::BeforeWork(loss) => lost(loss).await,
        Reply::Held(gate) => {
            let created = in_background(script, sent, "in_progress", None);
            let (responses, id) = (script.responses.clone(), created["id"].clone());
            let template = completed(json!(null));
            tokio::spawn(async move {
                let output = gate.opened().await;
                let mut done = template;
                done["output"][0]["content"][0]["text"] = json!(output.to_string());
                let mut responses = responses.lock().unwrap();
                let kept = responses.iter_mut().find(|r| r["id"] == id).unwrap();
                for field in ["status", "output", "usage", "model"] {
                    kept[field] = done[field].clone();
                }
            });
            Json(created).into_response()
        }
        other => unreachable!("answered as a call: {other:?}"),
    }
}

/// An AWS service's error answer: the status, the exception's name in `x-amzn-ErrorType`, a JSON message.
fn aws_error(status: u16, exception: &str, retry_after: Option<u64>) -> Response {
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        [("x-amzn-errortype", exception.to_owned())],
        Json(json!({"message": format!("{exception} from the stand-in")})),
    )
        .into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert("retry-after", seconds.to_string().parse().unwrap());
    }
    response
}

/// Checks a request's SigV4 signature as AWS does: the same canonical request, signed again with the secret of
/// the access key it names, must give the signature it carries.
mod sigv4 {
    use std::time::SystemTime;

    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;
    use axum::http::{HeaderMap, Uri};

    pub(super) fn verify(uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or(format!("no {name} header"))
        };
        let authorization = header("authorization")?;
        let fields = authorization
            .strip_prefix("AWS4-HMAC-SHA256 ")
            .ok_or("not a SigV4 authorization")?;
        let field = |name: &str| {
            fields
                .split(", ")
                .find_map(|f| f.strip_prefix(name))
                .ok_or(format!("no {name} in the authorization"))
        };
        let scope: Vec<&str> = field("Credential=")?.split('/').collect();
        let [access_key, _day, region, service, "aws4_request"] = scope[..] else {
            return Err(format!("a malformed credential scope: {scope:?}"));
        };
        let (expected_key, secret) = super::aws_identity();
        if access_key != expected_key || service != "bedrock" {
            return Err(format!("signed by {access_key} for {service}"));
        }
        let signed: Vec<&str> = field("SignedHeaders=")?.split(';').collect();
        let time = chrono::NaiveDateTime::parse_from_str(header("x-amz-date")?, "%Y%m%dT%H%M%SZ")
            .map_err(|e| e.to_string())?
            .and_utc();
        let token = headers
            .get("x-amz-security-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let identity =
            aws_sdk_dynamodb::config::Credentials::new(access_key, secret, token, None, "check")
                .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(region)
            .name(service)
            .time(SystemTime::from(time))
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let host = header("host")?;
        let url = format!("http://{host}{uri}");
        let mut values = Vec::new();
        for name in &signed {
            values.push((*name, header(name)?));
        }
        let request =
            SignableRequest::new("POST", url, values.into_iter(), SignableBody::Bytes(body))
                .map_err(|e| e.to_string())?;
        let again = sign(request, &params).map_err(|e| e.to_string())?;
        if field("Signature=")? == again.signature() {
            Ok(())
        } else {
            Err(
                "the request signature we calculated does not match the signature you provided"
                    .into(),
            )
        }
    }
}

/// The headers of the last call the stand-in received.
fn headers_of(script: &Script) -> HeaderMap {
    let calls = script.calls.borrow();
    calls
        .last()
        .expect("the call being answered")
        .headers
        .clone()
}
