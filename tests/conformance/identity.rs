//! One job per key and owner: concurrent creates, conflicts, owners kept apart, listings, and the ledger's evidence.

use super::*;

/// `n` creates of alice's `key` with `input` at once, each a write of its own.
async fn creates_at_once(
    store: &Arc<dyn JobStore>,
    n: i64,
    key: &str,
    input: &Value,
) -> Vec<CreateOutcome> {
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let (store, new) = (store.clone(), new_job("alice", key, input.clone()));
        tasks.spawn(async move { store.create_job(new, RETENTION, &by(i)).await.unwrap() });
    }
    tasks.join_all().await
}

pub(crate) async fn concurrent_creates_with_one_key_make_one_job(store: Arc<dyn JobStore>) {
    let outcomes = creates_at_once(&store, 50, "double-click", &json!({"text": "hi"})).await;
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, CreateOutcome::Created(_)))
        .count();
    let replayed = outcomes
        .iter()
        .filter(|o| matches!(o, CreateOutcome::Replayed(_)))
        .count();
    assert_eq!((created, replayed), (1, 49));
    let id = &outcomes[0].job().id;
    assert!(outcomes.iter().all(|o| &o.job().id == id));
    let jobs = all_jobs(store.as_ref(), "alice").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].attempts.len(), 1, "one attempt, queued once");
}

pub(crate) async fn a_changed_fingerprint_conflicts_and_leaves_the_job_unchanged(
    store: Arc<dyn JobStore>,
) {
    let original = created(
        store.as_ref(),
        new_job("alice", "k", json!({"text": "a"})),
        at(0),
    )
    .await;
    let outcome = store
        .create_job(
            new_job("alice", "k", json!({"text": "b"})),
            RETENTION,
            &by(5),
        )
        .await
        .unwrap();
    assert_eq!(outcome, CreateOutcome::Conflict(original.clone()));
    let stored = store
        .get_job(&original.owner, &original.id, later())
        .await
        .unwrap();
    assert_eq!(stored, Some(original));
    assert_eq!(all_jobs(store.as_ref(), "alice").await.len(), 1);
}

pub(crate) async fn owners_are_isolated(store: Arc<dyn JobStore>) {
    let alice = created(
        store.as_ref(),
        new_job("alice", "k", json!({"text": "a"})),
        at(0),
    )
    .await;
    let bob_owner = owner("bob");
    assert_eq!(
        store.get_job(&bob_owner, &alice.id, later()).await.unwrap(),
        None
    );
    assert!(matches!(
        store.cancel_job(&bob_owner, &alice.id, &by(1)).await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store
            .add_attempt(
                &bob_owner,
                &alice.id,
                Some(provider("fallback")),
                &stop(),
                onejob::store::Held::none(),
                &by(1)
            )
            .await,
        Err(StoreError::NotFound)
    ));
    assert!(matches!(
        store
            .cancel_attempt(&bob_owner, &alice.id, 1, &stop(), &by(1))
            .await,
        Err(StoreError::NotFound)
    ));
    // Bob's same key is Bob's own intent.
    let bob = created(
        store.as_ref(),
        new_job("bob", "k", json!({"text": "b"})),
        at(2),
    )
    .await;
    assert_ne!(bob.id, alice.id);
    let alice_now = store
        .get_job(&alice.owner, &alice.id, later())
        .await
        .unwrap();
    assert_eq!(alice_now, Some(alice));
    assert_eq!(all_jobs(store.as_ref(), "alice").await.len(), 1);
    assert_eq!(all_jobs(store.as_ref(), "bob").await, vec![bob]);
}

