//! How long a Lambda function takes to start: each `bootstrap` is run as Lambda runs it, against a stand-in of the
//! Lambda runtime API on loopback, and timed from its start to its first `GET /2018-06-01/runtime/invocation/next`
//! (the runtime asks for work once the function's init — config, AWS SDK, engine — is done). No invocation follows;
//! the process is killed. Runs on the machine's own architecture: build the bootstraps for it to measure them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use tokio::sync::mpsc;

/// Starts `bootstrap` `runs` times; prints its size and the init times (p50, max).
pub(crate) async fn measure(bootstraps: &[PathBuf], runs: usize) {
    println!(
        "lambda-init: {runs} starts of each bootstrap against a runtime API stand-in on loopback"
    );
    println!(
        "  {:<40} {:>10} {:>12} {:>12}",
        "bootstrap", "size MiB", "init p50 ms", "init max ms"
    );
    for bootstrap in bootstraps {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            times.push(once(bootstrap).await);
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let size = std::fs::metadata(bootstrap).unwrap().len() as f64 / (1024.0 * 1024.0);
        println!(
            "  {:<40} {size:>10.1} {:>12.1} {:>12.1}",
            bootstrap.display().to_string(),
            ms(times[times.len() / 2]),
            ms(*times.last().unwrap())
        );
    }
}

/// One cold start: the time until the runtime first asks for work.
async fn once(bootstrap: &Path) -> Duration {
    let (asked, mut asking) = mpsc::unbounded_channel::<()>();
    let api = Router::new().route(
        "/2018-06-01/runtime/invocation/next",
        get(move || {
            let _ = asked.send(());
            std::future::pending::<&'static str>()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, api).await });
    let started = Instant::now();
    let mut child = std::process::Command::new(bootstrap)
        .env_clear()
        .env("AWS_LAMBDA_RUNTIME_API", addr.to_string())
        .env("AWS_LAMBDA_FUNCTION_NAME", "bench")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "256")
        .env("AWS_LAMBDA_LOG_STREAM_NAME", "bench")
        .env("AWS_LAMBDA_LOG_GROUP_NAME", "bench")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .env("ONEJOB_TABLE", "bench")
        .env("ONEJOB_QUEUE_URL", "http://127.0.0.1:9/queue")
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let asked = tokio::time::timeout(Duration::from_secs(30), asking.recv()).await;
    let took = started.elapsed();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        matches!(asked, Ok(Some(()))),
        "{} never asked for work",
        bootstrap.display()
    );
    server.abort();
    took
}
