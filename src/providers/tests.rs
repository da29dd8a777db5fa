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
                reqwest::StatusCode::from_u16(status).unwrap()
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

/// A provider's fingerprint is what its qualifications are stored under: the same settings give the same one from
/// release to release, or every standing is lost on an upgrade. Pinned for one provider of each kind.
#[test]
fn each_kinds_fingerprint_stays_what_it_was() {
    let kinds = [
        "kind = \"demo\"\nbehavior = \"extra_key\"\ndelay_ms = 5",
        "kind = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nmodel = \"gpt-5-mini\"",
        "kind = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\npath = \"p\"\nheaders = { a = \"b\" }\nbody = { top_k = 3 }",
        "kind = \"anthropic\"\nbase_url = \"https://api.anthropic.com/v1\"\nmodel = \"claude-haiku-4-5\"\ncontext_window = 200000",
        "kind = \"bedrock\"\nmodel = \"us.anthropic.claude-haiku-4-5-20251001-v1:0\"\nregion = \"us-east-1\"\nsend_temperature = false",
    ];
    let got: Vec<String> = kinds
        .iter()
        .map(|table| fingerprint(&toml::from_str(table).unwrap()).to_string())
        .collect();
    assert_eq!(
        got,
        [
            "43d3ee5eeb5650df9e285998adf547e6b253f39f78be877801701e648c7f712b",
            "fb503034797de82405187950b43e9452a8f4116ab4bfaf668ffceb3ef667bd39",
            "10fbcaf109294427f26c2adffc76f14c5ca08a18cd27b27240b6491213865a64",
            "5c4892381d750993d32b19a1b256701980f028280f506d13fc2d19d87f8e9bac",
            "b61dcae2f7d69ddb80ba9c7e1fc4b8986a944430787eb622d9a4d37308e8ca82",
        ]
    );
}

/// What an owner reads of an error body: the provider's own JSON message with its addresses cut out, or only the
/// size of a body that is not the provider's (a proxy's page names internal hosts).
#[test]
fn an_error_body_keeps_the_providers_message_and_no_address() {
    let openai = r#"{"error": {"message": "Invalid key; see https://platform.example/keys (from 10.0.3.7:8443)", "type": "x"}}"#;
    assert_eq!(
        http::error_text(openai),
        "Invalid key; see [address] (from [address])"
    );
    let bracketed = r#"{"error": "upstream [fd00::1]:443 refused"}"#;
    assert_eq!(http::error_text(bracketed), "upstream [address] refused");
    for (leak, kept) in [
        ("squid.corp.internal:3128", ""),
        ("localhost:8080", ""),
        ("fd00:ec2::254", ""),
        ("2001:db8::1", ""),
        ("[fe80::1%eth0]:8080", ""),
        ("vllm-gpu-7:8000", ""),
        ("redis:6379", ""),
        ("my_svc.corp.local:9000", ""),
        ("http%3A%2F%2F10.9.8.7%3A8080%2Fadmin", ""),
        ("node_10.2.3.4", ""),
        ("10.2.3.5x", ""),
        ("::ffff:a01:101", ""),
        ("internal.corp.example.", ""),
        ("gpt-4.1", "gpt-4.1"),
        ("claude-3-5-haiku", "claude-3-5-haiku"),
    ] {
        let body = json!({"error": {"message": format!("upstream {leak} refused")}}).to_string();
        let expected = if kept.is_empty() { "[address]" } else { kept };
        assert_eq!(
            http::error_text(&body),
            format!("upstream {expected} refused"),
            "{leak}"
        );
    }
    // Cut at 300 characters, a word cut in two is left out whole: no key's or address's start is kept.
    let long =
        json!({"error": format!("{} sk-secret-key-0123456789", "z".repeat(280))}).to_string();
    assert_eq!(http::error_text(&long), "z".repeat(280));
    let page = "<html><body>squid at proxy.corp.internal:3128</body></html>";
    let kept = http::error_text(page);
    assert!(!kept.contains("corp") && !kept.contains("3128"), "{kept}");
    assert!(kept.contains(&format!("{} bytes", page.len())), "{kept}");
    assert_eq!(http::error_text("  "), "no body");
    let not_a_message = r#"{"error": {"code": 17}}"#;
    assert!(http::error_text(not_a_message).contains("not the provider's JSON error"));
}

/// Invariant 5 for every error status: only what said the request was not taken, or refused it, is a definite
/// failure; a gateway's time-out, a provider's own 5xx and a redirect that does not say "repeat it there" (a 303,
/// a 302) may have run the model.
#[test]
fn an_error_status_is_definite_only_where_the_work_was_not_done() {
    use http::Meaning::{Failed, MayBeDone};
    for (status, meaning) in [
        (301, MayBeDone("redirected")),
        (302, MayBeDone("redirected")),
        (303, MayBeDone("redirected")),
        (307, Failed("provider_refused")),
        (308, Failed("provider_refused")),
        (400, Failed("provider_refused")),
        (401, Failed("provider_refused")),
        (404, Failed("provider_refused")),
        (408, MayBeDone("gateway_timeout")),
        (429, Failed("rate_limited")),
        (500, MayBeDone("provider_error")),
        (501, Failed("provider_refused")),
        (502, MayBeDone("gateway_timeout")),
        (503, Failed("provider_unavailable")),
        (504, MayBeDone("gateway_timeout")),
        (520, MayBeDone("provider_error")),
        (524, MayBeDone("gateway_timeout")),
        (529, Failed("provider_unavailable")),
    ] {
        assert_eq!(http::meaning(status), meaning, "{status}");
    }
}
