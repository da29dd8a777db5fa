//! Completion events: the owner's endpoint (`PUT`, `GET`, `DELETE /v1/endpoint`) and a job's deliveries
//! (`GET /v1/jobs/{id}/events`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::{Caller, Viewer};
use super::body::StrictJson;
use super::error::ApiError;
use super::jobs::{job_id, rfc3339};
use crate::domain::{Endpoint, EventDelivery};
use crate::engine::Actor;
use crate::requests::EndpointRequest;

/// The owner's endpoint and the secret its events are signed with.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointView {
    pub url: String,
    /// The HMAC-SHA256 key of the `onejob-signature` header: `t=<unix seconds>,v1=<hex HMAC of "<t>.<body>">`.
    pub secret: String,
    pub created_at: String,
    pub updated_at: String,
}

impl From<Endpoint> for EndpointView {
    fn from(e: Endpoint) -> Self {
        Self {
            url: e.url,
            secret: e.secret,
            created_at: rfc3339(e.created_at),
            updated_at: rfc3339(e.updated_at),
        }
    }
}

/// A job's completion events and where each one's delivery stands.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventList {
    /// One per settle, oldest first; empty if the owner had no endpoint when the job ended, or it has not ended.
    pub events: Vec<EventDelivery>,
}

/// Registers (or moves) the caller's endpoint for completion events. A job that ends from now on is announced there
/// once it settles: a POST of `{id, type: "job.settled", settled_at, job}` signed with the endpoint's secret, tried
/// again with backoff until it answers 2xx. The secret is made on the first registration and kept by later ones.
#[utoipa::path(
    put, path = "/v1/endpoint", tag = "events",
    request_body = EndpointRequest,
    responses(
        (status = 200, description = "The endpoint, registered", body = EndpointView),
        (status = 400, description = "malformed_json, json_too_deep"),
        (status = 401, description = "unauthorized"),
        (status = 413, description = "body_too_large"),
        (status = 415, description = "unsupported_media_type"),
        (status = 422, description = "invalid_request; endpoint_refused: not http(s), or on a loopback, private or link-local address"),
    ),
    security(("bearer" = []))
)]
pub async fn put_endpoint(
    State(app): State<AppState>,
    Caller(owner): Caller,
    StrictJson(request): StrictJson<EndpointRequest>,
) -> Result<Json<EndpointView>, ApiError> {
    let url = app
        .engine
        .check_endpoint(&request.url)
        .await
        .map_err(|e| ApiError::EndpointRefused(e.to_string()))?;
    let endpoint = app.engine.put_endpoint(&owner, url).await?;
    tracing::info!(%owner, url = %endpoint.url, "endpoint registered");
    Ok(Json(endpoint.into()))
}

/// The caller's endpoint for completion events, with its secret.
#[utoipa::path(
    get, path = "/v1/endpoint", tag = "events",
    responses(
        (status = 200, body = EndpointView),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "endpoint_not_found"),
    ),
    security(("bearer" = []))
)]
pub async fn get_endpoint(
    State(app): State<AppState>,
    Caller(owner): Caller,
) -> Result<Json<EndpointView>, ApiError> {
    let endpoint = app.engine.endpoint(&owner).await?;
    Ok(Json(endpoint.ok_or(ApiError::EndpointNotFound)?.into()))
}

/// Removes the caller's endpoint: events not delivered yet are dropped. Idempotent.
#[utoipa::path(
    delete, path = "/v1/endpoint", tag = "events",
    responses(
        (status = 204, description = "No endpoint any more (also when there was none)"),
        (status = 401, description = "unauthorized"),
    ),
    security(("bearer" = []))
)]
pub async fn delete_endpoint(
    State(app): State<AppState>,
    Caller(owner): Caller,
) -> Result<Response, ApiError> {
    app.engine.remove_endpoint(&owner).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The job's completion events: each one's id, tries, last error and when it was delivered.
#[utoipa::path(
    get, path = "/v1/jobs/{id}/events", tag = "events",
    params(("id" = String, Path, description = "The job's id")),
    responses(
        (status = 200, body = EventList),
        (status = 401, description = "unauthorized"),
        (status = 404, description = "job_not_found (also for another owner's job)"),
    ),
    security(("bearer" = []))
)]
pub async fn list_events(
    State(app): State<AppState>,
    viewer: Viewer,
    Path(id): Path<String>,
) -> Result<Json<EventList>, ApiError> {
    let id = job_id(&id)?;
    let events = app
        .engine
        .job_events(&Actor::from(viewer), &id)
        .await?
        .ok_or(ApiError::JobNotFound)?;
    Ok(Json(EventList { events }))
}
