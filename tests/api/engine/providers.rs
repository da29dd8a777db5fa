//! Providers through the HTTP API: failover waits for qualification, standings shown, a breaker that opens.

use super::*;

/// Qualifies `provider` for summarize@1 through the app's engine and stores the evidence, as `onejob qualify` does.
async fn qualify_on(app: &TestApp, provider: &str) -> bool {
    let engine = app.engine();
    let name = ProviderName::parse(provider).unwrap();
    let contract = engine
        .contracts
        .get(&onejob::domain::ContractRef::parse("summarize@1").unwrap())
        .unwrap();
    let candidate = engine.providers.get(&name).unwrap();
    let evidence = onejob::providers::qualify::qualify(
        contract,
        &name,
        candidate,
        1,
        &*engine.clock,
        |_, _, _| {},
    )
    .await;
    app.faults.put_qualification(&evidence).await.unwrap();
    evidence.passed
}

/// The standing of `provider` for `contract` in `GET /v1/providers`.
async fn standing(app: &TestApp, provider: &str, contract: &str) -> Value {
    let list = json_with_status(app.get(ALICE, "/v1/providers").await, 200).await;
    let entry = list["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == provider)
        .unwrap()
        .clone();
    entry["contracts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["contract"] == contract)
        .unwrap()
        .clone()
}

#[tokio::test]
async fn failover_waits_for_qualification_and_providers_show_their_standing() {
    let mut config = config();
    for (name, behavior) in [
        ("demo-fail", DemoBehavior::Fail),
        ("demo-backup", DemoBehavior::Answer),
        ("demo-sloppy", DemoBehavior::ExtraKey),
    ] {
        config.providers.insert(
            ProviderName::parse(name).unwrap(),
            ProviderConfig::demo(behavior, 0),
        );
    }
    let app = TestApp::spawn_with(config).await;
    let chain = |text: &str| json!({"contract": "summarize@1", "input": {"text": text}, "providers": ["demo-fail", "demo-backup"]});
    let before = standing(&app, "demo-backup", "summarize@1").await;
    assert_eq!(before["standing"], "unqualified");
    assert_eq!(before["checked_at"], Value::Null);

    let id = created_id(&app, "before", &chain("Too early.")).await;
    let failed = app
        .wait_until(ALICE, &id, |j| j["status"] == "failed")
        .await;
    assert_eq!(failed["error"]["code"], "fallback_not_qualified");
    assert_eq!(failed["attempts"].as_array().unwrap().len(), 1);

    assert!(qualify_on(&app, "demo-backup").await);
    let after = standing(&app, "demo-backup", "summarize@1").await;
    assert_eq!(after["standing"], "qualified");
    assert_eq!(after["runs"], 3);
    assert_eq!(
        standing(&app, "demo-backup", "classify@1").await["standing"],
        "unqualified"
    );

    let id = created_id(&app, "after", &chain("Now it fails over. Fine.")).await;
    let done = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(done["completed_by"], 2);
    assert_eq!(done["attempts"][1]["provider"], "demo-backup");
    assert_eq!(done["attempts"][1]["report"]["model"], "demo/answer");
    assert_eq!(done["result"], json!({"summary": "Now it fails over."}));

    assert!(!qualify_on(&app, "demo-sloppy").await);
    let sloppy = standing(&app, "demo-sloppy", "summarize@1").await;
    assert_eq!(sloppy["standing"], "failed");
    assert_eq!(sloppy["problem"]["code"], "output_invalid");
    assert!(
        sloppy["problem"]["message"]
            .as_str()
            .unwrap()
            .contains("'note' was unexpected")
    );
}

/// Five failures that tell of the provider's health open its breaker: `GET /v1/providers` shows it open to the
/// operator; the next job on it makes no call and, its chain having nowhere else to go, waits out the cooldown
/// queued, unclaimed, without a try charged (no `breaker_open` attempt, no retry).
#[tokio::test]
async fn a_provider_that_keeps_failing_opens_its_breaker() {
    let mut config = config();
    config.providers.insert(
        ProviderName::parse("demo-fail").unwrap(),
        ProviderConfig::demo(DemoBehavior::Fail, 0),
    );
    let app = TestApp::spawn_with(config).await;
    let body = |n: u32| json!({"contract": "summarize@1", "input": {"text": format!("fails {n}")}, "providers": ["demo-fail"]});
    for n in 0..5 {
        let id = created_id(&app, &format!("k{n}"), &body(n)).await;
        app.wait_until(ALICE, &id, |j| j["status"] == "failed")
            .await;
    }
    let failing = app
        .provider_when("demo-fail", |p| p["breaker"]["recent_failures"] == 5)
        .await;
    let breaker = &failing["breaker"];
    assert_eq!(
        (
            &breaker["state"],
            &breaker["trips"],
            &breaker["recent_failures"]
        ),
        (&json!("open"), &json!(1), &json!(5)),
        "{breaker}"
    );

    let id = created_id(&app, "k5", &body(5)).await;
    let failing = [("provider", "demo-fail")];
    let metrics = app
        .metrics_when(|m| metric(m, "onejob_breaker_waits_total", &failing) >= 1.0)
        .await;
    let waiting = json_with_status(app.get(ALICE, &format!("/v1/jobs/{id}")).await, 200).await;
    assert_eq!(waiting["status"], "queued", "{waiting}");
    assert_eq!(
        waiting["attempts"].as_array().unwrap().len(),
        1,
        "{waiting}"
    );
    assert_eq!(waiting["attempts"][0]["state"], "queued", "{waiting}");
    assert_eq!(metric(&metrics, "onejob_retries_total", &failing), 0.0);
    assert_eq!(
        metric(&metrics, "onejob_breaker_trips_total", &failing),
        1.0,
        "{metrics}"
    );
    let failed = [("provider", "demo-fail"), ("state", "failed")];
    assert_eq!(
        metric(&metrics, "onejob_attempts_total", &failed),
        5.0,
        "{metrics}"
    );
}
