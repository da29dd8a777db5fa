//! The table's items: their stored shapes, derived with serde and encoded by `serde_dynamo`, and how a job is read
//! back from them. A value that does not read names its attribute (`attempts.2.created_at: invalid type …`); nothing
//! is defaulted.
//!
//! | attribute | type | meaning |
//! |---|---|---|
//! | `pk` | S | the intent part of the job id, `job_<32 hex>` (table hash key); the id adds the creation time |
//! | `owner`, `created_key` | S, S | GSI `by_owner` (keys only): owner → `<created_at ms, 13 digits>#<id>`, newest first |
//! | `idempotency_key`, `fingerprint`, `contract` | S, B, S | the intent (the fingerprint's 32 bytes; its hex text on items written before) |
//! | `input` | S or B | the input, as JSON text, deflated (B) when that is shorter ([`Packed`]), when the text is at most 1 KiB; a larger one is in the item `input#<pk>#<fingerprint>` (`input` S or B, `expires_at` N), written once before the job |
//! | `providers` | L of S | the chain |
//! | `attempts` | M | attempt number → `{provider, state, seen_version?, lease_expires_at?, created_at, dispatched_at?, not_before?, retry_of?, started_at?, finished_at?, error?, report?, origin?, writer?, request?, cancelled_by?, went_unknown?, cleared_by?, cleared_at?, call_id?}` |
//! | `slot` | M | the result slot, absent while open: `{attempt, result?, at, token?}`; attempt 0 = the job was cancelled (by the write `token`) |
//! | `error` | S | the job's error, as JSON text |
//! | `rev` | N | bumped by every write; guards the writes that read first |
//! | `sweep_pk`, `sweep_at` | S, N | sparse GSI `sweep` (keys only): `QUEUED#s` / `STARTED#s` (s = shard 0–7) → last dispatch / lease end |
//! | `created_at`, `updated_at` | N | milliseconds; `updated_at` absent until a write after the create |
//! | `expires_at` | N | seconds: the end of the retention, and the table's TTL attribute |
//!
//! Qualification evidence and breakers live in the same table too (see `providers`).
//!
//! `version` is not stored: it is 1 once the slot is taken (by a result or a cancel) and 0 before, which is exactly
//! "bumped by job-level transitions only". An attempt that delivered a result is stored as `answered`; it reads as
//! `succeeded` if it holds the slot, else `discarded`. That lets a completion be one `UpdateItem`
//! (`SET slot = if_not_exists(slot, :mine)`) for the winner and the loser alike: the loser's payload is never
//! written. A live attempt of a cancelled job reads as `cancelled`.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::serde::{ts_milliseconds, ts_milliseconds_option as ms_opt, ts_seconds};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::codec::{Packed, fingerprint_bytes, json_text_option as json_opt};
use super::update::{Sweep, sweep_key, sweep_kind};
use super::{DynamoError, Item};
use crate::domain::{
    Attempt, AttemptState, CallReport, Cleared, ClearedBy, ContractRef, ErrorInfo, Fingerprint,
    IdempotencyKey, Intervention, Job, JobId, JobStatus, Owner, ProviderName, Timestamp,
    WriteToken,
};
use crate::store::StoreError;

/// The state an attempt that delivered a result is stored in, winner or loser alike.
pub(super) const ANSWERED: &str = "answered";

/// A job's item.
#[derive(Debug, Serialize, Deserialize)]
struct JobItem {
    pk: String,
    owner: Owner,
    created_key: String,
    idempotency_key: IdempotencyKey,
    #[serde(with = "fingerprint_bytes")]
    fingerprint: Fingerprint,
    contract: ContractRef,
    /// Absent when the input is kept in an item of its own ([`input_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input: Option<Packed>,
    providers: Vec<ProviderName>,
    #[serde(with = "ts_milliseconds")]
    created_at: Timestamp,
    /// Absent until the first write after the create: the creation time then (every byte counts, see `capacity`).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    updated_at: Option<Timestamp>,
    #[serde(with = "ts_seconds")]
    expires_at: Timestamp,
    rev: i64,
    attempts: BTreeMap<String, AttemptItem>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_opt")]
    error: Option<ErrorInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sweep_pk: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    sweep_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slot: Option<Slot>,
    /// Operators' acts on the job, as JSON text; absent while there are none.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_opt")]
    interventions: Option<Vec<Intervention>>,
}

