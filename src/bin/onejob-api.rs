//! The API Lambda: the same router as the local server, under `lambda_http`, owners from JWT claims.

use onejob::lambda::{self, Settings};

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    onejob::telemetry::init_json();
    let settings = Settings::from_env()?;
    let aws = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let engine = lambda::engine(&settings, &aws)?;
    lambda_http::run(lambda::api(engine, settings.config.body_limit_bytes)).await
}
