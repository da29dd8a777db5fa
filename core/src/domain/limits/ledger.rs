//! An owner's ledger: what a store keeps for each owner that has limits — the places its live jobs hold and the
//! reservations they carry, its rates of creates and tokens, its spend this day and month — and the rules that admit
//! a write against it, bounded by the limits.

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
    /// The same for `tokens_per_minute`: each create moves it on by its job's worst case in tokens.
    pub token_tat_us: i64,
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
    /// The attempt whose call is paid for in advance against the budget (0: none): it is settled, from the job's
    /// record, once that attempt has ended.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reserved_for: u32,
    /// What it reserved: the call's worst case.
    #[serde(default, skip_serializing_if = "Bound::is_zero")]
    pub reserved: Bound,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Place {
    /// A place taken at `at` by `attempt`, with nothing reserved.
    pub fn new(at: i64, attempt: u32) -> Self {
        Self {
            at,
            attempt,
            reserved_for: 0,
            reserved: Bound::default(),
        }
    }
}

/// The ledger as stored: today's, and the one spend counter that ledgers kept before (`period`, `spent_tokens`,
/// `spent_nanos`), whose period's key tells its kind.
#[derive(Deserialize)]
struct StoredLedger {
    #[serde(default)]
    rate_tat_us: i64,
    #[serde(default)]
    token_tat_us: i64,
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
            token_tat_us: stored.token_tat_us,
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

    /// What the places reserve, together: calls paid for in advance, not settled yet.
    pub fn reserved(&self) -> Bound {
        (self.places.values()).fold(Bound::default(), |sum, place| sum.plus(place.reserved))
    }

    /// The ledger as it stands at `now`: without a live-jobs limit, places past [`Self::CREATE_HELD`] that reserve
    /// nothing gone (they only kept a create from being counted twice).
    fn at(&self, limits: &OwnerLimits, now: Timestamp) -> Self {
        let mut after = self.clone();
        if limits.live_jobs.is_none() {
            let fresh = (now - Self::CREATE_HELD).timestamp_millis();
            (after.places).retain(|_, place| place.at > fresh || place.reserved_for > 0);
        }
        after
    }

    /// A create of `intent` at `now`, under `limits`, the owner's live jobs known as `live` says, its job's worst
    /// case `bound`. An intent that holds its place already was counted: it is admitted as it is (another writer's
    /// create of it, or this create's own earlier try). Else it takes a place among the live jobs, then its turn at
    /// the create and token rates, and reserves its first call within the budget.
    pub fn admit_create(
        &self,
        intent: &str,
        limits: &OwnerLimits,
        now: Timestamp,
        live: Live,
        bound: Bound,
    ) -> Within {
        let mut after = self.at(limits, now);
        if after.places.contains_key(intent) {
            return Self::admitted(self, after);
        }
        if let Some(refused) = after.take_place(intent, 1, limits, now, live) {
            return refused;
        }
        const MINUTE_US: i64 = 60_000_000;
        if let Some(limit) = limits.creates_per_minute {
            // GCRA: one create every interval, a minute's worth at once at most — whatever the clock's minutes.
            let interval = MINUTE_US / i64::from(limit.max(1));
            match gcra(after.rate_tat_us, interval, now) {
                Ok(tat) => after.rate_tat_us = tat,
                Err(retry_after) => {
                    return Within::Beyond(LimitReached::CreateRate { limit, retry_after });
                }
            }
        }
        if let Some(limit) = limits.tokens_per_minute {
            // The same, a create weighing its tokens: a job of more than a minute's tokens waits for an empty
            // bucket, and the next for its tokens' time.
            let weight =
                i128::from(bound.tokens) * i128::from(MINUTE_US) / i128::from(limit.max(1));
            let weight = i64::try_from(weight).unwrap_or(i64::MAX / 4).max(1);
            match gcra(after.token_tat_us, weight, now) {
                Ok(tat) => after.token_tat_us = tat,
                Err(retry_after) => {
                    return Within::Beyond(LimitReached::TokenRate { limit, retry_after });
                }
            }
        }
        if limits.budget.is_some() {
            return after.reserving(intent, 1, limits, now, bound);
        }
        Self::admitted(self, after)
    }

