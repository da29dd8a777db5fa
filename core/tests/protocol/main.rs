//! The protocol, model-checked: every order in which two clients, the API, the store, the queue, two workers, the
//! sweeper, the reconcilers, the providers, the deliverer, a person and the clock can act, with faults injected at
//! each, explored breadth first to a bound by [stateright](https://docs.rs/stateright), each step calling the
//! domain's own transitions — the ones every store applies inside its atomic write. Two halves meet at the stored
//! job and its first message ([`model::Scenario`]). docs/model.md says what is modelled and what is not, and how to
//! run deeper.
//!
//! - `the_protocol_holds`: the bounds that `cargo test` checks (printing the states explored).
//! - `each_broken_variant_is_caught`: for each [`bugs::Bug`], the checker finds the property it breaks, and prints
//!   the shortest trace that shows it.
//! - `deeper` (ignored): larger fault budgets, as `ONEJOB_MODEL` says (`deep`, or `simulate` for random walks).

mod bugs;
mod fairness;
mod model;
mod owners;
mod properties;
mod providers;
mod slots;
mod steps;
mod world;

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

use bugs::Bug;
use model::{Protocol, Scenario};
use world::{Clears, Faults, World};

/// The intake `cargo test` checks: two clients under one key (`agree`: a double click; else another payload), a
/// store write that fails or loses its answer, an answer lost on the way, a first message the queue does not take.
fn intake(agree: bool) -> Protocol {
    Protocol {
        scenario: Scenario::Intake,
        agree,
        faults: Faults {
            store: 1,
            lost_answers: 1,
            lost_sends: 1,
            ..Faults::NONE
        },
        max_clock: 12,
        max_depth: None,
        reconcilers: 0,
        clears: [Clears::Hold; 3],
        bug: None,
    }
}

/// The attempts `cargo test` checks: one of each of their faults, runs of up to 14 steps.
fn attempts() -> Protocol {
    Protocol {
        scenario: Scenario::Attempts,
        agree: true,
        faults: Faults {
            store: 1,
            crashes: 1,
            duplicates: 1,
            lost_sends: 1,
            endpoint: 1,
            ..Faults::NONE
        },
        max_clock: 12,
        max_depth: Some(14),
        reconcilers: 0,
        clears: [Clears::Hold; 3],
        bug: None,
    }
}

/// The attempts without faults but a cancel, to longer runs: what providers, time-outs, people and the sweeper
/// do to a job alone.
fn calm() -> Protocol {
    Protocol {
        faults: Faults {
            cancels: 1,
            ..Faults::NONE
        },
        max_depth: Some(18),
        ..attempts()
    }
}

/// The reconciler `cargo test` checks: `a` can be asked about its calls, `b` has a policy; two reconcilers at
/// once (two lookups of one attempt in the queue, two clears), a store write that fails or loses its answer, a
/// person who cancels an attempt the reconciler would clear.
fn reconciler() -> Protocol {
    Protocol {
        faults: Faults {
            store: 1,
            resolves: 1,
            ..Faults::NONE
        },
        max_depth: Some(15),
        reconcilers: 2,
        clears: [Clears::Asked, Clears::Policy, Clears::Hold],
        ..attempts()
    }
}

/// One reconciler without faults, to longer runs: lookups that find the answer, or its absence once the call is
/// over, and the policy's clear of the fallback.
fn reconciler_calm() -> Protocol {
    Protocol {
        faults: Faults::NONE,
        max_depth: Some(21),
        reconcilers: 1,
        ..reconciler()
    }
}

/// A discovery as the steps that lead to it, one line each, with the job as each step left it.
fn explain(model: &Protocol, path: Path<World, model::Action>) -> String {
    let mut lines = Vec::new();
    for (state, action) in path.into_vec() {
        let job = state.job.as_ref().map_or_else(
            || "no job".to_owned(),
            |job| {
                let attempts: Vec<String> = (job.attempts.iter())
                    .map(|a| format!("{}{}:{}", a.provider, a.number, a.state.as_str()))
                    .collect();
                format!("{} [{}]", job.status().as_str(), attempts.join(" "))
            },
        );
        let step = action.map_or_else(|| "(end)".to_owned(), |a| model.format_action(&a));
        lines.push(format!("  t={:<2} {job:<48} then {step}", state.now));
    }
    lines.join("\n")
}

