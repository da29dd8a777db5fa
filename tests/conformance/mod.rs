//! The store conformance suite (and, in [`engine`], the engine's suite on that store): every case takes an `Arc<dyn JobStore>` and asserts what the design's invariants promise, so
//! every backend runs the very same cases. A backend's test file calls [`conformance_suite!`] with an async
//! expression that yields a fresh [`Fixture`].

pub mod edges;
pub mod engine;
pub mod faults;
pub mod model;

pub use edges::*;
pub use engine::*;
pub use faults::*;
pub use model::*;

use std::any::Any;
use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use onejob::domain::{
    AttemptCancel, AttemptRef, AttemptState, CallReport, Completion, ContractRef, ErrorInfo,
    Failover, Fingerprint, IdempotencyKey, Job, JobCancel, JobStatus, NewJob, Owner, ProviderName,
    Qualification, Refusal, RunEvidence, Stamp, Timestamp,
};
use onejob::store::{CreateOutcome, JobStore, ListQuery, StoreError};
use serde_json::{Value, json};
use tokio::task::JoinSet;

/// A store for one test, and whatever must live as long as it (a temporary folder, a table).
pub struct Fixture {
    pub store: Arc<dyn JobStore>,
    pub _keep: Box<dyn Any + Send>,
}

/// Declares one `#[tokio::test]` per case, each on a fresh fixture from `$fixture` (an `Option<Fixture>`: `None`
/// skips the case, for a backend whose server is not there outside CI).
#[macro_export]
macro_rules! conformance_suite {
    ($fixture:expr) => {
        $crate::conformance_suite!(@cases $fixture;
            concurrent_creates_with_one_key_make_one_job,
            a_changed_fingerprint_conflicts_and_leaves_the_job_unchanged,
            owners_are_isolated,
            a_second_live_attempt_is_refused,
            concurrent_completions_have_exactly_one_winner,
            a_duplicate_claim_is_refused,
            the_attempt_that_answers_first_wins_even_if_it_left_last,
            a_result_after_the_job_was_cancelled_is_discarded,
            a_result_for_a_never_claimed_attempt_of_a_cancelled_job_is_discarded,
            a_late_result_for_an_unknown_attempt_with_a_free_slot_wins,
            cancelling_a_job_is_idempotent_and_refused_once_it_succeeded,
            a_failure_and_its_failover_are_one_write,
            expired_leases_and_stale_queued_attempts_are_found,
            listing_is_newest_first_and_pages_with_a_cursor,
            reads_never_see_half_a_write,
            a_timeout_is_unknown_and_blocks_new_attempts,
            the_attempt_that_answers_first_wins_the_race,
            a_duplicate_delivery_makes_one_provider_call,
            a_late_result_after_a_job_cancel_is_discarded,
            a_late_answer_after_the_timeout_wins_a_free_slot,
            a_provider_error_fails_over_to_the_fallback,
            an_output_that_breaks_the_contract_fails_and_an_unqualified_fallback_gets_nothing,
            a_result_too_large_to_keep_fails_the_attempt,
            a_lost_connection_is_unknown_and_a_refused_one_is_failed,
            the_provider_call_carries_the_attempt_key_and_the_contract,
            the_sweeper_resolves_expired_leases_and_lost_messages,
            qualification_evidence_is_kept_per_pair_of_fingerprints,
            a_create_that_fails_either_side_of_its_write_is_created_once,
            a_claim_that_fails_either_side_of_its_write_calls_the_provider_once,
            a_completion_that_fails_either_side_of_its_write_keeps_the_answer,
            a_failure_that_fails_either_side_of_its_write_fails_over_at_once,
            a_time_out_that_fails_either_side_of_its_write_is_unknown,
            an_attempt_cancel_that_fails_either_side_of_its_write_fails_over_at_once,
            a_manual_retry_that_fails_either_side_of_its_write_adds_one_attempt,
            a_job_cancel_that_fails_either_side_of_its_write_cancels,
            a_redispatch_that_fails_either_side_of_its_write_sends_the_attempt_once,
            an_answer_is_written_through_a_store_outage,
            an_answer_the_store_never_takes_is_given_up_after_the_budget,
            the_store_follows_the_model_step_by_step,
            a_status_change_within_one_millisecond_is_listed_under_the_new_status,
            a_job_past_its_retention_is_gone_and_its_key_makes_a_new_job,
            a_job_at_every_cap_still_fits_the_store,
            a_started_attempt_of_a_job_another_attempt_won_still_ends,
            a_winning_result_ends_the_queued_attempt,
            a_redispatch_is_recorded_and_waits_its_turn,
            a_cancelled_attempt_answering_after_its_lease_is_discarded,
            a_gateway_timeout_is_unknown_and_the_fallback_is_not_paid,
            the_loser_of_a_race_won_by_a_cancelled_attempt_ends_unknown,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let fixture: Option<$crate::conformance::Fixture> = $fixture.await;
                let Some(fixture) = fixture else { return };
                $crate::conformance::$case(fixture.store.clone()).await;
            }
        )*
    };
}

