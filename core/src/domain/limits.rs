//! What one owner may start (`[limits]`), so that no owner starves the others: jobs live at once, creates a
//! minute, a budget a period (invariant 18). The rules are here, pure; each store applies them inside its guarded
//! writes, against the owner's [`OwnerLedger`]:
//!
//! - a **create** is held to all three ([`OwnerLedger::admit_create`]); a replay of a job that exists is never
//!   refused (the stores look for it first), nor is a create of an intent that already holds its place — another
//!   process writing the same intent, or this very create repeated after a lost answer: an intent counts once;
//! - a **manual attempt** that makes a job live again is held to the live jobs and the budget
//!   ([`OwnerLedger::admit_attempt`]), an operator's as an owner's (the jobs and the money are the owner's);
//! - **failover and retries** order a paid call on a job that is live already: held to the budget, which stops
//!   them with `budget_exceeded` ([`super::Failover::budget`]).
//!
//! The ledger is bounded by the limits, never by the owner's history: a place is held by a live job (at most
//! `live_jobs` of them) or, without a live-jobs limit, only while its create is written
//! ([`OwnerLedger::CREATE_HELD`]), so at most a minute's creates; the spend is two counters.

use std::collections::{BTreeMap, BTreeSet};

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

/// What a store keeps for each owner that has limits: its window of creates, its spend in the current day and month
/// (both counted, whichever the budget names, so that a budget moved from one to the other is held from the start
/// of its period), and the places its jobs hold. Bounded by the limits (see the module's doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OwnerLedger {
    /// The minute the window counts (its start, in milliseconds), and the creates in it.
    pub window_ms: i64,
    pub window_creates: u32,
    pub day: PeriodSpend,
    pub month: PeriodSpend,
    /// The places intents hold, by intent (the key its job is kept under, [`super::JobId::intent`]). A store that
    /// counts the owner's live jobs in the create's own write (SQLite) keeps none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub places: BTreeMap<String, Place>,
}

/// The place one intent's job holds among its owner's live jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct Place {
    /// Since when it is known to hold, in milliseconds: taken, or checked against its job.
    pub at: i64,
    /// The attempt that made the job live (1 for its create, a manual attempt's number): the job's end frees the
    /// place only if it came at or after that attempt, so a late release never frees a place taken again.
    pub attempt: u32,
}

/// The ledger as stored: today's, and the one spend counter that ledgers kept before (`period`, `spent_tokens`,
/// `spent_nanos`), whose period's key tells its kind.
#[derive(Deserialize)]
struct StoredLedger {
    #[serde(default)]
    window_ms: i64,
    #[serde(default)]
    window_creates: u32,
    #[serde(default)]
    day: PeriodSpend,
    #[serde(default)]
    month: PeriodSpend,
    #[serde(default)]
    places: BTreeMap<String, Place>,
    #[serde(default)]
    period: String,
    #[serde(default)]
    spent_tokens: u64,
    #[serde(default)]
    spent_nanos: u64,
}

