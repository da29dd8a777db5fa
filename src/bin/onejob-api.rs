//! The API Lambda: the same router as the local server, under `lambda_http`, owners from JWT claims.

use onejob::lambda;
use onejob::startup::Role;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    let (settings, engine) = lambda::start(Role::API).await?;
    lambda_http::run(lambda::api(engine, &settings.config)).await
}
