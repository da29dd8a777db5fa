//! The AWS-compatible test server (moto, started by `scripts/test`): SDK configs that reach it, and a counter of
//! the requests a client sends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// The SDK config for the test server, or `None` (outside CI) when `scripts/test` did not start one.
pub(crate) async fn sdk_config() -> Option<SdkConfig> {
    let Ok(endpoint) = std::env::var("ONEJOB_TEST_AWS_ENDPOINT") else {
        assert!(
            std::env::var("CI").is_err(),
            "ONEJOB_TEST_AWS_ENDPOINT is not set: run the tests through scripts/test"
        );
        eprintln!("skipped: no AWS test endpoint (run the tests through scripts/test)");
        return None;
    };
    let config = aws_config::defaults(BehaviorVersion::latest())
        .http_client(onejob::startup::https_client())
        .endpoint_url(endpoint)
        .region("us-east-1")
        .load()
        .await;
    Some(config)
}

/// A name no other test uses.
pub(crate) fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Counts every request a client puts on the wire (retries included).
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestCounter(Arc<AtomicUsize>);

impl RequestCounter {
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _config: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A fault at the wire, once: the first request whose body holds `marker` either never leaves (the interceptor
/// fails it before it is sent) or reaches the server and has its answer turned into a 500 (which the SDK's own
/// retry then sends again).
#[derive(Debug, Clone)]
pub(crate) struct WireFault {
    marker: &'static str,
    lose_answer: bool,
    armed: Arc<AtomicBool>,
    answer_pending: Arc<AtomicBool>,
}

impl WireFault {
    pub(crate) fn new(marker: &'static str, lose_answer: bool) -> Self {
        Self {
            marker,
            lose_answer,
            armed: Arc::new(true.into()),
            answer_pending: Arc::new(false.into()),
        }
    }

    pub(crate) fn fired(&self) -> bool {
        !self.armed.load(Ordering::SeqCst)
    }
}

impl Intercept for WireFault {
    fn name(&self) -> &'static str {
        "WireFault"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _config: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let body = context.request().body().bytes().unwrap_or_default();
        let matches = String::from_utf8_lossy(body).contains(self.marker);
        if !matches || !self.armed.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        if self.lose_answer {
            self.answer_pending.store(true, Ordering::SeqCst);
            Ok(())
        } else {
            Err("injected: the request never left".into())
        }
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _components: &RuntimeComponents,
        _config: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if self.answer_pending.swap(false, Ordering::SeqCst) {
            *context.response_mut().status_mut() = 500.try_into().expect("a status code");
        }
        Ok(())
    }
}

/// The table the stack made on the test server (`ONEJOB_TEST_STACK_TABLE`, set by `scripts/test` after it created
/// `template.yaml`'s stack on moto's CloudFormation), if there is one.
pub(crate) fn stack_table() -> Option<String> {
    std::env::var("ONEJOB_TEST_STACK_TABLE").ok()
}

/// A fresh table for one test, named `name`: made like the stack's table when there is a stack — the same key
/// schema, attributes, indexes, projections and billing, with TTL on `expires_at` as the template turns it on
/// (infra/stack.py checks that) — so every DynamoDB test runs on the table the template describes; else made by
/// the code (`onejob table create`).
pub(crate) async fn table_for_test(client: &aws_sdk_dynamodb::Client, name: &str) {
    let Some(stack) = stack_table() else {
        let store = onejob::store::dynamodb::DynamoStore::new(client.clone(), name);
        assert!(store.create_table().await.unwrap(), "a new table");
        return;
    };
    let table = client
        .describe_table()
        .table_name(&stack)
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    let indexes = table
        .global_secondary_indexes()
        .iter()
        .map(|index| {
            aws_sdk_dynamodb::types::GlobalSecondaryIndex::builder()
                .index_name(index.index_name().unwrap())
                .set_key_schema(Some(index.key_schema().to_vec()))
                .set_projection(index.projection().cloned())
                .build()
                .unwrap()
        })
        .collect();
    let billing = table
        .billing_mode_summary()
        .and_then(|b| b.billing_mode().cloned());
    client
        .create_table()
        .table_name(name)
        .set_attribute_definitions(Some(table.attribute_definitions().to_vec()))
        .set_key_schema(Some(table.key_schema().to_vec()))
        .set_global_secondary_indexes(Some(indexes))
        .set_billing_mode(billing)
        .send()
        .await
        .unwrap();
    client
        .update_time_to_live()
        .table_name(name)
        .time_to_live_specification(
            aws_sdk_dynamodb::types::TimeToLiveSpecification::builder()
                .attribute_name("expires_at")
                .enabled(true)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

/// A fresh queue for one test: like the stack's attempts queue when there is a stack (its visibility timeout,
/// retention and redrive to the stack's dead-letter queue), else a plain one. Its URL.
pub(crate) async fn queue_for_test(client: &aws_sdk_sqs::Client, prefix: &str) -> String {
    let mut request = client.create_queue().queue_name(unique_name(prefix));
    if let Ok(stack) = std::env::var("ONEJOB_TEST_STACK_QUEUE_URL") {
        let attributes = client
            .get_queue_attributes()
            .queue_url(stack)
            .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap_or_default();
        use aws_sdk_sqs::types::QueueAttributeName as A;
        for name in [
            A::VisibilityTimeout,
            A::MessageRetentionPeriod,
            A::RedrivePolicy,
        ] {
            if let Some(value) = attributes.get(&name) {
                request = request.attributes(name, value);
            }
        }
    }
    request.send().await.unwrap().queue_url.unwrap()
}

/// Makes the EventBridge bus `bus`, with a rule that sends onejob's `job.settled` events to a queue of its own;
/// that queue's URL.
pub(crate) async fn bus_for_test(aws: &SdkConfig, bus: &str) -> String {
    let events = aws_sdk_eventbridge::Client::new(aws);
    events.create_event_bus().name(bus).send().await.unwrap();
    let sqs = aws_sdk_sqs::Client::new(aws);
    let queue = queue_for_test(&sqs, "settled").await;
    let arn = sqs
        .get_queue_attributes()
        .queue_url(&queue)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
        .clone();
    events
        .put_rule()
        .event_bus_name(bus)
        .name("settled")
        .event_pattern(r#"{"source": ["onejob"], "detail-type": ["job.settled"]}"#)
        .send()
        .await
        .unwrap();
    let target = aws_sdk_eventbridge::types::Target::builder()
        .id("queue")
        .arn(arn)
        .build()
        .unwrap();
    events
        .put_targets()
        .event_bus_name(bus)
        .rule("settled")
        .targets(target)
        .send()
        .await
        .unwrap();
    queue
}

/// The messages on `queue_url`, their bodies as JSON, taken off the queue.
pub(crate) async fn drain(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> Vec<serde_json::Value> {
    let mut bodies = Vec::new();
    loop {
        let received = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            .send()
            .await
            .unwrap();
        if received.messages().is_empty() {
            return bodies;
        }
        for message in received.messages() {
            bodies.push(serde_json::from_str(message.body().unwrap()).unwrap());
            sqs.delete_message()
                .queue_url(queue_url)
                .receipt_handle(message.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
}

/// What a client sent, request by request, as IAM names it: the action (`dynamodb:Query`) and, for DynamoDB, the
/// resource it acts on (`table`, or `index/<name>` for a query of an index).
pub(crate) type Sent = std::collections::BTreeSet<(String, String)>;

/// An HTTP client that records every request an SDK client sends through it ([`Sent`]), then sends it on with
/// onejob's own client: what a function's code asks of AWS, as its role must allow.
#[derive(Debug, Clone, Default)]
pub(crate) struct Recording {
    sent: Arc<std::sync::Mutex<Sent>>,
}

impl Recording {
    /// `aws` with its requests recorded here.
    pub(crate) fn config(&self, aws: &SdkConfig) -> SdkConfig {
        aws.to_builder()
            .http_client(aws_smithy_runtime_api::client::http::SharedHttpClient::new(
                self.clone(),
            ))
            .build()
    }

    pub(crate) fn sent(&self) -> Sent {
        self.sent.lock().unwrap().clone()
    }
}

impl aws_smithy_runtime_api::client::http::HttpClient for Recording {
    fn http_connector(
        &self,
        settings: &aws_smithy_runtime_api::client::http::HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> aws_smithy_runtime_api::client::http::SharedHttpConnector {
        let inner = onejob::startup::https_client().http_connector(settings, components);
        aws_smithy_runtime_api::client::http::SharedHttpConnector::new(RecordingConnector {
            inner,
            sent: self.sent.clone(),
        })
    }
}

#[derive(Debug)]
struct RecordingConnector {
    inner: aws_smithy_runtime_api::client::http::SharedHttpConnector,
    sent: Arc<std::sync::Mutex<Sent>>,
}

impl aws_smithy_runtime_api::client::http::HttpConnector for RecordingConnector {
    fn call(
        &self,
        request: aws_smithy_runtime_api::client::orchestrator::HttpRequest,
    ) -> aws_smithy_runtime_api::client::http::HttpConnectorFuture {
        let target = request.headers().get("x-amz-target").unwrap_or_default();
        let (service, operation) = target.split_once('.').unwrap_or(("", target));
        let body: serde_json::Value =
            serde_json::from_slice(request.body().bytes().unwrap_or_default()).unwrap_or_default();
        let (action, resource) = match service {
            s if s.starts_with("DynamoDB") => {
                let resource = match body["IndexName"].as_str() {
                    Some(index) => format!("index/{index}"),
                    None => "table".to_owned(),
                };
                (format!("dynamodb:{operation}"), resource)
            }
            "AmazonSQS" => (format!("sqs:{operation}"), "queue".to_owned()),
            "secretsmanager" => (format!("secretsmanager:{operation}"), "secret".to_owned()),
            "AWSEvents" => (format!("events:{operation}"), "bus".to_owned()),
            other => (format!("{other}:{operation}"), String::new()),
        };
        self.sent.lock().unwrap().insert((action, resource));
        self.inner.call(request)
    }
}
