//! Two processes on one DynamoDB table, as AWS runs them (two api functions, an api function beside a worker), each
//! with its own client through a wire proxy that holds chosen writes back (a slow write: it lands when the test
//! lets it go) or loses their answers (invariant 21). Each process is an engine of its own: what one process
//! keeps for a moment (the creates it is writing, the evidence it read) the other does not see, so nothing here is
//! saved by a process's own memory — only by the table's conditions and the ledger's guarded writes.

use std::sync::Arc;

use onejob::domain::{
    Budget, JobStatus, LimitReached, Limits, OwnerLimits, Period, ProviderName, Refusal,
};
use onejob::engine::Actor;
use onejob::store::dynamodb::DynamoStore;
use onejob::store::{CreateOutcome, JobStore, StoreError};
use onejob::worker::Processed;
use serde_json::json;

use crate::support::aws::{sdk_config, table_for_test, unique_name};
use crate::support::rig::Rig;
use crate::support::stand_in::{Reply, StandIn, openai};
use crate::support::wire::WireProxy;

/// Two stores on one fresh table, each with its own client, both through one wire proxy; `None` outside CI when
/// there is no test server.
async fn two_processes() -> Option<(WireProxy, Arc<dyn JobStore>, Arc<dyn JobStore>)> {
    let config = sdk_config().await?;
    let endpoint = std::env::var("ONEJOB_TEST_AWS_ENDPOINT").unwrap();
    let proxy = WireProxy::start(&endpoint).await;
    let table = unique_name("onejob-two");
    table_for_test(&aws_sdk_dynamodb::Client::new(&config), &table).await;
    let process = || -> Arc<dyn JobStore> {
        let client = aws_sdk_dynamodb::config::Builder::from(&config)
            .endpoint_url(proxy.url())
            .build();
        Arc::new(DynamoStore::new(
            aws_sdk_dynamodb::Client::from_conf(client),
            &table,
        ))
    };
    let (a, b) = (process(), process());
    Some((proxy, a, b))
}

fn everyone(limits: OwnerLimits) -> Limits {
    Limits {
        default: limits,
        ..Limits::default()
    }
}

/// An engine of one process on `store`, its owners held to `limits`, its providers answering.
async fn process(store: Arc<dyn JobStore>, limits: OwnerLimits) -> Rig {
    let answering = StandIn::answering(json!({"summary": "A"})).await;
    let url = answering.base_url();
    Rig::configured(store, openai(url.clone()), openai(url), |config| {
        config.limits = everyone(limits)
    })
}

/// Each limit kind, set so that two intents fit and a third does not.
fn every_limit() -> [(&'static str, OwnerLimits); 3] {
    [
        (
            "live jobs",
            OwnerLimits {
                live_jobs: Some(2),
                ..OwnerLimits::default()
            },
        ),
        (
            "creates a minute",
            OwnerLimits {
                creates_per_minute: Some(2),
                ..OwnerLimits::default()
            },
        ),
        (
            "a budget",
            OwnerLimits {
                budget: Some(Budget {
                    period: Period::Day,
                    tokens: Some(1_000_000),
                    cost: None,
                }),
                ..OwnerLimits::default()
            },
        ),
    ]
}

fn limit_of(refused: Result<CreateOutcome, StoreError>) -> LimitReached {
    match refused {
        Err(StoreError::Refused(Refusal::Limit(limit))) => limit,
        other => panic!("expected a limit's refusal, got {other:?}"),
    }
}

/// A double click that reaches two api processes while the first one's job `PutItem` is slow to land: the second
/// finds no job yet, finds the intent holding its place already (the first's), and is not refused and not counted
/// again — its own conditional put lands first and is the 201, the first's lands on it and is the replay. One 201,
/// never a 429, under every limit kind — under a budget, even when another intent's reservation lands meanwhile
/// and fills it; the owner's next intent is admitted (refused once the budget is full), as the intent counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_double_click_across_two_processes_with_a_slow_write_is_one_201_under_every_limit() {
    for (kind, limits) in every_limit() {
        let Some((proxy, first_store, second_store)) = two_processes().await else {
            return;
        };
        let mut first = process(first_store.clone(), limits).await;
        let limits = match limits.budget {
            // Room for two intents' worst cases: the click's, and one more.
            Some(budget) => {
                let click = first.intent("click-1");
                let bound = (first.engine).bound(&click.contract, &click.input, &click.providers);
                let budget = Budget {
                    tokens: Some(2 * bound.tokens),
                    ..budget
                };
                first = process(
                    first_store,
                    OwnerLimits {
                        budget: Some(budget),
                        ..limits
                    },
                )
                .await;
                OwnerLimits {
                    budget: Some(budget),
                    ..limits
                }
            }
            None => limits,
        };
        let mut second = process(second_store, limits).await;
        let held = proxy.hold("PutItem", "click-1");
        let engine = first.engine.clone();
        let intent = first.intent("click-1");
        let slow = tokio::spawn(async move { engine.create_job(intent).await });
        held.arrived().await;
        if limits.budget.is_some() {
            // Another intent's worst case fills the budget meanwhile.
            let other = second.engine.create_job(second.intent("other")).await;
            assert!(matches!(other, Ok(CreateOutcome::Created(_))), "{other:?}");
        }
        let fast = second.engine.create_job(second.intent("click-1")).await;
        assert!(
            matches!(fast, Ok(CreateOutcome::Created(_))),
            "{kind}: {fast:?}"
        );
        held.release();
        let slow = slow.await.unwrap();
        assert!(
            matches!(slow, Ok(CreateOutcome::Replayed(_))),
            "{kind}: {slow:?}"
        );
        assert_eq!(
            slow.unwrap().job().id,
            fast.unwrap().job().id,
            "{kind}: one job"
        );
        // Counted once: the next intent fits; beyond it, the live-jobs and the creates' limits refuse. The budget
        // was filled meanwhile: another intent is refused.
        let next = second.engine.create_job(second.intent("next")).await;
        if limits.budget.is_some() {
            assert!(
                matches!(limit_of(next), LimitReached::Budget { .. }),
                "{kind}"
            );
            continue;
        }
        assert!(next.is_ok(), "{kind}");
        limit_of(second.engine.create_job(second.intent("third")).await);
        while !second.no_message() {}
    }
}

