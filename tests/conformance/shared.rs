//! State shared across owners and processes, on every store (invariants 18 and 21): an owner's limits on every
//! write that makes a job live or orders a paid call — a create, a manual or operator attempt, a failover, a retry —
//! and on nothing another owner does; call slots under a duplicate message; a budget whose period changes kind; an
//! owner whose ledger stays bounded by its limits however long it lives.

use std::sync::Arc;

use onejob::domain::{
    Budget, JobStatus, LimitReached, Limits, OwnerLimits, Period, ProviderName, Refusal,
};
use onejob::engine::Actor;
use onejob::store::{JobStore, StoreError};
use onejob::worker::{Processed, process_message};
use serde_json::{Value, json};

use crate::support::record_qualified;
use crate::support::rig::Rig;
use crate::support::stand_in::{Gate, Reply, StandIn, openai};

fn summary(text: &str) -> Value {
    json!({"summary": text})
}

/// Every owner's limits are `limits`.
fn everyone(limits: OwnerLimits) -> Limits {
    Limits {
        default: limits,
        ..Limits::default()
    }
}

fn limit_of(refused: Result<impl std::fmt::Debug, StoreError>) -> LimitReached {
    match refused {
        Err(StoreError::Refused(Refusal::Limit(limit))) => limit,
        other => panic!("expected a limit's refusal, got {other:?}"),
    }
}

/// A duplicate message of a running attempt is a step of its own: its claim is refused, and it frees nothing — the
/// running call keeps its provider's only slot, so another job's attempt waits (no try charged) until the call is
/// done. Calls in flight never pass `max_in_flight`. A duplicate that comes once the call is over lets the slot go.
pub(crate) async fn a_duplicate_message_never_frees_the_slot_of_the_running_call(
    store: Arc<dyn JobStore>,
) {
    let gate = Gate::new();
    let primary =
        StandIn::spawn(vec![Reply::Held(gate.clone())], Reply::Answer(summary("A"))).await;
    let fallback = StandIn::answering(summary("B")).await;
    let mut capped = openai(primary.base_url());
    capped.limits.max_in_flight = Some(1);
    let mut rig = Rig::new(store, capped, openai(fallback.base_url()));
    let (first, sent) = rig.create_sent("running").await;
    let running = rig.process_sent_in_background(&sent);
    primary.received(1).await;
    // The queue delivers the running attempt's message again.
    let duplicate = process_message(&rig.engine, &sent, None).await.unwrap();
    assert_eq!(duplicate, Processed::Dropped);
    let (waiting, other) = rig.create_sent("waiting").await;
    let step = process_message(&rig.engine, &other, None).await.unwrap();
    assert_eq!(
        step,
        Processed::Waiting,
        "the running call still holds the slot"
    );
    assert_eq!(primary.call_count(), 1);
    assert_eq!(rig.job(&waiting).await.attempts.len(), 1, "no try charged");
    gate.open(summary("A"));
    assert_eq!(running.await.unwrap(), Processed::Succeeded);
    assert_eq!(rig.job(&first).await.status(), JobStatus::Succeeded);
    // The slot is free once the running call is done: the waiting attempt comes back and is called.
    rig.advance(1_000);
    let again = rig.sent().await;
    assert_eq!(again.attempt, other.attempt);
    let step = process_message(&rig.engine, &again, None).await.unwrap();
    assert_eq!(step, Processed::Succeeded);
    assert_eq!(primary.call_count(), 2);

    // A duplicate that comes late, once its attempt's call is over, takes the slot again; its claim is refused
    // and it lets the slot go: the next job is called at once, not after the slot's time.
    let late = process_message(&rig.engine, &sent, None).await.unwrap();
    assert_eq!(late, Processed::Dropped);
    let (next, message) = rig.create_sent("after-the-late-duplicate").await;
    let step = process_message(&rig.engine, &message, None).await.unwrap();
    assert_eq!(step, Processed::Succeeded, "the slot was left to its time");
    assert_eq!(rig.job(&next).await.completed_by, Some(1));
    assert_eq!(primary.call_count(), 3);
}