/// Evidence is found under exactly its two fingerprints, and a later run for the same pair replaces it.
pub async fn qualification_evidence_is_kept_per_pair_of_fingerprints(store: Arc<dyn JobStore>) {
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
    };
    store.put_qualification(&evidence).await.unwrap();
    let found = store.qualification(&fp("contract"), &fp("provider")).await;
    assert_eq!(found.unwrap(), Some(evidence.clone()));
    for (contract, provider) in [("contract", "other"), ("other", "provider")] {
        let found = store.qualification(&fp(contract), &fp(provider)).await;
        assert_eq!(found.unwrap(), None, "({contract}, {provider})");
    }
    let passed = Qualification {
        passed: true,
        runs: Vec::new(),
        checked_at: at(2),
        ..evidence
    };
    store.put_qualification(&passed).await.unwrap();
    let found = store.qualification(&fp("contract"), &fp("provider")).await;
    assert_eq!(found.unwrap(), Some(passed));
}

pub fn at(ms: i64) -> Timestamp {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
}

fn owner(name: &str) -> Owner {
    Owner::parse(name).unwrap()
}

fn provider(name: &str) -> ProviderName {
    ProviderName::parse(name).unwrap()
}

pub fn new_job(owner_name: &str, key: &str, input: Value) -> NewJob {
    NewJob {
        owner: owner(owner_name),
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
        contract: ContractRef::parse("summarize@1").unwrap(),
        input,
        providers: vec![provider("primary"), provider("fallback")],
    }
}

async fn created(store: &dyn JobStore, new: NewJob, now: Timestamp) -> Job {
    match store
        .create_job(new, RETENTION, &Stamp::fresh(now))
        .await
        .unwrap()
    {
        CreateOutcome::Created(job) => job,
        other => panic!("expected Created, got {other:?}"),
    }
}

pub async fn all_jobs(store: &dyn JobStore, owner_name: &str) -> Vec<Job> {
    let query = ListQuery {
        status: None,
        limit: ListQuery::MAX_LIMIT,
        cursor: None,
    };
    store
        .list_jobs(&owner(owner_name), &query, later())
        .await
        .unwrap()
        .jobs
}

/// Alice's job under key `k`, created at `at(0)`, attempt 1 queued.
pub async fn fresh_job(store: &dyn JobStore) -> Job {
    created(store, new_job("alice", "k", json!({"text": "a"})), at(0)).await
}

/// [`fresh_job`] with attempt 1 claimed at `at(1)`.
pub async fn claimed_job(store: &dyn JobStore) -> Job {
    let job = fresh_job(store).await;
    store
        .claim_attempt(&job.id, 1, lease(), &by(1))
        .await
        .unwrap()
}

/// Attempt `number` of `job` answers `{"summary": summary}` at `at(ms)`, as a writer of its own.
pub async fn answer(
    store: &dyn JobStore,
    job: &Job,
    number: u32,
    summary: &str,
    ms: i64,
) -> (Completion, Job) {
    store
        .complete_attempt(
            &job.id,
            number,
            json!({ "summary": summary }),
            CallReport::default(),
            &by(ms),
        )
        .await
        .unwrap()
}

/// Failover to nobody: no provider is qualified.
pub fn stop() -> Failover {
    to_any(&[])
}

/// Failover that may go to `qualified`.
pub fn to(qualified: &str) -> Failover {
    to_any(&[qualified])
}

fn to_any(qualified: &[&str]) -> Failover {
    Failover {
        qualified: qualified.iter().map(|p| provider(p)).collect(),
        max_attempts: Failover::DEFAULT_MAX_ATTEMPTS,
    }
}

