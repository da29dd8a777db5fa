//! Who is calling. Locally: `Authorization: Bearer <token>`, each token mapped to an owner by the config. The
//! owner never comes from a request body.

use std::collections::BTreeMap;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use super::AppState;
use super::error::ApiError;
use crate::domain::Owner;

/// Bearer token → owner.
#[derive(Debug, Clone, Default)]
pub struct Tokens(BTreeMap<String, Owner>);

impl Tokens {
    /// Accepted only on a loopback address, when no token is configured; printed at start-up.
    pub const DEV: [(&'static str, &'static str); 2] =
        [("dev-token-alice", "alice"), ("dev-token-bob", "bob")];

    pub fn new(tokens: BTreeMap<String, Owner>) -> Self {
        Self(tokens)
    }

    pub fn dev() -> Self {
        Self(
            Self::DEV
                .into_iter()
                .map(|(token, owner)| {
                    (
                        token.to_owned(),
                        Owner::parse(owner).expect("valid dev owner"),
                    )
                })
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn owner(&self, token: &str) -> Option<&Owner> {
        self.0.get(token)
    }
}

/// The authenticated owner of a request.
#[derive(Debug, Clone)]
pub struct Caller(pub Owner);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or(ApiError::Unauthorized)?;
        state
            .tokens
            .owner(token)
            .cloned()
            .map(Caller)
            .ok_or(ApiError::Unauthorized)
    }
}
