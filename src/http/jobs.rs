//! The job endpoints (`docs/api.md`) and the JSON they answer with.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{Duration, SecondsFormat};
use headers::{ETag, HeaderMapExt, IfNoneMatch};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::{Caller, Viewer};
use super::body::{Key, MaybeKey, SentKey, StrictJson};
use super::error::ApiError;
use super::usage::BillView;
use crate::domain::{
    Attempt, AttemptState, Bill, CallReport, ClearedBy, ErrorInfo, Intervention, Job, JobId,
    JobStatus, Timestamp,
};
use crate::engine::{Actor, Engine, Intake};
use crate::requests::CreateJobRequest;
use crate::store::{CreateOutcome, Cursor, JobPage, ListQuery};

/// A job as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub id: String,
    pub idempotency_key: String,
    /// SHA-256 of the RFC 8785 canonical JSON of `{contract, input, providers}` as sent.
    pub fingerprint: String,
    pub contract: String,
    #[schema(value_type = Object)]
    pub input: Value,
    pub providers: Vec<String>,
    pub status: JobStatus,
    /// Bumped when the result is claimed or the job is cancelled.
    pub version: u64,
    /// The attempt whose result is the job's.
    pub completed_by: Option<u32>,
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub error: Option<ErrorInfo>,
    pub attempts: Vec<AttemptView>,
    /// Nothing can change the job's outcome any more without someone asking (a manual retry of a failed job):
    /// it succeeded, was cancelled, or failed with no attempt left that could still answer. Wait until this.
    pub settled: bool,
    /// While a failed job's cancelled attempt could still answer and win: when that chance ends (the job is
    /// settled from then on, unless it changes). Null otherwise.
    #[schema(format = DateTime)]
    pub settles_at: Option<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// When the job is gone and its idempotency key free again (the retention period after its creation).
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// What the intent cost so far, every answer paid for included.
    pub bill: BillView,
    /// What operators did to the job on its owner's behalf, and who.
    pub interventions: Vec<Intervention>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptView {
    pub number: u32,
    pub provider: String,
    pub state: AttemptState,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
    pub error: Option<ErrorInfo>,
    /// What the provider reported: model, token usage, `Retry-After`.
    pub report: Option<CallReport>,
    /// A retry: the attempt it tries again on the same provider, after that one's answer said the work was not
    /// done (429, 503 with `Retry-After`, a refused connection).
    pub retry_of: Option<u32>,
    /// A retry's earliest start (the provider's `Retry-After`, or a backoff): no worker starts it before.
    #[schema(format = DateTime)]
    pub not_before: Option<String>,
    /// How and when it left `unknown`.
    pub cleared: Option<ClearedView>,
    /// The provider's own id of the call (a background response's), kept when it went `unknown`: what the
    /// reconciler reads its fate by.
    pub call_id: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClearedView {
    pub by: ClearedBy,
    #[schema(format = DateTime)]
    pub at: String,
}

pub(super) fn rfc3339(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl JobView {
    /// The job as it reads at `now` (whether it is settled depends on the time), its bill as `engine` prices it.
    pub fn new(job: &Job, now: Timestamp, engine: &Engine) -> Self {
        let settles_at = job.settles_at();
        Self {
            id: job.id.to_string(),
            idempotency_key: job.idempotency_key.to_string(),
            fingerprint: job.fingerprint.to_string(),
            contract: job.contract.to_string(),
            input: job.input.clone(),
            providers: job.providers.iter().map(ToString::to_string).collect(),
            status: job.status(),
            version: job.version,
            completed_by: job.completed_by,
            result: job.result.clone(),
            error: job.error.clone(),
            attempts: job.attempts.iter().map(AttemptView::from).collect(),
            settled: job.is_settled(now),
            settles_at: settles_at.filter(|at| *at > now).map(rfc3339),
            created_at: rfc3339(job.created_at),
            updated_at: rfc3339(job.updated_at),
            expires_at: rfc3339(job.expires_at),
            bill: BillView::new(
                &Bill::of(job),
                engine.currency(),
                engine.bound_of(job, None),
            ),
            interventions: job.interventions.clone(),
        }
    }
}

impl From<&Attempt> for AttemptView {
    fn from(a: &Attempt) -> Self {
        Self {
            number: a.number,
            provider: a.provider.to_string(),
            state: a.state,
            created_at: rfc3339(a.created_at),
            started_at: a.started_at.map(rfc3339),
            finished_at: a.finished_at.map(rfc3339),
            error: a.error.clone(),
            report: a.report.clone(),
            retry_of: a.retry_of,
            not_before: a.not_before.map(rfc3339),
            cleared: (a.cleared).map(|c| ClearedView {
                by: c.by,
                at: rfc3339(c.at),
            }),
            call_id: a.call_id.clone(),
        }
    }
}

pub(super) fn job_response(app: &AppState, status: StatusCode, job: &Job) -> Response {
    let view = JobView::new(job, app.engine.clock.now(), &app.engine);
    (status, Json(view)).into_response()
}

/// Creates the job for an intent, or answers with the job the key already names.
#[utoipa::path(
    post, path = "/v1/jobs", tag = "jobs",
    params(("Idempotency-Key" = String, Header, description = "1-255 visible ASCII characters naming this intent",
            min_length = 1, max_length = 255, pattern = "^[!-~]+$")),
    request_body = CreateJobRequest,
    responses(
        (status = 201, description = "Created; attempt 1 is queued", body = JobView,
         headers(("Location" = String, description = "The job: /v1/jobs/{id}"))),
        (status = 200, description = "Replay of the same intent: the job as it is now", body = JobView,
         headers(("Idempotent-Replayed" = bool, description = "`true`: this key made the job before"))),
        (status = 400, description = "missing_idempotency_key, invalid_idempotency_key, malformed_json, json_too_deep"),
        (status = 401, description = "unauthorized"),
        (status = 409, description = "idempotency_key_reused: `job_id` names the existing job"),
        (status = 413, description = "body_too_large"),
        (status = 415, description = "unsupported_media_type"),
        (status = 422, description = "invalid_request, unknown_contract, unknown_provider, invalid_input"),
        (status = 429, description = "too_many_live_jobs, too_many_creates, too_many_tokens, budget_exceeded: beyond one of the owner's limits; nothing was written",
         headers(("Retry-After" = u64, description = "Seconds until a create may be admitted again"))),
        (status = 503, description = "store_busy: other writers kept winning the owner's ledger; nothing was written, send it again under the same key",
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("bearer" = []))
)]
pub async fn create_job(
    State(app): State<AppState>,
    Caller(owner): Caller,
    Key(sent): Key,
    StrictJson(request): StrictJson<CreateJobRequest>,
) -> Result<Response, ApiError> {
    let new = app.engine.intake(Intake {
        owner,
        key: sent.key,
        contract: request.contract,
        input: request.input,
        providers: request.providers,
    })?;
    match (app.engine)
        .create_job_as_sent(new, sent.literal.as_ref())
        .await?
    {
        CreateOutcome::Created(job) => {
            tracing::info!(job_id = %job.id, contract = %job.contract, "job created");
            let mut response = job_response(&app, StatusCode::CREATED, &job);
            let location = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id))
                .expect("a job id is a valid header value");
            response.headers_mut().insert(header::LOCATION, location);
            Ok(response)
        }
        CreateOutcome::Replayed(job) => {
            tracing::info!(job_id = %job.id, "create replayed");
            let mut response = job_response(&app, StatusCode::OK, &job);
            response
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(response)
        }
        CreateOutcome::Conflict(job) => {
            tracing::info!(job_id = %job.id, "idempotency key reused for another intent");
            Err(ApiError::IdempotencyKeyReused { job_id: job.id })
        }
    }
}

