use super::*;
use crate::domain::fixtures;
use crate::domain::{CallReport, ErrorInfo, IdempotencyKey, JobId, NewJob};

const NONE: Bound = Bound {
    tokens: 0,
    nanos: 0,
};

fn at(ms: i64) -> Timestamp {
    Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
}

fn admitted(within: Within) -> Option<OwnerLedger> {
    match within {
        Within::Yes(after) => after,
        other => panic!("not admitted: {other:?}"),
    }
}

#[test]
fn an_intent_counts_once_however_often_its_create_is_written() {
    let limits = OwnerLimits {
        live_jobs: Some(1),
        creates_per_minute: Some(1),
        ..OwnerLimits::default()
    };
    let ledger = OwnerLedger::default();
    let after = admitted(ledger.admit_create("i1", &limits, at(0), Live::Places, NONE)).unwrap();
    // One create counted: the next is due a minute on.
    assert_eq!(after.rate_tat_us, at(60_000).timestamp_micros());
    // The same intent again (another process, a lost answer's repeat): admitted, nothing to write.
    assert_eq!(
        after.admit_create("i1", &limits, at(5), Live::Places, NONE),
        Within::Yes(None)
    );
    // Another intent: beyond both limits.
    assert!(matches!(
        after.admit_create("i2", &limits, at(5), Live::Places, NONE),
        Within::Beyond(LimitReached::LiveJobs { limit: 1, .. })
    ));
    // A store that counts the live jobs in its write keeps no places: the count decides.
    let counted =
        admitted(ledger.admit_create("i1", &limits, at(0), Live::Counted(0), NONE)).unwrap();
    assert!(counted.places.is_empty());
    assert!(matches!(
        counted.admit_create("i2", &limits, at(61_000), Live::Counted(1), NONE),
        Within::Beyond(LimitReached::LiveJobs { .. })
    ));
    let next_minute =
        admitted(counted.admit_create("i2", &limits, at(61_000), Live::Counted(0), NONE));
    assert_eq!(
        next_minute.unwrap().rate_tat_us,
        at(121_000).timestamp_micros()
    );
}

#[test]
fn at_the_live_limit_only_places_not_known_to_hold_are_checked() {
    let limits = OwnerLimits {
        live_jobs: Some(2),
        ..OwnerLimits::default()
    };
    let mut ledger = OwnerLedger::default();
    for (i, ms) in [("a", 0), ("b", 50_000)] {
        ledger = admitted(ledger.admit_create(i, &limits, at(ms), Live::Places, NONE)).unwrap();
    }
    // Both known to hold for less than a minute: refused without reading a job.
    assert!(matches!(
        ledger.admit_create("c", &limits, at(55_000), Live::Places, NONE),
        Within::Beyond(_)
    ));
    // A minute on, the older is checked; it holds no more, and its place goes to the new intent.
    assert_eq!(
        ledger.admit_create("c", &limits, at(61_000), Live::Places, NONE),
        Within::Check(vec!["a".into()])
    );
    let checked = ledger.checked(&["a".into()], &BTreeMap::new(), at(61_000));
    let after =
        admitted(checked.admit_create("c", &limits, at(61_000), Live::Places, NONE)).unwrap();
    assert_eq!(after.places.keys().collect::<Vec<_>>(), ["b", "c"]);
    // A place that holds is known to hold from the check on: not read again for a minute.
    let held = ledger.checked(
        &["a".into()],
        &[("a".to_owned(), job_of("a"))].into(),
        at(61_000),
    );
    assert!(matches!(
        held.admit_create("c", &limits, at(62_000), Live::Places, NONE),
        Within::Beyond(_)
    ));
}

#[test]
fn places_are_bounded_by_the_limits_not_by_history() {
    let rate = OwnerLimits {
        creates_per_minute: Some(1_000),
        ..OwnerLimits::default()
    };
    let budget_only = OwnerLimits {
        budget: Some(Budget {
            period: Period::Day,
            tokens: Some(1_000_000),
            cost: None,
        }),
        ..OwnerLimits::default()
    };
    let (mut by_rate, mut by_budget) = (OwnerLedger::default(), OwnerLedger::default());
    for n in 0..10_000i64 {
        let intent = format!("i{n}");
        if let Some(after) =
            admitted(by_rate.admit_create(&intent, &rate, at(n * 100), Live::Places, NONE))
        {
            by_rate = after;
        }
        if let Some(after) =
            admitted(by_budget.admit_create(&intent, &budget_only, at(n * 100), Live::Places, NONE))
        {
            by_budget = after;
        }
        assert!(by_rate.places.len() <= 2 * 1_000);
        assert!(by_budget.places.len() <= 601, "{}", by_budget.places.len());
    }
    assert!(by_rate.places.len() <= 601, "{}", by_rate.places.len());
    // A budget alone keeps each create's place only while its create may be written (a minute), so that another
    // process's create of the same intent is its replay: the last minute's creates, never the owner's history.
    assert!(by_budget.places.len() <= 601, "{}", by_budget.places.len());
    assert!(by_budget.places.contains_key("i9999"));
    // Calls reserved and not settled hold their places, as many as the budget's worst cases fit: no more.
    let worst = Bound {
        tokens: 500,
        nanos: 0,
    };
    let mut reserving = OwnerLedger::default();
    for n in 0..3_000i64 {
        let at_n = at(n * 100);
        match reserving.admit_create(&format!("i{n}"), &budget_only, at_n, Live::Places, worst) {
            Within::Yes(after) => reserving = after.unwrap(),
            Within::Check(_) | Within::Beyond(_) => assert!(n >= 2_000, "refused at {n}"),
        }
    }
    assert_eq!(reserving.places.len(), 2_000);
}

