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

/// Bearer token → owner, and the operators' token that reads `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    owners: BTreeMap<String, Owner>,
    /// Counters cover every owner's activity: only this token reads them. None: nobody does.
    metrics: Option<String>,
}

impl Tokens {
    /// Accepted only on a loopback address, when no token is configured; printed at start-up.
    pub const DEV: [(&'static str, &'static str); 2] =
        [("dev-token-alice", "alice"), ("dev-token-bob", "bob")];
    /// The operators' token that goes with the dev tokens.
    pub const DEV_METRICS: &'static str = "dev-token-metrics";

    pub fn new(owners: BTreeMap<String, Owner>, metrics: Option<String>) -> Self {
        Self { owners, metrics }
    }

    pub fn dev() -> Self {
        let owners = Self::DEV
            .into_iter()
            .map(|(token, owner)| {
                (
                    token.to_owned(),
                    Owner::parse(owner).expect("valid dev owner"),
                )
            })
            .collect();
        Self::new(owners, Some(Self::DEV_METRICS.to_owned()))
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    fn owner(&self, token: &str) -> Option<&Owner> {
        self.owners.get(token)
    }
}

/// The bearer token of a request, if it sent one.
fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
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
            Self::Tokens(tokens) => tokens.owner(bearer(parts)?).cloned(),
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

/// A request with the operators' token (`/metrics`). An owner's token is known but not enough: 403.
#[derive(Debug, Clone, Copy)]
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Auth::Tokens(tokens) = state.auth.as_ref() else {
            // Behind API Gateway, counters leave as CloudWatch metrics, not through the API.
            return Err(ApiError::Forbidden);
        };
        match bearer(parts) {
            Some(token) if tokens.metrics.as_deref() == Some(token) => Ok(Operator),
            Some(token) if tokens.owner(token).is_some() => Err(ApiError::Forbidden),
            _ => Err(ApiError::Unauthorized),
        }
    }
}

/// Who reads a view that every owner may read and operators see more of (`GET /v1/providers`).
#[derive(Debug, Clone)]
pub enum Viewer {
    Owner(Owner),
    Operator,
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match Caller::from_request_parts(parts, state).await {
            Ok(Caller(owner)) => Ok(Self::Owner(owner)),
            Err(_) => Operator::from_request_parts(parts, state)
                .await
                .map(|_| Self::Operator)
                .map_err(|_| ApiError::Unauthorized),
        }
    }
}
