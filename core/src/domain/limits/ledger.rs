//! An owner's ledger: what a store keeps for each owner that has limits — the places its live jobs hold, its window
//! of creates, its spend this day and month — and the rules that admit a write against it, bounded by the limits.

use super::*;

/// What a store keeps for each owner that has limits: its window of creates, its spend in the current day and month
/// (both counted, whichever the budget names, so that a budget moved from one to the other is held from the start
/// of its period), and the places its jobs hold. Bounded by the limits (see the module's doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OwnerLedger {
    /// When the owner's next create is due by its rate, `creates_per_minute` spread evenly over the minute (its
    /// theoretical arrival time, in microseconds since the epoch: GCRA). A create is admitted while it comes no more
    /// than a minute's burst (`creates_per_minute` less one) ahead of it, and moves it on by one interval.
    pub rate_tat_us: i64,
    pub day: PeriodSpend,
    pub month: PeriodSpend,
    /// The places intents hold, by intent (the key its job is kept under, [`crate::domain::JobId::intent`]). A store that
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
    rate_tat_us: i64,
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
            rate_tat_us: stored.rate_tat_us,
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

    /// The ledger as it stands at `now`: without a live-jobs limit, places past [`Self::CREATE_HELD`] gone (they
    /// only kept a create from being counted twice).
    fn at(&self, limits: &OwnerLimits, now: Timestamp) -> Self {
        let mut after = self.clone();
        if limits.live_jobs.is_none() {
            let fresh = (now - Self::CREATE_HELD).timestamp_millis();
            after.places.retain(|_, place| place.at > fresh);
        }
        after
    }

    /// A create of `intent` at `now`, under `limits`, the owner's live jobs known as `live` says. An intent that
    /// holds its place already was counted: it is admitted as it is (another writer's create of it, or this
    /// create's own earlier try). Else it takes a place among the live jobs, then its turn at the create rate,
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
            // GCRA: one create every interval, a minute's worth at once at most — whatever the clock's minutes.
            const MINUTE_US: i64 = 60_000_000;
            let interval = MINUTE_US / i64::from(limit.max(1));
            let burst = MINUTE_US - interval;
            let now_us = now.timestamp_micros();
            let due = after.rate_tat_us.max(now_us);
            if due - now_us > burst {
                let retry_after = Duration::microseconds(due - burst - now_us);
                return Within::Beyond(LimitReached::CreateRate { limit, retry_after });
            }
            after.rate_tat_us = due + interval;
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

    /// `intent` takes a place at `now` — among the live jobs, at their limit only after the places not known to
    /// hold for [`Self::PLACE_HELD`] are checked; under any limit, so that each create counts once and another
    /// process's create of the intent is admitted as its replay. The refusal, if it is one.
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
        // A place for every intent held to a limit, a budget alone included: the other process's create of the same
        // intent finds it, and is admitted as the replay it is whatever the limits say by then.
        let at = now.timestamp_millis();
        self.places.insert(intent.to_owned(), Place { at, attempt });
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
