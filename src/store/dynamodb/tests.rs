//! The item encoding on its own: every attempt state survives a write and a read, and an item that does not read
//! names its attribute instead of being defaulted.

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{Value, json};

use super::item::{decode_input, decode_item, encode, encode_input};
use crate::domain::fixtures::{at, by, job, nowhere};
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
        AttemptState::Unknown => job.mark_unknown(1, None, &by(2)).unwrap(),
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
    let garbled = unreadable(|item| {
        item.insert("input".into(), AttributeValue::B(vec![7; 300].into()));
    });
    assert!(garbled.contains("input"), "{garbled}");
    let short = unreadable(|item| {
        item.insert("fingerprint".into(), AttributeValue::B(vec![7; 5].into()));
    });
    assert!(
        short.contains("fingerprint") && short.contains("5 bytes"),
        "{short}"
    );
}

/// Prose (this project's own design decisions) as an input whose JSON text is about `bytes` long.
fn prose(bytes: usize) -> Value {
    let docs = include_str!("../../../docs/decisions.md");
    let end = (0..=bytes.min(docs.len()))
        .rev()
        .find(|at| docs.is_char_boundary(*at))
        .unwrap();
    json!({ "text": &docs[..end] })
}

#[test]
fn an_input_is_kept_deflated_when_that_is_shorter_and_reads_back_either_way() {
    let mut inline = job();
    inline.input = prose(1000);
    let text = inline.input.to_string();
    let item = encode(&inline, 1);
    let Some(AttributeValue::B(bytes)) = item.get("input") else {
        panic!("prose is kept deflated: {:?}", item.get("input"))
    };
    assert!(
        bytes.as_ref().len() * 3 < text.len() * 2,
        "{} of {}",
        bytes.as_ref().len(),
        text.len()
    );
    assert_eq!(decode_item(&item).unwrap().job, inline);
    // An item written before inputs were deflated, fingerprints kept as bytes and times equal to the creation
    // time left out.
    let created = AttributeValue::N(inline.created_at.timestamp_millis().to_string());
    assert!(!item.contains_key("updated_at"));
    assert_eq!(
        item.get("fingerprint"),
        Some(&AttributeValue::B(
            inline.fingerprint.as_bytes().to_vec().into()
        ))
    );
    let mut before = item.clone();
    before.insert("input".into(), AttributeValue::S(text));
    before.insert(
        "fingerprint".into(),
        AttributeValue::S(inline.fingerprint.to_string()),
    );
    before.insert("updated_at".into(), created.clone());
    let Some(AttributeValue::M(attempts)) = before.get_mut("attempts") else {
        panic!("attempts is a map")
    };
    let Some(AttributeValue::M(first)) = attempts.get_mut("1") else {
        panic!("an attempt is a map")
    };
    assert!(!first.contains_key("dispatched_at"));
    first.insert("dispatched_at".into(), created);
    assert_eq!(decode_item(&before).unwrap().job, inline);

    let short = job();
    assert_eq!(
        encode(&short, 1).get("input"),
        Some(&AttributeValue::S(short.input.to_string()))
    );

    let mut apart = job();
    apart.input = prose(16 * 1024);
    assert!(!encode(&apart, 1).contains_key("input"));
    let own = encode_input(&apart).unwrap();
    assert!(
        matches!(own.get("input"), Some(AttributeValue::B(_))),
        "{own:?}"
    );
    assert_eq!(decode_input(&own).unwrap().1, apart.input);
    let mut before = own.clone();
    before.insert("input".into(), AttributeValue::S(apart.input.to_string()));
    assert_eq!(decode_input(&before).unwrap().1, apart.input);
}

/// The sizing rules on the store's own items: a small job's create puts the item and both (keys-only) index
/// entries, its claim moves the sweep entry (a delete and a put) and leaves the owner's alone, its completion takes
/// the sweep entry away; a 16 KiB input of prose, kept deflated in an item of its own, is paid once, by the create,
/// at about half the units its text would cost (17).
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
    big.input = prose(16 * 1024);
    let mut big_claimed = big.clone();
    big_claimed.claim(1, at(30_000), &by(1)).unwrap();
    let create = write_units(None, &big);
    assert!((4..=9).contains(&create.table), "{create:?}");
    assert_eq!(write_units(Some(&big), &big_claimed), small(1, 0, 2));
}
