//! The batch APIs, as their references describe them: OpenAI's Batch API (a JSONL file uploaded with purpose
//! `batch`, a batch created of it with `metadata`, read, listed newest first, its output file read) and Anthropic's
//! Message Batches (a batch created of `requests`, read, listed newest first, its results read as JSONL). Each
//! batch's request is answered as the script says: at once (`Answer`), when the gate opens (`Held`: in progress
//! until then), done and the submit's answer lost (`AfterWork`), made and running and the submit's answer lost
//! (`Accepted`), made and done and its submit answered with no usable id (`Unnamed`), lost before any batch is made
//! (`BeforeWork`), the submit refused (`Status`), or made and done with the key it was sent quoted (`EchoKey`).

use axum::extract::{Path, RawQuery};

use super::*;

/// A batch as the stand-in keeps it.
#[derive(Debug, Clone)]
pub(super) struct Batch {
    id: String,
    /// The API it was made through: [`Wire::OpenAi`] or [`Wire::Responses`] (OpenAI's Batch API, by the line's
    /// `url`), or [`Wire::Anthropic`].
    wire: Wire,
    custom_id: String,
    metadata: Value,
    created_at: chrono::DateTime<chrono::Utc>,
    /// The request's answer once the batch has ended with it.
    answer: Option<Value>,
    cancelled: bool,
}

impl Batch {
    fn ended(&self) -> bool {
        self.answer.is_some() || self.cancelled
    }

    /// The batch as its API shows it.
    fn shown(&self, base: &str) -> Value {
        let id = &self.id;
        match self.wire {
            Wire::Anthropic => {
                let count = |yes: bool| u64::from(yes);
                json!({
                    "id": id,
                    "type": "message_batch",
                    "processing_status": if self.ended() { "ended" } else { "in_progress" },
                    "request_counts": {
                        "processing": count(!self.ended()),
                        "succeeded": count(self.answer.is_some()),
                        "errored": 0,
                        "canceled": count(self.cancelled && self.answer.is_none()),
                        "expired": 0,
                    },
                    "created_at": self.created_at.to_rfc3339(),
                    "results_url": self.ended().then(|| format!("{base}/messages/batches/{id}/results")),
                })
            }
            _ => {
                let status = match (self.answer.is_some(), self.cancelled) {
                    (true, _) => "completed",
                    (false, true) => "cancelled",
                    (false, false) => "in_progress",
                };
                json!({
                    "id": id,
                    "object": "batch",
                    "endpoint": if self.wire == Wire::Responses { "/v1/responses" } else { "/v1/chat/completions" },
                    "status": status,
                    "completion_window": "24h",
                    "output_file_id": self.answer.is_some().then(|| format!("file-out-{id}")),
                    "error_file_id": null,
                    "created_at": self.created_at.timestamp(),
                    "metadata": self.metadata,
                    "request_counts": {"total": 1, "completed": u64::from(self.answer.is_some()), "failed": 0},
                })
            }
        }
    }

    /// The batch's results, as its API gives them (JSONL): the one line of its request.
    fn results(&self) -> String {
        let line = match (self.wire, &self.answer) {
            (Wire::Anthropic, Some(message)) => {
                json!({"custom_id": self.custom_id, "result": {"type": "succeeded", "message": message}})
            }
            (Wire::Anthropic, None) => {
                json!({"custom_id": self.custom_id, "result": {"type": "canceled"}})
            }
            (_, answer) => json!({
                "id": format!("batch_req_{}", self.id),
                "custom_id": self.custom_id,
                "response": {"status_code": 200, "request_id": "req_stand_in", "body": answer},
                "error": null,
            }),
        };
        format!("{line}\n")
    }
}

impl StandIn {
    /// Stamps its batches by `clock`, as a provider whose clock agrees with its caller's.
    pub(crate) fn keep_time_by(&self, clock: Arc<dyn onejob::clock::Clock>) {
        let _ = self.script.clock.set(clock);
    }

