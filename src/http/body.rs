//! Reading what a request carries, in the order a client should learn about its mistakes: the Idempotency-Key
//! header, the content type, the size, the nesting depth, then the JSON itself and its shape.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;
use crate::domain::IdempotencyKey;

/// Arrays and objects nested deeper than this are refused before parsing.
pub const MAX_JSON_DEPTH: usize = 64;

pub fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let raw = headers
        .get("idempotency-key")
        .ok_or(ApiError::MissingIdempotencyKey)?;
    let text = raw.to_str().map_err(|_| {
        ApiError::InvalidIdempotencyKey(
            "the Idempotency-Key may hold only visible ASCII characters (0x21-0x7E)".into(),
        )
    })?;
    IdempotencyKey::parse(text).map_err(|e| ApiError::InvalidIdempotencyKey(e.to_string()))
}

/// The body as a JSON value, if it is declared as JSON, fits `limit` bytes and nests at most
/// [`MAX_JSON_DEPTH`] levels.
pub async fn json_value(headers: &HeaderMap, body: Body, limit: usize) -> Result<Value, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    let bytes = Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<LengthLimitError>() {
                ApiError::BodyTooLarge { limit }
            } else {
                ApiError::MalformedJson(format!("the body could not be read: {e}"))
            }
        })?
        .to_bytes();
    json_from_bytes(&bytes)
}

/// JSON text as a value, refused if it nests deeper than [`MAX_JSON_DEPTH`] levels (checked before parsing, so a
/// hostile body never reaches the parser's recursion).
pub fn json_from_bytes(bytes: &[u8]) -> Result<Value, ApiError> {
    if nesting_depth(bytes) > MAX_JSON_DEPTH {
        return Err(ApiError::JsonTooDeep {
            limit: MAX_JSON_DEPTH,
        });
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::MalformedJson(e.to_string()))
}

/// Reads a JSON value into a request type; unknown fields, missing fields and wrong types answer 422.
pub fn shaped<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| ApiError::InvalidRequest(e.to_string()))
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(content_type) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The deepest nesting of arrays and objects in JSON text, brackets inside strings not counted. Malformed text
/// gets some number back; the parser that runs next reports what is wrong with it.
fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn depth_ignores_brackets_in_strings() {
        assert_eq!(nesting_depth(br#"{"a": "[[[{{{", "b": [1, [2]]}"#), 3);
        assert_eq!(nesting_depth(br#"{"a": "\"[[["}"#), 1);
        assert_eq!(nesting_depth(b"1"), 0);
    }

    #[test]
    fn json_content_types() {
        for (value, ok) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/merge-patch+json", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
            ("text/json+xml", false),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
            assert_eq!(is_json(&headers), ok, "{value}");
        }
        assert!(!is_json(&HeaderMap::new()));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            "[\\[\\]{}\"\\\\a]{0,6}".prop_map(Value::from)
        ];
        leaf.prop_recursive(8, 64, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[\\[{a\"]{0,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn depth_of(value: &Value) -> usize {
        match value {
            Value::Array(items) => 1 + items.iter().map(depth_of).max().unwrap_or(0),
            Value::Object(map) => 1 + map.values().map(depth_of).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest! {
        #[test]
        fn the_scanner_agrees_with_the_parsed_depth(value in arb_json()) {
            prop_assert_eq!(nesting_depth(value.to_string().as_bytes()), depth_of(&value));
        }
    }
}
