//! The attempt endpoints: a manual retry, and the out-of-band cancel that unblocks an `unknown` attempt.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::auth::Viewer;
use super::body::{MaybeJson, MaybeKey};
use super::error::ApiError;
use super::jobs::{AttemptView, JobView, job_id, job_response};
use crate::domain::{JobId, Refusal};
use crate::engine::Actor;
use crate::requests::AddAttemptRequest;
use crate::store::StoreError;

/// Queues a new attempt, when none is live and the job has no result. Under an `Idempotency-Key` a manual retry is
/// one intent: sent again, it answers with the attempt it queued (200, `Idempotent-Replayed: true`), whatever that
/// attempt did since; another request under the same key on this job is 409 `idempotency_key_reused`.
#[utoipa::path(
    post, path = "/v1/jobs/{id}/attempts", tag = "attempts",
    params(("id" = String, Path, description = "The job's id"), ("Idempotency-Key" = Option<String>, Header, description = "Optional: the same request sent again under it acts once (1-255 visible ASCII characters, bare or as a quoted string)")),
    request_body(content = Option<AddAttemptRequest>, description = "Optional: no body (or an empty one) is `{}`, the next provider"),
    responses(
        (status = 201, description = "The new attempt, queued", body = AttemptView),
        (status = 200, description = "This request (its Idempotency-Key) queued the attempt before: that attempt as it is now", body = AttemptView,
         headers(("Idempotent-Replayed" = bool, description = "`true`: this key queued the attempt before"))),
        (status = 400, description = "malformed_json, json_too_deep, invalid_idempotency_key"),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "job_not_found"),
        (status = 409, description = "attempt_in_progress (one is queued, started or unknown), job_finished, attempt_limit_reached, idempotency_key_reused"),
        (status = 413, description = "body_too_large"),
        (status = 415, description = "unsupported_media_type"),
        (status = 422, description = "invalid_request, unknown_provider"),
        (status = 429, description = "too_many_live_jobs, budget_exceeded: the attempt would make the job live again beyond the owner's limits (an operator acting for the owner too); nothing was written",
         headers(("Retry-After" = u64, description = "Seconds until the attempt may be admitted"))),
        (status = 503, description = "store_busy: other writers kept winning the owner's ledger; nothing was written, send it again",
         headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    security(("bearer" = []))
)]
pub async fn add_attempt(
    State(app): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
    MaybeKey(key): MaybeKey,
    MaybeJson(request): MaybeJson<AddAttemptRequest>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let provider = request
        .provider
        .map(|name| app.engine.provider(&name))
        .transpose()?;
    let added = app
        .engine
        .add_attempt(&Actor::from(viewer), &id, provider, key.as_ref())
        .await
        .map_err(|e| keyed(e, &id))?;
    let attempt = added
        .job
        .attempt(added.number)
        .expect("the attempt is in the job");
    let view = Json(AttemptView::from(attempt));
    if added.replayed {
        tracing::info!(job_id = %id, attempt = added.number, "manual attempt replayed");
        return Ok((
            StatusCode::OK,
            [("idempotent-replayed", HeaderValue::from_static("true"))],
            view,
        )
            .into_response());
    }
    tracing::info!(job_id = %id, attempt = added.number, provider = %attempt.provider, "attempt added by hand");
    Ok((StatusCode::CREATED, view).into_response())
}

/// A store's answer to a write under an `Idempotency-Key`: a key used on job `id` for another request is 409
/// `idempotency_key_reused`, naming the job.
pub(super) fn keyed(e: StoreError, id: &JobId) -> ApiError {
    match e {
        StoreError::Refused(Refusal::KeyReused) => {
            ApiError::IdempotencyKeyReused { job_id: id.clone() }
        }
        other => other.into(),
    }
}

/// Resolves a live attempt out of band ("stop waiting"): it becomes `cancelled` and failover goes on. If its
/// provider still delivers while the result slot is free, that result wins; later it would be discarded.
#[utoipa::path(
    post, path = "/v1/jobs/{id}/attempts/{number}/cancel", tag = "attempts",
    params(("id" = String, Path, description = "The job's id"), ("number" = u32, Path, description = "The attempt's number"), ("Idempotency-Key" = Option<String>, Header, description = "Optional: the same request sent again under it acts once (1-255 visible ASCII characters, bare or as a quoted string)")),
    responses(
        (status = 200, description = "The job (also when the attempt was already cancelled, or this cancel was sent before under its Idempotency-Key)", body = JobView),
        (status = 400, description = "invalid_parameter: not an attempt number; invalid_idempotency_key"),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "job_not_found, attempt_not_found"),
        (status = 409, description = "attempt_not_cancellable: it already ended; idempotency_key_reused"),
    ),
    security(("bearer" = []))
)]
pub async fn cancel_attempt(
    State(app): State<AppState>,
    viewer: Viewer,
    Path((id, number)): Path<(String, String)>,
    MaybeKey(key): MaybeKey,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let number: u32 = number
        .parse()
        .map_err(|_| ApiError::InvalidParameter(format!("not an attempt number: {number:?}")))?;
    let job = app
        .engine
        .cancel_attempt(&Actor::from(viewer), &id, number, key.as_ref())
        .await
        .map_err(|e| keyed(e, &id))?;
    Ok(job_response(&app, StatusCode::OK, &job))
}
