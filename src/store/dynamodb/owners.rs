//! What owners may start and what providers may take, on DynamoDB, with the operations the store already has
//! (`GetItem`, `UpdateItem`, `PutItem`, `Query`: no transactions, whose client code alone would not fit a
//! function's package):
//!
//! - an owner's ledger, the item `limits#<owner>`: its rates of creates and tokens, its spend in the day and the
//!   month, and `places`, a map from each intent holding a place to when it was last known to hold, the attempt
//!   that took it and the call it reserves against the budget ([`OwnerLedger`]), all guarded by `rev`. A create
//!   within limits takes its intent's place there first (reserving its first call's worst case), then puts the job;
//!   an intent that holds its place already — the same intent created by another process, or this create repeated
//!   after a lost answer — is not counted again and goes on to the job's conditional put, which decides created,
//!   replay or conflict. At the live-jobs limit or the budget, the places not known to hold for a minute are
//!   checked against their jobs (at most 16 a try, the oldest first): an ended call's reservation is settled from
//!   its job's record, an ended job's place leaves. A worker reserves each later call the same way before it makes
//!   it; an attempt's end settles its reservation, and the job's end frees its place, in the same guarded write. The
//!   places never stand for fewer than the owner's live jobs, nor the reservations for less than its calls not
//!   settled, so a limit of N admits at most N and the spend never passes the budget, however many functions write
//!   at once; and they are bounded by the limits, never by history.
//! - a provider's call slots, the item `slots#<provider>`: its holders, each until when (guarded by `rev`).
//! - the jobs that need a person: the sweep index lists a job `unknown` or `failed` under `UNKNOWN#s` or
//!   `FAILED#s` by when it came to be so.
//!
//! Costs, in requests: a create under limits reads the ledger and writes it (its job's put as ever); at a limit, it
//! may read up to 16 jobs. An attempt's end under a budget, and a job's end under a live-jobs limit, read the
//! ledger and write it; so does a worker's reservation of a failover's call. Taking or freeing a slot reads the
//! item and writes it. A guarded write that other writers keep winning ends as [`StoreError::Contended`]: a 503 to
//! a caller, to try again.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::AttributeValue;

use super::item::decode_item;
use super::update::Sweep;
use super::{DynamoError, DynamoStore, Item, SWEEP_INDEX, SWEEP_SHARDS, n, s, sdk_failure};
use crate::domain::{
    Bound, CallSlots, Job, JobId, JobStatus, Live, Owner, OwnerLedger, PeriodSpend, Place,
    ProviderName, Timestamp, Within,
};
use crate::store::{CallSlot, Cursor, Held, JobPage, ListQuery, StoreError};

/// How many times a guarded write of an owner's ledger or a provider's slots is tried while other writers win: a
/// burst of one owner's creates from many functions meets here.
const TRIES: u32 = 24;

/// A pause before try `n` again, with full jitter: 5 ms doubling, at most 200 ms.
async fn contended(tries: u32) {
    let cap = (5u64 << tries.min(6)).min(200);
    tokio::time::sleep(std::time::Duration::from_millis(fastrand::u64(0..=cap))).await;
}

fn ledger_key(owner: &Owner) -> String {
    format!("limits#{owner}")
}

fn slots_key(provider: &ProviderName) -> String {
    format!("slots#{provider}")
}

/// A number attribute, 0 when absent.
fn number(item: &Item, name: &str) -> u64 {
    number_of(item.get(name))
}

fn number_of(value: Option<&AttributeValue>) -> u64 {
    match value {
        Some(AttributeValue::N(v)) => v.parse().unwrap_or_default(),
        _ => 0,
    }
}

fn text<'a>(item: &'a Item, name: &str) -> Option<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Some(v),
        _ => None,
    }
}

/// A map kept as JSON text (`{"<key>": <ms>}`), empty when absent.
fn times(item: &Item, name: &str, key: &str) -> Result<BTreeMap<String, i64>, StoreError> {
    text(item, name)
        .map(|t| {
            serde_json::from_str(t)
                .map_err(|e| DynamoError::Corrupt(key.to_owned(), format!("{name}: {e}")).into())
        })
        .transpose()
        .map(Option::unwrap_or_default)
}

