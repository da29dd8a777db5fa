//! Faults side by side: per fault of a provider (healthy, slow past the time-out, a 500 after the work, the
//! connection dropped after the work, a 429), the same intents through onejob in each way an `unknown` clears —
//! `hold` (a person), `lookup` (the provider asked: OpenAI's stored completions), `policy` (`unknown_retry_after_ms`),
//! `batch` (the calls through OpenAI's Batch API, each batch read by its id, a lost submit found by listing) — and
//! through a client that retries as the OpenAI SDK does by default, in the same run, against the same stand-in: a
//! real HTTP server on loopback that speaks OpenAI's chat completions, its stored-completions list, and its Batch
//! API (files, batches, their list, output files). A batch's fault meets its submit: its work runs as a call's.
//! Each intent's first call meets the fault; any later call is answered. A call is billed when the stand-in did its
//! work, whatever became of the answer. Reported per cell: billed calls per intent, intents answered, jobs left for a
//! person, and the median time to an answer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use onejob::clock::SystemClock;
use onejob::domain::{JobStatus, Owner, ProviderName};
use onejob::providers::keys::ProviderKeys;
use onejob::providers::kinds::openai::OpenAiSettings;
use onejob::providers::{ProviderConfig, ProviderEndpoint, ProviderKind};
use onejob::startup::{self, Process, Role};
use onejob::store::sqlite::SqliteStore;
use serde_json::{Value, json};

use super::{Scratch, percentiles};

/// The stand-in's timings, and onejob's for it: a slow answer comes well past the time-out and the late window, and
/// well before a lookup's "no such call" counts as absence.
const TIMEOUT_MS: u64 = 300;
const LATE_MS: u64 = 300;
const SLOW_MS: u64 = 1_500;
const ABSENT_AFTER_MS: u64 = 3_000;
/// How long after its create an intent may take to be answered before it counts as not answered.
const PATIENCE: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Healthy,
    Slow,
    ErrorAfterWork,
    DroppedAfterWork,
    RateLimited,
}

impl Fault {
    const ALL: [Self; 5] = [
        Self::Healthy,
        Self::Slow,
        Self::ErrorAfterWork,
        Self::DroppedAfterWork,
        Self::RateLimited,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Slow => "slow past the time-out",
            Self::ErrorAfterWork => "500 after the work",
            Self::DroppedAfterWork => "dropped after the work",
            Self::RateLimited => "429",
        }
    }
}

/// How an `unknown` clears in a onejob run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Hold,
    Lookup,
    Policy,
    Batch,
}

impl Mode {
    const ALL: [Self; 4] = [Self::Hold, Self::Lookup, Self::Policy, Self::Batch];

    fn name(self) -> &'static str {
        match self {
            Self::Hold => "onejob, hold",
            Self::Lookup => "onejob, lookup",
            Self::Policy => "onejob, policy",
            Self::Batch => "onejob, batch",
        }
    }
}

/// The stand-in: what it was sent, what it did.
#[derive(Debug)]
struct StandIn {
    fault: Fault,
    /// Calls per intent (its prompt).
    seen: Mutex<HashMap<String, usize>>,
    calls: AtomicUsize,
    /// Calls whose work was done: what the provider bills.
    billed: AtomicUsize,
    /// Calls whose work is still running (counted once it ends, whoever still listens).
    working: AtomicUsize,
    stored: Mutex<Vec<Value>>,
    /// The files uploaded for batches: the one request line of each, by its id.
    files: Mutex<HashMap<String, Value>>,
    /// The batches made, oldest first, as the Batch API shows them (`_output`: the output file's one line).
    batches: Arc<Mutex<Vec<Value>>>,
}

/// What one cell came to.
struct Cell {
    intents: usize,
    calls: usize,
    billed: usize,
    answered: usize,
    for_a_person: usize,
    /// Attempts onejob recorded as possibly paid (cleared by policy): the extra calls it accepted.
    possibly_paid: Option<usize>,
    answer_ms: Option<f64>,
}

