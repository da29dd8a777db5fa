//! What one owner may start (`[limits]`), so that no owner starves the others: jobs live at once, creates and
//! tokens a minute, a budget a period (invariant 18). The rules are here, pure; each store applies them inside its
//! guarded writes, against the owner's [`OwnerLedger`]:
//!
//! - a **create** is held to all of them ([`OwnerLedger::admit_create`]); a replay of a job that exists is never
//!   refused (the stores look for it first), nor is a create of an intent that already holds its place — another
//!   process writing the same intent, or this very create repeated after a lost answer: an intent counts once;
//! - a **manual attempt** that makes a job live again is held to the live jobs and the budget
//!   ([`OwnerLedger::admit_attempt`]), an operator's as an owner's (the jobs and the money are the owner's);
//! - **every call** under a budget is paid for in advance: its worst case ([`Bound`]) is reserved on its intent's
//!   place before it is made — at the create for attempt 1, at a manual attempt for it, by the worker before any
//!   other ([`OwnerLedger::reserve`]) — and the reservation is settled to what the job's record says the call
//!   cost once the attempt ends ([`OwnerLedger::settle`], [`Job::settlement`](super::Job::settlement)). The spend and the reservations
//!   together never pass the budget, so neither does the spend.
//!
//! The ledger is bounded by the limits, never by the owner's history: a place is held by a live job (at most
//! `live_jobs` of them), by a reservation (at most [`OwnerLimits::MAX_LIVE_JOBS`]), or, else, only while its create
//! is written ([`OwnerLedger::CREATE_HELD`]), so at most a minute's creates; the spend is two counters.

use std::collections::BTreeMap;

use chrono::{Datelike, Duration, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use super::ids::Owner;
use super::time::Timestamp;

mod ledger;

pub use ledger::{OwnerLedger, Place};

use super::job::Job;

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
    /// Creates a minute, replays not counted: spread evenly (one each `60 s / creates_per_minute`), with a minute's
    /// worth at once at most — no window edge to pass twice (GCRA, [`OwnerLedger::rate_tat_us`]).
    pub creates_per_minute: Option<u32>,
    /// Prompt and answer tokens a minute, each create counted by its job's worst case ([`Bound::tokens`]), spread
    /// like `creates_per_minute` (GCRA, [`OwnerLedger::token_tat_us`]). Replays are not counted, nor are the calls
    /// of failover (the create counted its intent).
    pub tokens_per_minute: Option<u64>,
    /// Spend in one period: a call is made only if its worst case fits beside what is spent and reserved.
    pub budget: Option<Budget>,
}

/// The most one call can cost: the prompt's upper bound (a token is at least a byte, so its bytes, and the output
/// schema's, with [`Bound::FRAMING_TOKENS`] for the messages' framing) and the contract's output budget
/// (`max_output_tokens`, reasoning included), priced at the dearest provider the job's chain (and the attempt's own
/// provider) may reach — at the batch price for a batch provider. What a budget reserves, and what the bill of an
/// `unknown` or in-flight attempt shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct Bound {
    pub tokens: u64,
    /// In billionths of the price table's currency; 0 where no provider the job may reach is priced.
    pub nanos: u64,
}

impl Bound {
    /// Tokens counted for each call's framing beyond its prompt and output schema: roles, separators, the
    /// instructions a provider adds for structured output.
    pub const FRAMING_TOKENS: u64 = 512;

    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// Both bounds added (saturating).
    pub fn plus(self, other: Self) -> Self {
        Self {
            tokens: self.tokens.saturating_add(other.tokens),
            nanos: self.nanos.saturating_add(other.nanos),
        }
    }
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
    pub const ALL: [Self; 2] = [Self::Day, Self::Month];

    /// The period `now` is in, as a key (`2026-12-04`, `2026-12`), and when it ends. Keys of one kind sort as
    /// their periods do; keys of the two kinds are never compared (each kind is counted apart).
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

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Month => "month",
        }
    }
}

/// What was spent in one period of one kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct PeriodSpend {
    /// The period ([`Period::of`]'s key); empty before anything was spent.
    pub period: String,
    pub tokens: u64,
    pub nanos: u64,
}

impl PeriodSpend {
    /// This spend with `tokens` and `nanos` added in `period`: to what it holds if it counts that period, from 0
    /// if `period` is a later one; a writer behind the clock (an earlier period) adds nothing.
    fn plus(&self, period: &str, tokens: u64, nanos: u64) -> Self {
        if self.period.as_str() > period {
            return self.clone();
        }
        let (tokens0, nanos0) = if self.period == period {
            (self.tokens, self.nanos)
        } else {
            (0, 0)
        };
        Self {
            period: period.to_owned(),
            tokens: tokens0.saturating_add(tokens),
            nanos: nanos0.saturating_add(nanos),
        }
    }
}