/// A ledger write whose answer is lost (it landed; the SDK tries it again, and its guard then fails) is found again
/// by the create's next try as its intent's place: counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ledger_write_whose_answer_is_lost_counts_its_create_once() {
    let Some((proxy, store, _)) = two_processes().await else {
        return;
    };
    let limits = OwnerLimits {
        creates_per_minute: Some(2),
        ..OwnerLimits::default()
    };
    let mut rig = process(store.clone(), limits).await;
    proxy.lose_answer("UpdateItem", "limits#alice");
    let created = rig.engine.create_job(rig.intent("lost-answer")).await;
    assert!(
        matches!(created, Ok(CreateOutcome::Created(_))),
        "{created:?}"
    );
    assert!(proxy.spent());
    let ledger = store
        .owner_ledger(&onejob::domain::Owner::parse("alice").unwrap())
        .await
        .unwrap();
    // One create counted at the rate (a minute's interval ahead of its first try), one place.
    assert!(ledger.rate_tat_us > 0);
    assert_eq!(ledger.places.len(), 1);
    assert!(rig.engine.create_job(rig.intent("second")).await.is_ok());
    limit_of(rig.engine.create_job(rig.intent("third")).await);
    while !rig.no_message() {}
}

/// A manual attempt in one process whose job write is slow to land has taken its place among the owner's live
/// jobs before it: a create in the other process meanwhile is refused at the limit — never two live jobs at a
/// limit of one — and is admitted once the attempt's job is no longer live.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manual_attempt_with_a_slow_write_holds_its_place_against_the_other_process() {
    let Some((proxy, first_store, second_store)) = two_processes().await else {
        return;
    };
    let limits = OwnerLimits {
        live_jobs: Some(1),
        ..OwnerLimits::default()
    };
    let refusing = StandIn::spawn(vec![], Reply::Status(400, "no")).await;
    let mut first = Rig::configured(
        first_store,
        openai(refusing.base_url()),
        openai(refusing.base_url()),
        |config| config.limits = everyone(limits),
    );
    let mut second = process(second_store, limits).await;
    let (failed, message) = first.create("fails").await;
    assert_eq!(first.process(&message).await, Processed::Failed);
    assert_eq!(first.job(&failed).await.status(), JobStatus::Failed);
    // The attempt's write of the job (the whole item, guarded by its revision) is held at the wire.
    let held = proxy.hold("PutItem", "fails");
    let engine = first.engine.clone();
    let (owner, id) = (Actor::Owner(failed.owner.clone()), failed.id.clone());
    let attempt = tokio::spawn(async move {
        let fallback = Some(ProviderName::parse("fallback").unwrap());
        engine.add_attempt(&owner, &id, fallback, None).await
    });
    held.arrived().await;
    limit_of(second.engine.create_job(second.intent("meanwhile")).await);
    held.release();
    assert_eq!(attempt.await.unwrap().unwrap().number, 2);
    // The attempt fails too: the job is no longer live, its place is free, and the other process's create fits.
    let message = first.next_message();
    assert_eq!(first.process(&message).await, Processed::Failed);
    assert!(
        second
            .engine
            .create_job(second.intent("after"))
            .await
            .is_ok()
    );
    while !second.no_message() {}
}

/// A hundred concurrent creates of one owner through two processes on one table, against a budget with room for
/// exactly seven worst cases: seven jobs, ninety-three `budget_exceeded`, and the ledger reserves seven worst cases —
/// never more than the budget, whichever process wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_through_two_processes_reserves_no_more_than_the_budget() {
    let Some((_proxy, first_store, second_store)) = two_processes().await else {
        return;
    };
    let probe = process(first_store.clone(), OwnerLimits::default()).await;
    let intent = probe.intent("probe");
    let worst = (probe.engine).bound(&intent.contract, &intent.input, &intent.providers);
    let limits = OwnerLimits {
        budget: Some(Budget {
            period: Period::Day,
            tokens: Some(7 * worst.tokens + worst.tokens / 2),
            cost: None,
        }),
        ..OwnerLimits::default()
    };
    let first = process(first_store.clone(), limits).await;
    let second = process(second_store, limits).await;
    let creates = (0..100).map(|i| {
        let rig = if i % 2 == 0 { &first } else { &second };
        let (engine, intent) = (rig.engine.clone(), rig.intent(&format!("burst-{i}")));
        tokio::spawn(async move { engine.create_job(intent).await })
    });
    let mut created = 0;
    for create in futures_util::future::join_all(creates).await {
        match create.unwrap() {
            Ok(CreateOutcome::Created(_)) => created += 1,
            refused => assert!(
                matches!(limit_of(refused), LimitReached::Budget { .. }),
                "refused by the budget only"
            ),
        }
    }
    assert_eq!(created, 7, "exactly the worst cases that fit");
    let ledger = first_store.owner_ledger(&intent.owner).await.unwrap();
    assert_eq!(ledger.reserved().tokens, 7 * worst.tokens);
}
