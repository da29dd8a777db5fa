//! The worker Lambda: SQS batches of attempt messages, one step per record, partial batch failures.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use onejob::lambda::{self, Settings};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onejob::telemetry::init_json();
    let settings = Settings::from_env()?;
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let engine = lambda::engine(&settings, &aws)?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let engine = engine.clone();
        async move {
            let deadline = lambda::deadline(&event.context);
            let response = lambda::worker(&engine, event.payload, deadline).await;
            lambda::flush_metrics(&engine);
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}