/// The intent of alice's key `key`.
fn intent(key: &str) -> String {
    JobId::intent_of(&fixtures::job().owner, &IdempotencyKey::parse(key).unwrap())
}

/// A job of alice's under `key`, queued.
fn job_of(key: &str) -> Job {
    let job = fixtures::job();
    let new = NewJob {
        owner: job.owner,
        idempotency_key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: job.fingerprint,
        contract: job.contract,
        input: job.input,
        providers: job.providers,
    };
    Job::new(new, chrono::Duration::days(30), &fixtures::by(0))
}

/// A job under `key` ended: its attempt 1 failed, the provider refusing it (no work done).
fn ended(key: &str) -> Job {
    let mut job = job_of(key);
    let report = CallReport::default();
    let gone = ErrorInfo::new("provider_refused", "no");
    job.claim(1, at(10_000), &fixtures::by(1)).unwrap();
    job.fail(1, gone, report, &fixtures::nowhere(), &fixtures::by(2))
        .unwrap();
    job
}

#[test]
fn an_ended_job_frees_its_place_unless_taken_again_after_the_end() {
    let limits = OwnerLimits {
        live_jobs: Some(1),
        ..OwnerLimits::default()
    };
    let ledger = admitted(OwnerLedger::default().admit_create(
        &intent("a"),
        &limits,
        at(0),
        Live::Places,
        NONE,
    ))
    .unwrap();
    let job = ended("a");
    assert!(ledger.settle(&job, at(3)).unwrap().places.is_empty());
    // A manual attempt (2) took the place again after the job ended: that end's late settle leaves it.
    let again =
        admitted(ledger.admit_attempt(&job, 2, &limits, at(20), Live::Places, NONE)).unwrap();
    assert_eq!(again.settle(&job, at(21)), None);
    assert_eq!(ledger.settle(&ended("b"), at(3)), None);
}

/// A token budget of `tokens` a day.
fn tokens_a_day(tokens: u64) -> OwnerLimits {
    OwnerLimits {
        budget: Some(Budget {
            period: Period::Day,
            tokens: Some(tokens),
            cost: None,
        }),
        ..OwnerLimits::default()
    }
}

#[test]
fn a_budget_admits_what_its_worst_cases_fit_and_settles_each_call_once() {
    let limits = tokens_a_day(1_100);
    let worst = Bound {
        tokens: 300,
        nanos: 0,
    };
    let mut ledger = OwnerLedger::default();
    for i in 0..3 {
        ledger = admitted(ledger.admit_create(
            &intent(&format!("i{i}")),
            &limits,
            at(0),
            Live::Places,
            worst,
        ))
        .unwrap();
    }
    assert_eq!(ledger.reserved().tokens, 900);
    // A fourth worst case would pass the budget: refused for a moment (reservations settle), nothing spent yet.
    match ledger.admit_create(&intent("i3"), &limits, at(1), Live::Places, worst) {
        Within::Beyond(LimitReached::Budget { retry_after, .. }) => {
            assert_eq!(retry_after, LIVE_RETRY);
        }
        other => panic!("admitted past the budget: {other:?}"),
    }
    // i0's call ends with its usage: settled at 120 tokens, once however often its end is written.
    let mut job = job_of("i0");
    job.claim(1, at(10_000), &fixtures::by(1)).unwrap();
    let report = CallReport {
        input_tokens: Some(100),
        output_tokens: Some(20),
        ..CallReport::default()
    };
    (job.complete(1, serde_json::json!({}), report, &fixtures::by(2))).unwrap();
    let settled = ledger.settle(&job, at(2)).unwrap();
    assert_eq!((settled.day.tokens, settled.reserved().tokens), (120, 600));
    assert!(!settled.places.contains_key(&intent("i0")));
    assert_eq!(settled.settle(&job, at(3)), None);
    // The room it left admits the fourth.
    assert!(
        admitted(settled.admit_create(&intent("i3"), &limits, at(3), Live::Places, worst))
            .is_some()
    );
    // A call that may have been paid with no usage known (cleared as a time-out) settles at its worst case; one
    // that did no work, at nothing.
    let mut timed_out = job_of("i1");
    timed_out.claim(1, at(10_000), &fixtures::by(1)).unwrap();
    timed_out.cancel(&fixtures::by(2)).unwrap();
    let after = settled.settle(&timed_out, at(4)).unwrap();
    assert_eq!((after.day.tokens, after.reserved().tokens), (420, 300));
    let refused = after.settle(&ended("i2"), at(5)).unwrap();
    assert_eq!((refused.day.tokens, refused.reserved().tokens), (420, 0));
}

