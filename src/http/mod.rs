//! One axum [`router`] for every runtime: the local server serves it with `axum::serve`, tests bind it to port 0.

pub mod attempts;
pub mod auth;
pub mod body;
pub mod error;
pub mod jobs;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use tower_http::trace::TraceLayer;
use utoipa::{OpenApi, ToSchema};

use crate::engine::Engine;
use auth::{Auth, Caller};
use error::{ApiError, Problem};

/// What every handler may use; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub auth: Arc<Auth>,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/contracts", get(list_contracts))
        .route("/v1/providers", get(list_providers))
        .route("/v1/jobs", post(jobs::create_job).get(jobs::list_jobs))
        .route("/v1/jobs/{id}", get(jobs::get_job))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel_job))
        .route("/v1/jobs/{id}/attempts", post(attempts::add_attempt))
        .route("/v1/jobs/{id}/attempts/{number}/cancel", post(attempts::cancel_attempt))
        .fallback(|| async { ApiError::NotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
            tracing::info_span!("request", method = %request.method(), path = %request.uri().path())
        }))
        .with_state(state)
}

#[derive(OpenApi)]
#[openapi(
    info(title = "onejob", description = "One job per user intent: idempotent job creation, guarded attempts, first-wins results."),
    paths(healthz, metrics, list_contracts, list_providers, jobs::create_job, jobs::get_job, jobs::list_jobs, jobs::cancel_job,
          attempts::add_attempt, attempts::cancel_attempt),
    components(schemas(Problem, jobs::JobView, jobs::AttemptView, jobs::JobList, jobs::CreateJobRequest, ContractList,
                       ProviderList, attempts::AddAttemptRequest)),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI 3.1 document of this API.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi_document())
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
        (status = 401, description = "unauthorized", body = Problem, content_type = "application/problem+json"),
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

/// Counters in the Prometheus text format: creates by outcome, attempts by state, races lost.
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain")))]
async fn metrics(State(app): State<AppState>) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        app.engine.metrics.render(),
    )
}

#[derive(Debug, Serialize, ToSchema)]
struct ProviderView {
    name: String,
    kind: String,
    timeout_ms: u64,
    late_result_ms: u64,
    /// May automatic failover go to this provider?
    qualified: bool,
}

#[derive(Debug, Serialize, ToSchema)]
struct ProviderList {
    providers: Vec<ProviderView>,
}

/// The configured providers.
#[utoipa::path(
    get, path = "/v1/providers", tag = "contracts",
    responses(
        (status = 200, body = ProviderList),
        (status = 401, description = "unauthorized", body = Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
async fn list_providers(State(app): State<AppState>, _: Caller) -> Json<ProviderList> {
    let providers = app
        .engine
        .providers
        .iter()
        .map(|(name, p)| ProviderView {
            name: name.to_string(),
            kind: p.config.kind.as_str().to_owned(),
            timeout_ms: p.config.timeout_ms,
            late_result_ms: p.config.late_result_ms,
            qualified: p.config.qualified,
        })
        .collect();
    Json(ProviderList { providers })
}
