//! What each answer of Bedrock's Converse API means about the work (invariant 5), through the real client against
//! a stand-in that checks every call's SigV4 signature: throttling and unavailability say it was not done (a
//! retry may follow); a model's time-out or error, the service's 500 or a connection lost after sending may have
//! done it (`unknown`); a refusal of the request is definite and not the provider's health, a refusal of the
//! role's access is.

use onejob::domain::{ContractRef, Health};
use onejob::providers::kinds::bedrock::BedrockSettings;
use onejob::providers::{ProviderKind, ProviderOutcome, ProviderRequest, Reply as Answer};
use serde_json::json;

use crate::support::stand_in::{
    BEDROCK_MODEL, Reply, StandIn, bedrock, hanging_up, refusing, timed,
};
use crate::{clock, good, providers};

/// One call of a Bedrock provider whose calls go to `base_url`, with the summarize contract's shape.
async fn call(config: onejob::providers::ProviderConfig) -> Answer {
    let providers = providers(config, clock());
    let candidate = providers
        .get(&onejob::domain::ProviderName::parse("candidate").unwrap())
        .unwrap();
    let request = ProviderRequest {
        idempotency_key: "job_1:1".into(),
        contract: ContractRef::parse("summarize@1").unwrap(),
        prompt: "Summarise: the meeting moved.".into(),
        input: json!({"text": "the meeting moved"}),
        output_schema: json!({"type": "object", "properties": {"summary": {"type": "string"}}}),
        temperature: 0.2,
        max_output_tokens: 100,
    };
    candidate.client.call(&request).await
}

/// The code of a definite failure, and whether it tells of the provider's health.
fn failure(answer: &Answer) -> (&str, bool) {
    match &answer.outcome {
        ProviderOutcome::Failed(e) => (e.code.as_str(), answer.health == Health::Failing),
        other => panic!("not a failure: {other:?}"),
    }
}

