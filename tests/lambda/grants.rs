//! Every request each function's code sends to AWS is allowed to its role in the template's stack, as moto's IAM
//! holds the roles' policies. The requests are derived, not listed: each function runs with a client that records
//! what it sends, through everything it does — the api function through every route of its own OpenAPI document,
//! as an owner and as an operator; the worker through the batch that runs the jobs made; the sweeper through a
//! sweep with deliveries, leases and messages due. moto enforces no IAM, so a grant the code needs and the template
//! lacks (an index the api queries) would otherwise be found on AWS, as an AccessDenied.

use std::collections::BTreeMap;
use std::sync::Arc;

use onejob::config::Config;
use onejob::domain::{OwnerLimits, ProviderName};
use onejob::lambda::{self, Deployment};
use onejob::startup::Role;
use onejob::worker::sweeper::sweep;
use serde_json::{Value, json};

use crate::support::aws::{
    Recording, Sent, queue_for_test, sdk_config, table_for_test, unique_name,
};
use crate::support::stand_in::{StandIn, openai};
use crate::{api_call, call_api, received};

/// One statement of a role: the actions it allows, on these resources.
type Statement = (Vec<String>, Vec<String>);

/// What each function's role may do, by function: its statements' actions and resources (`table`, `index/<name>`,
/// `queue` for the attempts queue, else an ARN), from `ONEJOB_TEST_STACK_FUNCTIONS`.
fn granted() -> Option<BTreeMap<String, Vec<Statement>>> {
    let Ok(path) = std::env::var("ONEJOB_TEST_STACK_FUNCTIONS") else {
        assert!(
            std::env::var("CI").is_err(),
            "scripts/test creates the stack"
        );
        return None;
    };
    let functions: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let strings = |v: &Value| -> Vec<String> {
        (v.as_array().unwrap().iter())
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    };
    let queue = |r: String| {
        if r.contains("AttemptsQueue") {
            "queue".to_owned()
        } else {
            r
        }
    };
    Some(
        (functions.as_object().unwrap().iter())
            .map(|(name, f)| {
                let statements = (f["grants"].as_array().unwrap().iter())
                    .map(|g| {
                        let resources = strings(&g["resources"]).into_iter().map(queue).collect();
                        (strings(&g["actions"]), resources)
                    })
                    .collect();
                (name.clone(), statements)
            })
            .collect(),
    )
}

/// What of `sent` no statement of `function`'s allows.
fn denied(grants: &BTreeMap<String, Vec<Statement>>, function: &str, sent: &Sent) -> Vec<String> {
    let statements = &grants[function];
    sent.iter()
        .filter(|(action, resource)| {
            !statements.iter().any(|(actions, resources)| {
                actions.contains(action) && resources.contains(resource)
            })
        })
        .map(|(action, resource)| format!("{action} on {resource}"))
        .collect()
}

