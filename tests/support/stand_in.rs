//! Provider stand-ins: real HTTP servers on loopback that speak both the OpenAI chat-completions and the Anthropic
//! Messages wire formats, scripted per call, counting what they get.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use onejob::providers::{ProviderConfig, ProviderEndpoint, ProviderKind};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

/// The timings of every [`openai`] stand-in provider.
pub const TIMEOUT_MS: u64 = 1_000;
pub const LATE_MS: u64 = 10_000;

/// The endpoint of an openai stand-in at `base_url`, with short, known timings; its key is read from
/// `CARGO_PKG_NAME`.
pub fn endpoint(base_url: String) -> ProviderEndpoint {
    ProviderEndpoint {
        base_url,
        model: "gpt-4o-mini".into(),
        api_key_env: Some("CARGO_PKG_NAME".into()),
        ..ProviderEndpoint::default()
    }
}

/// A provider of `kind`, with the stand-ins' short, known timings.
pub fn timed(kind: ProviderKind) -> ProviderConfig {
    ProviderConfig::of(kind).with_timings(TIMEOUT_MS, LATE_MS)
}

/// An openai provider at `base_url`, timed as [`timed`] says.
pub fn openai(base_url: String) -> ProviderConfig {
    timed(ProviderKind::Openai(endpoint(base_url)))
}

/// An anthropic provider at `base_url`, timed like [`openai`].
pub fn anthropic(base_url: String) -> ProviderConfig {
    timed(ProviderKind::Anthropic(ProviderEndpoint {
        model: "claude-stand-in".into(),
        ..endpoint(base_url)
    }))
}

/// How the stand-in answers one call.
#[derive(Debug, Clone)]
pub enum Reply {
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
    /// This status, with this body.
    Status(u16, &'static str),
    /// 429 with `Retry-After: <seconds>`.
    RateLimited(u64),
    /// 503 with `Retry-After: <seconds>`.
    Unavailable(u64),
    /// Nothing until the gate opens, then the gate's answer.
    Held(Gate),
    /// As OpenAI's reasoning models answer: 400 `unsupported_parameter` to a body with `max_tokens`, 400
    /// `unsupported_value` to a temperature other than 1, else this JSON.
    Reasoning(Value),
}

/// Holds a [`Reply::Held`] answer back until the test opens it.
#[derive(Debug, Clone)]
pub struct Gate(Arc<watch::Sender<Option<Value>>>);

impl Gate {
    pub fn new() -> Self {
        Self(Arc::new(watch::Sender::new(None)))
    }

    /// Lets the held call answer with `output`.
    pub fn open(&self, output: Value) {
        self.0.send_replace(Some(output));
    }
}

/// A call as the stand-in received it.
#[derive(Debug, Clone)]
pub struct Call {
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
}

#[derive(Debug, Clone)]
pub struct StandIn {
    pub addr: SocketAddr,
    script: Arc<Script>,
}

/// Which wire format a call came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    OpenAi,
    Anthropic,
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
        Wire::Anthropic => {
            body["system"].as_str().unwrap_or_default().len()
                + body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .len()
        }
    };
    texts as u64
}

impl StandIn {
    /// Answers the calls with `replies` in order, then with `otherwise`.
    pub async fn spawn(replies: Vec<Reply>, otherwise: Reply) -> Self {
        let script = Arc::new(Script {
            replies: Mutex::new(replies.into()),
            otherwise,
            calls: watch::Sender::new(Vec::new()),
        });
        let app = axum::Router::new()
            .route(
                "/v1/chat/completions",
                post(|state, uri, headers, body| respond(Wire::OpenAi, state, uri, headers, body)),
            )
            .route(
                "/v1/messages",
                post(|state, uri, headers, body| {
                    respond(Wire::Anthropic, state, uri, headers, body)
                }),
            )
            // An Azure OpenAI deployment's path.
            .route(
                "/openai/deployments/{deployment}/chat/completions",
                post(|state, uri, headers, body| respond(Wire::OpenAi, state, uri, headers, body)),
            )
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, script }
    }

    /// Always answers with `output`.
    pub async fn answering(output: Value) -> Self {
        Self::spawn(vec![], Reply::Answer(output)).await
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.script.calls.borrow().clone()
    }

    pub fn call_count(&self) -> usize {
        self.script.calls.borrow().len()
    }

    /// Waits (on the stand-in's own notice, not on time) until it has received `n` calls.
    pub async fn received(&self, n: usize) {
        let mut calls = self.script.calls.subscribe();
        tokio::time::timeout(Duration::from_secs(20), calls.wait_for(|c| c.len() >= n))
            .await
            .unwrap_or_else(|_| panic!("the stand-in never received {n} calls"))
            .unwrap();
    }
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
    match reply {
        Reply::Answer(output) => Json(answer(wire, Answer::Json(output), honest)).into_response(),
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
        Reply::Status(status, body) => {
            (StatusCode::from_u16(status).unwrap(), body).into_response()
        }
        Reply::RateLimited(seconds) => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", seconds.to_string())],
            "rate limited",
        )
            .into_response(),
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
            let mut open = gate.0.subscribe();
            let output = open
                .wait_for(Option::is_some)
                .await
                .unwrap()
                .clone()
                .unwrap();
            Json(answer(wire, Answer::Json(output), honest)).into_response()
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

/// A server that reads each request and closes the connection without a word: the request was sent, no answer
/// will come. Returns its base URL.
pub async fn hanging_up() -> String {
    reading_then_closing(false).await
}

/// A server that reads each request and resets the connection (TCP RST) instead of answering. Returns its base URL.
pub async fn resetting() -> String {
    reading_then_closing(true).await
}

async fn reading_then_closing(reset: bool) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 64 * 1024];
            let _ = socket.read(&mut buf).await;
            if reset {
                // Linger 0: closing sends a reset, not a FIN.
                let _ = socket.set_zero_linger();
            }
            drop(socket);
        }
    });
    format!("http://{addr}/v1")
}

/// A base URL on which nothing listens: connections are refused before anything is sent.
pub async fn refusing() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/v1")
}
