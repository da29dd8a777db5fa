//! The three Lambda functions, as library code the thin `src/bin/onejob-*.rs` mains run and the tests drive with
//! real event payloads:
//!
//! - **api**: the same axum [`router`] under `lambda_http`; the owner is the `sub` claim of API
//!   Gateway's JWT authorizer.
//! - **worker**: an SQS batch, one [`process_delivery`] per record (under the `traceparent` the message carries),
//!   reporting only the records that should be retried (`batchItemFailures`).
//! - **sweeper**: one [`sweep`](crate::worker::sweeper::sweep) per scheduled event, batch after batch until its
//!   invocation's [`deadline`]; it alone delivers completion events, so it alone carries the EventBridge client.
//!
//! Each builds its [`Engine`] once per container ([`start`], with its [`Role`]) from the environment: `ONEJOB_TABLE` (DynamoDB),
//! `ONEJOB_QUEUE_URL` (SQS), `ONEJOB_CONFIG` (the `onejob.toml` of the stack's config layer, which `onejob serve`
//! and `onejob qualify` read too: providers, chains, limits, contract files beside it), optionally
//! `ONEJOB_SECRET_ARN` (the Secrets Manager secret with the provider keys) and `ONEJOB_EVENT_BUS` (the EventBridge
//! bus every settled job's event goes to). The built-in contracts are compiled in; a team's are files in its layer. Logs are JSON; after each invocation one CloudWatch Embedded Metric Format line
//! carries the counts of attempts by outcome, replays, conflicts and races lost, and, when a collector is
//! configured (`OTEL_EXPORTER_OTLP_ENDPOINT`, e.g. the ADOT layer's), the invocation's spans are exported before
//! it answers.

use std::sync::Arc;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use aws_sdk_dynamodb::config::{Credentials, SharedCredentialsProvider};
use axum::Router;
use futures_util::future::join_all;

use crate::clock::SystemClock;
use crate::config::env::{self, Env};
use crate::config::{Config, ConfigError};
use crate::domain::Timestamp;
use crate::engine::{Engine, Parts};
use crate::http::auth::Auth;
use crate::http::{AppState, router};
use crate::metrics::Metrics;
use crate::queue::Delivery;
use crate::queue::sqs::SqsQueue;
use crate::startup::{self, Process, Role, StartError};
use crate::store::dynamodb::DynamoStore;
use crate::telemetry::{self, trace};
use crate::worker::process_delivery;

/// The stack a function runs in: where its engine keeps jobs and sends attempts, its config, and where its provider
/// keys are.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub table: String,
    pub queue_url: String,
    pub config: Config,
    /// The Secrets Manager secret holding the provider keys, if any.
    pub secret_arn: Option<String>,
}

impl Deployment {
    /// From the environment (`var` reads a variable): `ONEJOB_TABLE`, `ONEJOB_QUEUE_URL`, `ONEJOB_CONFIG` (the
    /// config layer's `onejob.toml`, read as [`Config::load_deployed`] says: the providers it names and no demo
    /// ones, its contract files beside it), and the optional `ONEJOB_SECRET_ARN` and `ONEJOB_EVENT_BUS` (the
    /// config's environment, as [`Env`] reads it).
    pub fn from(var: impl Fn(&str) -> Option<String>) -> Result<Self, StartError> {
        let env = Env::from(var);
        let missing = |name: &str| StartError::Config(ConfigError::Missing(name.to_owned()));
        let path = env.config.as_deref().ok_or_else(|| missing(env::CONFIG))?;
        let mut config = Config::load_deployed(path)?;
        env.apply(&mut config);
        Ok(Self {
            table: env.table.ok_or_else(|| missing(env::TABLE))?,
            queue_url: env.queue_url.ok_or_else(|| missing(env::QUEUE_URL))?,
            config,
            secret_arn: env.secret_arn,
        })
    }
}

/// What a function does when its container starts: JSON logs, the settings and the AWS SDK's config from the
/// environment, and the engine of its `role` ([`engine`]). A start that fails logs why, whole (the file, the line,
/// the fix), before the runtime reports it.
pub async fn start(role: Role) -> Result<(Deployment, Arc<Engine>), StartError> {
    crate::telemetry::init_json();
    let var = |name: &str| std::env::var(name).ok();
    let started = async {
        let settings = Deployment::from(var)?;
        let engine = engine(&settings, &aws_config(var)?, role).await?;
        Ok((settings, Arc::new(engine)))
    }
    .await;
    if let Err(e) = &started {
        tracing::error!(error = %crate::telemetry::error_chain(e), "onejob cannot start");
    }
    started
}

/// The AWS SDK's config of a function, from what Lambda puts in its environment (`env` reads a variable): the
/// execution role's credentials (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`), `AWS_REGION`,
/// `AWS_ENDPOINT_URL` and each service's own (`AWS_ENDPOINT_URL_BEDROCK_RUNTIME`, …) if set; onejob's HTTPS
/// client. Not aws-config's default chain: its profile files, SSO, STS and instance-metadata providers serve other
/// hosts, and would weigh on every package (BENCHMARKS.md, section 5). Retries, timeouts and the sleep and time
/// sources are each client's defaults.
pub fn aws_config(
    env: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
) -> Result<SdkConfig, StartError> {
    let var = |name: &str| {
        env(name).ok_or_else(|| StartError::Config(ConfigError::Missing(name.to_owned())))
    };
    let credentials = Credentials::new(
        var("AWS_ACCESS_KEY_ID")?,
        var("AWS_SECRET_ACCESS_KEY")?,
        env("AWS_SESSION_TOKEN"),
        None,
        "lambda-environment",
    );
    let builder = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(var("AWS_REGION")?))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .http_client(startup::https_client());
    let builder = match env("AWS_ENDPOINT_URL") {
        Some(url) => builder.endpoint_url(url),
        None => builder,
    };
    Ok(builder.service_config(ServiceEnv(Box::new(env))).build())
}

