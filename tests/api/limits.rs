//! Owners who cannot starve each other: a limit of N live jobs admits exactly N of a concurrent burst, on both
//! stores, and the rest answer 429 with `Retry-After`, nothing written; a replay of a job that exists is never
//! refused; another owner is untouched; a minute's creates and a period's budget hold the same way.

use chrono::Duration;
use futures_util::future::join_all;
use onejob::clock::Clock;
use onejob::contracts::Contracts;
use onejob::domain::{Budget, ContractRef, Limits, OwnerLimits, Period, ProviderName};
use onejob::providers::{DemoBehavior, ProviderConfig};
use serde_json::{Value, json};
use std::collections::BTreeMap;

use crate::helpers::{ALICE, BOB, TestApp, assert_problem, config, json_with_status};
use crate::support::faulty::{Call, Fault};
use crate::support::metric;
use crate::support::stand_in::{Gate, Reply, StandIn, openai};

fn summarize(text: &str) -> Value {
    json!({"contract": "summarize@1", "input": {"text": text}, "providers": ["stuck"]})
}

/// An app whose every owner has `limits`, and whose provider `stuck` never answers: a job stays live.
async fn app_with(limits: OwnerLimits) -> TestApp {
    let mut config = config();
    config.providers.insert(
        ProviderName::parse("stuck").unwrap(),
        ProviderConfig::demo(DemoBehavior::Hang, 0),
    );
    config.limits = Limits {
        default: limits,
        ..Limits::default()
    };
    TestApp::spawn_with(config).await
}

#[tokio::test]
async fn a_live_jobs_limit_of_n_admits_exactly_n_of_a_burst_and_never_refuses_a_replay() {
    let app = app_with(OwnerLimits {
        live_jobs: Some(3),
        ..OwnerLimits::default()
    })
    .await;
    let burst = (0..12).map(|i| {
        let app = &app;
        async move {
            let response = app
                .create(ALICE, &format!("burst-{i}"), &summarize("t"))
                .await;
            (format!("burst-{i}"), response)
        }
    });
    let mut admitted = Vec::new();
    let mut refused = 0;
    for (key, response) in join_all(burst).await {
        match response.status().as_u16() {
            201 => admitted.push(key),
            429 => {
                let retry_after = response.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                assert!(retry_after.parse::<u64>().unwrap() >= 1);
                assert_problem(response, 429, "too_many_live_jobs").await;
                refused += 1;
            }
            other => panic!("{key}: {other}"),
        }
    }
    assert_eq!((admitted.len(), refused), (3, 9));
    let listed = json_with_status(app.list_jobs(ALICE, "?limit=100").await, 200).await;
    assert_eq!(
        listed["jobs"].as_array().unwrap().len(),
        3,
        "nothing else written"
    );

    // A replay of an admitted job answers it, limit or not; a refused key is still free.
    let replay = app.create(ALICE, &admitted[0], &summarize("t")).await;
    assert_eq!(replay.status(), 200);
    // Another owner has a limit of its own.
    assert_eq!(
        app.create(BOB, "bob-1", &summarize("t")).await.status(),
        201
    );

    // A job that ends makes room.
    let first = json_with_status(app.create(ALICE, &admitted[0], &summarize("t")).await, 200).await;
    let id = first["id"].as_str().unwrap();
    assert_eq!(app.cancel_job(ALICE, id).await.status(), 200);
    assert_eq!(
        app.create(ALICE, "after-a-cancel", &summarize("t"))
            .await
            .status(),
        201
    );
    let again = app.create(ALICE, "one-too-many", &summarize("t")).await;
    assert_problem(again, 429, "too_many_live_jobs").await;
}

#[tokio::test]
async fn creates_a_minute_are_spread_over_the_minute_and_replays_are_not_counted() {
    let app = app_with(OwnerLimits {
        creates_per_minute: Some(2),
        ..OwnerLimits::default()
    })
    .await;
    for key in ["a", "b"] {
        assert_eq!(app.create(ALICE, key, &summarize(key)).await.status(), 201);
    }
    assert_eq!(app.create(ALICE, "a", &summarize("a")).await.status(), 200);
    let third = app.create(ALICE, "c", &summarize("c")).await;
    // Two a minute is one each 30 s: after a burst of two, the next is due 30 s on.
    assert_eq!(third.headers()["retry-after"], "30");
    assert_problem(third, 429, "too_many_creates").await;
    app.clock.advance(Duration::seconds(30));
    assert_eq!(app.create(ALICE, "c", &summarize("c")).await.status(), 201);
    // No window edge: a minute on from the burst, one more is due, not two.
    app.clock.advance(Duration::seconds(30));
    assert_eq!(app.create(ALICE, "d", &summarize("d")).await.status(), 201);
    assert_problem(
        app.create(ALICE, "e", &summarize("e")).await,
        429,
        "too_many_creates",
    )
    .await;
}

