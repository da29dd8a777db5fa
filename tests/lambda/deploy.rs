//! The deploy path as a team runs it (docs/deploy.md): its own folder — `examples/team/`, a config with quotes and
//! comments, two providers of two kinds (OpenAI with a key from the stack's secret, Claude on Bedrock signed with
//! the role's credentials), a contract of its own with its schema and samples — is the config layer the template
//! mounts at `/opt`; `scripts/test` made the stack from template.yaml on moto's CloudFormation (with the provider
//! keys' secret of step 1 and the Bedrock grant `onejob check` prints); here `onejob check` and `onejob qualify`
//! run as the docs say, then the api and worker functions run with the environment the stack gave them and drive
//! one job of the team's contract to `succeeded` on loopback stand-ins of both providers (Bedrock's reached
//! through `AWS_ENDPOINT_URL_BEDROCK_RUNTIME`, as the SDK reads it, checking every call's SigV4 signature).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use onejob::engine::Engine;
use onejob::lambda::{self, Deployment};
use onejob::startup::Role;
use serde_json::{Value, json};

use crate::support::aws::sdk_config;
use crate::support::stand_in::{Reply, StandIn};
use crate::{call_api, event, event_for, received};

/// The key `infra/stack.py` put in the stack's secret, under the name the team's config gives.
const OPENAI_KEY: &str = "sk-team-openai";

/// What `infra/stack.py` granted the stack's functions on Bedrock: what `onejob check` prints for the team's folder.
const BEDROCK_GRANT: &str = "BedrockModelArns=\
    arn:aws:bedrock:us-east-1:*:inference-profile/us.anthropic.claude-haiku-4-5-20251001-v1:0,\
    arn:aws:bedrock:*::foundation-model/anthropic.claude-haiku-4-5-20251001-v1:0";

/// The team's folder, copied as `sam build` packs it, its OpenAI provider's URL pointed at its stand-in.
fn config_layer(gpt: &StandIn) -> tempfile::TempDir {
    let team = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/team");
    let layer = tempfile::tempdir().unwrap();
    std::fs::create_dir(layer.path().join("contracts")).unwrap();
    let contract = "contracts/triage.toml";
    std::fs::copy(team.join(contract), layer.path().join(contract)).unwrap();
    let config = std::fs::read_to_string(team.join("onejob.toml"))
        .unwrap()
        .replace("https://api.openai.com/v1", &gpt.base_url());
    std::fs::write(layer.path().join("onejob.toml"), config).unwrap();
    layer
}

/// The environment Lambda gives the stack's function `function` (as moto holds it), the config layer at `layer`
/// in place of `/opt`, the execution role's credentials and region from this process, moto as the endpoint, and
/// `bedrock` as Bedrock's.
fn environment(
    functions: &Value,
    function: &str,
    layer: &Path,
    bedrock: &StandIn,
) -> impl Fn(&str) -> Option<String> + Clone + Send + Sync + 'static {
    let variables = functions[function]["environment"].clone();
    let layer = layer.to_owned();
    let bedrock = bedrock_endpoint(bedrock);
    move |name| match name {
        "AWS_ENDPOINT_URL" => std::env::var("ONEJOB_TEST_AWS_ENDPOINT").ok(),
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME" => Some(bedrock.clone()),
        "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" | "AWS_REGION" => std::env::var(name).ok(),
        _ => {
            let value = variables[name].as_str()?;
            Some(match value.strip_prefix("/opt/") {
                Some(inside) => layer.join(inside).display().to_string(),
                None => value.to_owned(),
            })
        }
    }
}

/// Where Bedrock's calls go: the stand-in's root.
fn bedrock_endpoint(stand_in: &StandIn) -> String {
    format!("http://{}", stand_in.addr)
}

/// The worker function of the stack, started as on Lambda from `env`.
async fn start(
    env: impl Fn(&str) -> Option<String> + Clone + Send + Sync + 'static,
) -> Arc<Engine> {
    let settings = Deployment::from(&env).unwrap();
    let aws = lambda::aws_config(env).unwrap();
    Arc::new(lambda::engine(&settings, &aws, Role::WORKER).await.unwrap())
}

