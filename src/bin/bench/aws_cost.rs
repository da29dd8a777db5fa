//! `aws-cost`: what onejob itself costs on AWS per million jobs. Jobs run through the api and worker functions'
//! own code (their engines as `onejob::lambda` makes them) against moto, every AWS request counted at the HTTP
//! client by its operation; DynamoDB's write units come from its sizing rules on the job's own items, a read is a
//! unit (each is a consistent read of an item under 4 KB), and each function's time is measured here. Priced at the
//! list prices below, beside Step Functions Standard making the same transitions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use onejob::domain::{Job, Owner, Stamp};
use onejob::http::auth::{Auth, Tokens};
use onejob::http::{AppState, router};
use onejob::lambda::{self, Deployment};
use onejob::startup::Role;
use onejob::store::dynamodb::write_units;
use serde_json::{Value, json};

use super::{RETENTION, instant_config, intent};

/// List prices, us-east-1, as AWS publishes them (read 2026-12; DynamoDB's on-demand prices since its cut of
/// 2024-11-01), in US dollars.
mod price {
    /// DynamoDB on demand: a million write request units; a million read request units.
    pub(super) const WRITE_UNITS: f64 = 0.625;
    pub(super) const READ_UNITS: f64 = 0.125;
    /// SQS standard queue: a million requests.
    pub(super) const SQS_REQUESTS: f64 = 0.40;
    /// Lambda on arm64: a million requests; a GB-second.
    pub(super) const LAMBDA_REQUESTS: f64 = 0.20;
    pub(super) const LAMBDA_GB_SECOND: f64 = 0.000_013_333_4;
    /// API Gateway HTTP API: a million requests.
    pub(super) const API_REQUESTS: f64 = 1.00;
    /// Step Functions Standard: a thousand state transitions.
    pub(super) const STEP_FUNCTIONS_TRANSITIONS: f64 = 0.025;
}

/// The functions' memory (template.yaml's `MemorySize`), in GB.
const MEMORY_GB: f64 = 0.25;

/// Counts each AWS request by its operation (`x-amz-target`: `DynamoDB_20120810.PutItem`, `AmazonSQS.SendMessage`).
#[derive(Debug, Clone, Default)]
struct Counted(Arc<Mutex<BTreeMap<String, usize>>>);

impl Counted {
    fn take(&self) -> BTreeMap<String, usize> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[derive(Debug)]
struct Counting {
    inner: SharedHttpClient,
    counted: Counted,
}

#[derive(Debug)]
struct CountingConnector {
    inner: SharedHttpConnector,
    counted: Counted,
}

impl HttpConnector for CountingConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let operation = request
            .headers()
            .get("x-amz-target")
            .unwrap_or("other")
            .to_owned();
        *self.counted.0.lock().unwrap().entry(operation).or_default() += 1;
        self.inner.call(request)
    }
}

impl HttpClient for Counting {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(CountingConnector {
            inner: self.inner.http_connector(settings, components),
            counted: self.counted.clone(),
        })
    }
}

/// What a job asked of one service, on average.
fn per_job(counts: &BTreeMap<String, usize>, jobs: usize, prefix: &str) -> f64 {
    let sum: usize = (counts.iter())
        .filter(|(op, _)| op.starts_with(prefix))
        .map(|(_, n)| n)
        .sum();
    sum as f64 / jobs as f64
}

