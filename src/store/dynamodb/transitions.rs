//! The transitions DynamoDB makes in one conditional `UpdateItem`, each its update built with its condition. The
//! others (an added attempt, a failure, a cancelled attempt: each chooses what follows among the job's attempts)
//! are read, applied by the domain and written back whole.

use super::item::{ANSWERED, Slot, json_attribute};
use super::update::{AttemptUpdate, Sweep};
use super::{n, s};
use crate::domain::{AttemptState, CallReport, ClearedBy, JobId, Stamp, Timestamp};
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

/// A `queued` attempt of a job without an outcome whose time has come: past its `not_before`, or none (when the
/// condition fails, the domain says why).
const QUEUED_AND_DUE: &str = "#attempts.#n.#state = :queued AND attribute_not_exists(slot) \
     AND (attribute_not_exists(#attempts.#n.not_before) OR #attempts.#n.not_before <= :now)";

fn queued_and_due(number: u32, stamp: &Stamp) -> AttemptUpdate {
    let mut u = AttemptUpdate::new(number, stamp);
    u.condition(QUEUED_AND_DUE);
    u.value(":queued", s(AttemptState::Queued.as_str()));
    u
}

/// `queued` → `started` with a lease, and the job's sweep entry at the lease's end.
pub(super) fn claim(
    id: &JobId,
    number: u32,
    lease_expires_at: Timestamp,
    stamp: &Stamp,
) -> AttemptUpdate {
    let mut u = queued_and_due(number, stamp);
    u.set("#attempts.#n.#state = :started");
    u.value(":started", s(AttemptState::Started.as_str()));
    u.set("#attempts.#n.seen_version = :zero");
    u.set("#attempts.#n.started_at = :now");
    u.set("#attempts.#n.lease_expires_at = :lease");
    u.value(":lease", n(lease_expires_at.timestamp_millis()));
    u.sweep(Sweep::Started, id, lease_expires_at);
    u
}

/// `started` → `unknown` in a job without an outcome: the job now needs a person, and its sweep entry says so
/// (the operators' view). An orphan of a job that has its result is written in full (it needs nobody).
pub(super) fn mark_unknown(
    id: &JobId,
    number: u32,
    call_id: Option<&str>,
    stamp: &Stamp,
) -> AttemptUpdate {
    let mut u = AttemptUpdate::new(number, stamp);
    u.condition("#attempts.#n.#state = :started AND attribute_not_exists(slot)");
    u.value(":started", s(AttemptState::Started.as_str()));
    u.set("#attempts.#n.#state = :unknown");
    u.value(":unknown", s(AttemptState::Unknown.as_str()));
    // Kept once it moves on: its answer, written in one targeted update, then reads as cleared by it.
    u.set("#attempts.#n.went_unknown = :went");
    u.value(":went", AttributeValue::Bool(true));
    if let Some(call_id) = call_id {
        u.set("#attempts.#n.call_id = :call");
        u.value(":call", s(call_id));
    }
    u.sweep(Sweep::Unknown, id, stamp.now);
    u
}

/// A claimed attempt's answer, the compare-and-swap on the slot in the same write.
pub(super) fn complete(
    number: u32,
    result: &Value,
    report: &CallReport,
    stamp: &Stamp,
) -> AttemptUpdate {
    let mut u = AttemptUpdate::new(number, stamp);
    // A claimed attempt that is still live: no other attempt is, so the job's sweep entry is this attempt's own.
    // An `unknown` one reads as cleared by its late answer (`went_unknown`, [`mark_unknown`]); an answer found by a
    // lookup says so, and wins only an open slot here. Any other case (an attempt cancelled meanwhile, never
    // claimed, or this write landed before) is decided by the domain on the item the failed condition returns.
    if stamp.by_lookup {
        u.condition(
            "#attempts.#n.#state = :unknown AND attribute_not_exists(slot) AND attribute_exists(#attempts.#n.seen_version)",
        );
        u.set("#attempts.#n.cleared_by = :lookup");
        u.value(":lookup", s(ClearedBy::Lookup.as_str()));
        u.set("#attempts.#n.cleared_at = :now");
    } else {
        u.condition(
            "attribute_exists(#attempts.#n.seen_version) AND #attempts.#n.#state IN (:started, :unknown)",
        );
        u.value(":started", s(AttemptState::Started.as_str()));
    }
    u.value(":unknown", s(AttemptState::Unknown.as_str()));
    // The compare-and-swap: the slot is taken only if it is free; a loser leaves it as it was.
    u.set("slot = if_not_exists(slot, :mine)");
    u.value(":mine", Slot::result(number, result.clone(), stamp.now));
    u.set("#attempts.#n.#state = :answered");
    u.value(":answered", s(ANSWERED));
    u.set("#attempts.#n.finished_at = :now");
    if let Some(report) = report.clone().into_option() {
        u.set("#attempts.#n.report = :report");
        u.value(":report", json_attribute(&report));
    }
    u.remove("sweep_pk");
    u.remove("sweep_at");
    u.no_updated_at();
    u
}

/// A `queued` attempt handed to the queue again: its dispatch time, and the sweep entry's.
pub(super) fn redispatch(number: u32, stamp: &Stamp) -> AttemptUpdate {
    let mut u = queued_and_due(number, stamp);
    u.set("#attempts.#n.dispatched_at = :now");
    u.set("sweep_at = :now");
    u.no_updated_at();
    u.no_writer();
    u
}

/// The owner's job cancelled: the slot closed by attempt 0, if no result holds it.
pub(super) fn cancel_job(stamp: &Stamp) -> AttemptUpdate {
    let mut u = AttemptUpdate::new(0, stamp);
    u.condition("#owner = :owner AND attribute_not_exists(slot)");
    u.name("#owner", "owner");
    u.set("slot = :closed");
    u.value(":closed", Slot::cancelled(&stamp.token, stamp.now));
    u.remove("sweep_pk");
    u.remove("sweep_at");
    u.no_writer();
    u
}