impl<'de> Deserialize<'de> for OwnerLedger {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let stored = StoredLedger::deserialize(deserializer)?;
        let mut ledger = Self {
            window_ms: stored.window_ms,
            window_creates: stored.window_creates,
            day: stored.day,
            month: stored.month,
            places: stored.places,
        };
        let earlier = PeriodSpend {
            period: stored.period,
            tokens: stored.spent_tokens,
            nanos: stored.spent_nanos,
        };
        ledger.keep_earlier(earlier);
        Ok(ledger)
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
        self.live_jobs.is_some() || self.creates_per_minute.is_some() || self.budget.is_some()
    }

    /// The largest `live_jobs` and `creates_per_minute`: what one ledger item holds (each place is a few dozen
    /// bytes; DynamoDB keeps an item to 400 KB).
    pub const MAX_LIVE_JOBS: u32 = 4_000;
    pub const MAX_CREATES_PER_MINUTE: u32 = 2_000;

    /// The checks serde cannot make.
    pub fn check(&self) -> Result<(), String> {
        if self.live_jobs == Some(0) || self.creates_per_minute == Some(0) {
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

    /// Whether `ledger` at `now` leaves the budget spent: no call may be ordered (a create, a manual attempt, a
    /// failover, a retry), until its period ends.
    pub fn spent(&self, ledger: &OwnerLedger, now: Timestamp) -> Option<LimitReached> {
        let budget = self.budget.as_ref()?;
        let (period, end) = budget.period.of(now);
        let spend = ledger.spend_of(budget.period);
        let counts = spend.period == period;
        let tokens = budget.tokens.is_some_and(|t| counts && spend.tokens >= t);
        let cost = budget
            .cost
            .is_some_and(|c| counts && spend.nanos as f64 >= c * 1e9);
        (tokens || cost).then(|| LimitReached::Budget {
            period: budget.period,
            retry_after: end - now,
        })
    }
}

/// What one call cost an owner, and when it was recorded: counted in the day and the month it falls in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spend {
    pub at: Timestamp,
    pub tokens: u64,
    pub nanos: u64,
}

impl OwnerLedger {
    /// How long a place counts without being known to hold: with a live-jobs limit, a place older than this is
    /// checked against its job when the owner is at its limit.
    pub const PLACE_HELD: Duration = Duration::seconds(60);

    /// How long a place keeps an intent being created from being counted twice when no live-jobs limit keeps it
    /// (creates a minute alone): longer than a create takes from its first read to its put's last repeat (a
    /// caller's write budget is seconds, the api function's timeout thirty). Then it goes: at most a minute's
    /// creates hold one.
    pub const CREATE_HELD: Duration = Duration::seconds(60);

    /// How many places one write checks at most, the oldest first.
    pub const CHECKS: usize = 16;

    /// The spend of one period kind.
    pub fn spend_of(&self, period: Period) -> &PeriodSpend {
        match period {
            Period::Day => &self.day,
            Period::Month => &self.month,
        }
    }

    /// The ledger with `spend` counted in its day and its month.
    pub fn spend(&self, spend: &Spend) -> Self {
        let mut after = self.clone();
        let (day, _) = Period::Day.of(spend.at);
        let (month, _) = Period::Month.of(spend.at);
        after.day = self.day.plus(&day, spend.tokens, spend.nanos);
        after.month = self.month.plus(&month, spend.tokens, spend.nanos);
        after
    }

    /// Counts a spend an earlier ledger kept in its one counter, under the kind its period's key tells.
    fn keep_earlier(&mut self, earlier: PeriodSpend) {
        let kind = match earlier.period.len() {
            10 => &mut self.day,
            7 => &mut self.month,
            _ => return,
        };
        if kind.period.is_empty() {
            *kind = earlier;
        }
    }

    /// The ledger as it stands at `now`: the window (where creates are counted) moved to `now`'s minute, and,
    /// without a live-jobs limit, places past [`Self::CREATE_HELD`] gone (they only kept a create from being counted
    /// twice).
    fn at(&self, limits: &OwnerLimits, now: Timestamp) -> Self {
        let mut after = self.clone();
        let minute = now
            .duration_trunc(Duration::minutes(1))
            .expect("a time truncates to minutes")
            .timestamp_millis();
        if limits.creates_per_minute.is_some() && after.window_ms != minute {
            after.window_ms = minute;
            after.window_creates = 0;
        }
        if limits.live_jobs.is_none() {
            let fresh = (now - Self::CREATE_HELD).timestamp_millis();
            after.places.retain(|_, place| place.at > fresh);
        }
        after
    }

