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
pub struct Key(pub IdempotencyKey);

impl<S: Send + Sync> FromRequestParts<S> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        idempotency_key(&parts.headers).map(Key)
    }
}

/// The request's `Idempotency-Key`, if it sent one (a manual attempt, a cancel): the same request sent again under
/// it acts once.
#[derive(Debug, Clone)]
pub struct MaybeKey(pub Option<IdempotencyKey>);

impl<S: Send + Sync> FromRequestParts<S> for MaybeKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        optional_idempotency_key(&parts.headers).map(MaybeKey)
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
fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    optional_idempotency_key(headers)?.ok_or(ApiError::MissingIdempotencyKey)
}

/// The request's `Idempotency-Key`, if it sent one: a Structured Field string as the IETF draft writes it
/// (`"order-42"`), or the bare key clients already send (`order-42`) — the same key either way. Sent twice, it is
/// refused: two keys name two intents, or one said twice, and a proxy may keep either.
fn optional_idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
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

    }
}
