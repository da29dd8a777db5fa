//! `onejob serve` as a team runs it: from any folder, on its own providers, with the chains its config names.

mod support;

use std::ffi::OsStr;

use onejob::domain::JobId;
use onejob::telemetry::trace;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{Value, json};
use support::aws::{bus_for_test, sdk_config, unique_name};
use support::collector::Collector;
use support::process::{serve, serve_with};
use support::stand_in::StandIn;

/// alice's request: the answer's JSON body.
async fn as_alice(request: reqwest::RequestBuilder) -> Value {
    let answer = request.bearer_auth("dev-token-alice").send().await.unwrap();
    answer.json().await.unwrap()
}

async fn get(url: &str) -> Value {
    as_alice(reqwest::Client::new().get(url)).await
}

/// alice's summarize job under `key`.
async fn create(url: &str, key: &str) -> Value {
    let request = reqwest::Client::new()
        .post(format!("{url}/v1/jobs"))
        .header("Idempotency-Key", key)
        .json(&json!({"contract": "summarize@1", "input": {"text": "A long text."}}));
    as_alice(request).await
}

/// The contracts are in the binary: a server started in an empty folder, with no config, serves them.
#[tokio::test]
async fn serve_from_an_empty_folder_serves_the_built_in_contracts() {
    let empty = tempfile::tempdir().unwrap();
    let (_server, url) = serve(empty.path(), &[]).await.unwrap();
    let contracts = get(&format!("{url}/v1/contracts")).await;
    let mut names: Vec<&str> = contracts["contracts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["contract"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["classify@1", "summarize@1"]);
    assert!(empty.path().join("data/onejob.db").exists());
}

/// A config that defines only real providers and names each contract's chain starts and runs a job on that chain;
/// without the chains it stops at once, saying what to write.
#[tokio::test]
async fn a_config_with_real_providers_and_its_own_chains_runs_jobs() {
    let provider = StandIn::answering(json!({"summary": "From the team's own provider."})).await;
    let dir = tempfile::tempdir().unwrap();
    let providers = format!(
        r#"
[providers.main]
kind = "openai"
base_url = "{}"
model = "gpt-4o-mini"
"#,
        provider.base_url()
    );
    let config = dir.path().join("onejob.toml");
    std::fs::write(&config, &providers).unwrap();
    let args = [OsStr::new("--config"), config.as_os_str()];
    let refused = serve(dir.path(), &args).await.unwrap_err();
    assert!(
        refused.contains("runs on demo, which is not a configured provider"),
        "{refused}"
    );
    assert!(
        refused.contains(r#"[chains] "classify@1" = ["#),
        "{refused}"
    );

    let chains = "[chains]\n\"summarize@1\" = [\"main\"]\n\"classify@1\" = [\"main\"]\n";
    std::fs::write(&config, format!("{chains}{providers}")).unwrap();
    let (_server, url) = serve(dir.path(), &args).await.unwrap();
    let created = create(&url, "k").await;
    assert_eq!(created["providers"], json!(["main"]));
    let id = created["id"].as_str().unwrap();
    let done = loop {
        let job = get(&format!("{url}/v1/jobs/{id}?wait=20")).await;
        if job["settled"] == true {
            break job;
        }
    };
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(
        done["result"],
        json!({"summary": "From the team's own provider."})
    );
    assert_eq!(provider.call_count(), 1);
}

/// With a collector named by `OTEL_EXPORTER_OTLP_ENDPOINT`, the server exports each job's steps as one trace: the
/// create (the root, with the ids the job's id gives), its dispatch, and the worker's step under the dispatch that
/// the local queue's message carried, down to the completion.
#[tokio::test]
async fn a_server_given_a_collector_exports_each_job_as_one_trace() {
    let collector = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.base_url.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "10"),
    ];
    let (_server, url) = serve_with(dir.path(), &[], &env).await.unwrap();
    let created = create(&url, "traced").await;
    let id = JobId::parse(created["id"].as_str().unwrap()).unwrap();
    let (trace, root) = trace::ids(&id);
    let trace = trace.to_bytes().to_vec();
    // A parent span ends, and is exported, after its children: wait for every span the test reads, not only the
    // last to begin.
    let named = ["create", "dispatch", "message", "provider_call", "complete"];
    let spans = collector
        .until(|spans| {
            named
                .iter()
                .all(|name| spans.iter().any(|s| s.name == *name && s.trace_id == trace))
        })
        .await;
    let in_trace: Vec<&Span> = spans.iter().filter(|s| s.trace_id == trace).collect();
    let one = |name: &str| -> &Span {
        let found: Vec<_> = in_trace.iter().filter(|s| s.name == name).collect();
        assert_eq!(
            found.len(),
            1,
            "one {name} in the job's trace: {in_trace:#?}"
        );
        found[0]
    };
    let create = one("create");
    assert_eq!(create.span_id, root.to_bytes().to_vec());
    assert!(create.parent_span_id.is_empty());
    let dispatch = one("dispatch");
    assert_eq!(dispatch.parent_span_id, create.span_id);
    assert_eq!(one("message").parent_span_id, dispatch.span_id);
    one("provider_call");
    one("complete");
}

