//! The promise where providers' shared state meets owners' inputs, on every store: refusals and breaches never move a
//! breaker or a standing, old evidence never overwrites new, jobs waiting on a probe.

use super::*;

/// Invariant 15: refusals the request caused (a 400, a 422) describe the input, not the provider: however many
/// one owner sends, the shared breaker stays closed and another owner's job is called — and sent between another
/// owner's failures, through another process, they do not hold a failing provider's breaker closed either. Keys
/// the provider refuses (401) describe the deployment: five of them open it.
pub(crate) async fn refusals_the_input_caused_never_open_a_breaker(store: Arc<dyn JobStore>) {
    let refusing = StandIn::spawn(
        vec![Reply::Status(400, "bad input"); 4]
            .into_iter()
            .chain(vec![Reply::Status(422, "unprocessable"); 4])
            .collect(),
        Reply::Answer(summary("A")),
    )
    .await;
    let unused = StandIn::answering(summary("B")).await;
    let mut rig = Rig::new(
        store.clone(),
        openai(refusing.base_url()),
        openai(unused.base_url()),
    );
    let primary = ProviderName::parse("primary").unwrap();
    for i in 0..8 {
        let (job, message) = rig.create(&format!("refused-{i}")).await;
        assert_eq!(rig.process(&message).await, Processed::Failed);
        let error = rig.attempt_error(&job, 1).await;
        assert_eq!(error.code, "provider_refused");
    }
    let (breaker, _) = store.breaker(&primary).await.unwrap();
    assert!(breaker.is_clean(), "{breaker:?}");
    let (job, message) = rig.create("next").await;
    assert_eq!(rig.process(&message).await, Processed::Succeeded);
    assert_eq!(rig.job(&job).await.completed_by, Some(1));
    assert_eq!(refusing.call_count(), 9);

    let unauthorized = StandIn::spawn(vec![], Reply::Status(401, "invalid api key")).await;
    let mut rig = Rig::new(
        store.clone(),
        openai(unauthorized.base_url()),
        openai(unused.base_url()),
    );
    for i in 0..5 {
        let (_, message) = rig.create(&format!("unauthorized-{i}")).await;
        assert_eq!(rig.process(&message).await, Processed::Failed);
    }
    let (breaker, _) = store.breaker(&primary).await.unwrap();
    assert_eq!(breaker.trips, 1, "{breaker:?}");

    // A provider failing for bob (500s), alice's bad requests (400s) between each of his failures, each owner
    // through a process of its own: his five failures open it all the same.
    let failing = StandIn::spawn(
        [Reply::Status(403, "down"), Reply::Status(400, "bad input")]
            .into_iter()
            .cycle()
            .take(9)
            .collect(),
        Reply::Answer(summary("A")),
    )
    .await;
    let process = || {
        Rig::new(
            store.clone(),
            openai(failing.base_url()),
            openai(unused.base_url()),
        )
    };
    let (mut bob, mut alice) = (process().for_owner("bob"), process().for_owner("alice"));
    // The breaker the keys opened, closed and forgotten: a provider starting afresh.
    let (_, rev) = store.breaker(&primary).await.unwrap();
    assert!(
        store
            .put_breaker(&primary, &Breaker::default(), rev)
            .await
            .unwrap()
    );
    for i in 0..5 {
        let (_, message) = bob.create(&format!("failing-{i}")).await;
        assert_eq!(bob.process(&message).await, Processed::Failed);
        if i < 4 {
            let (_, message) = alice.create(&format!("between-{i}")).await;
            assert_eq!(alice.process(&message).await, Processed::Failed);
        }
    }
    assert_eq!(failing.call_count(), 9);
    let (breaker, _) = store.breaker(&primary).await.unwrap();
    assert_eq!(
        breaker.trips, 1,
        "alice's refusals held it closed: {breaker:?}"
    );
    assert!(breaker.open_until.is_some(), "{breaker:?}");
}

