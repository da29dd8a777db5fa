//! The EventBridge bus through the functions: every settled job put once, whatever its endpoint does, and a put
//! that fails at the wire.

use super::*;

/// The functions with `bus` configured, their provider answering at once. The endpoint stand-ins are on loopback;
/// a failed try is due again at once (the functions' clock is the real one).
async fn functions_on_a_bus(bus: &str) -> Option<Functions> {
    let provider = StandIn::answering(json!({"summary": "The projector broke."})).await;
    let configure = |config: &mut Config| {
        config.event_bus = Some(bus.to_owned());
        config.allow_private_endpoints = true;
        config.event_backoff_base_ms = 0;
    };
    functions_with(provider, configure, None).await
}

/// With a bus configured, every settled job's event goes to it (its owner's endpoint or not), once: a bus that is
/// not there yet is tried again, and an endpoint that fails is tried again on its own, never putting the event on
/// the bus a second time. The api and worker functions only arm; the sweeper puts.
#[tokio::test]
async fn every_settled_job_goes_to_the_event_bus_once_whatever_its_endpoint_does() {
    let bus = unique_name("onejob-settled");
    let Some(f) = functions_on_a_bus(&bus).await else {
        return;
    };
    let receiver = StandIn::spawn(vec![Reply::Status(500, "down")], Reply::Answer(json!({}))).await;
    let alice = onejob::domain::Owner::parse("alice").unwrap();
    let url = format!("{}/chat/completions", receiver.base_url());
    let url = f.engine.check_endpoint(&url).await.unwrap();
    f.engine.put_endpoint(&alice, url).await.unwrap();

    // Alice's job (her endpoint hears of it too) and Bob's (no endpoint: only the bus).
    let (status, created) = f.api("api-create.json").await;
    assert_eq!(status, 201, "{created}");
    let mut bobs = event("api-create.json");
    bobs["requestContext"]["authorizer"]["jwt"]["claims"]["sub"] = json!("bob");
    let (status, bob_created) = f.api_event(bobs).await;
    assert_eq!(status, 201, "{bob_created}");
    let ids = [created["id"].clone(), bob_created["id"].clone()];
    f.work_the_queue().await;
    // The worker armed both; it delivers nothing.
    for id in &ids {
        let id = JobId::parse(id.as_str().unwrap()).unwrap();
        let (armed, _) = f.store.deliveries(&id).await.unwrap().expect("armed");
        assert!(armed.events.is_empty());
    }

    // The bus is not there yet: its tries fail and stay due; the endpoint's first try gets a 500.
    let sweeper = lambda::engine(&f.settings, &f.functions_aws, Role::SWEEPER)
        .await
        .unwrap();
    sweep(&sweeper, None).await.unwrap();
    assert_eq!(receiver.call_count(), 1);
    let alices = JobId::parse(ids[0].as_str().unwrap()).unwrap();
    let (tried, _) = f.store.deliveries(&alices).await.unwrap().unwrap();
    let by_sink = |sink: SinkKind| {
        tried
            .events
            .iter()
            .find(|e| e.sink == sink)
            .unwrap()
            .clone()
    };
    assert_eq!(
        by_sink(SinkKind::Endpoint).last_error.as_deref(),
        Some("HTTP 500")
    );
    let bus_error = by_sink(SinkKind::Bus).last_error.unwrap();
    assert!(bus_error.contains("ResourceNotFound"), "{bus_error}");

    // Now the bus is there, routing onejob's events to a queue.
    let aws = sdk_config().await.unwrap();
    let sqs = aws_sdk_sqs::Client::new(&aws);
    let heard = bus_for_test(&aws, &bus).await;

    // Each sink is tried again, and takes it: one entry per job on the bus, the endpoint's second try. (With the
    // invocation's deadline, as the function runs it: nothing more is due after the sweep's own batch.)
    let deadline = chrono::Utc::now() + chrono::Duration::minutes(1);
    let swept = sweep(&sweeper, Some(deadline)).await.unwrap();
    assert_eq!(swept.delivered, 2);
    assert_eq!(receiver.call_count(), 2);
    let mut put = drain(&sqs, &heard).await;
    put.sort_by_key(|e| e["detail"]["job"]["id"].as_str().unwrap().to_owned());
    let mut expected = ids.to_vec();
    expected.sort_by_key(|id| id.as_str().unwrap().to_owned());
    assert_eq!(
        put.iter()
            .map(|e| e["detail"]["job"]["id"].clone())
            .collect::<Vec<_>>(),
        expected
    );
    for entry in &put {
        assert_eq!(
            (&entry["source"], &entry["detail-type"]),
            (&json!("onejob"), &json!("job.settled"))
        );
        assert_eq!(entry["detail"]["job"]["status"], "succeeded");
        assert_eq!(
            entry["detail"]["job"]["result"]["summary"],
            "The projector broke."
        );
    }
    // The bus's event and the endpoint's are one event: one id.
    let alices_on_bus = put
        .iter()
        .find(|e| e["detail"]["job"]["id"] == ids[0])
        .unwrap();
    let posted = &receiver.calls()[1];
    assert_eq!(alices_on_bus["detail"]["id"], posted.body["id"]);
    assert_eq!(
        posted.headers["onejob-event-id"],
        posted.body["id"].as_str().unwrap()
    );

    // Both took it: nothing more, however often the sweeper looks.
    sweep(&sweeper, None).await.unwrap();
    sweep(&sweeper, None).await.unwrap();
    assert_eq!(receiver.call_count(), 2);
    assert!(drain(&sqs, &heard).await.is_empty());
    let (delivered, _) = f.store.deliveries(&alices).await.unwrap().unwrap();
    let tries: Vec<_> = delivered
        .events
        .iter()
        .map(|e| (e.sink, e.tries, e.delivered_at.is_some()))
        .collect();
    assert_eq!(
        tries,
        [(SinkKind::Endpoint, 2, true), (SinkKind::Bus, 2, true)]
    );
    let metrics = sweeper.metrics.drain_emf(0).join("\n");
    assert!(metrics.contains("\"sink\":\"bus\""), "{metrics}");
}

