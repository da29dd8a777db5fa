//! The worker Lambda: SQS batches of attempt messages, one step per record, partial batch failures.

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_runtime::{LambdaEvent, service_fn};
use onejob::lambda;
use onejob::startup::Role;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let (_, engine) = lambda::start(Role::WORKER).await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let engine = engine.clone();
        async move {
            let deadline = lambda::deadline(&event.context);
            let response = lambda::worker(&engine, event.payload, deadline).await;
            lambda::end_invocation(&engine).await;
            Ok::<_, lambda_runtime::Error>(response)
        }
    }))
    .await
}
