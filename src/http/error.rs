//! `ApiError`: every answer that is not a success, with its status and its stable `code`, written as RFC 9457
//! `application/problem+json`. Internal errors are logged with their cause chain and answered with a bare 500.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::contracts::InputError;
use crate::domain::{AttemptState, JobId, JobStatus, LimitReached, Refusal};
use crate::engine::Refused;
use crate::json::JsonError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401 `unauthorized`: no bearer token, or one that names no owner.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// 403 `forbidden`: a valid credential that does not reach this endpoint (`/metrics`, the operators' view
    /// and another owner's usage want an operator's).
    #[error("this is for operators: send an operator's credential")]
    Forbidden,
    /// 429 `too_many_live_jobs`, `too_many_creates`, `too_many_tokens` or `budget_exceeded`, with `Retry-After`: a create, or a manual
    /// attempt that would make a job live again, beyond one of its owner's limits. Nothing was written; a replay of
    /// an existing job is never refused.
    #[error("{0}")]
    Limit(LimitReached),
    /// 400 `missing_idempotency_key`.
    #[error("this request needs an Idempotency-Key header")]
    MissingIdempotencyKey,
    /// 400 `invalid_idempotency_key`.
    #[error("{0}")]
    InvalidIdempotencyKey(String),
    /// 415 `unsupported_media_type`: the body is not declared as JSON.
    #[error("send the body as application/json")]
    UnsupportedMediaType,
    /// 413 `body_too_large`.
    #[error("the body is larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// 413 `input_too_large`: the input, as stored, is longer than a job may keep.
    #[error("the input is {size} bytes of JSON as stored; at most {limit} are kept")]
    InputTooLarge { size: usize, limit: usize },
    /// 400 `malformed_json`: not JSON at all, or an object names a member twice.
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    /// 400 `json_too_deep`.
    #[error("the body nests arrays and objects deeper than {limit} levels")]
    JsonTooDeep { limit: usize },
    /// 422 `invalid_request`: JSON, but not the shape this call takes (not an object, unknown or missing fields,
    /// wrong types).
    #[error("{0}")]
    InvalidRequest(String),
    /// 400 `invalid_parameter`: a query parameter that cannot be used.
    #[error("{0}")]
    InvalidParameter(String),
    /// 422 `unknown_contract`.
    #[error("there is no contract {0:?}; GET /v1/contracts lists them")]
    UnknownContract(String),
    /// 422 `unknown_provider`.
    #[error("there is no provider {0:?}; GET /v1/providers lists them")]
    UnknownProvider(String),
    /// 422 `invalid_input`: the input breaks the contract's input schema; `errors` lists where.
    #[error("the input does not satisfy the contract's input schema")]
    InvalidInput(Vec<InputError>),
    /// 409 `idempotency_key_reused`: the key names another intent; `job_id` is that job.
    #[error(
        "this Idempotency-Key was already used with a different request; send a new key for a new intent"
    )]
    IdempotencyKeyReused { job_id: JobId },
    /// 409 `attempt_in_progress`: an attempt is still `queued`, `started` or `unknown`.
    #[error("attempt {number} is still {}; resolve or cancel it first", .state.as_str())]
    AttemptInProgress { number: u32, state: AttemptState },
    /// 409 `attempt_limit_reached`: the job has as many attempts as one job may have.
    #[error("the job already has {limit} attempts, the most one job may have")]
    AttemptLimitReached { limit: u32 },
    /// 409 `attempt_not_cancellable`: the attempt already ended.
    #[error("attempt {number} is already {}", .state.as_str())]
    AttemptNotCancellable { number: u32, state: AttemptState },
    /// 404 `attempt_not_found`.
    #[error("the job has no attempt {0}")]
    AttemptNotFound(u32),
    /// 404 `job_not_found`: no such job for this owner (another owner's job answers the same).
    #[error("no job with this id")]
    JobNotFound,
    /// 409 `job_finished`.
    #[error("the job is already {}", .status.as_str())]
    JobFinished { status: JobStatus },
    /// 422 `endpoint_refused`: not an http(s) URL, or one on a loopback, private or link-local address.
    #[error("{0}")]
    EndpointRefused(String),
    /// 404 `endpoint_not_found`: the owner has registered no endpoint for completion events.
    #[error("no endpoint is registered; PUT /v1/endpoint registers one")]
    EndpointNotFound,
    /// 404 `not_found`: no such endpoint.
    #[error("no such endpoint; GET /openapi.json lists them")]
    NotFound,
    /// 405 `method_not_allowed`.
    #[error("this endpoint does not take this method; GET /openapi.json lists them")]
    MethodNotAllowed,
    /// 503 `store_busy`, with `Retry-After`: other writers kept winning a guarded write of shared state (an owner's
    /// ledger under a burst of its creates) through every try. Nothing was written by this request: send it again,
    /// under the same `Idempotency-Key`.
    #[error(
        "the store is busy with other writes to what this request shares; send it again shortly"
    )]
    StoreBusy,
    /// 500 `internal`: logged with its cause; the answer says nothing more.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            Self::Limit(limit) => (
                StatusCode::TOO_MANY_REQUESTS,
                match limit {
                    LimitReached::LiveJobs { .. } => "too_many_live_jobs",
                    LimitReached::CreateRate { .. } => "too_many_creates",
                    LimitReached::TokenRate { .. } => "too_many_tokens",
                    LimitReached::Budget { .. } => "budget_exceeded",
                },
            ),
            Self::MissingIdempotencyKey => (StatusCode::BAD_REQUEST, "missing_idempotency_key"),
            Self::InvalidIdempotencyKey(_) => (StatusCode::BAD_REQUEST, "invalid_idempotency_key"),
            Self::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            Self::InputTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "input_too_large"),
            Self::MalformedJson(_) => (StatusCode::BAD_REQUEST, "malformed_json"),
            Self::JsonTooDeep { .. } => (StatusCode::BAD_REQUEST, "json_too_deep"),
            Self::InvalidRequest(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            Self::InvalidParameter(_) => (StatusCode::BAD_REQUEST, "invalid_parameter"),
            Self::UnknownContract(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_contract"),
            Self::UnknownProvider(_) => (StatusCode::UNPROCESSABLE_ENTITY, "unknown_provider"),
            Self::InvalidInput(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
            Self::IdempotencyKeyReused { .. } => (StatusCode::CONFLICT, "idempotency_key_reused"),
            Self::JobNotFound => (StatusCode::NOT_FOUND, "job_not_found"),
            Self::JobFinished { .. } => (StatusCode::CONFLICT, "job_finished"),
            Self::AttemptInProgress { .. } => (StatusCode::CONFLICT, "attempt_in_progress"),
            Self::AttemptNotCancellable { .. } => (StatusCode::CONFLICT, "attempt_not_cancellable"),
            Self::AttemptLimitReached { .. } => (StatusCode::CONFLICT, "attempt_limit_reached"),
            Self::AttemptNotFound(_) => (StatusCode::NOT_FOUND, "attempt_not_found"),
            Self::EndpointRefused(_) => (StatusCode::UNPROCESSABLE_ENTITY, "endpoint_refused"),
            Self::EndpointNotFound => (StatusCode::NOT_FOUND, "endpoint_not_found"),
            Self::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::StoreBusy => (StatusCode::SERVICE_UNAVAILABLE, "store_busy"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// The RFC 9457 body, as documented in the OpenAPI document.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `urn:onejob:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    /// Stable and snake_case: branch on this.
    pub code: String,
    pub detail: String,
    /// Set on `idempotency_key_reused`: the job the key already names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Set on `invalid_input`: where the input breaks the schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<InputError>>,
    /// Set on `job_finished`: the status that makes the job finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_status: Option<JobStatus>,
    /// Set on `body_too_large`, `input_too_large`, `json_too_deep` and `attempt_limit_reached`: the limit that was
    /// passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let detail = if let Self::Internal(source) = &self {
            tracing::error!(error = %crate::telemetry::error_chain(source.as_ref()), "internal error");
            "internal error".to_owned()
        } else {
            self.to_string()
        };
        let mut problem = Problem {
            kind: format!("urn:onejob:problem:{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            code: code.to_owned(),
            detail,
            job_id: None,
            errors: None,
            job_status: None,
            limit: None,
        };
        match self {
            Self::InvalidInput(ref errors) => problem.errors = Some(errors.clone()),
            Self::IdempotencyKeyReused { ref job_id } => problem.job_id = Some(job_id.to_string()),
            Self::JobFinished { status } => problem.job_status = Some(status),
            Self::BodyTooLarge { limit }
            | Self::JsonTooDeep { limit }
            | Self::InputTooLarge { limit, .. } => problem.limit = Some(limit),
            Self::AttemptLimitReached { limit } => problem.limit = Some(limit as usize),
            _ => {}
        }
        let mut response = (status, axum::Json(problem)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if matches!(self, Self::Unauthorized) {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"onejob\""),
            );
        }
        if let Self::Limit(limit) = self {
            // Whole seconds, rounded up: never sooner than the limit admits again.
            let ms = limit.retry_after().num_milliseconds().max(0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from((ms + 999) / 1000));
        }
        if matches!(self, Self::StoreBusy) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<JsonError> for ApiError {
    fn from(e: JsonError) -> Self {
        match e {
            JsonError::TooDeep { limit } => Self::JsonTooDeep { limit },
            JsonError::Malformed(why) => Self::MalformedJson(why),
            JsonError::Shape(why) => Self::InvalidRequest(why),
        }
    }
}

impl From<Refused> for ApiError {
    fn from(e: Refused) -> Self {
        match e {
            Refused::InputTooLarge { size, limit } => Self::InputTooLarge { size, limit },
            Refused::UnknownContract(name) => Self::UnknownContract(name),
            Refused::UnknownProvider(name) => Self::UnknownProvider(name),
            Refused::Chain(why) => Self::InvalidRequest(why),
            Refused::InvalidInput(errors) => Self::InvalidInput(errors),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Self::JobNotFound,
            StoreError::Refused(Refusal::JobFinished { status }) => Self::JobFinished { status },
            StoreError::Refused(Refusal::AttemptInProgress { number, state }) => {
                Self::AttemptInProgress { number, state }
            }
            StoreError::Refused(Refusal::NoSuchAttempt { number }) => Self::AttemptNotFound(number),
            StoreError::Refused(Refusal::AttemptLimitReached { limit }) => {
                Self::AttemptLimitReached { limit }
            }
            StoreError::Refused(Refusal::Limit(limit)) => Self::Limit(limit),
            StoreError::Contended(what) => {
                tracing::warn!(contended = %what, "a guarded write kept losing to other writers: 503");
                Self::StoreBusy
            }
            // The API's only attempt transition is the out-of-band cancel.
            StoreError::Refused(Refusal::InvalidTransition { number, from, .. }) => {
                Self::AttemptNotCancellable {
                    number,
                    state: from,
                }
            }
            other => Self::Internal(Box::new(other)),
        }
    }
}