#[tokio::test]
async fn a_spent_budget_refuses_creates_until_the_next_period_and_a_replay_still_answers() {
    let mut config = config();
    let body = json!({"contract": "summarize@1", "input": {"text": "The projector broke. The meeting moved."}});
    // Room for one call's worst case: the second create's does not fit beside what the first spent.
    let contracts = Contracts::load(&[], &BTreeMap::new(), true, |_| true).unwrap();
    let summarize = contracts
        .get(&ContractRef::parse("summarize@1").unwrap())
        .unwrap();
    let (prompt, answer) = summarize.worst_case_tokens(&body["input"]);
    config.limits.default.budget = Some(Budget {
        period: Period::Day,
        tokens: Some(prompt + answer),
        cost: None,
    });
    // The demo provider, at once, reports its usage: more than ten tokens for any summary.
    config.providers.insert(
        ProviderName::parse("demo").unwrap(),
        ProviderConfig::demo(DemoBehavior::Answer, 0),
    );
    let app = TestApp::spawn_with(config).await;
    let job = json_with_status(app.create(ALICE, "spends", &body).await, 201).await;
    let id = job["id"].as_str().unwrap();
    let done = app
        .wait_until(ALICE, id, |j| j["status"] == "succeeded")
        .await;
    // The call is settled after the answer is written: wait for the settle to land, not just to start.
    app.faults.finished(Call::SettlePlace, 1).await;
    // The metrics tell the worst case reserved from what it settled to: the tokens the demo reported.
    let used = &done["attempts"][0]["report"];
    let used = used["input_tokens"].as_u64().unwrap() + used["output_tokens"].as_u64().unwrap();
    assert!(used < prompt + answer);
    let counted = |phase: &str, value: u64| {
        format!("onejob_budget_total{{owner=\"alice\",phase=\"{phase}\",unit=\"tokens\"}} {value}")
    };
    let metrics = app
        .metrics_when(|m| m.contains(&counted("settled", used)))
        .await;
    assert!(
        metrics.contains(&counted("reserved", prompt + answer)),
        "{metrics}"
    );

    let refused = app.create(ALICE, "next", &body).await;
    let problem = assert_problem(refused, 429, "budget_exceeded").await;
    assert!(
        problem["detail"].as_str().unwrap().contains("budget"),
        "{problem}"
    );
    assert_eq!(
        app.create(ALICE, "spends", &body).await.status(),
        200,
        "a replay"
    );
    assert_eq!(
        app.create(BOB, "bob", &body).await.status(),
        201,
        "bob's own budget"
    );
    // The next day, the budget is whole again.
    app.clock.advance(Duration::hours(15));
    assert_eq!(app.create(ALICE, "next", &body).await.status(), 201);
}

/// A create under limits whose answer was lost is tried again under its token: it finds its own job (201), and
/// the owner's ledger counted it once. One that failed before the write counted nothing.
#[tokio::test]
async fn a_create_whose_answer_was_lost_is_counted_once() {
    let app = app_with(OwnerLimits {
        creates_per_minute: Some(2),
        ..OwnerLimits::default()
    })
    .await;
    app.faults.plan(&[(Call::Create, Fault::After)]);
    assert_eq!(app.create(ALICE, "a", &summarize("a")).await.status(), 201);
    app.faults.plan(&[(Call::Create, Fault::Before)]);
    assert_eq!(app.create(ALICE, "b", &summarize("b")).await.status(), 201);
    assert!(app.faults.spent());
    let third = app.create(ALICE, "c", &summarize("c")).await;
    assert_problem(third, 429, "too_many_creates").await;
}

