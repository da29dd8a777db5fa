use super::http::exchange;
use super::*;

/// Invariant 15: what a breaker counts is what tells of the provider, never of the request.
#[test]
fn a_reply_tells_of_the_providers_health_only_when_the_provider_failed() {
    for code in Health::FAILING_CODES {
        assert_eq!(Reply::failed(code, "x").health, Health::Failing, "{code}");
    }
    assert_eq!(
        Reply::failed("provider_refused", "x").health,
        Health::Silent,
        "a refusal the request caused moves no breaker either way"
    );
    for code in [
        "model_refused",
        "output_invalid",
        "output_not_json",
        "output_truncated",
        "prompt_truncated",
    ] {
        assert_eq!(Reply::failed(code, "x").health, Health::Answered, "{code}");
    }
    let lost = Reply::from(ProviderOutcome::Lost(ErrorInfo::new(
        "connection_lost",
        "x",
    )));
    assert_eq!(lost.health, Health::Failing);
    assert_eq!(
        Reply::from(ProviderOutcome::Answered(json!({}))).health,
        Health::Answered
    );
}

/// A key the provider refuses says the deployment is broken for every caller: counted, though its code is the
/// 4xx's; any other 4xx is the request's.
#[tokio::test]
async fn a_refused_key_is_the_providers_health_and_a_bad_request_is_not() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/{status}",
        axum::routing::post(
            |axum::extract::Path(status): axum::extract::Path<u16>| async move {
                StatusCode::from_u16(status).unwrap()
            },
        ),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    for (status, health) in [
        (401, Health::Failing),
        (403, Health::Failing),
        (400, Health::Silent),
        (422, Health::Silent),
        (404, Health::Silent),
    ] {
        let reply = exchange(http.post(format!("http://{addr}/{status}")))
            .await
            .unwrap_err();
        assert_eq!(failure_code(&reply), "provider_refused", "{status}");
        assert_eq!(reply.health, health, "{status}");
    }
}
