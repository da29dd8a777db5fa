//! The idempotency key parser: never panics; what it accepts it keeps exactly, accepts again, and maps to one job
//! id that is itself a valid id; an owner and a key never share a job id with another (owner, key) split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onejob_core::domain::{IdempotencyKey, JobId, Owner};

fuzz_target!(|raw: &str| {
    let Ok(key) = IdempotencyKey::parse(raw) else {
        return;
    };
    assert_eq!(key.as_str(), raw);
    assert_eq!(IdempotencyKey::parse(key.as_str()).unwrap(), key);
    let alice = Owner::parse("alice").unwrap();
    let at = chrono::DateTime::from_timestamp_millis(1_800_000_000_000).unwrap();
    let id = JobId::derive(&alice, &key, at);
    assert_eq!(JobId::parse(id.as_str()).unwrap(), id);
    assert_eq!(JobId::derive(&alice, &key, at), id);
    // Moving characters between owner and key must not land on the same id (the derivation is length-prefixed).
    if let (Ok(owner), Ok(shorter)) = (
        Owner::parse(&format!("alice{}", &raw[..raw.chars().next().map_or(0, char::len_utf8)])),
        IdempotencyKey::parse(&raw[raw.chars().next().map_or(0, char::len_utf8)..]),
    ) {
        assert_ne!(JobId::derive(&owner, &shorter, at), id);
    }
});
