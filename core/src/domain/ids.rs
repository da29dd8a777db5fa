//! Identifiers that cross the edge: each is a newtype with a private field and a `parse` constructor, so no
//! unvalidated value exists past the HTTP layer, the config loader or the store adapters.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::time::Timestamp;

/// Why a value was refused at the edge. The message is meant for the client, as a problem's `detail`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

macro_rules! string_newtype {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::parse(&raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_newtype!(
    /// The client-chosen `Idempotency-Key`: 1–255 visible ASCII characters (0x21–0x7E). Scoped to an owner.
    IdempotencyKey
);

impl IdempotencyKey {
    /// The longest key accepted, in characters (= bytes, since only ASCII is allowed).
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        if raw.is_empty() {
            return Err(ParseError("the Idempotency-Key is empty".into()));
        }
        if raw.len() > Self::MAX_LEN {
            return Err(ParseError(format!(
                "the Idempotency-Key has {} characters; at most {} are allowed",
                raw.len(),
                Self::MAX_LEN
            )));
        }
        if let Some(bad) = raw.chars().find(|c| !matches!(c, '\x21'..='\x7e')) {
            return Err(ParseError(format!(
                "the Idempotency-Key may hold only visible ASCII characters (0x21-0x7E); found {bad:?}"
            )));
        }
        Ok(Self(raw.to_owned()))
    }
}

string_newtype!(
    /// The authenticated principal. Comes from the credential, never from a request body.
    Owner
);

impl Owner {
    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        if raw.is_empty() || raw.len() > 255 || raw.chars().any(char::is_control) {
            return Err(ParseError(format!(
                "an owner is 1-255 characters without control characters; got {raw:?}"
            )));
        }
        Ok(Self(raw.to_owned()))
    }
}

string_newtype!(
    /// A configured provider's name: 1–64 of `[a-z0-9_-]`.
    ProviderName
);

impl ProviderName {
    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        if is_slug(raw, 64) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(ParseError(format!(
                "a provider name is 1-64 characters of a-z, 0-9, '-' and '_'; got {raw:?}"
            )))
        }
    }
}

