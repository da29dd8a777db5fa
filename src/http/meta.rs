//! The service's own endpoints: liveness, and the operators' counters.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Operator;
use super::error::ApiError;
use crate::engine::Served;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    status: &'static str,
    /// The config and contracts this process serves, by fingerprint.
    #[serde(flatten)]
    served: Served,
}

/// Liveness, and what this process serves: the fingerprints of its config file and its contracts.
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, body = Health)))]
pub async fn healthz(State(app): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        served: app.engine.served(),
    })
}

/// Counters and histograms in the Prometheus text format (`docs/operations.md` lists them). They cover every owner's
/// activity, so only the operators' metrics token reads them.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses(
        (status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain"),
        (status = 401, description = "unauthorized"),
        (status = 403, description = "forbidden: an owner's token, not the metrics token"),
    ),
    security(("bearer" = [])))]
pub async fn metrics(
    State(app): State<AppState>,
    _: Operator,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    // An exporter without text prints EMF lines for CloudWatch instead (Lambda, where `Operator` already refuses).
    let text = app.engine.metrics.render().ok_or(ApiError::Forbidden)?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    ))
}