/// Invariant 15: one owner's inputs make a qualified fallback answer in prose three times. That is suspicion, not
/// proof: the fallback keeps its standing and another owner's job fails over to it; the sweeper qualifies it
/// again on the contract's own samples, and only their failure takes the standing away.
pub(crate) async fn production_breaches_only_suspect_and_the_samples_decide(
    store: Arc<dyn JobStore>,
) {
    let down = StandIn::spawn(vec![], Reply::Status(403, "down")).await;
    let prose = Reply::Prose("Sure! Here is a summary, in prose as you asked.");
    let mut replies = vec![prose.clone(); 3];
    // Bob's job gets a good answer; then the nine runs of the requalification answer in prose.
    replies.push(Reply::Answer(summary("B")));
    let fallback = StandIn::spawn(replies, prose).await;
    let mut rig = Rig::configured(
        store,
        openai(down.base_url()),
        openai(fallback.base_url()),
        |config| {
            config.requalify_stale = true;
            config.breaker_threshold = 0;
        },
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let standing = |rig: &Rig| {
        let engine = rig.engine.clone();
        async move {
            let contract = onejob::domain::ContractRef::parse("summarize@1").unwrap();
            let fallback = ProviderName::parse("fallback").unwrap();
            let evidence = engine.qualification(&contract, &fallback).await.unwrap();
            let now = engine.clock.now();
            (
                Standing::of(
                    evidence.as_ref(),
                    now,
                    engine.settings.qualification_max_age,
                ),
                evidence,
            )
        }
    };
    for i in 0..3 {
        let (job, message) = rig.create(&format!("prose-{i}")).await;
        assert_eq!(rig.process(&message).await, Processed::Failed);
        let to_fallback = rig.next_message();
        assert_eq!(rig.process(&to_fallback).await, Processed::Failed);
        let failed = rig.job(&job).await;
        assert_eq!(
            failed.attempt(2).unwrap().error.as_ref().unwrap().code,
            "output_not_json"
        );
    }
    let (now, evidence) = standing(&rig).await;
    assert_eq!(now, Standing::Qualified);
    let suspicion = evidence.unwrap().suspected.unwrap();
    assert_eq!(suspicion.reason.code, "contract_broken");
    assert_eq!(suspicion.attempts.len(), 3);

    let bob = Owner::parse("bob").unwrap();
    let intent = onejob::domain::NewJob {
        owner: bob.clone(),
        ..rig.intent("bob")
    };
    let job = rig.engine.create_job(intent).await.unwrap().job().clone();
    let first = rig.next_message();
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let to_fallback = rig.next_message();
    assert_eq!(rig.process(&to_fallback).await, Processed::Succeeded);
    let done = rig.engine.get_job(&bob, &job.id).await.unwrap().unwrap();
    assert_eq!(
        done.completed_by,
        Some(2),
        "another owner still fails over to it"
    );

    // A sweep whose deadline leaves no time for the nine runs (each bounded by the provider's timeout) does not
    // start them; one with the time does.
    let no_time = sweep(&rig.engine, Some(rig.clock.now())).await.unwrap();
    assert_eq!(no_time.requalified, 0);
    assert_eq!(fallback.call_count(), 4);
    let swept = sweep(&rig.engine, None).await.unwrap();
    assert_eq!(swept.requalified, 1);
    let (now, evidence) = standing(&rig).await;
    assert_eq!(now, Standing::Failed, "{evidence:?}");
    assert_eq!(fallback.call_count(), 4 + 9);
}

/// A note on evidence is a compare-and-swap on the evidence as read: a strike made on an old pass never
/// overwrites a qualification that failed meanwhile.
pub(crate) async fn a_note_on_old_evidence_never_overwrites_a_newer_qualification(
    store: Arc<dyn JobStore>,
) {
    let unused = StandIn::answering(summary("A")).await;
    let rig = Rig::new(
        store.clone(),
        openai(unused.base_url()),
        openai(unused.base_url()),
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let contract = onejob::domain::ContractRef::parse("summarize@1").unwrap();
    let fallback = ProviderName::parse("fallback").unwrap();
    let passed = rig
        .engine
        .qualification(&contract, &fallback)
        .await
        .unwrap()
        .unwrap();
    let bad = ErrorInfo::new("output_invalid", "extra key");
    let mut struck = passed.clone();
    assert!(struck.observe("job_1#1", None, Some(&bad), rig.clock.now()));
    assert!(store.replace_qualification(&passed, &struck).await.unwrap());
    let mut again = passed.clone();
    again.observe("job_2#1", None, Some(&bad), rig.clock.now());
    assert!(
        !store.replace_qualification(&passed, &again).await.unwrap(),
        "the stored evidence is no longer what this writer read"
    );
    let failed = onejob::domain::Qualification {
        passed: false,
        strikes: Vec::new(),
        ..passed.clone()
    };
    store.put_qualification(&failed).await.unwrap();
    let mut late = struck.clone();
    late.observe("job_3#1", None, Some(&bad), rig.clock.now());
    assert!(!store.replace_qualification(&struck, &late).await.unwrap());
    let stored = rig
        .engine
        .qualification(&contract, &fallback)
        .await
        .unwrap();
    assert_eq!(stored, Some(failed));
}

/// A breaker opens; its probe runs (held). The other jobs on the provider, with nowhere else to go, are not
/// claimed and not charged a try: their attempts stay queued and their messages come back within the probe's own
/// timeout. Once the probe answers, each of them is called once and succeeds; none failed
/// `fallback_not_qualified`.
pub(crate) async fn jobs_waiting_on_a_probe_are_called_once_it_answers(store: Arc<dyn JobStore>) {
    let probe = Gate::new();
    let replies = vec![Reply::Status(403, "down"); 5]
        .into_iter()
        .chain([Reply::Held(probe.clone())])
        .collect();
    let primary = StandIn::spawn(replies, Reply::Answer(summary("A"))).await;
    let unqualified = StandIn::answering(summary("B")).await;
    let mut rig = Rig::new(
        store,
        openai(primary.base_url()),
        openai(unqualified.base_url()),
    );
    for i in 0..5 {
        let (_, message) = rig.create(&format!("down-{i}")).await;
        assert_eq!(rig.process(&message).await, Processed::Failed);
    }
    rig.advance(rig.engine.settings.breaker_cooldown.num_milliseconds() as u64);
    let (probed, probe_message) = rig.create_sent("probe").await;
    let probing = rig.process_sent_in_background(&probe_message);
    primary.received(6).await;
    let mut waiting = Vec::new();
    for i in 0..4 {
        let (job, message) = rig.create_sent(&format!("waiting-{i}")).await;
        assert_eq!(
            rig.process_sent_in_background(&message).await.unwrap(),
            Processed::Waiting
        );
        let queued = rig.job(&job).await;
        assert_eq!(queued.attempts.len(), 1, "no try charged: {queued:?}");
        assert_eq!(queued.attempt(1).unwrap().state, AttemptState::Queued);
        waiting.push(job);
    }
    assert_eq!(primary.call_count(), 6);
    probe.open(summary("the probe's answer"));
    assert_eq!(probing.await.unwrap(), Processed::Succeeded);
    assert_eq!(rig.job(&probed).await.completed_by, Some(1));
    // Within the provider's timeout, the waiting messages come back.
    rig.advance(TIMEOUT_MS);
    for _ in &waiting {
        let message = rig.sent().await;
        assert_eq!(
            rig.process_sent_in_background(&message).await.unwrap(),
            Processed::Succeeded
        );
    }
    for job in &waiting {
        let done = rig.job(job).await;
        assert_eq!((done.completed_by, done.attempts.len()), (Some(1), 1));
    }
    assert_eq!(primary.call_count(), 10);
    assert_eq!(unqualified.call_count(), 0);
}

/// A provider's endpoint that redirects (a 307 to another origin) is never followed, by any kind or lane: the key —
/// in the kind's header or the config's — and the prompt would go with it. The 3xx is the provider's refusal: the
/// attempt fails, nothing reached the other origin.
pub(crate) async fn a_redirect_is_never_followed_so_the_key_goes_nowhere_else(
    store: Arc<dyn JobStore>,
) {
    let elsewhere = StandIn::answering(summary("taken elsewhere")).await;
    let target = elsewhere.base_url();
    let redirecting = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let to = format!("{target}{}", uri.path().trim_start_matches("/v1"));
        async move {
            (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [("location", to)],
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, redirecting).await });
    let unused = StandIn::answering(summary("B")).await;
    let keyed = |mut config: onejob::providers::ProviderConfig, header: Option<&str>| {
        if let onejob::providers::ProviderKind::Openai(settings) = &mut config.kind {
            settings.api_key_env = Some("CARGO_PKG_NAME".into());
            settings.api_key_header = header.map(str::to_owned);
        }
        if let onejob::providers::ProviderKind::Anthropic(settings) = &mut config.kind {
            settings.api_key_env = Some("CARGO_PKG_NAME".into());
        }
        config
    };
    let anthropic = crate::support::stand_in::anthropic;
    for (case, primary) in [
        ("anthropic", keyed(anthropic(base_url.clone()), None)),
        (
            "azure-style",
            keyed(openai(base_url.clone()), Some("api-key")),
        ),
    ] {
        let mut rig = Rig::new(store.clone(), primary, openai(unused.base_url()));
        let (job, message) = rig.create(&format!("redirected-{case}")).await;
        assert_eq!(rig.process(&message).await, Processed::Failed, "{case}");
        let error = rig.attempt_error(&job, 1).await;
        assert_eq!(error.code, "provider_refused", "{case}");
        assert!(error.message.contains("HTTP 307"), "{case}: {error:?}");
    }
    assert_eq!(elsewhere.call_count(), 0, "followed to the other origin");
}