    /// A batch of one request someone else made at `at` (another application of the account), still running.
    pub(crate) fn someone_elses_batch(&self, at: chrono::DateTime<chrono::Utc>) {
        let mut batches = self.script.batches.lock().unwrap();
        let id = format!("msgbatch_someone_elses_{}", batches.len() + 1);
        batches.push(Batch {
            id,
            wire: Wire::Anthropic,
            custom_id: "theirs".into(),
            metadata: Value::Null,
            created_at: at,
            answer: None,
            cancelled: false,
        });
    }

    /// The batches made, as their API shows them.
    pub(crate) fn batches(&self) -> Vec<Value> {
        let base = self.base_url();
        let batches = self.script.batches.lock().unwrap();
        batches.iter().map(|b| b.shown(&base)).collect()
    }

    /// The batches whose request was done (what the provider billed).
    pub(super) fn batches_done(&self) -> usize {
        let batches = self.script.batches.lock().unwrap();
        batches.iter().filter(|b| b.answer.is_some()).count()
    }

    /// Cancels every batch not yet ended, as a person might at the provider.
    pub(crate) fn cancel_batches(&self) {
        for batch in self.script.batches.lock().unwrap().iter_mut() {
            batch.cancelled |= batch.answer.is_none();
        }
    }
}

/// The routes of both batch APIs.
pub(super) fn routes(app: axum::Router<Arc<Script>>) -> axum::Router<Arc<Script>> {
    app.route("/v1/files", post(upload))
        .route("/v1/files/{id}/content", get(file_content))
        .route("/v1/batches", post(create_openai).get(list))
        .route("/v1/batches/{id}", get(read))
        .route("/v1/messages/batches", post(create_anthropic).get(list))
        .route("/v1/messages/batches/{id}", get(read))
        .route("/v1/messages/batches/{id}/results", get(results))
}

/// `POST /v1/files`, a multipart form with `purpose` and `file`: the file kept, its id answered.
async fn upload(
    State(script): State<Arc<Script>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let content_type = headers[axum::http::header::CONTENT_TYPE].to_str().unwrap();
    let boundary = content_type
        .split("boundary=")
        .nth(1)
        .expect("a multipart form");
    let form = String::from_utf8(body.to_vec()).unwrap();
    let part = |name: &str| {
        (form.split(&format!("--{boundary}")))
            .find(|part| part.contains(&format!("name=\"{name}\"")))
            .and_then(|part| part.split_once("\r\n\r\n"))
            .map(|(_, content)| content.trim_end_matches("\r\n").to_owned())
            .unwrap_or_else(|| panic!("no {name} in the form"))
    };
    assert_eq!(part("purpose"), "batch");
    let mut files = script.files.lock().unwrap();
    let id = format!("file-stand-in-{}", files.len() + 1);
    files.push((id.clone(), part("file")));
    Json(json!({"id": id, "object": "file", "purpose": "batch"})).into_response()
}

/// `POST /v1/batches`: a batch of the uploaded file's one request.
async fn create_openai(
    state: State<Arc<Script>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Json(create): Json<Value>,
) -> Response {
    let file = create["input_file_id"].as_str().unwrap();
    let content = (state.files.lock().unwrap().iter())
        .find(|(id, _)| id == file)
        .map(|(_, content)| content.clone())
        .expect("an uploaded file");
    let line: Value = serde_json::from_str(content.trim()).unwrap();
    assert_eq!(line["url"], create["endpoint"], "{line}");
    let wire = match line["url"].as_str() {
        Some("/v1/responses") => Wire::Responses,
        _ => Wire::OpenAi,
    };
    let request = Submitted {
        wire,
        custom_id: line["custom_id"].as_str().unwrap().to_owned(),
        metadata: create["metadata"].clone(),
        body: line["body"].clone(),
    };
    let sent = json!({"batch": create, "request": line});
    submit(state, uri, headers, sent, request).await
}

