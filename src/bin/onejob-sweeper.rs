//! The sweeper Lambda: one sweep per scheduled event.

use lambda_runtime::{LambdaEvent, service_fn};
use onejob::lambda::{self, Settings};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    onejob::telemetry::init_json();
    let settings = Settings::from_env()?;
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let engine = lambda::engine(&settings, &aws)?;
    lambda_runtime::run(service_fn(|_: LambdaEvent<Value>| {
        let engine = engine.clone();
        async move {
            let swept = lambda::sweeper(&engine).await?;
            lambda::flush_metrics(&engine);
            Ok::<_, lambda_runtime::Error>(
                json!({"expired": swept.expired, "redispatched": swept.redispatched}),
            )
        }
    }))
    .await
}