/// One attempt, under its number in the job's `attempts` map.
#[derive(Debug, Serialize, Deserialize)]
struct AttemptItem {
    provider: ProviderName,
    /// An [`AttemptState`], or [`ANSWERED`].
    state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seen_version: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    lease_expires_at: Option<Timestamp>,
    #[serde(with = "ts_milliseconds")]
    created_at: Timestamp,
    /// Absent until the attempt is dispatched again (and on items written before re-dispatches were recorded): the
    /// creation time then.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    dispatched_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    not_before: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_of: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    started_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    finished_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_opt")]
    error: Option<ErrorInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_opt")]
    report: Option<CallReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    origin: Option<WriteToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    writer: Option<WriteToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<WriteToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cancelled_by: Option<WriteToken>,
    /// It was `unknown` (set by the time-out's update): an answer written to it by the targeted completion, which
    /// says nothing more, reads as cleared by its late answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    went_unknown: bool,
    /// How it left `unknown` ([`Cleared`]) where a write said so: `by`'s name, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cleared_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "ms_opt")]
    cleared_at: Option<Timestamp>,
    /// The provider's name of the call ([`Attempt::call_id`]), set by the time-out's update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    call_id: Option<String>,
}

/// The result slot: taken once, by a result (`attempt` > 0) or by the job's cancel (`attempt` 0).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Slot {
    attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_opt")]
    result: Option<Value>,
    #[serde(with = "ts_milliseconds")]
    at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    token: Option<WriteToken>,
}

impl Slot {
    /// The slot a winning result takes.
    pub(super) fn result(number: u32, result: Value, at: Timestamp) -> AttributeValue {
        encode_value(&Slot {
            attempt: number,
            result: Some(result),
            at,
            token: None,
        })
    }

    /// The slot the job's cancel takes, by the write `token`.
    pub(super) fn cancelled(token: &WriteToken, at: Timestamp) -> AttributeValue {
        encode_value(&Slot {
            attempt: 0,
            result: None,
            at,
            token: Some(token.clone()),
        })
    }
}

/// What a read of an item needs besides the job: the guard of a read-then-write, the sweep entry's time, and
/// whether the job's input is in an item of its own (then `job.input` is `null` until that item is read).
pub(super) struct Decoded {
    pub job: Job,
    pub rev: i64,
    pub sweep_at: Option<Timestamp>,
    pub input_apart: bool,
}

/// The largest input (its JSON text, in bytes) kept in the job's item. A larger one is written once, in an item of
/// its own, so that the transitions, which rewrite the job's item, do not pay for it again (see `capacity`).
pub(super) const INLINE_INPUT: usize = 1024;

/// Whether the input goes in an item of its own: by the length of its JSON text, so the same input is always kept
/// in the same place.
fn input_apart(job: &Job) -> bool {
    job.input.to_string().len() > INLINE_INPUT
}

/// An input kept apart: immutable, under its job's intent and the fingerprint (which covers the input), so a
/// replay or a later incarnation with the same intent writes the very same item; it expires with its job.
#[derive(Debug, Serialize, Deserialize)]
struct InputItem {
    pk: String,
    input: Packed,
    #[serde(with = "ts_seconds")]
    expires_at: Timestamp,
}

/// The key of the item that holds `job`'s input when it is kept apart. It cannot be a job id (those start `job_`)
/// and carries no index key.
pub(super) fn input_key(job: &Job) -> String {
    format!("input#{}#{}", job.id.intent(), job.fingerprint)
}

/// The item holding `job`'s input, if it is kept apart.
pub(super) fn encode_input(job: &Job) -> Option<Item> {
    input_apart(job).then(|| {
        serde_dynamo::to_item(InputItem {
            pk: input_key(job),
            input: Packed(job.input.clone()),
            expires_at: job.expires_at,
        })
        .expect("an input's item always encodes")
    })
}

/// The input an input item holds, with its key.
pub(super) fn decode_input(item: &Item) -> Result<(String, Value), StoreError> {
    let stored: InputItem = read(item)?;
    Ok((stored.pk, stored.input.0))
}

