//! One axum [`router`] for every runtime: the local server serves it with `axum::serve`, the API function through
//! `lambda_http`, tests bind it to port 0. Handlers speak only HTTP: the request's rules are extractors (`auth`,
//! `body`), the create's are the engine's intake, every error is an [`error::ApiError`].
//!
//! - `jobs`, `attempts`, `events`: the API's resources; `usage`: what intents cost (a job's bill, an owner's usage);
//!   `operators`: every owner's jobs that need a person; `catalogue`: contracts and providers; `meta`: liveness and
//!   the operators' counters; `page`: the page at `/`; `openapi`: the document of all of them.

pub mod attempts;
pub mod auth;
pub mod body;
pub mod catalogue;
pub mod error;
pub mod events;
pub mod jobs;
pub mod meta;
pub mod openapi;
pub mod operators;
pub mod page;
pub mod usage;

use std::sync::Arc;

use axum::extract::Request;
use axum::routing::get;
use axum::{Json, Router};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::engine::Engine;
use auth::Auth;
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