fn is_slug(raw: &str, max: usize) -> bool {
    !raw.is_empty()
        && raw.len() <= max
        && raw
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A named, versioned job kind: `summarize@1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContractRef {
    name: String,
    version: u32,
}

impl ContractRef {
    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        let refuse = || {
            ParseError(format!(
                "a contract is written name@version, e.g. summarize@1; got {raw:?}"
            ))
        };
        let (name, version) = raw.split_once('@').ok_or_else(refuse)?;
        let version_ok = !version.is_empty()
            && version.len() <= 9
            && version.bytes().all(|b| b.is_ascii_digit())
            && !version.starts_with('0');
        if !is_slug(name, 64) || !version_ok {
            return Err(refuse());
        }
        Ok(Self {
            name: name.to_owned(),
            version: version.parse().map_err(|_| refuse())?,
        })
    }

    pub fn new(name: &str, version: u32) -> Result<Self, ParseError> {
        Self::parse(&format!("{name}@{version}"))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn version(&self) -> u32 {
        self.version
    }
}

impl fmt::Display for ContractRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.version)
    }
}

impl Serialize for ContractRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ContractRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

string_newtype!(
    /// A job's id: `job_`, 32 lowercase hex digits derived from (owner, idempotency key), then `_` and the job's
    /// creation time in milliseconds, base 36.
    ///
    /// The hex part names the intent: every store keys the job by it, so that the key's uniqueness and the job's
    /// existence are one thing, and idempotency keys (which clients may fill with meaningful text) stay out of URLs.
    /// The suffix names the incarnation: once a job has expired and its key is used again, the new job has a new
    /// id, so an old id never finds the new job and provider idempotency keys (`<job id>:<attempt>`) never repeat.
    /// Ids made before incarnations existed have no suffix; they still parse.
    JobId
);

impl JobId {
    const PREFIX: &'static str = "job_";
    /// `job_` and 32 hex digits.
    const INTENT_LEN: usize = 36;

    /// The id of the job that (owner, key) names, created at `created_at`. Length-prefixed, so no two pairs share
    /// an input.
    pub fn derive(owner: &Owner, key: &IdempotencyKey, created_at: Timestamp) -> Self {
        Self::incarnation(&Self::intent_of(owner, key), created_at.timestamp_millis())
    }

    /// The intent part (see [`JobId::intent`]) of every job (owner, key) names, whenever it was created.
    pub fn intent_of(owner: &Owner, key: &IdempotencyKey) -> String {
        let mut hash = Sha256::new();
        hash.update((owner.as_str().len() as u64).to_be_bytes());
        hash.update(owner.as_str());
        hash.update(key.as_str());
        format!("{}{}", Self::PREFIX, hex::encode(&hash.finalize()[..16]))
    }

    /// The id of the job of `intent` (an [`JobId::intent`]) created at `created_at_ms`.
    pub fn incarnation(intent: &str, created_at_ms: i64) -> Self {
        Self(format!("{intent}_{}", base36(created_at_ms.max(0) as u64)))
    }

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        let refuse = || ParseError(format!("not a job id: {raw:?}"));
        let hex_part = raw.strip_prefix(Self::PREFIX).ok_or_else(refuse)?;
        let (hex_part, suffix) = match hex_part.split_once('_') {
            Some((hex_part, suffix)) => (hex_part, Some(suffix)),
            None => (hex_part, None),
        };
        let hex_ok = hex_part.len() == 32
            && hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let suffix_ok = suffix.is_none_or(|s| {
            (1..=13).contains(&s.len())
                && (s == "0" || !s.starts_with('0'))
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        });
        if hex_ok && suffix_ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(refuse())
        }
    }

    /// The part that names the intent, (owner, key): `job_` and 32 hex digits. Stores key jobs by it.
    pub fn intent(&self) -> &str {
        &self.0[..Self::INTENT_LEN]
    }

    /// The creation time the id carries, in milliseconds; `None` for an id from before incarnations.
    pub fn created_at_ms(&self) -> Option<i64> {
        let suffix = self.0.get(Self::INTENT_LEN + 1..)?;
        i64::from_str_radix(suffix, 36).ok()
    }
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII digits")
}

string_newtype!(
    /// A token of one writer's intent, carried by every write that may be repeated (invariant 11): a write that
    /// finds its own token already applied is a success, never another writer's. 32 lowercase hex digits.
    ///
    /// A worker step makes one for its claim and the writes that follow it; the engine makes one per API call and
    /// keeps it across its own retries; a redelivered message or a client's new request has a new one — unless the
    /// request carries an `Idempotency-Key` ([`WriteToken::for_request`]): then its token is the request's.
    WriteToken
);

impl WriteToken {
    /// A fresh random token.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4().simple().to_string())
    }

    /// The token of a caller's write to job `job` sent under `key` (invariant 17): its first half names the intent
    /// — the owner, the job, whose keys they are (`scope`: empty for the owner, the operator's name for an
    /// operator's, whose keys are its own) and the key — and its second half what was asked (`request`: the write
    /// and its body). The same request sent again carries the same token, so it finds its own write and acts once;
    /// another request under the same key shares the first half only ([`WriteToken::same_intent`]): a conflict.
    pub fn for_request(
        owner: &Owner,
        job: &JobId,
        scope: &str,
        key: &IdempotencyKey,
        request: &str,
    ) -> Self {
        use sha2::{Digest, Sha256};
        let mut intent = Sha256::new()
            .chain_update(owner.as_str())
            .chain_update(b"\0")
            .chain_update(job.as_str())
            .chain_update(b"\0");
        // An owner's tokens are as they always were: stored ones are still found.
        if !scope.is_empty() {
            intent = intent.chain_update(scope).chain_update(b"\0");
        }
        let intent = intent.chain_update(key.as_str()).finalize();
        let asked = Sha256::digest(request.as_bytes());
        Self(format!(
            "{}{}",
            hex::encode(&intent[..8]),
            hex::encode(&asked[..8])
        ))
    }

    /// Whether `other` was made for the same intent as this token (the same owner, job and key), whatever it asked.
    pub fn same_intent(&self, other: &WriteToken) -> bool {
        self.0[..16] == other.0[..16]
    }

    pub fn parse(raw: &str) -> Result<Self, ParseError> {
        if raw.len() == 32
            && raw
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(Self(raw.to_owned()))
        } else {
            Err(ParseError(format!("not a write token: {raw:?}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keys_at_the_bounds() {
        assert!(IdempotencyKey::parse("a").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(256)).is_err());
        assert!(IdempotencyKey::parse("").is_err());
        assert!(IdempotencyKey::parse("has space").is_err());
        assert!(IdempotencyKey::parse("tab\there").is_err());
        assert!(IdempotencyKey::parse("clé").is_err());
        assert!(IdempotencyKey::parse("~!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}").is_ok());
    }

    #[test]
    fn contract_refs() {
        let c = ContractRef::parse("summarize@1").unwrap();
        assert_eq!((c.name(), c.version()), ("summarize", 1));
        assert_eq!(c.to_string(), "summarize@1");
        for bad in [
            "summarize",
            "summarize@",
            "@1",
            "summarize@01",
            "Sum@1",
            "a@1@2",
            "a@-1",
            "a@x",
        ] {
            assert!(ContractRef::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn job_ids_are_scoped_to_the_owner() {
        let key = IdempotencyKey::parse("k1").unwrap();
        let alice = JobId::derive(&Owner::parse("alice").unwrap(), &key, at(0));
        let bob = JobId::derive(&Owner::parse("bob").unwrap(), &key, at(0));
        assert_ne!(alice, bob);
        assert_eq!(JobId::parse(alice.as_str()).unwrap(), alice);
        // The length prefix keeps ("ab", "c") and ("a", "bc") apart.
        let ab_c = JobId::derive(
            &Owner::parse("ab").unwrap(),
            &IdempotencyKey::parse("c").unwrap(),
            at(0),
        );
        let a_bc = JobId::derive(
            &Owner::parse("a").unwrap(),
            &IdempotencyKey::parse("bc").unwrap(),
            at(0),
        );
        assert_ne!(ab_c, a_bc);
    }

    #[test]
    fn each_incarnation_of_an_intent_has_its_own_id() {
        let (owner, key) = (
            Owner::parse("alice").unwrap(),
            IdempotencyKey::parse("k").unwrap(),
        );
        let first = JobId::derive(&owner, &key, at(1_800_000_000_123));
        let second = JobId::derive(&owner, &key, at(1_802_592_000_123));
        assert_ne!(first, second);
        assert_eq!(first.intent(), second.intent());
        assert_eq!(first.created_at_ms(), Some(1_800_000_000_123));
        assert_eq!(JobId::parse(first.as_str()).unwrap(), first);
        let legacy = JobId::parse(first.intent()).unwrap();
        assert_eq!(
            (legacy.intent(), legacy.created_at_ms()),
            (first.intent(), None)
        );
        assert_eq!(JobId::incarnation(first.intent(), 1_800_000_000_123), first);
    }

    fn at(ms: i64) -> Timestamp {
        chrono::TimeZone::timestamp_millis_opt(&chrono::Utc, ms).unwrap()
    }

    proptest! {
        #[test]
        fn a_key_parses_exactly_when_it_is_1_to_255_visible_ascii(raw in "\\PC{0,300}") {
            let valid = (1..=255).contains(&raw.len()) && raw.bytes().all(|b| (0x21..=0x7e).contains(&b));
            prop_assert_eq!(IdempotencyKey::parse(&raw).is_ok(), valid);
        }

        #[test]
        fn every_visible_ascii_key_round_trips(raw in "[\\x21-\\x7e]{1,255}") {
            let key = IdempotencyKey::parse(&raw).unwrap();
            prop_assert_eq!(key.as_str(), raw.as_str());
        }

        #[test]
        fn job_ids_parse_only_in_their_own_format(raw in "\\PC{0,40}") {
            let id = JobId::parse(&raw);
            let hex = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
            let valid = raw.len() == 36 && raw.starts_with("job_") && hex(&raw[4..]);
            prop_assert!(!valid || id.is_ok());
            if id.is_ok() {
                prop_assert!(raw.starts_with("job_") && hex(&raw[4..36]));
            }
        }

        #[test]
        fn derived_ids_parse_and_carry_their_time(ms in 0i64..4_102_444_800_000, key in "[!-~]{1,20}") {
            let id = JobId::derive(&Owner::parse("o").unwrap(), &IdempotencyKey::parse(&key).unwrap(), at(ms));
            prop_assert_eq!(JobId::parse(id.as_str()).unwrap(), id.clone());
            prop_assert_eq!(id.created_at_ms(), Some(ms));
        }
    }
}