#[tokio::test]
async fn every_request_each_function_makes_is_granted_to_its_role() {
    let (Some(aws), Some(grants)) = (sdk_config().await, granted()) else {
        return;
    };
    let provider = StandIn::answering(json!({"summary": "The projector broke."})).await;
    let table = unique_name("onejob-grants");
    table_for_test(&aws_sdk_dynamodb::Client::new(&aws), &table).await;
    let sqs = aws_sdk_sqs::Client::new(&aws);
    let queue_url = queue_for_test(&sqs, "grants").await;
    let mut config = Config::default();
    config.providers.insert(
        ProviderName::parse("demo").unwrap(),
        openai(provider.base_url()),
    );
    config.operators.claim = Some("cognito:groups".into());
    config.operators.value = Some("onejob-operators".into());
    config.allow_private_endpoints = true;
    // Every kind of limit, so that the owners' ledger's requests are made too.
    config.limits.default = OwnerLimits {
        live_jobs: Some(10),
        creates_per_minute: Some(100),
        budget: Some(onejob::domain::Budget {
            period: onejob::domain::Period::Month,
            tokens: Some(1_000_000),
            cost: None,
        }),
        tokens_per_minute: Some(1_000_000),
    };
    let settings = Deployment {
        table,
        queue_url: queue_url.clone(),
        config: config.clone(),
        secret_arn: None,
    };
    let functions_aws = lambda::aws_config(|name| match name {
        "AWS_ENDPOINT_URL" => std::env::var("ONEJOB_TEST_AWS_ENDPOINT").ok(),
        _ => std::env::var(name).ok(),
    })
    .unwrap();
    let (api_sent, worker_sent, sweeper_sent) = (
        Recording::default(),
        Recording::default(),
        Recording::default(),
    );
    let engine = |sent: &Recording, role| {
        let aws = sent.config(&functions_aws);
        let settings = &settings;
        async move { lambda::engine(settings, &aws, role).await.unwrap() }
    };
    let api = Arc::new(engine(&api_sent, Role::API).await);
    let worker = engine(&worker_sent, Role::WORKER).await;
    let sweeper = engine(&sweeper_sent, Role::SWEEPER).await;

    // The api function through every route its document names, as an owner and as an operator.
    let owner = json!({"sub": "alice"});
    let operator = json!({"sub": "ops-1", "cognito:groups": "[onejob-operators]"});
    let call =
        |method: &str, path: &str, claims: &Value, body: Option<Value>, key: Option<&str>| {
            let mut event = api_call(method, path, claims.clone());
            if let Some(body) = body {
                event["body"] = json!(body.to_string());
                event["headers"]["content-type"] = json!("application/json");
            }
            if let Some(key) = key {
                event["headers"]["idempotency-key"] = json!(key);
            }
            let api = api.clone();
            async move { call_api(&api, event).await }
        };
    let create = json!({"contract": "summarize@1", "input": {"text": "Grants."}});
    let (status, made) = call(
        "POST",
        "/v1/jobs",
        &owner,
        Some(create.clone()),
        Some("grants-1"),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let made: Value = serde_json::from_str(&made).unwrap();
    let id = made["id"].as_str().unwrap().to_owned();
    let (_, document) = call("GET", "/openapi.json", &owner, None, None).await;
    let document: Value = serde_json::from_str(&document).unwrap();
    let mut routes = 0;
    for (path, methods) in document["paths"].as_object().unwrap() {
        for method in methods.as_object().unwrap().keys() {
            let path = path
                .replace("{id}", &id)
                .replace("{n}", "1")
                .replace("{number}", "1");
            let body = match (method.as_str(), path.as_str()) {
                ("post", "/v1/jobs") => Some(create.clone()),
                ("put", "/v1/endpoint") => Some(json!({"url": "http://127.0.0.1:9/hook"})),
                ("post", p) if p.ends_with("/attempts") => Some(json!({})),
                _ => None,
            };
            for claims in [&owner, &operator] {
                let verb = method.to_uppercase();
                call(&verb, &path, claims, body.clone(), Some("grants-route")).await;
                routes += 1;
            }
        }
    }
    assert!(routes > 20, "{routes} routes");
    // A job that settles with an endpoint registered, for the worker and the sweeper to deliver.
    let (status, _) = call(
        "PUT",
        "/v1/endpoint",
        &owner,
        Some(json!({"url": "http://127.0.0.1:9/hook"})),
        None,
    )
    .await;
    assert_eq!(status, 200);
    call(
        "POST",
        "/v1/jobs",
        &owner,
        Some(json!({"contract": "summarize@1", "input": {"text": "Runs."}})),
        Some("grants-2"),
    )
    .await;

    // The worker through the messages the api sent; the sweeper through a sweep with everything due.
    let batch = received(&sqs, &queue_url, 2).await;
    lambda::worker(&worker, batch, None).await;
    let deadline =
        onejob::clock::Clock::now(&onejob::clock::SystemClock) + chrono::Duration::seconds(30);
    sweep(&sweeper, Some(deadline)).await.unwrap();

    let mut problems = Vec::new();
    for (function, sent) in [
        ("ApiFunction", api_sent.sent()),
        ("WorkerFunction", worker_sent.sent()),
        ("SweeperFunction", sweeper_sent.sent()),
    ] {
        assert!(!sent.is_empty(), "{function} sent nothing");
        println!("{function}: {sent:?}");
        for missing in denied(&grants, function, &sent) {
            problems.push(format!(
                "{function} sends {missing}, which its role may not"
            ));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
    // The views that need the indexes were among what was sent.
    let api_sent = api_sent.sent();
    for index in ["index/by_owner", "index/sweep"] {
        assert!(
            api_sent.contains(&("dynamodb:Query".to_owned(), index.to_owned())),
            "the api function queries {index}: {api_sent:?}"
        );
    }
}
