//! One `[providers.NAME]` table of `onejob.toml`: what a provider is, by `kind`, and how long to wait for it. Each
//! kind takes only its own keys (serde refuses the others, and a missing `base_url` or `model`), so a settings value
//! is always whole.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::ProviderEndpoint;
use super::kinds::ProviderKind;
use super::kinds::demo::{DemoBehavior, DemoSettings};
use crate::domain::RetryLimits;

/// A provider's settings: what it is, by `kind`, and the limits every kind has. In `onejob.toml` one flat table.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    pub limits: ProviderLimits,
}

/// The limits every kind of provider takes.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderLimits {
    /// The model's context window in tokens: the prompt plus the contract's output budget must fit in it. A remote
    /// provider that names none has 8192 (set it to your model's); a demo provider, no limit.
    pub context_window: Option<u64>,
    /// Without an answer after this long, the attempt becomes `unknown`.
    pub timeout_ms: u64,
    /// After the timeout, how much longer the worker keeps listening for a late answer.
    pub late_result_ms: u64,
    /// Retries of this provider in a row after answers that say the work was not done, in place of the
    /// deployment's `provider_retries` (a contract may lower it).
    pub retries: Option<u32>,
    /// How long after the first try a retry may still start, in place of `provider_retry_within_ms`.
    pub retry_within_ms: Option<u64>,
    /// The most calls in flight to this provider at once, across every worker and function: beyond it an attempt
    /// waits, queued, without a try (a burst queues instead of earning 429s). None: no cap.
    pub max_in_flight: Option<u32>,
    /// What clears an `unknown` attempt of a provider that cannot be asked about its calls (see
    /// [`super::Kind::can_be_asked`]): unset, a person (`hold`); set, the reconciler retries it this long after its
    /// time-out (and never while a worker may still hear its late answer), accepting a possible second paid call.
    pub unknown_retry_after_ms: Option<u64>,
    /// For a provider that can be asked: how long after a call started the provider's "no such call" is taken as
    /// the work not done (before, the call may still be running, or its record not yet written). Default 15
    /// minutes: past the longest a provider keeps a request running.
    pub lookup_absent_after_ms: u64,
}

impl ProviderLimits {
    /// The table keys that are limits; the others belong to the kind.
    const KEYS: [&str; 8] = [
        "context_window",
        "timeout_ms",
        "late_result_ms",
        "retries",
        "retry_within_ms",
        "max_in_flight",
        "unknown_retry_after_ms",
        "lookup_absent_after_ms",
    ];

    /// The default of `lookup_absent_after_ms`: 15 minutes.
    pub const LOOKUP_ABSENT_AFTER_MS: u64 = 900_000;
}

impl Default for ProviderLimits {
    fn default() -> Self {
        Self {
            context_window: None,
            timeout_ms: 30_000,
            late_result_ms: 60_000,
            retries: None,
            retry_within_ms: None,
            max_in_flight: None,
            unknown_retry_after_ms: None,
            lookup_absent_after_ms: Self::LOOKUP_ABSENT_AFTER_MS,
        }
    }
}

/// One table, split: the limits to [`ProviderLimits`], the rest (with `kind`) to the kind's own settings. Each part
/// refuses a key it does not know, so a key of another kind is refused.
impl<'de> Deserialize<'de> for ProviderConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut table = Map::<String, Value>::deserialize(deserializer)?;
        let limits: Map<String, Value> = ProviderLimits::KEYS
            .iter()
            .filter_map(|key| table.remove_entry(*key))
            .collect();
        let limits =
            ProviderLimits::deserialize(Value::Object(limits)).map_err(D::Error::custom)?;
        let kind = ProviderKind::deserialize(Value::Object(table)).map_err(D::Error::custom)?;
        Ok(Self { kind, limits })
    }
}

impl ProviderConfig {
    /// A demo provider with the given behaviour and delay, and default limits.
    pub fn demo(behavior: DemoBehavior, delay_ms: u64) -> Self {
        let kind = ProviderKind::Demo(DemoSettings { behavior, delay_ms });
        Self::of(kind)
    }

    /// A provider of this kind with default limits.
    pub fn of(kind: ProviderKind) -> Self {
        let limits = ProviderLimits::default();
        Self { kind, limits }
    }

