//! Reading what a request carries, in the order a client should learn about its mistakes: the Idempotency-Key
//! header, the content type, the size, the nesting depth, then the JSON itself and its shape.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::{self, DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::error::ApiError;
use crate::domain::IdempotencyKey;

/// Arrays and objects nested deeper than this are refused before parsing.
pub const MAX_JSON_DEPTH: usize = 64;

/// The request's `Idempotency-Key`; a create must send one.
pub fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    optional_idempotency_key(headers)?.ok_or(ApiError::MissingIdempotencyKey)
}

/// The request's `Idempotency-Key`, if it sent one: a Structured Field string as the IETF draft writes it
/// (`"order-42"`), or the bare key clients already send (`order-42`) — the same key either way. Sent twice, it is
/// refused: two keys name two intents, or one said twice, and a proxy may keep either.
pub fn optional_idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let mut sent = headers.get_all("idempotency-key").iter();
    let Some(raw) = sent.next() else {
        return Ok(None);
    };
    if sent.next().is_some() {
        return Err(ApiError::InvalidIdempotencyKey(
            "send exactly one Idempotency-Key header".into(),
        ));
    }
    let text = raw.to_str().map_err(|_| {
        ApiError::InvalidIdempotencyKey(
            "the Idempotency-Key may hold only visible ASCII characters (0x21-0x7E)".into(),
        )
    })?;
    let key = match text.strip_prefix('"') {
        Some(quoted) => structured_string(quoted)?,
        None => text.to_owned(),
    };
    IdempotencyKey::parse(&key)
        .map(Some)
        .map_err(|e| ApiError::InvalidIdempotencyKey(e.to_string()))
}

/// The text of a Structured Field string (RFC 8941 §3.3.3) after its opening quote: up to the closing quote, with
/// `\"` and `\\` unescaped. Nothing may follow it (no parameters).
fn structured_string(quoted: &str) -> Result<String, ApiError> {
    let refuse = |why: &str| {
        ApiError::InvalidIdempotencyKey(format!(
            "a quoted Idempotency-Key is a Structured Field string (\"…\"): {why}"
        ))
    };
    let mut text = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    loop {
        match chars.next() {
            None => return Err(refuse("it has no closing quote")),
            Some('"') => break,
            Some('\\') => match chars.next() {
                Some(escaped @ ('"' | '\\')) => text.push(escaped),
                _ => return Err(refuse("only \\\" and \\\\ may be escaped")),
            },
            Some(c) => text.push(c),
        }
    }
    if chars.next().is_some() {
        return Err(refuse("nothing may follow the closing quote"));
    }
    Ok(text)
}

/// The body as a JSON value, if it is declared as JSON, fits `limit` bytes and nests at most
/// [`MAX_JSON_DEPTH`] levels.
pub async fn json_value(headers: &HeaderMap, body: Body, limit: usize) -> Result<Value, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    json_from_bytes(&bytes(headers, body, limit).await?)
}

/// An optional JSON body: `None` when the body is empty (whatever its declared type), else as [`json_value`].
pub async fn optional_json_value(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Option<Value>, ApiError> {
    let bytes = bytes(headers, body, limit).await?;
    if bytes.is_empty() {
        return Ok(None);
    }
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    json_from_bytes(&bytes).map(Some)
}

/// The body's bytes, refused past `limit` (by its declared length before reading it, else as it is read).
async fn bytes(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::BodyTooLarge { limit });
    }
    Ok(Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<LengthLimitError>() {
                ApiError::BodyTooLarge { limit }
            } else {
                ApiError::MalformedJson(format!("the body could not be read: {e}"))
            }
        })?
        .to_bytes())
}

/// JSON text as a value, refused if it nests deeper than [`MAX_JSON_DEPTH`] levels (checked before parsing, so a
/// hostile body never reaches the parser's recursion) or if any object names a member twice (parsers disagree on
/// which one counts, so a proxy could read another intent than onejob does).
pub fn json_from_bytes(bytes: &[u8]) -> Result<Value, ApiError> {
    if nesting_depth(bytes) > MAX_JSON_DEPTH {
        return Err(ApiError::JsonTooDeep {
            limit: MAX_JSON_DEPTH,
        });
    }
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    let value = Strict::deserialize(&mut parser)
        .and_then(|Strict(value)| parser.end().map(|()| value))
        .map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    Ok(value)
}

/// A JSON value read with one rule more than `serde_json`'s: an object may not name a member twice.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = serde_json::Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(de::Error::custom(format!(
                    "the member {name:?} appears twice in one object"
                )));
            }
            let Strict(value) = map.next_value()?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

/// Reads a JSON object into a request type; another kind of value, unknown fields, missing fields and wrong types
/// answer 422. The object is checked first because serde also reads a struct from an array of its fields in order,
/// which no request body of the API is.
pub fn shaped<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    let kind = match &value {
        Value::Object(_) => {
            return serde_json::from_value(value)
                .map_err(|e| ApiError::InvalidRequest(e.to_string()));
        }
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    };
    Err(ApiError::InvalidRequest(format!(
        "the body must be a JSON object, not {kind}"
    )))
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
    fn a_member_named_twice_anywhere_is_refused() {
        for body in [
            r#"{"contract": "a@1", "contract": "b@1"}"#,
            r#"{"input": {"text": "x", "text": "y"}}"#,
            r#"[1, {"a": [{"k": 1, "k": 1}]}]"#,
        ] {
            let refused = json_from_bytes(body.as_bytes());
            assert!(
                matches!(refused, Err(ApiError::MalformedJson(_))),
                "{body}: {refused:?}"
            );
        }
        let fine =
            json_from_bytes(br#"{"a": {"k": 1}, "b": {"k": 1.5, "n": null}, "c": [true, "s"]}"#);
        assert_eq!(
            fine.unwrap(),
            serde_json::json!({"a": {"k": 1}, "b": {"k": 1.5, "n": null}, "c": [true, "s"]})
        );
        assert!(json_from_bytes(b"{} {}").is_err(), "trailing data");
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

    fn key_of(value: &str) -> Result<Option<IdempotencyKey>, ApiError> {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", value.parse().unwrap());
        optional_idempotency_key(&headers)
    }

    proptest! {
        /// A key sent as a Structured Field string (its quotes and backslashes escaped) is the bare key.
        #[test]
        fn a_quoted_key_is_the_bare_key(raw in "[!-~]{1,200}") {
            let quoted = format!("\"{}\"", raw.replace('\\', "\\\\").replace('"', "\\\""));
            let bare = IdempotencyKey::parse(&raw).unwrap();
            prop_assert_eq!(key_of(&quoted).unwrap(), Some(bare.clone()));
            if !raw.starts_with('"') {
                prop_assert_eq!(key_of(&raw).unwrap(), Some(bare));
            }
        }

        #[test]
        fn the_scanner_agrees_with_the_parsed_depth(value in arb_json()) {
            prop_assert_eq!(nesting_depth(value.to_string().as_bytes()), depth_of(&value));
        }

        #[test]
        fn the_strict_reader_reads_what_serde_json_writes(value in arb_json()) {
            prop_assert_eq!(json_from_bytes(value.to_string().as_bytes()).unwrap(), value);
        }
    }
}
