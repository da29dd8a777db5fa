//! What intents cost: a job's bill (part of every job view) and an owner's usage by day and contract
//! (`GET /v1/usage`, for billing exports). Amounts are in the price table's currency; a cost that is not known (an
//! attempt with no answer yet, usage with no price) is listed as such, never counted as zero.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Viewer;
use super::error::ApiError;
use crate::domain::{Bill, Bound, Owner, Share, amount};
use crate::engine::UsageRow;

/// Usage of some attempts.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShareView {
    pub attempts: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Of the input tokens, those read from the provider's cache.
    pub cached_input_tokens: u64,
    /// Of the output tokens, those spent reasoning.
    pub reasoning_tokens: u64,
    /// In the currency, of the attempts that were priced.
    pub cost: f64,
}

impl From<&Share> for ShareView {
    fn from(share: &Share) -> Self {
        Self {
            attempts: share.attempts,
            input_tokens: share.input_tokens,
            output_tokens: share.output_tokens,
            cached_input_tokens: share.cached_input_tokens,
            reasoning_tokens: share.reasoning_tokens,
            cost: amount(share.cost_nanos),
        }
    }
}

/// What the intent cost, by what became of each answer. Every answer a provider was paid for is here: the one
/// kept, the ones discarded (they lost the race, or came after a cancel), the ones that failed the contract.
#[derive(Debug, Serialize, ToSchema)]
pub struct BillView {
    /// The price table's currency.
    pub currency: String,
    /// Everything below together.
    pub total: ShareView,
    /// The answer that is the job's result.
    pub won: ShareView,
    /// Answers paid for and thrown away.
    pub discarded: ShareView,
    /// Failed attempts: answers that broke the contract or were refused, and errors.
    pub failed: ShareView,
    /// Attempts whose call may have been billed but whose usage is not known: `unknown`, in flight, or cancelled
    /// after their call began. Their cost is known only if their answer arrives; it is not zero.
    pub unknown_attempts: Vec<u32>,
    /// Retried by policy while unknown: possibly billed too.
    pub possibly_paid_attempts: Vec<u32>,
    /// Attempts that reported usage with no price configured for their provider: tokens counted, cost not.
    pub unpriced_attempts: Vec<u32>,
    /// Whether `total` is the whole cost (nothing unknown, nothing unpriced).
    pub complete: bool,
    /// The most the attempts whose cost is not known (`unknown_attempts`, `possibly_paid_attempts`) can have
    /// cost: each call's worst case, its prompt's bound and the contract's output budget at the dearest price it
    /// may have had. `total` and this together bound the whole cost.
    pub reserved: ReservedView,
}

/// The upper bound of calls whose cost is not known yet.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReservedView {
    pub attempts: Vec<u32>,
    /// Prompt and answer tokens, at most.
    pub tokens: u64,
    /// In the currency, at most (0 where no price applies).
    pub cost: f64,
}

impl BillView {
    /// `bill` in `currency`, each call whose cost is not known bounded by `worst` ([`crate::domain::Bound`]).
    pub fn new(bill: &Bill, currency: &str, worst: Bound) -> Self {
        let mut attempts = [bill.unknown.clone(), bill.possibly_paid.clone()].concat();
        attempts.sort_unstable();
        let calls = attempts.len() as u64;
        Self {
            reserved: ReservedView {
                tokens: worst.tokens * calls,
                cost: amount(worst.nanos * calls),
                attempts,
            },
            currency: currency.to_owned(),
            total: ShareView::from(&bill.total()),
            won: ShareView::from(&bill.won),
            discarded: ShareView::from(&bill.discarded),
            failed: ShareView::from(&bill.failed),
            unknown_attempts: bill.unknown.clone(),
            possibly_paid_attempts: bill.possibly_paid.clone(),
            unpriced_attempts: bill.unpriced.clone(),
            complete: bill.complete(),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// The first day (UTC, `YYYY-MM-DD`), included.
    from: NaiveDate,
    /// The last day, included; at most 366 days after `from`.
    to: NaiveDate,
    /// Operators only: whose usage (an owner's is its own).
    #[param(value_type = Option<String>)]
    owner: Option<Owner>,
}

/// One day's usage of one contract: the jobs created that day and their bills added up.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageRowView {
    #[schema(value_type = String, format = Date)]
    pub date: NaiveDate,
    pub contract: String,
    pub jobs: u32,
    pub total: ShareView,
    pub won: ShareView,
    /// Answers paid for and thrown away: the waste onejob's races and cancels cost.
    pub discarded: ShareView,
    pub failed: ShareView,
    pub unknown_attempts: u32,
    pub possibly_paid_attempts: u32,
    pub unpriced_attempts: u32,
    /// The most the unknown and possibly paid attempts can have cost (each call's worst case): with `total`, the
    /// day's bound.
    pub reserved: AmountView,
}

/// Tokens and their cost.
#[derive(Debug, Serialize, ToSchema)]
pub struct AmountView {
    pub tokens: u64,
    /// In the currency.
    pub cost: f64,
}

impl From<Bound> for AmountView {
    fn from(bound: Bound) -> Self {
        Self {
            tokens: bound.tokens,
            cost: amount(bound.nanos),
        }
    }
}

/// Where the owner's budget stands this period: what its calls that ended cost (`settled`), and what its calls
/// not settled yet hold at their worst case (`reserved`). A call is made only if its worst case fits beside both.
#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetView {
    /// `day` or `month`.
    pub period: String,
    /// The period (`2026-12-06`, `2026-12`).
    pub current: String,
    /// The budget's limits, as configured.
    pub tokens: Option<u64>,
    pub cost: Option<f64>,
    pub settled: AmountView,
    pub reserved: AmountView,
}