/// Checks `model` breadth first, stopping once any of `until` is found (`None`: explore it all); prints what it
/// explored and how long it took.
fn check(
    name: &str,
    model: Protocol,
    until: Option<&'static str>,
) -> impl Checker<Protocol> + use<> {
    let started = Instant::now();
    let depth = model.max_depth;
    let mut builder = model
        .checker()
        .threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
    if let Some(depth) = depth {
        builder = builder.target_max_depth(depth);
    }
    if let Some(property) = until {
        builder = builder.finish_when(HasDiscoveries::AnyOf([property].into()));
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

/// Fails with the trace of every property the checker found broken.
fn assert_holds(model: &Protocol, checker: &impl Checker<Protocol>) {
    let mut broken = Vec::new();
    for (name, path) in checker.discoveries() {
        if properties::musts().contains(name) {
            broken.push(format!("{name}:\n{}", explain(model, path)));
        }
    }
    assert!(broken.is_empty(), "broken:\n{}", broken.join("\n\n"));
    let never: Vec<_> = (properties::sometimes(model).into_iter())
        .filter(|property| checker.discovery(property).is_none())
        .collect();
    assert!(never.is_empty(), "never reached: {never:?}");
}

#[test]
fn the_protocol_holds() {
    for (name, model) in [
        ("intake, a double click", intake(true)),
        ("intake, another payload", intake(false)),
        ("attempts, with faults", attempts()),
        ("attempts, calm", calm()),
        ("reconciler, races", reconciler()),
        ("reconciler, calm", reconciler_calm()),
    ] {
        let checker = check(name, model.clone(), None);
        assert_holds(&model, &checker);
    }
}

/// Which property each broken variant must break, and the model it shows in.
fn caught_by(bug: Bug) -> (&'static str, Protocol) {
    use properties::*;
    let model = match bug {
        Bug::UnconditionalCreate | Bug::RepeatWithoutToken | Bug::ReplayAnswersCreated => {
            intake(true)
        }
        Bug::ConflictAnswered => intake(false),
        Bug::SettleFromUpdatedAt => calm(),
        Bug::FoundWithoutSwap => Protocol {
            faults: Faults {
                resolves: 1,
                ..Faults::NONE
            },
            ..reconciler_calm()
        },
        Bug::ListensPastLease | Bug::UnarmedAfterReconciler => Protocol {
            faults: Faults {
                store: 1,
                ..Faults::NONE
            },
            ..reconciler_calm()
        },
        Bug::AbsenceTooEarly
        | Bug::BeforeLease
        | Bug::LookupCalls
        | Bug::FoundUnmarked
        | Bug::AskOnce => reconciler_calm(),
        _ => attempts(),
    };
    let property = match bug {
        Bug::UnconditionalCreate => ONE_JOB,
        Bug::RepeatWithoutToken => ANSWERED,
        Bug::ReplayAnswersCreated => ONE_201,
        Bug::ConflictAnswered => CONFLICT,
        Bug::UnknownFailsOver => ONE_LIVE,
        Bug::TimeoutFails => UNKNOWN,
        Bug::CompleteWithoutSwap => ONE_RESULT,
        Bug::ClaimWithoutToken => ONE_CALL,
        Bug::FailoverUnqualified => QUALIFIED,
        Bug::UnbiasedLateWindow => ANSWERS_KEPT,
        Bug::SettleFromUpdatedAt => ONE_EVENT,
        Bug::NoRedispatch => SETTLES,
        Bug::NoRearm => ANNOUNCED,
        Bug::AbsenceTooEarly => PAID_ONCE,
        Bug::FoundWithoutSwap => ONE_RESULT,
        Bug::BeforeLease => NOT_RACED,
        Bug::LookupCalls => ONE_CALL,
        Bug::FoundUnmarked => CLEARED_AS,
        Bug::AskOnce => CLEARS,
        Bug::ListensPastLease => PAID_ONCE,
        Bug::UnarmedAfterReconciler => ANNOUNCED,
    };
    (
        property,
        Protocol {
            bug: Some(bug),
            ..model
        },
    )
}

#[test]
fn each_broken_variant_is_caught() {
    for bug in Bug::ALL {
        let (property, model) = caught_by(bug);
        let checker = check(&format!("{bug:?}"), model.clone(), Some(property));
        let path = checker
            .discovery(property)
            .unwrap_or_else(|| panic!("{bug:?} was not caught by {property:?}"));
        println!("{bug:?} breaks {property:?}:\n{}", explain(&model, path));
    }
}

/// Checks `model` (of the shared state: owners' limits, call slots, fair deliveries) breadth first to its end, or
/// until `until` is found; prints what it explored.
fn check_shared<M>(name: &str, model: M, until: Option<&'static str>) -> impl Checker<M> + use<M>
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Clone + PartialEq + Send + Sync + 'static,
    M::Action: Clone + PartialEq + Send + Sync,
{
    let started = Instant::now();
    let mut builder = model
        .checker()
        .threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
    if let Some(property) = until {
        builder = builder.finish_when(HasDiscoveries::AnyOf([property].into()));
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

/// Fails naming each of `musts` the checker found broken (with the discovery's last state), and each of `reached`
/// it never reached.
fn assert_shared<M: Model>(
    checker: &impl Checker<M>,
    musts: &[&'static str],
    reached: &[&'static str],
) where
    M::State: std::fmt::Debug + Clone + PartialEq,
    M::Action: std::fmt::Debug + Clone + PartialEq,
{
    let broken: Vec<String> = (checker.discoveries().into_iter())
        .filter(|(name, _)| musts.contains(name))
        .map(|(name, path)| {
            format!(
                "{name}: {:?}\n  by {:?}",
                path.last_state().clone(),
                path.into_actions()
            )
        })
        .collect();
    assert!(broken.is_empty(), "broken:\n{}", broken.join("\n\n"));
    for property in reached {
        assert!(
            checker.discovery(property).is_some(),
            "never reached: {property}"
        );
    }
}

fn owners(limited: owners::Limited) -> owners::Owners {
    owners::Owners {
        limited,
        faults: 1,
        slow_puts: 1,
        max_clock: 3,
        bug: None,
    }
}

fn slots() -> slots::Slots {
    slots::Slots {
        duplicates: 1,
        crashes: 1,
        max_clock: 5,
        bug: None,
    }
}

fn providers() -> providers::Providers {
    providers::Providers {
        calls: 4,
        faults: 1,
        bug: None,
    }
}

fn fairness() -> fairness::Fairness {
    fairness::Fairness {
        max_clock: 8,
        bug: None,
    }
}

/// The state shared across owners and processes (invariants 15, 18, 21): an owner's limits through two api
/// processes (live jobs, budget, manual attempts and failover; creates a minute), a provider's call slots under
/// duplicates, a provider's breaker and evidence under two owners' calls and two writers, two owners' events through
/// one deliverer — each model to its end.
#[test]
fn the_shared_state_holds() {
    use owners::Limited;
    for limited in [
        Limited::Intake,
        Limited::Attempts,
        Limited::Budgeted,
        Limited::Rate,
    ] {
        let checker = check_shared(&format!("owners, {limited:?}"), owners(limited), None);
        let reached: &[&str] = match limited {
            Limited::Intake => &[owners::REACHED_REFUSED, owners::REACHED_REPLAY],
            Limited::Attempts => &[owners::REACHED_REFUSED],
            Limited::Budgeted => &[owners::REACHED_REFUSED],
            Limited::Rate => &[owners::REACHED_REPLAY],
        };
        assert_shared(&checker, &owners::musts(), reached);
    }
    let checker = check_shared("call slots", slots(), None);
    assert_shared(&checker, &[slots::IN_FLIGHT], &[slots::BOTH_CALLED]);
    let checker = check_shared("a provider's breaker and evidence", providers(), None);
    assert_shared(
        &checker,
        &[
            providers::OPENS_ON_HEALTH,
            providers::NOT_HELD_CLOSED,
            providers::STANDING,
        ],
        &[providers::OPENED, providers::SUSPECTED],
    );
    let checker = check_shared("deliveries, two owners", fairness(), None);
    assert_shared(
        &checker,
        &[
            fairness::FIRST_BATCH,
            fairness::NOT_BLOCKED,
            fairness::CAPPED,
            fairness::DELIVERED,
        ],
        &[fairness::BOB_TRIED, fairness::SIDE_BY_SIDE],
    );
}

/// Each broken variant of the shared state is caught by the property it breaks.
#[test]
fn each_broken_shared_variant_is_caught() {
    for bug in owners::Bug::ALL {
        let (property, limited) = owners::caught_by(bug);
        let model = owners::Owners {
            bug: Some(bug),
            ..owners(limited)
        };
        assert_caught(&format!("{bug:?}"), model, property);
    }
    let model = slots::Slots {
        bug: Some(slots::Bug::FreeOnRefusedClaim),
        ..slots()
    };
    assert_caught("FreeOnRefusedClaim", model, slots::IN_FLIGHT);
    for bug in providers::Bug::ALL {
        let model = providers::Providers {
            bug: Some(bug),
            ..providers()
        };
        assert_caught(&format!("{bug:?}"), model, providers::caught_by(bug));
    }
    for bug in fairness::Bug::ALL {
        let model = fairness::Fairness {
            bug: Some(bug),
            ..fairness()
        };
        assert_caught(&format!("{bug:?}"), model, fairness::caught_by(bug));
    }
}

/// Fails unless the checker finds `model` (a broken variant, `bug`) breaking `property`.
fn assert_caught<M>(bug: &str, model: M, property: &'static str)
where
    M: Model + Send + Sync + 'static,
    M::State: std::hash::Hash + Clone + PartialEq + Send + Sync + 'static,
    M::Action: Clone + PartialEq + Send + Sync,
{
    let checker = check_shared(bug, model, Some(property));
    let path = (checker.discovery(property))
        .unwrap_or_else(|| panic!("{bug} was not caught by {property:?}"));
    println!(
        "{bug} breaks {property:?} at depth {}",
        path.into_actions().len()
    );
}

/// Deeper bounds, and long random walks: `ONEJOB_MODEL=deep` (to `ONEJOB_MODEL_DEPTH` steps, 15 unless set) or
/// `ONEJOB_MODEL=simulate` (random runs to their end for ten minutes), with two store faults and a cancel more;
/// `ONEJOB_MODEL=reconciler`: the reconciler's races with a crash and a duplicate more (docs/model.md).
#[test]
#[ignore = "minutes to hours: run by hand (docs/model.md)"]
fn deeper() {
    let depth = std::env::var("ONEJOB_MODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(15);
    let deep = Protocol {
        faults: Faults {
            store: 2,
            cancels: 1,
            ..attempts().faults
        },
        max_clock: 16,
        max_depth: Some(depth),
        ..attempts()
    };
    if std::env::var("ONEJOB_MODEL").as_deref() == Ok("reconciler") {
        let deep = Protocol {
            faults: Faults {
                crashes: 1,
                duplicates: 1,
                ..reconciler().faults
            },
            max_depth: Some(depth),
            ..reconciler()
        };
        let checker = check("reconciler, deep", deep.clone(), None);
        return assert_holds(&deep, &checker);
    }
    if std::env::var("ONEJOB_MODEL").as_deref() != Ok("simulate") {
        let checker = check("deep", deep.clone(), None);
        return assert_holds(&deep, &checker);
    }
    let started = Instant::now();
    let walks = Protocol {
        max_depth: None,
        ..deep
    };
    let checker = walks
        .clone()
        .checker()
        .timeout(std::time::Duration::from_secs(600))
        .spawn_simulation(0, stateright::UniformChooser)
        .join();
    println!(
        "simulation: {} states, depth {}, in {:.1?}",
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    assert_holds(&walks, &checker);
}
