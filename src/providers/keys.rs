//! Provider API keys. On AWS they live in one Secrets Manager secret — a JSON object, key name → key
//! (`{"OPENAI_API_KEY": "sk-…"}`) — read once when a function starts (`ONEJOB_SECRET_ARN`); anywhere else, or for a
//! name the secret does not hold, in the environment variable of that name, read at each call so that a rotated
//! variable needs no restart. A provider's `api_key_env` is the name.
//!
//! A key is a [`Secret`]: it prints as `[redacted]`, and whatever a provider sends back is scrubbed of it before it
//! reaches an error message, an attempt's report or a log line.

use std::collections::BTreeMap;
use std::fmt;

/// One API key. Its `Debug` never shows it; the only way to the text is [`Secret::expose`], for the request.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Secret {
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The key itself, to put in a request header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of this key replaced by `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_owned()
        } else {
            text.replace(&self.0, "[redacted]")
        }
    }

    /// `value` with this key scrubbed from every string in it, names and values: an answer that echoes the key
    /// must not carry it into a result, a check's message quoting the answer, or a log line.
    pub fn scrub_value(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        if self.0.is_empty() {
            return;
        }
        match value {
            Value::String(text) if text.contains(&self.0) => *text = self.scrub(text),
            Value::Array(items) => items.iter_mut().for_each(|item| self.scrub_value(item)),
            Value::Object(members) if members.keys().any(|k| k.contains(&self.0)) => {
                *members = std::mem::take(members)
                    .into_iter()
                    .map(|(name, mut member)| {
                        self.scrub_value(&mut member);
                        (self.scrub(&name), member)
                    })
                    .collect();
            }
            Value::Object(members) => members.values_mut().for_each(|m| self.scrub_value(m)),
            _ => {}
        }
    }
}

/// The keys a secret held, by name.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ProviderKeys(BTreeMap<String, Secret>);

impl fmt::Debug for ProviderKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Why the keys could not be had. Never carries a key.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error(
        "the secret {arn} is not a JSON object of key names to keys (e.g. {{\"OPENAI_API_KEY\": \"...\"}})"
    )]
    Shape { arn: String },
    #[error("cannot read the secret {arn}")]
    Read {
        arn: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ProviderKeys {
    /// The keys of a secret's text: a JSON object whose values are strings.
    pub fn from_json(arn: &str, text: &str) -> Result<Self, KeysError> {
        let shape = || KeysError::Shape {
            arn: arn.to_owned(),
        };
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|_| shape())?;
        object
            .into_iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(key) => Ok((name, Secret::new(key))),
                _ => Err(shape()),
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Reads the secret `arn` from AWS Secrets Manager.
    pub async fn from_secrets_manager(
        client: &aws_sdk_secretsmanager::Client,
        arn: &str,
    ) -> Result<Self, KeysError> {
        let value = client
            .get_secret_value()
            .secret_id(arn)
            .send()
            .await
            .map_err(|e| KeysError::Read {
                arn: arn.to_owned(),
                source: Box::new(e.into_service_error()),
            })?;
        let text = value.secret_string().ok_or_else(|| KeysError::Shape {
            arn: arn.to_owned(),
        })?;
        Self::from_json(arn, text)
    }

    /// Where the key named `name` comes from: this secret if it holds it, else the environment.
    pub fn source(&self, name: Option<&str>) -> KeySource {
        KeySource {
            stored: name.and_then(|n| self.0.get(n)).cloned(),
            env: name.map(str::to_owned),
        }
    }

    /// The names the secret holds.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

/// Where one provider's key comes from.
#[derive(Debug, Clone, Default)]
pub struct KeySource {
    /// Read from the secret at start-up.
    stored: Option<Secret>,
    /// Else this environment variable, read at each call.
    env: Option<String>,
}

impl KeySource {
    /// The key now, if there is one.
    pub fn current(&self) -> Option<Secret> {
        self.stored.clone().or_else(|| {
            self.env
                .as_deref()
                .and_then(|var| std::env::var(var).ok())
                .map(Secret::new)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows_and_is_scrubbed_from_text() {
        let key = Secret::new("sk-live-123");
        assert_eq!(format!("{key:?}"), "[redacted]");
        assert_eq!(
            key.scrub("HTTP 401: bad key sk-live-123 (sk-live-123)"),
            "HTTP 401: bad key [redacted] ([redacted])"
        );
        let keys = ProviderKeys::from_json("arn", r#"{"OPENAI_API_KEY": "sk-live-123"}"#).unwrap();
        assert!(!format!("{keys:?}").contains("sk-live"));
        assert_eq!(
            keys.source(Some("OPENAI_API_KEY")).current(),
            Some(key.clone())
        );
        assert_eq!(keys.source(None).current(), None);
    }

    #[test]
    fn a_secret_of_another_shape_is_refused_without_showing_it() {
        for text in [r#"["sk-live-123"]"#, r#"{"A": 1}"#, "sk-live-123"] {
            let err = ProviderKeys::from_json("arn:x", text).unwrap_err();
            assert!(!err.to_string().contains("sk-live"), "{err}");
        }
    }
}
