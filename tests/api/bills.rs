//! The whole bill of one intent over HTTP: every answer a provider was paid for is in the job's bill — the kept one,
//! the discarded one — priced by the deployment's table; a call whose usage is not known yet is said to be unknown,
//! never counted as free; an owner's usage adds up its bills, and sees no other owner's; the metrics carry cost and
//! tokens by owner, contract and provider, and the calls a replay avoided.

use chrono::Duration;
use onejob::domain::{Price, PriceTable, ProviderName};
use serde_json::{Value, json};

use crate::helpers::{ALICE, BOB, TestApp, config, json_with_status};
use crate::support::stand_in::{Gate, Reply, StandIn, TIMEOUT_MS, openai};
use crate::support::{metric, record_qualified};

/// $1 a million prompt tokens and $2 a million answer tokens on the primary; $3 and $4 on the fallback.
fn prices() -> PriceTable {
    let price = |input, output| Price {
        input,
        output,
        cached_input: None,
    };
    PriceTable {
        currency: "EUR".into(),
        per_million: [
            ("primary".to_owned(), price(1.0, 2.0)),
            ("fallback".to_owned(), price(3.0, 4.0)),
        ]
        .into(),
    }
}

/// What an attempt's reported usage costs at `(input, output)` per million tokens, in the currency.
fn cost_of(attempt: &Value, (input, output): (f64, f64)) -> f64 {
    let report = &attempt["report"];
    (report["input_tokens"].as_f64().unwrap() * input
        + report["output_tokens"].as_f64().unwrap() * output)
        / 1e6
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[tokio::test]
async fn a_losing_answer_is_billed_beside_the_winner_and_an_unknown_cost_is_said() {
    let gate = Gate::new();
    let primary = StandIn::spawn(vec![Reply::Held(gate.clone())], Reply::Status(500, "")).await;
    let fallback = StandIn::answering(json!({"summary": "B"})).await;
    let mut config = config();
    for (name, stand_in) in [("primary", &primary), ("fallback", &fallback)] {
        (config.providers).insert(
            ProviderName::parse(name).unwrap(),
            openai(stand_in.base_url()),
        );
    }
    config.prices = Some(prices());
    let app = TestApp::spawn_with(config).await;
    record_qualified(app.engine(), app.faults.as_ref(), "fallback").await;
    let body = json!({"contract": "summarize@1", "input": {"text": "t"}, "providers": ["primary", "fallback"]});
    let created = json_with_status(app.create(ALICE, "k", &body).await, 201).await;
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["bill"]["currency"], "EUR");
    assert_eq!(
        created["bill"]["complete"], true,
        "nothing called yet: {created}"
    );

    // The primary hangs: its call may be billed, and nobody knows for how much yet.
    primary.received(1).await;
    app.clock.advance(Duration::milliseconds(TIMEOUT_MS as i64));
    let unknown = app
        .wait_until(ALICE, &id, |j| j["status"] == "unknown")
        .await;
    assert_eq!(unknown["bill"]["unknown_attempts"], json!([1]));
    assert_eq!(unknown["bill"]["complete"], false);
    assert_eq!(unknown["bill"]["total"]["cost"], 0.0);

    // Cancelled, the fallback wins; the primary's cost is still unknown.
    app.post(ALICE, &format!("/v1/jobs/{id}/attempts/1/cancel"))
        .await;
    let won = app
        .wait_until(ALICE, &id, |j| j["status"] == "succeeded")
        .await;
    assert_eq!(won["bill"]["unknown_attempts"], json!([1]), "{won}");
    let kept = cost_of(&won["attempts"][1], (3.0, 4.0));
    assert!(
        close(won["bill"]["won"]["cost"].as_f64().unwrap(), kept),
        "{won}"
    );

    // Its late answer is discarded and billed: both answers were paid for, one is kept.
    gate.open(json!({"summary": "A"}));
    let job = app
        .wait_until(ALICE, &id, |j| j["attempts"][0]["state"] == "discarded")
        .await;
    let bill = &job["bill"];
    let thrown = cost_of(&job["attempts"][0], (1.0, 2.0));
    assert!(thrown > 0.0 && kept > 0.0);
    assert!(
        close(bill["discarded"]["cost"].as_f64().unwrap(), thrown),
        "{bill}"
    );
    assert!(close(bill["won"]["cost"].as_f64().unwrap(), kept), "{bill}");
    assert!(
        close(bill["total"]["cost"].as_f64().unwrap(), thrown + kept),
        "{bill}"
    );
    assert_eq!(
        (&bill["won"]["attempts"], &bill["discarded"]["attempts"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(
        (&bill["unknown_attempts"], &bill["complete"]),
        (&json!([]), &json!(true))
    );
    assert_eq!(job["result"], json!({"summary": "B"}));

    // A replay costs no call, and is counted as one avoided.
    assert_eq!(app.create(ALICE, "k", &body).await.status(), 200);
    assert_eq!((primary.call_count(), fallback.call_count()), (1, 1));

    // The owner's usage adds up the bills of the day; another owner's is empty.
    let day = "2026-11-30";
    let usage = json_with_status(
        app.get(ALICE, &format!("/v1/usage?from={day}&to={day}"))
            .await,
        200,
    )
    .await;
    assert_eq!(usage["currency"], "EUR");
    assert_eq!(usage["rows"].as_array().unwrap().len(), 1, "{usage}");
    let row = &usage["rows"][0];
    assert_eq!(
        (&row["date"], &row["contract"], &row["jobs"]),
        (&json!(day), &json!("summarize@1"), &json!(1))
    );
    assert!(
        close(row["discarded"]["cost"].as_f64().unwrap(), thrown),
        "{usage}"
    );
    assert!(
        close(usage["total"]["cost"].as_f64().unwrap(), thrown + kept),
        "{usage}"
    );
    let other = json_with_status(
        app.get(BOB, &format!("/v1/usage?from={day}&to={day}"))
            .await,
        200,
    )
    .await;
    assert_eq!(
        (&other["rows"], &other["total"]["cost"]),
        (&json!([]), &json!(0.0))
    );

    // The metrics: the spend by owner, contract, provider and what became of the answer; the tokens; the call
    // avoided.
    let discarded = [
        ("owner", "alice"),
        ("contract", "summarize"),
        ("provider", "primary"),
        ("outcome", "discarded"),
    ];
    let metrics = app
        .metrics_when(|m| metric(m, "onejob_attempt_cost_count", &discarded) == 1.0)
        .await;
    assert!(
        close(
            metric(&metrics, "onejob_attempt_cost_sum", &discarded),
            thrown
        ),
        "{metrics}"
    );
    let won = [
        ("owner", "alice"),
        ("contract", "summarize"),
        ("provider", "fallback"),
        ("outcome", "won"),
    ];
    assert!(
        close(metric(&metrics, "onejob_attempt_cost_sum", &won), kept),
        "{metrics}"
    );
    let tokens = [
        ("owner", "alice"),
        ("contract", "summarize"),
        ("provider", "fallback"),
        ("kind", "output"),
    ];
    assert_eq!(
        metric(&metrics, "onejob_tokens_total", &tokens),
        10.0,
        "{metrics}"
    );
    let avoided = [
        ("owner", "alice"),
        ("contract", "summarize"),
        ("outcome", "replayed"),
    ];
    assert_eq!(
        metric(&metrics, "onejob_calls_avoided_total", &avoided),
        1.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn a_usage_range_is_checked() {
    let app = TestApp::spawn().await;
    for query in [
        "from=2026-12-02&to=2026-12-01",
        "from=2025-01-01&to=2026-12-01",
        "from=yesterday&to=2026-12-01",
        "to=2026-12-01",
    ] {
        let answer = app.get(ALICE, &format!("/v1/usage?{query}")).await;
        assert_eq!(answer.status(), 400, "{query}");
    }
}
