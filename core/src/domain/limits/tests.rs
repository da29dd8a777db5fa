use super::*;

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
        budget: None,
    };
    let ledger = OwnerLedger::default();
    let after = admitted(ledger.admit_create("i1", &limits, at(0), Live::Places)).unwrap();
    // One create counted: the next is due a minute on.
    assert_eq!(after.rate_tat_us, at(60_000).timestamp_micros());
    // The same intent again (another process, a lost answer's repeat): admitted, nothing to write.
    assert_eq!(
        after.admit_create("i1", &limits, at(5), Live::Places),
        Within::Yes(None)
    );
    // Another intent: beyond both limits.
    assert!(matches!(
        after.admit_create("i2", &limits, at(5), Live::Places),
        Within::Beyond(LimitReached::LiveJobs { limit: 1, .. })
    ));
    // A store that counts the live jobs in its write keeps no places: the count decides.
    let counted = admitted(ledger.admit_create("i1", &limits, at(0), Live::Counted(0))).unwrap();
    assert!(counted.places.is_empty());
    assert!(matches!(
        counted.admit_create("i2", &limits, at(61_000), Live::Counted(1)),
        Within::Beyond(LimitReached::LiveJobs { .. })
    ));
    let next_minute = admitted(counted.admit_create("i2", &limits, at(61_000), Live::Counted(0)));
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
        ledger = admitted(ledger.admit_create(i, &limits, at(ms), Live::Places)).unwrap();
    }
    // Both known to hold for less than a minute: refused without reading a job.
    assert!(matches!(
        ledger.admit_create("c", &limits, at(55_000), Live::Places),
        Within::Beyond(_)
    ));
    // A minute on, the older is checked; it holds no more, and its place goes to the new intent.
    assert_eq!(
        ledger.admit_create("c", &limits, at(61_000), Live::Places),
        Within::Check(vec!["a".into()])
    );
    let checked = ledger.checked(&["a".into()], &BTreeSet::new(), at(61_000));
    let after = admitted(checked.admit_create("c", &limits, at(61_000), Live::Places)).unwrap();
    assert_eq!(after.places.keys().collect::<Vec<_>>(), ["b", "c"]);
    // A place that holds is known to hold from the check on: not read again for a minute.
    let held = ledger.checked(&["a".into()], &["a".to_owned()].into(), at(61_000));
    assert!(matches!(
        held.admit_create("c", &limits, at(62_000), Live::Places),
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
            admitted(by_rate.admit_create(&intent, &rate, at(n * 100), Live::Places))
        {
            by_rate = after;
        }
        if let Some(after) =
            admitted(by_budget.admit_create(&intent, &budget_only, at(n * 100), Live::Places))
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
}

#[test]
fn a_released_place_is_free_unless_taken_again_after_the_job_ended() {
    let limits = OwnerLimits {
        live_jobs: Some(1),
        ..OwnerLimits::default()
    };
    let ledger =
        admitted(OwnerLedger::default().admit_create("a", &limits, at(0), Live::Places)).unwrap();
    assert!(ledger.released("a", 1).unwrap().places.is_empty());
    // A manual attempt (3) took the place again after the job ended at attempt 2: that end's late release
    // leaves it; the end of attempt 3 frees it.
    let again = admitted(ledger.admit_attempt("a", 3, &limits, at(20), Live::Places)).unwrap();
    assert_eq!(again.released("a", 2), None);
    assert!(again.released("a", 3).unwrap().places.is_empty());
    assert_eq!(ledger.released("b", 1), None);
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
    assert!(month.spent(&ledger, at(3 * 86_400_000)).is_some());
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
    assert!(matches!(
        spent.admit_create("a", &limits, at(1), Live::Places),
        Within::Beyond(LimitReached::Budget { .. })
    ));
    assert!(matches!(
        spent.admit_attempt("a", 2, &limits, at(1), Live::Places),
        Within::Beyond(LimitReached::Budget { .. })
    ));
    assert_eq!(
        spent.admit_attempt("a", 2, &limits, at(86_400_000), Live::Places),
        Within::Yes(None)
    );
}

#[test]
fn creates_are_spread_over_the_minute_with_no_window_edge_to_pass_twice() {
    let limits = OwnerLimits {
        creates_per_minute: Some(4),
        ..OwnerLimits::default()
    };
    let create = |ledger: &OwnerLedger, i: usize, ms: i64| {
        ledger.admit_create(&format!("i{i}"), &limits, at(ms), Live::Places)
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
