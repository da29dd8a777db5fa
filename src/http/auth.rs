//! Who is calling. Locally: `Authorization: Bearer <token>`, each token mapped by the config to an owner or to an
//! operator. On Lambda: the `sub` claim that API Gateway's JWT authorizer verified (bearer tokens are not accepted
//! there), an operator when the token holds the configured claim (`[operators] claim`, `value`). The owner never
//! comes from a request body; an operator acts on an owner's job only through the endpoints that record it.

use std::collections::BTreeMap;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use lambda_http::request::RequestContext;

use super::AppState;
use super::error::ApiError;
use crate::domain::Owner;
use crate::engine::Actor;

/// Bearer tokens: each an owner's, or an operator's.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    owners: BTreeMap<String, Owner>,
    /// Operators' tokens, by the name each act of theirs is recorded under: they read `/metrics`, the full
    /// provider view, every owner's jobs that need a person and their usage, and act on any owner's job.
    operators: BTreeMap<String, String>,
}

impl Tokens {
    /// Accepted only on a loopback address, when no token is configured; printed at start-up.
    pub const DEV: [(&'static str, &'static str); 2] =
        [("dev-token-alice", "alice"), ("dev-token-bob", "bob")];
    /// The operator's token that goes with the dev tokens (its name: `operator`).
    pub const DEV_METRICS: &'static str = "dev-token-metrics";

    pub fn new(owners: BTreeMap<String, Owner>, operators: BTreeMap<String, String>) -> Self {
        Self { owners, operators }
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
        let operators = [(Self::DEV_METRICS.to_owned(), "operator".to_owned())].into();
        Self::new(owners, operators)
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

/// Which JWT claim makes a caller an operator, and the value it must hold: the value itself, or one whole member of a
/// list — a JSON array (`["a", "b"]`), an array as API Gateway hands it over (`[a b]`), or the space-separated list
/// of OAuth's `scope` and `scp` claims. Any other claim is one value: a group named `readonly onejob-operators` is
/// not `onejob-operators`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorClaim {
    pub claim: String,
    pub value: String,
}

impl OperatorClaim {
    fn holds(&self, claims: &std::collections::HashMap<String, String>) -> bool {
        let Some(held) = claims.get(&self.claim) else {
            return false;
        };
        if *held == self.value {
            return true;
        }
        if let Ok(members) = serde_json::from_str::<Vec<String>>(held) {
            return members.contains(&self.value);
        }
        let listed = match held.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(inner) => inner,
            None if matches!(self.claim.as_str(), "scope" | "scp") => held,
            None => return false,
        };
        listed.split(' ').any(|member| member == self.value)
    }
}

/// How requests are authenticated.
#[derive(Debug, Clone)]
pub enum Auth {
    /// The local server: bearer tokens from the config.
    Tokens(Tokens),
    /// Behind API Gateway's JWT authorizer: the `sub` claim of the verified token; a caller whose token holds the
    /// operators' claim is an operator, named by its `sub`.
    JwtClaims { operators: Option<OperatorClaim> },
}

impl Auth {
    /// The verified claims of a request behind API Gateway.
    fn claims(parts: &Parts) -> Option<&std::collections::HashMap<String, String>> {
        match parts.extensions.get::<RequestContext>()? {
            RequestContext::ApiGatewayV2(context) => {
                Some(&context.authorizer.as_ref()?.jwt.as_ref()?.claims)
            }
            _ => None,
        }
    }

    fn owner(&self, parts: &Parts) -> Option<Owner> {
        match self {
            Self::Tokens(tokens) => tokens.owner(bearer(parts)?).cloned(),
            Self::JwtClaims { .. } => Owner::parse(Self::claims(parts)?.get("sub")?).ok(),
        }
    }

    /// The operator a request comes from, if it comes from one; `Err(())` when it came with an owner's
    /// credential (known, but not an operator's).
    fn operator(&self, parts: &Parts) -> Result<Option<String>, ()> {
        match self {
            Self::Tokens(tokens) => match bearer(parts) {
                Some(token) => match tokens.operators.get(token) {
                    Some(name) => Ok(Some(name.clone())),
                    None if tokens.owner(token).is_some() => Err(()),
                    None => Ok(None),
                },
                None => Ok(None),
            },
            Self::JwtClaims { operators } => {
                let Some(claims) = Self::claims(parts) else {
                    return Ok(None);
                };
                match operators {
                    Some(rule) if rule.holds(claims) => Ok(claims.get("sub").cloned()),
                    _ if claims.contains_key("sub") => Err(()),
                    _ => Ok(None),
                }
            }
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

/// A request from an operator, named. An owner's credential is known but not enough: 403.
#[derive(Debug, Clone)]
pub struct Operator(pub String);

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match state.auth.operator(parts) {
            Ok(Some(name)) => Ok(Self(name)),
            Err(()) => Err(ApiError::Forbidden),
            Ok(None) => Err(ApiError::Unauthorized),
        }
    }
}

/// Who reads a view that every owner may read and operators see more of (`GET /v1/providers`, a job).
#[derive(Debug, Clone)]
pub enum Viewer {
    Owner(Owner),
    Operator(String),
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Ok(Some(name)) = state.auth.operator(parts) {
            return Ok(Self::Operator(name));
        }
        state
            .auth
            .owner(parts)
            .map(Self::Owner)
            .ok_or(ApiError::Unauthorized)
    }
}

impl From<Viewer> for Actor {
    fn from(viewer: Viewer) -> Self {
        match viewer {
            Viewer::Owner(owner) => Actor::Owner(owner),
            Viewer::Operator(name) => Actor::Operator(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OperatorClaim;

    fn holds(claim: &str, held: &str) -> bool {
        let rule = OperatorClaim {
            claim: claim.into(),
            value: "onejob-operators".into(),
        };
        rule.holds(&[(claim.to_owned(), held.to_owned())].into())
    }

    #[test]
    fn the_operators_claim_is_matched_by_whole_members() {
        assert!(holds("groups", "onejob-operators"));
        assert!(holds("groups", "[readers onejob-operators]"));
        assert!(holds("groups", r#"["readers", "onejob-operators"]"#));
        assert!(holds("scope", "jobs:read onejob-operators"));
        // A value that only holds the value's text is not a member of it.
        assert!(!holds("groups", "readonly onejob-operators"));
        assert!(!holds("groups", r#"["readonly onejob-operators"]"#));
        assert!(!holds("groups", "[onejob-operators-readonly]"));
        assert!(!holds("groups", "not-onejob-operators"));
    }
}