/// The settings of one AWS service that its SDK client reads from the environment, by the SDK's own names: the
/// key's variable and the service's id (`AWS_ENDPOINT_URL` + `Bedrock Runtime` =
/// `AWS_ENDPOINT_URL_BEDROCK_RUNTIME`).
struct ServiceEnv(Box<EnvReader>);

/// Reads one environment variable.
type EnvReader = dyn Fn(&str) -> Option<String> + Send + Sync;

impl std::fmt::Debug for ServiceEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceEnv")
    }
}

impl aws_types::service_config::LoadServiceConfig for ServiceEnv {
    fn load_config(&self, key: aws_types::service_config::ServiceConfigKey<'_>) -> Option<String> {
        let service = key.service_id().to_uppercase().replace(' ', "_");
        (self.0)(&format!("{}_{service}", key.env()))
    }
}

/// The parts of a function's engine, as its `role` needs them: DynamoDB (arming every ended job's deliveries if the
/// config names a bus), SQS, the config's contracts on its chains; its providers' clients with the keys of the
/// secret where the role calls them (the api function's are described, not called: it reads no key and carries no
/// provider client's code); the bus's client where it delivers (the sweeper: the other functions do not carry its
/// code).
pub async fn parts(
    settings: &Deployment,
    aws: &SdkConfig,
    role: Role,
) -> Result<Parts, StartError> {
    let keys = role.keys(aws, settings.secret_arn.as_deref()).await?;
    let store = DynamoStore::new(aws_sdk_dynamodb::Client::new(aws), &settings.table)
        .arming_every_job(settings.config.event_bus.is_some());
    let queue = SqsQueue::new(aws_sdk_sqs::Client::new(aws), &settings.queue_url);
    let process = Process {
        store: Arc::new(store),
        queue: Arc::new(queue),
        clock: Arc::new(SystemClock),
        metrics: Metrics::emf(),
    };
    startup::parts(&settings.config, role, &keys, process)
}

/// A function's engine ([`parts`]); its first log line names what it serves.
pub async fn engine(
    settings: &Deployment,
    aws: &SdkConfig,
    role: Role,
) -> Result<Engine, StartError> {
    let parts = parts(settings, aws, role).await?;
    let engine = Engine::new(parts, settings.config.engine_settings());
    let served = engine.served();
    tracing::info!(
        config = %served.config.unwrap_or_default(),
        contracts = %served.contracts,
        served = %engine.contracts.iter().map(|c| c.reference.to_string()).collect::<Vec<_>>().join(","),
        ?role,
        "onejob starts"
    );
    Ok(engine)
}

/// The API function's router: owners (and operators, by the config's claim) come from the JWT authorizer's claims;
/// each answer is followed by the invocation's metrics line.
pub fn api(engine: Arc<Engine>, config: &Config) -> Router {
    let metrics = engine.clone();
    router(AppState {
        engine,
        auth: Arc::new(Auth::JwtClaims {
            operators: config.operators.claim(),
        }),
        body_limit: config.body_limit_bytes,
    })
    .layer(axum::middleware::map_response(
        move |response: axum::response::Response| {
            let metrics = metrics.clone();
            async move {
                end_invocation(&metrics).await;
                response
            }
        },
    ))
}

/// Listening stops this long before the invocation's deadline, to leave time to record what was heard.
const DEADLINE_MARGIN_MS: i64 = 2_000;

/// The invocation's deadline, less a margin, as the worker's listening limit.
pub fn deadline(context: &lambda_runtime::Context) -> Option<Timestamp> {
    let ms = i64::try_from(context.deadline).ok()? - DEADLINE_MARGIN_MS;
    chrono::DateTime::from_timestamp_millis(ms)
}

/// Runs every record of an SQS batch (side by side) and names the ones to deliver again: those whose step failed
/// on the store. A record that names no attempt is logged and acknowledged, since no retry can mend it; one whose
/// attempt is already claimed or finished is acknowledged by the step itself.
pub async fn worker(
    engine: &Engine,
    event: SqsEvent,
    deadline: Option<Timestamp>,
) -> SqsBatchResponse {
    let steps = event.records.into_iter().map(|record| async move {
        let id = record.message_id.clone().unwrap_or_default();
        let body = record.body.as_deref().unwrap_or_default();
        let delivery = match SqsQueue::parse(body) {
            Ok(message) => Delivery {
                message,
                traceparent: record
                    .message_attributes
                    .get(trace::TRACEPARENT)
                    .and_then(|a| a.string_value.clone()),
            },
            Err(e) => {
                tracing::error!(message_id = %id, error = %e, "not an attempt message: acknowledged and dropped");
                return None;
            }
        };
        match process_delivery(engine, &delivery, deadline).await {
            Ok(_) => None,
            Err(e) => {
                tracing::error!(message_id = %id, job_id = %delivery.message.attempt.job_id, error = %crate::telemetry::error_chain(&e), "step failed: will be retried");
                Some(id)
            }
        }
    });
    let mut response = SqsBatchResponse::default();
    response.batch_item_failures = join_all(steps)
        .await
        .into_iter()
        .flatten()
        .map(|id| {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            failure
        })
        .collect();
    response
}

/// Prints the metrics lines of the invocation that just ended (one per label set), and exports its spans.
pub async fn end_invocation(engine: &Engine) {
    flush_metrics(engine);
    telemetry::flush().await;
}

fn flush_metrics(engine: &Engine) {
    for line in engine
        .metrics
        .drain_emf(engine.clock.now().timestamp_millis())
    {
        println!("{line}");
    }
}
