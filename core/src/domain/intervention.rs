//! What operators did to a job on its owner's behalf.

use super::time::Timestamp;

/// An operator's act on an owner's job (a manual attempt, an attempt or the job cancelled), kept on the job: an
/// operator acts for any owner, and the job says who did what.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Intervention {
    /// The operator: a token's name locally, the JWT's `sub` on AWS.
    pub by: String,
    /// `attempt_added`, `attempt_cancelled` or `job_cancelled`.
    pub action: String,
    /// The attempt it queued or cancelled.
    pub attempt: Option<u32>,
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
}

impl Intervention {
    /// The most a job keeps: each is a write that moved the job, and a job has at most 25 attempts.
    pub const MAX: usize = 64;
}