/// `POST /v1/messages/batches`: a batch of its one request.
async fn create_anthropic(
    state: State<Arc<Script>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    Json(create): Json<Value>,
) -> Response {
    let requests = create["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{create}");
    let request = Submitted {
        wire: Wire::Anthropic,
        custom_id: requests[0]["custom_id"].as_str().unwrap().to_owned(),
        metadata: Value::Null,
        body: requests[0]["params"].clone(),
    };
    submit(state, uri, headers, create, request).await
}

/// A batch's one request, as submitted.
struct Submitted {
    wire: Wire,
    custom_id: String,
    metadata: Value,
    body: Value,
}

/// A submit, answered as the script says: the call recorded (it is what the provider bills), the batch made.
async fn submit(
    State(script): State<Arc<Script>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    sent: Value,
    request: Submitted,
) -> Response {
    let honest = honest_prompt_tokens(request.wire, &request.body);
    script.calls.send_modify(|calls| {
        calls.push(Call {
            uri,
            headers,
            body: sent,
        })
    });
    let reply =
        (script.replies.lock().unwrap().pop_front()).unwrap_or_else(|| script.otherwise.clone());
    let base = format!("http://{}/v1", script.addr.get().unwrap());
    let done = |output| answer(request.wire, Answer::Json(output), honest);
    let made = |answer: Option<Value>| {
        let mut batches = script.batches.lock().unwrap();
        let prefix = if request.wire == Wire::Anthropic {
            "msgbatch"
        } else {
            "batch"
        };
        let batch = Batch {
            id: format!("{prefix}_stand_in_{}", batches.len() + 1),
            wire: request.wire,
            custom_id: request.custom_id.clone(),
            metadata: request.metadata.clone(),
            created_at: (script.clock.get()).map_or_else(chrono::Utc::now, |clock| clock.now()),
            answer,
            cancelled: false,
        };
        batches.push(batch.clone());
        batch
    };
    match reply {
        Reply::Answer(output) => Json(made(Some(done(output))).shown(&base)).into_response(),
        Reply::AfterWork(output, loss) => {
            made(Some(done(output)));
            lost(loss).await
        }
        Reply::BeforeWork(loss) => lost(loss).await,
        Reply::Status(status, body) => {
            (StatusCode::from_u16(status).unwrap(), body).into_response()
        }
        Reply::Held(gate) => {
            let batch = made(None);
            run_until_open(&script, &batch, gate, honest);
            Json(batch.shown(&base)).into_response()
        }
        Reply::Unnamed(output) => {
            let mut shown = made(Some(done(output))).shown(&base);
            shown["id"] = json!("");
            Json(shown).into_response()
        }
        Reply::EchoKey(width) => {
            let sent = headers_of(&script);
            let key = (sent.get("authorization").or_else(|| sent.get("x-api-key")))
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let summary = format!("{key:<width$}");
            Json(made(Some(done(json!({"summary": summary})))).shown(&base)).into_response()
        }
        Reply::Accepted(gate, loss) => {
            let batch = made(None);
            run_until_open(&script, &batch, gate, honest);
            lost(loss).await
        }
        other => unreachable!("not a batch's reply: {other:?}"),
    }
}

/// Ends `batch` with the answer its gate opens with, unless it was cancelled first.
fn run_until_open(script: &Script, batch: &Batch, gate: Gate, honest: u64) {
    let (batches, id, wire) = (script.batches.clone(), batch.id.clone(), batch.wire);
    tokio::spawn(async move {
        let output = gate.opened().await;
        let answer = answer(wire, Answer::Json(output), honest);
        let mut batches = batches.lock().unwrap();
        let kept = batches.iter_mut().find(|b| b.id == id).unwrap();
        if !kept.cancelled {
            kept.answer = Some(answer);
        }
    });
}

