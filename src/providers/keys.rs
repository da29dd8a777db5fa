//! Provider API keys. On AWS they live in one Secrets Manager secret — a JSON object, key name → key
//! (`{"OPENAI_API_KEY": "sk-…"}`) — read when a function starts (`ONEJOB_SECRET_ARN`), and again before the next
//! call after a provider refused a key (at most every five minutes), so that a rotated secret needs no redeploy;
//! anywhere else, or for a
//! name the secret does not hold, in the environment variable of that name, read at each call so that a rotated
//! variable needs no restart. A provider's `api_key_env` is the name.
//!
//! A key is a [`Secret`]: it prints as `[redacted]`, and the messages onejob writes of a call — its error, a check's
//! message quoting the answer, the model id it reported — are scrubbed of it before they reach an attempt, a log line
//! or an event. An answer itself is never altered (a provider's answer is kept whole, or discarded whole), and a key
//! shorter than [`Secret::MIN_SCRUBBED`] is a placeholder, not a secret: nothing is scrubbed of it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

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

    /// The shortest key that is scrubbed: shorter ones are the placeholders local servers document (`ollama`,
    /// `lm-studio`, `token-abc123`, `sk-no-key-required`), words an answer may well hold; real keys are longer.
    pub const MIN_SCRUBBED: usize = 20;

    /// `text` (a message onejob writes) with every occurrence of this key replaced by `[redacted]`, if the key is
    /// long enough to be a secret.
    pub fn scrub(&self, text: &str) -> String {
        if self.0.len() < Self::MIN_SCRUBBED {
            text.to_owned()
        } else {
            text.replace(&self.0, "[redacted]")
        }
    }
}

/// How often at most the secret is read again after a provider refused a key.
pub const REREAD_EVERY: Duration = Duration::from_secs(300);
/// How long a read of the secret may take before a call goes out with the key it has.
const REREAD_TIMEOUT: Duration = Duration::from_secs(2);

/// The keys a secret held, by name, shared by every provider of a process. After a provider refused a key (401,
/// 403) the next call reads the secret again first — at most every [`REREAD_EVERY`] — so that a rotated secret is
/// picked up without a redeploy. With them, the AWS settings that Bedrock providers sign their calls with (a
/// function's execution role): the credentials a provider needs, whatever their kind.
#[derive(Clone, Default)]
pub struct ProviderKeys {
    ring: Arc<Ring>,
    aws: Option<aws_config::SdkConfig>,
}

#[derive(Default)]
struct Ring {
    keys: RwLock<BTreeMap<String, Secret>>,
    /// Where they were read from, to read them again.
    secret: Option<(aws_sdk_secretsmanager::Client, String)>,
    /// A provider refused a key since the secret was last read.
    stale: AtomicBool,
    /// When the secret was last read again (not the first read: a key rotated a minute after start is read at once).
    reread_at: Mutex<Option<Instant>>,
}

