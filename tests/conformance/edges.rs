//! The edges of the store, on every store: transitions within one millisecond, retention, the size caps, an
//! attempt still running when another one won, re-dispatches, and a cancelled attempt's answer after its lease.

use std::sync::Arc;

use chrono::Duration;
use onejob::domain::{
    AttemptRef, AttemptState, CallReport, Completion, ErrorInfo, Failover, JobStatus,
    MAX_INPUT_BYTES, ProviderName, Stamp,
};
use onejob::store::{CreateOutcome, JobStore, ListQuery, StoreError};
use serde_json::json;

use super::{
    RETENTION, all_jobs, answer, at, by, claimed_job, fresh_job, later, lease, new_job, stop, to,
};

/// The statuses under which a listing filtered by status finds the job `key` of alice.
async fn listed_as(store: &dyn JobStore, now: onejob::domain::Timestamp) -> Vec<JobStatus> {
    let mut found = Vec::new();
    for status in JobStatus::ALL {
        let query = ListQuery {
            status: Some(status),
            limit: 10,
            cursor: None,
            created_before: None,
        };
        let page = store
            .list_jobs(&onejob::domain::Owner::parse("alice").unwrap(), &query, now)
            .await
            .unwrap();
        if !page.jobs.is_empty() {
            found.push(status);
        }
    }
    found
}

/// Transitions that fall in one millisecond still move the job's listed status (SQLite keeps it in a column).
pub(crate) async fn a_status_change_within_one_millisecond_is_listed_under_the_new_status(
    store: Arc<dyn JobStore>,
) {
    let job = fresh_job(store.as_ref()).await;
    assert_eq!(
        listed_as(store.as_ref(), later()).await,
        [JobStatus::Queued]
    );
    store
        .claim_attempt(&job.id, 1, lease(), &by(0))
        .await
        .unwrap();
    assert_eq!(
        listed_as(store.as_ref(), later()).await,
        [JobStatus::Running]
    );
    store.mark_unknown(&job.id, 1, None, &by(0)).await.unwrap();
    assert_eq!(
        listed_as(store.as_ref(), later()).await,
        [JobStatus::Unknown]
    );
    store
        .cancel_attempt(&job.owner, &job.id, 1, &stop(), &by(0))
        .await
        .unwrap();
    assert_eq!(
        listed_as(store.as_ref(), later()).await,
        [JobStatus::Failed]
    );
}

