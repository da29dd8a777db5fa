//! One axum [`router`] for every runtime: the local server serves it with `axum::serve`, tests bind it to port 0.

pub mod auth;
pub mod body;
pub mod error;
pub mod jobs;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::Value;
use tower_http::trace::TraceLayer;
use utoipa::{OpenApi, ToSchema};

use crate::clock::Clock;
use crate::config::ProviderConfig;
use crate::contracts::Contracts;
use crate::domain::ProviderName;
use crate::store::JobStore;
use auth::{Caller, Tokens};
use error::{ApiError, Problem};

/// What every handler may use; cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub store: Arc<dyn JobStore>,
    pub clock: Arc<dyn Clock>,
    pub contracts: Arc<Contracts>,
    pub providers: Arc<BTreeMap<ProviderName, ProviderConfig>>,
    pub tokens: Arc<Tokens>,
    /// Largest request body accepted, in bytes.
    pub body_limit: usize,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/v1/contracts", get(list_contracts))
        .route("/v1/jobs", post(jobs::create_job).get(jobs::list_jobs))
        .route("/v1/jobs/{id}", get(jobs::get_job))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel_job))
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
    paths(healthz, list_contracts, jobs::create_job, jobs::get_job, jobs::list_jobs, jobs::cancel_job),
    components(schemas(Problem, jobs::JobView, jobs::AttemptView, jobs::JobList, jobs::CreateJobRequest, ContractList)),
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
