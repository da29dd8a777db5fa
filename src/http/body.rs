//! What a request carries, read by axum extractors in the order a client should learn about its mistakes (axum runs
//! a handler's header extractors before its body's): the credential (`auth`), the `Idempotency-Key` header
//! ([`Key`], [`MaybeKey`]), then the body ([`StrictJson`], [`MaybeJson`]) — its content type, its size, its
//! nesting depth, the JSON itself and its shape, through the core's strict reader (`json`). Each rejection is the
//! problem its rule names.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use crate::domain::IdempotencyKey;
use crate::json::{read, shaped};

/// The request's `Idempotency-Key`, which it must send (a create).
#[derive(Debug, Clone)]
pub struct Key(pub SentKey);

impl<S: Send + Sync> FromRequestParts<S> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        idempotency_key(&parts.headers).map(Key)
    }
}

/// An `Idempotency-Key` as it was sent: the key, and — for a quoted key read as a Structured Field string — the
/// literal text with its quotes, the key of any job made under it before quoted keys were read so (such a job is
/// still found by it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentKey {
    pub key: IdempotencyKey,
    pub literal: Option<IdempotencyKey>,
}

impl SentKey {
    /// `text` as a key: a Structured Field string as the IETF draft writes it (`"order-42"`) is its content, the same
    /// key as the bare `order-42` clients send — when it parses as one and its content is a key; any other text is
    /// the key as it stands (`"abc`, `"a"b"` are keys of their own).
    pub fn read(text: &str) -> Result<Self, String> {
        let structured = (text.strip_prefix('"'))
            .and_then(structured_string)
            .and_then(|content| IdempotencyKey::parse(&content).ok());
        match structured {
            Some(key) => Ok(Self {
                key,
                literal: IdempotencyKey::parse(text).ok(),
            }),
            None => Ok(Self {
                key: IdempotencyKey::parse(text).map_err(|e| e.to_string())?,
                literal: None,
            }),
        }
    }
}

/// The request's `Idempotency-Key`, if it sent one (a manual attempt, a cancel): the same request sent again under
/// it acts once. (Keys of these requests are kept on the job only since quoted keys were read as Structured
/// Fields: there is no earlier literal form to look for.)
#[derive(Debug, Clone)]
pub struct MaybeKey(pub Option<IdempotencyKey>);

impl<S: Send + Sync> FromRequestParts<S> for MaybeKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        optional_idempotency_key(&parts.headers).map(|sent| MaybeKey(sent.map(|s| s.key)))
    }
}

/// A JSON body, shaped into `T`: declared as JSON (415), within the body limit (413), nested at most
/// `json::MAX_JSON_DEPTH` levels and no member named twice (400), an object of `T`'s fields (422).
#[derive(Debug)]
pub struct StrictJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for StrictJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        let value = json_value(&parts.headers, body, state.body_limit).await?;
        Ok(StrictJson(shaped(value)?))
    }
}

/// An optional JSON body: an empty one (whatever its declared type) is `T`'s default, any other as
/// [`StrictJson`].
#[derive(Debug)]
pub struct MaybeJson<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for MaybeJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = request.into_parts();
        let bytes = bytes(&parts.headers, body, state.body_limit).await?;
        if bytes.is_empty() {
            return Ok(MaybeJson(T::default()));
        }
        if !is_json(&parts.headers) {
            return Err(ApiError::UnsupportedMediaType);
        }
        Ok(MaybeJson(shaped(read(&bytes)?)?))
    }
}

/// The request's `Idempotency-Key`; a create must send one.
fn idempotency_key(headers: &HeaderMap) -> Result<SentKey, ApiError> {
    optional_idempotency_key(headers)?.ok_or(ApiError::MissingIdempotencyKey)
}

/// The request's `Idempotency-Key`, if it sent one, read as [`SentKey::read`] says. Sent twice, it is refused: two
/// keys name two intents, or one said twice, and a proxy may keep either.
fn optional_idempotency_key(headers: &HeaderMap) -> Result<Option<SentKey>, ApiError> {
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
    SentKey::read(text)
        .map(Some)
        .map_err(ApiError::InvalidIdempotencyKey)
}

/// The text of a Structured Field string (RFC 8941 §3.3.3) after its opening quote: up to the closing quote, with
/// `\"` and `\\` unescaped, and nothing after it (no parameters); `None` when it is no such string.
fn structured_string(quoted: &str) -> Option<String> {
    let mut text = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    loop {
        match chars.next()? {
            '"' => break,
            '\\' => match chars.next()? {
                escaped @ ('"' | '\\') => text.push(escaped),
                _ => return None,
            },
            c => text.push(c),
        }
    }
    chars.next().is_none().then_some(text)
}

/// The body as a JSON value, if it is declared as JSON, fits `limit` bytes and is read by the strict reader.
async fn json_value(headers: &HeaderMap, body: Body, limit: usize) -> Result<Value, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    Ok(read(&bytes(headers, body, limit).await?)?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn key_of(value: &str) -> Result<Option<IdempotencyKey>, ApiError> {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", value.parse().unwrap());
        optional_idempotency_key(&headers).map(|sent| sent.map(|s| s.key))
    }

    #[test]
    fn text_that_is_no_structured_string_is_a_key_as_it_stands() {
        for raw in [r#""abc"#, r#""a"b""#, r#""a\x""#, r#""""#, "a\"b"] {
            let sent = SentKey::read(raw).unwrap();
            assert_eq!(sent.key.as_str(), raw);
            assert_eq!(sent.literal, None);
        }
        // A quoted key keeps its literal text: a job made under it before quoted keys were read so is found by it.
        let sent = SentKey::read(r#""order-42""#).unwrap();
        assert_eq!(sent.key.as_str(), "order-42");
        assert_eq!(sent.literal.unwrap().as_str(), r#""order-42""#);
        assert!(SentKey::read("a b").is_err());
        assert!(SentKey::read(r#""a b""#).is_err());
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

        /// Any key of visible ASCII is accepted: as its content when it is a Structured Field string, else as it
        /// stands.
        #[test]
        fn every_visible_key_is_accepted(raw in "\"?[!-~]{0,200}") {
            prop_assume!(!raw.is_empty());
            prop_assert!(key_of(&raw).is_ok());
        }
    }
}
