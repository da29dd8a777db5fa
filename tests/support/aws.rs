//! The AWS-compatible test server (moto, started by `scripts/test`): SDK configs that reach it, and a counter of
//! the requests a client sends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_config::{BehaviorVersion, SdkConfig};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::BeforeTransmitInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

/// The SDK config for the test server, or `None` (outside CI) when `scripts/test` did not start one.
pub async fn sdk_config() -> Option<SdkConfig> {
    let Ok(endpoint) = std::env::var("ONEJOB_TEST_AWS_ENDPOINT") else {
        assert!(
            std::env::var("CI").is_err(),
            "ONEJOB_TEST_AWS_ENDPOINT is not set: run the tests through scripts/test"
        );
        eprintln!("skipped: no AWS test endpoint (run the tests through scripts/test)");
        return None;
    };
    let config = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region("us-east-1")
        .load()
        .await;
    Some(config)
}

/// A name no other test uses.
pub fn unique_name(prefix: &str) -> String {
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
pub struct RequestCounter(Arc<AtomicUsize>);

impl RequestCounter {
    pub fn count(&self) -> usize {
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
