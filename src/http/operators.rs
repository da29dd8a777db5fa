//! The operators' view: every owner's jobs that need a person (`unknown`: an attempt may still be working, and
//! neither its provider can be asked about it nor a retry policy clears it; `failed`), the latest to need one
//! first. A page may hold fewer jobs than its limit (those the reconciler clears by itself are left out); its
//! `next_cursor` goes on. An operator acts on one through the job endpoints themselves
//! (`/v1/jobs/{id}/attempts`, `…/cancel`), on its owner's behalf; the job records who did what.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::Deserialize;
use utoipa::IntoParams;

use super::AppState;
use super::auth::Operator;
use super::error::ApiError;
use super::jobs::{JobList, JobView};
use crate::domain::JobStatus;
use crate::store::{Cursor, ListQuery};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PeopleNeededParams {
    /// Only `unknown` or only `failed` jobs; both without it.
    status: Option<JobStatus>,
    /// 1 to 100; default 20.
    #[param(minimum = 1, maximum = 100)]
    limit: Option<usize>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Every owner's jobs that need a person, the latest to need one first (operators only).
#[utoipa::path(
    get, path = "/v1/operator/jobs", tag = "operators",
    params(PeopleNeededParams),
    responses(
        (status = 200, body = JobList),
        (status = 400, description = "invalid_parameter"),
        (status = 401, description = "unauthorized"),
        (status = 403, description = "forbidden: an owner's credential, not an operator's"),
    ),
    security(("bearer" = []))
)]
pub async fn needing_a_person(
    State(app): State<AppState>,
    _: Operator,
    params: Result<Query<PeopleNeededParams>, QueryRejection>,
) -> Result<Json<JobList>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::InvalidParameter(e.body_text()))?;
    if let Some(status) = params
        .status
        .filter(|s| !matches!(s, JobStatus::Unknown | JobStatus::Failed))
    {
        return Err(ApiError::InvalidParameter(format!(
            "status: {} jobs need nobody; ask for unknown or failed",
            status.as_str()
        )));
    }
    let limit = params.limit.unwrap_or(ListQuery::DEFAULT_LIMIT);
    if !(1..=ListQuery::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::InvalidParameter(format!(
            "limit must be 1 to {}",
            ListQuery::MAX_LIMIT
        )));
    }
    let cursor = (params.cursor.map(|c| c.parse::<Cursor>()).transpose())
        .map_err(|e| ApiError::InvalidParameter(e.to_string()))?;
    let engine = &app.engine;
    let page = engine
        .needing_a_person(params.status, limit, cursor.as_ref())
        .await?;
    let now = engine.clock.now();
    Ok(Json(JobList {
        jobs: (page.jobs.iter())
            .filter(|job| !engine.clears_itself(job))
            .map(|job| JobView::new(job, now, engine))
            .collect(),
        next_cursor: page.next_cursor.map(|c| c.to_string()),
    }))
}