/// A manual attempt that makes a failed job live again is held to its owner's live jobs, as a create is: at the
/// limit it is refused (429 `too_many_live_jobs`), nothing written, and an operator's attempt for the owner is held
/// the same way; once a live job ends, it is admitted. Another owner's jobs count for nothing here.
pub(crate) async fn a_manual_attempt_is_held_to_the_owners_live_jobs(store: Arc<dyn JobStore>) {
    let refusing = StandIn::spawn(vec![], Reply::Status(400, "no")).await;
    let gate = Gate::new();
    let holding = StandIn::spawn(vec![Reply::Held(gate.clone())], Reply::Status(400, "no")).await;
    let mut rig = Rig::configured(
        store,
        openai(refusing.base_url()),
        openai(holding.base_url()),
        |config| {
            config.limits = everyone(OwnerLimits {
                live_jobs: Some(1),
                ..OwnerLimits::default()
            })
        },
    );
    let owner = Actor::Owner(rig.intent("x").owner);
    // A job that failed at once (its fallback is not qualified): not live.
    let (failed, message) = rig.create("failed").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    assert_eq!(rig.job(&failed).await.status(), JobStatus::Failed);
    // The one live job: its attempt runs on the holding provider.
    let live = rig.intent("live");
    let live = onejob::domain::NewJob {
        providers: vec![ProviderName::parse("fallback").unwrap()],
        ..live
    };
    let live = rig.engine.create_job(live).await.unwrap().job().clone();
    let message = rig.next_message();
    let running = rig.process_in_background(&message);
    holding.received(1).await;
    for actor in [owner.clone(), Actor::Operator("ops".into())] {
        let refused = rig.engine.add_attempt(&actor, &failed.id, None, None).await;
        assert!(
            matches!(limit_of(refused), LimitReached::LiveJobs { limit: 1, .. }),
            "{actor:?}"
        );
        assert_eq!(rig.job(&failed).await.attempts.len(), 1, "nothing written");
    }
    // Another owner is not held by alice's live job.
    let bob = onejob::domain::NewJob {
        owner: onejob::domain::Owner::parse("bob").unwrap(),
        ..rig.intent("bob")
    };
    assert!(matches!(
        rig.engine.create_job(bob).await.unwrap(),
        onejob::store::CreateOutcome::Created(_)
    ));
    rig.next_message();
    // The live job ends: its place is free, and the manual attempt is admitted.
    gate.open(summary("done"));
    assert_eq!(running.await.unwrap(), Processed::Succeeded);
    assert_eq!(rig.job(&live).await.status(), JobStatus::Succeeded);
    let key = onejob::domain::IdempotencyKey::parse("retry-failed").unwrap();
    let added = rig
        .engine
        .add_attempt(&owner, &failed.id, None, Some(&key))
        .await;
    assert_eq!(added.unwrap().number, 2);
    // And now that job is the owner's one live job.
    let refused = rig.engine.create_job(rig.intent("third")).await;
    assert!(matches!(limit_of(refused), LimitReached::LiveJobs { .. }));
    // Its attempt fails; another job takes the one place. The manual attempt's request sent again is its replay,
    // whatever the limits say now: never refused.
    let message = rig.next_message();
    assert_eq!(rig.process(&message).await, Processed::Failed);
    rig.engine.create_job(rig.intent("third")).await.unwrap();
    let again = rig
        .engine
        .add_attempt(&owner, &failed.id, None, Some(&key))
        .await;
    let again = again.expect("a replay is never refused");
    assert_eq!((again.number, again.replayed), (2, true));
    assert_eq!(rig.job(&failed).await.attempts.len(), 2);
}

