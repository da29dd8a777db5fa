//! The store conformance suite (and, in [`engine`], the engine's suite on that store): every case takes an `Arc<dyn JobStore>` and asserts what the design's invariants promise, so
//! every backend runs the very same cases. A backend's test file calls [`conformance_suite!`] with an async
//! expression that yields a fresh [`Fixture`].

pub(crate) mod edges;
pub(crate) mod engine;
pub(crate) mod events;
pub(crate) mod faults;
pub(crate) mod identity;
pub(crate) mod model;
pub(crate) mod promise;
pub(crate) mod replies;
pub(crate) mod results;
pub(crate) mod shared;
pub(crate) mod transitions;

pub(crate) use edges::*;
pub(crate) use engine::*;
pub(crate) use events::*;
pub(crate) use faults::*;
pub(crate) use identity::*;
pub(crate) use model::*;
pub(crate) use promise::*;
pub(crate) use replies::*;
pub(crate) use results::*;
pub(crate) use shared::*;
pub(crate) use transitions::*;

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
pub(crate) struct Fixture {
    pub store: Arc<dyn JobStore>,
    /// How many random sequences the model test runs on this store by default (`ONEJOB_MODEL_CASES` overrides it):
    /// many where a case takes milliseconds, fewer where it takes a second (moto answers a few hundred requests a
    /// second).
    pub model_cases: u32,
    /// How many creates the long-lived owner makes under each limit kind (`ONEJOB_LONG_OWNER` overrides it): 10,000
    /// where a create takes a fraction of a millisecond, 150 on moto, whose one Python process answers a few dozen
    /// creates a second under limits (the bound is the limit's, the same rule on every store: the domain's).
    pub long_owner_creates: usize,
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
            a_large_input_comes_back_from_every_answer,
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
            a_definite_failure_fails_over_to_the_fallback,
            an_output_that_breaks_the_contract_fails_and_an_unqualified_fallback_gets_nothing,
            a_result_too_large_to_keep_fails_the_attempt,
            a_lost_connection_is_unknown_and_a_refused_one_is_failed,
            the_provider_call_carries_the_attempt_key_and_the_contract,
            the_sweeper_resolves_expired_leases_and_lost_messages,
            qualification_evidence_is_kept_per_pair_of_fingerprints,
            a_create_that_fails_either_side_of_its_write_is_created_once,
            duplicates_of_a_create_in_flight_answer_from_its_write_without_writing,
            a_breaker_write_that_fails_either_side_never_decides_a_job,
            an_evidence_write_that_fails_either_side_never_decides_a_job,
            a_call_slot_write_that_fails_either_side_never_calls_twice,
            a_reservation_or_settle_that_fails_either_side_counts_each_call_once,
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
            an_event_the_store_would_not_arm_is_armed_by_the_redelivery,
            a_status_change_within_one_millisecond_is_listed_under_the_new_status,
            a_job_past_its_retention_is_gone_and_its_key_makes_a_new_job,
            a_job_at_every_cap_still_fits_the_store,
            a_started_attempt_of_a_job_another_attempt_won_still_ends,
            a_winning_result_ends_the_queued_attempt,
            a_redispatch_is_recorded_and_waits_its_turn,
            a_cancelled_attempt_answering_after_its_lease_is_discarded,
            a_gateway_timeout_is_unknown_and_the_fallback_is_not_paid,
            the_loser_of_a_race_won_by_a_cancelled_attempt_ends_unknown,
            a_rate_limited_provider_is_retried_not_before_its_retry_after,
            a_providers_retry_hints_are_honoured,
            a_fallback_that_answers_as_another_model_loses_its_standing_at_once,
            a_breaker_opened_by_five_failures_is_shared_and_probed_after_its_cooldown,
            a_clean_breaker_and_evidence_are_read_once_per_window_and_a_failure_always_reads,
            endpoints_are_kept_per_owner_and_removed,
            deliveries_are_armed_once_per_settle_and_taken_by_compare_and_swap,
            the_sweeper_delivers_batch_after_batch_until_none_is_due,
            the_sweeper_expires_and_dispatches_again_batch_after_batch,
            one_settle_is_one_event_whatever_its_orphan_does,
            refusals_the_input_caused_never_open_a_breaker,
            production_breaches_only_suspect_and_the_samples_decide,
            a_note_on_old_evidence_never_overwrites_a_newer_qualification,
            an_answer_that_comes_while_the_time_out_write_stalls_is_kept,
            the_answer_is_written_before_the_breaker_and_the_evidence,
            jobs_waiting_on_a_probe_are_called_once_it_answers,
            a_cancelled_attempts_answer_is_in_time_by_when_it_came,
            a_cancelled_attempts_late_failure_is_kept_and_settles_nothing,
            an_echoed_key_is_scrubbed_from_messages_and_never_from_an_answer,
            a_prompt_of_separator_lines_is_answered_not_called_truncated,
            a_duplicate_message_never_frees_the_slot_of_the_running_call,
            a_manual_attempt_is_held_to_the_owners_live_jobs,
            a_spent_budget_stops_manual_attempts_and_failover,
            a_budget_moved_from_day_to_month_is_held_that_month,
            one_owners_slow_endpoint_never_delays_another_owners_events,
            a_slow_endpoints_tries_hold_up_no_other_batch,
            every_reply_of_every_provider_kind_means_what_it_says_of_the_work,
            an_operators_keys_are_its_own,
            a_redirect_is_never_followed_so_the_key_goes_nowhere_else,
            a_lost_answer_is_found_at_the_provider_not_bought_again,
            a_call_the_provider_never_did_is_tried_again_once_its_absence_is_sure,
            an_unknown_no_provider_can_answer_waits_for_its_policy_or_a_person,
            two_reconcilers_clear_an_unknown_once,
            a_lookup_that_fails_is_asked_again_and_never_calls,
            a_claim_found_again_too_late_for_its_lease_is_not_called,
            a_lookups_event_the_store_would_not_arm_is_armed_by_its_redelivery,
            a_background_response_is_waited_on_by_its_id_through_lost_reads,
            an_unknown_background_response_is_settled_by_reading_its_id,
            a_batch_is_answered_from_its_results_at_half_the_price,
            a_batch_cancelled_at_the_provider_is_cleared_and_submitted_anew,
            a_batch_whose_submit_answer_was_lost_is_found_by_listing_never_submitted_again,
        );
    };
    (@cases $fixture:expr; $($case:ident),* $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn the_store_follows_the_model_step_by_step() {
            let fixture: Option<$crate::conformance::Fixture> = $fixture.await;
            let Some(fixture) = fixture else { return };
            let cases = fixture.model_cases;
            $crate::conformance::the_store_follows_the_model_step_by_step(fixture.store.clone(), cases).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_long_lived_owners_ledger_stays_bounded() {
            let fixture: Option<$crate::conformance::Fixture> = $fixture.await;
            let Some(fixture) = fixture else { return };
            let creates = fixture.long_owner_creates;
            $crate::conformance::a_long_lived_owners_ledger_stays_bounded(fixture.store.clone(), creates).await;
        }
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let fixture: Option<$crate::conformance::Fixture> = $fixture.await;
                let Some(fixture) = fixture else { return };
                $crate::conformance::bounded(stringify!($case), $crate::conformance::$case(fixture.store.clone())).await;
            }
        )*
    };
}