impl fmt::Debug for ProviderKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
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
        let keys = parse(arn, text)?;
        Ok(Self::held(Ring {
            keys: RwLock::new(keys),
            ..Ring::default()
        }))
    }

    /// Reads the secret `arn` from AWS Secrets Manager, and again (with `client`) after a provider refused a key.
    pub async fn from_secrets_manager(
        client: &aws_sdk_secretsmanager::Client,
        arn: &str,
    ) -> Result<Self, KeysError> {
        let keys = read(client, arn).await?;
        Ok(Self::held(Ring {
            keys: RwLock::new(keys),
            secret: Some((client.clone(), arn.to_owned())),
            ..Ring::default()
        }))
    }

    fn held(ring: Ring) -> Self {
        Self {
            ring: Arc::new(ring),
            aws: None,
        }
    }

    /// These keys, and `aws` for the providers that sign with AWS credentials (Bedrock).
    pub fn with_aws(self, aws: aws_config::SdkConfig) -> Self {
        Self {
            aws: Some(aws),
            ..self
        }
    }

    /// The AWS settings Bedrock providers sign with, if the process has them.
    pub fn aws(&self) -> Option<&aws_config::SdkConfig> {
        self.aws.as_ref()
    }

    /// Where the key named `name` comes from: this secret if it holds it, else the environment.
    pub fn source(&self, name: Option<&str>) -> KeySource {
        KeySource {
            keys: self.clone(),
            name: name.map(str::to_owned),
        }
    }

    /// The names the secret holds.
    pub fn names(&self) -> Vec<String> {
        self.ring
            .keys
            .read()
            .expect("keys lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Reads the secret again if a provider refused a key since it was last read, and it was not read again for
    /// [`REREAD_EVERY`]. A read that fails or takes too long keeps the keys as they were.
    async fn refresh(&self) {
        let ring = &self.ring;
        let Some((client, arn)) = &ring.secret else {
            return;
        };
        if !ring.stale.load(Ordering::Acquire) {
            return;
        }
        {
            let mut reread_at = ring.reread_at.lock().expect("keys lock");
            if reread_at.is_some_and(|at| at.elapsed() < REREAD_EVERY) {
                return;
            }
            *reread_at = Some(Instant::now());
            ring.stale.store(false, Ordering::Release);
        }
        match tokio::time::timeout(REREAD_TIMEOUT, read(client, arn)).await {
            Ok(Ok(keys)) => {
                tracing::info!(secret = %arn, names = ?keys.keys().collect::<Vec<_>>(), "provider keys read again after a key was refused");
                *ring.keys.write().expect("keys lock") = keys;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::telemetry::error_chain(&e), "provider keys not read again")
            }
            Err(_) => {
                tracing::warn!(secret = %arn, "provider keys not read again: the secret took too long")
            }
        }
    }
}

/// The keys of a secret's text.
fn parse(arn: &str, text: &str) -> Result<BTreeMap<String, Secret>, KeysError> {
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
        .collect()
}

/// The keys the secret `arn` holds now.
async fn read(
    client: &aws_sdk_secretsmanager::Client,
    arn: &str,
) -> Result<BTreeMap<String, Secret>, KeysError> {
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
    parse(arn, text)
}

/// Where one provider's key comes from.
#[derive(Debug, Clone)]
pub struct KeySource {
    keys: ProviderKeys,
    /// The key's name: the secret's member, else the environment variable (read at each call).
    name: Option<String>,
}

impl KeySource {
    /// The key now, if there is one.
    pub fn current(&self) -> Option<Secret> {
        let name = self.name.as_deref()?;
        let stored = self
            .keys
            .ring
            .keys
            .read()
            .expect("keys lock")
            .get(name)
            .cloned();
        stored.or_else(|| std::env::var(name).ok().map(Secret::new))
    }

    /// The key for a call about to go out: [`current`](Self::current), after reading the secret again if a
    /// provider refused a key since.
    pub async fn for_call(&self) -> Option<Secret> {
        self.keys.refresh().await;
        self.current()
    }

    /// A provider refused the key (401, 403): the next call reads the secret again first.
    pub fn refused(&self) {
        self.keys.ring.stale.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_shows_and_is_scrubbed_from_text() {
        let key = Secret::new("sk-live-1234567890abcdef");
        assert_eq!(format!("{key:?}"), "[redacted]");
        assert_eq!(
            key.scrub("HTTP 401: bad key sk-live-1234567890abcdef (sk-live-1234567890abcdef)"),
            "HTTP 401: bad key [redacted] ([redacted])"
        );
        // A placeholder is no secret: what mentions it is left as it is.
        for placeholder in ["k", "ollama", "sk-no-key-required"] {
            let text = format!("served by {placeholder}");
            assert_eq!(Secret::new(placeholder).scrub(&text), text);
        }
        let keys =
            ProviderKeys::from_json("arn", r#"{"OPENAI_API_KEY": "sk-live-1234567890abcdef"}"#)
                .unwrap();
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
