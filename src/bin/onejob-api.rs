//! The API Lambda: the same router as the local server, under `lambda_http`, owners from JWT claims.

use onejob::lambda;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    let (settings, engine) = lambda::start_api().await?;
    lambda_http::run(lambda::api(engine, &settings.config)).await
}