pub(super) async fn faults(intents: usize) {
    println!(
        "faults: {intents} intents per cell; time-out {TIMEOUT_MS} ms, late window {LATE_MS} ms, a slow answer after {SLOW_MS} ms, absence after {ABSENT_AFTER_MS} ms; breakers off"
    );
    println!(
        "{:<24} {:<28} {:>12} {:>14} {:>10} {:>12} {:>14} {:>14}",
        "fault",
        "client",
        "calls/intent",
        "billed/intent",
        "answered",
        "for a person",
        "possibly paid",
        "answer p50 ms"
    );
    for fault in Fault::ALL {
        for mode in Mode::ALL {
            let cell = onejob_cell(fault, mode, intents).await;
            print_cell(fault, mode.name(), &cell);
        }
        let cell = sdk_cell(fault, intents).await;
        print_cell(fault, "OpenAI SDK, default retries", &cell);
    }
}

fn print_cell(fault: Fault, client: &str, cell: &Cell) {
    let p50 = cell
        .answer_ms
        .map_or_else(|| "—".to_owned(), |ms| format!("{ms:.0}"));
    let per_intent = |n: usize| n as f64 / cell.intents as f64;
    let possibly_paid = cell
        .possibly_paid
        .map_or_else(|| "—".to_owned(), |n| n.to_string());
    println!(
        "{:<24} {:<28} {:>12.2} {:>14.2} {:>7}/{:<3} {:>12} {:>14} {:>14}",
        fault.name(),
        client,
        per_intent(cell.calls),
        per_intent(cell.billed),
        cell.answered,
        cell.intents,
        cell.for_a_person,
        possibly_paid,
        p50
    );
}

/// The intents through a onejob engine (SQLite, its worker and its sweep every 100 ms) whose one provider is the
/// stand-in, its `unknown` cleared as `mode` says.
async fn onejob_cell(fault: Fault, mode: Mode, intents: usize) -> Cell {
    let (stand_in, base_url) = stand_in(fault).await;
    let dir = Scratch::new("faults");
    let store = Arc::new(SqliteStore::open(&dir.join("bench.db")).unwrap());
    let mut config = onejob::config::Config {
        breaker_threshold: 0,
        lease_margin_ms: 200,
        ..Default::default()
    };
    let mut provider = ProviderConfig::of(ProviderKind::Openai(OpenAiSettings(ProviderEndpoint {
        base_url,
        model: "gpt-4o-mini".into(),
        store: (mode == Mode::Lookup).then_some(true),
        batch: (mode == Mode::Batch).then_some(true),
        ..ProviderEndpoint::default()
    })))
    .with_timings(TIMEOUT_MS, LATE_MS);
    provider.limits.lookup_absent_after_ms = ABSENT_AFTER_MS;
    provider.limits.unknown_retry_after_ms = (mode == Mode::Policy).then_some(0);
    let primary = ProviderName::parse("primary").unwrap();
    config.providers = [(primary.clone(), provider)].into();
    // Every bundled contract's chain on the one provider.
    config.chains = ["summarize@1", "classify@1"]
        .map(|c| {
            (
                onejob::domain::ContractRef::parse(c).unwrap(),
                vec![primary.clone()],
            )
        })
        .into();
    let (process, messages) = Process::local(store, Arc::new(SystemClock));
    let engine = startup::engine(&config, Role::COMMAND, &ProviderKeys::default(), process);
    let engine = Arc::new(engine.unwrap());
    let worker = tokio::spawn(onejob::worker::run_local(engine.clone(), messages, 64));
    let sweeper = tokio::spawn(onejob::worker::sweeper::run_local(
        engine.clone(),
        chrono::Duration::milliseconds(100),
    ));
    let owner = Owner::parse("alice").unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..intents {
        let (engine, owner, primary) = (engine.clone(), owner.clone(), primary.clone());
        tasks.spawn(async move {
            let sent = Instant::now();
            let mut new = super::intent(&owner, &format!("fault-{i}"), &format!("Intent {i}."));
            new.providers = vec![primary];
            let job = engine.create_job(new).await.unwrap().job().clone();
            let mut changes = engine.watch(&job.id);
            let mut now = Arc::new(engine.get_job(&owner, &job.id).await.unwrap().unwrap());
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while now.status() != JobStatus::Succeeded {
                let changed = tokio::time::timeout_at(deadline, changes.changed()).await;
                now = match changed {
                    Ok(Some(last)) => last,
                    Ok(None) => Arc::new(engine.get_job(&owner, &job.id).await.unwrap().unwrap()),
                    Err(_) => break,
                };
            }
            let possibly_paid = onejob::domain::Bill::of(&now).possibly_paid.len();
            (now.status(), sent.elapsed(), possibly_paid)
        });
    }
    let mut cell = Cell {
        intents,
        calls: 0,
        billed: 0,
        answered: 0,
        for_a_person: 0,
        possibly_paid: Some(0),
        answer_ms: None,
    };
    let mut times = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (status, took, possibly_paid) = done.unwrap();
        cell.possibly_paid = cell.possibly_paid.map(|n| n + possibly_paid);
        match status {
            JobStatus::Succeeded => times.push(took),
            JobStatus::Unknown | JobStatus::Failed => cell.for_a_person += 1,
            _ => {}
        }
    }
    worker.abort();
    sweeper.abort();
    stand_in.idle().await;
    cell.calls = stand_in.calls.load(Ordering::SeqCst);
    cell.billed = stand_in.billed.load(Ordering::SeqCst);
    cell.answered = times.len();
    cell.answer_ms = (!times.is_empty()).then(|| percentiles(&mut times).0);
    cell
}