/// The api function of the stack, started as on Lambda from `env`: its providers described, not called.
async fn start_api(
    env: impl Fn(&str) -> Option<String> + Clone + Send + Sync + 'static,
) -> Arc<Engine> {
    let settings = Deployment::from(&env).unwrap();
    let aws = lambda::aws_config(env).unwrap();
    Arc::new(lambda::engine(&settings, &aws, Role::API).await.unwrap())
}

/// `onejob ARGS` as a team runs it against the deployed stack (moto), with the stack's secret and Bedrock at
/// `bedrock`; its stdout. It runs off the test's runtime, which serves the stand-ins it calls.
async fn onejob(args: &[&str], secret_arn: &str, bedrock: &StandIn) -> String {
    let endpoint = std::env::var("ONEJOB_TEST_AWS_ENDPOINT").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_onejob"));
    command
        .args(args)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env(
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
            bedrock_endpoint(bedrock),
        )
        .env("ONEJOB_SECRET_ARN", secret_arn)
        .env_remove("ONEJOB_CONFIG");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "onejob {args:?}: {stdout}{stderr}");
    stdout
}

#[tokio::test]
async fn a_team_folder_deploys_and_runs_its_own_contract_on_both_its_providers() {
    if sdk_config().await.is_none() {
        return;
    }
    let Ok(functions) = std::env::var("ONEJOB_TEST_STACK_FUNCTIONS") else {
        assert!(
            std::env::var("CI").is_err(),
            "ONEJOB_TEST_STACK_FUNCTIONS is not set: scripts/test creates the stack"
        );
        return;
    };
    let functions: Value =
        serde_json::from_str(&std::fs::read_to_string(functions).unwrap()).unwrap();
    // The team's primary refuses (a 403: the work was not done, definitely); its fallback answers.
    let answer =
        json!({"urgency": "urgent", "queue": "infrastructure", "reason": "Production is down."});
    let gpt = StandIn::spawn(vec![], Reply::Status(403, "")).await;
    let claude = StandIn::answering(answer.clone()).await;
    let layer = config_layer(&gpt);
    let config = layer.path().join("onejob.toml");
    let api_env = environment(&functions, "ApiFunction", layer.path(), &claude);
    let worker_env = environment(&functions, "WorkerFunction", layer.path(), &claude);
    let (table, queue_url, secret_arn) = (
        api_env("ONEJOB_TABLE").unwrap(),
        api_env("ONEJOB_QUEUE_URL").unwrap(),
        api_env("ONEJOB_SECRET_ARN").unwrap(),
    );
    assert_eq!(api_env("ONEJOB_CONFIG"), Some(config.display().to_string()));

    // Before the deploy, as docs/deploy.md says: the config checks, with the fingerprints the functions will show.
    let checked = onejob(
        &["check", "--config", &config.display().to_string()],
        &secret_arn,
        &claude,
    )
    .await;
    assert!(checked.contains("triage@1 on gpt → claude"), "{checked}");
    assert!(!checked.contains("summarize@1"), "{checked}");
    assert!(checked.contains(BEDROCK_GRANT), "{checked}");
    // After it: the fallback qualified into the stack's table, through the real client, with the secret's key.
    let qualified = onejob(
        &[
            "qualify",
            "triage@1",
            "claude",
            "--runs",
            "1",
            "--store",
            "dynamodb",
            "--table",
            &table,
            "--config",
            &config.display().to_string(),
        ],
        &secret_arn,
        &claude,
    )
    .await;
    let samples = 2;
    assert_eq!(claude.calls().len(), samples, "{qualified}");

    let api = start_api(api_env.clone()).await;
    let (status, health) = call_api(&api, health_event()).await;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(status, 200);
    let contracts = health["contracts"].as_str().unwrap();
    assert!(
        checked.contains(&format!("contracts: {contracts}")),
        "{checked} / {health}"
    );
    let config_fingerprint = health["config"].as_str().unwrap();
    assert!(checked.contains(config_fingerprint), "{checked} / {health}");

    let (status, created) = call_api(&api, triage_create()).await;
    assert_eq!(status, 201, "{created}");
    let id = serde_json::from_str::<Value>(&created).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The worker function, started from its own environment: attempt 1 on gpt fails, the failover it queued runs
    // on claude and answers.
    let worker = start(worker_env).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk_config().await.unwrap());
    for _ in 0..2 {
        let batch = received(&sqs, &queue_url, 1).await;
        assert_eq!(batch.records.len(), 1, "one attempt at a time");
        let response = lambda::worker(&worker, batch, None).await;
        assert!(response.batch_item_failures.is_empty());
    }
    let (status, job) = call_api(&api, event_for("api-get.json", &id)).await;
    let job: Value = serde_json::from_str(&job).unwrap();
    assert_eq!(
        (status, &job["status"]),
        (200, &json!("succeeded")),
        "{job}"
    );
    assert_eq!(job["result"], answer);
    let providers: Vec<&str> = (job["attempts"].as_array().unwrap().iter())
        .map(|a| a["provider"].as_str().unwrap())
        .collect();
    assert_eq!(providers, ["gpt", "claude"]);

    // One call each for the job, with the team's prompt: to OpenAI with the key of the stack's secret, to Bedrock
    // signed with the role's credentials (the stand-in refuses any other signature), on the team's model.
    let (gpt_calls, claude_calls) = (gpt.calls(), claude.calls());
    assert_eq!((gpt_calls.len(), claude_calls.len()), (1, samples + 1));
    assert_eq!(
        gpt_calls[0].headers["authorization"],
        format!("Bearer {OPENAI_KEY}").as_str()
    );
    let to_claude = claude_calls.last().unwrap();
    assert_eq!(
        to_claude.uri.path(),
        "/model/us.anthropic.claude-haiku-4-5-20251001-v1%3A0/converse"
    );
    let signature = to_claude.headers["authorization"].to_str().unwrap();
    assert!(
        signature.contains("/us-east-1/bedrock/aws4_request"),
        "{signature}"
    );
    assert!(
        to_claude.body.to_string().contains("Acme Cloud"),
        "{}",
        to_claude.body
    );
}