/// Whether lookups are down: recorded as `what`, then answered 500 if they are.
fn looked_up(script: &Script, what: String) -> Option<Response> {
    script.lookups.lock().unwrap().push(what);
    let down = (script.lookups_fail).load(std::sync::atomic::Ordering::SeqCst);
    down.then(|| (StatusCode::INTERNAL_SERVER_ERROR, "reads are down").into_response())
}

fn not_found(what: &str) -> Response {
    let error = json!({"error": {"type": "not_found_error", "message": format!("No such {what}")}});
    (StatusCode::NOT_FOUND, Json(error)).into_response()
}

/// `GET /v1/batches/{id}`, `GET /v1/messages/batches/{id}`.
async fn read(State(script): State<Arc<Script>>, Path(id): Path<String>) -> Response {
    if let Some(down) = looked_up(&script, format!("batches/{id}")) {
        return down;
    }
    let base = format!("http://{}/v1", script.addr.get().unwrap());
    let batches = script.batches.lock().unwrap();
    match batches.iter().find(|b| b.id == id) {
        Some(batch) => Json(batch.shown(&base)).into_response(),
        None => not_found("batch"),
    }
}

/// `GET /v1/batches`, `GET /v1/messages/batches`: every batch of the API asked, newest first, `limit` a page
/// (default 20), from after `after` (OpenAI) or `after_id` (Anthropic).
async fn list(
    State(script): State<Arc<Script>>,
    uri: axum::http::Uri,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    if let Some(down) = looked_up(&script, format!("batches?{query}")) {
        return down;
    }
    let anthropic = uri.path().starts_with("/v1/messages/");
    let url = reqwest::Url::parse(&format!("http://stand-in/?{query}")).unwrap();
    let param =
        |name: &str| (url.query_pairs()).find_map(|(k, v)| (k == name).then(|| v.into_owned()));
    let limit: usize = param("limit").and_then(|l| l.parse().ok()).unwrap_or(20);
    let after = param(if anthropic { "after_id" } else { "after" });
    let base = format!("http://{}/v1", script.addr.get().unwrap());
    let batches = script.batches.lock().unwrap();
    let newest_first = (batches.iter().rev())
        .filter(|b| (b.wire == Wire::Anthropic) == anthropic)
        .skip_while(|b| after.as_ref().is_some_and(|after| &b.id != after))
        .skip(usize::from(after.is_some()))
        .map(|b| b.shown(&base))
        .collect::<Vec<_>>();
    let data: Vec<&Value> = newest_first.iter().take(limit).collect();
    Json(json!({
        "object": "list",
        "data": data,
        "first_id": data.first().map(|b| b["id"].clone()),
        "last_id": data.last().map(|b| b["id"].clone()),
        "has_more": newest_first.len() > limit,
    }))
    .into_response()
}

/// `GET /v1/files/{id}/content`: a batch's output file (`file-out-{batch id}`) or an uploaded one.
async fn file_content(State(script): State<Arc<Script>>, Path(id): Path<String>) -> Response {
    if let Some(down) = looked_up(&script, format!("files/{id}")) {
        return down;
    }
    let batches = script.batches.lock().unwrap();
    let output = id
        .strip_prefix("file-out-")
        .and_then(|batch| batches.iter().find(|b| b.id == batch && b.answer.is_some()));
    match output {
        Some(batch) => batch.results().into_response(),
        None => not_found("file"),
    }
}

/// `GET /v1/messages/batches/{id}/results`: an ended batch's results.
async fn results(State(script): State<Arc<Script>>, Path(id): Path<String>) -> Response {
    if let Some(down) = looked_up(&script, format!("batches/{id}/results")) {
        return down;
    }
    let batches = script.batches.lock().unwrap();
    match batches.iter().find(|b| b.id == id && b.ended()) {
        Some(batch) => batch.results().into_response(),
        None => not_found("results"),
    }
}
