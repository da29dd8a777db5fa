//! The canonical-JSON fingerprint: equal JSON values have equal fingerprints (the canonical form is a fixed point:
//! re-reading it gives the same fingerprint, however the input was spelled); unequal values have unequal ones.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onejob_core::domain::Fingerprint;
use onejob_core::domain::fingerprint::canonical_json;
use serde_json::{Value, json};

fuzz_target!(|bytes: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else {
        return;
    };
    let canonical = canonical_json(&value);
    let again: Value = serde_json::from_slice(&canonical).expect("canonical JSON is JSON");
    assert_eq!(canonical_json(&again), canonical, "canonicalisation is idempotent");
    let fingerprint = Fingerprint::of_value(&value);
    assert_eq!(Fingerprint::of_value(&again), fingerprint, "equal values, equal fingerprints");
    // Pretty-printed, the same value is the same intent.
    let pretty: Value = serde_json::from_str(&serde_json::to_string_pretty(&value).unwrap()).unwrap();
    assert_eq!(Fingerprint::of_value(&pretty), fingerprint);
    // A different value is a different intent.
    for other in [json!([value.clone()]), json!({"v": value.clone()}), json!([value.clone(), null])] {
        assert_ne!(Fingerprint::of_value(&other), fingerprint);
    }
});