#[test]
fn a_stale_reservation_is_checked_against_its_job_before_a_refusal() {
    let limits = tokens_a_day(1_000);
    let worst = Bound {
        tokens: 600,
        nanos: 0,
    };
    let ledger =
        admitted(OwnerLedger::default().admit_create("a", &limits, at(0), Live::Places, worst))
            .unwrap();
    // Known to be running for less than a minute: refused without a read.
    assert!(matches!(
        ledger.admit_create("b", &limits, at(30_000), Live::Places, worst),
        Within::Beyond(LimitReached::Budget { .. })
    ));
    // Then checked: a create whose job was never written made no call, and its reservation goes.
    assert_eq!(
        ledger.admit_create("b", &limits, at(61_000), Live::Places, worst),
        Within::Check(vec!["a".into()])
    );
    let checked = ledger.checked(&["a".into()], &BTreeMap::new(), at(61_000));
    assert!(
        admitted(checked.admit_create("b", &limits, at(61_000), Live::Places, worst)).is_some()
    );
}

#[test]
fn a_worker_reserves_each_later_call_and_settles_the_one_before() {
    let limits = tokens_a_day(1_000);
    let worst = Bound {
        tokens: 400,
        nanos: 0,
    };
    let mut job = ended("a");
    let ledger = admitted(OwnerLedger::default().admit_create(
        &intent("a"),
        &limits,
        at(0),
        Live::Places,
        worst,
    ))
    .unwrap();
    // Attempt 1 is reserved already: nothing to write.
    assert_eq!(
        ledger.reserve(&job, 1, &limits, at(1), worst),
        Within::Yes(None)
    );
    // Attempt 2 (a failover): attempt 1 settled from the record (refused: no work), attempt 2 reserved.
    job.add_attempt(
        Some(fixtures::provider("b")),
        &fixtures::to(&["b"]),
        &fixtures::by(3),
    )
    .unwrap();
    let after = admitted(ledger.reserve(&job, 2, &limits, at(4), worst)).unwrap();
    assert_eq!((after.day.tokens, after.reserved().tokens), (0, 400));
    assert_eq!(after.places[&intent("a")].reserved_for, 2);
    // Beyond the budget, refused until the period ends when the spend alone leaves no room.
    let spent = after.spend(&Spend {
        at: at(4),
        tokens: 700,
        nanos: 0,
    });
    let mut third = job.clone();
    third.attempts.push(third.attempts[1].clone());
    third.attempts[2].number = 3;
    match spent.reserve(&third, 3, &limits, at(5), worst) {
        Within::Beyond(LimitReached::Budget { retry_after, .. }) => {
            assert!(retry_after > LIVE_RETRY)
        }
        other => panic!("reserved past the budget: {other:?}"),
    }
}

#[test]
fn a_budget_moved_from_day_to_month_counts_from_its_period_start() {
    let month = OwnerLimits {
        budget: Some(Budget {
            period: Period::Month,
            tokens: Some(100),
            cost: None,
        }),
        ..OwnerLimits::default()
    };
    // 2027-01-15: spend counted in the day and the month, whichever the budget names.
    let mut ledger = OwnerLedger::default();
    for day in 0..3 {
        let spend = Spend {
            at: at(day * 86_400_000),
            tokens: 40,
            nanos: 0,
        };
        ledger = ledger.spend(&spend);
    }
    assert_eq!((ledger.day.tokens, ledger.month.tokens), (40, 120));
    assert!(month.fits(&ledger, at(3 * 86_400_000), NONE).is_some());
    // A ledger of the one counter ledgers kept before reads as the kind its period names.
    let old: OwnerLedger = serde_json::from_value(serde_json::json!({
        "window_ms": 0, "window_creates": 0, "period": "2027-01-15", "spent_tokens": 7, "spent_nanos": 0
    }))
    .unwrap();
    assert_eq!((old.day.period.as_str(), old.day.tokens), ("2027-01-15", 7));
    assert!(old.month.period.is_empty());
    // A writer behind the clock adds to no later period.
    let behind = ledger.spend(&Spend {
        at: at(-40 * 86_400_000),
        tokens: 1,
        nanos: 0,
    });
    assert_eq!(behind, ledger);
}