pub(crate) async fn listing_is_newest_first_and_pages_with_a_cursor(store: Arc<dyn JobStore>) {
    for i in 0..7 {
        created(
            store.as_ref(),
            new_job("alice", &format!("k{i}"), json!({"text": i.to_string()})),
            at(i * 1000),
        )
        .await;
    }
    created(
        store.as_ref(),
        new_job("bob", "k0", json!({"text": "b"})),
        at(500),
    )
    .await;
    let cancelled = &all_jobs(store.as_ref(), "alice").await[3];
    store
        .cancel_job(&cancelled.owner, &cancelled.id, &by(9000))
        .await
        .unwrap();

    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let query = ListQuery {
            status: None,
            limit: 3,
            cursor,
            created_before: None,
        };
        let page = store
            .list_jobs(&owner("alice"), &query, later())
            .await
            .unwrap();
        assert!(page.jobs.len() <= 3);
        seen.extend(page.jobs.iter().map(|j| j.idempotency_key.to_string()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["k6", "k5", "k4", "k3", "k2", "k1", "k0"]);

    let query = ListQuery {
        status: Some(JobStatus::Cancelled),
        limit: 10,
        cursor: None,
        created_before: None,
    };
    let page = store
        .list_jobs(&owner("alice"), &query, later())
        .await
        .unwrap();
    let keys: Vec<_> = page
        .jobs
        .iter()
        .map(|j| j.idempotency_key.to_string())
        .collect();
    assert_eq!(keys, ["k3"]);
    assert_eq!(page.next_cursor, None);
}

/// Evidence is found under exactly its two fingerprints, and a later run for the same pair replaces it.
pub(crate) async fn qualification_evidence_is_kept_per_pair_of_fingerprints(
    store: Arc<dyn JobStore>,
) {
    let fp = |s: &str| Fingerprint::of_value(&json!(s));
    let evidence = Qualification {
        contract: ContractRef::parse("summarize@1").unwrap(),
        contract_fingerprint: fp("contract"),
        provider: provider("fallback"),
        provider_fingerprint: fp("provider"),
        passed: false,
        runs_per_sample: 1,
        checked_at: at(1),
        runs: vec![RunEvidence {
            sample: 0,
            run: 1,
            problem: Some(ErrorInfo::new("output_invalid", "extra key")),
            elapsed_ms: 12,
            counted_prompt_tokens: Some(80),
            report: Some(CallReport {
                model: Some("m".into()),
                ..CallReport::default()
            }),
        }],
        strikes: Vec::new(),
        suspected: None,
    };
    store.put_qualification(&evidence).await.unwrap();
    let found = store.qualification(&fp("contract"), &fp("provider")).await;
    assert_eq!(found.unwrap(), Some(evidence.clone()));
    for (contract, provider) in [("contract", "other"), ("other", "provider")] {
        let found = store.qualification(&fp(contract), &fp(provider)).await;
        assert_eq!(found.unwrap(), None, "({contract}, {provider})");
    }
    // What production showed is kept with it.
    let passed = Qualification {
        passed: true,
        runs: Vec::new(),
        checked_at: at(2),
        strikes: vec!["job_1#1".into()],
        suspected: Some(onejob::domain::Suspicion {
            reason: ErrorInfo::new("model_changed", "answered as m2; qualified as m"),
            at: at(3),
            attempts: vec!["job_1#2".into()],
        }),
        ..evidence
    };
    store.put_qualification(&passed).await.unwrap();
    let found = store.qualification(&fp("contract"), &fp("provider")).await;
    assert_eq!(found.unwrap(), Some(passed));
}

/// A large input (on DynamoDB kept in an item of its own, written once) comes back whole from every answer that
/// shows the job — concurrent creates of one key, a conflict (the job's own input), a read, a listing and each kind
/// of write — and the key still makes one job.
pub(crate) async fn a_large_input_comes_back_from_every_answer(store: Arc<dyn JobStore>) {
    let input = json!({"text": "l".repeat(64 * 1024)});
    let outcomes = creates_at_once(&store, 20, "large", &input).await;
    let created = outcomes
        .iter()
        .filter(|o| matches!(o, CreateOutcome::Created(_)))
        .count();
    assert_eq!(created, 1);
    assert!(outcomes.iter().all(|o| o.job().input == input));
    let job = outcomes[0].job().clone();
    assert!(outcomes.iter().all(|o| o.job().id == job.id));

    let other = json!({"text": "m".repeat(64 * 1024)});
    let conflict = store
        .create_job(new_job("alice", "large", other), RETENTION, &by(30))
        .await
        .unwrap();
    assert!(matches!(&conflict, CreateOutcome::Conflict(j) if j.input == input));

    let read = store.get_job(&job.owner, &job.id, later()).await.unwrap();
    assert_eq!(read.unwrap().input, input);
    assert_eq!(all_jobs(store.as_ref(), "alice").await[0].input, input);

    let claimed = store
        .claim_attempt(&job.id, 1, lease(), &by(31))
        .await
        .unwrap();
    assert_eq!(claimed.input, input);
    let failed = store
        .fail_attempt(
            &job.id,
            1,
            ErrorInfo::new("provider_error", "down"),
            CallReport::default(),
            &to("fallback"),
            &by(32),
        )
        .await
        .unwrap();
    assert_eq!((failed.attempts.len(), &failed.input), (2, &input));
    store
        .claim_attempt(&job.id, 2, lease(), &by(33))
        .await
        .unwrap();
    let (won, done) = answer(store.as_ref(), &job, 2, "ok", 34).await;
    assert_eq!((won, &done.input), (Completion::Won, &input));
}
