//! Request shapes as a provider's settings say: a reasoning model, an Azure-style endpoint.

use super::*;

/// An openai provider on `model` at `stand_in`, its endpoint as `shape` leaves it.
fn shaped(
    stand_in: &StandIn,
    model: &str,
    shape: impl FnOnce(&mut ProviderEndpoint),
) -> ProviderConfig {
    let mut endpoint = ProviderEndpoint {
        model: model.into(),
        ..endpoint(stand_in.base_url())
    };
    shape(&mut endpoint);
    timed(ProviderKind::Openai(OpenAiSettings(endpoint)))
}

/// Today's reasoning models refuse `max_tokens` and any temperature but theirs: a provider on one qualifies by
/// its family's default (gpt-5, o-series), or, under a name that does not tell (a deployment, a server of its
/// own), once its settings say so — and not before.
#[tokio::test]
async fn a_reasoning_model_answers_once_its_settings_say_so() {
    let samples = 3;
    // A name that does not tell: the legacy fields go out and are refused, definitely, one call per run.
    let stand_in = StandIn::spawn(vec![], Reply::Reasoning(good())).await;
    let evidence = qualify_summarize(shaped(&stand_in, "team-reasoner", |_| {}), 1).await;
    assert!(!evidence.passed);
    assert_eq!(evidence.first_problem().unwrap().code, "provider_refused");
    assert_eq!(stand_in.calls().len(), samples);

    let settled = shaped(&stand_in, "team-reasoner", |e| {
        e.token_limit_field = Some(TokenLimitField::MaxCompletionTokens);
        e.send_temperature = Some(false);
        e.reasoning_effort = Some("low".into());
    });
    let evidence = qualify_summarize(settled, 1).await;
    assert!(evidence.passed, "{evidence:?}");
    let sent = stand_in.calls().last().unwrap().body.clone();
    assert_eq!(sent["max_completion_tokens"], 256);
    assert_eq!(sent["reasoning_effort"], "low");
    assert!(
        sent.get("max_tokens").is_none() && sent.get("temperature").is_none(),
        "{sent}"
    );
    assert_eq!(stand_in.calls().len(), 2 * samples);

    // A family the name tells: no setting needed.
    for model in ["gpt-5-mini", "o4-mini", "openai/gpt-5"] {
        let evidence = qualify_summarize(shaped(&stand_in, model, |_| {}), 1).await;
        assert!(evidence.passed, "{model}: {evidence:?}");
    }
    // And a model that takes both still gets them.
    let classic = StandIn::answering(good()).await;
    assert!(
        qualify_summarize(shaped(&classic, "gpt-4.1-mini", |_| {}), 1)
            .await
            .passed
    );
    let sent = classic.calls()[0].body.clone();
    assert_eq!(
        (&sent["max_tokens"], &sent["temperature"]),
        (&json!(256), &json!(0.0))
    );
}

/// Azure OpenAI's shape — a deployment's path, an `api-version`, the key in `api-key` — and a server's own headers
/// and body fields, all from the provider's settings; each is part of its fingerprint.
#[tokio::test]
async fn an_azure_style_endpoint_is_reached_as_its_settings_say() {
    let stand_in = StandIn::answering(good()).await;
    let azure = |e: &mut ProviderEndpoint| {
        e.base_url = stand_in
            .base_url()
            .replace("/v1", "/openai/deployments/team-gpt");
        e.query = [("api-version".to_owned(), "2024-10-21".to_owned())].into();
        e.api_key_header = Some("api-key".into());
        e.headers = [("x-team".to_owned(), "support".to_owned())].into();
        e.body = [("user".to_owned(), json!("onejob"))].into_iter().collect();
    };
    let evidence = qualify_summarize(shaped(&stand_in, "gpt-4.1-mini", azure), 1).await;
    assert!(evidence.passed, "{evidence:?}");
    let call = stand_in.calls().pop().unwrap();
    assert_eq!(
        call.uri.path(),
        "/openai/deployments/team-gpt/chat/completions"
    );
    assert_eq!(call.uri.query(), Some("api-version=2024-10-21"));
    assert_eq!(call.headers["api-key"], env!("CARGO_PKG_NAME"));
    assert!(call.headers.get("authorization").is_none());
    assert_eq!(call.headers["x-team"], "support");
    assert_eq!(call.body["user"], "onejob");

    let plain = fingerprint(&shaped(&stand_in, "gpt-4.1-mini", |_| {}));
    let shaped_too = fingerprint(&shaped(&stand_in, "gpt-4.1-mini", |e| {
        e.send_temperature = Some(false)
    }));
    assert_ne!(
        plain, shaped_too,
        "another request shape is another provider to qualify"
    );
    // A setting that fights onejob's own fields is refused when the config is read.
    let fights = shaped(&stand_in, "gpt-4.1-mini", |e| {
        e.body = [("max_tokens".to_owned(), json!(5))].into_iter().collect();
    });
    assert!(fights.check().unwrap_err().contains("token_limit_field"));
}