pub(super) async fn aws_cost(jobs: usize, model_seconds: f64) {
    let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") else {
        eprintln!("aws-cost needs AWS_ENDPOINT_URL (moto: see BENCHMARKS.md)");
        std::process::exit(2);
    };
    let counted = Counted::default();
    let env = move |name: &str| match name {
        "AWS_ENDPOINT_URL" => Some(endpoint.clone()),
        "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("test".into()),
        "AWS_REGION" => Some("us-east-1".into()),
        _ => None,
    };
    let functions = lambda::aws_config(env).unwrap();
    let aws = functions
        .to_builder()
        .http_client(SharedHttpClient::new(Counting {
            inner: onejob::startup::https_client(),
            counted: counted.clone(),
        }))
        .build();
    let table = format!("bench-cost-{}", std::process::id());
    let store =
        onejob::store::dynamodb::DynamoStore::new(aws_sdk_dynamodb::Client::new(&aws), &table);
    store.create_table().await.unwrap();
    let sqs = aws_sdk_sqs::Client::new(&aws);
    let queue_url = sqs
        .create_queue()
        .queue_name(&table)
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let settings = Deployment {
        table,
        queue_url: queue_url.clone(),
        config: instant_config(),
        secret_arn: None,
    };
    let api = Arc::new(lambda::engine(&settings, &aws, Role::API).await.unwrap());
    let worker = lambda::engine(&settings, &aws, Role::WORKER).await.unwrap();
    let token = "bench-token";
    let owner = Owner::parse("alice").unwrap();
    let app = router(AppState {
        engine: api,
        auth: Arc::new(Auth::Tokens(Tokens::new(
            [(token.to_owned(), owner.clone())].into(),
            Default::default(),
        ))),
        body_limit: 256 * 1024,
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    counted.take();

    let (mut api_time, mut worker_time) = (Duration::ZERO, Duration::ZERO);
    let mut created: Option<Job> = None;
    for i in 0..jobs {
        let body = json!({"contract": "summarize@1", "input": {"text": "The projector broke. The meeting moved to Thursday."}});
        let started = Instant::now();
        let answer = http
            .post(format!("{base}/v1/jobs"))
            .bearer_auth(token)
            .header("idempotency-key", format!("cost-{i}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 201);
        let job: Value = answer.json().await.unwrap();
        api_time += started.elapsed();
        let id = job["id"].as_str().unwrap().to_owned();

        // The event source's work: receive the message, run the worker, delete it.
        let received = sqs
            .receive_message()
            .queue_url(&queue_url)
            .max_number_of_messages(1)
            .send()
            .await
            .unwrap();
        let mut records = Vec::new();
        for m in received.messages() {
            let mut record = SqsMessage::default();
            record.message_id = m.message_id().map(str::to_owned);
            record.body = m.body().map(str::to_owned);
            records.push(record);
        }
        let mut event = SqsEvent::default();
        event.records = records;
        let started = Instant::now();
        let response = lambda::worker(&worker, event, None).await;
        worker_time += started.elapsed();
        assert!(response.batch_item_failures.is_empty());
        for m in received.messages() {
            sqs.delete_message()
                .queue_url(&queue_url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }

        // The client reads its result once.
        let started = Instant::now();
        let answer = http
            .get(format!("{base}/v1/jobs/{id}"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let done: Value = answer.json().await.unwrap();
        api_time += started.elapsed();
        assert_eq!(done["status"], "succeeded");
        if created.is_none() {
            created = Some(Job::new(
                intent(
                    &owner,
                    "units",
                    "The projector broke. The meeting moved to Thursday.",
                ),
                RETENTION,
                &Stamp::fresh(chrono::Utc::now()),
            ));
        }
    }
    let counts = counted.take();

    // DynamoDB's units: the write rules on this very job's items; a read is a unit (consistent, under 4 KB).
    let job = created.expect("at least one job");
    let write_units = write_units_of(&job) as f64;
    let reads = per_job(&counts, jobs, "DynamoDB_20120810.GetItem")
        + per_job(&counts, jobs, "DynamoDB_20120810.Query");
    let writes = per_job(&counts, jobs, "DynamoDB_20120810.PutItem")
        + per_job(&counts, jobs, "DynamoDB_20120810.UpdateItem");
    let sqs_requests = per_job(&counts, jobs, "AmazonSQS.");
    let (api_ms, worker_ms) = (
        api_time.as_secs_f64() * 1e3 / jobs as f64,
        worker_time.as_secs_f64() * 1e3 / jobs as f64,
    );
    // Per job: two API requests and invocations (create, one read), one worker invocation (a batch of one).
    let lambda_invocations = 3.0;
    let own_gb_s = (api_ms + worker_ms) / 1e3 * MEMORY_GB;
    let model_gb_s = model_seconds * MEMORY_GB;
    let million = 1e6;
    let rows = [
        (
            "DynamoDB write units",
            write_units,
            price::WRITE_UNITS / million,
        ),
        ("DynamoDB read units", reads, price::READ_UNITS / million),
        ("SQS requests", sqs_requests, price::SQS_REQUESTS / million),
        (
            "Lambda invocations",
            lambda_invocations,
            price::LAMBDA_REQUESTS / million,
        ),
        (
            "Lambda GB-s, onejob's own",
            own_gb_s,
            price::LAMBDA_GB_SECOND,
        ),
        ("API Gateway requests", 2.0, price::API_REQUESTS / million),
    ];
    println!(
        "aws-cost: {jobs} jobs through the api and worker functions' code on moto (a demo provider answering at once)"
    );
    println!("  AWS requests by operation: {counts:?}");
    println!(
        "  DynamoDB requests a job: {writes:.2} writes, {reads:.2} reads; measured here: api {api_ms:.2} ms a job (2 requests), worker {worker_ms:.2} ms"
    );
    println!(
        "  {:<32} {:>12} {:>18}",
        "per job", "quantity", "$ per million jobs"
    );
    let mut total = 0.0;
    for (name, quantity, unit_price) in rows {
        let cost = quantity * unit_price * million;
        total += cost;
        println!("  {name:<32} {quantity:>12.4} {cost:>18.2}");
    }
    println!("  {:<32} {:>12} {total:>18.2}", "onejob, all told", "");
    let waiting = model_gb_s * price::LAMBDA_GB_SECOND * million;
    println!(
        "  {:<32} {model_gb_s:>12.4} {waiting:>18.2}",
        format!("+ worker waiting {model_seconds} s on the model")
    );
    // The same transitions as a Step Functions Standard workflow: start, record the job, call, record the result,
    // end — five states entered, the store's writes and the call's compute still to pay beside them.
    let transitions = 5.0;
    let step_functions = transitions * price::STEP_FUNCTIONS_TRANSITIONS / 1e3 * million;
    println!(
        "  {:<32} {transitions:>12.4} {step_functions:>18.2}",
        "Step Functions Standard transitions"
    );
    println!(
        "  onejob's orchestration is {:.1}% of Step Functions Standard's transitions alone",
        total / step_functions * 100.0
    );
    println!(
        "  fixed, whatever the load: the sweeper once a minute (43,800 invocations a month) and its queries; the \
         event source's empty long polls"
    );
}

/// The write units of a job's create, claim and completion, by DynamoDB's sizing rules.
fn write_units_of(new: &Job) -> u64 {
    let now = chrono::Utc::now();
    let mut claimed = new.clone();
    claimed
        .claim(1, now + chrono::Duration::minutes(5), &Stamp::fresh(now))
        .unwrap();
    let mut done = claimed.clone();
    done.complete(
        1,
        json!({"summary": "The projector broke."}),
        Default::default(),
        &Stamp::fresh(now),
    )
    .unwrap();
    write_units(None, new).total()
        + write_units(Some(new), &claimed).total()
        + write_units(Some(&claimed), &done).total()
}