/// The worst case of one call of `rig`'s intents (they share a contract, an input and a chain).
fn worst_case(rig: &Rig) -> u64 {
    let intent = rig.intent("worst");
    (rig.engine)
        .bound(&intent.contract, &intent.input, &intent.providers)
        .tokens
}

/// Once the owner's budget has no room for another call's worst case, no paid call is ordered for it: a create and
/// a manual attempt are refused (429 `budget_exceeded`), and a failover stops with `budget_exceeded` — the fallback
/// is never called. The budget has room for one worst case and a token: the primary's answer breaks the contract,
/// and what it used leaves too little room for the failover's.
pub(crate) async fn a_spent_budget_stops_manual_attempts_and_failover(store: Arc<dyn JobStore>) {
    let broken = StandIn::spawn(vec![], Reply::Answer(json!({"wrong": true}))).await;
    let fallback = StandIn::answering(summary("B")).await;
    let probe = Rig::configured(
        store.clone(),
        openai(broken.base_url()),
        openai(fallback.base_url()),
        |_| {},
    );
    let worst = worst_case(&probe);
    let mut rig = Rig::configured(
        store,
        openai(broken.base_url()),
        openai(fallback.base_url()),
        |config| {
            config.limits = everyone(OwnerLimits {
                budget: Some(Budget {
                    period: Period::Day,
                    tokens: Some(worst + 1),
                    cost: None,
                }),
                ..OwnerLimits::default()
            })
        },
    );
    record_qualified(&rig.engine, rig.store.as_ref(), "fallback").await;
    let (stopped, first) = rig.create("stopped").await;
    // The first job's worst case holds the budget: another create does not fit while it runs.
    let refused = rig.engine.create_job(rig.intent("beside")).await;
    assert!(matches!(limit_of(refused), LimitReached::Budget { .. }));
    // The primary's answer breaks the contract, and was paid for. Failover queues the fallback's attempt, whose
    // worker settles the first call before it reserves its own: what the first used leaves too little room, and
    // the fallback is not called.
    assert_eq!(rig.process(&first).await, Processed::Failed);
    let second = rig.next_message();
    assert_eq!(rig.process(&second).await, Processed::Failed);
    let after = rig.job(&stopped).await;
    assert_eq!(after.status(), JobStatus::Failed);
    assert_eq!(after.error.unwrap().code, "budget_exceeded");
    assert_eq!(after.attempts.len(), 2);
    assert!(rig.no_message());
    assert_eq!(fallback.call_count(), 0);
    let owner = Actor::Owner(stopped.owner.clone());
    for provider in [None, Some(ProviderName::parse("fallback").unwrap())] {
        let refused = rig
            .engine
            .add_attempt(&owner, &stopped.id, provider, None)
            .await;
        assert!(matches!(limit_of(refused), LimitReached::Budget { .. }));
    }
    let refused = rig.engine.create_job(rig.intent("third")).await;
    assert!(matches!(limit_of(refused), LimitReached::Budget { .. }));
    // The next day, the budget admits again.
    rig.advance(86_400_000);
    let added = rig
        .engine
        .add_attempt(&owner, &stopped.id, None, None)
        .await;
    assert!(added.unwrap().number >= 2);
}