    /// A create of `intent` at `now`, under `limits`, the owner's live jobs known as `live` says. An intent that
    /// holds its place already was counted: it is admitted as it is (another writer's create of it, or this
    /// create's own earlier try). Else it takes a place among the live jobs, then one of the minute's creates,
    /// within the budget.
    pub fn admit_create(
        &self,
        intent: &str,
        limits: &OwnerLimits,
        now: Timestamp,
        live: Live,
    ) -> Within {
        let mut after = self.at(limits, now);
        if after.places.contains_key(intent) {
            return Self::admitted(self, after);
        }
        if let Some(refused) = after.take_place(intent, 1, limits, now, live) {
            return refused;
        }
        if let Some(limit) = limits.creates_per_minute {
            if after.window_creates >= limit {
                let retry_after = Timestamp::from_timestamp_millis(after.window_ms)
                    .expect("a minute")
                    + Duration::minutes(1)
                    - now;
                return Within::Beyond(LimitReached::CreateRate { limit, retry_after });
            }
            after.window_creates += 1;
        }
        if let Some(spent) = limits.spent(&after, now) {
            return Within::Beyond(spent);
        }
        Self::admitted(self, after)
    }

    /// A manual attempt `attempt` at `now` that makes `intent`'s job live again: it takes a place among the live
    /// jobs — or, if the intent holds one still, makes it this attempt's — within the budget. Creates a minute
    /// count creates only.
    pub fn admit_attempt(
        &self,
        intent: &str,
        attempt: u32,
        limits: &OwnerLimits,
        now: Timestamp,
        live: Live,
    ) -> Within {
        if let Some(spent) = limits.spent(self, now) {
            return Within::Beyond(spent);
        }
        if limits.live_jobs.is_none() {
            return Within::Yes(None);
        }
        let mut after = self.at(limits, now);
        match after.places.get_mut(intent) {
            Some(place) => {
                place.attempt = place.attempt.max(attempt);
                place.at = now.timestamp_millis();
            }
            None => {
                if let Some(refused) = after.take_place(intent, attempt, limits, now, live) {
                    return refused;
                }
            }
        }
        Self::admitted(self, after)
    }

    /// `intent` takes a place at `now` among the live jobs, where places are kept (and, with a limit of creates,
    /// so that each create counts once): at the live-jobs limit only after the places not known to hold for
    /// [`Self::PLACE_HELD`] are checked. The refusal, if it is one.
    fn take_place(
        &mut self,
        intent: &str,
        attempt: u32,
        limits: &OwnerLimits,
        now: Timestamp,
        live: Live,
    ) -> Option<Within> {
        let refused = |limit| {
            Some(Within::Beyond(LimitReached::LiveJobs {
                limit,
                retry_after: LIVE_RETRY,
            }))
        };
        if let Live::Counted(live) = live {
            return limits.live_jobs.filter(|l| live >= *l).and_then(refused);
        }
        if let Some(limit) = limits
            .live_jobs
            .filter(|l| self.places.len() >= *l as usize)
        {
            let stale = (now - Self::PLACE_HELD).timestamp_millis();
            let mut unknown: Vec<(i64, &String)> = (self.places.iter())
                .filter(|(_, place)| place.at <= stale)
                .map(|(intent, place)| (place.at, intent))
                .collect();
            if unknown.is_empty() {
                return refused(limit);
            }
            unknown.sort();
            let check = unknown.into_iter().take(Self::CHECKS);
            return Some(Within::Check(check.map(|(_, i)| i.clone()).collect()));
        }
        if limits.live_jobs.is_some() || limits.creates_per_minute.is_some() {
            let at = now.timestamp_millis();
            self.places.insert(intent.to_owned(), Place { at, attempt });
        }
        None
    }

    fn admitted(before: &Self, after: Self) -> Within {
        Within::Yes((after != *before).then_some(after))
    }

    /// The ledger once the store read the jobs of `checked` (what [`Within::Check`] asked for) at `now`: those
    /// `holding` (live) are known to hold as of `now`, the others' places are free.
    pub fn checked(&self, checked: &[String], holding: &BTreeSet<String>, now: Timestamp) -> Self {
        let mut after = self.clone();
        for intent in checked {
            match after.places.get_mut(intent) {
                Some(place) if holding.contains(intent) => place.at = now.timestamp_millis(),
                _ => {
                    after.places.remove(intent);
                }
            }
        }
        after
    }