    /// The `kind` key.
    pub fn kind(&self) -> &'static str {
        self.kind.kind().name()
    }

    /// The endpoint of an HTTP provider.
    pub fn endpoint(&self) -> Option<&ProviderEndpoint> {
        self.kind.kind().endpoint()
    }

    /// The model it is configured with (a demo provider has none).
    pub fn model(&self) -> Option<&str> {
        self.kind.kind().model()
    }

    /// Where its calls go, for operators: an HTTP provider's base URL, a Bedrock provider's region.
    pub fn address(&self) -> Option<String> {
        self.kind.kind().address()
    }

    pub fn timeout_ms(&self) -> u64 {
        self.limits.timeout_ms
    }

    pub fn late_result_ms(&self) -> u64 {
        self.limits.late_result_ms
    }

    pub fn timeout(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.timeout_ms() as i64)
    }

    pub fn late_result(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.late_result_ms() as i64)
    }

    /// The context window in tokens, with the kind's default; `None` is unbounded.
    pub fn context_window(&self) -> Option<u64> {
        (self.limits.context_window).or_else(|| self.kind.kind().default_context_window())
    }

    /// Sets both timings, in milliseconds.
    pub fn with_timings(mut self, timeout_ms: u64, late_result_ms: u64) -> Self {
        (self.limits.timeout_ms, self.limits.late_result_ms) = (timeout_ms, late_result_ms);
        self
    }

    /// Its own retry limits.
    pub fn retry_limits(&self) -> RetryLimits {
        RetryLimits {
            retries: self.limits.retries,
            retry_within_ms: self.limits.retry_within_ms,
        }
    }

    /// The value checks serde cannot make: limits above zero, retry limits within bounds, request settings that
    /// fit the kind.
    pub fn check(&self) -> Result<(), String> {
        self.retry_limits().check()?;
        self.kind.kind().check()?;
        if self.timeout_ms() == 0 {
            return Err("timeout_ms must be above 0".into());
        }
        if self.context_window() == Some(0) {
            return Err("context_window must be above 0".into());
        }
        // A provider asked by the name it gave a call (a background response's id) cannot be asked about a call it
        // never named (its create's answer lost): the policy is for those.
        let kind = self.kind.kind();
        if self.limits.unknown_retry_after_ms.is_some()
            && kind.can_be_asked()
            && !kind.asked_by_call_name()
        {
            return Err(
                "unknown_retry_after_ms is for a provider that cannot be asked about its calls: this one is asked \
                 (store = true, or batch = true), and its unknown attempts clear by what it answers"
                    .into(),
            );
        }
        if self.limits.lookup_absent_after_ms
            < self.timeout_ms().saturating_add(self.late_result_ms())
        {
            return Err(
                "lookup_absent_after_ms must be at least timeout_ms + late_result_ms: until then the call may still \
                 be running, and its worker listening"
                    .into(),
            );
        }
        if self.limits.max_in_flight == Some(0) {
            return Err("max_in_flight of 0 lets no call through: leave it out for no cap".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(table: &str) -> Result<ProviderConfig, toml::de::Error> {
        toml::from_str(table)
    }

    #[test]
    fn every_kind_takes_every_limit_and_only_its_own_keys() {
        let limits = "context_window = 100\ntimeout_ms = 1\nlate_result_ms = 2\nretries = 3\nretry_within_ms = 4\n\
                      unknown_retry_after_ms = 5\nlookup_absent_after_ms = 6";
        let expected = ProviderLimits {
            context_window: Some(100),
            timeout_ms: 1,
            late_result_ms: 2,
            retries: Some(3),
            retry_within_ms: Some(4),
            max_in_flight: None,
            unknown_retry_after_ms: Some(5),
            lookup_absent_after_ms: 6,
        };
        for kind in [
            "kind = \"demo\"\nbehavior = \"fail\"",
            "kind = \"openai\"\nbase_url = \"http://x\"\nmodel = \"m\"",
            "kind = \"anthropic\"\nbase_url = \"http://x\"\nmodel = \"m\"",
            "kind = \"bedrock\"\nmodel = \"m\"\nregion = \"eu-west-1\"",
        ] {
            let config = parse(&format!("{kind}\n{limits}")).unwrap();
            assert_eq!(config.limits, expected, "{kind}");
            assert_eq!(parse(kind).unwrap().limits, ProviderLimits::default());
            let foreign = if kind.contains("demo") {
                "model = \"m\""
            } else {
                "delay_ms = 1"
            };
            let err = parse(&format!("{kind}\n{foreign}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("unknown field"), "{kind}: {err}");
        }
        let err = parse("kind = \"openai\"\nbase_url = \"http://x\"").unwrap_err();
        assert!(err.to_string().contains("missing field `model`"), "{err}");
        assert!(parse("kind = \"nope\"").is_err());
        assert!(
            parse("timeout_ms = 5")
                .unwrap_err()
                .to_string()
                .contains("kind")
        );
    }

    #[test]
    fn a_retry_policy_is_refused_where_every_unknown_can_be_asked_and_taken_for_calls_left_unnamed()
    {
        let openai =
            "kind = \"openai\"\nbase_url = \"http://x\"\nmodel = \"m\"\nunknown_retry_after_ms = 5";
        let checked = |extra: &str| parse(&format!("{openai}\n{extra}")).unwrap().check();
        assert_eq!(checked(""), Ok(()));
        for asked in ["store = true", "batch = true"] {
            let err = checked(asked).unwrap_err();
            assert!(err.contains("cannot be asked"), "{asked}: {err}");
        }
        // A background response is asked by its id: a create whose answer was lost left none, for the policy.
        assert_eq!(
            checked("api = \"responses\"\nstore = true\nbackground = true"),
            Ok(())
        );
    }
}