/// How long the suite's jobs are kept.
pub const RETENTION: Duration = Duration::days(30);

/// A write of its own (a fresh token) at `at(ms)`.
pub fn by(ms: i64) -> Stamp {
    Stamp::fresh(at(ms))
}

/// When the suite reads: after every write of a case, well before any job expires.
pub fn later() -> Timestamp {
    at(3_600_000)
}

pub fn lease() -> Timestamp {
    at(60_000)
}

pub async fn concurrent_creates_with_one_key_make_one_job(store: Arc<dyn JobStore>) {
    let mut tasks = JoinSet::new();
    for i in 0..50 {
        let store = store.clone();
        tasks.spawn(async move {
            store
                .create_job(
                    new_job("alice", "double-click", json!({"text": "hi"})),
                    RETENTION,
                    &by(i),
                )
                .await
                .unwrap()
        });
    }
    let outcomes = tasks.join_all().await;
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

pub async fn a_changed_fingerprint_conflicts_and_leaves_the_job_unchanged(
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

pub async fn owners_are_isolated(store: Arc<dyn JobStore>) {
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

pub async fn a_second_live_attempt_is_refused(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    let refused = |number, state| {
        move |r: Result<(u32, Job), StoreError>| match r {
            Err(StoreError::Refused(Refusal::AttemptInProgress {
                number: n,
                state: s,
            })) => {
                assert_eq!((n, s), (number, state))
            }
            other => panic!("expected attempt_in_progress, got {other:?}"),
        }
    };
    let (nowhere, one) = (stop(), by(1));
    let add = || {
        store.add_attempt(
            &job.owner,
            &job.id,
            Some(provider("fallback")),
            &nowhere,
            &one,
        )
    };
    refused(1, AttemptState::Queued)(add().await);
    store
        .claim_attempt(&job.id, 1, lease(), &by(2))
        .await
        .unwrap();
    refused(1, AttemptState::Started)(add().await);
    let unknown = store.mark_unknown(&job.id, 1, &by(3)).await.unwrap();
    assert_eq!(unknown.status(), JobStatus::Unknown);
    refused(1, AttemptState::Unknown)(add().await);
    assert_eq!(
        store.get_job(&job.owner, &job.id, later()).await.unwrap(),
        Some(unknown)
    );

    store
        .cancel_attempt(&job.owner, &job.id, 1, &stop(), &by(4))
        .await
        .unwrap();
    // Released: many concurrent requests for the next attempt, exactly one gets it.
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let (store, job) = (store.clone(), job.clone());
        tasks.spawn(async move {
            store
                .add_attempt(
                    &job.owner,
                    &job.id,
                    Some(provider("fallback")),
                    &stop(),
                    &by(5),
                )
                .await
        });
    }
    let results = tasks.join_all().await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results.iter().all(|r| matches!(
        r,
        Ok((2, _))
            | Err(StoreError::Refused(Refusal::AttemptInProgress {
                number: 2,
                ..
            }))
    )));
    let job = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.attempts.len(), 2);
    assert_eq!(job.attempts[1].state, AttemptState::Queued);
}

/// Puts `job` in the state of breakpoint 4: attempt 1 (primary) claimed then released by an out-of-band cancel,
/// attempt 2 (fallback) claimed. Both may now deliver a result.
async fn two_claimed_attempts(store: &dyn JobStore, job: &Job) {
    store
        .claim_attempt(&job.id, 1, lease(), &by(1))
        .await
        .unwrap();
    store.mark_unknown(&job.id, 1, &by(2)).await.unwrap();
    let (cancel, job) = store
        .cancel_attempt(&job.owner, &job.id, 1, &to("fallback"), &by(3))
        .await
        .unwrap();
    assert_eq!(cancel, AttemptCancel::Cancelled);
    assert_eq!(job.attempt(2).unwrap().state, AttemptState::Queued);
    store
        .claim_attempt(&job.id, 2, lease(), &by(5))
        .await
        .unwrap();
}