    /// The ledger once `intent`'s job ended (no longer live) with `last` its newest attempt: its place is free —
    /// unless a later attempt took it again (a manual attempt made the job live after this end).
    pub fn released(&self, intent: &str, last: u32) -> Option<Self> {
        let place = self.places.get(intent)?;
        (place.attempt <= last).then(|| {
            let mut after = self.clone();
            after.places.remove(intent);
            after
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    fn admitted(within: Within) -> Option<OwnerLedger> {
        match within {
            Within::Yes(after) => after,
            other => panic!("not admitted: {other:?}"),
        }
    }

    #[test]
    fn an_intent_counts_once_however_often_its_create_is_written() {
        let limits = OwnerLimits {
            live_jobs: Some(1),
            creates_per_minute: Some(1),
            budget: None,
        };
        let ledger = OwnerLedger::default();
        let after = admitted(ledger.admit_create("i1", &limits, at(0), Live::Places)).unwrap();
        assert_eq!(after.window_creates, 1);
        // The same intent again (another process, a lost answer's repeat): admitted, nothing to write.
        assert_eq!(
            after.admit_create("i1", &limits, at(5), Live::Places),
            Within::Yes(None)
        );
        // Another intent: beyond both limits.
        assert!(matches!(
            after.admit_create("i2", &limits, at(5), Live::Places),
            Within::Beyond(LimitReached::LiveJobs { limit: 1, .. })
        ));
        // A store that counts the live jobs in its write keeps no places: the count decides.
        let counted =
            admitted(ledger.admit_create("i1", &limits, at(0), Live::Counted(0))).unwrap();
        assert!(counted.places.is_empty());
        assert!(matches!(
            counted.admit_create("i2", &limits, at(61_000), Live::Counted(1)),
            Within::Beyond(LimitReached::LiveJobs { .. })
        ));
        let next_minute =
            admitted(counted.admit_create("i2", &limits, at(61_000), Live::Counted(0)));
        assert_eq!(next_minute.unwrap().window_creates, 1);
    }

    #[test]
    fn at_the_live_limit_only_places_not_known_to_hold_are_checked() {
        let limits = OwnerLimits {
            live_jobs: Some(2),
            ..OwnerLimits::default()
        };
        let mut ledger = OwnerLedger::default();
        for (i, ms) in [("a", 0), ("b", 50_000)] {
            ledger = admitted(ledger.admit_create(i, &limits, at(ms), Live::Places)).unwrap();
        }
        // Both known to hold for less than a minute: refused without reading a job.
        assert!(matches!(
            ledger.admit_create("c", &limits, at(55_000), Live::Places),
            Within::Beyond(_)
        ));
        // A minute on, the older is checked; it holds no more, and its place goes to the new intent.
        assert_eq!(
            ledger.admit_create("c", &limits, at(61_000), Live::Places),
            Within::Check(vec!["a".into()])
        );
        let checked = ledger.checked(&["a".into()], &BTreeSet::new(), at(61_000));
        let after = admitted(checked.admit_create("c", &limits, at(61_000), Live::Places)).unwrap();
        assert_eq!(after.places.keys().collect::<Vec<_>>(), ["b", "c"]);
        // A place that holds is known to hold from the check on: not read again for a minute.
        let held = ledger.checked(&["a".into()], &["a".to_owned()].into(), at(61_000));
        assert!(matches!(
            held.admit_create("c", &limits, at(62_000), Live::Places),
            Within::Beyond(_)
        ));
    }

    #[test]
    fn places_are_bounded_by_the_limits_not_by_history() {
        let rate = OwnerLimits {
            creates_per_minute: Some(1_000),
            ..OwnerLimits::default()
        };
        let budget_only = OwnerLimits {
            budget: Some(Budget {
                period: Period::Day,
                tokens: Some(1_000_000),
                cost: None,
            }),
            ..OwnerLimits::default()
        };
        let (mut by_rate, mut by_budget) = (OwnerLedger::default(), OwnerLedger::default());
        for n in 0..10_000i64 {
            let intent = format!("i{n}");
            if let Some(after) =
                admitted(by_rate.admit_create(&intent, &rate, at(n * 100), Live::Places))
            {
                by_rate = after;
            }
            if let Some(after) =
                admitted(by_budget.admit_create(&intent, &budget_only, at(n * 100), Live::Places))
            {
                by_budget = after;
            }
            assert!(by_rate.places.len() <= 2 * 1_000);
        }
        assert!(by_rate.places.len() <= 601, "{}", by_rate.places.len());
        assert_eq!(
            by_budget,
            OwnerLedger::default(),
            "a budget alone keeps nothing per create"
        );
    }

    #[test]
    fn a_released_place_is_free_unless_taken_again_after_the_job_ended() {
        let limits = OwnerLimits {
            live_jobs: Some(1),
            ..OwnerLimits::default()
        };
        let ledger =
            admitted(OwnerLedger::default().admit_create("a", &limits, at(0), Live::Places))
                .unwrap();
        assert!(ledger.released("a", 1).unwrap().places.is_empty());
        // A manual attempt (3) took the place again after the job ended at attempt 2: that end's late release
        // leaves it; the end of attempt 3 frees it.
        let again = admitted(ledger.admit_attempt("a", 3, &limits, at(20), Live::Places)).unwrap();
        assert_eq!(again.released("a", 2), None);
        assert!(again.released("a", 3).unwrap().places.is_empty());
        assert_eq!(ledger.released("b", 1), None);
    }

    #[test]
    fn a_budget_moved_from_day_to_month_counts_from_its_period_start() {
        let month = OwnerLimits {
            budget: Some(Budget {
                period: Period::Month,
                tokens: Some(100),
                cost: None,
            }),
            ..OwnerLimits::default()
        };
        // 2027-01-15: spend counted in the day and the month, whichever the budget names.
        let mut ledger = OwnerLedger::default();
        for day in 0..3 {
            let spend = Spend {
                at: at(day * 86_400_000),
                tokens: 40,
                nanos: 0,
            };
            ledger = ledger.spend(&spend);
        }
        assert_eq!((ledger.day.tokens, ledger.month.tokens), (40, 120));
        assert!(month.spent(&ledger, at(3 * 86_400_000)).is_some());
        // A ledger of the one counter ledgers kept before reads as the kind its period names.
        let old: OwnerLedger = serde_json::from_value(serde_json::json!({
            "window_ms": 0, "window_creates": 0, "period": "2027-01-15", "spent_tokens": 7, "spent_nanos": 0
        }))
        .unwrap();
        assert_eq!((old.day.period.as_str(), old.day.tokens), ("2027-01-15", 7));
        assert!(old.month.period.is_empty());
        // A writer behind the clock adds to no later period.
        let behind = ledger.spend(&Spend {
            at: at(-40 * 86_400_000),
            tokens: 1,
            nanos: 0,
        });
        assert_eq!(behind, ledger);
    }

    #[test]
    fn a_spent_budget_admits_neither_a_create_nor_a_manual_attempt() {
        let limits = OwnerLimits {
            budget: Some(Budget {
                period: Period::Day,
                tokens: Some(10),
                cost: None,
            }),
            ..OwnerLimits::default()
        };
        let spent = OwnerLedger::default().spend(&Spend {
            at: at(0),
            tokens: 10,
            nanos: 0,
        });
        assert!(matches!(
            spent.admit_create("a", &limits, at(1), Live::Places),
            Within::Beyond(LimitReached::Budget { .. })
        ));
        assert!(matches!(
            spent.admit_attempt("a", 2, &limits, at(1), Live::Places),
            Within::Beyond(LimitReached::Budget { .. })
        ));
        assert_eq!(
            spent.admit_attempt("a", 2, &limits, at(86_400_000), Live::Places),
            Within::Yes(None)
        );
    }
}
