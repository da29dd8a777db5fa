//! The batch lane, on every store: a provider with `batch = true` submits each call as a batch of its one request
//! (OpenAI's Batch API, through chat completions or the Responses API; Anthropic's Message Batches). A batch still
//! running at its time-out leaves the attempt `unknown` with the batch's id, and the reconciler reads the batch's
//! result once it ends; a submit whose answer was lost is found by listing the provider's batches, never submitted
//! again. Exact counts: batches submitted (what the provider bills), requests done, lookups.

use onejob::domain::{ClearedBy, PriceTable};
use onejob::providers::{OpenAiApi, ProviderConfig, ProviderKind};

use super::reconcile::{cleared, lease_ms, read, read_past_its_time_out};
use super::*;
use crate::support::stand_in::{Loss, anthropic};

/// The three ways a batch is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
}

const LANES: [Lane; 3] = [Lane::OpenAiChat, Lane::OpenAiResponses, Lane::Anthropic];

/// A provider at `base_url` whose calls go through `lane`'s batch API.
fn batching(lane: Lane, base_url: String) -> ProviderConfig {
    let mut config = match lane {
        Lane::Anthropic => anthropic(base_url),
        _ => openai(base_url),
    };
    match &mut config.kind {
        ProviderKind::Openai(settings) => {
            settings.batch = Some(true);
            if lane == Lane::OpenAiResponses {
                settings.api = Some(OpenAiApi::Responses);
            }
        }
        ProviderKind::Anthropic(settings) => settings.batch = Some(true),
        _ => unreachable!("an HTTP provider"),
    }
    config
}

/// A rig whose primary (at `primary`) batches through `lane`, priced at 1,000 a million tokens either way.
fn rig(store: Arc<dyn JobStore>, lane: Lane, primary: &StandIn, fallback: &StandIn) -> Rig {
    let rig = Rig::configured(
        store,
        batching(lane, primary.base_url()),
        openai(fallback.base_url()),
        |config| {
            let price = toml::from_str("input = 1000.0\noutput = 1000.0").unwrap();
            let mut prices = PriceTable::default();
            prices.per_million.insert("primary".into(), price);
            config.prices = Some(prices);
        },
    );
    primary.keep_time_by(rig.clock.clone());
    rig
}

/// A batch still running at its time-out: the attempt goes `unknown` with the batch's id, no sign of a failing
/// provider; once it ends and no worker can hear it, the reconciler reads the batch by that id and its result is the
/// attempt's answer — one batch submitted, one request done, billed at half the price table's price. The request is
/// the API's own under the attempt's identity.
pub(crate) async fn a_batch_is_answered_from_its_results_at_half_the_price(
    store: Arc<dyn JobStore>,
) {
    for lane in LANES {
        let gate = Gate::new();
        let primary = StandIn::spawn(
            vec![Reply::Held(gate.clone())],
            Reply::Answer(summary("again")),
        )
        .await;
        let fallback = StandIn::answering(summary("B")).await;
        let mut rig = rig(store.clone(), lane, &primary, &fallback);
        let (job, message) = rig.create(&format!("batched-{lane:?}")).await;
        let step = rig.process_in_background(&message);
        let unknown = read_past_its_time_out(&rig, &primary, &job, step).await;
        let batch_id = primary.batches()[0]["id"].as_str().unwrap().to_owned();
        assert_eq!(
            unknown.attempt(1).unwrap().call_id.as_deref(),
            Some(batch_id.as_str()),
            "{lane:?}"
        );
        assert!(
            rig.engine.clears_itself(&rig.job(&job).await),
            "{lane:?}: not a person's"
        );
        gate.open(summary("A, batched"));
        while primary.stored_count() < 1 {
            tokio::task::yield_now().await;
        }
        rig.advance(lease_ms(&rig));
        let reads = primary.lookups().len();
        assert_eq!(rig.reconcile().await, [Processed::Succeeded], "{lane:?}");
        assert_eq!(primary.lookups()[reads], format!("batches/{batch_id}"));
        let done = rig.job(&job).await;
        assert_eq!(done.result, Some(summary("A, batched")), "{lane:?}");
        assert_eq!(
            done.attempt(1).unwrap().cleared.map(|c| c.by),
            Some(ClearedBy::Lookup)
        );
        assert_eq!(
            (
                primary.call_count(),
                primary.stored_count(),
                fallback.call_count()
            ),
            (1, 1, 0),
            "{lane:?}"
        );
        // Half the list price: 1,000 a million tokens is a millionth of the currency a token, 1,000,000 nanos.
        let report = done.attempt(1).unwrap().report.clone().unwrap();
        let tokens = report.input_tokens.unwrap() + report.output_tokens.unwrap();
        assert_eq!(report.cost_nanos, Some(tokens * 1_000_000 / 2), "{lane:?}");

        let submitted = &primary.calls()[0];
        let identity = format!("{}_1", job.id);
        let (request, path) = match lane {
            Lane::Anthropic => (&submitted.body["requests"][0], "/v1/messages/batches"),
            _ => (&submitted.body["request"], "/v1/batches"),
        };
        assert_eq!(submitted.uri.path(), path);
        assert_eq!(request["custom_id"], identity.as_str());
        match lane {
            Lane::Anthropic => {
                assert_eq!(request["params"]["tool_choice"]["name"], "answer");
                assert_eq!(request["params"]["model"], "claude-stand-in");
            }
            _ => {
                let batch = &submitted.body["batch"];
                assert_eq!(batch["metadata"]["onejob_attempt"], format!("{}:1", job.id));
                assert_eq!(batch["completion_window"], "24h");
                assert_eq!(batch["output_expires_after"]["seconds"], 30 * 24 * 3600);
                let url = match lane {
                    Lane::OpenAiResponses => "/v1/responses",
                    _ => "/v1/chat/completions",
                };
                assert_eq!(
                    (request["url"].as_str(), request["method"].as_str()),
                    (Some(url), Some("POST"))
                );
                assert!(request["body"].get("background").is_none(), "{request}");
            }
        }
    }
}