/// The intents through a client that retries as the OpenAI SDK does by default: up to 2 retries after a
/// connection error, a time-out, a 408, 409, 429 or any 5xx, waiting `retry-after-ms` (else `Retry-After`) or
/// 0.5 s doubling (at most 8 s) less up to a quarter of jitter; its time-out (10 minutes) never comes here.
async fn sdk_cell(fault: Fault, intents: usize) -> Cell {
    let (stand_in, base_url) = stand_in(fault).await;
    let http = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..intents {
        let (http, url) = (http.clone(), format!("{base_url}/chat/completions"));
        tasks.spawn(async move {
            let sent = Instant::now();
            let body = json!({
                "model": "gpt-4o-mini",
                "messages": [{"role": "system", "content": "JSON"}, {"role": "user", "content": format!("Intent {i}.")}],
            });
            for retry in 0..=2u32 {
                let answer = http
                    .post(&url)
                    .timeout(Duration::from_secs(600))
                    .json(&body)
                    .send()
                    .await;
                let wait = match answer {
                    Ok(answer) if answer.status().is_success() => return Some(sent.elapsed()),
                    Ok(answer) => {
                        let status = answer.status().as_u16();
                        if !(matches!(status, 408 | 409 | 429) || status >= 500) {
                            return None;
                        }
                        let header = |name| answer.headers().get(name).and_then(|v| v.to_str().ok());
                        (header("retry-after-ms").and_then(|v| v.parse::<u64>().ok()))
                            .map(Duration::from_millis)
                    }
                    Err(_) => None,
                };
                let backoff = Duration::from_millis(500 * 2u64.pow(retry)).min(Duration::from_secs(8));
                let jittered = backoff.mul_f64(1.0 - 0.25 * fastrand::f64());
                tokio::time::sleep(wait.unwrap_or(jittered)).await;
            }
            None
        });
    }
    let mut times = Vec::new();
    while let Some(done) = tasks.join_next().await {
        times.extend(done.unwrap());
    }
    stand_in.idle().await;
    Cell {
        intents,
        calls: stand_in.calls.load(Ordering::SeqCst),
        billed: stand_in.billed.load(Ordering::SeqCst),
        answered: times.len(),
        for_a_person: 0,
        possibly_paid: None,
        answer_ms: (!times.is_empty()).then(|| percentiles(&mut times).0),
    }
}