    /// A manual attempt `attempt` at `now` that makes `job` live again: it takes a place among the live jobs — or,
    /// if the intent holds one still, makes it this attempt's — and reserves its call (worst case `bound`) within
    /// the budget. Creates and tokens a minute count creates only.
    pub fn admit_attempt(
        &self,
        job: &Job,
        attempt: u32,
        limits: &OwnerLimits,
        now: Timestamp,
        live: Live,
        bound: Bound,
    ) -> Within {
        if !limits.keeps_places() {
            return Within::Yes(None);
        }
        let intent = job.id.intent();
        let mut after = self.at(limits, now).settled(job, now);
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
        if limits.budget.is_some() {
            return after.reserving(intent, attempt, limits, now, bound);
        }
        Self::admitted(self, after)
    }

    /// Before attempt `attempt` of `job` calls its provider at `now`: its call reserved within the budget (worst
    /// case `bound`) — the attempt the intent's place reserves for already (its create's or its manual attempt's
    /// reservation) as it is; else the earlier reservation settled from the job's record, and this one made. A
    /// job that lost its place (a check found it ended, or it was made before the budget) takes one again.
    pub fn reserve(
        &self,
        job: &Job,
        attempt: u32,
        limits: &OwnerLimits,
        now: Timestamp,
        bound: Bound,
    ) -> Within {
        let intent = job.id.intent();
        if limits.budget.is_none()
            || self
                .places
                .get(intent)
                .is_some_and(|p| p.reserved_for == attempt)
        {
            return Within::Yes(None);
        }
        let mut after = self.at(limits, now);
        if let Some(place) = after.places.get(intent).copied() {
            // The reservation of an attempt before this one: ended (this one could not be claimed else), or
            // taken for the worst if the record says no more of it.
            let spent = job
                .settlement(place.reserved_for, place.reserved)
                .unwrap_or(place.reserved);
            after = after.settle_place(intent, spent, now);
        }
        (after.places)
            .entry(intent.to_owned())
            .or_insert_with(|| Place::new(now.timestamp_millis(), attempt));
        after.reserving(intent, attempt, limits, now, bound)
    }

    /// `intent`'s place (taken) reserves `bound` for `attempt`, if that fits the budget beside the spend and the
    /// other reservations; else the places reserving for a call that is not known to be running for
    /// [`Self::PLACE_HELD`] are checked against their jobs first, then it is refused.
    fn reserving(
        mut self,
        intent: &str,
        attempt: u32,
        limits: &OwnerLimits,
        now: Timestamp,
        bound: Bound,
    ) -> Within {
        if bound.is_zero() {
            // Nothing to pay for in advance (no price, and a budget of cost alone).
            return Within::Yes(Some(self));
        }
        let reserving = self.places.values().filter(|p| p.reserved_for > 0).count();
        if reserving >= OwnerLimits::MAX_LIVE_JOBS as usize {
            return Within::Beyond(LimitReached::LiveJobs {
                limit: OwnerLimits::MAX_LIVE_JOBS,
                retry_after: LIVE_RETRY,
            });
        }
        if let Some(beyond) = limits.fits(&self, now, bound) {
            let unknown = self.unknown(now, |place| place.reserved_for > 0);
            if !unknown.is_empty() && beyond.retry_after() == LIVE_RETRY {
                return Within::Check(unknown);
            }
            return Within::Beyond(beyond);
        }
        let place = self.places.get_mut(intent).expect("the place is taken");
        place.reserved_for = attempt;
        place.reserved = bound;
        place.at = now.timestamp_millis();
        Within::Yes(Some(self))
    }

