//! The strict JSON reader every request body goes through: nesting bounded before parsing (a hostile body never
//! reaches the parser's recursion), a member named twice in any object refused (parsers disagree on which one
//! counts, so a proxy could read another intent than onejob does), and shaping into a request type from an object
//! only (serde alone would read a struct from an array of its fields in order).

use serde::de::{self, DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Arrays and objects nested deeper than this are refused before parsing.
pub const MAX_JSON_DEPTH: usize = 64;

/// Why a body is not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    #[error("the JSON nests deeper than {limit} levels")]
    TooDeep { limit: usize },
    /// Not JSON, trailing text, or a member named twice.
    #[error("{0}")]
    Malformed(String),
    /// JSON, but not the request's shape: another kind of value than an object, unknown, missing or mistyped fields.
    #[error("{0}")]
    Shape(String),
}

/// JSON text as a value, refused if it nests deeper than [`MAX_JSON_DEPTH`] levels (checked before parsing, so a
/// hostile body never reaches the parser's recursion) or if any object names a member twice (parsers disagree on
/// which one counts, so a proxy could read another intent than onejob does).
pub fn read(bytes: &[u8]) -> Result<Value, JsonError> {
    if nesting_depth(bytes) > MAX_JSON_DEPTH {
        return Err(JsonError::TooDeep {
            limit: MAX_JSON_DEPTH,
        });
    }
    let mut parser = serde_json::Deserializer::from_slice(bytes);
    let value = Strict::deserialize(&mut parser)
        .and_then(|Strict(value)| parser.end().map(|()| value))
        .map_err(|e| JsonError::Malformed(e.to_string()))?;
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
pub fn shaped<T: DeserializeOwned>(value: Value) -> Result<T, JsonError> {
    let kind = match &value {
        Value::Object(_) => {
            return serde_json::from_value(value).map_err(|e| JsonError::Shape(e.to_string()));
        }
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    };
    Err(JsonError::Shape(format!(
        "the body must be a JSON object, not {kind}"
    )))
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
            let refused = read(body.as_bytes());
            assert!(
                matches!(refused, Err(JsonError::Malformed(_))),
                "{body}: {refused:?}"
            );
        }
        let fine = read(br#"{"a": {"k": 1}, "b": {"k": 1.5, "n": null}, "c": [true, "s"]}"#);
        assert_eq!(
            fine.unwrap(),
            serde_json::json!({"a": {"k": 1}, "b": {"k": 1.5, "n": null}, "c": [true, "s"]})
        );
        assert!(read(b"{} {}").is_err(), "trailing data");
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

        #[test]
        fn the_strict_reader_reads_what_serde_json_writes(value in arb_json()) {
            prop_assert_eq!(read(value.to_string().as_bytes()).unwrap(), value);
        }
    }
}