impl StandIn {
    /// Once no call's work is running: what it bills is all counted.
    async fn idle(&self) {
        while self.working.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A stand-in whose every intent's first call meets `fault`; its base URL.
async fn stand_in(fault: Fault) -> (Arc<StandIn>, String) {
    let state = Arc::new(StandIn {
        fault,
        seen: Mutex::new(HashMap::new()),
        calls: AtomicUsize::new(0),
        billed: AtomicUsize::new(0),
        working: AtomicUsize::new(0),
        stored: Mutex::new(Vec::new()),
        files: Mutex::new(HashMap::new()),
        batches: Arc::new(Mutex::new(Vec::new())),
    });
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(call).get(list))
        .route("/v1/files", post(upload))
        .route("/v1/files/{id}/content", get(output))
        .route("/v1/batches", post(submit).get(batches))
        .route("/v1/batches/{id}", get(batch))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (state, format!("http://{addr}/v1"))
}

impl StandIn {
    /// The fault an intent's call meets: its first call's, none for any later one.
    fn fault_for(&self, prompt: &str) -> Fault {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut seen = self.seen.lock().unwrap();
        let n = seen.entry(prompt.to_owned()).or_default();
        *n += 1;
        if *n == 1 { self.fault } else { Fault::Healthy }
    }

    /// The work of a call sent `body`, run to its end (and billed) whether or not the caller still listens, slow as
    /// `fault` says: its chat completion, kept as a stored one if the call asked for `store`.
    fn work(self: &Arc<Self>, fault: Fault, body: Value) -> tokio::task::JoinHandle<Value> {
        self.working.fetch_add(1, Ordering::SeqCst);
        let state = self.clone();
        tokio::spawn(async move {
            if fault == Fault::Slow {
                tokio::time::sleep(Duration::from_millis(SLOW_MS)).await;
            }
            let prompt = body["messages"][1]["content"].as_str().unwrap_or_default();
            let billed = state.billed.fetch_add(1, Ordering::SeqCst) + 1;
            let completion = json!({
                "id": format!("chatcmpl-{billed}"),
                "object": "chat.completion",
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": json!({"summary": prompt}).to_string()}}],
                "usage": {"prompt_tokens": prompt.len() + 60, "completion_tokens": 10},
            });
            if body["store"] == true {
                let mut kept = completion.clone();
                kept["metadata"] = body["metadata"].clone();
                state.stored.lock().unwrap().push(kept);
            }
            state.working.fetch_sub(1, Ordering::SeqCst);
            completion
        })
    }
}

/// What a call's answer becomes on its way back, as `fault` says, once its work is done.
fn answered(fault: Fault, answer: Value) -> Response {
    match fault {
        Fault::ErrorAfterWork => {
            (StatusCode::INTERNAL_SERVER_ERROR, "failed after the work").into_response()
        }
        // The connection's task ends without a response: the caller reads no answer.
        Fault::DroppedAfterWork => std::panic::resume_unwind(Box::new("dropped")),
        _ => Json(answer).into_response(),
    }
}

fn rate_limited() -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [("retry-after-ms", "100")],
        "slow down",
    )
        .into_response()
}

/// One call: the fault for an intent's first, an answer for any other.
async fn call(State(state): State<Arc<StandIn>>, Json(body): Json<Value>) -> Response {
    let prompt = body["messages"][1]["content"].as_str().unwrap_or_default();
    let fault = state.fault_for(prompt);
    if fault == Fault::RateLimited {
        return rate_limited();
    }
    let completion = state.work(fault, body).await.unwrap();
    answered(fault, completion)
}

/// `POST /v1/files` (a multipart form): the batch's one request line kept, its id answered.
async fn upload(State(state): State<Arc<StandIn>>, form: String) -> Json<Value> {
    let line = (form.lines())
        .find(|line| line.starts_with('{'))
        .and_then(|line| serde_json::from_str::<Value>(line).ok())
        .unwrap_or_default();
    let mut files = state.files.lock().unwrap();
    let id = format!("file-{}", files.len() + 1);
    files.insert(id.clone(), line);
    Json(json!({"id": id, "object": "file", "purpose": "batch"}))
}