pub(super) fn job_id(raw: &str) -> Result<JobId, ApiError> {
    JobId::parse(raw).map_err(|_| ApiError::JobNotFound)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetParams {
    /// Hold the answer up to this many seconds (at most 25) until the job changes or is settled.
    #[param(minimum = 0, maximum = 25)]
    wait: Option<u64>,
}

/// The longest `?wait=` accepted, in seconds.
const MAX_WAIT_SECONDS: u64 = 25;

/// While a long poll waits, how often it reads the job again in case another process changed it.
const POLL_EVERY: Duration = Duration::seconds(1);

/// One of the caller's jobs, with its attempts, and its `ETag`.
///
/// With `?wait=N` the answer waits (up to N seconds) until the job differs from what the client has seen: the
/// version named by `If-None-Match`, else the job as it is when the request arrives (a settled job then answers at
/// once). A failed job that is not settled yet changes when it settles. If nothing changed in time, the answer is
/// 304 when the client named a version (`If-None-Match`), else 200 with the job as it is.
#[utoipa::path(
    get, path = "/v1/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "The job's id"), GetParams,
           ("If-None-Match" = Option<String>, Header, description = "The ETag of the version the client has")),
    responses(
        (status = 200, body = JobView, headers(("ETag" = String, description = "The version of this job view"))),
        (status = 304, description = "Not modified: the job is still the version named by If-None-Match",
         headers(("ETag" = String, description = "The version the client has"))),
        (status = 400, description = "invalid_parameter"),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "job_not_found (also for another owner's job)"),
    ),
    security(("bearer" = []))
)]
pub async fn get_job(
    State(app): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    params: Result<Query<GetParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::InvalidParameter(e.body_text()))?;
    let wait = params.wait.unwrap_or(0);
    if wait > MAX_WAIT_SECONDS {
        return Err(ApiError::InvalidParameter(format!(
            "wait must be 0 to {MAX_WAIT_SECONDS} seconds"
        )));
    }
    let id = job_id(&id)?;
    let engine = &app.engine;
    let actor = Actor::from(viewer);
    // Watch before the first read, so that no change between the two is missed.
    let mut changes = engine.watch(&id);
    let read = || async {
        let job = engine
            .job_for(&actor, &id)
            .await?
            .ok_or(ApiError::JobNotFound)?;
        Ok::<_, ApiError>(TaggedView::new(&job, engine))
    };
    let first = read().await?;
    // What the client has seen: the versions it names (a list, weak tags or `*`, compared as RFC 9110 §13.1.2
    // says; a malformed header is ignored), else the job as it is now (unless that is settled).
    let named = headers.typed_get::<IfNoneMatch>();
    let seen = match &named {
        Some(tags) => tags.clone(),
        None if wait == 0 || first.view.settled => return Ok(first.into_response()),
        None => IfNoneMatch::from(first.tag()),
    };
    // A 304 answers only a request that named a version (RFC 9110 §15.4.5).
    let answer = |tagged: TaggedView| match &named {
        Some(_) => tagged.or_not_modified(&seen),
        None => tagged.into_response(),
    };
    if seen.precondition_passes(&first.tag()) || wait == 0 {
        return Ok(answer(first));
    }
    let mut deadline = engine.clock.sleep(Duration::seconds(wait as i64));
    loop {
        // A failed job that is not settled yet becomes settled without a write: wake up then.
        let settling = first_settles(&first, engine.clock.now());
        let last = tokio::select! {
            () = &mut deadline => return Ok(answer(read().await?)),
            last = changes.changed() => last,
            () = engine.clock.sleep(POLL_EVERY.min(settling)) => None,
        };
        // A change that made the job final brought it along: no write can change it any more, so it is not read.
        let now = match last {
            Some(job) if !job.is_expired(engine.clock.now()) => TaggedView::new(&job, engine),
            _ => read().await?,
        };
        if seen.precondition_passes(&now.tag()) {
            return Ok(now.into_response());
        }
    }
}

