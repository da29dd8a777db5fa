//! The bodies of the API's requests, as the strict reader (`json::shaped`) reads them: objects only, no field the
//! type does not name.

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

/// The body of `POST /v1/jobs`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateJobRequest {
    /// `name@version` of a contract from `GET /v1/contracts`.
    #[schema(example = "summarize@1")]
    pub contract: String,
    /// Must satisfy the contract's input schema.
    #[schema(value_type = Object, example = json!({"text": "A long text to summarise."}))]
    pub input: Value,
    /// Provider chain, primary first, no repeats; the contract's default chain when absent.
    #[serde(default)]
    #[schema(min_items = 1)]
    pub providers: Option<Vec<String>>,
}

/// The optional body of `POST /v1/jobs/{id}/attempts`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddAttemptRequest {
    /// The provider to try; by default the next untried provider of the job's chain, else its primary.
    pub provider: Option<String>,
}

/// The body of `PUT /v1/endpoint`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointRequest {
    /// Where completion events are POSTed: an http or https URL on a public address.
    pub url: String,
}
