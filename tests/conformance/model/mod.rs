//! The model-based test: random sequences of every store operation — creates (new, duplicate, conflicting, after
//! expiry), claims (first and duplicate), time-outs, completions (late, out of order, after a cancel), failures with
//! their failover, attempt cancels, manual retries, job cancels, re-dispatches, sweeps — applied to a store and to a
//! plain in-memory reference model (a map of jobs moved by the domain's own transitions). Any write may fail before
//! it reaches the store or land and lose its answer; it is then repeated with the same token, as the engine does,
//! and must answer as the model says the write did (invariant 11). Steps may share a millisecond. After every step
//! the design's invariants hold in the store, and the store's job equals the model's, field by field. Shrunk
//! failures print the steps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::Duration;
use onejob::domain::event::event_id;
use onejob::domain::{
    AttemptRef, AttemptState, CallReport, ErrorInfo, Failover, Fingerprint, IdempotencyKey, Job,
    JobId, JobStatus, NewJob, Owner, ProviderName, Refusal, Stamp, Timestamp, WriteToken,
};
use onejob::store::{CreateOutcome, JobStore, ListQuery, StoreError};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use serde_json::json;

use super::at;
use crate::support::faulty::{Call, Fault, FaultyStore};

mod reference;

use reference::{Model, check_invariants, error, on_model, result};

const KEYS: usize = 3;
const PROVIDERS: [&str; 3] = ["p0", "p1", "p2"];
/// Short, so that sequences see jobs expire and keys come back.
const MODEL_RETENTION: Duration = Duration::seconds(8);
/// Few, so that sequences reach the limit.
const MAX_ATTEMPTS: u32 = 4;

/// One write. Jobs are named by key index; attempts by number.
#[derive(Debug, Clone)]
enum Write {
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
    /// `qualified`: a bit per provider.
    Fail {
        key: usize,
        attempt: u32,
        qualified: u8,
    },
    /// `keyed`: sent under one of a few `Idempotency-Key`s, so that sequences send one twice, or reuse a key.
    CancelAttempt {
        key: usize,
        attempt: u32,
        qualified: u8,
        keyed: Option<u8>,
    },
    Retry {
        key: usize,
        provider: Option<usize>,
        qualified: u8,
        keyed: Option<u8>,
    },
    CancelJob {
        key: usize,
    },
    Redispatch {
        key: usize,
        attempt: u32,
    },
}

/// One step: a write (maybe faulted, maybe in the same millisecond as the last step), or a sweep.
#[derive(Debug, Clone)]
enum Op {
    Write {
        write: Write,
        fault: Option<Fault>,
        same_ms: bool,
    },
    /// Moves time on, then asks the sweep queries.
    Sweep { advance_ms: i64 },
}