pub async fn concurrent_completions_have_exactly_one_winner(store: Arc<dyn JobStore>) {
    for round in 0..10 {
        let job = created(
            store.as_ref(),
            new_job("alice", &format!("race-{round}"), json!({"text": "a"})),
            at(0),
        )
        .await;
        two_claimed_attempts(store.as_ref(), &job).await;
        let mut tasks = JoinSet::new();
        for number in [1u32, 2] {
            let (store, id) = (store.clone(), job.id.clone());
            tasks.spawn(async move {
                let outcome = store
                    .complete_attempt(
                        &id,
                        number,
                        json!({"summary": number}),
                        CallReport::default(),
                        &by(10),
                    )
                    .await
                    .unwrap();
                (number, outcome.0)
            });
        }
        let outcomes = tasks.join_all().await;
        let winners: Vec<u32> = outcomes
            .iter()
            .filter(|(_, c)| *c == Completion::Won)
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let winner = winners[0];
        let loser = 3 - winner;
        assert!(outcomes.contains(&(
            loser,
            Completion::Lost {
                winner: Some(winner)
            }
        )));
        let job = store
            .get_job(&job.owner, &job.id, later())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(job.result, Some(json!({"summary": winner})));
        assert_eq!((job.completed_by, job.version), (Some(winner), 1));
        assert_eq!(job.attempt(winner).unwrap().state, AttemptState::Succeeded);
        assert_eq!(job.attempt(loser).unwrap().state, AttemptState::Discarded);
    }
}

pub async fn a_duplicate_claim_is_refused(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    let mut tasks = JoinSet::new();
    for _ in 0..10 {
        let (store, id) = (store.clone(), job.id.clone());
        tasks.spawn(async move { store.claim_attempt(&id, 1, lease(), &by(1)).await });
    }
    let results = tasks.join_all().await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results.iter().all(|r| matches!(
        r,
        Ok(_)
            | Err(StoreError::Refused(Refusal::InvalidTransition {
                from: AttemptState::Started,
                ..
            }))
    )));
    let job = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.attempts[0].seen_version, Some(0));
    assert_eq!(job.attempts[0].lease_expires_at, Some(lease()));
    assert_eq!(job.status(), JobStatus::Running);
}

/// Breakpoint 4 at the store: A leaves first and returns last, B leaves second and returns first.
pub async fn the_attempt_that_answers_first_wins_even_if_it_left_last(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    two_claimed_attempts(store.as_ref(), &job).await;
    let (won, after_b) = answer(store.as_ref(), &job, 2, "B", 6).await;
    assert_eq!(won, Completion::Won);
    // The loser's call was paid for: what its provider reported is kept even though its result is not.
    let paid = CallReport {
        model: Some("model-a".into()),
        input_tokens: Some(120),
        output_tokens: Some(9),
        retry_after_s: None,
    };
    let (lost, after_a) = store
        .complete_attempt(&job.id, 1, json!({"summary": "A"}), paid.clone(), &by(7))
        .await
        .unwrap();
    assert_eq!(lost, Completion::Lost { winner: Some(2) });
    assert_eq!(after_a.result, Some(json!({"summary": "B"})));
    assert_eq!(
        (after_a.version, after_a.completed_by, after_a.updated_at),
        (after_b.version, after_b.completed_by, after_b.updated_at)
    );
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Discarded);
    assert_eq!(stored.attempt(1).unwrap().report, Some(paid));
    assert_eq!(stored.attempt(2).unwrap().report, None);
    assert_eq!(stored.result, Some(json!({"summary": "B"})));
}

pub async fn a_result_after_the_job_was_cancelled_is_discarded(store: Arc<dyn JobStore>) {
    let job = claimed_job(store.as_ref()).await;
    let (cancel, cancelled) = store.cancel_job(&job.owner, &job.id, &by(2)).await.unwrap();
    assert_eq!(cancel, JobCancel::Cancelled);
    assert_eq!(cancelled.version, 1);
    let (outcome, after) = answer(store.as_ref(), &job, 1, "late", 3).await;
    assert_eq!(outcome, Completion::Lost { winner: None });
    assert_eq!(after.status(), JobStatus::Cancelled);
    assert_eq!(after.result, None);
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Discarded);
    assert_eq!((stored.version, stored.result), (1, None));
}

