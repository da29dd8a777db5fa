//! The model-based test: random sequences of every store operation — creates (new, duplicate, conflicting),
//! claims (first and duplicate), time-outs, completions (late, out of order, after a cancel), failures with their
//! failover, attempt cancels, manual retries, job cancels, sweeps — applied to a store and to a plain in-memory
//! reference model (a map of jobs moved by the domain's own transitions). After every step the SPEC §3 invariants
//! hold in the store, and the store's job equals the model's, field by field. Shrunk failures print the steps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::Duration;
use onejob::domain::{
    AttemptRef, AttemptState, CallReport, ErrorInfo, Fingerprint, IdempotencyKey, Job, JobId,
    NewJob, NextStep, Owner, ProviderName, Refusal, Timestamp,
};
use onejob::store::{CreateOutcome, JobStore, StoreError};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::json;

use super::at;

const KEYS: usize = 3;
const PROVIDERS: [&str; 3] = ["p0", "p1", "p2"];

/// One step. Jobs are named by key index; attempts by number.
#[derive(Debug, Clone)]
enum Op {
    /// Same key and input as before: a replay; same key, other input: a conflict.
    Create {
        key: usize,
        input: u8,
    },
    Claim {
        key: usize,
        attempt: u32,
    },
    TimeOut {
        key: usize,
        attempt: u32,
    },
    Complete {
        key: usize,
        attempt: u32,
    },
    Fail {
        key: usize,
        attempt: u32,
        next: Option<usize>,
    },
    CancelAttempt {
        key: usize,
        attempt: u32,
        next: Option<usize>,
    },
    Retry {
        key: usize,
        provider: usize,
    },
    CancelJob {
        key: usize,
    },
    /// Moves time on, then asks the sweep queries.
    Sweep {
        advance_ms: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let attempt = 1..4u32;
    let next = proptest::option::of(0..PROVIDERS.len());
    prop_oneof![
        3 => (key.clone(), 0..2u8).prop_map(|(key, input)| Op::Create { key, input }),
        3 => (key.clone(), attempt.clone()).prop_map(|(key, attempt)| Op::Claim { key, attempt }),
        1 => (key.clone(), attempt.clone()).prop_map(|(key, attempt)| Op::TimeOut { key, attempt }),
        3 => (key.clone(), attempt.clone()).prop_map(|(key, attempt)| Op::Complete { key, attempt }),
        2 => (key.clone(), attempt.clone(), next.clone())
            .prop_map(|(key, attempt, next)| Op::Fail { key, attempt, next }),
        1 => (key.clone(), attempt.clone(), next)
            .prop_map(|(key, attempt, next)| Op::CancelAttempt { key, attempt, next }),
        1 => (key.clone(), 0..PROVIDERS.len()).prop_map(|(key, provider)| Op::Retry { key, provider }),
        1 => key.prop_map(|key| Op::CancelJob { key }),
        1 => (0..3_000i64).prop_map(|advance_ms| Op::Sweep { advance_ms }),
    ]
}

fn provider(i: usize) -> ProviderName {
    ProviderName::parse(PROVIDERS[i]).unwrap()
}

fn next_step(next: Option<usize>) -> NextStep {
    match next {
        Some(i) => NextStep::Queue(provider(i)),
        None => NextStep::Stop(ErrorInfo::new("providers_exhausted", "model says stop")),
    }
}

/// The reference: jobs by key, moved by the domain's transitions, and the clock.
struct Model {
    owner: Owner,
    jobs: BTreeMap<usize, Job>,
    now: Timestamp,
}

impl Model {
    fn key(&self, key: usize) -> IdempotencyKey {
        IdempotencyKey::parse(&format!("key-{key}")).unwrap()
    }

    fn id(&self, key: usize) -> JobId {
        JobId::derive(&self.owner, &self.key(key))
    }

    fn new_job(&self, key: usize, input: u8) -> NewJob {
        let input = json!({"text": format!("input {input}")});
        NewJob {
            owner: self.owner.clone(),
            idempotency_key: self.key(key),
            fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
            contract: onejob::domain::ContractRef::parse("summarize@1").unwrap(),
            input,
            providers: PROVIDERS
                .iter()
                .map(|p| ProviderName::parse(p).unwrap())
                .collect(),
        }
    }

