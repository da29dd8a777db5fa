//! The sweeper Lambda: one sweep per scheduled event.

use lambda_runtime::{LambdaEvent, service_fn};
use onejob::lambda;
use onejob::startup::Role;
use onejob::worker::sweeper::sweep;
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let (_, engine) = lambda::start(Role::SWEEPER).await?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<Value>| {
        let engine = engine.clone();
        async move {
            let swept = sweep(&engine, lambda::deadline(&event.context)).await?;
            lambda::end_invocation(&engine).await;
            Ok::<_, lambda_runtime::Error>(json!({
                "expired": swept.expired, "redispatched": swept.redispatched,
                "purged": swept.purged, "delivered": swept.delivered,
            }))
        }
    }))
    .await
}
