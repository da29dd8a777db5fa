//! Listings of jobs: what a page asks for, the page, and where the next one starts.

use std::fmt;
use std::str::FromStr;

use crate::domain::{Job, JobId, JobStatus, ParseError, Timestamp};

/// Where a page of a listing starts: just after the job with this creation time and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub created_at_ms: i64,
    pub id: JobId,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_at_ms, self.id)
    }
}

impl FromStr for Cursor {
    type Err = ParseError;

    fn from_str(raw: &str) -> Result<Self, ParseError> {
        let refuse = || ParseError(format!("not a cursor from this API: {raw:?}"));
        let (ms, id) = raw.split_once('.').ok_or_else(refuse)?;
        Ok(Self {
            created_at_ms: ms.parse().map_err(|_| refuse())?,
            id: JobId::parse(id).map_err(|_| refuse())?,
        })
    }
}

impl Cursor {
    pub fn after(job: &Job) -> Self {
        Self {
            created_at_ms: job.created_at.timestamp_millis(),
            id: job.id.clone(),
        }
    }
}

/// A listing of one owner's jobs, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub status: Option<JobStatus>,
    /// 1 to [`ListQuery::MAX_LIMIT`].
    pub limit: usize,
    pub cursor: Option<Cursor>,
    /// Only jobs created before this moment (a usage report's last day's end).
    pub created_before: Option<Timestamp>,
}

impl ListQuery {
    pub const DEFAULT_LIMIT: usize = 20;
    pub const MAX_LIMIT: usize = 100;
}

#[derive(Debug, Clone, PartialEq)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    /// Set when more jobs may follow.
    pub next_cursor: Option<Cursor>,
}