/// A budget whose period moves from a day to a month (the config changed) is held that very month: the spend is
/// counted in the day and in the month alike, one period rule on every store.
pub(crate) async fn a_budget_moved_from_day_to_month_is_held_that_month(store: Arc<dyn JobStore>) {
    let answering = StandIn::answering(summary("A")).await;
    let fallback = StandIn::answering(summary("B")).await;
    let probe = Rig::configured(
        store.clone(),
        openai(answering.base_url()),
        openai(fallback.base_url()),
        |_| {},
    );
    // Room for one call's worst case and a token: what one call used leaves too little for another.
    let worst = worst_case(&probe);
    let budget = |period| OwnerLimits {
        budget: Some(Budget {
            period,
            tokens: Some(worst + 1),
            cost: None,
        }),
        ..OwnerLimits::default()
    };
    let mut daily = Rig::configured(
        store.clone(),
        openai(answering.base_url()),
        openai(fallback.base_url()),
        |config| config.limits = everyone(budget(Period::Day)),
    );
    let monthly = Rig::configured(
        store,
        openai(answering.base_url()),
        openai(fallback.base_url()),
        |config| config.limits = everyone(budget(Period::Month)),
    );
    // The rigs' clocks start on 30 November: the spend falls on 2 December.
    const DAY: u64 = 86_400_000;
    daily.advance(2 * DAY);
    monthly.advance(2 * DAY);
    let (_, message) = daily.create("day").await;
    assert_eq!(daily.process(&message).await, Processed::Succeeded);
    // The next day, a day's budget admits again; a month's, on the same store, does not.
    daily.advance(DAY);
    monthly.advance(DAY);
    assert!(
        daily
            .engine
            .create_job(daily.intent("next-day"))
            .await
            .is_ok()
    );
    let refused = monthly
        .engine
        .create_job(monthly.intent("next-day-monthly"))
        .await;
    assert!(matches!(
        limit_of(refused),
        LimitReached::Budget {
            period: Period::Month,
            ..
        }
    ));
}

/// Creates of one owner, `n` of them, each with its own key, at a few a second of the rig's clock, under one limit
/// kind at a time (a budget alone, creates a minute, live jobs), its jobs ending as they go: the owner's ledger stays
/// as small as its limits, whatever its history — every create is admitted, and the store keeps at most what the
/// limit bounds.
pub(crate) async fn a_long_lived_owners_ledger_stays_bounded(store: Arc<dyn JobStore>, n: usize) {
    let n = std::env::var("ONEJOB_LONG_OWNER")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(n);
    let answering = StandIn::answering(summary("A")).await;
    let kinds = [
        (
            "budget",
            OwnerLimits {
                budget: Some(Budget {
                    period: Period::Month,
                    tokens: Some(u64::MAX),
                    cost: None,
                }),
                ..OwnerLimits::default()
            },
        ),
        (
            "rate",
            OwnerLimits {
                creates_per_minute: Some(1_000),
                ..OwnerLimits::default()
            },
        ),
        (
            "live",
            OwnerLimits {
                live_jobs: Some(8),
                ..OwnerLimits::default()
            },
        ),
    ];
    for (name, limits) in kinds {
        let mut rig = Rig::configured(
            store.clone(),
            openai(answering.base_url()),
            openai(answering.base_url()),
            |config| config.limits = everyone(limits),
        );
        let owner = onejob::domain::Owner::parse(&format!("long-{name}")).unwrap();
        let mut largest = 0;
        for i in 0..n {
            let new = onejob::domain::NewJob {
                owner: owner.clone(),
                ..rig.intent(&format!("{name}-{i}"))
            };
            let created = rig.engine.create_job(new).await;
            assert!(created.is_ok(), "{name} {i}: {created:?}");
            // Under a budget, the jobs are worked as they go: each call's reservation is settled at its end.
            if limits.budget.is_some() {
                let message = rig.next_message();
                assert_eq!(rig.process(&message).await, Processed::Succeeded);
            }
            // The live jobs end as they go (a cancel frees its place at once).
            if limits.live_jobs.is_some() {
                let job = created.unwrap().job().clone();
                let actor = Actor::Owner(owner.clone());
                rig.engine.cancel_job(&actor, &job.id, None).await.unwrap();
            }
            while !rig.no_message() {}
            // At least a minute and a half in all: places past their minute go, and are seen to.
            let step = (90_000 / n as u64).max(100);
            rig.advance(step);
            let ledger = rig.store.owner_ledger(&owner).await.unwrap();
            largest = largest.max(serde_json::to_string(&ledger).unwrap().len());
            // Live jobs hold at most their limit; else a create holds a place while it is written (a minute, where
            // a store needs it to know its replay): at most the last minute's creates.
            let bound = match limits.live_jobs {
                Some(n) => n as usize,
                None => {
                    (onejob::domain::OwnerLedger::CREATE_HELD.num_milliseconds() as u64 / step)
                        as usize
                        + 1
                }
            };
            assert!(
                ledger.places.len() <= bound,
                "{name} {i}: {}",
                ledger.places.len()
            );
        }
        // A few dozen bytes a place, at most the limit's: under 60 KB for 1,000 creates a minute, whatever n is.
        assert!(largest < 60_000, "{name}: {largest} bytes");
        println!("{name}: {n} creates, the ledger at most {largest} bytes");
    }
}