/// `GET /healthz` as API Gateway hands it over (routed without the authorizer).
fn health_event() -> Value {
    let mut health = event("api-get.json");
    health["rawPath"] = json!("/healthz");
    health["requestContext"]["http"]["path"] = json!("/healthz");
    health
}

/// A create of the team's own contract under a key of its own.
fn triage_create() -> Value {
    let mut create = event("api-create.json");
    let body = json!({
        "contract": "triage@1",
        "input": {
            "ticket": "Our \"production\" cluster is down since 09:00.",
            "customer": "Globex",
            "queues": ["billing", "infrastructure", "accounts"],
        },
    });
    create["body"] = json!(body.to_string());
    create["headers"]["idempotency-key"] = json!(format!("team-{}", uuid::Uuid::now_v7()));
    create
}

/// A function whose config layer names no provider, or that has no config at all, does not start: it never serves
/// the demo providers' answers.
#[test]
fn a_function_whose_config_names_no_provider_does_not_start() {
    let layer = tempfile::tempdir().unwrap();
    let config = layer.path().join("onejob.toml");
    std::fs::write(&config, "[chains]\n\"summarize@1\" = [\"gpt\"]\n").unwrap();
    let env = |with_config: bool| {
        let config = config.display().to_string();
        move |name: &str| match name {
            "ONEJOB_CONFIG" if with_config => Some(config.clone()),
            "ONEJOB_TABLE" | "ONEJOB_QUEUE_URL" => Some("set".to_owned()),
            _ => None,
        }
    };
    let err = Deployment::from(env(true)).unwrap_err().to_string();
    assert!(err.contains("names no providers"), "{err}");
    assert!(err.contains(&config.display().to_string()), "{err}");
    let err = Deployment::from(env(false)).unwrap_err().to_string();
    assert!(err.contains("ONEJOB_CONFIG is not set"), "{err}");
}
