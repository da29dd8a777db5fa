//! The catalogue: the contracts this deployment runs (`GET /v1/contracts`) and its providers with their standing
//! (`GET /v1/providers`). Every owner reads both, so they show what is the deployment's and no owner's: the
//! providers' settings and what their qualification on the contracts' own samples found. What other owners' jobs
//! showed — a breaker's counters, production's suspicions and the attempts behind them — and where a provider is
//! (its base URL) are the operators' view (invariant 15).

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::auth::{Caller, Viewer};
use super::error::ApiError;
use super::{AppState, jobs};
use crate::domain::{BreakerState, ErrorInfo, Standing, Suspicion};
use crate::providers::tokens::Encoding;

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
pub struct ContractList {
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
pub async fn list_contracts(State(app): State<AppState>, _: Caller) -> Json<ContractList> {
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

#[derive(Debug, Serialize, ToSchema)]
pub struct ProviderView {
    name: String,
    kind: String,
    model: Option<String>,
    timeout_ms: u64,
    late_result_ms: u64,
    /// Tokens; `null` is unbounded (demo providers).
    context_window: Option<u64>,
    /// How prompts are counted: `bytes` (an upper bound for any byte-level tokenizer), and for OpenAI's models
    /// `bytes, at most 128 per token` (a lower bound too).
    tokenizer: String,
    /// What a qualification is tied to: kind, base URL, model, context window, timeout.
    fingerprint: String,
    /// The provider's standing for each contract's current fingerprint.
    contracts: Vec<StandingView>,
    /// Operators only: where the provider is.
    #[serde(skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
    /// Operators only: its breaker, shared by every worker and moved by every owner's calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker: Option<BreakerView>,
}

#[derive(Debug, Serialize, ToSchema)]
struct BreakerView {
    state: BreakerState,
    #[schema(format = DateTime)]
    open_until: Option<String>,
    /// Failures within the window that tell of the provider's health.
    recent_failures: usize,
    /// How many times it opened.
    trips: u64,
}

#[derive(Debug, Serialize, ToSchema)]
struct StandingView {
    contract: String,
    /// `qualified`: automatic failover may go here. `failed`: qualification ran and failed. `unqualified`: no
    /// qualification for the current fingerprints (never run, or voided by a change), or too old.
    standing: Standing,
    #[schema(format = DateTime)]
    checked_at: Option<String>,
    runs: Option<usize>,
    /// Why it does not stand qualified: the first problem of a failed qualification (on the contract's own
    /// samples), evidence too old (`qualification_stale`), or an answer as a model qualification never saw
    /// (`model_changed`: the provider's own evidence voids the standing until it is qualified again).
    problem: Option<ErrorInfo>,
    /// Operators only: why production suspects the provider (`model_changed`, `contract_broken`) and the attempts
    /// that showed it. `contract_broken` leaves the standing as it is until a new qualification fails;
    /// `model_changed` voids it until one passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    suspected: Option<Suspicion>,
    /// Operators only: the production attempts whose answers broke the contract since it was qualified.
    #[serde(skip_serializing_if = "Option::is_none")]
    strikes: Option<Vec<String>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProviderList {
    providers: Vec<ProviderView>,
}

/// The configured providers, each with its qualification standing per contract. The primary of a chain needs no
/// qualification; automatic failover goes only to a `qualified` provider. An owner sees the deployment's settings
/// and what qualification found; the operators' token also sees base URLs, breakers and production's suspicions.
#[utoipa::path(
    get, path = "/v1/providers", tag = "contracts",
    responses(
        (status = 200, body = ProviderList),
        (status = 401, description = "unauthorized"),
        (status = 500, description = "the job store failed"),
    ),
    security(("bearer" = []))
)]
pub async fn list_providers(
    State(app): State<AppState>,
    viewer: Viewer,
) -> Result<Json<ProviderList>, ApiError> {
    let operator = matches!(viewer, Viewer::Operator(_));
    let engine = &app.engine;
    let mut providers = Vec::new();
    for (name, rows) in engine.standings().await? {
        let Some(p) = engine.providers.get(&name) else {
            continue;
        };
        let breaker = match operator {
            false => None,
            true => {
                let (breaker, state) = engine.breaker(&name).await?;
                Some(BreakerView {
                    state,
                    open_until: breaker.open_until.map(jobs::rfc3339),
                    recent_failures: breaker.failures.len(),
                    trips: breaker.trips,
                })
            }
        };
        let contracts = rows
            .into_iter()
            .map(|row| {
                let evidence = row.evidence.as_ref();
                StandingView {
                    contract: row.contract.to_string(),
                    standing: row.standing,
                    checked_at: evidence.map(|q| jobs::rfc3339(q.checked_at)),
                    runs: evidence.map(|q| q.runs.len()),
                    problem: row.reason,
                    suspected: evidence
                        .and_then(|q| q.suspected.clone())
                        .filter(|_| operator),
                    strikes: evidence.map(|q| q.strikes.clone()).filter(|_| operator),
                }
            })
            .collect();
        providers.push(ProviderView {
            name: name.to_string(),
            kind: p.config.kind().to_owned(),
            model: p.config.model().map(str::to_owned),
            timeout_ms: p.config.timeout_ms(),
            late_result_ms: p.config.late_result_ms(),
            context_window: p.config.context_window(),
            tokenizer: Encoding::of(&p.config).method().to_owned(),
            fingerprint: p.fingerprint.to_string(),
            contracts,
            base_url: p.config.address().filter(|_| operator),
            breaker,
        });
    }
    Ok(Json(ProviderList { providers }))
}
