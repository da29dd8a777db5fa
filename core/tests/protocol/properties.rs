//! What must hold, each named by the invariant of docs/design.md it checks. Safety properties hold in every state;
//! liveness properties hold in every state where the run has ended — no actor can take a step — before the clock's
//! bound: every fault has a budget and time moves only towards what is due, so every run ends, and a run that ends
//! is one in which every actor that could act did (the fair schedules).

use std::collections::BTreeSet;

use onejob_core::domain::event::event_id;
use onejob_core::domain::{AttemptState, ClearedBy, Job, JobStatus};
use stateright::{Model, Property};

use crate::model::{Protocol, Scenario};
use crate::world::{Answer, Clears, TIMEOUT, World, at, failover, number};

pub(crate) const ONE_JOB: &str = "1: one job per (owner, key)";
pub(crate) const ONE_201: &str = "2: at most one 201 per key";
pub(crate) const CONFLICT: &str = "3: another payload under the key is a conflict";
pub(crate) const ONE_LIVE: &str = "4: at most one live attempt, and only the newest";
pub(crate) const UNKNOWN: &str = "5: not knowing is not failing";
pub(crate) const ONE_RESULT: &str = "6, 7: one result, never overwritten";
pub(crate) const ONE_CALL: &str = "8: one provider call per attempt, only after its claim";
pub(crate) const QUALIFIED: &str = "9: failover only to qualified providers";
pub(crate) const ANSWERS_KEPT: &str = "11, 16: every answer a worker took is written or logged";
pub(crate) const ONE_EVENT: &str = "14: one settle, one event id";
pub(crate) const SETTLES: &str = "12: every run ends with the job settled (liveness)";
pub(crate) const ANNOUNCED: &str = "14: every settle is delivered (liveness)";
pub(crate) const ANSWERED: &str = "2: every client is answered, one of them 201 (liveness)";
pub(crate) const PAID_ONCE: &str =
    "5, 8: a lookup is no call: a provider that can be asked is paid once per intent";
pub(crate) const NOT_RACED: &str =
    "5: the reconciler waits for the lease: no worker hears an attempt it moved";
pub(crate) const CLEARED_AS: &str = "5: every attempt that left unknown says how, as it happened";
pub(crate) const CLEARS: &str =
    "5: every unknown of a provider that can be asked, or has a policy, clears (liveness)";

// Reached at all: a model that never gets there checks nothing there.
pub(crate) const LATE_WIN: &str = "a late answer wins after the time-out";
pub(crate) const DISCARDED: &str = "a loser's answer is discarded";
pub(crate) const FAILED_OVER: &str = "failover runs the qualified fallback";
pub(crate) const REPLAYED: &str = "a conflict or a replay is answered";
pub(crate) const REDELIVERED: &str = "an event is delivered after a failed try";
pub(crate) const FOUND_WINS: &str = "an answer a lookup found wins";
pub(crate) const ABSENT_RETRIED: &str = "a call the provider has no record of is retried";
pub(crate) const POLICY_CLEARED: &str = "an unknown is cleared by policy";

/// Whether the run has ended here: nothing can happen any more, and the clock's bound did not cut it.
fn ended(model: &Protocol, w: &World) -> bool {
    let mut next = Vec::new();
    model.actions(w, &mut next);
    next.is_empty() && w.now < model.max_clock
}

/// Whether the run has ended with the job's work in the model: nobody works the job at intake.
fn worked(model: &Protocol, w: &World) -> bool {
    model.scenario == Scenario::Attempts && ended(model, w)
}