/// The item for a job as the domain sees it, at revision `rev`. Attempt states are written as they are.
pub(super) fn encode(job: &Job, rev: i64) -> Item {
    let sweep = job
        .live_attempt()
        .and_then(|live| match sweep_kind(job, live)? {
            Sweep::Queued => Some((Sweep::Queued, live.dispatched_at)),
            Sweep::Started => Some((
                Sweep::Started,
                live.lease_expires_at.unwrap_or(job.updated_at),
            )),
            Sweep::Events | Sweep::Lanes | Sweep::Unknown | Sweep::Failed => None,
        })
        // A job that needs a person, by when it came to: the operators' view.
        .or(match job.status() {
            JobStatus::Unknown => Some((Sweep::Unknown, job.updated_at)),
            JobStatus::Failed => Some((Sweep::Failed, job.updated_at)),
            _ => None,
        });
    let item = JobItem {
        pk: job.id.intent().to_owned(),
        owner: job.owner.clone(),
        created_key: created_key(job.created_at.timestamp_millis(), &job.id),
        idempotency_key: job.idempotency_key.clone(),
        fingerprint: job.fingerprint,
        contract: job.contract.clone(),
        input: (!input_apart(job)).then(|| Packed(job.input.clone())),
        providers: job.providers.clone(),
        created_at: job.created_at,
        updated_at: (job.updated_at != job.created_at).then_some(job.updated_at),
        expires_at: job.expires_at,
        rev,
        attempts: job
            .attempts
            .iter()
            .map(|a| (a.number.to_string(), encode_attempt(a)))
            .collect(),
        error: job.error.clone(),
        sweep_pk: sweep.map(|(kind, _)| sweep_key(kind, &job.id)),
        sweep_at: sweep.map(|(_, at)| at),
        slot: (job.version > 0).then(|| Slot {
            attempt: job.completed_by.unwrap_or(0),
            result: job.result.clone(),
            at: job.cancelled_at.unwrap_or(job.updated_at),
            token: job.cancelled_by.clone(),
        }),
        interventions: (!job.interventions.is_empty()).then(|| job.interventions.clone()),
    };
    serde_dynamo::to_item(item).expect("a job's item always encodes")
}

fn encode_attempt(a: &Attempt) -> AttemptItem {
    AttemptItem {
        provider: a.provider.clone(),
        state: a.state.as_str().to_owned(),
        seen_version: a.seen_version,
        lease_expires_at: a.lease_expires_at,
        created_at: a.created_at,
        dispatched_at: (a.dispatched_at != a.created_at).then_some(a.dispatched_at),
        not_before: a.not_before,
        retry_of: a.retry_of,
        started_at: a.started_at,
        finished_at: a.finished_at,
        error: a.error.clone(),
        report: a.report.clone(),
        origin: a.origin.clone(),
        writer: a.writer.clone(),
        request: a.request.clone(),
        cancelled_by: a.cancelled_by.clone(),
        went_unknown: a.state == AttemptState::Unknown,
        cleared_by: a.cleared.map(|c| c.by.as_str().to_owned()),
        cleared_at: a.cleared.map(|c| c.at),
        call_id: a.call_id.clone(),
    }
}

/// A value in an update expression, encoded as the item's attribute of that type is.
fn encode_value(value: &impl Serialize) -> AttributeValue {
    serde_dynamo::to_attribute_value(value).expect("stored values always encode")
}

/// A value kept as JSON text, for an update expression (a report, an error).
pub(super) fn json_attribute(value: &impl Serialize) -> AttributeValue {
    AttributeValue::S(serde_json::to_string(value).expect("domain values always serialise"))
}

