//! The OpenAPI document, built from the routes themselves: each route is declared once, with its operation
//! (`utoipa-axum`), and every problem answer gets its body here, once: `application/problem+json`, a [`Problem`].
//! The document is written for client generators to take as it is: an optional parameter or body is declared as
//! its type and not required (never "it or null"), and every header an answer carries is declared on it.

use utoipa::openapi::header::Header;
use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::{SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    Content, Object, OpenApi as Document, Ref, RefOr, Required, Response, Schema,
};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::Problem;
use super::{AppState, attempts, catalogue, events, jobs, meta, operators, usage};

#[derive(OpenApi)]
#[openapi(
    info(title = "onejob", description = "One job per user intent: idempotent job creation, guarded attempts, first-wins results."),
    components(schemas(Problem, jobs::JobView, jobs::AttemptView, jobs::JobList, crate::requests::CreateJobRequest, catalogue::ContractList,
                       catalogue::ProviderList, crate::requests::AddAttemptRequest, crate::requests::EndpointRequest,
                       events::EndpointView, events::EventList, crate::domain::EventDelivery, usage::BillView,
                       usage::ShareView, usage::UsageView, usage::UsageRowView, crate::domain::Intervention)),
    modifiers(&BearerAuth),
)]
struct ApiDoc;

/// Every route of the API with its operation.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(meta::healthz))
        .routes(routes!(meta::metrics))
        .routes(routes!(catalogue::list_contracts))
        .routes(routes!(catalogue::list_providers))
        .routes(routes!(jobs::create_job, jobs::list_jobs))
        .routes(routes!(jobs::get_job))
        .routes(routes!(jobs::cancel_job))
        .routes(routes!(attempts::add_attempt))
        .routes(routes!(attempts::cancel_attempt))
        .routes(routes!(
            events::put_endpoint,
            events::get_endpoint,
            events::delete_endpoint
        ))
        .routes(routes!(events::list_events))
        .routes(routes!(usage::get_usage))
        .routes(routes!(operators::needing_a_person))
}

/// The document once every route is in: each operation may answer 500, every problem answer (4xx, 5xx) has the
/// problem body, a 401 names its scheme (`WWW-Authenticate`), and nothing optional is declared nullable.
pub fn finish(mut document: Document) -> Document {
    for item in document.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            add_problem_bodies(operation);
            optional_is_absent(operation);
        }
    }
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

fn add_problem_bodies(operation: &mut Operation) {
    let problem = Content::new(Some(Ref::from_schema_name("Problem")));
    let responses = &mut operation.responses.responses;
    responses
        .entry("500".into())
        .or_insert_with(|| RefOr::T(Response::new("internal: the server failed")));
    for (status, response) in responses.iter_mut() {
        let RefOr::T(response) = response else {
            continue;
        };
        if status.starts_with(['4', '5']) && response.content.is_empty() {
            response
                .content
                .insert("application/problem+json".into(), problem.clone());
        }
        if status == "401" {
            let mut challenge = Header::new(Object::with_type(Type::String));
            challenge.description = Some("`Bearer realm=\"onejob\"`".into());
            response
                .headers
                .insert("WWW-Authenticate".into(), challenge);
        }
    }
}

/// utoipa declares an optional header as "string or null" and an optional body as "one of null or the body";
/// generated clients then send a `null`, or cannot leave the header out. Optional means absent: the type alone,
/// not required.
fn optional_is_absent(operation: &mut Operation) {
    for parameter in operation.parameters.iter_mut().flatten() {
        if parameter.required == Required::False
            && let Some(RefOr::T(Schema::Object(object))) = &mut parameter.schema
        {
            without_null(object);
        }
    }
    if let Some(body) = &mut operation.request_body
        && body.required != Some(Required::True)
    {
        for content in body.content.values_mut() {
            if let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema {
                let mut others = one_of.items.iter().filter(|item| !is_null(item));
                if let (Some(only), None) = (others.next(), others.next()) {
                    content.schema = Some(only.clone());
                }
            }
        }
    }
}

fn without_null(object: &mut Object) {
    if let SchemaType::Array(types) = &mut object.schema_type {
        types.retain(|t| *t != Type::Null);
        if let [only] = types.as_slice() {
            object.schema_type = SchemaType::Type(only.clone());
        }
    }
}

fn is_null(schema: &RefOr<Schema>) -> bool {
    matches!(schema, RefOr::T(Schema::Object(o)) if o.schema_type == SchemaType::Type(Type::Null))
}
