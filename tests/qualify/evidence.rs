//! Stored evidence as the failover gate and the sweeper read it: voided by an edit, qualified again when asked.

use super::*;

/// An engine on `store` whose chain is `primary` → `fallback` (the stand-in), with the built-in contracts and the
/// contract `files`.
fn engine(store: Arc<dyn JobStore>, files: &[PathBuf], fallback: ProviderConfig) -> Engine {
    let mut config = Config {
        contract_files: files.to_vec(),
        ..Config::default()
    };
    config
        .providers
        .insert(ProviderName::parse("fallback").unwrap(), fallback);
    config.providers.insert(
        ProviderName::parse("primary").unwrap(),
        ProviderConfig::demo(Default::default(), 0),
    );
    let clock = clock();
    let (process, _) = Process::local(store, clock);
    let keys = ProviderKeys::default();
    startup::engine(&config, Role::COMMAND, &keys, process).unwrap()
}

/// A job on primary → fallback whose attempt 1 has ended, as the gate sees it.
fn job_after_primary() -> Job {
    let input = json!({"text": "x"});
    let mut job = Job::new(
        NewJob {
            owner: Owner::parse("alice").unwrap(),
            idempotency_key: IdempotencyKey::parse("k").unwrap(),
            fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
            contract: ContractRef::parse("summarize@1").unwrap(),
            input,
            providers: vec![
                ProviderName::parse("primary").unwrap(),
                ProviderName::parse("fallback").unwrap(),
            ],
        },
        chrono::Duration::days(30),
        &Stamp::fresh(Utc::now()),
    );
    job.attempts[0].state = onejob::domain::AttemptState::Failed;
    job
}

/// What failover does for `job` on `engine`'s ledger.
async fn gate_says(engine: &Engine, job: &Job) -> String {
    match job.failover_decision(&engine.failover(job).await.unwrap()) {
        FailoverDecision::Queue(provider) => format!("queue {provider}"),
        FailoverDecision::Stop(error) => error.code,
    }
}

#[tokio::test]
async fn editing_the_prompt_or_the_model_voids_a_stored_qualification() {
    let stand_in = StandIn::answering(good()).await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn JobStore> =
        Arc::new(SqliteStore::open(&dir.path().join("onejob.db")).unwrap());
    let original = engine(store.clone(), &[], openai(stand_in.base_url()));
    let job = job_after_primary();
    assert_eq!(gate_says(&original, &job).await, "fallback_not_qualified");

    let name = ProviderName::parse("fallback").unwrap();
    let contract = summarize(&original.contracts);
    let evidence = qualify(
        contract,
        &name,
        original.providers.get(&name).unwrap(),
        1,
        &*original.clock,
        |_, _, _| {},
    )
    .await;
    assert!(evidence.passed, "{}", summary(&evidence));
    store.put_qualification(&evidence).await.unwrap();
    assert_eq!(gate_says(&original, &job).await, "queue fallback");

    // The same contract with one word of its prompt changed: a new fingerprint, no evidence for it.
    let edited = tempfile::tempdir().unwrap();
    let file = edited.path().join("summarize.toml");
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts/summarize.toml");
    let text = std::fs::read_to_string(built_in).unwrap();
    std::fs::write(
        &file,
        text.replace("You summarise texts.", "You summarise texts briefly."),
    )
    .unwrap();
    let after_edit = engine(store.clone(), &[file], openai(stand_in.base_url()));
    assert_ne!(
        summarize(&after_edit.contracts).fingerprint,
        contract.fingerprint
    );
    assert_eq!(gate_says(&after_edit, &job).await, "fallback_not_qualified");

    // The same provider on another model, or with a shorter timeout than it was qualified with.
    let other_model = timed(ProviderKind::Openai(OpenAiSettings(ProviderEndpoint {
        model: "gpt-4o".into(),
        ..endpoint(stand_in.base_url())
    })));
    let shorter_timeout = openai(stand_in.base_url()).with_timings(10, LATE_MS);
    for changed in [other_model, shorter_timeout] {
        let after_swap = engine(store.clone(), &[], changed);
        assert_eq!(gate_says(&after_swap, &job).await, "fallback_not_qualified");
    }
}

/// With `requalify_stale`, the sweeper qualifies again, through the real client, a provider whose evidence grew
/// old, and then has nothing left to do; without it, the sweeper never calls a provider.
#[tokio::test]
async fn the_sweeper_requalifies_stale_evidence_only_when_asked() {
    let stand_in = StandIn::answering(good()).await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn JobStore> =
        Arc::new(SqliteStore::open(&dir.path().join("onejob.db")).unwrap());
    let mut engine = engine(store.clone(), &[], openai(stand_in.base_url()));
    let name = ProviderName::parse("fallback").unwrap();
    let evidence = qualify(
        summarize(&engine.contracts),
        &name,
        engine.providers.get(&name).unwrap(),
        1,
        &*engine.clock,
        |_, _, _| {},
    )
    .await;
    assert!(evidence.passed, "{}", summary(&evidence));
    let old = Qualification {
        checked_at: engine.clock.now() - Duration::days(31),
        ..evidence
    };
    store.put_qualification(&old).await.unwrap();
    let calls = stand_in.call_count();
    let needed = engine.needing_requalification().await.unwrap();
    assert_eq!(needed.len(), 1);
    assert_eq!(needed[0].2.code, "qualification_stale");

    assert_eq!(sweep(&engine, None).await.unwrap().requalified, 0);
    assert_eq!(stand_in.call_count(), calls, "off by default: no call");

    engine.settings.requalify_stale = true;
    assert_eq!(sweep(&engine, None).await.unwrap().requalified, 1);
    assert!(stand_in.call_count() > calls);
    let renewed = engine
        .qualification(&summarize(&engine.contracts).reference, &name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (renewed.passed, renewed.checked_at),
        (true, engine.clock.now())
    );
    assert!(engine.needing_requalification().await.unwrap().is_empty());
    assert_eq!(sweep(&engine, None).await.unwrap().requalified, 0);
}
