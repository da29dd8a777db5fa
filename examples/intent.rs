//! One intent, created the right way and followed to its end, from an outside program.
//!
//! With the local server running (`cargo run -- serve`, which prints its dev tokens):
//!
//! ```sh
//! cargo run --example intent -- "The projector broke. The meeting moved."
//! ONEJOB_KEY=<the key a run printed> cargo run --example intent -- "…"   # the same intent again: the same job
//! ```
//!
//! `ONEJOB_URL` (default `http://127.0.0.1:8080`) and `ONEJOB_TOKEN` (default `dev-token-alice`) name the server and
//! the caller. Exit status 0 when the job succeeded, 1 when it ended otherwise, 2 when the request stopped (the
//! key to submit the same intent with is printed).

use std::process::ExitCode;

use onejob::client::{Client, Intent, JobSpec, Tries};

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::var("ONEJOB_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let token = std::env::var("ONEJOB_TOKEN").unwrap_or_else(|_| "dev-token-alice".into());
    let text = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "Nothing happened.".into());
    let job = JobSpec {
        contract: "summarize@1".into(),
        input: serde_json::json!({ "text": text }),
        providers: None,
    };
    // One key for the intent's whole life: a kept key resumes it, else a new one is made.
    let intent = match std::env::var("ONEJOB_KEY") {
        Ok(key) => Intent::resume(key, job),
        Err(_) => Intent::new(job),
    };
    let client = Client::new(&url, &token, Tries::default());
    let outcome = async {
        let created = client.submit(&intent).await?;
        let how = if created.replayed {
            "replayed"
        } else {
            "created"
        };
        println!("{} {how} after {} tries", created.job["id"], created.tries);
        client
            .wait(&intent, &created, |job| {
                println!("status {}", job["status"])
            })
            .await
    };
    match outcome.await {
        Ok(job) => {
            println!("result {}", job["result"]);
            ExitCode::from(u8::from(job["status"] != "succeeded"))
        }
        Err(e) => {
            eprintln!("{e}");
            if e.may_exist() {
                eprintln!("the job may exist: run again with ONEJOB_KEY={}", e.key);
            }
            ExitCode::from(2)
        }
    }
}