impl From<&UsageRow> for UsageRowView {
    fn from(row: &UsageRow) -> Self {
        Self {
            date: row.date,
            contract: row.contract.to_string(),
            jobs: row.jobs,
            total: ShareView::from(&row.won.plus(&row.discarded).plus(&row.failed)),
            won: ShareView::from(&row.won),
            discarded: ShareView::from(&row.discarded),
            failed: ShareView::from(&row.failed),
            unknown_attempts: row.unknown_attempts,
            possibly_paid_attempts: row.possibly_paid_attempts,
            unpriced_attempts: row.unpriced_attempts,
            reserved: AmountView::from(row.reserved),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UsageView {
    pub currency: String,
    /// By day, then contract; days and contracts without jobs are left out.
    pub rows: Vec<UsageRowView>,
    /// Every row together.
    pub total: ShareView,
    /// Set when the range held more jobs than one report reads: the rows are complete from this day on; ask
    /// again with `to` the day before it for the rest.
    #[schema(value_type = Option<String>, format = Date)]
    pub complete_from: Option<NaiveDate>,
    /// The owner's budget now, where it has one.
    pub budget: Option<BudgetView>,
}

/// The caller's usage by day and contract: what its jobs created on those days cost, as their bills say. An
/// operator names the owner.
#[utoipa::path(
    get, path = "/v1/usage", tag = "usage",
    params(UsageParams),
    responses(
        (status = 200, body = UsageView),
        (status = 400, description = "invalid_parameter"),
        (status = 401, description = "unauthorized"),
        (status = 403, description = "forbidden: `owner` is for operators"),
    ),
    security(("bearer" = []))
)]
pub async fn get_usage(
    State(app): State<AppState>,
    viewer: Viewer,
    params: Result<Query<UsageParams>, QueryRejection>,
) -> Result<Json<UsageView>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::InvalidParameter(e.body_text()))?;
    let owner = match (viewer, params.owner) {
        (Viewer::Owner(owner), None) => owner,
        (Viewer::Owner(_), Some(_)) => return Err(ApiError::Forbidden),
        (Viewer::Operator(_), Some(owner)) => owner,
        (Viewer::Operator(_), None) => {
            return Err(ApiError::InvalidParameter(
                "owner: name whose usage (an operator has none of its own)".into(),
            ));
        }
    };
    let days = (params.to - params.from).num_days();
    if !(0..=366).contains(&days) {
        return Err(ApiError::InvalidParameter(
            "to must be from or a day after it, at most 366 days after".into(),
        ));
    }
    let usage = app.engine.usage(&owner, params.from, params.to).await?;
    let total = (usage.rows.iter()).fold(Share::default(), |sum, r| {
        sum.plus(&r.won).plus(&r.discarded).plus(&r.failed)
    });
    let budget = app
        .engine
        .budget_standing(&owner)
        .await?
        .map(|b| BudgetView {
            period: b.budget.period.as_str().to_owned(),
            current: b.current,
            tokens: b.budget.tokens,
            cost: b.budget.cost,
            settled: AmountView::from(b.settled),
            reserved: AmountView::from(b.reserved),
        });
    Ok(Json(UsageView {
        currency: app.engine.settings.prices.currency.clone(),
        rows: usage.rows.iter().map(UsageRowView::from).collect(),
        total: ShareView::from(&total),
        complete_from: usage.complete_from,
        budget,
    }))
}