/// A batch cancelled at the provider before its work is not done, and its provider is tried again in a new batch:
/// seen by the reconciler, the attempt is cleared by its lookup; seen by the worker still reading it, the attempt
/// fails `cancelled_at_provider`, which is retried on the same provider. Two submitted, one done, either way.
pub(crate) async fn a_batch_cancelled_at_the_provider_is_cleared_and_submitted_anew(
    store: Arc<dyn JobStore>,
) {
    for (lane, by_worker) in [
        (Lane::OpenAiChat, false),
        (Lane::Anthropic, false),
        (Lane::OpenAiChat, true),
        (Lane::Anthropic, true),
    ] {
        let gate = Gate::new();
        let primary =
            StandIn::spawn(vec![Reply::Held(gate)], Reply::Answer(summary("again"))).await;
        let fallback = StandIn::answering(summary("B")).await;
        let mut rig = rig(store.clone(), lane, &primary, &fallback);
        let (job, message) = rig.create(&format!("cancelled-{lane:?}-{by_worker}")).await;
        let step = rig.process_in_background(&message);
        if by_worker {
            read(&rig, &primary, 1).await;
            primary.cancel_batches();
            rig.advance(250);
            assert_eq!(step.await.unwrap(), Processed::Failed);
            let failed = rig.job(&job).await;
            assert_eq!(
                failed
                    .attempt(1)
                    .unwrap()
                    .error
                    .as_ref()
                    .map(|e| e.code.as_str()),
                Some("cancelled_at_provider")
            );
            // Retried on the same provider, after its backoff.
            let retry = failed.attempt(2).unwrap();
            assert_eq!(
                (retry.provider.as_str(), retry.retry_of),
                ("primary", Some(1))
            );
            let wait = retry.not_before.unwrap() - rig.clock.now();
            rig.advance(wait.num_milliseconds().max(0) as u64 + 5_000);
        } else {
            read_past_its_time_out(&rig, &primary, &job, step).await;
            primary.cancel_batches();
            rig.advance(lease_ms(&rig));
            assert_eq!(rig.reconcile().await, [Processed::Cleared], "{lane:?}");
            let cleared_job = rig.job(&job).await;
            assert_eq!(
                cleared(&cleared_job, 1),
                (AttemptState::Cancelled, Some(ClearedBy::Lookup))
            );
        }
        let retry = rig.message().await;
        assert_eq!(retry.number, 2);
        assert_eq!(rig.process(&retry).await, Processed::Succeeded);
        let done = rig.job(&job).await;
        assert_eq!(done.result, Some(summary("again")));
        assert_eq!(done.attempt(2).unwrap().provider.as_str(), "primary");
        assert_eq!(
            (
                primary.call_count(),
                primary.stored_count(),
                fallback.call_count()
            ),
            (2, 1, 0),
            "{lane:?} {by_worker}"
        );
    }
}

/// What a lost submit left at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    /// A batch, done.
    Done,
    /// A batch, still running.
    Running,
    /// A batch, done, its submit answered 2xx with no id onejob can keep.
    Unnamed,
    /// A batch, done, its submit answered 303 "see other".
    Redirected,
    /// Nothing.
    Nothing,
}

