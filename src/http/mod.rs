//! One axum [`router`] for every runtime: the local server serves it with `axum::serve`, tests bind it to port 0.

pub mod attempts;
pub mod auth;
pub mod body;
pub mod error;
pub mod events;
pub mod jobs;
pub mod openapi;
pub mod page;
pub mod providers;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::ToSchema;

use crate::engine::Engine;
use auth::{Auth, Caller, Operator};
use error::ApiError;

/// What every handler may use; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub auth: Arc<Auth>,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
}

pub fn router(state: AppState) -> Router {
    let (api, document) = openapi::api_routes().split_for_parts();
    let document = Arc::new(openapi::finish(document));
    api.route("/", get(page::index))
        .route("/assets/app.js", get(page::script))
        .route("/assets/style.css", get(page::style))
        .route(
            "/openapi.json",
            get(move || std::future::ready(Json(document.as_ref().clone()))),
        )
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        // Innermost first: a panic is a problem+json 500, the request id goes back on every answer, the request's
        // span names it, and a request without one is given one.
        .layer(CatchPanicLayer::custom(|_| {
            axum::response::IntoResponse::into_response(ApiError::Internal("a handler panicked".into()))
        }))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
            let id = request
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id = %id)
        }))
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(state)
}

/// The OpenAPI 3.1 document of this API.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    openapi::finish(openapi::api_routes().into_openapi())
}

#[derive(Debug, Serialize, ToSchema)]
struct Health {
    status: &'static str,
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

#[derive(Debug, Serialize, ToSchema)]
struct ContractView {
    /// `name@version`.
    contract: String,
    description: String,
    #[schema(value_type = Object)]
    input_schema: Value,
    #[schema(value_type = Object)]
    output_schema: Value,
    temperature: f64,
    max_output_tokens: u32,
    /// The default provider chain.
    providers: Vec<String>,
    #[schema(value_type = Vec<Object>)]
    samples: Vec<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
struct ContractList {
    contracts: Vec<ContractView>,
}

/// The job contracts this server knows.
#[utoipa::path(
    get, path = "/v1/contracts", tag = "contracts",
    responses(
        (status = 200, body = ContractList),
        (status = 401, description = "unauthorized"),
    ),
    security(("bearer" = []))
)]
async fn list_contracts(State(app): State<AppState>, _: Caller) -> Json<ContractList> {
    let contracts = app
        .engine
        .contracts
        .iter()
        .map(|c| ContractView {
            contract: c.reference.to_string(),
            description: c.description.clone(),
            input_schema: c.input_schema.clone(),
            output_schema: c.output_schema.clone(),
            temperature: c.temperature,
            max_output_tokens: c.max_output_tokens,
            providers: c.providers.iter().map(ToString::to_string).collect(),
            samples: c.samples.clone(),
        })
        .collect();
    Json(ContractList { contracts })
}

/// Counters and histograms in the Prometheus text format (the README lists them). They cover every owner's
/// activity, so only the operators' metrics token reads them.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses(
        (status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain"),
        (status = 401, description = "unauthorized"),
        (status = 403, description = "forbidden: an owner's token, not the metrics token"),
    ),
    security(("bearer" = [])))]
async fn metrics(
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