/// Found by the model test on DynamoDB: a job cancelled while its attempt was still queued (never claimed), then a
/// result for that attempt. Every backend discards it the same way, and the job stays as the cancel left it.
pub async fn a_result_for_a_never_claimed_attempt_of_a_cancelled_job_is_discarded(
    store: Arc<dyn JobStore>,
) {
    let job = fresh_job(store.as_ref()).await;
    let (_, cancelled) = store.cancel_job(&job.owner, &job.id, &by(1)).await.unwrap();
    assert_eq!(cancelled.attempt(1).unwrap().state, AttemptState::Cancelled);
    let unasked = by(2);
    let (outcome, after) = store
        .complete_attempt(
            &job.id,
            1,
            json!({"summary": "unasked"}),
            CallReport::default(),
            &unasked,
        )
        .await
        .unwrap();
    assert_eq!(outcome, Completion::Lost { winner: None });
    let mut expected = cancelled.clone();
    assert_eq!(
        expected.complete(
            1,
            json!({"summary": "unasked"}),
            CallReport::default(),
            &unasked
        ),
        Ok(Completion::Lost { winner: None })
    );
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((&after, &stored), (&expected, &expected));
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Discarded);
}

pub async fn a_late_result_for_an_unknown_attempt_with_a_free_slot_wins(store: Arc<dyn JobStore>) {
    let job = claimed_job(store.as_ref()).await;
    store.mark_unknown(&job.id, 1, &by(2)).await.unwrap();
    let (outcome, after) = answer(store.as_ref(), &job, 1, "late", 3).await;
    assert_eq!(outcome, Completion::Won);
    assert_eq!(after.status(), JobStatus::Succeeded);
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.result, Some(json!({"summary": "late"})));
    assert_eq!(stored.attempt(1).unwrap().state, AttemptState::Succeeded);
    // A second delivery of the same result is refused: the attempt already ended.
    assert!(matches!(
        store
            .complete_attempt(
                &job.id,
                1,
                json!({"summary": "again"}),
                CallReport::default(),
                &by(4)
            )
            .await,
        Err(StoreError::Refused(Refusal::InvalidTransition {
            from: AttemptState::Succeeded,
            ..
        }))
    ));
}

pub async fn cancelling_a_job_is_idempotent_and_refused_once_it_succeeded(
    store: Arc<dyn JobStore>,
) {
    let job = created(
        store.as_ref(),
        new_job("alice", "a", json!({"text": "a"})),
        at(0),
    )
    .await;
    let (first, once) = store.cancel_job(&job.owner, &job.id, &by(1)).await.unwrap();
    let (second, twice) = store.cancel_job(&job.owner, &job.id, &by(2)).await.unwrap();
    assert_eq!(
        (first, second),
        (JobCancel::Cancelled, JobCancel::AlreadyCancelled)
    );
    assert_eq!(once, twice);
    assert_eq!(twice.attempts[0].state, AttemptState::Cancelled);
    assert!(matches!(
        store
            .add_attempt(
                &job.owner,
                &job.id,
                Some(provider("fallback")),
                &stop(),
                &by(3)
            )
            .await,
        Err(StoreError::Refused(Refusal::JobFinished {
            status: JobStatus::Cancelled
        }))
    ));

    let done = created(
        store.as_ref(),
        new_job("alice", "b", json!({"text": "b"})),
        at(0),
    )
    .await;
    store
        .claim_attempt(&done.id, 1, lease(), &by(1))
        .await
        .unwrap();
    answer(store.as_ref(), &done, 1, "x", 2).await;
    assert!(matches!(
        store.cancel_job(&done.owner, &done.id, &by(3)).await,
        Err(StoreError::Refused(Refusal::JobFinished {
            status: JobStatus::Succeeded
        }))
    ));
}

