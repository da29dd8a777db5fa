//! Completion events: an owner's endpoint hears of each job once it settles, signed, until it answers 2xx; a crash
//! does not lose a delivery; an endpoint on a private address is refused.

use chrono::Duration;
use hmac::{Hmac, Mac};
use onejob::clock::Clock;
use onejob::config::Config;
use onejob::domain::{AttemptRef, JobId, Owner, Stamp, WriteToken};
use onejob::store::{EventStore, JobStore};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::helpers::{ALICE, BOB, TestApp, assert_problem, config, json_with_status};
use crate::support::faulty::{Call, Fault};
use crate::support::stand_in::{Call as Received, Gate, Reply, StandIn};

/// An app whose owners may register endpoints on loopback (the receiver stand-in is there).
async fn app() -> TestApp {
    TestApp::spawn_with(Config {
        allow_private_endpoints: true,
        ..config()
    })
    .await
}

async fn register(app: &TestApp, token: &str, url: &str) -> reqwest::Response {
    app.client
        .put(app.url("/v1/endpoint"))
        .bearer_auth(token)
        .json(&json!({ "url": url }))
        .send()
        .await
        .unwrap()
}

/// Registers `receiver` as Alice's endpoint; its secret.
async fn register_receiver(app: &TestApp, receiver: &StandIn) -> String {
    let url = format!("{}/chat/completions", receiver.base_url());
    let endpoint = json_with_status(register(app, ALICE, &url).await, 200).await;
    assert_eq!(endpoint["url"], url);
    endpoint["secret"].as_str().unwrap().to_owned()
}

/// A job of Alice's, cancelled at once: settled, with nothing left to run.
async fn settled_job(app: &TestApp, key: &str) -> String {
    settled_job_of(app, ALICE, key).await
}

/// A job of the owner of `token`, cancelled at once.
async fn settled_job_of(app: &TestApp, token: &str, key: &str) -> String {
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let job = json_with_status(app.create(token, key, &body).await, 201).await;
    let id = job["id"].as_str().unwrap().to_owned();
    json_with_status(app.cancel_job(token, &id).await, 200).await;
    id
}