    /// Applies `apply` to the model's job `key`: `Err(None)` when there is no such job.
    fn apply<T>(
        &mut self,
        key: usize,
        apply: impl FnOnce(&mut Job) -> Result<T, Refusal>,
    ) -> Result<T, Option<Refusal>> {
        let job = self.jobs.get_mut(&key).ok_or(None)?;
        let mut after = job.clone();
        let out = apply(&mut after).map_err(Some)?;
        *job = after;
        Ok(out)
    }
}

/// What the store said, reduced to what the model can also say.
fn verdict<T>(outcome: Result<T, StoreError>) -> Result<(), Option<Refusal>> {
    match outcome {
        Ok(_) => Ok(()),
        Err(StoreError::Refused(refusal)) => Err(Some(refusal)),
        Err(StoreError::NotFound) => Err(None),
        Err(e @ StoreError::Backend(_)) => panic!("the store failed: {e:?}"),
    }
}

/// SPEC §3, on one job.
fn check_invariants(job: &Job) {
    let live = job.attempts.iter().filter(|a| a.state.is_live()).count();
    assert!(live <= 1, "two live attempts: {job:?}");
    let winners: Vec<u32> = job
        .attempts
        .iter()
        .filter(|a| a.state == AttemptState::Succeeded)
        .map(|a| a.number)
        .collect();
    assert!(winners.len() <= 1, "two winners: {job:?}");
    assert_eq!(winners.first().copied(), job.completed_by, "{job:?}");
    assert_eq!(job.result.is_some(), job.completed_by.is_some(), "{job:?}");
    assert!(job.version <= 1, "{job:?}");
    // A cancel ends every live attempt. (A result may win while a later attempt is still live — a cancelled
    // attempt answering while the slot was free, SPEC §4 — and that attempt's result is discarded when it lands.)
    if job.cancelled_at.is_some() {
        assert_eq!(live, 0, "a cancelled job with a live attempt: {job:?}");
    }
}

async fn step(store: &dyn JobStore, model: &mut Model, op: &Op) {
    let now = model.now;
    let lease = now + Duration::seconds(1);
    let (key, said, expected) = match *op {
        Op::Create { key, input } => {
            let new = model.new_job(key, input);
            let outcome = store.create_job(new.clone(), now).await.unwrap();
            let expected = match model.jobs.get(&key) {
                None => {
                    model.jobs.insert(key, Job::new(new, now));
                    "created"
                }
                Some(job) if job.fingerprint == new.fingerprint => "replayed",
                Some(_) => "conflict",
            };
            let said = match &outcome {
                CreateOutcome::Created(_) => "created",
                CreateOutcome::Replayed(_) => "replayed",
                CreateOutcome::Conflict(_) => "conflict",
            };
            assert_eq!(said, expected, "{op:?}");
            assert_eq!(outcome.job(), &model.jobs[&key], "{op:?}");
            (key, Ok(()), Ok(()))
        }
        Op::Claim { key, attempt } => {
            let said = verdict(
                store
                    .claim_attempt(&model.id(key), attempt, lease, now)
                    .await,
            );
            (
                key,
                said,
                model.apply(key, |j| j.claim(attempt, lease, now)),
            )
        }
        Op::TimeOut { key, attempt } => {
            let said = verdict(store.mark_unknown(&model.id(key), attempt, now).await);
            (
                key,
                said,
                model.apply(key, |j| j.mark_unknown(attempt, now)),
            )
        }
        Op::Complete { key, attempt } => {
            let result = json!({"summary": format!("from attempt {attempt}")});
            let said = store
                .complete_attempt(
                    &model.id(key),
                    attempt,
                    result.clone(),
                    CallReport::default(),
                    now,
                )
                .await;
            let expected = model.apply(key, |j| {
                j.complete(attempt, result, CallReport::default(), now)
            });
            if let (Ok((completion, _)), Ok(model_completion)) = (&said, &expected) {
                assert_eq!(completion, model_completion, "{op:?}");
            }
            (key, verdict(said), expected.map(|_| ()))
        }
        Op::Fail { key, attempt, next } => {
            let error = ErrorInfo::new("provider_error", "HTTP 500");
            let said = store
                .fail_attempt(
                    &model.id(key),
                    attempt,
                    error.clone(),
                    CallReport::default(),
                    next_step(next),
                    now,
                )
                .await;
            let expected = model.apply(key, |j| {
                j.fail(attempt, error, CallReport::default(), next_step(next), now)
            });
            (key, verdict(said), expected)
        }
        Op::CancelAttempt { key, attempt, next } => {
            let owner = model.owner.clone();
            let said = store
                .cancel_attempt(&owner, &model.id(key), attempt, next_step(next), now)
                .await;
            let expected = model.apply(key, |j| j.cancel_attempt(attempt, next_step(next), now));
            (key, verdict(said), expected)
        }
        Op::Retry { key, provider: p } => {
            let owner = model.owner.clone();
            let said = store
                .add_attempt(&owner, &model.id(key), provider(p), now)
                .await;
            let expected = model.apply(key, |j| j.add_attempt(provider(p), now));
            if let (Ok((number, _)), Ok(model_number)) = (&said, &expected) {
                assert_eq!(number, model_number, "{op:?}");
            }
            (key, verdict(said), expected.map(|_| ()))
        }
        Op::CancelJob { key } => {
            let owner = model.owner.clone();
            let said = store.cancel_job(&owner, &model.id(key), now).await;
            let expected = model.apply(key, |j| j.cancel(now));
            if let (Ok((outcome, _)), Ok(model_outcome)) = (&said, &expected) {
                assert_eq!(outcome, model_outcome, "{op:?}");
            }
            (key, verdict(said), expected.map(|_| ()))
        }
        Op::Sweep { advance_ms } => {
            model.now = now + Duration::milliseconds(advance_ms);
            let now = model.now;
            let ours = |refs: Vec<AttemptRef>| {
                let mut refs: Vec<(JobId, u32)> = refs
                    .into_iter()
                    .filter(|r| (0..KEYS).any(|k| model.id(k) == r.job_id))
                    .map(|r| (r.job_id, r.number))
                    .collect();
                refs.sort();
                refs
            };
            let expired = ours(store.expired_leases(now, 10_000).await.unwrap());
            let stale = ours(store.stale_queued(now, 10_000).await.unwrap());
            let mut want_expired = Vec::new();
            let mut want_stale = Vec::new();
            for job in model.jobs.values().filter(|j| !j.status().is_settled()) {
                for a in &job.attempts {
                    if a.state == AttemptState::Started && a.lease_expires_at.unwrap() < now {
                        want_expired.push((job.id.clone(), a.number));
                    }
                    if a.state == AttemptState::Queued && a.created_at < now {
                        want_stale.push((job.id.clone(), a.number));
                    }
                }
            }
            want_expired.sort();
            want_stale.sort();
            assert_eq!(expired, want_expired, "expired leases at {now}");
            assert_eq!(stale, want_stale, "stale queued attempts at {now}");
            return;
        }
    };
    assert_eq!(said, expected, "{op:?}: the store and the model disagree");
    let stored = store.get_job(&model.owner, &model.id(key)).await.unwrap();
    assert_eq!(
        stored.as_ref(),
        model.jobs.get(&key),
        "{op:?}: the stored job"
    );
    if let Some(job) = &stored {
        check_invariants(job);
    }
    // Every step takes a millisecond, so timestamps tell steps apart.
    model.now += Duration::milliseconds(1);
}

/// Runs `cases` random sequences of up to 40 steps against `store`, each on its own owner.
pub async fn the_store_follows_the_model_step_by_step(store: Arc<dyn JobStore>) {
    let cases = std::env::var("ONEJOB_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48);
    let runtime = tokio::runtime::Handle::current();
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let outcome = tokio::task::block_in_place(|| {
        runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
            let n = case.fetch_add(1, Ordering::Relaxed);
            let mut model = Model {
                owner: Owner::parse(&format!("model-{n}")).unwrap(),
                jobs: BTreeMap::new(),
                now: at(0),
            };
            runtime.block_on(async {
                for op in &ops {
                    step(store.as_ref(), &mut model, op).await;
                }
            });
            Ok(())
        })
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