/// A submit whose answer was lost: the attempt is `unknown` with no batch id. The reconciler lists the provider's
/// batches — never submits again —: the batch made is found (by its metadata at OpenAI, by its results at
/// Anthropic) and its result is the answer, one batch in all — as is one whose submit was answered 2xx with no id
/// onejob can keep, or 303 "see other" (never followed): taken, so never failed and paid again. One still running is waited on, however long past the
/// time absence would be sure — at Anthropic, a running batch of one request made while the call ran may be it, as
/// its requests cannot be seen before it ends (one made long before is not). A submit lost before any batch was made is found nowhere: once its absence is sure the
/// attempt is cleared and submitted anew — two submits, one done.
pub(crate) async fn a_batch_whose_submit_answer_was_lost_is_found_by_listing_never_submitted_again(
    store: Arc<dyn JobStore>,
) {
    for lane in [Lane::OpenAiChat, Lane::Anthropic] {
        for left in [
            Left::Done,
            Left::Unnamed,
            Left::Redirected,
            Left::Running,
            Left::Nothing,
        ] {
            let gate = Gate::new();
            let lost = match left {
                Left::Done => Reply::AfterWork(summary("A, found"), Loss::Dropped),
                Left::Running => Reply::Accepted(gate.clone(), Loss::Dropped),
                Left::Unnamed => Reply::Unnamed(summary("A, found")),
                Left::Redirected => Reply::AfterWork(summary("A, found"), Loss::SeeOther),
                Left::Nothing => Reply::BeforeWork(Loss::Dropped),
            };
            let primary = StandIn::spawn(vec![lost], Reply::Answer(summary("again"))).await;
            let fallback = StandIn::answering(summary("B")).await;
            let mut rig = rig(store.clone(), lane, &primary, &fallback);
            if lane == Lane::Anthropic {
                // A running batch of one request made long before this call: not its, whatever it holds.
                let before = rig.clock.now() - chrono::Duration::minutes(10);
                primary.someone_elses_batch(before);
            }
            let (job, message) = rig.create(&format!("submit-lost-{lane:?}-{left:?}")).await;
            assert_eq!(rig.process(&message).await, Processed::Unknown);
            let unknown = rig.job(&job).await;
            assert_eq!(unknown.attempt(1).unwrap().call_id, None);
            assert!(
                rig.engine.clears_itself(&unknown),
                "{lane:?}: asked by listing"
            );
            let primary_name = onejob::domain::ProviderName::parse("primary").unwrap();
            let absent_ms = (rig
                .engine
                .providers
                .get(&primary_name)
                .unwrap()
                .config
                .limits)
                .lookup_absent_after_ms;
            rig.advance(lease_ms(&rig).max(absent_ms));
            let processed = rig.reconcile().await;
            assert!(
                primary.lookups().iter().any(|l| l.starts_with("batches?")),
                "{lane:?}: listed {:?}",
                primary.lookups()
            );
            match left {
                Left::Done | Left::Unnamed | Left::Redirected => {
                    assert_eq!(processed, [Processed::Succeeded], "{lane:?}");
                    assert_eq!(rig.job(&job).await.result, Some(summary("A, found")));
                    assert_eq!(
                        (primary.call_count(), primary.stored_count()),
                        (1, 1),
                        "{lane:?}"
                    );
                }
                Left::Running => {
                    assert_eq!(processed, [Processed::Unknown], "{lane:?}: waited on");
                    // Not a person's while the batch may be it — until a batch's day is long gone: then a person is
                    // told too, while the reconciler goes on asking.
                    assert!(rig.engine.clears_itself(&rig.job(&job).await));
                    rig.advance(26 * 3_600_000);
                    let listed = rig
                        .engine
                        .needing_a_person(Some(JobStatus::Unknown), 100, None)
                        .await
                        .unwrap();
                    assert!(listed.jobs.iter().any(|j| j.id == job.id));
                    assert!(
                        !rig.engine.clears_itself(&rig.job(&job).await),
                        "{lane:?}: a person's too"
                    );
                    gate.open(summary("A, at last"));
                    while primary.stored_count() < 1 {
                        tokio::task::yield_now().await;
                    }
                    assert_eq!(rig.reconcile().await, [Processed::Succeeded], "{lane:?}");
                    assert_eq!(rig.job(&job).await.result, Some(summary("A, at last")));
                    assert_eq!(
                        (primary.call_count(), primary.stored_count()),
                        (1, 1),
                        "{lane:?}"
                    );
                }
                Left::Nothing => {
                    assert_eq!(processed, [Processed::Cleared], "{lane:?}");
                    let retry = rig.message().await;
                    assert_eq!(rig.process(&retry).await, Processed::Succeeded);
                    assert_eq!(rig.job(&job).await.result, Some(summary("again")));
                    assert_eq!(
                        (primary.call_count(), primary.stored_count()),
                        (2, 1),
                        "{lane:?}"
                    );
                }
            }
            assert_eq!(fallback.call_count(), 0);
        }
    }
}
