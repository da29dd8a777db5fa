//! The command line's other commands: an endpoint set and the event a job made shown, and the exit codes that say what
//! happened.

use super::*;

/// `onejob endpoint set` registers where completion events go and prints the secret; `onejob jobs events` shows
/// the job's event delivered; `onejob endpoint remove` removes it, and `show` then says there is none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_an_endpoint_and_shows_the_event_a_job_made() {
    let app = App::start().await;
    let url = app.url();
    let receiver = StandIn::answering(serde_json::json!({})).await;
    let hook = format!("{}/chat/completions", receiver.base_url());
    let set = onejob(&url, &["endpoint", "set", &hook]).await;
    assert_eq!(set.code, Some(0), "{}", set.stderr);
    let secret = set
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("secret  "))
        .unwrap_or_else(|| panic!("no secret in {}", set.stdout))
        .to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let shown = onejob(&url, &["endpoint", "show", "--json"]).await;
    let shown: Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(
        (&shown["url"], &shown["secret"]),
        (&Value::from(hook), &Value::from(secret))
    );

    let done = onejob(&url, &[&CREATE[..], &["--wait", "--json"]].concat()).await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    let job: Value = serde_json::from_str(&done.stdout).unwrap();
    let id = job["id"].as_str().unwrap();
    receiver.received(1).await;
    // The deliverer writes what the try came to just after the receiver answered.
    let started = Instant::now();
    let events = loop {
        let events = onejob(&url, &["jobs", "events", id]).await;
        assert_eq!(events.code, Some(0), "{}", events.stderr);
        if events.stdout.contains("delivered") || started.elapsed() > Duration::from_secs(20) {
            break events.stdout;
        }
    };
    let line = events.lines().next().unwrap();
    assert!(
        line.starts_with("evt_") && line.contains("succeeded") && line.contains("(1 tries)"),
        "{events}"
    );
    assert_eq!(events.lines().count(), 1, "{events}");

    let removed = onejob(&url, &["endpoint", "remove"]).await;
    assert_eq!(removed.code, Some(0), "{}", removed.stderr);
    let none = onejob(&url, &["endpoint", "show"]).await;
    assert_eq!(none.code, Some(3), "{}", none.stdout);
    assert!(
        none.stderr.contains("endpoint_not_found"),
        "{}",
        none.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_say_what_happened() {
    let app = App::start().await;
    let url = app.url();
    let done = onejob(&url, &[&CREATE[..], &["--wait"]].concat()).await;
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert!(done.stdout.contains("SUCCEEDED"), "{}", done.stdout);
    assert!(done.stdout.contains("* winner"), "{}", done.stdout);
    assert!(
        done.stdout
            .contains(r#"result: {"summary":"The projector broke."}"#),
        "{}",
        done.stdout
    );

    let failing = [
        &CREATE[..],
        &["--providers", "demo-fail", "--wait", "--json"],
    ]
    .concat();
    let failed = onejob(&url, &failing).await;
    assert_eq!(failed.code, Some(1), "{}", failed.stderr);
    let job: Value = serde_json::from_str(&failed.stdout).unwrap();
    assert_eq!(job["error"]["code"], "providers_exhausted");

    let id = job["id"].as_str().unwrap();
    let retried = onejob(&url, &["attempts", "retry", id, "--provider", "demo"]).await;
    assert_eq!(retried.code, Some(0), "{}", retried.stderr);
    let watched = onejob(&url, &["jobs", "watch", id]).await;
    assert_eq!(watched.code, Some(0), "{}", watched.stderr);
    assert!(watched.stdout.contains("#2 demo"), "{}", watched.stdout);
    let cancel = onejob(&url, &["jobs", "cancel", id]).await;
    assert_eq!(cancel.code, Some(3), "a succeeded job cannot be cancelled");
    assert!(cancel.stderr.contains("job_finished"), "{}", cancel.stderr);

    let listed = onejob(&url, &["jobs", "list", "--json"]).await;
    let page: Value = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2);

    let bad_input = onejob(
        &url,
        &[
            "jobs",
            "create",
            "--contract",
            "summarize@1",
            "--input",
            "{not json",
        ],
    )
    .await;
    assert_eq!(bad_input.code, Some(2));
    assert!(
        bad_input.stderr.contains("--input is not JSON"),
        "{}",
        bad_input.stderr
    );

    let missing = onejob(
        &url,
        &["jobs", "get", "job_00000000000000000000000000000000"],
    )
    .await;
    assert_eq!(missing.code, Some(3));
    assert!(
        missing.stderr.contains("job_not_found (HTTP 404)"),
        "{}",
        missing.stderr
    );

    let nobody = support::stand_in::refusing().await;
    let nobody = nobody.trim_end_matches("/v1");
    let unreachable = onejob(nobody, &[&CREATE[..], &["--retries", "1"]].concat()).await;
    assert_eq!(unreachable.code, Some(4), "{}", unreachable.stderr);
    assert!(
        unreachable.stderr.contains("gave up after 2 tries"),
        "{}",
        unreachable.stderr
    );

    let bad_status = tokio::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["jobs", "list", "--status", "done", "--url", &url])
        .output()
        .await
        .unwrap();
    assert_eq!(bad_status.status.code(), Some(2));
    let said = String::from_utf8_lossy(&bad_status.stderr);
    assert!(
        said.contains("succeeded") && said.contains("cancelled"),
        "{said}"
    );

    let no_token = tokio::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["jobs", "list", "--url", &url])
        .env_remove("ONEJOB_TOKEN")
        .output()
        .await
        .unwrap();
    assert_eq!(no_token.status.code(), Some(2));
}
