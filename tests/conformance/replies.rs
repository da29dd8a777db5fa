//! One reply-classification suite for every provider kind (invariant 5): each kind's client, against a stand-in of
//! its wire format, through every fault of the wire — refused before sending, reset after sending, a 200 cut off
//! mid-body, a 5xx, an unavailable provider's 503, a gateway's 504 (a proxy's error page naming the addresses
//! behind it), a 429 with and without `Retry-After`, an answer that breaks the contract — with
//! what each means about work done: the attempt's state, the exact calls, and what follows (a retry on the same
//! provider, failover to the qualified fallback, or nothing: `unknown` waits). A kind added later is a compile
//! error in [`kinds`] until it is here.

use std::sync::Arc;

use onejob::domain::{AttemptState, JobStatus};
use onejob::providers::{ProviderConfig, ProviderKind};
use onejob::store::JobStore;
use onejob::worker::Processed;
use serde_json::{Value, json};

use crate::support::record_qualified;
use crate::support::rig::Rig;
use crate::support::stand_in::{
    Reply, StandIn, anthropic, bedrock, cutting, openai, refusing, resetting,
};

fn summary(text: &str) -> Value {
    json!({"summary": text})
}

/// A fault of the wire, as the primary's stand-in plays it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    RefusedBeforeSending,
    ResetAfterSending,
    CutMidBody,
    ServerError,
    Unavailable,
    GatewayTimeout,
    RateLimitedAfter(u64),
    RateLimited,
    BreaksTheContract,
}

const FAULTS: [Fault; 9] = [
    Fault::RefusedBeforeSending,
    Fault::ResetAfterSending,
    Fault::CutMidBody,
    Fault::ServerError,
    Fault::Unavailable,
    Fault::GatewayTimeout,
    Fault::RateLimitedAfter(30),
    Fault::RateLimited,
    Fault::BreaksTheContract,
];