#[test]
fn a_spent_budget_admits_neither_a_create_nor_a_manual_attempt() {
    let limits = OwnerLimits {
        budget: Some(Budget {
            period: Period::Day,
            tokens: Some(10),
            cost: None,
        }),
        ..OwnerLimits::default()
    };
    let spent = OwnerLedger::default().spend(&Spend {
        at: at(0),
        tokens: 10,
        nanos: 0,
    });
    let one = Bound {
        tokens: 1,
        nanos: 0,
    };
    assert!(matches!(
        spent.admit_create("a", &limits, at(1), Live::Places, one),
        Within::Beyond(LimitReached::Budget { .. })
    ));
    let job = ended("a");
    assert!(matches!(
        spent.admit_attempt(&job, 2, &limits, at(1), Live::Places, one),
        Within::Beyond(LimitReached::Budget { .. })
    ));
    assert!(
        admitted(spent.admit_attempt(&job, 2, &limits, at(86_400_000), Live::Places, one))
            .is_some()
    );
}

#[test]
fn creates_are_spread_over_the_minute_with_no_window_edge_to_pass_twice() {
    let limits = OwnerLimits {
        creates_per_minute: Some(4),
        ..OwnerLimits::default()
    };
    let create = |ledger: &OwnerLedger, i: usize, ms: i64| {
        ledger.admit_create(&format!("i{i}"), &limits, at(ms), Live::Places, NONE)
    };
    // A minute's worth at once, just before a clock minute ends (at(0) starts one)...
    let mut ledger = OwnerLedger::default();
    for i in 0..4 {
        ledger = admitted(create(&ledger, i, 59_900)).unwrap();
    }
    // ...and none more just after it: a window would have let four more through.
    match create(&ledger, 4, 60_100) {
        Within::Beyond(LimitReached::CreateRate {
            limit: 4,
            retry_after,
        }) => {
            // One interval (15 s) after the burst, less the 0.2 s gone.
            assert_eq!(retry_after, Duration::milliseconds(14_800));
        }
        other => panic!("admitted past the rate: {other:?}"),
    }
    // Then one each interval, not four at the next minute.
    let ledger = admitted(create(&ledger, 4, 74_900)).unwrap();
    assert!(matches!(
        create(&ledger, 5, 75_000),
        Within::Beyond(LimitReached::CreateRate { .. })
    ));
    assert!(admitted(create(&ledger, 5, 89_900)).is_some());
    // A quiet owner earns no more than a minute's burst.
    let rested = admitted(create(&ledger, 6, 3_600_000)).unwrap();
    let mut later = rested;
    for i in 7..10 {
        later = admitted(create(&later, i, 3_600_000)).unwrap();
    }
    assert!(matches!(
        create(&later, 10, 3_600_000),
        Within::Beyond(LimitReached::CreateRate { .. })
    ));
}

#[test]
fn tokens_a_minute_weigh_each_create_by_its_worst_case() {
    let limits = OwnerLimits {
        tokens_per_minute: Some(1_000),
        ..OwnerLimits::default()
    };
    let worst = |tokens| Bound { tokens, nanos: 0 };
    let create = |ledger: &OwnerLedger, i: usize, ms: i64, tokens| {
        ledger.admit_create(
            &format!("i{i}"),
            &limits,
            at(ms),
            Live::Places,
            worst(tokens),
        )
    };
    let ledger = admitted(create(&OwnerLedger::default(), 0, 0, 600)).unwrap();
    // 400 more fit the minute; 500 do not, until 6 s (100 tokens' time) have passed.
    assert!(admitted(create(&ledger, 1, 0, 400)).is_some());
    match create(&ledger, 1, 0, 500) {
        Within::Beyond(LimitReached::TokenRate { retry_after, .. }) => {
            assert_eq!(retry_after, Duration::seconds(6));
        }
        other => panic!("admitted past the rate: {other:?}"),
    }
    assert!(admitted(create(&ledger, 1, 6_000, 500)).is_some());
    // A job of more than a minute's tokens waits for an empty bucket, then goes alone.
    assert!(matches!(
        create(&ledger, 2, 1_000, 5_000),
        Within::Beyond(_)
    ));
    let big = admitted(create(&ledger, 2, 36_000, 5_000)).unwrap();
    assert!(matches!(create(&big, 3, 60_000, 1), Within::Beyond(_)));
}