/// The job's events once `ready` holds of them (the deliverer writes what a try came to after the receiver
/// answered). The real-time bound only turns a hang into a failure.
async fn events_when(app: &TestApp, id: &str, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let poll = async {
        loop {
            let list =
                json_with_status(app.get(ALICE, &format!("/v1/jobs/{id}/events")).await, 200).await;
            let events = list["events"].as_array().unwrap().clone();
            if ready(&events) {
                return events;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), poll)
        .await
        .expect("the events never got there")
}

/// The event id of every call the receiver got, each signature checked.
fn event_ids(receiver: &StandIn, secret: &str) -> Vec<String> {
    receiver
        .calls()
        .iter()
        .map(|c| verified_event_id(c, secret))
        .collect()
}

/// Whether the job's one event was delivered.
fn delivered(events: &[Value]) -> bool {
    matches!(events, [one] if !one["delivered_at"].is_null())
}

/// Whether the job's one event was tried `n` times.
fn tried(events: &[Value], n: u32) -> bool {
    matches!(events, [one] if one["tries"] == n)
}

/// Checks a received call's signature as a receiver would, from the secret alone; its event id.
fn verified_event_id(call: &Received, secret: &str) -> String {
    let header = call.headers["onejob-signature"].to_str().unwrap();
    let (t, v1) = header
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
        .unwrap_or_else(|| panic!("not a signature: {header}"));
    let body = serde_json::to_vec(&call.body).unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(&body);
    mac.verify_slice(&hex::decode(v1).unwrap())
        .expect("the signature is the HMAC of the time and the body under the secret");
    let id = call.headers["onejob-event-id"].to_str().unwrap().to_owned();
    assert_eq!(call.body["id"], id.as_str());
    id
}

#[tokio::test]
async fn a_receiver_that_fails_twice_gets_one_signed_event_three_times_and_no_more() {
    let receiver = StandIn::spawn(
        vec![Reply::Status(500, "down"), Reply::Status(503, "still down")],
        Reply::Answer(json!({})),
    )
    .await;
    let app = app().await;
    let secret = register_receiver(&app, &receiver).await;
    let id = settled_job(&app, "k").await;

    receiver.received(1).await;
    events_when(&app, &id, |e| tried(e, 1)).await;
    // The deliverer is driven here (the server's own also looks each second of its clock, and whichever claims
    // the deliveries first sends).
    app.clock.advance(Duration::seconds(1));
    app.engine().deliver_due().await.unwrap();
    receiver.received(2).await;
    events_when(&app, &id, |e| tried(e, 2)).await;
    // The second wait is twice the first.
    app.clock.advance(Duration::milliseconds(1_999));
    app.engine().deliver_due().await.unwrap();
    assert_eq!(
        receiver.call_count(),
        2,
        "not due before its backoff: {:?} {:?}",
        receiver
            .calls()
            .iter()
            .map(|c| c.headers["onejob-signature"].clone())
            .collect::<Vec<_>>(),
        app.get(ALICE, &format!("/v1/jobs/{id}/events"))
            .await
            .text()
            .await
    );
    app.clock.advance(Duration::milliseconds(1));
    app.engine().deliver_due().await.unwrap();
    receiver.received(3).await;
    let events = events_when(&app, &id, delivered).await;

    let ids = event_ids(&receiver, &secret);
    assert_eq!(ids, vec![ids[0].clone(); 3], "one event, three tries");
    assert!(ids[0].starts_with("evt_"), "{}", ids[0]);
    let body = &receiver.calls()[2].body;
    assert_eq!(
        (&body["type"], &body["job"]["id"], &body["job"]["status"]),
        (&json!("job.settled"), &json!(id), &json!("cancelled"))
    );
    assert_eq!(events.len(), 1);
    assert_eq!(
        (
            &events[0]["id"],
            &events[0]["tries"],
            &events[0]["last_error"]
        ),
        (&json!(ids[0]), &json!(3), &Value::Null)
    );

    // Delivered: nothing is due any more, however long the deliverer looks.
    app.clock.advance(Duration::hours(2));
    assert_eq!(app.engine().deliver_due().await.unwrap(), 0);
    assert_eq!(receiver.call_count(), 3);

    // The operator sees each try by outcome, and the delivery 3 s after the settle.
    let metrics = app.metrics().await;
    for line in [
        "onejob_event_tries_total{sink=\"endpoint\",outcome=\"rejected\"} 2",
        "onejob_event_tries_total{sink=\"endpoint\",outcome=\"delivered\"} 1",
        "onejob_event_delivery_seconds_bucket{sink=\"endpoint\",le=\"1\"} 0",
        "onejob_event_delivery_seconds_bucket{sink=\"endpoint\",le=\"5\"} 1",
        "onejob_event_delivery_seconds_sum{sink=\"endpoint\"} 3",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_server_killed_mid_delivery_delivers_the_same_event_after_its_restart() {
    let gate = Gate::new();
    let receiver = StandIn::spawn(vec![Reply::Held(gate)], Reply::Answer(json!({}))).await;
    let app = app().await;
    let secret = register_receiver(&app, &receiver).await;
    let id = settled_job(&app, "k").await;
    // The first delivery is in flight when the server dies.
    receiver.received(1).await;
    let app = app.crash_and_restart(Duration::seconds(6)).await;

    receiver.received(2).await;
    let events = events_when(&app, &id, delivered).await;
    let ids = event_ids(&receiver, &secret);
    assert_eq!(ids[0], ids[1], "the same event, from the store");
    assert_eq!(events[0]["id"], ids[0].as_str());
    assert_eq!(receiver.call_count(), 2);
}

#[tokio::test]
async fn endpoints_on_private_addresses_are_refused_and_nothing_is_registered() {
    let app = TestApp::spawn().await;
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://[fd00::1]/hook",
        "http://0.0.0.0/hook",
        // Addresses that carry a private IPv4 one (NAT64, 6to4, IPv4-compatible), and the ranges that are not
        // globally routable unicast: Teredo, site-local, local-use NAT64, IETF assignments, benchmarking,
        // reserved, documentation.
        "http://[64:ff9b::7f00:1]/hook",
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "http://[2002:a9fe:a9fe::1]/hook",
        "http://[::127.0.0.1]/hook",
        "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/hook",
        "http://[fec0::1]/hook",
        "http://[64:ff9b:1::808:808]/hook",
        "http://[2001:db8::1]/hook",
        "http://192.0.0.170/hook",
        "http://198.18.0.1/hook",
        "http://240.0.0.1/hook",
        "http://203.0.113.7/hook",
    ] {
        let refused =
            assert_problem(register(&app, ALICE, url).await, 422, "endpoint_refused").await;
        assert!(
            refused["detail"].as_str().unwrap().contains("private"),
            "{url}: {refused}"
        );
    }
    for url in [
        "ftp://example.com/",
        "not a url",
        "https://user:pw@example.com/",
        "http://93.184.215.14:0/hook",
    ] {
        assert_problem(register(&app, ALICE, url).await, 422, "endpoint_refused").await;
    }
    let missing = app.get(ALICE, "/v1/endpoint").await;
    assert_problem(missing, 404, "endpoint_not_found").await;
}

#[tokio::test]
async fn an_endpoint_is_the_owners_own_and_keeps_its_secret_when_moved() {
    let app = app().await;
    let first = json_with_status(register(&app, ALICE, "http://127.0.0.1:9/a").await, 200).await;
    let moved = json_with_status(register(&app, ALICE, "http://127.0.0.1:9/b").await, 200).await;
    assert_eq!(moved["secret"], first["secret"]);
    assert_eq!(moved["url"], "http://127.0.0.1:9/b");
    let read = json_with_status(app.get(ALICE, "/v1/endpoint").await, 200).await;
    assert_eq!(read["secret"], first["secret"]);
    assert_problem(
        app.get(BOB, "/v1/endpoint").await,
        404,
        "endpoint_not_found",
    )
    .await;
    let deleted = app
        .client
        .delete(app.url("/v1/endpoint"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    assert_problem(
        app.get(ALICE, "/v1/endpoint").await,
        404,
        "endpoint_not_found",
    )
    .await;
    // Registered again: a new secret.
    let again = json_with_status(register(&app, ALICE, "http://127.0.0.1:9/a").await, 200).await;
    assert_ne!(again["secret"], first["secret"]);
}

#[tokio::test]
async fn a_job_ended_without_an_endpoint_has_no_events_and_another_owner_sees_none() {
    let receiver = StandIn::answering(json!({})).await;
    let app = app().await;
    let before = settled_job(&app, "before").await;
    app.clock.advance(Duration::seconds(1));
    register_receiver(&app, &receiver).await;
    // A message of the job that comes back only now (the queue's redelivery) arms its deliveries again; the
    // endpoint registered since hears nothing of it.
    let attempt = AttemptRef {
        job_id: JobId::parse(&before).unwrap(),
        number: 1,
    };
    let dropped = onejob::worker::process_attempt(app.engine(), &attempt).await;
    assert_eq!(dropped.unwrap(), onejob::worker::Processed::Dropped);
    app.engine().deliver_due().await.unwrap();
    let after = settled_job(&app, "after").await;
    receiver.received(1).await;
    events_when(&app, &after, delivered).await;
    let none = json_with_status(
        app.get(ALICE, &format!("/v1/jobs/{before}/events")).await,
        200,
    )
    .await;
    assert_eq!(none["events"], json!([]));
    let foreign = app.get(BOB, &format!("/v1/jobs/{after}/events")).await;
    assert_problem(foreign, 404, "job_not_found").await;
    assert_eq!(receiver.calls()[0].body["job"]["id"], after.as_str());
    assert_eq!(receiver.call_count(), 1);
}

/// The store fails around the deliveries' writes: scheduling that landed with its answer lost is tried again
/// (and is still one event); a claim whose answer was lost holds until it runs out, then the event goes once; a
/// try whose outcome was not written is made again, with the same event id.
#[tokio::test]
async fn store_faults_around_deliveries_lose_no_event_and_repeat_none_that_was_recorded() {
    let receiver = StandIn::answering(json!({})).await;
    let app = app().await;
    let secret = register_receiver(&app, &receiver).await;

    // Arming landed, its answer lost: tried again at once.
    app.faults.plan(&[(Call::ArmDeliveries, Fault::After)]);
    let armed_twice = settled_job(&app, "armed-twice").await;
    receiver.received(1).await;
    events_when(&app, &armed_twice, delivered).await;
    assert!(app.faults.spent());
    assert_eq!(receiver.call_count(), 1);

    // The claim landed, its answer lost: nobody sends until the claim (the timeout and a second, 6 s) runs out.
    app.faults.plan(&[(Call::PutDeliveries, Fault::After)]);
    let claim_lost = settled_job(&app, "claim-lost").await;
    let claimed = events_when(&app, &claim_lost, |_| app.faults.spent()).await;
    assert!(
        claimed.is_empty(),
        "nothing sent under a claim: {claimed:?}"
    );
    app.engine().deliver_due().await.unwrap();
    assert_eq!(receiver.call_count(), 1);
    app.clock.advance(Duration::seconds(6));
    app.engine().deliver_due().await.unwrap();
    receiver.received(2).await;
    events_when(&app, &claim_lost, delivered).await;

    // Delivered, but the record of it failed before it was written: it goes again when the claim runs out.
    app.faults.plan(&[
        (Call::PutDeliveries, Fault::Pass),
        (Call::PutDeliveries, Fault::Before),
    ]);
    let record_lost = settled_job(&app, "record-lost").await;
    receiver.received(3).await;
    events_when(&app, &record_lost, |_| app.faults.spent()).await;
    app.clock.advance(Duration::seconds(6));
    app.engine().deliver_due().await.unwrap();
    receiver.received(4).await;
    let events = events_when(&app, &record_lost, delivered).await;
    let ids = event_ids(&receiver, &secret);
    assert_eq!(ids[2], ids[3], "the repeat is the same event");
    assert_eq!(events[0]["id"], ids[2].as_str());
    assert_eq!(receiver.call_count(), 4);
}

/// A step that ended a job and stopped before its event was armed (a Lambda out of time right after its write)
/// left its message to come back: the redelivery, whose claim is refused, arms the event, which goes once.
#[tokio::test]
async fn a_message_redelivered_after_its_job_ended_arms_the_event_its_step_did_not() {
    let receiver = StandIn::answering(json!({})).await;
    let app = app().await;
    let secret = register_receiver(&app, &receiver).await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let job = json_with_status(app.create(ALICE, "k", &body).await, 201).await;
    let id = JobId::parse(job["id"].as_str().unwrap()).unwrap();
    // The job ends by a write that reaches the store alone: the process that made it heard nothing after it.
    let stamp = Stamp::new(WriteToken::new(), app.clock.now());
    let owner = Owner::parse("alice").unwrap();
    app.faults.cancel_job(&owner, &id, &stamp).await.unwrap();
    assert_eq!(receiver.call_count(), 0);

    let message = AttemptRef {
        job_id: id.clone(),
        number: 1,
    };
    let processed = onejob::worker::process_attempt(app.engine(), &message)
        .await
        .unwrap();
    assert_eq!(processed, onejob::worker::Processed::Dropped);
    receiver.received(1).await;
    let events = events_when(&app, id.as_str(), delivered).await;
    assert_eq!(
        event_ids(&receiver, &secret),
        [events[0]["id"].as_str().unwrap()]
    );
    // Another copy of the message arms nothing new.
    onejob::worker::process_attempt(app.engine(), &message)
        .await
        .unwrap();
    app.engine().deliver_due().await.unwrap();
    assert_eq!(receiver.call_count(), 1);
}

/// A cancel whose event the store would not arm through its budget fails (the cancel itself stands), and the
/// client's repeat arms it: one event.
#[tokio::test]
async fn a_cancel_whose_event_was_not_armed_fails_and_its_repeat_arms_it() {
    let receiver = StandIn::answering(json!({})).await;
    let app = app().await;
    register_receiver(&app, &receiver).await;
    let body = json!({"contract": "summarize@1", "input": {"text": "x"}});
    let job = json_with_status(app.create(ALICE, "k", &body).await, 201).await;
    let id = job["id"].as_str().unwrap().to_owned();
    app.faults
        .plan(&[(Call::ArmDeliveries, Fault::Before); 10_000]);
    let cancel = app.cancel_job(ALICE, &id);
    let mut cancel = std::pin::pin!(cancel);
    // The arming's backoff waits on the server's clock: moved on whenever something sleeps on it.
    let failed = loop {
        tokio::select! {
            answer = &mut cancel => break answer,
            _ = tokio::time::sleep(std::time::Duration::from_millis(5)) => {
                if app.clock.sleepers() > 0 {
                    app.clock.advance(Duration::seconds(2));
                }
            }
        }
    };
    assert_eq!(failed.status(), 500);
    let stored = json_with_status(app.get_job(ALICE, &id).await, 200).await;
    assert_eq!(stored["status"], "cancelled", "the cancel stands");
    // (On SQLite the cancel's own transaction armed the event: it may be out already.)

    app.faults.clear();
    json_with_status(app.cancel_job(ALICE, &id).await, 200).await;
    receiver.received(1).await;
    events_when(&app, &id, delivered).await;
    app.engine().deliver_due().await.unwrap();
    assert_eq!(receiver.call_count(), 1);
}

/// An endpoint that is private by the time an event goes (its name now resolves to loopback, or it was stored
/// before the rule) is not reached: the try fails, and says why.
#[tokio::test]
async fn an_endpoint_private_at_delivery_time_is_not_reached() {
    let receiver = StandIn::answering(json!({})).await;
    let app = TestApp::spawn().await;
    let owner = onejob::domain::Owner::parse("alice").unwrap();
    let port = receiver.addr.port();
    for (key, url) in [
        (
            "by-name",
            format!("http://localhost:{port}/v1/chat/completions"),
        ),
        (
            "by-address",
            format!("http://127.0.0.1:{port}/v1/chat/completions"),
        ),
    ] {
        let endpoint = onejob::domain::Endpoint::new(url, app.clock.now());
        let store = &app.faults;
        store.put_endpoint(&owner, Some(&endpoint)).await.unwrap();
        let id = settled_job(&app, key).await;
        app.engine().deliver_due().await.unwrap();
        let events = events_when(&app, &id, |e| tried(e, 1)).await;
        let error = events[0]["last_error"].as_str().unwrap();
        assert!(error.contains("private"), "{error}");
        assert!(events[0]["delivered_at"].is_null());
    }
    assert_eq!(receiver.call_count(), 0);
}

/// The server's own deliverer, undriven: Bob's endpoint holds every try (within a minute's timeout) and Alice's
/// event still goes out at once — the batch holding Bob's tries holds up no other batch.
#[tokio::test]
async fn one_owners_slow_endpoint_holds_up_no_other_owners_event() {
    let app = TestApp::spawn_with(Config {
        allow_private_endpoints: true,
        event_timeout_ms: 60_000,
        ..config()
    })
    .await;
    let gate = Gate::new();
    let bobs = StandIn::spawn(vec![], Reply::Held(gate.clone())).await;
    let url = format!("{}/chat/completions", bobs.base_url());
    json_with_status(register(&app, BOB, &url).await, 200).await;
    for i in 0..6 {
        settled_job_of(&app, BOB, &format!("bob-{i}")).await;
    }
    let in_flight = onejob::domain::event::ENDPOINT_IN_FLIGHT;
    bobs.received(in_flight).await;

    let alices = StandIn::answering(json!({})).await;
    register_receiver(&app, &alices).await;
    settled_job(&app, "alice-1").await;
    alices.received(1).await;
    assert_eq!(
        bobs.call_count(),
        in_flight,
        "bob's tries still held, no more"
    );
    gate.open(json!({}));
}