/// How long until the job `tagged` shows settles, if it is waiting to (else a long time).
fn first_settles(tagged: &TaggedView, now: Timestamp) -> Duration {
    tagged
        .settles_at
        .map_or(Duration::days(1), |at| (at - now).max(Duration::zero()))
}

/// A job's view with its entity tag: a hash of exactly what the client would see.
struct TaggedView {
    view: JobView,
    etag: String,
    /// When an unsettled failed job settles.
    settles_at: Option<Timestamp>,
}

impl TaggedView {
    fn new(job: &Job, engine: &Engine) -> Self {
        let now = engine.clock.now();
        let view = JobView::new(job, now, engine);
        let bytes = serde_json::to_vec(&view).expect("a job view always serialises");
        let etag = format!("\"{}\"", &hex::encode(Sha256::digest(bytes))[..32]);
        let settles_at = job.settles_at().filter(|at| !view.settled && *at > now);
        Self {
            view,
            etag,
            settles_at,
        }
    }

    fn tag(&self) -> ETag {
        self.etag
            .parse()
            .expect("a job's entity tag is a valid ETag")
    }

    /// 304 if the client already has this version, else the job.
    fn or_not_modified(self, seen: &IfNoneMatch) -> Response {
        if !seen.precondition_passes(&self.tag()) {
            (StatusCode::NOT_MODIFIED, [(header::ETAG, self.etag)]).into_response()
        } else {
            self.into_response()
        }
    }
}

