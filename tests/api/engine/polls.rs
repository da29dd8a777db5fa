//! Long polls through the HTTP API: at once for a settled job, until a version the client has not seen, and what the
//! final write shows; entity tags.

use super::*;

#[tokio::test]
async fn a_long_poll_answers_at_once_for_a_settled_job_and_refuses_long_waits() {
    let app = TestApp::spawn().await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let id = created_id(&app, "k", &body).await;
    json_with_status(app.cancel_job(ALICE, &id).await, 200).await;
    // The clock never moves: a wait that did not answer at once would never answer.
    let settled =
        json_with_status(app.get(ALICE, &format!("/v1/jobs/{id}?wait=25")).await, 200).await;
    assert_eq!(settled["status"], "cancelled");
    assert_problem(
        app.get(ALICE, &format!("/v1/jobs/{id}?wait=26")).await,
        400,
        "invalid_parameter",
    )
    .await;
}

/// `ETag` and `If-None-Match`: a client names the version it has and waits for the next one.
#[tokio::test]
async fn a_long_poll_waits_for_a_version_the_client_has_not_seen() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let id = created_id(&app, "k", &body).await;
    // The demo provider now waits on the clock, which stands still: the job holds still too.
    app.wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    let response = app.get_job(ALICE, &id).await;
    let etag = response.headers()["etag"].to_str().unwrap().to_owned();
    let same = app
        .client
        .get(app.url(&format!("/v1/jobs/{id}")))
        .bearer_auth(ALICE)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(same.status(), 304);

    let poll = app.long_poll(ALICE, &id, etag.clone());
    json_with_status(app.cancel_job(ALICE, &id).await, 200).await;
    let changed = poll.await.unwrap();
    assert_ne!(changed.headers()["etag"].to_str().unwrap(), etag);
    let job = json_with_status(changed, 200).await;
    assert_eq!(job["status"], "cancelled");
}

/// A long poll woken by the write that made the job final answers from the copy that write brought along, not
/// from a read: it shows exactly what a read shows afterwards, entity tag included.
#[tokio::test]
async fn a_long_poll_woken_by_the_final_write_shows_what_a_read_shows() {
    let gate = Gate::new();
    let primary = StandIn::spawn(
        vec![Reply::Held(gate.clone())],
        Reply::Status(500, "unused"),
    )
    .await;
    let fallback = StandIn::answering(json!({"summary": "unused"})).await;
    let app = std::sync::Arc::new(app_on(&primary, &fallback).await);
    let id = created_id(&app, "k", &chain_job("text")).await;
    primary.received(1).await;
    let running = app.get_job(ALICE, &id).await;
    let etag = running.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(json_with_status(running, 200).await["status"], "running");

    let poll = app.long_poll(ALICE, &id, etag);
    gate.open(json!({"summary": "A"}));
    let polled = poll.await.unwrap();
    let polled_tag = polled.headers()["etag"].clone();
    let polled = json_with_status(polled, 200).await;
    assert_eq!(polled["status"], "succeeded");
    assert_eq!(polled["result"], json!({"summary": "A"}));
    let read = app.get_job(ALICE, &id).await;
    assert_eq!(read.headers()["etag"], polled_tag);
    assert_eq!(json_with_status(read, 200).await, polled);
}

/// `If-None-Match` as RFC 9110 reads it: a list matches if any tag does, a weak tag matches its strong twin, `*`
/// matches any version; a list of other versions is a change.
#[tokio::test]
async fn if_none_match_takes_lists_weak_tags_and_a_star() {
    let app = TestApp::spawn().await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let id = created_id(&app, "k", &body).await;
    app.wait_until(ALICE, &id, |j| j["status"] == "running")
        .await;
    let etag = app.get_job(ALICE, &id).await.headers()["etag"]
        .to_str()
        .unwrap()
        .to_owned();
    let other = "\"00000000000000000000000000000000\"";
    for (named, status) in [
        (format!("{other}, {etag}"), 304),
        (format!("W/{etag}"), 304),
        ("*".to_owned(), 304),
        (other.to_owned(), 200),
        (format!("{other}, W/{other}"), 200),
    ] {
        let response = app
            .client
            .get(app.url(&format!("/v1/jobs/{id}")))
            .bearer_auth(ALICE)
            .header("if-none-match", &named)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "If-None-Match: {named}");
        assert_eq!(response.headers()["etag"], etag.as_str());
    }
}