fn write() -> impl Strategy<Value = Write> {
    let key = 0..KEYS;
    let attempt = 1..5u32;
    let mask = 0..8u8;
    prop_oneof![
        3 => (key.clone(), 0..2u8).prop_map(|(key, input)| Write::Create { key, input }),
        3 => (key.clone(), attempt.clone()).prop_map(|(key, attempt)| Write::Claim { key, attempt }),
        1 => (key.clone(), attempt.clone()).prop_map(|(key, attempt)| Write::TimeOut { key, attempt }),
        3 => (key.clone(), attempt.clone()).prop_map(|(key, attempt)| Write::Complete { key, attempt }),
        2 => (key.clone(), attempt.clone(), mask.clone())
            .prop_map(|(key, attempt, qualified)| Write::Fail { key, attempt, qualified }),
        1 => (key.clone(), attempt.clone(), mask.clone(), proptest::option::of(0..2u8))
            .prop_map(|(key, attempt, qualified, keyed)| Write::CancelAttempt { key, attempt, qualified, keyed }),
        2 => (key.clone(), proptest::option::of(0..PROVIDERS.len()), mask, proptest::option::of(0..2u8))
            .prop_map(|(key, provider, qualified, keyed)| Write::Retry { key, provider, qualified, keyed }),
        1 => key.clone().prop_map(|key| Write::CancelJob { key }),
        1 => (key, attempt).prop_map(|(key, attempt)| Write::Redispatch { key, attempt }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let fault = prop_oneof![
        6 => Just(None),
        1 => Just(Some(Fault::Before)),
        1 => Just(Some(Fault::After)),
    ];
    prop_oneof![
        12 => (write(), fault, any::<bool>())
            .prop_map(|(write, fault, same_ms)| Op::Write { write, fault, same_ms }),
        1 => (0..3_000i64).prop_map(|advance_ms| Op::Sweep { advance_ms }),
    ]
}

fn provider(i: usize) -> ProviderName {
    ProviderName::parse(PROVIDERS[i]).unwrap()
}

fn failover(qualified: u8) -> Failover {
    Failover {
        qualified: (0..PROVIDERS.len())
            .filter(|i| qualified & (1 << i) != 0)
            .map(provider)
            .collect::<BTreeSet<_>>(),
        max_attempts: MAX_ATTEMPTS,
        retry: None,
        jitter_permille: 0,
        budget: None,
    }
}

/// What a write answered: its answer (as text, to compare outcomes of any type), or its refusal.
type Said = Result<String, Option<Refusal>>;

/// The write on the store, as it stands.
async fn on_store(
    store: &dyn JobStore,
    model: &Model,
    write: &Write,
    stamp: &Stamp,
) -> Result<String, StoreError> {
    let now = stamp.now;
    let lease = now + Duration::seconds(1);
    let owner = &model.owner;
    let answer = |a: &dyn std::fmt::Debug| format!("{a:?}");
    Ok(match *write {
        Write::Create { key, input } => answer(
            &store
                .create_job(model.new_job(key, input), MODEL_RETENTION, stamp)
                .await?,
        ),
        Write::Claim { key, attempt } => answer(
            &store
                .claim_attempt(&model.id(key), attempt, lease, stamp)
                .await?,
        ),
        Write::TimeOut { key, attempt } => answer(
            &store
                .mark_unknown(&model.id(key), attempt, None, stamp)
                .await?,
        ),
        Write::Complete { key, attempt } => answer(
            &store
                .complete_attempt(
                    &model.id(key),
                    attempt,
                    result(attempt),
                    CallReport::default(),
                    stamp,
                )
                .await?,
        ),
        Write::Fail {
            key,
            attempt,
            qualified,
        } => answer(
            &store
                .fail_attempt(
                    &model.id(key),
                    attempt,
                    error(),
                    CallReport::default(),
                    &failover(qualified),
                    stamp,
                )
                .await?,
        ),
        Write::CancelAttempt {
            key,
            attempt,
            qualified,
            ..
        } => answer(
            &store
                .cancel_attempt(owner, &model.id(key), attempt, &failover(qualified), stamp)
                .await?,
        ),
        Write::Retry {
            key,
            provider: p,
            qualified,
            ..
        } => answer(
            &store
                .add_attempt(
                    owner,
                    &model.id(key),
                    p.map(provider),
                    &failover(qualified),
                    onejob::store::Held::none(),
                    stamp,
                )
                .await?,
        ),
        Write::CancelJob { key } => answer(&store.cancel_job(owner, &model.id(key), stamp).await?),
        Write::Redispatch { key, attempt } => {
            answer(&store.redispatch(&model.id(key), attempt, now).await?)
        }
    })
}

fn said(outcome: Result<String, StoreError>) -> Said {
    match outcome {
        Ok(answer) => Ok(answer),
        Err(StoreError::Refused(refusal)) => Err(Some(refusal)),
        Err(StoreError::NotFound) => Err(None),
        Err(e @ (StoreError::Backend(_) | StoreError::Contended(_))) => {
            panic!("the store failed: {e:?}")
        }
    }
}

/// Which store call a write makes, for its fault.
fn call_of(write: &Write) -> Call {
    match write {
        Write::Create { .. } => Call::Create,
        Write::Claim { .. } => Call::Claim,
        Write::TimeOut { .. } => Call::MarkUnknown,
        Write::Complete { .. } => Call::Complete,
        Write::Fail { .. } => Call::Fail,
        Write::CancelAttempt { .. } => Call::CancelAttempt,
        Write::Retry { .. } => Call::AddAttempt,
        Write::CancelJob { .. } => Call::CancelJob,
        Write::Redispatch { .. } => Call::Redispatch,
    }
}

async fn step(store: &FaultyStore, model: &mut Model, op: &Op) {
    let (write, fault, same_ms) = match op {
        Op::Write {
            write,
            fault,
            same_ms,
        } => (write, *fault, *same_ms),
        Op::Sweep { advance_ms } => return sweep(store, model, *advance_ms).await,
    };
    if !same_ms {
        model.now += Duration::milliseconds(1);
    }
    let stamp = stamp_of(model, write);
    if let Some(fault) = fault {
        // Before the write nothing happens; after it, the write lands and its answer is lost. Either way the
        // caller sees a failure, and repeats the write with the same token (below): it must answer as the write
        // did the first time, and change nothing more.
        // (A write the store refuses lands nothing: its refusal comes back as it is.)
        store.plan(&[(call_of(write), fault)]);
        let failed = on_store(store, model, write, &stamp).await;
        assert!(store.spent(), "{op:?}: the fault did not strike");
        assert!(
            fault == Fault::After || matches!(failed, Err(StoreError::Backend(_))),
            "{op:?}: {failed:?}"
        );
    }
    let answered = said(on_store(store, model, write, &stamp).await);
    let (key, expected) = on_model(model, write, &stamp);
    assert_eq!(
        answered, expected,
        "{op:?}: the store and the model disagree"
    );
    let stored = store
        .get_job(&model.owner, &model.id(key), model.now)
        .await
        .unwrap();
    assert_eq!(stored.as_ref(), model.live(key), "{op:?}: the stored job");
    if let Some(job) = &stored {
        check_invariants(job);
        one_settle_one_event(model, job, op);
        assert_eq!(
            listed_status(store, model, job).await,
            job.status(),
            "{op:?}: the listing's status"
        );
    }
}

/// The stamp of a write: a fresh token, or for a caller's write under an `Idempotency-Key` the request's own (a
/// manual attempt keeps it apart from its token, as the engine does; a cancel's token is the request's).
fn stamp_of(model: &Model, write: &Write) -> Stamp {
    let fresh = Stamp::fresh(model.now);
    let request = |key: usize, keyed: u8, asked: String| {
        let idempotency_key = IdempotencyKey::parse(&format!("click-{keyed}")).unwrap();
        WriteToken::for_request(&model.owner, &model.id(key), "", &idempotency_key, &asked)
    };
    match *write {
        Write::Retry {
            key,
            provider: p,
            keyed: Some(keyed),
            ..
        } => fresh.serving(Some(request(key, keyed, format!("attempt {p:?}")))),
        Write::CancelAttempt {
            key,
            attempt,
            keyed: Some(keyed),
            ..
        } => Stamp::new(
            request(key, keyed, format!("cancel attempt {attempt}")),
            model.now,
        ),
        _ => fresh,
    }
}

/// Invariant 14: while a job stays settled with the same outcome, its settle (and so its event id) stays where it
/// was, whatever is written to it; a new settle comes only with a new outcome or after the job was open again.
fn one_settle_one_event(model: &mut Model, job: &Job, op: &Op) {
    let now = (job.status(), job.settles_at());
    match (model.settles.insert(job.id.clone(), now), now) {
        (Some((status, Some(before))), (same, Some(after))) if status == same => {
            assert_eq!(before, after, "{op:?}: the settle of {:?} moved", job.id);
            assert_eq!(event_id(job, before), event_id(job, after));
        }
        _ => {}
    }
}

/// The status under which a listing filtered by status finds `job`: it must be the job's own.
async fn listed_status(store: &FaultyStore, model: &Model, job: &Job) -> JobStatus {
    for status in JobStatus::ALL {
        let query = ListQuery {
            status: Some(status),
            limit: ListQuery::MAX_LIMIT,
            cursor: None,
            created_before: None,
        };
        let page = store
            .list_jobs(&model.owner, &query, model.now)
            .await
            .unwrap();
        if page.jobs.iter().any(|j| j.id == job.id) {
            return status;
        }
    }
    panic!("{:?} is in no listing", job.id)
}

async fn sweep(store: &FaultyStore, model: &mut Model, advance_ms: i64) {
    model.now += Duration::milliseconds(advance_ms);
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
    let stale = ours(store.stale_queued(now, now, 10_000).await.unwrap());
    let mut want_expired = Vec::new();
    let mut want_stale = Vec::new();
    for job in model.jobs.values().filter(|j| !j.is_expired(now)) {
        for a in &job.attempts {
            if a.state == AttemptState::Started
                && job.cancelled_at.is_none()
                && a.lease_expires_at.unwrap() < now
            {
                want_expired.push((job.id.clone(), a.number));
            }
            let open = job.completed_by.is_none() && job.cancelled_at.is_none();
            if a.state == AttemptState::Queued && open && a.dispatched_at < now {
                want_stale.push((job.id.clone(), a.number));
            }
        }
    }
    want_expired.sort();
    want_stale.sort();
    assert_eq!(expired, want_expired, "expired leases at {now}");
    assert_eq!(stale, want_stale, "stale queued attempts at {now}");
    store.purge_expired(now, 10_000).await.unwrap();
    for key in 0..KEYS {
        let stored = store
            .get_job(&model.owner, &model.id(key), now)
            .await
            .unwrap();
        assert_eq!(
            stored.as_ref(),
            model.live(key),
            "job {key} after the sweep at {now}"
        );
    }
}

/// Runs `cases` random sequences of up to 40 steps against `store`, each on its own owner.
pub(crate) async fn the_store_follows_the_model_step_by_step(store: Arc<dyn JobStore>, cases: u32) {
    let cases = std::env::var("ONEJOB_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    let runtime = tokio::runtime::Handle::current();
    let case = AtomicUsize::new(0);
    let faulty = FaultyStore::new(store, Vec::new());
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
                settles: BTreeMap::new(),
            };
            runtime.block_on(async {
                for op in &ops {
                    step(&faulty, &mut model, op).await;
                }
            });
            Ok(())
        })
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