/// `POST /v1/batches`: the batch's submit meets the intent's fault; the batch runs its request as a call's work, and
/// is completed when it is done.
async fn submit(State(state): State<Arc<StandIn>>, Json(create): Json<Value>) -> Response {
    let file = create["input_file_id"].as_str().unwrap_or_default();
    let line = state
        .files
        .lock()
        .unwrap()
        .get(file)
        .cloned()
        .unwrap_or_default();
    let prompt = line["body"]["messages"][1]["content"]
        .as_str()
        .unwrap_or_default();
    let fault = state.fault_for(prompt);
    if fault == Fault::RateLimited {
        return rate_limited();
    }
    let shown = {
        let mut batches = state.batches.lock().unwrap();
        let id = format!("batch_{}", batches.len() + 1);
        let shown = json!({
            "id": id, "object": "batch", "status": "in_progress", "output_file_id": null,
            "created_at": chrono::Utc::now().timestamp(), "metadata": create["metadata"],
        });
        batches.push(shown.clone());
        shown
    };
    let work = state.work(fault, line["body"].clone());
    let (batches, id, custom_id) = (
        state.batches.clone(),
        shown["id"].clone(),
        line["custom_id"].clone(),
    );
    let completed = tokio::spawn(async move {
        let completion = work.await.unwrap();
        let mut batches = batches.lock().unwrap();
        let kept = batches.iter_mut().find(|b| b["id"] == id).unwrap();
        kept["status"] = json!("completed");
        kept["output_file_id"] = json!(format!("out-{}", id.as_str().unwrap()));
        kept["_output"] =
            json!({"custom_id": custom_id, "response": {"status_code": 200, "body": completion}});
        kept.clone()
    });
    match fault {
        // A healthy batch is done before its submit answers (it is read at once either way).
        Fault::Healthy => Json(completed.await.unwrap()).into_response(),
        Fault::Slow => Json(shown).into_response(),
        _ => answered(fault, shown),
    }
}

/// The batch, as the Batch API shows it.
fn shown(batch: &Value) -> Value {
    let mut shown = batch.clone();
    shown.as_object_mut().unwrap().remove("_output");
    shown
}

/// `GET /v1/batches/{id}`.
async fn batch(State(state): State<Arc<StandIn>>, Path(id): Path<String>) -> Response {
    let batches = state.batches.lock().unwrap();
    match batches.iter().find(|b| b["id"] == id.as_str()) {
        Some(batch) => Json(shown(batch)).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// `GET /v1/batches`: every batch, newest first, on one page.
async fn batches(State(state): State<Arc<StandIn>>) -> Json<Value> {
    let batches = state.batches.lock().unwrap();
    let data: Vec<Value> = batches.iter().rev().map(shown).collect();
    Json(json!({"object": "list", "data": data, "has_more": false}))
}

/// `GET /v1/files/{id}/content`: a completed batch's output file.
async fn output(State(state): State<Arc<StandIn>>, Path(id): Path<String>) -> Response {
    let batches = state.batches.lock().unwrap();
    match batches.iter().find(|b| b["output_file_id"] == id.as_str()) {
        Some(batch) => format!("{}\n", batch["_output"]).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// OpenAI's list of stored chat completions, filtered by `metadata[onejob_attempt]`.
async fn list(State(state): State<Arc<StandIn>>, RawQuery(query): RawQuery) -> Json<Value> {
    let url =
        reqwest::Url::parse(&format!("http://stand-in/?{}", query.unwrap_or_default())).unwrap();
    let wanted = url
        .query_pairs()
        .find(|(k, _)| k == "metadata[onejob_attempt]")
        .map(|(_, v)| v.into_owned());
    let stored = state.stored.lock().unwrap();
    let data: Vec<&Value> = (stored.iter())
        .filter(|c| {
            wanted
                .as_deref()
                .is_some_and(|w| c["metadata"]["onejob_attempt"] == w)
        })
        .take(1)
        .collect();
    Json(json!({"object": "list", "data": data, "has_more": false}))
}