impl IntoResponse for TaggedView {
    fn into_response(self) -> Response {
        (StatusCode::OK, [(header::ETAG, self.etag)], Json(self.view)).into_response()
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only jobs with this status.
    status: Option<JobStatus>,
    /// 1 to 100; default 20.
    #[param(minimum = 1, maximum = 100)]
    limit: Option<usize>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Only the job this `Idempotency-Key` names (the key as it was sent, bare or quoted): the page holds it, or
    /// nothing.
    /// For a client that kept the key and lost the rest; no body is resent, nothing is created.
    idempotency_key: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobView>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// The caller's jobs, newest first.
#[utoipa::path(
    get, path = "/v1/jobs", tag = "jobs",
    params(ListParams),
    responses(
        (status = 200, body = JobList),
        (status = 400, description = "invalid_parameter"),
        (status = 401, description = "unauthorized"),
    ),
    security(("bearer" = []))
)]
pub async fn list_jobs(
    State(app): State<AppState>,
    Caller(owner): Caller,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<JobList>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::InvalidParameter(e.body_text()))?;
    let limit = params.limit.unwrap_or(ListQuery::DEFAULT_LIMIT);
    if !(1..=ListQuery::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::InvalidParameter(format!(
            "limit must be 1 to {}",
            ListQuery::MAX_LIMIT
        )));
    }
    let cursor = params
        .cursor
        .map(|c| c.parse::<Cursor>())
        .transpose()
        .map_err(|e| ApiError::InvalidParameter(e.to_string()))?;
    let query = ListQuery {
        status: params.status,
        limit,
        cursor,
        created_before: None,
    };
    let page = match params.idempotency_key {
        None => app.engine.list_jobs(&owner, &query).await?,
        Some(_) if query.cursor.is_some() => {
            return Err(ApiError::InvalidParameter(
                "idempotency_key names one job: it takes no cursor".into(),
            ));
        }
        Some(key) => {
            let sent = SentKey::read(&key)
                .map_err(|e| ApiError::InvalidParameter(format!("idempotency_key: {e}")))?;
            let found = match &sent.literal {
                Some(literal) => app.engine.find_job(&owner, literal).await?,
                None => None,
            };
            let found = match found {
                Some(job) => Some(job),
                None => app.engine.find_job(&owner, &sent.key).await?,
            };
            JobPage {
                jobs: found
                    .into_iter()
                    .filter(|job| query.status.is_none_or(|s| job.status() == s))
                    .collect(),
                next_cursor: None,
            }
        }
    };
    let now = app.engine.clock.now();
    Ok(Json(JobList {
        jobs: (page.jobs.iter())
            .map(|job| JobView::new(job, now, &app.engine))
            .collect(),
        next_cursor: page.next_cursor.map(|c| c.to_string()),
    }))
}

/// Cancels the job: every live attempt is cancelled and any later result discarded. Idempotent.
#[utoipa::path(
    post, path = "/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "The job's id"), ("Idempotency-Key" = Option<String>, Header, description = "Optional: the same request sent again under it acts once (1-255 visible ASCII characters, bare or as a quoted string)")),
    responses(
        (status = 200, description = "The job, cancelled", body = JobView),
        (status = 400, description = "invalid_idempotency_key"),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "job_not_found"),
        (status = 409, description = "job_finished: it already succeeded"),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_job(
    State(app): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    MaybeKey(key): MaybeKey,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let actor = Actor::from(viewer);
    let job = app.engine.cancel_job(&actor, &id, key.as_ref()).await?;
    Ok(job_response(&app, StatusCode::OK, &job))
}
