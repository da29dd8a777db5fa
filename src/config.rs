//! `onejob.toml`: every key, its default, and where it is used. `onejob.example.toml` at the repository root shows
//! them all with comments. Without a config file the defaults below apply: two demo providers, the shipped
//! contracts, no tokens (dev tokens on loopback only).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::domain::{Owner, ProviderName};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Folder of `*.toml` job contracts, relative to the working directory.
    #[serde(default = "default_contracts_dir")]
    pub contracts_dir: PathBuf,
    /// Largest request body accepted, in bytes; larger ones answer 413.
    #[serde(default = "default_body_limit")]
    pub body_limit_bytes: usize,
    /// Bearer token → owner. `ONEJOB_TOKENS="tokenA=alice,tokenB=bob"` adds to (and overrides) these.
    #[serde(default)]
    pub tokens: BTreeMap<String, Owner>,
    /// The providers jobs may run on, by name.
    #[serde(default = "default_providers")]
    pub providers: BTreeMap<ProviderName, ProviderConfig>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Built in, in process, deterministic: for local runs and demos.
    Demo,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid onejob config")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("ONEJOB_TOKENS entry {0:?} is not token=owner with a valid owner")]
    Tokens(String),
}

fn default_contracts_dir() -> PathBuf {
    PathBuf::from("contracts")
}

fn default_body_limit() -> usize {
    256 * 1024
}

fn default_providers() -> BTreeMap<ProviderName, ProviderConfig> {
    ["demo", "demo-backup"]
        .into_iter()
        .map(|name| {
            (
                ProviderName::parse(name).expect("a valid built-in name"),
                ProviderConfig {
                    kind: ProviderKind::Demo,
                },
            )
        })
        .collect()
}

impl Default for Config {
    fn default() -> Self {
        Self {
            contracts_dir: default_contracts_dir(),
            body_limit_bytes: default_body_limit(),
            tokens: BTreeMap::new(),
            providers: default_providers(),
        }
    }
}

impl Config {
    /// Reads the file if one is named, else the defaults; then adds the tokens of `ONEJOB_TOKENS` if given.
    pub fn load(path: Option<&Path>, env_tokens: Option<&str>) -> Result<Self, ConfigError> {
        let mut config = match path {
            None => Self::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                toml::from_str(&text).map_err(|source| ConfigError::Parse {
                    path: path.to_owned(),
                    source: Box::new(source),
                })?
            }
        };
        for entry in env_tokens.unwrap_or_default().split(',').map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            let (token, owner) = entry
                .split_once('=')
                .filter(|(token, _)| !token.is_empty())
                .ok_or_else(|| ConfigError::Tokens(entry.to_owned()))?;
            let owner = Owner::parse(owner).map_err(|_| ConfigError::Tokens(entry.to_owned()))?;
            config.tokens.insert(token.to_owned(), owner);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_tokens_add_to_the_file_and_bad_entries_are_refused() {
        let config = Config::load(None, Some("tA=alice, tB=bob")).unwrap();
        assert_eq!(config.tokens.len(), 2);
        assert_eq!(config.tokens["tB"].as_str(), "bob");
        assert!(Config::load(None, Some("no-equals-sign")).is_err());
        assert!(Config::load(None, Some("=alice")).is_err());
        assert!(Config::load(None, Some("t=")).is_err());
    }

    #[test]
    fn unknown_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("onejob.toml");
        std::fs::write(&path, "contract_dir = \"x\"\n").unwrap();
        let err = Config::load(Some(&path), None).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    }

    #[test]
    fn the_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("onejob.example.toml");
        let config = Config::load(Some(&path), None).unwrap();
        assert!(!config.providers.is_empty());
    }
}
