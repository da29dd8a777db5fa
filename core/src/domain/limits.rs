//! What one owner may start (`[limits]`), so that no owner starves the others: jobs live at once, creates a
//! minute, a budget a period. A create beyond one is refused and nothing is written; a replay of a job that exists
//! is never refused (the stores look for it first). The rule is here, pure; each store applies it inside the write
//! that creates the job, against the owner's [`OwnerLedger`] and the owner's live jobs as it counts them, so that a
//! limit of N admits at most N under concurrent creates.

use std::collections::BTreeMap;

use chrono::{Datelike, Duration, DurationRound, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use super::ids::Owner;
use super::time::Timestamp;

/// Every owner's limits (`[limits]`): a default for every owner, and owners' own (which replace it whole).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub default: OwnerLimits,
    pub owners: BTreeMap<Owner, OwnerLimits>,
}

impl Limits {
    /// `owner`'s limits.
    pub fn of(&self, owner: &Owner) -> &OwnerLimits {
        self.owners.get(owner).unwrap_or(&self.default)
    }

    /// The checks serde cannot make.
    pub fn check(&self) -> Result<(), String> {
        self.default
            .check()
            .map_err(|e| format!("limits.default: {e}"))?;
        for (owner, limits) in &self.owners {
            limits
                .check()
                .map_err(|e| format!("limits.owners.{owner}: {e}"))?;
        }
        Ok(())
    }
}

/// One owner's limits; a limit left out does not apply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OwnerLimits {
    /// Jobs `queued`, `running` or `unknown` at once.
    pub live_jobs: Option<u32>,
    /// Creates in one minute of the clock (12:00:00 to 12:00:59), replays not counted.
    pub creates_per_minute: Option<u32>,
    /// Spend in one period: once it is reached, creates wait for the next period.
    pub budget: Option<Budget>,
}

/// What an owner may spend in a period: tokens, money in the price table's currency, or both.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub period: Period,
    /// Prompt and answer tokens together.
    pub tokens: Option<u64>,
    /// In the price table's currency, of priced calls.
    pub cost: Option<f64>,
}

/// A budget's period, by the clock (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    /// The period `now` is in, as a key (`2026-12-04`, `2026-12`), and when it ends.
    pub fn of(self, now: Timestamp) -> (String, Timestamp) {
        let day = now.date_naive();
        let (key, next) = match self {
            Self::Day => (day.to_string(), day.succ_opt().unwrap_or(day)),
            Self::Month => {
                let first = |y, m| NaiveDate::from_ymd_opt(y, m, 1).expect("a month's first day");
                let next = match day.month() {
                    12 => first(day.year() + 1, 1),
                    m => first(day.year(), m + 1),
                };
                (format!("{:04}-{:02}", day.year(), day.month()), next)
            }
        };
        let end = Utc.from_utc_datetime(&next.and_hms_opt(0, 0, 0).expect("midnight"));
        (key, end)
    }
}

/// What a store keeps for each owner that has limits: its window of creates and its period's spend. The live jobs
/// are counted by each store its own way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct OwnerLedger {
    /// The minute the window counts (its start, in milliseconds), and the creates in it.
    pub window_ms: i64,
    pub window_creates: u32,
    /// The period the spend counts ([`Period::of`]'s key), and what was spent in it.
    pub period: String,
    pub spent_tokens: u64,
    pub spent_nanos: u64,
}

/// Why a create was refused. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitReached {
    #[error(
        "{limit} jobs of yours are live (queued, running or unknown): the most you may have at once"
    )]
    LiveJobs { limit: u32, retry_after: Duration },
    #[error("{limit} creates a minute is the most you may make")]
    CreateRate { limit: u32, retry_after: Duration },
    #[error("your budget for this {period:?} is spent")]
    Budget {
        period: Period,
        retry_after: Duration,
    },
}

impl LimitReached {
    /// When a create may be admitted again, at the soonest.
    pub fn retry_after(&self) -> Duration {
        match *self {
            Self::LiveJobs { retry_after, .. }
            | Self::CreateRate { retry_after, .. }
            | Self::Budget { retry_after, .. } => retry_after,
        }
    }
}

/// How soon to look again when the live jobs are at the limit: one ends when its provider answers.
const LIVE_RETRY: Duration = Duration::seconds(2);

impl OwnerLimits {
    /// Whether any limit applies.
    pub fn any(&self) -> bool {
        self.live_jobs.is_some() || self.creates_per_minute.is_some() || self.budget.is_some()
    }

    /// A create for an owner with `live` jobs live and `ledger` as stored, at `now`: the ledger with it counted,
    /// or the limit it would pass.
    pub fn admit(
        &self,
        live: u32,
        ledger: &OwnerLedger,
        now: Timestamp,
    ) -> Result<OwnerLedger, LimitReached> {
        if let Some(limit) = self.live_jobs.filter(|limit| live >= *limit) {
            return Err(LimitReached::LiveJobs {
                limit,
                retry_after: LIVE_RETRY,
            });
        }
        let mut after = ledger.clone();
        let minute = now
            .duration_trunc(Duration::minutes(1))
            .expect("a time truncates to minutes");
        if after.window_ms != minute.timestamp_millis() {
            after.window_ms = minute.timestamp_millis();
            after.window_creates = 0;
        }
        if let Some(limit) = self.creates_per_minute
            && after.window_creates >= limit
        {
            let retry_after = minute + Duration::minutes(1) - now;
            return Err(LimitReached::CreateRate { limit, retry_after });
        }
        after.window_creates += 1;
        if let Some(budget) = &self.budget {
            let (period, end) = budget.period.of(now);
            let spent = ledger.period == period;
            let tokens = budget
                .tokens
                .is_some_and(|t| spent && ledger.spent_tokens >= t);
            let cost = budget
                .cost
                .is_some_and(|c| spent && ledger.spent_nanos as f64 >= c * 1e9);
            if tokens || cost {
                return Err(LimitReached::Budget {
                    period: budget.period,
                    retry_after: end - now,
                });
            }
        }
        Ok(after)
    }

    /// The checks serde cannot make.
    pub fn check(&self) -> Result<(), String> {
        if self.live_jobs == Some(0) || self.creates_per_minute == Some(0) {
            return Err("a limit of 0 admits nothing: leave it out for no limit".into());
        }
        if let Some(budget) = &self.budget {
            if budget.tokens.is_none() && budget.cost.is_none() {
                return Err("budget: name tokens, cost or both".into());
            }
            if budget.cost.is_some_and(|c| !(c.is_finite() && c >= 0.0)) {
                return Err("budget.cost is a number of at least 0".into());
            }
        }
        Ok(())
    }
}

/// What one call cost an owner, in the budget's period it counts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    /// The period's name ([`Period::of`]).
    pub period: String,
    pub tokens: u64,
    pub nanos: u64,
}

impl OwnerLedger {
    /// The ledger with `spend` added to its period (a new period starts at 0).
    pub fn spend(&self, spend: &Spend) -> Self {
        let mut after = self.clone();
        if after.period != spend.period {
            (after.period, after.spent_tokens, after.spent_nanos) = (spend.period.clone(), 0, 0);
        }
        after.spent_tokens += spend.tokens;
        after.spent_nanos += spend.nanos;
        after
    }
}