pub(crate) fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(ONE_JOB, |_, w: &World| w.ghost.jobs_made <= 1),
        Property::always(ONE_201, |_, w: &World| w.ghost.created <= 1),
        Property::always(CONFLICT, |_, w: &World| !w.ghost.answered_foreign),
        Property::always(ONE_LIVE, |_, w: &World| {
            w.job.as_ref().is_none_or(|job| {
                let live: Vec<_> = job.attempts.iter().filter(|a| a.state.is_live()).collect();
                live.len() <= 1 && live.iter().all(|a| a.number == job.attempts.len() as u32)
            })
        }),
        Property::always(UNKNOWN, |_, w: &World| {
            w.job.as_ref().is_none_or(|job| {
                (job.attempts.iter())
                    .filter(|a| a.state == AttemptState::Failed)
                    .all(|a| w.ghost.definite.contains(&(a.number as u8)))
            })
        }),
        Property::always(ONE_RESULT, |_, w: &World| {
            w.job.as_ref().is_none_or(|job| {
                let winners = (job.attempts.iter())
                    .filter(|a| a.state == AttemptState::Succeeded)
                    .count();
                let kept = match &w.ghost.winner {
                    Some((n, result)) => {
                        job.completed_by == Some(*n) && job.result.as_ref() == Some(result)
                    }
                    None => job.completed_by.is_none(),
                };
                winners <= 1 && kept
            })
        }),
        Property::always(ONE_CALL, |_, w: &World| {
            w.ghost.calls.iter().all(|c| *c <= 1) && !w.ghost.unclaimed_call
        }),
        Property::always(QUALIFIED, |_, w: &World| {
            let qualified = failover().qualified;
            w.job.as_ref().is_none_or(|job| {
                job.attempts.iter().skip(1).all(|a| {
                    let retry_of = a.retry_of.and_then(|n| job.attempt(n));
                    qualified.contains(&a.provider)
                        || retry_of.is_some_and(|r| r.provider == a.provider)
                })
            })
        }),
        Property::always(ANSWERS_KEPT, |_, w: &World| w.ghost.dropped.is_empty()),
        Property::always(ONE_EVENT, |_, w: &World| {
            w.ghost.sent.len() <= w.ghost.settles.len()
        }),
        Property::always(SETTLES, |model: &Protocol, w: &World| {
            !worked(model, w) || w.job.as_ref().is_some_and(|job| job.is_settled(at(w.now)))
        }),
        Property::always(ANNOUNCED, |model: &Protocol, w: &World| {
            !worked(model, w)
                || w.job.as_ref().is_some_and(|job| {
                    job.settles_at()
                        .is_some_and(|t| w.ghost.delivered.contains(&event_id(job, t)))
                })
        }),
        Property::always(PAID_ONCE, |model: &Protocol, w: &World| {
            w.job.as_ref().is_none_or(|job| {
                let asked = (job.attempts.iter())
                    .filter(|a| model.clears(&a.provider) == Clears::Asked)
                    .filter(|a| {
                        w.work
                            .get(a.number as usize)
                            .is_some_and(|x| x.maybe_paid())
                    });
                let paid: Vec<_> = asked.map(|a| a.provider.as_str()).collect();
                paid.len() == paid.iter().collect::<BTreeSet<_>>().len()
            })
        }),
        Property::always(NOT_RACED, |_, w: &World| !w.ghost.raced),
        Property::always(CLEARED_AS, |_, w: &World| {
            w.job.as_ref().is_none_or(|job| {
                job.attempts.iter().all(|a| {
                    let left = w.ghost.left_unknown.get(&number(a.number)).copied();
                    a.cleared.map(|c| c.by) == left && a.cleared.is_none_or(|c| c.at <= at(w.now))
                })
            })
        }),
        Property::always(CLEARS, |model: &Protocol, w: &World| {
            !worked(model, w)
                || w.job.as_ref().is_none_or(|job| {
                    job.attempts.iter().all(|a| {
                        a.state != AttemptState::Unknown
                            || model.clears(&a.provider) == Clears::Hold
                    })
                })
        }),
        Property::always(ANSWERED, |model: &Protocol, w: &World| {
            let answered = w.clients.iter().all(|c| c.answer.is_some());
            let one_201 = w.ghost.gave_up || w.ghost.created == 1;
            !ended(model, w) || (answered && one_201)
        }),
        Property::sometimes(LATE_WIN, |_, w: &World| {
            w.job.as_ref().is_some_and(|job| {
                job.completed_by
                    .and_then(|n| job.attempt(n))
                    .is_some_and(|a| {
                        let timed_out = a
                            .started_at
                            .map(|t| t + chrono::Duration::seconds(TIMEOUT.into()));
                        a.finished_at >= timed_out
                    })
            })
        }),
        Property::sometimes(DISCARDED, |_, w: &World| {
            w.job.as_ref().is_some_and(|job| {
                job.attempts
                    .iter()
                    .any(|a| a.state == AttemptState::Discarded)
            })
        }),
        Property::sometimes(FAILED_OVER, |_, w: &World| {
            w.job.as_ref().is_some_and(|job| {
                job.attempts
                    .iter()
                    .any(|a| a.provider.as_str() == "b" && a.retry_of.is_none())
                    && job.status() == JobStatus::Succeeded
            })
        }),
        Property::sometimes(REPLAYED, |_, w: &World| {
            w.clients
                .iter()
                .any(|c| matches!(c.answer, Some(Answer::Replayed | Answer::Conflict)))
        }),
        Property::sometimes(REDELIVERED, |_, w: &World| {
            !w.ghost.delivered.is_empty() && w.faults.endpoint == 0
        }),
        Property::sometimes(FOUND_WINS, |_, w: &World| {
            w.job.as_ref().is_some_and(|job| {
                (job.completed_by.and_then(|n| job.attempt(n)))
                    .is_some_and(|a| a.cleared.is_some_and(|c| c.by == ClearedBy::Lookup))
            })
        }),
        Property::sometimes(ABSENT_RETRIED, |_, w: &World| {
            w.job.as_ref().is_some_and(|job| {
                job.attempts.iter().any(|a| {
                    a.retry_of.and_then(|n| job.attempt(n)).is_some_and(|r| {
                        r.cleared.is_some_and(|c| c.by == ClearedBy::Lookup)
                            && r.state == AttemptState::Cancelled
                    })
                })
            })
        }),
        Property::sometimes(POLICY_CLEARED, |_, w: &World| {
            w.job.as_ref().is_some_and(|job| {
                (job.attempts.iter()).any(|a| a.cleared.is_some_and(|c| c.by == ClearedBy::Policy))
            })
        }),
    ]
}