/// One owner's endpoint that never answers in time, with a backlog longer than a sweep's batch, never delays
/// another owner's event: each owner is listed its fair share of the batch, a few of one endpoint's tries run at
/// once, and a failing endpoint starts no more tries in that batch. The other owner's event goes out in the first
/// batch; the failing endpoint is tried no more than its share at once.
pub(crate) async fn one_owners_slow_endpoint_never_delays_another_owners_events(
    store: Arc<dyn JobStore>,
) {
    let TwoEndpoints {
        rig,
        alice,
        bob,
        alices,
        bobs,
        ..
    } = TwoEndpoints::with_bobs_held(store, 200, Gate::new()).await;
    for i in 0..50 {
        settle(&rig, &bob, &format!("bob-{i}")).await;
    }
    settle(&rig, &alice, "alice-1").await;
    let batch = rig.engine.deliver_batch().await.unwrap();
    assert_eq!(
        alices.call_count(),
        1,
        "alice's event went out in the first batch"
    );
    assert_eq!(batch.counted, 1);
    assert!(
        bobs.call_count() <= onejob::domain::event::ENDPOINT_IN_FLIGHT,
        "bob's endpoint was tried {} times at once",
        bobs.call_count()
    );
    assert!(batch.listed <= 20, "{batch:?}");
}

/// One owner's endpoint that holds every try (slow, within its timeout) holds up its own tries only: a batch that
/// comes while they are in flight delivers another owner's new event at once and starts none of the held
/// endpoint's — the process has at most [`ENDPOINT_IN_FLIGHT`](onejob::domain::event::ENDPOINT_IN_FLIGHT) of one
/// endpoint's tries in flight, whichever batch started them.
pub(crate) async fn a_slow_endpoints_tries_hold_up_no_other_batch(store: Arc<dyn JobStore>) {
    let in_flight = onejob::domain::event::ENDPOINT_IN_FLIGHT;
    let gate = Gate::new();
    let TwoEndpoints {
        rig,
        alice,
        bob,
        alices,
        bobs,
        ..
    } = TwoEndpoints::with_bobs_held(store, 60_000, gate.clone()).await;
    for i in 0..10 {
        settle(&rig, &bob, &format!("bob-{i}")).await;
    }
    let engine = rig.engine.clone();
    let first = tokio::spawn(async move { engine.deliver_batch().await });
    bobs.received(in_flight).await;

    settle(&rig, &alice, "alice-1").await;
    let second = rig.engine.deliver_batch().await.unwrap();
    assert_eq!(
        (second.counted, alices.call_count()),
        (1, 1),
        "alice's event went out while bob's tries were in flight: {second:?}"
    );
    assert_eq!(
        bobs.call_count(),
        in_flight,
        "the second batch started none of bob's tries"
    );
    assert!(!first.is_finished(), "bob's tries were still held");

    gate.open(json!({}));
    let first = first.await.unwrap().unwrap();
    assert!(first.counted >= in_flight, "{first:?}");
}

/// Two owners' endpoints on a rig that sweeps 20 events a batch: alice's answers at once, bob's holds every try
/// until its gate opens.
struct TwoEndpoints {
    rig: Rig,
    alice: onejob::domain::Owner,
    bob: onejob::domain::Owner,
    alices: StandIn,
    bobs: StandIn,
    /// The providers' stand-in (no attempt runs: the jobs are cancelled).
    _providers: StandIn,
}

