//! Who is calling. Locally: `Authorization: Bearer <token>`, each token mapped to an owner by the config. On Lambda:
//! the `sub` claim that API Gateway's JWT authorizer verified (bearer tokens are not accepted there). The owner
//! never comes from a request body.

use std::collections::BTreeMap;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use lambda_http::request::RequestContext;

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

/// How requests are authenticated.
#[derive(Debug, Clone)]
pub enum Auth {
    /// The local server: bearer tokens from the config.
    Tokens(Tokens),
    /// Behind API Gateway's JWT authorizer: the `sub` claim of the verified token.
    JwtClaims,
}

impl Auth {
    fn owner(&self, parts: &Parts) -> Option<Owner> {
        match self {
            Self::Tokens(tokens) => {
                let token = parts
                    .headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| {
                        let (scheme, token) = v.split_once(' ')?;
                        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
                    })?;
                tokens.owner(token).cloned()
            }
            Self::JwtClaims => match parts.extensions.get::<RequestContext>()? {
                RequestContext::ApiGatewayV2(context) => {
                    let sub = context
                        .authorizer
                        .as_ref()?
                        .jwt
                        .as_ref()?
                        .claims
                        .get("sub")?;
                    Owner::parse(sub).ok()
                }
                _ => None,
            },
        }
    }
}

/// The authenticated owner of a request.
#[derive(Debug, Clone)]
pub struct Caller(pub Owner);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        state
            .auth
            .owner(parts)
            .map(Caller)
            .ok_or(ApiError::Unauthorized)
    }
}