/// The job an item holds (its input aside, when kept apart), with `version`, result, cancellation and derived
/// attempt states read from the slot, its revision and its sweep time.
pub(super) fn decode_item(item: &Item) -> Result<Decoded, StoreError> {
    let stored: JobItem = read(item)?;
    let bad = |what: &str, detail: &dyn std::fmt::Display| corrupt(&stored.pk, what, detail);
    let intent = JobId::parse(&stored.pk).map_err(|e| bad("pk", &e))?;
    let id = JobId::incarnation(intent.intent(), stored.created_at.timestamp_millis());
    let input_apart = stored.input.is_none();
    let updated_at = stored.updated_at.unwrap_or(stored.created_at);
    let slot = stored.slot;
    let slot_at = slot.as_ref().map(|s| s.at);
    let cancelled_at = slot.as_ref().filter(|s| s.attempt == 0).map(|s| s.at);
    let completed_by = slot.as_ref().map(|s| s.attempt).filter(|a| *a > 0);
    let mut attempts = Vec::with_capacity(stored.attempts.len());
    for (key, a) in stored.attempts {
        let number: u32 = key
            .parse()
            .map_err(|e| bad(&format!("attempts.{key}"), &e))?;
        let state = read_state(&a.state, number, completed_by, cancelled_at)
            .ok_or_else(|| bad(&format!("attempts.{key}.state"), &a.state))?;
        // The job was cancelled while this attempt was live: by a person, then, if it was `unknown`.
        let cancelled_with_job =
            cancelled_at.filter(|_| state == AttemptState::Cancelled && a.state != state.as_str());
        let finished_at = cancelled_with_job.or(a.finished_at);
        // How it left `unknown`: as a write said; else, if it was `unknown`, by the job's cancel (a person) when
        // the job was cancelled — an answer it had after that lost to the cancel —, or by its answer, written by
        // the targeted completion.
        let was_unknown = a.went_unknown || a.state == AttemptState::Unknown.as_str();
        let cleared = match (a.cleared_by, a.cleared_at) {
            (Some(by), Some(at)) => Some(Cleared {
                by: ClearedBy::parse(&by)
                    .ok_or_else(|| bad(&format!("attempts.{key}.cleared_by"), &by))?,
                at,
            }),
            _ if was_unknown => match (cancelled_at, a.state.as_str(), finished_at) {
                (Some(at), _, _) => Some(Cleared {
                    by: ClearedBy::Person,
                    at,
                }),
                (None, ANSWERED, Some(at)) => Some(Cleared {
                    by: ClearedBy::LateAnswer,
                    at,
                }),
                _ => None,
            },
            _ => None,
        };
        attempts.push(Attempt {
            number,
            provider: a.provider,
            state,
            seen_version: a.seen_version,
            lease_expires_at: a.lease_expires_at,
            created_at: a.created_at,
            dispatched_at: a.dispatched_at.unwrap_or(a.created_at),
            not_before: a.not_before,
            retry_of: a.retry_of,
            started_at: a.started_at,
            finished_at,
            error: a.error,
            report: a.report,
            origin: a.origin,
            writer: a.writer,
            request: a.request,
            cancelled_by: a.cancelled_by,
            cleared,
            call_id: a.call_id,
        });
    }
    attempts.sort_by_key(|a| a.number);
    let (result, cancelled_by) = match slot {
        Some(slot) => (slot.result, slot.token.filter(|_| cancelled_at.is_some())),
        None => (None, None),
    };
    let job = Job {
        id,
        owner: stored.owner,
        idempotency_key: stored.idempotency_key,
        fingerprint: stored.fingerprint,
        contract: stored.contract,
        input: stored.input.map_or(Value::Null, |packed| packed.0),
        providers: stored.providers,
        version: u64::from(slot_at.is_some()),
        completed_by,
        result,
        // A job that has its result has no error (a late winner after a failure leaves the old one behind).
        error: stored.error.filter(|_| completed_by.is_none()),
        interventions: stored.interventions.unwrap_or_default(),
        cancelled_at,
        cancelled_by,
        attempts,
        created_at: stored.created_at,
        updated_at: slot_at.map_or(updated_at, |at| at.max(updated_at)),
        expires_at: stored.expires_at,
    };
    Ok(Decoded {
        job,
        rev: stored.rev,
        sweep_at: stored.sweep_at,
        input_apart,
    })
}

/// The state attempt `number` reads as, from its stored state and the slot.
fn read_state(
    stored: &str,
    number: u32,
    completed_by: Option<u32>,
    cancelled_at: Option<Timestamp>,
) -> Option<AttemptState> {
    if stored == ANSWERED {
        return Some(if completed_by == Some(number) {
            AttemptState::Succeeded
        } else {
            AttemptState::Discarded
        });
    }
    let state = AttemptState::parse(stored)?;
    Some(if cancelled_at.is_some() && state.is_live() {
        AttemptState::Cancelled
    } else {
        state
    })
}

/// Reads an item as `T`, naming the attribute that does not read.
pub(super) fn read<T: DeserializeOwned>(item: &Item) -> Result<T, StoreError> {
    let value = serde_dynamo::AttributeValue::M(serde_dynamo::Item::from(item.clone()).into());
    serde_path_to_error::deserialize(serde_dynamo::Deserializer::from_attribute_value(value))
        .map_err(|e| {
            let pk = item.get("pk").and_then(|v| v.as_s().ok());
            corrupt(
                pk.map_or("?", String::as_str),
                &e.path().to_string(),
                e.inner(),
            )
        })
}

fn corrupt(pk: &str, attribute: &str, detail: &dyn std::fmt::Display) -> StoreError {
    DynamoError::Corrupt(pk.to_owned(), format!("{attribute}: {detail}")).into()
}

/// The sort key of the `by_owner` index: newest first when read backwards.
pub(super) fn created_key(created_at_ms: i64, id: &JobId) -> String {
    format!("{created_at_ms:013}#{id}")
}
