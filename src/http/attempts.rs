//! The attempt endpoints: a manual retry, and the out-of-band cancel that unblocks an `unknown` attempt.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Caller;
use super::body;
use super::error::ApiError;
use super::jobs::{AttemptView, JobView, job_id, job_response};
use crate::domain::ProviderName;

/// The optional body of `POST /v1/jobs/{id}/attempts`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddAttemptRequest {
    /// The provider to try; by default the next untried provider of the job's chain, else its primary.
    pub provider: Option<String>,
}

/// Queues a new attempt, when none is live and the job has no result.
#[utoipa::path(
    post, path = "/v1/jobs/{id}/attempts", tag = "attempts",
    params(("id" = String, Path, description = "The job's id")),
    request_body(content = Option<AddAttemptRequest>, description = "Optional: no body (or an empty one) is `{}`, the next provider"),
    responses(
        (status = 201, description = "The new attempt, queued", body = AttemptView),
        (status = 400, description = "malformed_json, json_too_deep"),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "job_not_found"),
        (status = 409, description = "attempt_in_progress (one is queued, started or unknown), job_finished, attempt_limit_reached"),
        (status = 413, description = "body_too_large"),
        (status = 415, description = "unsupported_media_type"),
        (status = 422, description = "invalid_request, unknown_provider"),
    ),
    security(("bearer" = []))
)]
pub async fn add_attempt(
    State(app): State<AppState>,
    Caller(owner): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let request: AddAttemptRequest =
        match body::optional_json_value(&headers, body, app.body_limit).await? {
            None => AddAttemptRequest::default(),
            Some(value) => body::shaped(value)?,
        };
    let provider = request
        .provider
        .map(|name| {
            ProviderName::parse(&name)
                .ok()
                .filter(|p| app.engine.providers.contains(p))
                .ok_or(ApiError::UnknownProvider(name))
        })
        .transpose()?;
    let (number, job) = app.engine.add_attempt(&owner, &id, provider).await?;
    let attempt = job.attempt(number).expect("the new attempt is in the job");
    tracing::info!(job_id = %job.id, attempt = number, provider = %attempt.provider, "attempt added by hand");
    Ok((StatusCode::CREATED, Json(AttemptView::from(attempt))).into_response())
}

/// Resolves a live attempt out of band ("stop waiting"): it becomes `cancelled` and failover goes on. If its
/// provider still delivers while the result slot is free, that result wins; later it would be discarded.
#[utoipa::path(
    post, path = "/v1/jobs/{id}/attempts/{number}/cancel", tag = "attempts",
    params(("id" = String, Path, description = "The job's id"), ("number" = u32, Path, description = "The attempt's number")),
    responses(
        (status = 200, description = "The job (also when the attempt was already cancelled: idempotent)", body = JobView),
        (status = 400, description = "invalid_parameter: not an attempt number"),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "job_not_found, attempt_not_found"),
        (status = 409, description = "attempt_not_cancellable: it already ended"),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_attempt(
    State(app): State<AppState>,
    Caller(owner): Caller,
    Path((id, number)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let number: u32 = number
        .parse()
        .map_err(|_| ApiError::InvalidParameter(format!("not an attempt number: {number:?}")))?;
    let job = app.engine.cancel_attempt(&owner, &id, number).await?;
    Ok(job_response(&app, StatusCode::OK, &job))
}