#[tokio::test]
async fn a_signed_converse_call_carries_the_contract_and_its_answer_is_the_tool_input() {
    let stand_in = StandIn::answering(good()).await;
    let mut config = bedrock(stand_in.base_url());
    let ProviderKind::Bedrock(settings) = &mut config.kind else {
        unreachable!()
    };
    settings.additional_model_request_fields =
        [("top_k".to_owned(), json!(50))].into_iter().collect();
    let answer = call(config).await;
    assert_eq!(answer.outcome, ProviderOutcome::Answered(good()));
    assert_eq!(answer.report.model.as_deref(), Some(BEDROCK_MODEL));
    assert_eq!(answer.report.output_tokens, Some(10));

    let sent = stand_in.calls().pop().unwrap();
    assert_eq!(
        sent.uri.path(),
        "/model/us.anthropic.claude-haiku-4-5-20251001-v1%3A0/converse"
    );
    let authorization = sent.headers["authorization"].to_str().unwrap();
    assert!(
        authorization.contains("/us-east-1/bedrock/aws4_request"),
        "{authorization}"
    );
    let body = &sent.body;
    assert_eq!(
        body["messages"][0]["content"][0]["text"],
        "Summarise: the meeting moved."
    );
    assert_eq!(body["inferenceConfig"]["maxTokens"], 100);
    assert!((body["inferenceConfig"]["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
    let tool = &body["toolConfig"]["tools"][0]["toolSpec"];
    assert_eq!(tool["name"], "answer");
    assert_eq!(
        tool["inputSchema"]["json"]["properties"]["summary"]["type"],
        "string"
    );
    assert_eq!(
        body["toolConfig"]["toolChoice"],
        json!({"tool": {"name": "answer"}})
    );
    assert_eq!(body["additionalModelRequestFields"], json!({"top_k": 50}));
}

/// A call signed with another secret than the account's is refused, as Bedrock refuses it: the stand-in's check
/// bites, and a refused access tells of the deployment, for every owner alike.
#[tokio::test]
async fn a_call_signed_with_the_wrong_secret_is_refused_as_the_deployments_trouble() {
    let stand_in = StandIn::answering(good()).await;
    let (id, _) = crate::support::stand_in::aws_identity();
    let wrong = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            aws_sdk_dynamodb::config::Credentials::new(id, "not-the-secret", None, None, "t"),
        ))
        .http_client(onejob::startup::https_client())
        .build();
    let ProviderKind::Bedrock(settings) = bedrock(stand_in.base_url()).kind else {
        unreachable!()
    };
    let client = onejob::providers::kinds::bedrock::BedrockProvider::new(&settings, &wrong);
    let request = ProviderRequest {
        idempotency_key: "job_1:1".into(),
        contract: ContractRef::parse("summarize@1").unwrap(),
        prompt: "p".into(),
        input: json!({}),
        output_schema: json!({"type": "object"}),
        temperature: 0.0,
        max_output_tokens: 10,
    };
    let answer = onejob::providers::Provider::call(&client, &request).await;
    assert_eq!(failure(&answer), ("provider_refused", true), "{answer:?}");
    assert!(stand_in.calls().is_empty(), "refused before the script");
}

#[tokio::test]
async fn each_bedrock_refusal_means_what_it_says_about_the_work() {
    // (the stand-in's answer, the code, whether it tells of the provider's health)
    let definite = [
        (Reply::RateLimited(3), "rate_limited", true),
        (Reply::Unavailable(3), "provider_unavailable", true),
        (
            Reply::Status(429, "ModelNotReadyException"),
            "provider_unavailable",
            true,
        ),
        (
            Reply::Status(403, "AccessDeniedException"),
            "provider_refused",
            true,
        ),
        (
            Reply::Status(400, "ValidationException"),
            "provider_refused",
            false,
        ),
        (
            Reply::Status(404, "ResourceNotFoundException"),
            "provider_refused",
            false,
        ),
        (
            Reply::Prose("I would rather chat."),
            "output_not_json",
            false,
        ),
    ];
    for (reply, code, health) in definite {
        let stand_in = StandIn::spawn(vec![], reply.clone()).await;
        let answer = call(bedrock(stand_in.base_url())).await;
        assert_eq!(failure(&answer), (code, health), "{reply:?}: {answer:?}");
        assert_eq!(
            stand_in.call_count(),
            1,
            "{reply:?}: one call, never an SDK retry"
        );
    }
    let throttled = StandIn::spawn(vec![], Reply::RateLimited(3)).await;
    let answer = call(bedrock(throttled.base_url())).await;
    assert_eq!(answer.report.retry_after_s, Some(3));

    // The model ran out of time, or ran and broke, or the service failed after taking the request: the work may
    // have been done (and billed), so the attempt is `unknown`, never failed over.
    let maybe_done = [
        (
            Reply::Status(408, "ModelTimeoutException"),
            "gateway_timeout",
        ),
        (
            Reply::Status(500, "InternalServerException"),
            "provider_error",
        ),
        (Reply::Status(424, "ModelErrorException"), "provider_error"),
    ];
    for (reply, code) in maybe_done {
        let stand_in = StandIn::spawn(vec![], reply.clone()).await;
        let answer = call(bedrock(stand_in.base_url())).await;
        assert!(
            matches!(&answer.outcome, ProviderOutcome::Lost(e) if e.code == code),
            "{reply:?}: {answer:?}"
        );
        assert_eq!(stand_in.call_count(), 1, "{reply:?}: one call");
    }
}

#[tokio::test]
async fn a_lost_connection_is_unknown_and_a_refused_one_is_failed_on_bedrock() {
    let answer = call(bedrock(hanging_up().await)).await;
    assert!(
        matches!(&answer.outcome, ProviderOutcome::Lost(e) if e.code == "connection_lost"),
        "{answer:?}"
    );
    let answer = call(bedrock(refusing().await)).await;
    assert_eq!(failure(&answer), ("connection_failed", true), "{answer:?}");
}

#[test]
fn bedrock_settings_are_checked_when_the_config_is_read() {
    let with = |settings: BedrockSettings| timed(ProviderKind::Bedrock(settings)).check();
    let model = |m: &str| BedrockSettings {
        model: m.into(),
        ..BedrockSettings::default()
    };
    assert!(with(model(BEDROCK_MODEL)).is_ok());
    assert!(with(model("")).unwrap_err().contains("model"));
    let bad_url = BedrockSettings {
        endpoint_url: Some("not a url".into()),
        ..model(BEDROCK_MODEL)
    };
    assert!(with(bad_url).unwrap_err().contains("endpoint_url"));
}