impl TwoEndpoints {
    /// Each event's delivery times out after `event_timeout_ms`.
    async fn with_bobs_held(store: Arc<dyn JobStore>, event_timeout_ms: u64, gate: Gate) -> Self {
        let alices = StandIn::answering(summary("heard")).await;
        let bobs = StandIn::spawn(vec![], Reply::Held(gate)).await;
        let providers = StandIn::answering(summary("B")).await;
        let rig = Rig::configured(
            store,
            openai(providers.base_url()),
            openai(providers.base_url()),
            |config| {
                config.allow_private_endpoints = true;
                config.event_timeout_ms = event_timeout_ms;
            },
        )
        .sweeping(20);
        let alice = onejob::domain::Owner::parse("alice").unwrap();
        let bob = onejob::domain::Owner::parse("bob").unwrap();
        register(&rig, &alice, &alices).await;
        register(&rig, &bob, &bobs).await;
        Self {
            rig,
            alice,
            bob,
            alices,
            bobs,
            _providers: providers,
        }
    }
}

/// Registers `receiver` as `owner`'s endpoint.
async fn register(rig: &Rig, owner: &onejob::domain::Owner, receiver: &StandIn) {
    let url = format!("{}/chat/completions", receiver.base_url());
    let url = rig.engine.check_endpoint(&url).await.unwrap();
    rig.engine.put_endpoint(owner, url).await.unwrap();
}

/// A job of `owner`'s under `key`, cancelled at once: settled, its event due.
async fn settle(rig: &Rig, owner: &onejob::domain::Owner, key: &str) {
    let new = onejob::domain::NewJob {
        owner: owner.clone(),
        ..rig.intent(key)
    };
    let job = rig.engine.create_job(new).await.unwrap().job().clone();
    let actor = Actor::Owner(owner.clone());
    (rig.engine.cancel_job(&actor, &job.id, None).await).unwrap();
}

/// An operator's `Idempotency-Key`s are its own: an operator acting on an owner's job under a key the owner used on
/// that job acts (it is not the owner's request repeated, nor a conflict with it), and sent again acts once.
pub(crate) async fn an_operators_keys_are_its_own(store: Arc<dyn JobStore>) {
    let refusing = StandIn::spawn(vec![], Reply::Status(400, "no")).await;
    let mut rig = Rig::new(
        store,
        openai(refusing.base_url()),
        openai(refusing.base_url()),
    );
    let (job, message) = rig.create("shared-key").await;
    assert_eq!(rig.process(&message).await, Processed::Failed);
    let key = onejob::domain::IdempotencyKey::parse("retry-1").unwrap();
    let owner = Actor::Owner(job.owner.clone());
    let operator = Actor::Operator("ops-7".into());
    let fallback = || Some(ProviderName::parse("fallback").unwrap());
    let mine = rig
        .engine
        .add_attempt(&owner, &job.id, fallback(), Some(&key))
        .await
        .unwrap();
    assert_eq!((mine.number, mine.replayed), (2, false));
    let cancelled = rig
        .engine
        .cancel_attempt(&operator, &job.id, 2, Some(&key))
        .await;
    assert!(cancelled.is_ok(), "{cancelled:?}");
    let again = rig
        .engine
        .cancel_attempt(&operator, &job.id, 2, Some(&key))
        .await;
    assert!(again.is_ok(), "{again:?}");
    // The owner's own key still names the owner's request only.
    let replayed = rig
        .engine
        .add_attempt(&owner, &job.id, fallback(), Some(&key))
        .await
        .unwrap();
    assert_eq!((replayed.number, replayed.replayed), (2, true));
    let interventions = rig.job(&job).await.interventions;
    assert_eq!(interventions.len(), 1, "{interventions:?}");
}