/// How long one case may take, in real time: the slowest take seconds (on moto), so one that takes minutes hangs.
const CASE_BOUND: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `case` to its end, or fails naming it once it has run [`CASE_BOUND`]: a case that hangs (a step asleep on a
/// clock nobody moves, a held reply never released) fails the suite there, with its name, instead of holding it
/// until CI's own limit.
pub(crate) async fn bounded(name: &str, case: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(CASE_BOUND, case).await.is_err() {
        panic!("{name} did not end within {CASE_BOUND:?}: it hangs");
    }
}

pub(crate) fn at(ms: i64) -> Timestamp {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
}

fn owner(name: &str) -> Owner {
    Owner::parse(name).unwrap()
}

fn provider(name: &str) -> ProviderName {
    ProviderName::parse(name).unwrap()
}

pub(crate) fn new_job(owner_name: &str, key: &str, input: Value) -> NewJob {
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

pub(crate) async fn all_jobs(store: &dyn JobStore, owner_name: &str) -> Vec<Job> {
    let query = ListQuery {
        status: None,
        limit: ListQuery::MAX_LIMIT,
        cursor: None,
        created_before: None,
    };
    store
        .list_jobs(&owner(owner_name), &query, later())
        .await
        .unwrap()
        .jobs
}

/// Alice's job under key `k`, created at `at(0)`, attempt 1 queued.
pub(crate) async fn fresh_job(store: &dyn JobStore) -> Job {
    created(store, new_job("alice", "k", json!({"text": "a"})), at(0)).await
}

/// [`fresh_job`] with attempt 1 claimed at `at(1)`.
pub(crate) async fn claimed_job(store: &dyn JobStore) -> Job {
    let job = fresh_job(store).await;
    store
        .claim_attempt(&job.id, 1, lease(), &by(1))
        .await
        .unwrap()
}

/// Attempt `number` of `job` answers `{"summary": summary}` at `at(ms)`, as a writer of its own.
pub(crate) async fn answer(
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
pub(crate) fn stop() -> Failover {
    to_any(&[])
}

/// Failover that may go to `qualified`.
pub(crate) fn to(qualified: &str) -> Failover {
    to_any(&[qualified])
}

fn to_any(qualified: &[&str]) -> Failover {
    Failover {
        qualified: qualified.iter().map(|p| provider(p)).collect(),
        max_attempts: Failover::DEFAULT_MAX_ATTEMPTS,
        retry: None,
        jitter_permille: 0,
        budget: None,
    }
}

/// How long the suite's jobs are kept.
pub(crate) const RETENTION: Duration = Duration::days(30);

/// A write of its own (a fresh token) at `at(ms)`.
pub(crate) fn by(ms: i64) -> Stamp {
    Stamp::fresh(at(ms))
}

/// When the suite reads: after every write of a case, well before any job expires.
pub(crate) fn later() -> Timestamp {
    at(3_600_000)
}

pub(crate) fn lease() -> Timestamp {
    at(60_000)
}