/// Why a write was refused by a limit. Nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitReached {
    #[error(
        "{limit} jobs of yours are live (queued, running or unknown): the most you may have at once"
    )]
    LiveJobs { limit: u32, retry_after: Duration },
    #[error("{limit} creates a minute is the most you may make")]
    CreateRate { limit: u32, retry_after: Duration },
    #[error(
        "{limit} tokens a minute (each job counted at its worst case) is the most you may start"
    )]
    TokenRate { limit: u64, retry_after: Duration },
    #[error("your budget for this {} is spent", period.as_str())]
    Budget {
        period: Period,
        retry_after: Duration,
    },
}

impl LimitReached {
    /// When a write may be admitted again, at the soonest.
    pub fn retry_after(&self) -> Duration {
        match *self {
            Self::LiveJobs { retry_after, .. }
            | Self::CreateRate { retry_after, .. }
            | Self::TokenRate { retry_after, .. }
            | Self::Budget { retry_after, .. } => retry_after,
        }
    }
}

/// What a ledger says of a write held to the limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Within {
    /// Within the limits: the ledger to store (guarded by what was read), or `None` when it stays as it was — the
    /// intent holds its place already, or no limit keeps count of it.
    Yes(Option<OwnerLedger>),
    /// At the live-jobs limit, with places not known to hold for [`OwnerLedger::PLACE_HELD`]: the store reads
    /// these intents' jobs and tells the ledger which hold no more ([`OwnerLedger::checked`]), then asks again.
    Check(Vec<String>),
    /// Beyond a limit: nothing is written.
    Beyond(LimitReached),
}

/// How a store knows an owner's live jobs when it holds a write to the live-jobs limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Live {
    /// It counted them inside the write itself (SQLite's transaction): nothing else can come between, and the
    /// ledger keeps no places.
    Counted(u32),
    /// The ledger's places stand for them (DynamoDB, whose write of the ledger cannot count jobs): never fewer
    /// than the owner's live jobs.
    Places,
}

/// How soon to look again when the live jobs are at the limit: one ends when its provider answers.
const LIVE_RETRY: Duration = Duration::seconds(2);

impl OwnerLimits {
    /// Whether any limit applies.
    pub fn any(&self) -> bool {
        self.live_jobs.is_some()
            || self.creates_per_minute.is_some()
            || self.tokens_per_minute.is_some()
            || self.budget.is_some()
    }

    /// Whether the owner's intents hold places in its ledger after their create: for its live jobs, or for the
    /// reservations of a budget.
    pub fn keeps_places(&self) -> bool {
        self.live_jobs.is_some() || self.budget.is_some()
    }

    /// The largest `live_jobs` and `creates_per_minute`: what one ledger item holds (each place is a few dozen
    /// bytes; DynamoDB keeps an item to 400 KB).
    pub const MAX_LIVE_JOBS: u32 = 4_000;
    pub const MAX_CREATES_PER_MINUTE: u32 = 2_000;

    /// The checks serde cannot make.
    pub fn check(&self) -> Result<(), String> {
        if self.live_jobs == Some(0)
            || self.creates_per_minute == Some(0)
            || self.tokens_per_minute == Some(0)
        {
            return Err("a limit of 0 admits nothing: leave it out for no limit".into());
        }
        if self.live_jobs.is_some_and(|n| n > Self::MAX_LIVE_JOBS)
            || self
                .creates_per_minute
                .is_some_and(|n| n > Self::MAX_CREATES_PER_MINUTE)
        {
            return Err(format!(
                "live_jobs is at most {}, creates_per_minute at most {}",
                Self::MAX_LIVE_JOBS,
                Self::MAX_CREATES_PER_MINUTE
            ));
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

    /// Whether a call whose worst case is `bound` fits the budget at `now` beside what `ledger` holds spent in the
    /// period and reserved (by calls not settled yet, whenever they were reserved: each will be counted when it
    /// settles). Beyond it: refused until the period ends if the spend alone leaves no room, else for a moment (a
    /// reservation settles when its call ends, usually for less).
    pub fn fits(&self, ledger: &OwnerLedger, now: Timestamp, bound: Bound) -> Option<LimitReached> {
        let budget = self.budget.as_ref()?;
        let (period, end) = budget.period.of(now);
        let spend = ledger.spend_of(budget.period);
        let spent = match spend.period == period {
            true => Bound {
                tokens: spend.tokens,
                nanos: spend.nanos,
            },
            false => Bound::default(),
        };
        let beyond = |held: Bound| {
            let after = held.plus(bound);
            budget.tokens.is_some_and(|t| after.tokens > t)
                || budget.cost.is_some_and(|c| after.nanos > budget_nanos(c))
        };
        if !beyond(spent.plus(ledger.reserved())) {
            return None;
        }
        let retry_after = match beyond(spent) {
            true => end - now,
            false => LIVE_RETRY,
        };
        Some(LimitReached::Budget {
            period: budget.period,
            retry_after,
        })
    }
}

/// A budget's cost in billionths of its currency.
fn budget_nanos(cost: f64) -> u64 {
    (cost * 1e9).round() as u64
}

/// What one call cost an owner, and when it was recorded: counted in the day and the month it falls in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    pub at: Timestamp,
    pub tokens: u64,
    pub nanos: u64,
}

#[cfg(test)]
mod tests;
