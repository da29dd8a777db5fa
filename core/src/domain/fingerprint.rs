//! The fingerprint of an intent: SHA-256 of the RFC 8785 (JCS) canonical JSON of
//! `{"contract", "input", "providers"}` as the client sent them.
//!
//! Canonical JSON sorts object keys by their UTF-16 code units, drops insignificant white space and writes numbers
//! the way ECMAScript does (`1.0` and `1` are both `1`), so two spellings of one intent share a fingerprint.
//! `providers` absent and `providers: null` are the same intent; an explicit chain is not the same as the default
//! chain, even when it names the same providers, because the client said something different.

use std::fmt;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::ids::ParseError;

/// 32 bytes of SHA-256, shown as 64 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a create request's intent. `contract` is the text the client sent.
    pub fn of_intent(contract: &str, input: &Value, providers: Option<&Value>) -> Self {
        let intent = json!({
            "contract": contract,
            "input": input,
            "providers": providers.unwrap_or(&Value::Null),
        });
        Self::of_value(&intent)
    }

    /// SHA-256 of the canonical form of any JSON value.
    pub fn of_value(value: &Value) -> Self {
        Self(Sha256::digest(canonical_json(value)).into())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(raw, &mut bytes)
            .map_err(|_| ParseError(format!("not a fingerprint: {raw:?}")))?;
        if raw.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(ParseError(format!("not a fingerprint: {raw:?}")));
        }
        Ok(Self(bytes))
    }
}

/// RFC 8785 canonical JSON text of a value.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    // Serialising a `serde_json::Value` cannot fail: every key is a string and every number is finite.
    serde_json_canonicalizer::to_vec(value).expect("a JSON value always canonicalises")
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canon(text: &str) -> String {
        String::from_utf8(canonical_json(&serde_json::from_str(text).unwrap())).unwrap()
    }

    /// RFC 8785 §3.2.2 and Appendix B examples.
    #[test]
    fn rfc_8785_examples() {
        assert_eq!(
            canon(
                r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                      "literals": [null, true, false]}"#
            ),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        // §3.2.3: keys sort by UTF-16 code units, not by UTF-8 bytes or code points.
        assert_eq!(
            canon(
                r#"{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
                      "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}"#
            ),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
        for (number, expected) in [
            ("0", "0"),
            ("-0", "0"),
            ("1.0", "1"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("9007199254740992", "9007199254740992"),
            ("0.1", "0.1"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ] {
            assert_eq!(canon(number), expected, "{number}");
        }
    }

    #[test]
    fn one_intent_spelt_two_ways_has_one_fingerprint() {
        let a: Value =
            serde_json::from_str(r#"{"text": "hi", "n": 1, "opts": {"a": true, "b": [1, 2]}}"#)
                .unwrap();
        let b: Value = serde_json::from_str(
            r#"{ "opts": {"b": [1.0, 2e0], "a": true}, "n": 1.0, "text": "hi" }"#,
        )
        .unwrap();
        assert_eq!(
            Fingerprint::of_intent("summarize@1", &a, None),
            Fingerprint::of_intent("summarize@1", &b, Some(&Value::Null))
        );
        assert_ne!(
            Fingerprint::of_intent("summarize@1", &a, None),
            Fingerprint::of_intent("summarize@1", &a, Some(&json!(["demo"])))
        );
        assert_ne!(
            Fingerprint::of_intent("summarize@1", &a, None),
            Fingerprint::of_intent("summarize@2", &a, None)
        );
    }

    #[test]
    fn fingerprints_print_and_parse_as_hex() {
        let f = Fingerprint::of_value(&json!({"a": 1}));
        assert_eq!(Fingerprint::parse(&f.to_string()).unwrap(), f);
        assert!(Fingerprint::parse("abc").is_err());
        assert!(Fingerprint::parse(&f.to_string().to_uppercase()).is_err());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                prop::collection::btree_map("\\PC{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Writes a value with object keys in reverse order and integers as floats where that is exact.
    fn respell(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let fields: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(k, v)| format!("{} : {}", Value::from(k.as_str()), respell(v)))
                    .collect();
                format!("{{ {} }}", fields.join(" , "))
            }
            Value::Array(items) => {
                format!(
                    "[{}]",
                    items.iter().map(respell).collect::<Vec<_>>().join(", ")
                )
            }
            Value::Number(n) if n.is_i64() => format!("{}.0", n),
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn reordering_keys_and_respelling_numbers_keeps_the_fingerprint(value in arb_json()) {
            let respelt: Value = serde_json::from_str(&respell(&value)).unwrap();
            prop_assert_eq!(Fingerprint::of_value(&value), Fingerprint::of_value(&respelt));
        }

        #[test]
        fn different_values_have_different_fingerprints(a in arb_json(), b in arb_json()) {
            let same_value = canonical_json(&a) == canonical_json(&b);
            prop_assert_eq!(Fingerprint::of_value(&a) == Fingerprint::of_value(&b), same_value);
        }
    }
}