/// A put on the bus that fails at the wire. One never sent is a failed try, and the next sweep puts it: one entry.
/// One whose answer was lost had landed, and the SDK's own retry sends it again: the bus gets the event twice under
/// one event id (EventBridge keeps no token for a put; delivery is at least once, for the rule's target to drop the
/// repeat), and the deliverer records one try that delivered, so no sweep puts it a third time.
#[tokio::test]
async fn a_put_on_the_bus_that_fails_at_the_wire_is_delivered_at_least_once_under_one_id() {
    for lose_answer in [false, true] {
        let bus = unique_name("onejob-settled");
        let Some(f) = functions_on_a_bus(&bus).await else {
            return;
        };
        let aws = sdk_config().await.unwrap();
        let sqs = aws_sdk_sqs::Client::new(&aws);
        let heard = bus_for_test(&aws, &bus).await;
        let (status, created) = f.api("api-create.json").await;
        assert_eq!(status, 201, "{created}");
        f.work_the_queue().await;

        let fault = WireFault::new("job.settled", lose_answer);
        let config = aws_sdk_eventbridge::config::Builder::from(&f.functions_aws);
        let client =
            aws_sdk_eventbridge::Client::from_conf(config.interceptor(fault.clone()).build());
        // The sweeper's parts, its bus's client the one with the fault.
        let mut parts = lambda::parts(&f.settings, &f.functions_aws, Role::SWEEPER)
            .await
            .unwrap();
        let timeout = f.settings.config.engine_settings().events.timeout;
        parts.sinks.bus = Some(BusSink::new(bus.clone(), Some(client), timeout));
        let sweeper = Engine::new(parts, f.settings.config.engine_settings());
        let first = sweep(&sweeper, None).await.unwrap();
        assert!(fault.fired());
        assert_eq!(first.delivered, usize::from(lose_answer));
        sweep(&sweeper, None).await.unwrap();
        sweep(&sweeper, None).await.unwrap();

        let put = drain(&sqs, &heard).await;
        assert_eq!(put.len(), if lose_answer { 2 } else { 1 }, "{put:?}");
        assert!(
            put.iter()
                .all(|e| e["detail"]["id"] == put[0]["detail"]["id"])
        );
        assert!(
            put.iter()
                .all(|e| e["detail"]["job"]["id"] == created["id"])
        );
        let id = JobId::parse(created["id"].as_str().unwrap()).unwrap();
        let (deliveries, _) = f.store.deliveries(&id).await.unwrap().unwrap();
        let tries: Vec<_> = (deliveries.events.iter())
            .map(|e| (e.sink, e.tries, e.delivered_at.is_some()))
            .collect();
        let expected = if lose_answer { 1 } else { 2 };
        assert_eq!(
            tries,
            [(SinkKind::Bus, expected, true)],
            "lose_answer: {lose_answer}"
        );
    }
}