/// A provider capped at two calls in flight takes two of a burst of five; the others wait queued, their messages
/// put off and coming back, without a try (one attempt each, still `queued`); as calls end, the next ones go.
#[tokio::test]
async fn a_provider_capped_at_two_calls_takes_two_and_the_rest_wait_without_a_try() {
    let gate = Gate::new();
    let capped = StandIn::spawn(
        vec![Reply::Held(gate.clone()), Reply::Held(gate.clone())],
        Reply::Answer(json!({"summary": "s"})),
    )
    .await;
    let mut config = config();
    // Its calls may take a minute: the looks of the waiting attempts, a second apart, time none of them out.
    let mut provider = openai(capped.base_url()).with_timings(60_000, 10_000);
    provider.limits.max_in_flight = Some(2);
    config
        .providers
        .insert(ProviderName::parse("capped").unwrap(), provider);
    let app = TestApp::spawn_with(config).await;
    let body = |i: usize| json!({"contract": "summarize@1", "input": {"text": format!("t{i}")}, "providers": ["capped"]});
    let mut ids = Vec::new();
    for i in 0..5 {
        let job = json_with_status(app.create(ALICE, &format!("k{i}"), &body(i)).await, 201).await;
        ids.push(job["id"].as_str().unwrap().to_owned());
    }
    capped.received(2).await;
    let waits = |n: f64| {
        move |m: &str| metric(m, "onejob_slot_waits_total", &[("provider", "capped")]) >= n
    };
    app.metrics_when(waits(3.0)).await;
    // A second look finds the slots still taken: still two calls, and no job has a second attempt.
    app.clock.advance(Duration::seconds(1));
    app.metrics_when(waits(6.0)).await;
    assert_eq!(capped.call_count(), 2);
    for id in &ids {
        let job = json_with_status(app.get_job(ALICE, id).await, 200).await;
        assert_eq!(job["attempts"].as_array().unwrap().len(), 1, "{job}");
    }
    // The held calls answer and free their slots; at the next look the waiting attempts go, two at a time.
    gate.open(json!({"summary": "s"}));
    for (freed, called) in [(2, 4), (4, 5)] {
        app.faults.finished(Call::FreeCallSlot, freed).await;
        app.clock.advance(Duration::seconds(1));
        capped.received(called).await;
    }
    for id in &ids {
        app.wait_until(ALICE, id, |j| j["status"] == "succeeded")
            .await;
    }
    assert_eq!(capped.call_count(), 5, "one call per job");
}

/// A hundred concurrent creates of one owner against a budget with room for exactly seven worst cases: seven are
/// created, the rest are refused `budget_exceeded` with nothing written, a replay of an admitted one still answers,
/// and each in-flight job's bill shows its worst case as reserved — which the usage report's budget adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_against_a_budget_admits_exactly_the_worst_cases_that_fit() {
    let body = summarize("t");
    let contracts = Contracts::load(&[], &BTreeMap::new(), true, |_| true).unwrap();
    let summarize = contracts
        .get(&ContractRef::parse("summarize@1").unwrap())
        .unwrap();
    let (prompt, answer) = summarize.worst_case_tokens(&body["input"]);
    let worst = prompt + answer;
    let app = app_with(OwnerLimits {
        budget: Some(Budget {
            period: Period::Day,
            tokens: Some(7 * worst + worst / 2),
            cost: None,
        }),
        ..OwnerLimits::default()
    })
    .await;
    let burst = (0..100).map(|i| {
        let (app, body) = (&app, &body);
        async move { (i, app.create(ALICE, &format!("b-{i}"), body).await) }
    });
    let mut admitted = Vec::new();
    for (i, response) in join_all(burst).await {
        match response.status().as_u16() {
            201 => admitted.push(json_with_status(response, 201).await),
            _ => drop(assert_problem(response, 429, "budget_exceeded").await),
        }
        assert!(i < 100);
    }
    assert_eq!(admitted.len(), 7, "exactly the worst cases that fit");
    let listed = json_with_status(app.list_jobs(ALICE, "?limit=100").await, 200).await;
    assert_eq!(
        listed["jobs"].as_array().unwrap().len(),
        7,
        "nothing else written"
    );
    let first = &admitted[0];
    let key = first["idempotency_key"].as_str().unwrap();
    assert_eq!(
        app.create(ALICE, key, &body).await.status(),
        200,
        "a replay"
    );
    // Once its only attempt is in flight (its provider never answers), its bill bounds it.
    let id = first["id"].as_str().unwrap();
    let job = app
        .wait_until(ALICE, id, |j| j["status"] == "running")
        .await;
    assert_eq!(
        job["bill"]["reserved"]["tokens"],
        json!(worst),
        "{}",
        job["bill"]
    );
    assert_eq!(job["bill"]["reserved"]["attempts"], json!([1]));
    let today = app.clock.now().date_naive();
    let usage = json_with_status(
        app.get(ALICE, &format!("/v1/usage?from={today}&to={today}"))
            .await,
        200,
    )
    .await;
    assert_eq!(
        usage["budget"]["reserved"]["tokens"],
        json!(7 * worst),
        "{usage}"
    );
    assert_eq!(usage["budget"]["settled"]["tokens"], json!(0));
    let in_flight = usage["rows"][0]["reserved"]["tokens"].as_u64().unwrap();
    assert!((worst..=7 * worst).contains(&in_flight), "{usage}");
}
