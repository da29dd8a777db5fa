//! The Lambda handlers fed the payloads in `events/`, in process, against the AWS test server (DynamoDB and SQS on
//! moto) and a provider stand-in: api create → message on the queue → worker batch (with a duplicate) → api get.

mod access;
mod bus;
mod deploy;
mod grants;
#[path = "../support/mod.rs"]
mod support;
mod traces;

use std::path::Path;
use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_http::request::LambdaRequest;
use lambda_http::{Adapter, Context, LambdaEvent, Service};
use onejob::config::Config;
use onejob::domain::{JobId, ProviderName, SinkKind};
use onejob::engine::Engine;
use onejob::lambda::{self, Deployment};
use onejob::providers::ProviderKind;
use onejob::sinks::bus::BusSink;
use onejob::startup::Role;
use onejob::store::EventStore;
use onejob::store::dynamodb::DynamoStore;
use onejob::telemetry::otlp::Traces;
use onejob::telemetry::trace;
use onejob::worker::sweeper::sweep;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};
use support::aws::{
    WireFault, bus_for_test, drain, queue_for_test, sdk_config, table_for_test, unique_name,
};
use support::collector::Collector;
use support::stand_in::{Reply, StandIn, openai};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

fn event(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The job the event files name (alice's key `lambda-demo-1`, created at 2026-12-01T00:00:00Z).
const EVENTS_JOB: &str = "job_c93ad8e3d05dd0142f00a17c6f511a74_mx3xkao0";

/// An event file naming `id` instead of the job the files name: the functions run on the real clock, so the job
/// they make has the same intent but another creation time, hence another id.
fn event_for(name: &str, id: &str) -> Value {
    serde_json::from_str(&event(name).to_string().replace(EVENTS_JOB, id)).unwrap()
}

struct Functions {
    engine: Arc<Engine>,
    /// The functions' table, for what a test looks at behind their back.
    store: DynamoStore,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    provider: StandIn,
    /// What the engine was made of, for the sweeper's own.
    settings: Deployment,
    functions_aws: aws_config::SdkConfig,
}

/// The functions' engine on a fresh table and queue, the contracts' default provider answering from a stand-in.
async fn functions() -> Option<Functions> {
    let provider = StandIn::answering(json!({"summary": "The projector broke."})).await;
    functions_with(provider, |_| {}, None).await
}

/// The functions' engine on a fresh table and queue, the contracts' default provider (`demo`) being `provider`,
/// the config as `configure` leaves it, the provider keys in the secret `secret_arn`.
async fn functions_with(
    provider: StandIn,
    configure: impl FnOnce(&mut Config),
    secret_arn: Option<String>,
) -> Option<Functions> {
    let aws = sdk_config().await?;
    let table = unique_name("onejob-lambda");
    table_for_test(&aws_sdk_dynamodb::Client::new(&aws), &table).await;
    let sqs = aws_sdk_sqs::Client::new(&aws);
    let queue_url = queue_for_test(&sqs, "attempts").await;
    let mut config = Config::default();
    config.providers.insert(
        ProviderName::parse("demo").unwrap(),
        openai(provider.base_url()),
    );
    configure(&mut config);
    let settings = Deployment {
        table,
        queue_url: queue_url.clone(),
        config,
        secret_arn,
    };
    // The functions' own SDK config, made as on Lambda from the environment (moto's endpoint as AWS_ENDPOINT_URL).
    let functions_aws = lambda::aws_config(|name| match name {
        "AWS_ENDPOINT_URL" => std::env::var("ONEJOB_TEST_AWS_ENDPOINT").ok(),
        _ => std::env::var(name).ok(),
    })
    .unwrap();
    let engine = Arc::new(
        lambda::engine(&settings, &functions_aws, Role::WORKER)
            .await
            .unwrap(),
    );
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(&aws), &settings.table);
    Some(Functions {
        engine,
        store,
        sqs,
        queue_url,
        provider,
        settings,
        functions_aws,
    })
}

impl Functions {
    /// Runs an API Gateway event through the api function, as `lambda_http::run` does; (status, JSON body).
    async fn api(&self, name: &str) -> (u16, Value) {
        self.api_event(event(name)).await
    }

    async fn api_event(&self, event: Value) -> (u16, Value) {
        let (status, body) = self.api_raw(event).await;
        (status, serde_json::from_str(&body).unwrap())
    }

    /// The status and the body text the api function answers `event` with.
    async fn api_raw(&self, event: Value) -> (u16, String) {
        call_api(&self.engine, event).await
    }

    /// Runs the messages on the queue, each twice, through the worker function, which retries none.
    async fn work_the_queue(&self) {
        let batch = self.received_with_duplicates().await;
        let response = lambda::worker(&self.engine, batch, None).await;
        assert!(response.batch_item_failures.is_empty());
    }

    /// The messages on the queue, as the SQS event a worker would get: each real message, then a duplicate of it.
    async fn received_with_duplicates(&self) -> SqsEvent {
        received(&self.sqs, &self.queue_url, 2).await
    }
}

/// The api function's config as the tests deploy it: its operators are the callers in the `onejob-operators` group.
fn api_config() -> Config {
    let mut config = Config::default();
    config.operators.claim = Some("cognito:groups".into());
    config.operators.value = Some("onejob-operators".into());
    config
}

/// Runs an API Gateway event through the api function on `engine`, as `lambda_http::run` does: the status and the
/// body text.
pub(crate) async fn call_api(engine: &Arc<Engine>, event: Value) -> (u16, String) {
    let request: LambdaRequest = serde_json::from_value(event).unwrap();
    let mut function = Adapter::from(lambda::api(engine.clone(), &api_config()));
    let response = function
        .call(LambdaEvent::new(request, Context::default()))
        .await
        .unwrap();
    let response = serde_json::to_value(response).unwrap();
    let body = response["body"].as_str().unwrap_or_default().to_owned();
    (response["statusCode"].as_u64().unwrap() as u16, body)
}

/// The messages on the queue at `queue_url`, as the SQS event a worker would get: each real message `copies` times
/// (a duplicate delivery after the first).
pub(crate) async fn received(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    copies: usize,
) -> SqsEvent {
    let received = sqs
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap();
    let mut records = Vec::new();
    for (i, message) in received.messages().iter().enumerate() {
        // As Lambda hands them over: {"traceparent": {"stringValue": …, "dataType": "String", …}}.
        let attributes: serde_json::Map<String, Value> = message
            .message_attributes()
            .into_iter()
            .flatten()
            .map(|(name, value)| {
                let value = json!({
                    "stringValue": value.string_value(), "dataType": value.data_type(),
                    "stringListValues": [], "binaryListValues": [],
                });
                (name.clone(), value)
            })
            .collect();
        for copy in 0..copies {
            records.push(json!({
                "messageId": format!("{}-{copy}", message.message_id().unwrap_or(&i.to_string())),
                "receiptHandle": message.receipt_handle(),
                "body": message.body(),
                "attributes": {}, "messageAttributes": attributes,
                "eventSource": "aws:sqs", "awsRegion": "us-east-1",
            }));
        }
    }
    serde_json::from_value(json!({"Records": records})).unwrap()
}

#[tokio::test]
async fn a_job_goes_from_the_api_event_through_the_queue_and_the_worker_to_succeeded() {
    let Some(f) = functions().await else { return };
    let (status, created) = f.api("api-create.json").await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();

    let (status, replayed) = f.api("api-replay.json").await;
    assert_eq!((status, &replayed["id"]), (200, &json!(id)));
    let (status, conflict) = f.api("api-conflict.json").await;
    assert_eq!(
        (status, &conflict["code"], &conflict["job_id"]),
        (409, &json!("idempotency_key_reused"), &json!(id))
    );

    let batch = f.received_with_duplicates().await;
    assert_eq!(batch.records.len(), 2, "one message, delivered twice");
    // No traces exported here: the message carries the job's root, for a worker that exports to join.
    let (trace, root) = trace::ids(&JobId::parse(&id).unwrap());
    assert_eq!(
        batch.records[0].message_attributes[trace::TRACEPARENT].string_value,
        Some(format!("00-{trace}-{root}-01"))
    );
    let response = lambda::worker(&f.engine, batch, None).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(
        f.provider.call_count(),
        1,
        "the duplicate made no second call"
    );

    // What the worker recorded, as EMF documents: one per label set, the labels its dimensions, histograms as
    // values. (The api function printed its own after each answer, these too: its creates are not left.)
    let documents: Vec<Value> = f
        .engine
        .metrics
        .drain_emf(0)
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let find = |dimensions: Value, metric: &str| -> Value {
        documents
            .iter()
            .find(|d| {
                d["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == json!([dimensions, []])
                    && d.get(metric).is_some()
            })
            .unwrap_or_else(|| panic!("no {metric} by {dimensions} in {documents:#?}"))
            .clone()
    };
    assert!(
        documents
            .iter()
            .all(|d| d.get("onejob_creates_total").is_none()),
        "{documents:#?}"
    );
    let waited = find(json!(["contract", "provider"]), "onejob_queue_wait_seconds");
    assert_eq!(
        (&waited["contract"], &waited["provider"]),
        (&json!("summarize"), &json!("demo"))
    );
    assert_eq!(
        waited["onejob_queue_wait_seconds"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let called = find(
        json!(["provider", "model", "outcome"]),
        "onejob_provider_call_seconds",
    );
    assert_eq!(
        (&called["provider"], &called["outcome"]),
        (&json!("demo"), &json!("answered"))
    );
    assert_eq!(
        called["model"], "gpt-4o-mini",
        "the configured model, not the one the answer names (stand-in-model)"
    );
    assert_eq!(
        called["onejob_provider_call_seconds"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "the duplicate made no call"
    );
    let ended = find(json!(["contract", "outcome"]), "onejob_attempts_per_job");
    assert_eq!(
        (&ended["outcome"], &ended["onejob_attempts_per_job"]),
        (&json!("succeeded"), &json!([1.0]))
    );
    let succeeded = documents
        .iter()
        .find(|d| d["state"] == "succeeded")
        .expect("the attempt's end");
    assert_eq!(succeeded["onejob_attempts_total"], 1);
    assert_eq!(
        succeeded["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        json!([["contract", "provider", "state"], ["state"], []]),
        "also by state alone, which the template's alarm on unknown attempts watches"
    );

    let (status, job) = f.api_event(event_for("api-get.json", &id)).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&job["id"], &job["status"]),
        (&json!(id), &json!("succeeded"))
    );
    assert_eq!(job["result"], json!({"summary": "The projector broke."}));
    let (status, other) = f
        .api_event(event_for("api-get-other-owner.json", &id))
        .await;
    assert_eq!((status, &other["code"]), (404, &json!("job_not_found")));
}

/// The payloads are the ones the handlers are documented with: the get event names a job of the intent the create
/// event sends (an id's intent part is derived from owner and key), and the SQS batch names it twice.
/// A function's SDK config is what Lambda's environment says, and a missing variable is named.
#[test]
fn a_functions_sdk_config_comes_from_lambdas_environment() {
    let lambda = |name: &str| {
        [
            ("AWS_ACCESS_KEY_ID", "ASIAEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_SESSION_TOKEN", "session"),
            ("AWS_REGION", "eu-west-1"),
        ]
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_owned())
    };
    let config = lambda::aws_config(lambda).unwrap();
    assert_eq!(config.region().map(|r| r.as_ref()), Some("eu-west-1"));
    assert_eq!(config.endpoint_url(), None);
    assert!(config.credentials_provider().is_some());
    let missing = lambda::aws_config(move |name| lambda(name).filter(|_| name != "AWS_REGION"))
        .unwrap_err()
        .to_string();
    assert!(missing.contains("AWS_REGION"), "{missing}");
}

#[tokio::test]
async fn the_event_files_describe_one_job() {
    let created_at = chrono::DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z").unwrap();
    let id = JobId::derive(
        &onejob::domain::Owner::parse("alice").unwrap(),
        &onejob::domain::IdempotencyKey::parse("lambda-demo-1").unwrap(),
        created_at.to_utc(),
    );
    assert_eq!(id.as_str(), EVENTS_JOB);
    assert_eq!(event("api-get.json")["rawPath"], format!("/v1/jobs/{id}"));
    let batch: SqsEvent = serde_json::from_value(event("sqs-batch-with-duplicate.json")).unwrap();
    let bodies: Vec<_> = batch
        .records
        .iter()
        .map(|r| r.body.clone().unwrap())
        .collect();
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0], bodies[1]);
    let named = onejob::queue::sqs::SqsQueue::parse(&bodies[0]).unwrap();
    assert_eq!((named.attempt.job_id, named.attempt.number), (id, 1));
}

/// Every file in `events/` through its handler: the SQS batch with its duplicate makes one call and no failure;
/// the schedule event sweeps; a malformed record is acknowledged, not retried forever.
#[tokio::test]
async fn the_worker_and_sweeper_events_run_through_their_handlers() {
    let Some(f) = functions().await else { return };
    let (status, created) = f.api("api-create.json").await;
    assert_eq!(status, 201);
    let id = created["id"].as_str().unwrap();
    let batch: SqsEvent =
        serde_json::from_value(event_for("sqs-batch-with-duplicate.json", id)).unwrap();
    let response = lambda::worker(&f.engine, batch, None).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(f.provider.call_count(), 1);
    let (_, job) = f.api_event(event_for("api-get.json", id)).await;
    assert_eq!(job["status"], "succeeded");

    assert_eq!(event("schedule.json")["detail-type"], "Scheduled Event");
    let swept = sweep(&f.engine, None).await.unwrap();
    assert_eq!((swept.expired, swept.redispatched), (0, 0));

    let garbage: SqsEvent =
        serde_json::from_value(json!({"Records": [{"messageId": "m-1", "body": "not json"}]}))
            .unwrap();
    assert!(
        lambda::worker(&f.engine, garbage, None)
            .await
            .batch_item_failures
            .is_empty()
    );
}

/// An API Gateway event of `method` on `path` (with its query), from a caller whose verified claims are `claims`.
pub(crate) fn api_call(method: &str, path: &str, claims: Value) -> Value {
    let mut call = event("api-get.json");
    let (bare, query) = path.split_once('?').unwrap_or((path, ""));
    call["rawPath"] = json!(bare);
    call["rawQueryString"] = json!(query);
    call["requestContext"]["http"]["path"] = json!(bare);
    call["requestContext"]["http"]["method"] = json!(method);
    call["requestContext"]["authorizer"]["jwt"]["claims"] = claims;
    call
}

/// The functions read the provider keys from the Secrets Manager secret at start: the provider gets its key from
/// there, and an answer that echoes the key back never brings it into the store (nor the logs that quote it). A
/// rotated secret is not read again for every call, but once the provider refused the key: the next call carries
/// the new one, with no redeploy.
#[tokio::test]
async fn provider_keys_come_from_the_secret_and_never_reach_the_store() {
    let Some(aws) = sdk_config().await else {
        return;
    };
    let secret = aws_sdk_secretsmanager::Client::new(&aws)
        .create_secret()
        .name(unique_name("onejob-provider-keys"))
        .secret_string(r#"{"OPENAI_API_KEY": "sk-from-the-secret-42"}"#)
        .send()
        .await
        .unwrap();
    let provider = StandIn::spawn(
        vec![Reply::Status(
            401,
            r#"{"error": {"message": "Incorrect API key provided: sk-from-the-secret-42"}}"#,
        )],
        Reply::Answer(json!({"summary": "unused"})),
    )
    .await;
    let keyed = |config: &mut Config| {
        let demo = ProviderName::parse("demo").unwrap();
        let Some(ProviderKind::Openai(endpoint)) =
            config.providers.get_mut(&demo).map(|p| &mut p.kind)
        else {
            panic!("the functions' demo provider is an openai stand-in")
        };
        endpoint.api_key_env = Some("OPENAI_API_KEY".into());
    };
    let Some(f) = functions_with(provider, keyed, secret.arn.clone()).await else {
        return;
    };
    // Rotated after the function read it: the first call still carries the key it read.
    aws_sdk_secretsmanager::Client::new(&aws)
        .put_secret_value()
        .secret_id(secret.arn.unwrap())
        .secret_string(r#"{"OPENAI_API_KEY": "sk-rotated-43"}"#)
        .send()
        .await
        .unwrap();
    let (status, created) = f.api("api-create.json").await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    f.work_the_queue().await;
    let calls = f.provider.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].headers["authorization"],
        "Bearer sk-from-the-secret-42"
    );
    let (_, job) = f.api_event(event_for("api-get.json", id)).await;
    let error = &job["attempts"][0]["error"];
    assert_eq!(error["code"], "provider_refused", "{job}");
    assert!(
        error["message"].as_str().unwrap().contains("[redacted]"),
        "{job}"
    );
    assert!(!job.to_string().contains("sk-from-the-secret-42"), "{job}");

    // The key was refused: the next call reads the secret again first, and carries the rotated key.
    let mut again = event("api-create.json");
    again["headers"]["idempotency-key"] = json!("after-the-rotation");
    let (status, created) = f.api_event(again).await;
    assert_eq!(status, 201, "{created}");
    f.work_the_queue().await;
    let calls = f.provider.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].headers["authorization"], "Bearer sk-rotated-43");
    let (_, job) = f
        .api_event(event_for("api-get.json", created["id"].as_str().unwrap()))
        .await;
    assert_eq!(job["status"], "succeeded", "{job}");
}