/// What a reply means about the work, and what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Means {
    /// Not done: the attempt fails with this code and is tried again on the same provider, not before this many
    /// seconds if the provider said so.
    Retried(&'static str, Option<u64>),
    /// Done, or may have been: `unknown`, and nothing else is called.
    Unknown,
    /// A definite failure with this code: failover goes on to the qualified fallback.
    FailedOver(&'static str),
}

/// A provider kind, and the config of one of its providers at a stand-in's base URL.
type Kind = (&'static str, fn(String) -> ProviderConfig);

/// Every provider kind that calls out (the demo kind is in process: no wire), with how to reach a stand-in of it.
fn kinds() -> Vec<Kind> {
    let all: [Kind; 3] = [
        ("openai", openai),
        ("anthropic", anthropic),
        ("bedrock", bedrock),
    ];
    for (name, config) in &all {
        // Exhaustive: a new kind does not compile until it is in the list above.
        let covered = match config("http://127.0.0.1:9/v1".into()).kind {
            ProviderKind::Openai(_) => *name == "openai",
            ProviderKind::Anthropic(_) => *name == "anthropic",
            ProviderKind::Bedrock(_) => *name == "bedrock",
            ProviderKind::Demo(_) => false,
        };
        assert!(covered, "{name}");
    }
    all.to_vec()
}

/// What `fault` means: the same on every kind. Anything after the request went out may have been done — a reset, a
/// cut answer, a gateway that stopped waiting, the provider's own 500 (the model may have run).
fn means(fault: Fault) -> Means {
    match fault {
        Fault::RefusedBeforeSending => Means::Retried("connection_failed", None),
        Fault::ResetAfterSending
        | Fault::CutMidBody
        | Fault::GatewayTimeout
        | Fault::ServerError => Means::Unknown,
        Fault::Unavailable => Means::Retried("provider_unavailable", None),
        Fault::RateLimitedAfter(seconds) => Means::Retried("rate_limited", Some(seconds)),
        Fault::RateLimited => Means::Retried("rate_limited", None),
        Fault::BreaksTheContract => Means::FailedOver("output_not_json"),
    }
}

/// A proxy's error page, naming what is behind it.
const PROXY_PAGE: &str = "<html><body>504 Gateway Time-out: upstream http://10.20.30.40:8443/v1/chat/completions \
     (llm-gw.internal.example) did not answer; proxy 172.16.0.9:3128</body></html>";

/// The primary's base URL for `fault`, and its stand-in if it counts calls (the raw sockets do not).
async fn primary_for(kind: &str, fault: Fault) -> (String, Option<StandIn>) {
    let exception =
        |aws: &'static str, http: &'static str| if kind == "bedrock" { aws } else { http };
    let reply = match fault {
        Fault::RefusedBeforeSending => return (refusing().await, None),
        Fault::ResetAfterSending => return (resetting().await, None),
        Fault::CutMidBody => return (cutting().await, None),
        Fault::ServerError => Reply::Status(500, exception("InternalServerException", "boom")),
        Fault::Unavailable => {
            Reply::Status(503, exception("ServiceUnavailableException", "overloaded"))
        }
        Fault::GatewayTimeout => {
            Reply::Status(504, exception("GatewayTimeoutException", PROXY_PAGE))
        }
        Fault::RateLimitedAfter(seconds) => Reply::RateLimited(seconds),
        Fault::RateLimited => Reply::Status(429, exception("ThrottlingException", "slow down")),
        Fault::BreaksTheContract => Reply::Prose("Here is your summary, in prose."),
    };
    let stand_in = StandIn::spawn(vec![], reply).await;
    (stand_in.base_url(), Some(stand_in))
}

pub(crate) async fn every_reply_of_every_provider_kind_means_what_it_says_of_the_work(
    store: Arc<dyn JobStore>,
) {
    let fallback = StandIn::answering(summary("B")).await;
    for (kind, config) in kinds() {
        for fault in FAULTS {
            let case = format!("{kind}, {fault:?}");
            let (url, counted) = primary_for(kind, fault).await;
            let mut rig = Rig::configured(
                store.clone(),
                config(url),
                openai(fallback.base_url()),
                // Every case's failures on one provider name: no breaker between them.
                |config| config.breaker_threshold = 0,
            );
            record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
            let before = fallback.call_count();
            let (job, message) = rig.create(&format!("{kind}-{fault:?}")).await;
            let processed = rig.process(&message).await;
            let after = rig.job(&job).await;
            let first = after.attempt(1).unwrap().clone();
            if let Some(primary) = &counted {
                assert_eq!(primary.call_count(), 1, "{case}: one call to the primary");
            }
            // What an owner reads of it names no address: the provider's, or what a proxy's page says is behind it.
            if let Some(error) = &first.error {
                for address in ["127.0.0.1", "10.20.30.40", "172.16.0.9", "internal.example"] {
                    assert!(
                        !error.message.contains(address),
                        "{case}: {}",
                        error.message
                    );
                }
            }
            match means(fault) {
                Means::Unknown => {
                    assert_eq!(processed, Processed::Unknown, "{case}");
                    assert_eq!(first.state, AttemptState::Unknown, "{case}");
                    assert_eq!(after.status(), JobStatus::Unknown, "{case}");
                    assert!(rig.no_message(), "{case}: nothing follows an unknown");
                }
                Means::Retried(code, retry_after) => {
                    assert_eq!(processed, Processed::Failed, "{case}");
                    assert_eq!(first.state, AttemptState::Failed, "{case}");
                    assert_eq!(first.error.as_ref().unwrap().code, code, "{case}");
                    let retry = after
                        .attempt(2)
                        .unwrap_or_else(|| panic!("{case}: no retry"));
                    assert_eq!(
                        (retry.retry_of, &retry.provider, retry.state),
                        (Some(1), &first.provider, AttemptState::Queued),
                        "{case}"
                    );
                    let not_before = retry.not_before.unwrap();
                    if let Some(seconds) = retry_after {
                        let asked =
                            first.finished_at.unwrap() + chrono::Duration::seconds(seconds as i64);
                        assert!(not_before >= asked, "{case}: {not_before} before {asked}");
                    }
                }
                Means::FailedOver(code) => {
                    assert_eq!(processed, Processed::Failed, "{case}");
                    assert_eq!(first.state, AttemptState::Failed, "{case}");
                    assert_eq!(first.error.as_ref().unwrap().code, code, "{case}");
                    let to_fallback = rig.next_message();
                    assert_eq!(
                        rig.process(&to_fallback).await,
                        Processed::Succeeded,
                        "{case}"
                    );
                    assert_eq!(rig.job(&job).await.completed_by, Some(2), "{case}");
                }
            }
            let paid = usize::from(matches!(means(fault), Means::FailedOver(_)));
            assert_eq!(
                fallback.call_count() - before,
                paid,
                "{case}: calls to the fallback"
            );
            while !rig.no_message() {}
        }
    }
}
