//! The item encoding on its own: every attempt state survives a write and a read, and an item that does not read
//! names its attribute instead of being defaulted.

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::json;

use super::item::{decode_item, encode};
use crate::domain::tests::{at, by, job, nowhere};
use crate::domain::{AttemptState, CallReport, ErrorInfo, Job};
use crate::store::StoreError;

/// A job whose attempt 1 ends in `state`, reached by the domain's own transitions.
fn job_with_attempt(state: AttemptState) -> Job {
    let mut job = job();
    let report = CallReport {
        model: Some("m-1".into()),
        ..CallReport::default()
    };
    if state != AttemptState::Queued && state != AttemptState::Cancelled {
        job.claim(1, at(30_000), &by(1)).unwrap();
    }
    match state {
        AttemptState::Queued | AttemptState::Started => {}
        AttemptState::Unknown => job.mark_unknown(1, &by(2)).unwrap(),
        AttemptState::Failed => job
            .fail(
                1,
                ErrorInfo::new("provider_error", "500"),
                report,
                &nowhere(),
                &by(2),
            )
            .unwrap(),
        AttemptState::Cancelled => {
            job.cancel_attempt(1, &nowhere(), &by(2)).unwrap();
        }
        AttemptState::Succeeded => {
            job.complete(1, json!({"summary": "s"}), report, &by(2))
                .unwrap();
        }
        AttemptState::Discarded => {
            job.cancel(&by(2)).unwrap();
            job.complete(1, json!({"summary": "late"}), report, &by(3))
                .unwrap();
        }
    }
    assert_eq!(job.attempt(1).unwrap().state, state);
    job
}

#[test]
fn every_attempt_state_reads_back_as_it_was_written() {
    for state in [
        AttemptState::Queued,
        AttemptState::Started,
        AttemptState::Unknown,
        AttemptState::Failed,
        AttemptState::Cancelled,
        AttemptState::Succeeded,
        AttemptState::Discarded,
    ] {
        let job = job_with_attempt(state);
        assert_eq!(decode_item(&encode(&job, 3)).unwrap().job, job, "{state:?}");
    }
}

fn unreadable(mut change: impl FnMut(&mut super::Item)) -> String {
    let mut item = encode(&job_with_attempt(AttemptState::Started), 1);
    change(&mut item);
    match decode_item(&item).map(|d| d.job) {
        Err(e @ StoreError::Backend(_)) => crate::telemetry::error_chain(&e),
        other => panic!("an unreadable item read as {other:?}"),
    }
}

#[test]
fn an_unreadable_attribute_is_named_not_defaulted() {
    let bad_time = unreadable(|item| {
        item.insert("updated_at".into(), AttributeValue::S("yesterday".into()));
    });
    assert!(bad_time.contains("updated_at"), "{bad_time}");
    let out_of_range = unreadable(|item| {
        item.insert("expires_at".into(), AttributeValue::N("1e40".into()));
    });
    assert!(out_of_range.contains("expires_at"), "{out_of_range}");
    let nested = unreadable(|item| {
        let AttributeValue::M(attempts) = item.get_mut("attempts").unwrap() else {
            panic!("attempts is a map")
        };
        let AttributeValue::M(first) = attempts.get_mut("1").unwrap() else {
            panic!("an attempt is a map")
        };
        first.remove("created_at");
    });
    assert!(
        nested.contains("attempts.1") && nested.contains("created_at"),
        "{nested}"
    );
    let state = unreadable(|item| {
        let AttributeValue::M(attempts) = item.get_mut("attempts").unwrap() else {
            panic!("attempts is a map")
        };
        let AttributeValue::M(first) = attempts.get_mut("1").unwrap() else {
            panic!("an attempt is a map")
        };
        first.insert("state".into(), AttributeValue::S("sleeping".into()));
    });
    assert!(state.contains("attempts.1.state"), "{state}");
}

/// The sizing rules on the store's own items: a small job's create puts the item and both (keys-only) index
/// entries, its claim moves the sweep entry (a delete and a put) and leaves the owner's alone, its completion takes
/// the sweep entry away; a 64 KiB input, kept in an item of its own, is paid once, by the create.
#[test]
fn write_units_follow_the_sizing_rules() {
    use super::{WriteUnits, write_units};
    let new = job();
    let mut claimed = new.clone();
    claimed.claim(1, at(30_000), &by(1)).unwrap();
    let mut done = claimed.clone();
    done.complete(1, json!({"summary": "s"}), CallReport::default(), &by(2))
        .unwrap();
    let small = |table, by_owner, sweep| WriteUnits {
        table,
        by_owner,
        sweep,
    };
    assert_eq!(write_units(None, &new), small(1, 1, 1));
    assert_eq!(write_units(Some(&new), &claimed), small(1, 0, 2));
    assert_eq!(write_units(Some(&claimed), &done), small(1, 0, 1));

    let mut big = job();
    big.input = json!({"text": "x".repeat(64 * 1024)});
    let mut big_claimed = big.clone();
    big_claimed.claim(1, at(30_000), &by(1)).unwrap();
    let create = write_units(None, &big);
    assert!(create.table >= 66, "{create:?}");
    assert_eq!(write_units(Some(&big), &big_claimed), small(1, 0, 2));
}
