//! The config of a deployed function: the file its stack ships (the config layer's `onejob.toml`, which
//! `ONEJOB_CONFIG` names), with its contract files beside it. Unlike a local run, nothing is assumed: the demo
//! providers exist only if the file names them, and a file that names no provider is refused, so a deployment that
//! lost its config never answers jobs with demo text.

use std::path::Path;

use super::{Config, ConfigError};

impl Config {
    /// The config at `path` as a deployed function reads it: whole, with the providers it names and no others —
    /// or the error that names the file, the line and the fix. Its contracts load as everywhere
    /// ([`Config::contracts`]).
    pub fn load_deployed(path: &Path) -> Result<Self, ConfigError> {
        let mut config = Self::load(Some(path), None)?;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        // `Config::parse` fills a missing `[providers]` with the demo ones, for a newcomer's first run; here a
        // missing table means none.
        let names_providers =
            toml::from_str::<toml::Table>(&text).is_ok_and(|table| table.contains_key("providers"));
        if !names_providers {
            config.providers.clear();
        }
        if config.providers.is_empty() {
            return Err(ConfigError::NoProviders(path.to_owned()));
        }
        Ok(config)
    }
}
