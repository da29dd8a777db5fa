//! The OpenAPI document, built from the routes themselves: each route is declared once, with its operation
//! (`utoipa-axum`), and every problem answer gets its body here, once: `application/problem+json`, a [`Problem`].

use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, OpenApi as Document, Ref, RefOr, Response};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::Problem;
use super::{AppState, ContractList, ProviderList, StandingView, attempts, jobs};

#[derive(OpenApi)]
#[openapi(
    info(title = "onejob", description = "One job per user intent: idempotent job creation, guarded attempts, first-wins results."),
    components(schemas(Problem, jobs::JobView, jobs::AttemptView, jobs::JobList, jobs::CreateJobRequest, ContractList,
                       ProviderList, StandingView, attempts::AddAttemptRequest)),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

/// Every route of the API with its operation.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(super::healthz))
        .routes(routes!(super::metrics))
        .routes(routes!(super::list_contracts))
        .routes(routes!(super::list_providers))
        .routes(routes!(jobs::create_job, jobs::list_jobs))
        .routes(routes!(jobs::get_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(attempts::add_attempt))
        .routes(routes!(attempts::cancel_attempt))
}

/// The document once every route is in: each operation may answer 500, and every problem answer (4xx, 5xx) has
/// the problem body.
pub fn finish(mut document: Document) -> Document {
    ProblemBodies.modify(&mut document);
    document
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

struct ProblemBodies;

impl Modify for ProblemBodies {
    fn modify(&self, openapi: &mut Document) {
        let problem = Content::new(Some(Ref::from_schema_name("Problem")));
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            for operation in operations.into_iter().flatten() {
                add_problem_bodies(operation, &problem);
            }
        }
    }
}

fn add_problem_bodies(operation: &mut Operation, problem: &Content) {
    let responses = &mut operation.responses.responses;
    responses
        .entry("500".into())
        .or_insert_with(|| RefOr::T(Response::new("internal: the server failed")));
    for (status, response) in responses.iter_mut() {
        if let RefOr::T(response) = response
            && status.starts_with(['4', '5'])
            && response.content.is_empty()
        {
            response
                .content
                .insert("application/problem+json".into(), problem.clone());
        }
    }
}
