//! Request body parsing for `POST /v1/jobs`: any bytes give a value or a typed refusal (never a panic, never a
//! stack overflow); what is accepted nests at most 64 levels and is what serde_json reads; what serde_json reads but
//! is refused names a member twice; shaping it into a create request refuses unknown fields and anything but an
//! object (serde alone would read the request from an array of its fields in order).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onejob_core::json::{JsonError, MAX_JSON_DEPTH, read, shaped};
use onejob_core::requests::CreateJobRequest;

fuzz_target!(|bytes: &[u8]| {
    match read(bytes) {
        Ok(value) => {
            assert_eq!(serde_json::from_slice::<serde_json::Value>(bytes).unwrap(), value);
            if let Ok(request) = shaped::<CreateJobRequest>(value.clone()) {
                let object = value.as_object().expect("a create request is an object");
                assert!(object.keys().all(|k| ["contract", "input", "providers"].contains(&k.as_str())));
                assert_eq!(object["contract"].as_str(), Some(request.contract.as_str()));
            }
        }
        Err(JsonError::TooDeep { limit }) => assert_eq!(limit, MAX_JSON_DEPTH),
        Err(JsonError::Malformed(message)) => {
            assert!(
                serde_json::from_slice::<serde_json::Value>(bytes).is_err()
                    || message.contains("appears twice"),
                "{message}"
            );
        }
        Err(other) => panic!("unexpected refusal: {other:?}"),
    }
});