/// `onejob serve` with `ONEJOB_EVENT_BUS` (the AWS SDK's usual settings naming moto): the job it runs goes to the
/// bus once it settles, an owner without an endpoint included.
#[tokio::test]
async fn a_server_given_a_bus_puts_each_settled_job_on_it() {
    let Some(aws) = sdk_config().await else {
        return;
    };
    let bus = unique_name("onejob-serve");
    let heard = bus_for_test(&aws, &bus).await;
    let moto = std::env::var("ONEJOB_TEST_AWS_ENDPOINT").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("ONEJOB_EVENT_BUS", bus.as_str()),
        ("AWS_ENDPOINT_URL", moto.as_str()),
    ];
    let (_server, url) = serve_with(dir.path(), &[], &env).await.unwrap();
    let created = create(&url, "heard").await;
    let sqs = aws_sdk_sqs::Client::new(&aws);
    // Waited for by SQS's long poll: the message is there when the server put the event.
    let mut put = Vec::new();
    for _ in 0..6 {
        let received = sqs
            .receive_message()
            .queue_url(&heard)
            .wait_time_seconds(5)
            .send()
            .await
            .unwrap();
        put.extend(
            received
                .messages()
                .iter()
                .map(|m| serde_json::from_str::<Value>(m.body().unwrap()).unwrap()),
        );
        if !put.is_empty() {
            break;
        }
    }
    assert_eq!(put.len(), 1, "{put:?}");
    let detail = &put[0]["detail"];
    assert_eq!(
        (
            &detail["type"],
            &detail["job"]["id"],
            &detail["job"]["status"]
        ),
        (&json!("job.settled"), &created["id"], &json!("succeeded"))
    );
    assert!(detail["id"].as_str().unwrap().starts_with("evt_"));
}

/// A server behind an egress proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`) still resolves an endpoint itself,
/// with its vetted resolver: a name that does not resolve is not sent to, and the proxy hears nothing — it would
/// have resolved the name itself, past the address guard.
#[tokio::test]
async fn deliveries_never_go_through_an_environment_proxy() {
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("HTTP_PROXY", proxy_url.as_str()),
        ("HTTPS_PROXY", proxy_url.as_str()),
        ("ALL_PROXY", proxy_url.as_str()),
        ("http_proxy", proxy_url.as_str()),
    ];
    let (_server, url) = serve_with(dir.path(), &[], &env).await.unwrap();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let endpoint = as_alice(
        client
            .put(format!("{url}/v1/endpoint"))
            .json(&json!({"url": "http://hooks.onejob-test.invalid/events"})),
    )
    .await;
    assert_eq!(endpoint["url"], "http://hooks.onejob-test.invalid/events");
    let created = create(&url, "behind-a-proxy").await;
    let id = created["id"].as_str().unwrap();
    // The real-time bound only turns a hang into a failure.
    let tried = async {
        loop {
            let list = as_alice(client.get(format!("{url}/v1/jobs/{id}/events"))).await;
            let events = list["events"].as_array().cloned().unwrap_or_default();
            if events.iter().any(|e| e["tries"].as_u64() >= Some(1)) {
                break events;
            }
            tokio::task::yield_now().await;
        }
    };
    let events = tokio::time::timeout(std::time::Duration::from_secs(20), tried)
        .await
        .expect("the event was tried");
    assert!(events[0]["delivered_at"].is_null(), "{events:?}");
    let accepted =
        tokio::time::timeout(std::time::Duration::from_millis(200), proxy.accept()).await;
    assert!(accepted.is_err(), "the proxy was reached");
}