pub async fn a_failure_and_its_failover_are_one_write(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    assert!(matches!(
        store
            .fail_attempt(
                &job.id,
                1,
                ErrorInfo::new("x", "queued"),
                CallReport::default(),
                &stop(),
                &by(1)
            )
            .await,
        Err(StoreError::Refused(Refusal::InvalidTransition {
            from: AttemptState::Queued,
            ..
        }))
    ));
    store
        .claim_attempt(&job.id, 1, lease(), &by(1))
        .await
        .unwrap();
    let error = ErrorInfo::new("rate_limited", "HTTP 429 (Retry-After: 30 s)");
    let limited = CallReport {
        retry_after_s: Some(30),
        ..CallReport::default()
    };
    let after = store
        .fail_attempt(
            &job.id,
            1,
            error.clone(),
            limited.clone(),
            &to("fallback"),
            &by(2),
        )
        .await
        .unwrap();
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, after);
    assert_eq!(stored.status(), JobStatus::Queued);
    let first = stored.attempt(1).unwrap();
    assert_eq!(
        (first.state, &first.error, first.finished_at),
        (AttemptState::Failed, &Some(error), Some(at(2)))
    );
    assert_eq!(first.report, Some(limited));
    let second = stored.attempt(2).unwrap();
    assert_eq!(
        (second.state, second.provider.as_str()),
        (AttemptState::Queued, "fallback")
    );

    store
        .claim_attempt(&job.id, 2, lease(), &by(3))
        .await
        .unwrap();
    let failed = store
        .fail_attempt(
            &job.id,
            2,
            ErrorInfo::new("provider_error", "HTTP 503"),
            CallReport::default(),
            &to_any(&["primary", "fallback"]),
            &by(4),
        )
        .await
        .unwrap();
    assert_eq!(failed.status(), JobStatus::Failed);
    assert_eq!(failed.error.as_ref().unwrap().code, "providers_exhausted");
    assert_eq!(
        store.get_job(&job.owner, &job.id, later()).await.unwrap(),
        Some(failed)
    );
}

/// What the sweeper asks for: `started` attempts past their lease, `queued` attempts nobody claimed.
pub async fn expired_leases_and_stale_queued_attempts_are_found(store: Arc<dyn JobStore>) {
    let short = created(
        store.as_ref(),
        new_job("alice", "short", json!({"text": "a"})),
        at(0),
    )
    .await;
    let long = created(
        store.as_ref(),
        new_job("alice", "long", json!({"text": "b"})),
        at(0),
    )
    .await;
    let queued = created(
        store.as_ref(),
        new_job("bob", "queued", json!({"text": "c"})),
        at(10),
    )
    .await;
    created(
        store.as_ref(),
        new_job("bob", "fresh", json!({"text": "d"})),
        at(5_000),
    )
    .await;
    store
        .claim_attempt(&short.id, 1, at(1_000), &by(1))
        .await
        .unwrap();
    store
        .claim_attempt(&long.id, 1, at(90_000), &by(1))
        .await
        .unwrap();

    let expired = store.expired_leases(at(2_000), 10).await.unwrap();
    assert_eq!(
        expired,
        vec![AttemptRef {
            job_id: short.id.clone(),
            number: 1
        }]
    );
    assert_eq!(store.expired_leases(at(999), 10).await.unwrap(), vec![]);

    let stale = store.stale_queued(at(1_000), later(), 10).await.unwrap();
    assert_eq!(
        stale,
        vec![AttemptRef {
            job_id: queued.id.clone(),
            number: 1
        }]
    );
    assert_eq!(
        store
            .stale_queued(at(9_000), later(), 1)
            .await
            .unwrap()
            .len(),
        1,
        "the limit holds"
    );

    store.mark_unknown(&short.id, 1, &by(2_000)).await.unwrap();
    assert_eq!(store.expired_leases(at(2_000), 10).await.unwrap(), vec![]);
}

/// A failure and its job-level error are one write: a reader racing it sees both or neither.
pub async fn reads_never_see_half_a_write(store: Arc<dyn JobStore>) {
    for round in 0..50 {
        let job = created(
            store.as_ref(),
            new_job("alice", &format!("torn-{round}"), json!({"text": "a"})),
            at(0),
        )
        .await;
        store
            .claim_attempt(&job.id, 1, lease(), &by(1))
            .await
            .unwrap();
        let mut readers = JoinSet::new();
        for _ in 0..3 {
            let (store, job) = (store.clone(), job.clone());
            readers.spawn(async move {
                loop {
                    let seen = store
                        .get_job(&job.owner, &job.id, later())
                        .await
                        .unwrap()
                        .unwrap();
                    let failed = seen.attempt(1).unwrap().state == AttemptState::Failed;
                    assert_eq!(failed, seen.error.is_some(), "a torn read: {seen:?}");
                    if failed {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            });
        }
        store
            .fail_attempt(
                &job.id,
                1,
                ErrorInfo::new("provider_error", "500"),
                CallReport::default(),
                &stop(),
                &by(2),
            )
            .await
            .unwrap();
        readers.join_all().await;
    }
}

pub async fn listing_is_newest_first_and_pages_with_a_cursor(store: Arc<dyn JobStore>) {
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
