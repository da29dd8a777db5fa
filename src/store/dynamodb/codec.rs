//! How values are kept in the table's attributes: JSON text (`json_text`), JSON text deflated when that is shorter
//! ([`Packed`]), a fingerprint as its bytes; each reads back the older forms items written before still hold.

use std::io::Write;

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The shortest JSON text worth deflating: below it, deflate's own overhead leaves little or nothing to save.
const PACK_FROM: usize = 256;

/// A JSON value as the table keeps it: its text (`S`), or that text deflated (`B`) when it is at least
/// [`PACK_FROM`] bytes long and deflate makes it shorter. Prose takes about half its bytes deflated, so an input of
/// prose costs fewer write units on every write of the item that holds it (see `capacity`); one that does not
/// shrink (already compressed, random) stays text. Either form reads back, so items written before inputs were
/// deflated still read.
#[derive(Debug)]
pub(super) struct Packed(pub(super) Value);

impl Packed {
    fn deflated(text: &str) -> Option<Vec<u8>> {
        if text.len() < PACK_FROM {
            return None;
        }
        let mut encoder =
            DeflateEncoder::new(Vec::with_capacity(text.len() / 2), Compression::default());
        encoder
            .write_all(text.as_bytes())
            .and_then(|()| encoder.finish())
            .ok()
            .filter(|bytes| bytes.len() < text.len())
    }
}

impl Serialize for Packed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = self.0.to_string();
        match Self::deflated(&text) {
            Some(bytes) => s.serialize_bytes(&bytes),
            None => s.serialize_str(&text),
        }
    }
}

impl<'de> Deserialize<'de> for Packed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        text_or_bytes(
            d,
            "JSON text, or JSON text deflated",
            |text| serde_json::from_str(text).map_err(|e| e.to_string()),
            |bytes| serde_json::from_reader(DeflateDecoder::new(bytes)).map_err(|e| e.to_string()),
        )
        .map(Packed)
    }
}

/// A fingerprint as the table keeps it: its 32 bytes (`B`), half the length of its hex text, which items written
/// before still hold and which still reads.
pub(super) mod fingerprint_bytes {
    use serde::{Deserializer, Serializer};

    use crate::domain::Fingerprint;

    pub(crate) fn serialize<S: Serializer>(
        fingerprint: &Fingerprint,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(fingerprint.as_bytes())
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Fingerprint, D::Error> {
        super::text_or_bytes(
            d,
            "a fingerprint: 32 bytes, or 64 hex digits",
            |text| Fingerprint::parse(text).map_err(|e| e.to_string()),
            |bytes| {
                <[u8; 32]>::try_from(bytes)
                    .map(Fingerprint::from_bytes)
                    .map_err(|_| format!("{} bytes, not 32", bytes.len()))
            },
        )
    }
}

/// Reads an attribute that may be kept as text (`S`) or as bytes (`B`), with a reader for each form.
fn text_or_bytes<'de, D: serde::Deserializer<'de>, T>(
    d: D,
    expecting: &'static str,
    text: impl FnOnce(&str) -> Result<T, String>,
    bytes: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<T, D::Error> {
    struct Either<F, G>(&'static str, F, G);
    impl<T, F: FnOnce(&str) -> Result<T, String>, G: FnOnce(&[u8]) -> Result<T, String>>
        serde::de::Visitor<'_> for Either<F, G>
    {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(self.0)
        }
        fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<T, E> {
            (self.1)(value).map_err(E::custom)
        }
        fn visit_bytes<E: serde::de::Error>(self, value: &[u8]) -> Result<T, E> {
            (self.2)(value).map_err(E::custom)
        }
    }
    d.deserialize_any(Either(expecting, text, bytes))
}

/// A value kept as JSON text (an `S`), as the input, results, errors and reports are.
pub(super) mod json_text {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<T: Serialize, S: Serializer>(
        value: &T,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&serde_json::to_string(value).map_err(S::Error::custom)?)
    }

    pub(crate) fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<T, D::Error> {
        serde_json::from_str(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// An optional [`json_text`] value (absent when `None`).
pub(super) mod json_text_option {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<T: Serialize, S: Serializer>(
        value: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => super::json_text::serialize(value, s),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| serde_json::from_str(&text))
            .transpose()
            .map_err(D::Error::custom)
    }
}