/// A period's spend, kept as `<kind>_period`, `<kind>_tokens`, `<kind>_nanos`.
fn period_spend(item: &Item, kind: &str) -> PeriodSpend {
    PeriodSpend {
        period: text(item, &format!("{kind}_period"))
            .unwrap_or_default()
            .to_owned(),
        tokens: number(item, &format!("{kind}_tokens")),
        nanos: number(item, &format!("{kind}_nanos")),
    }
}

/// An owner's ledger as its item keeps it, and the item's revision. Items written before the spend was counted per
/// kind (`spend_period`, `spent_tokens`, `spent_nanos`) and before places were kept by intent (`live`, JSON text by
/// job id) read as today's.
fn read_ledger(item: &Item, key: &str) -> Result<(OwnerLedger, u64), StoreError> {
    let mut places: BTreeMap<String, Place> = match item.get("places") {
        Some(AttributeValue::M(places)) => places
            .iter()
            .filter_map(|(intent, place)| {
                let place = place.as_m().ok()?;
                let at = i64::try_from(number_of(place.get("at"))).ok()?;
                let attempt = u32::try_from(number_of(place.get("n"))).ok()?;
                let place = Place {
                    reserved_for: u32::try_from(number_of(place.get("r"))).ok()?,
                    reserved: Bound {
                        tokens: number_of(place.get("t")),
                        nanos: number_of(place.get("c")),
                    },
                    ..Place::new(at, attempt)
                };
                Some((intent.clone(), place))
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    for (id, at) in times(item, "live", key)? {
        if let Ok(id) = JobId::parse(&id) {
            places
                .entry(id.intent().to_owned())
                .or_insert(Place::new(at, 1));
        }
    }
    let earlier = serde_json::json!({
        "period": text(item, "spend_period").unwrap_or_default(),
        "spent_tokens": number(item, "spent_tokens"),
        "spent_nanos": number(item, "spent_nanos"),
    });
    let mut ledger: OwnerLedger =
        serde_json::from_value(earlier).expect("an earlier ledger's fields");
    for (kind, spend) in [("day", &mut ledger.day), ("month", &mut ledger.month)] {
        let stored = period_spend(item, kind);
        if !stored.period.is_empty() {
            *spend = stored;
        }
    }
    ledger.rate_tat_us = number(item, "rate_tat_us") as i64;
    ledger.token_tat_us = number(item, "token_tat_us") as i64;
    ledger.places = places;
    Ok((ledger, number(item, "rev")))
}

/// The attributes of `ledger` as an update sets them, and the earlier forms it replaces.
fn ledger_values(ledger: &OwnerLedger) -> HashMap<String, AttributeValue> {
    let places = (ledger.places.iter())
        .map(|(intent, place)| {
            let mut kept = HashMap::from([
                ("at".to_owned(), n(place.at)),
                ("n".to_owned(), n(place.attempt)),
            ]);
            if place.reserved_for > 0 {
                kept.insert("r".to_owned(), n(place.reserved_for));
                kept.insert("t".to_owned(), n(place.reserved.tokens));
                kept.insert("c".to_owned(), n(place.reserved.nanos));
            }
            (intent.clone(), AttributeValue::M(kept))
        })
        .collect();
    let mut values = HashMap::from([
        (":rate".to_owned(), n(ledger.rate_tat_us)),
        (":token_rate".to_owned(), n(ledger.token_tat_us)),
        (":places".to_owned(), AttributeValue::M(places)),
    ]);
    for (kind, spend) in [("day", &ledger.day), ("month", &ledger.month)] {
        values.insert(format!(":{kind}_period"), s(&spend.period));
        values.insert(format!(":{kind}_tokens"), n(spend.tokens));
        values.insert(format!(":{kind}_nanos"), n(spend.nanos));
    }
    values
}

const LEDGER_SET: &str = "SET rate_tat_us = :rate, token_tat_us = :token_rate, places = :places, \
     day_period = :day_period, day_tokens = :day_tokens, day_nanos = :day_nanos, \
     month_period = :month_period, month_tokens = :month_tokens, month_nanos = :month_nanos, rev = :next \
     REMOVE live, spend_period, spent_tokens, spent_nanos, window_ms, window_creates";

fn limit_refused(limit: crate::domain::LimitReached) -> StoreError {
    StoreError::Refused(crate::domain::Refusal::Limit(limit))
}

/// Which write holds an intent to its owner's limits.
#[derive(Debug, Clone, Copy)]
pub(super) enum Holding<'a> {
    /// A create.
    Create,
    /// A manual attempt, this one, making the job (as read) live again.
    Attempt(&'a Job, u32),
}

impl DynamoStore {
    /// `owner`'s ledger and its revision (0 when it has none).
    async fn ledger(&self, owner: &Owner) -> Result<(OwnerLedger, u64), StoreError> {
        let key = ledger_key(owner);
        match self.get(&key).await? {
            Some(item) => read_ledger(&item, &key),
            None => Ok((OwnerLedger::default(), 0)),
        }
    }

    pub(super) async fn owner_ledger_of(&self, owner: &Owner) -> Result<OwnerLedger, StoreError> {
        Ok(self.ledger(owner).await?.0)
    }

    /// Stores `ledger` as `owner`'s if it is still at revision `rev`; whether it was.
    async fn put_ledger(
        &self,
        owner: &Owner,
        ledger: &OwnerLedger,
        rev: u64,
    ) -> Result<bool, StoreError> {
        let written = self
            .client
            .update_item()
            .table_name(&self.table)
            .key("pk", s(&ledger_key(owner)))
            .update_expression(LEDGER_SET)
            .condition_expression("attribute_not_exists(rev) OR rev = :rev")
            .set_expression_attribute_values(Some(ledger_values(ledger)))
            .expression_attribute_values(":next", n(rev + 1))
            .expression_attribute_values(":rev", n(rev))
            .send()
            .await;
        match written.map_err(|e| e.into_service_error()) {
            Ok(_) => Ok(true),
            Err(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
            Err(other) => Err(StoreError::backend(other)),
        }
    }

    /// The jobs of `intents` that are there at `now` (not expired), by intent: what a check of places reads.
    async fn jobs(
        &self,
        intents: &[String],
        now: Timestamp,
    ) -> Result<BTreeMap<String, Job>, StoreError> {
        let mut jobs = BTreeMap::new();
        for item in self.read_items(intents).await? {
            let job = decode_item(&item)?.job;
            if !job.is_expired(now) {
                jobs.insert(job.id.intent().to_owned(), job);
            }
        }
        Ok(jobs)
    }

    /// Holds `intent`'s write (`holding`) to `owner`'s limits at `now` (`held`), in the ledger's guarded write: Ok
    /// once it is within them (its place taken, or held already), else the limit it would pass
    /// ([`StoreError::Refused`]).
    pub(super) async fn hold(
        &self,
        owner: &Owner,
        intent: &str,
        holding: Holding<'_>,
        Held { limits, bound }: Held<'_>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let admit = |ledger: &OwnerLedger| match holding {
            Holding::Create => ledger.admit_create(intent, limits, now, Live::Places, bound),
            Holding::Attempt(job, n) => {
                ledger.admit_attempt(job, n, limits, now, Live::Places, bound)
            }
        };
        self.guarded(owner, now, admit).await
    }

    /// Writes what `admit` makes of `owner`'s ledger at `now`, in a write guarded by its revision: Ok once it is
    /// written (or there was nothing to write), else the limit `admit` says it would pass ([`StoreError::Refused`]).
    /// Places not known to hold are checked against their jobs first, as `admit` asks, and what the check found is
    /// kept even when the write is refused.
    pub(super) async fn guarded(
        &self,
        owner: &Owner,
        now: Timestamp,
        admit: impl Fn(&OwnerLedger) -> Within,
    ) -> Result<(), StoreError> {
        for tries in 0..TRIES {
            if tries > 0 {
                contended(tries).await;
            }
            let (read, rev) = self.ledger(owner).await?;
            let mut ledger = read.clone();
            let within = loop {
                match admit(&ledger) {
                    Within::Check(intents) => {
                        let jobs = self.jobs(&intents, now).await?;
                        ledger = ledger.checked(&intents, &jobs, now);
                    }
                    within => break within,
                }
            };
            let (after, refused) = match within {
                Within::Yes(None) if ledger == read => return Ok(()),
                Within::Yes(None) => (ledger, None),
                Within::Yes(Some(after)) => (after, None),
                Within::Beyond(limit) if ledger == read => return Err(limit_refused(limit)),
                Within::Beyond(limit) => (ledger, Some(limit)),
                Within::Check(_) => unreachable!("checks are made above"),
            };
            if self.put_ledger(owner, &after, rev).await? {
                return refused.map_or(Ok(()), |limit| Err(limit_refused(limit)));
            }
        }
        Err(StoreError::Contended(ledger_key(owner)))
    }

    /// Takes or frees `holder`'s slot of `provider` (`take` is `Some(slot)` to take one), as [`CallSlots`] rules,
    /// in a write guarded by the item's revision: whether `holder` holds one after a take.
    pub(super) async fn slot(
        &self,
        provider: &ProviderName,
        holder: &str,
        take: Option<CallSlot>,
    ) -> Result<bool, StoreError> {
        let key = slots_key(provider);
        for tries in 0..TRIES {
            if tries > 0 {
                contended(tries).await;
            }
            let item = self.get(&key).await?.unwrap_or_default();
            let rev = number(&item, "rev");
            let slots = CallSlots {
                holders: times(&item, "holders", &key)?,
            };
            let after = match take {
                Some(CallSlot { cap, until, now }) => match slots.take(holder, cap, until, now) {
                    Some(after) => after,
                    None => return Ok(false),
                },
                None => match slots.free(holder) {
                    Some(after) => after,
                    None => return Ok(true),
                },
            };
            let written = self
                .client
                .update_item()
                .table_name(&self.table)
                .key("pk", s(&key))
                .update_expression("SET holders = :holders, rev = :next")
                .condition_expression("attribute_not_exists(rev) OR rev = :rev")
                .expression_attribute_values(
                    ":holders",
                    s(&serde_json::to_string(&after.holders).expect("a map")),
                )
                .expression_attribute_values(":next", n(rev + 1))
                .expression_attribute_values(":rev", n(rev))
                .send()
                .await;
            match written.map_err(|e| e.into_service_error()) {
                Ok(_) => return Ok(true),
                Err(UpdateItemError::ConditionalCheckFailedException(_)) => {}
                Err(other) => return Err(StoreError::backend(other)),
            }
        }
        Err(StoreError::Contended(key))
    }

    /// Every owner's jobs that need a person, the latest first: each shard of the sweep index's `UNKNOWN` and
    /// `FAILED` entries (or `status`'s), read and merged; an entry whose job moved on since is left out.
    pub(super) async fn people_needed(
        &self,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        let (status, limit, cursor) = (query.status, query.limit, query.cursor.as_ref());
        let kinds = match status {
            Some(JobStatus::Unknown) => vec![Sweep::Unknown],
            Some(JobStatus::Failed) => vec![Sweep::Failed],
            Some(_) => vec![],
            None => vec![Sweep::Unknown, Sweep::Failed],
        };
        let mut keys = Vec::new();
        for kind in kinds {
            for shard in 0..SWEEP_SHARDS {
                let mut request = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .index_name(SWEEP_INDEX)
                    .expression_attribute_values(":pk", s(&format!("{}#{shard}", kind.as_str())))
                    .scan_index_forward(false)
                    .limit(limit as i32 + 1);
                request = match cursor {
                    Some(c) => request
                        .key_condition_expression("sweep_pk = :pk AND sweep_at <= :at")
                        .expression_attribute_values(":at", n(c.created_at_ms)),
                    None => request.key_condition_expression("sweep_pk = :pk"),
                };
                let out = request.send().await.map_err(sdk_failure)?;
                keys.extend(
                    out.items()
                        .iter()
                        .filter_map(|entry| text(entry, "pk").map(str::to_owned)),
                );
            }
        }
        let mut found = Vec::new();
        for item in self.read_items(&keys).await? {
            let decoded = decode_item(&item)?;
            let job = &decoded.job;
            let needs = matches!(job.status(), JobStatus::Unknown | JobStatus::Failed)
                && status.is_none_or(|s| s == job.status());
            let Some(at) = decoded.sweep_at.filter(|_| needs && !job.is_expired(now)) else {
                continue;
            };
            let place = (at.timestamp_millis(), job.id.clone());
            if cursor.is_none_or(|c| place < (c.created_at_ms, c.id.clone())) {
                found.push((place, decoded));
            }
        }
        found.sort_by(|(a, _), (b, _)| b.cmp(a));
        let next_cursor = (found.len() > limit).then(|| {
            found.truncate(limit);
            let ((ms, id), _) = found.last().expect("limit is at least 1");
            Cursor {
                created_at_ms: *ms,
                id: id.clone(),
            }
        });
        let decoded = self
            .with_inputs(found.into_iter().map(|(_, d)| d).collect())
            .await?;
        Ok(JobPage {
            jobs: decoded.into_iter().map(|d| d.job).collect(),
            next_cursor,
        })
    }
}