/// What a model must reach: its scenario's, and with a reconciler, the ways it clears an `unknown` (each where a
/// provider of the chain clears that way).
pub(crate) fn sometimes(model: &Protocol) -> Vec<&'static str> {
    let mut reached = match model.scenario {
        Scenario::Intake => vec![REPLAYED],
        Scenario::Attempts => vec![LATE_WIN, DISCARDED, FAILED_OVER, REDELIVERED],
    };
    if model.reconciling() && model.clears.contains(&Clears::Asked) {
        reached.extend([FOUND_WINS, ABSENT_RETRIED]);
    }
    if model.reconciling() && model.clears.contains(&Clears::Policy) {
        reached.push(POLICY_CLEARED);
    }
    reached
}

/// The names of the properties that must never be broken.
pub(crate) fn musts() -> BTreeSet<&'static str> {
    [
        ONE_JOB,
        ONE_201,
        CONFLICT,
        ONE_LIVE,
        UNKNOWN,
        ONE_RESULT,
        ONE_CALL,
        QUALIFIED,
        ANSWERS_KEPT,
        ONE_EVENT,
        SETTLES,
        ANNOUNCED,
        ANSWERED,
        PAID_ONCE,
        NOT_RACED,
        CLEARED_AS,
        CLEARS,
    ]
    .into()
}

/// What a settled job came to, told apart as invariant 14 tells settles apart: its status, the attempt whose result
/// it holds, and for a failure how many attempts it had (a failure retried by hand that fails again is a new one).
/// Writes that leave these as they were settle nothing.
pub(crate) fn outcome(job: &Job) -> (u8, u32, usize) {
    let status = JobStatus::ALL
        .iter()
        .position(|s| *s == job.status())
        .expect("a status");
    let failed = job.status() == JobStatus::Failed;
    (
        u8::try_from(status).expect("six statuses"),
        job.completed_by.unwrap_or(0),
        if failed { job.attempts.len() } else { 0 },
    )
}