/// Past its retention a job is gone for every read and write, on every store (DynamoDB's TTL may not have deleted
/// it yet); its key makes a new job with a new id, whose provider keys cannot repeat the old one's.
pub(crate) async fn a_job_past_its_retention_is_gone_and_its_key_makes_a_new_job(
    store: Arc<dyn JobStore>,
) {
    let hour = Duration::hours(1);
    let new = || new_job("alice", "k", json!({"text": "a"}));
    let CreateOutcome::Created(old) = store.create_job(new(), hour, &by(0)).await.unwrap() else {
        panic!("a new job")
    };
    assert_eq!(old.expires_at, at(0) + hour);
    store
        .claim_attempt(&old.id, 1, lease(), &by(1))
        .await
        .unwrap();
    let end = old.expires_at;
    let just_before = end - Duration::milliseconds(1);
    assert!(
        store
            .get_job(&old.owner, &old.id, just_before)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(store.get_job(&old.owner, &old.id, end).await.unwrap(), None);
    let query = ListQuery {
        status: None,
        limit: 10,
        cursor: None,
        created_before: None,
    };
    let listed = store.list_jobs(&old.owner, &query, end).await.unwrap();
    assert_eq!(listed.jobs, vec![]);
    let gone = |r: Result<_, StoreError>| matches!(r, Err(StoreError::NotFound));
    let stamp = Stamp::fresh(end);
    assert!(gone(
        store
            .mark_unknown(&old.id, 1, None, &stamp)
            .await
            .map(|_| ())
    ));
    assert!(gone(
        store
            .complete_attempt(
                &old.id,
                1,
                json!({"summary": "x"}),
                CallReport::default(),
                &stamp
            )
            .await
            .map(|_| ())
    ));
    assert!(gone(
        store
            .cancel_job(&old.owner, &old.id, &stamp)
            .await
            .map(|_| ())
    ));
    assert_eq!(store.expired_leases(end + hour, 10).await.unwrap(), vec![]);

    let again = Stamp::fresh(end);
    let CreateOutcome::Created(fresh) = store.create_job(new(), RETENTION, &again).await.unwrap()
    else {
        panic!("the key is free again")
    };
    assert_ne!(fresh.id, old.id);
    assert_eq!(fresh.id.intent(), old.id.intent());
    assert_eq!(fresh.attempts.len(), 1);
    assert_eq!(fresh.attempt(1).unwrap().state, AttemptState::Queued);
    assert_eq!(store.get_job(&old.owner, &old.id, end).await.unwrap(), None);
    assert_eq!(
        store.get_job(&old.owner, &fresh.id, end).await.unwrap(),
        Some(fresh.clone())
    );
    // A message for the old job's attempt 1 does not claim the new job's.
    assert!(gone(
        store
            .claim_attempt(&old.id, 1, end + hour, &Stamp::fresh(end))
            .await
            .map(|_| ())
    ));
    store.purge_expired(end + RETENTION, 100).await.unwrap();
    assert_eq!(
        store
            .get_job(&old.owner, &fresh.id, end + RETENTION)
            .await
            .unwrap(),
        None
    );
}

/// The largest input, the most attempts a job may have (each failing with an error message far past its cap and a
/// long model id), then the largest result: every write fits the store. On DynamoDB (400 KB items) this is the
/// worst case `docs/dynamodb.md` states.
pub(crate) async fn a_job_at_every_cap_still_fits_the_store(store: Arc<dyn JobStore>) {
    let limit = onejob::config::MAX_ATTEMPTS_LIMIT;
    let text_len = MAX_INPUT_BYTES - r#"{"text":""}"#.len();
    let input = json!({"text": "x".repeat(text_len)});
    assert_eq!(input.to_string().len(), MAX_INPUT_BYTES);
    let mut new = new_job(&"o".repeat(255), &"k".repeat(255), input);
    let long_name = ProviderName::parse(&"p".repeat(64)).unwrap();
    new.providers = vec![long_name.clone()];
    let job = store
        .create_job(new, RETENTION, &by(0))
        .await
        .unwrap()
        .job()
        .clone();
    let everything = Failover {
        max_attempts: limit,
        retry: None,
        jitter_permille: 0,
        budget: None,
        ..stop()
    };
    let huge = ErrorInfo::new("output_invalid", "é".repeat(100_000));
    let paid = CallReport {
        model: Some("m".repeat(100_000)),
        input_tokens: Some(u64::MAX),
        output_tokens: Some(u64::MAX),
        cached_input_tokens: Some(u64::MAX),
        reasoning_tokens: Some(u64::MAX),
        cost_nanos: Some(u64::MAX),
        retry_after_s: Some(u64::MAX),
        retry_after_ms: Some(u64::MAX),
        note: Some("n".repeat(100_000)),
    };
    let mut t = 1;
    for number in 1..=limit {
        if number > 1 {
            let (added, _) = store
                .add_attempt(
                    &job.owner,
                    &job.id,
                    Some(long_name.clone()),
                    &everything,
                    onejob::store::Held::none(),
                    &by(t),
                )
                .await
                .unwrap();
            assert_eq!(added, number);
        }
        store
            .claim_attempt(&job.id, number, lease(), &by(t + 1))
            .await
            .unwrap();
        if number < limit {
            store
                .fail_attempt(
                    &job.id,
                    number,
                    huge.clone(),
                    paid.clone(),
                    &everything,
                    &by(t + 2),
                )
                .await
                .unwrap();
        }
        t += 3;
    }
    let refused = store
        .add_attempt(
            &job.owner,
            &job.id,
            None,
            &everything,
            onejob::store::Held::none(),
            &by(t),
        )
        .await;
    assert!(matches!(refused, Err(StoreError::Refused(_))));
    let largest = json!({"summary": "y".repeat(onejob::providers::checks::MAX_RESULT_BYTES - r#"{"summary":""}"#.len())});
    let (won, done) = store
        .complete_attempt(&job.id, limit, largest.clone(), paid.clone(), &by(t))
        .await
        .unwrap();
    assert_eq!(won, Completion::Won);
    assert_eq!(done.result, Some(largest));
    assert_eq!(done.attempts.len(), limit as usize);
    let size = onejob::store::dynamodb::item_size(&done);
    eprintln!("the largest job: {size} bytes as a DynamoDB item");
    assert!(size < 400 * 1024, "{size} bytes");
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored, done);
    assert!(stored.attempts.iter().all(|a| {
        a.error
            .as_ref()
            .is_none_or(|e| e.message.len() <= ErrorInfo::MAX_MESSAGE_BYTES)
    }));
}

/// A cancelled attempt answered and won while a later attempt was running: the later one is still swept (and made
/// `unknown`) when its lease ends, and its own answer is discarded. No attempt stays `started` for ever.
pub(crate) async fn a_started_attempt_of_a_job_another_attempt_won_still_ends(
    store: Arc<dyn JobStore>,
) {
    let job = claimed_job(store.as_ref()).await;
    store
        .cancel_attempt(&job.owner, &job.id, 1, &to("fallback"), &by(2))
        .await
        .unwrap();
    let second_lease = at(120_000);
    store
        .claim_attempt(&job.id, 2, second_lease, &by(3))
        .await
        .unwrap();
    let (won, after) = answer(store.as_ref(), &job, 1, "late", 4).await;
    assert_eq!(won, Completion::Won);
    assert_eq!(after.status(), JobStatus::Succeeded);
    assert_eq!(after.attempt(2).unwrap().state, AttemptState::Started);
    let expired = store
        .expired_leases(second_lease + Duration::seconds(1), 10)
        .await
        .unwrap();
    assert!(expired.contains(&AttemptRef {
        job_id: job.id.clone(),
        number: 2
    }));
    let unknown = store.mark_unknown(&job.id, 2, None, &by(5)).await.unwrap();
    assert_eq!(unknown.attempt(2).unwrap().state, AttemptState::Unknown);
    assert_eq!(unknown.status(), JobStatus::Succeeded);
    let (lost, _) = answer(store.as_ref(), &job, 2, "B", 6).await;
    assert_eq!(lost, Completion::Lost { winner: Some(1) });
    let stored = store
        .get_job(&job.owner, &job.id, later())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.attempt(2).unwrap().state, AttemptState::Discarded);
    assert_eq!(stored.result, Some(json!({"summary": "late"})));
}

/// A result that wins while the next attempt is still queued ends that attempt (`cancelled`): it can never run,
/// and nothing sweeps it again.
pub(crate) async fn a_winning_result_ends_the_queued_attempt(store: Arc<dyn JobStore>) {
    let job = claimed_job(store.as_ref()).await;
    store
        .cancel_attempt(&job.owner, &job.id, 1, &to("fallback"), &by(2))
        .await
        .unwrap();
    let (won, after) = answer(store.as_ref(), &job, 1, "late", 3).await;
    assert_eq!(won, Completion::Won);
    assert_eq!(after.attempt(2).unwrap().state, AttemptState::Cancelled);
    assert_eq!(
        store.stale_queued(later(), later(), 10).await.unwrap(),
        vec![]
    );
}

/// The sweeper's re-dispatch is recorded: the attempt is not stale again until its turn comes round.
pub(crate) async fn a_redispatch_is_recorded_and_waits_its_turn(store: Arc<dyn JobStore>) {
    let job = fresh_job(store.as_ref()).await;
    let this = AttemptRef {
        job_id: job.id.clone(),
        number: 1,
    };
    assert_eq!(
        store.stale_queued(at(100), later(), 10).await.unwrap(),
        vec![this.clone()]
    );
    let after = store.redispatch(&job.id, 1, at(100)).await.unwrap();
    assert_eq!(after.attempt(1).unwrap().dispatched_at, at(100));
    assert_eq!(
        store.stale_queued(at(100), later(), 10).await.unwrap(),
        vec![]
    );
    assert_eq!(
        store.stale_queued(at(101), later(), 10).await.unwrap(),
        vec![this]
    );
    store
        .claim_attempt(&job.id, 1, lease(), &by(200))
        .await
        .unwrap();
    assert!(matches!(
        store.redispatch(&job.id, 1, at(300)).await,
        Err(StoreError::Refused(_))
    ));
}

/// A cancelled attempt's answer wins only before its lease ends; after it, it is discarded, and the failed job
/// was settled from that moment.
pub(crate) async fn a_cancelled_attempt_answering_after_its_lease_is_discarded(
    store: Arc<dyn JobStore>,
) {
    let job = claimed_job(store.as_ref()).await;
    let (_, failed) = store
        .cancel_attempt(&job.owner, &job.id, 1, &stop(), &by(2))
        .await
        .unwrap();
    assert_eq!(failed.status(), JobStatus::Failed);
    assert_eq!(failed.settles_at(), Some(lease()));
    let too_late = Stamp::fresh(lease());
    let (lost, after) = store
        .complete_attempt(
            &job.id,
            1,
            json!({"summary": "late"}),
            CallReport::default(),
            &too_late,
        )
        .await
        .unwrap();
    assert_eq!(lost, Completion::Lost { winner: None });
    assert_eq!(after.status(), JobStatus::Failed);
    assert_eq!(after.attempt(1).unwrap().state, AttemptState::Discarded);
    assert_eq!(all_jobs(store.as_ref(), "alice").await, vec![after]);
}