    /// The places `which` picks that are not known to hold for [`Self::PLACE_HELD`] at `now`, the oldest first, at
    /// most [`Self::CHECKS`].
    fn unknown(&self, now: Timestamp, which: impl Fn(&Place) -> bool) -> Vec<String> {
        let stale = (now - Self::PLACE_HELD).timestamp_millis();
        let mut unknown: Vec<(i64, &String)> = (self.places.iter())
            .filter(|(_, place)| place.at <= stale && which(place))
            .map(|(intent, place)| (place.at, intent))
            .collect();
        unknown.sort();
        let check = unknown.into_iter().take(Self::CHECKS);
        check.map(|(_, i)| i.clone()).collect()
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
        match live {
            Live::Counted(live) => {
                if let Some(limit) = limits.live_jobs.filter(|l| live >= *l) {
                    return refused(limit);
                }
                // Counted, the live jobs need no place; a reservation does.
                limits.budget?;
            }
            Live::Places => {
                if let Some(limit) = limits
                    .live_jobs
                    .filter(|l| self.places.len() >= *l as usize)
                {
                    let unknown = self.unknown(now, |_| true);
                    if unknown.is_empty() {
                        return refused(limit);
                    }
                    return Some(Within::Check(unknown));
                }
            }
        }
        // A place for every intent held to a limit, a budget alone included: the other process's create of the same
        // intent finds it, and is admitted as the replay it is whatever the limits say by then.
        let place = Place::new(now.timestamp_millis(), attempt);
        self.places.insert(intent.to_owned(), place);
        None
    }

    fn admitted(before: &Self, after: Self) -> Within {
        Within::Yes((after != *before).then_some(after))
    }

    /// The ledger once the store read the jobs of `checked` (what [`Within::Check`] asked for) at `now` — `jobs`
    /// by intent, those that are there and not expired: each found settles what its place reserved if its call
    /// ended, and is known to hold as of `now` while it is live; the others' places are free, and what they
    /// reserved with them (a create whose job was never written made no call).
    pub fn checked(
        &self,
        checked: &[String],
        jobs: &BTreeMap<String, Job>,
        now: Timestamp,
    ) -> Self {
        let mut after = self.clone();
        for intent in checked {
            match jobs.get(intent) {
                Some(job) => {
                    after = after.settled(job, now);
                    if let Some(place) = after.places.get_mut(intent) {
                        place.at = now.timestamp_millis();
                    }
                }
                None => {
                    after.places.remove(intent);
                }
            }
        }
        after
    }

    /// The ledger once `job`'s record was read at `now`: what its place reserved is settled if that attempt
    /// ended ([`Job::settlement`]: counted in the spend once), and the place is free if the job is no longer
    /// live — unless a later attempt took it again (a manual attempt made the job live after this end). `None`
    /// when nothing changes: what a job's end writes.
    pub fn settle(&self, job: &Job, now: Timestamp) -> Option<Self> {
        let after = self.settled(job, now);
        (after != *self).then_some(after)
    }

    fn settled(&self, job: &Job, now: Timestamp) -> Self {
        let intent = job.id.intent();
        let Some(place) = self.places.get(intent).copied() else {
            return self.clone();
        };
        let mut after = self.clone();
        if place.reserved_for > 0
            && let Some(spent) = job.settlement(place.reserved_for, place.reserved)
        {
            after = after.settle_place(intent, spent, now);
        }
        let last = job.attempts.iter().map(|a| a.number).max().unwrap_or(0);
        let still_reserving = after.places.get(intent).is_some_and(|p| p.reserved_for > 0);
        if !job.is_live() && place.attempt <= last && !still_reserving {
            after.places.remove(intent);
        }
        after
    }

    /// `intent`'s reservation settled at `now` as `spent`: counted in the day and the month, the place reserving
    /// nothing more.
    fn settle_place(mut self, intent: &str, spent: Bound, now: Timestamp) -> Self {
        if let Some(place) = self.places.get_mut(intent) {
            place.reserved_for = 0;
            place.reserved = Bound::default();
        }
        self.spend(&Spend {
            at: now,
            tokens: spent.tokens,
            nanos: spent.nanos,
        })
    }
}

/// GCRA over `tat` (a theoretical arrival time, in microseconds) for a request weighing `weight` microseconds at
/// `now`: the next `tat` if it is admitted — it comes no more than a minute's worth ahead, or the bucket is empty —
/// else how long until it would be.
fn gcra(tat: i64, weight: i64, now: Timestamp) -> Result<i64, Duration> {
    const MINUTE_US: i64 = 60_000_000;
    let now_us = now.timestamp_micros();
    let due = tat.max(now_us);
    let ahead = due.saturating_add(weight) - now_us;
    if ahead > MINUTE_US && due > now_us {
        return Err(
            Duration::microseconds(ahead - MINUTE_US).min(Duration::microseconds(due - now_us))
        );
    }
    Ok(due.saturating_add(weight))
}
