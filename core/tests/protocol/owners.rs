//! An owner's limits, model-checked (invariant 18): creates through two api processes on one table, a manual
//! attempt by the owner and one by an operator, workers that reserve each call before they make it and whose
//! answers fail over, and the settles that follow an attempt's end (its reservation to what it cost, a freed place)
//! — every write of the owner's ledger as the DynamoDB store makes it, the strictest: the domain's own
//! [`OwnerLedger`] rules (`admit_create`, `admit_attempt`, `reserve`, `checked`, `settle`), applied to the stored
//! ledger in a write guarded by its revision, which fails before it lands, or lands and loses its answer (then
//! tried again). A job's put is conditional on its intent's item, and may be slow: it lands later, after the other
//! process's whole create. A create that took its place puts its job within the minute a place counts unchecked
//! (the api's write budget is seconds, its function's timeout thirty). Every call's worst case is [`BOUND`] tokens
//! and it reports [`USED`]: under a budget of 15, a second call is reserved only once the first is settled, and
//! a third never.

mod world;
pub(crate) use world::*;

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use chrono::Duration;
use onejob_core::domain::{
    Bound, Budget, CallReport, Failover, IdempotencyKey, Job, LimitReached, Live, NewJob,
    OwnerLedger, OwnerLimits, Period, ProviderName, Spend, Stamp, Transition, Within, WriteToken,
};
use stateright::{Model, Property};

use crate::world::{Tick, at, intent};

/// Every call's worst case.
const BOUND: Bound = Bound {
    tokens: 10,
    nanos: 0,
};

/// What every call uses (and reports): less than its worst case.
pub(crate) const USED: u64 = 4;

/// The budget, in tokens a day: one worst case at a time, two calls in all.
const BUDGET_TOKENS: u64 = 15;

/// A tick of this model is thirty seconds: a place not known to hold is looked at again after two.
const TICK_S: i64 = 30;

fn now_of(tick: Tick) -> onejob_core::domain::Timestamp {
    at(0) + Duration::seconds(TICK_S * i64::from(tick))
}

/// What the model runs, and under which limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limited {
    /// One live job and a budget of 15 tokens a day: a double click of one intent through two api processes and a
    /// create of another (nobody works the jobs).
    Intake,
    /// One live job, from one intent's job made and queued: workers answer and fail over, a create of another
    /// intent, a manual attempt by the owner and one by an operator, and the freed places that follow.
    Attempts,
    /// A budget of 15 tokens a day and nothing else, from the same start: each answer spends 10, failover and the
    /// manual attempts meet the spent budget.
    Budgeted,
    /// Two creates a minute and nothing else: the double click and the other create, each intent counted once,
    /// its place gone once its create is written.
    Rate,
}

/// A broken variant, behind a seam of this model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bug {
    /// A place is keyed by the request (as by a job id made from the request's time), not by the intent: the other
    /// process's create of the same intent does not find it. Breaks "a replay is never refused" and "counted once".
    PlaceByRequest,
    /// A manual attempt is not held to the live jobs (it queues without taking a place). Breaks the live limit.
    ManualUnheld,
    /// A worker calls without reserving the call first. Breaks "the calls never pass the budget".
    WorkerUnreserved,
    /// A settle whose answer was lost, written again, counts the call again. Breaks "counted once".
    SettledTwice,
    /// A create's place is never let go without a live-jobs limit. Breaks "bounded by the limits".
    PlacesKept,
}

impl Bug {
    pub(crate) const ALL: [Self; 5] = [
        Self::PlaceByRequest,
        Self::ManualUnheld,
        Self::WorkerUnreserved,
        Self::SettledTwice,
        Self::PlacesKept,
    ];
}

#[derive(Debug, Clone)]
pub(crate) struct Owners {
    pub limited: Limited,
    /// Store faults to inject (a write that fails before it lands, or lands and loses its answer), and slow puts.
    pub faults: u8,
    pub slow_puts: u8,
    pub max_clock: Tick,
    pub bug: Option<Bug>,
}

fn token(kind: u32, id: u8) -> WriteToken {
    WriteToken::parse(&format!("{kind:08x}{id:08x}{:016x}", 0)).expect("32 hex digits")
}

/// The job of intent `i`: the shared payload under the key `order-<i>`.
fn new_job(i: u8) -> NewJob {
    NewJob {
        idempotency_key: IdempotencyKey::parse(&format!("order-{i}")).expect("a key"),
        ..intent(0, true)
    }
}

/// What failover may do: `b` and `c` are qualified (so that a failover may meet a spent budget).
fn failover(budget: Option<LimitReached>) -> Failover {
    Failover {
        qualified: ["b", "c"]
            .map(|p| ProviderName::parse(p).expect("a name"))
            .into(),
        // One more than the chain: a manual attempt after the chain failed.
        max_attempts: 4,
        retry: None,
        jitter_permille: 0,
        budget,
    }
}

impl Owners {
    pub(crate) fn limits(&self) -> OwnerLimits {
        let budget = Some(Budget {
            period: Period::Day,
            tokens: Some(BUDGET_TOKENS),
            cost: None,
        });
        match self.limited {
            Limited::Intake => OwnerLimits {
                live_jobs: Some(1),
                budget,
                ..OwnerLimits::default()
            },
            Limited::Attempts => OwnerLimits {
                live_jobs: Some(1),
                ..OwnerLimits::default()
            },
            Limited::Budgeted => OwnerLimits {
                budget,
                ..OwnerLimits::default()
            },
            Limited::Rate => OwnerLimits {
                creates_per_minute: Some(2),
                ..OwnerLimits::default()
            },
        }
    }

    fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// Where intent `i`'s create takes its place: the intent's item key (a request's, under the bug).
    fn place(&self, i: u8, request: u8) -> String {
        let id =
            onejob_core::domain::JobId::intent_of(&new_job(i).owner, &new_job(i).idempotency_key);
        if self.has(Bug::PlaceByRequest) {
            format!("{id}@{request}")
        } else {
            id
        }
    }

    fn live(job: &Option<Job>) -> bool {
        job.as_ref().is_some_and(|j| j.live_attempt().is_some())
    }

    /// What the ledger says of a write once the places it asks about are checked against their jobs.
    fn within(&self, w: &World, ask: impl Fn(&OwnerLedger) -> Within) -> (OwnerLedger, Within) {
        let mut ledger = w.ledger.clone();
        loop {
            match ask(&ledger) {
                Within::Check(intents) => {
                    let jobs: BTreeMap<String, Job> = (0..2u8)
                        .filter_map(|i| Some((self.place(i, 0), w.jobs[usize::from(i)].clone()?)))
                        .collect();
                    ledger = ledger.checked(&intents, &jobs, now_of(w.now));
                }
                within => return (ledger, within),
            }
        }
    }

    /// A write that admitted a create or an attempt (which drops stale places first).
    fn store_ledger(&self, w: &mut World, ledger: OwnerLedger) {
        self.store_note(w, ledger);
        w.ghost.admitted_at = w.now;
    }

    /// A write that settles a reservation or frees a place.
    fn store_note(&self, w: &mut World, ledger: OwnerLedger) {
        w.ledger = ledger;
        w.rev += 1;
    }

    /// What the engine's read of the budget tells failover and a manual attempt before their write: whether a
    /// call's worst case fits beside the spend and the reservations (the job's own, to be settled, left out).
    fn spent(&self, w: &World, i: u8) -> Option<LimitReached> {
        let mut ledger = w.ledger.clone();
        ledger.places.remove(&self.place(i, 0));
        self.limits().fits(&ledger, now_of(w.now), BOUND)
    }
}

impl Model for Owners {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        // Two api processes take a double click of intent 0 (requests 0 and 1); intent 1 is created by a third
        // request (2). From intent 0's job made, only the third.
        let made = matches!(self.limited, Limited::Attempts | Limited::Budgeted);
        let clicked = false;
        let requests: Vec<Request> = [(0, 0), (0, 1), (1, 2), (1, 3)]
            .into_iter()
            .filter(|(intent, id)| match made {
                true => *intent == 1 && (clicked || *id == 2),
                false => *id < 3,
            })
            .map(|(intent, id)| Request {
                intent,
                id,
                phase: Phase::Read,
            })
            .collect();
        let mut ledger = OwnerLedger::default();
        let mut jobs = [None, None];
        if made {
            let within = ledger.admit_create(
                &self.place(0, 0),
                &self.limits(),
                now_of(0),
                Live::Places,
                BOUND,
            );
            let Within::Yes(after) = within else {
                unreachable!("the first create is admitted")
            };
            ledger = after.unwrap_or(ledger);
            let stamp = Stamp::new(token(1, 0), now_of(0));
            jobs[0] = Some(Job::new(new_job(0), Duration::days(30), &stamp));
        }
        vec![World {
            now: 0,
            ledger,
            rev: u32::from(made),
            jobs,
            requests,
            manual: [Manual::Idle; 2],
            frees: Vec::new(),
            faults: self.faults,
            slow_puts: self.slow_puts,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        for (r, request) in (0u8..).zip(&w.requests) {
            match request.phase {
                Phase::Read => actions.push(Action::Read(r)),
                Phase::Hold { .. } => {
                    actions.push(Action::Hold(r, false));
                    if w.faults > 0 {
                        actions.push(Action::Hold(r, true));
                    }
                }
                Phase::Put => {
                    actions.push(Action::Put(r, false));
                    if w.slow_puts > 0 {
                        actions.push(Action::Put(r, true));
                    }
                }
                Phase::Landing => actions.push(Action::Land(r)),
                Phase::Answer(_) => actions.push(Action::Answer(r)),
            }
        }
        let worked = matches!(self.limited, Limited::Attempts | Limited::Budgeted);
        for i in (0..2u8).filter(|_| worked) {
            if w.jobs[usize::from(i)]
                .as_ref()
                .and_then(Job::live_attempt)
                .is_some()
            {
                actions.push(Action::Work(i, true));
                actions.push(Action::Work(i, false));
            }
        }
        // The settles in the order their attempts ended (each job's worker writes its own after its answer).
        if !w.frees.is_empty() {
            actions.push(Action::Free(0, false));
            if w.faults > 0 && self.limits().budget.is_some() {
                actions.push(Action::Free(0, true));
            }
        }
        if worked {
            for (a, manual) in (0u8..).zip(&w.manual) {
                let failed = w.jobs[0].as_ref().is_some_and(|j| {
                    j.live_attempt().is_none()
                        && j.status() == onejob_core::domain::JobStatus::Failed
                });
                // The operator's after the owner's: the two are the same write, as the owner's limits hold both.
                let turn = a == 0 || w.manual[0] == Manual::Done;
                match manual {
                    Manual::Idle if failed && turn => actions.push(Action::ManualHold(a)),
                    Manual::Held => actions.push(Action::ManualAdd(a)),
                    _ => {}
                }
            }
        }
        // An api request — a create from its first read to its put's landing, a manual attempt from its hold to its
        // write — ends within the minute a place counts unchecked (its write budget is seconds, its function's
        // timeout thirty): the clock does not pass that minute while one is under way.
        let putting = (w.requests.iter())
            .any(|r| matches!(r.phase, Phase::Hold { .. } | Phase::Put | Phase::Landing));
        let adding = w.manual.contains(&Manual::Held);
        if w.now < self.max_clock && !putting && !adding {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        let now = now_of(w.now);
        match action {
            Action::Read(r) => {
                let request = w.requests[usize::from(r)];
                let phase = match &w.jobs[usize::from(request.intent)] {
                    Some(_) => Phase::Answer(Answer::Replayed),
                    None => Phase::Hold { faulted: false },
                };
                w.requests[usize::from(r)].phase = phase;
            }
            Action::Hold(r, fault) => {
                let request = w.requests[usize::from(r)];
                let place = self.place(request.intent, request.id);
                let limits = self.limits();
                let (checked, within) = self.within(&w, |l| {
                    l.admit_create(&place, &limits, now, Live::Places, BOUND)
                });
                let phase = match within {
                    Within::Yes(after) => {
                        if let Some(after) = after {
                            if after.rate_tat_us != checked.rate_tat_us {
                                w.ghost.counted[usize::from(request.intent)] += 1;
                            }
                            if fault {
                                // It lands and its answer is lost: the next try reads it back.
                                w.faults -= 1;
                                self.store_ledger(&mut w, after);
                                w.requests[usize::from(r)].phase = Phase::Hold { faulted: true };
                                return Some(w);
                            }
                            self.store_ledger(&mut w, after);
                        }
                        Phase::Put
                    }
                    Within::Beyond(_) => {
                        if checked != w.ledger {
                            self.store_ledger(&mut w, checked);
                        }
                        // A create of this very intent may have landed meanwhile: a replay.
                        match &w.jobs[usize::from(request.intent)] {
                            Some(_) => Phase::Answer(Answer::Replayed),
                            None => {
                                // Refused while another create of the intent is past its hold: a replay refused.
                                let replay = w.requests.iter().any(|o| {
                                    o.intent == request.intent
                                        && matches!(o.phase, Phase::Put | Phase::Landing)
                                });
                                w.ghost.refused_replay |= replay;
                                Phase::Answer(Answer::Refused)
                            }
                        }
                    }
                    Within::Check(_) => unreachable!("checked above"),
                };
                w.requests[usize::from(r)].phase = phase;
            }
            Action::Put(r, slow) => {
                if slow {
                    w.slow_puts -= 1;
                    w.requests[usize::from(r)].phase = Phase::Landing;
                } else {
                    self.put(&mut w, r);
                }
            }
            Action::Land(r) => self.put(&mut w, r),
            Action::Answer(r) => {
                let request = w.requests.remove(usize::from(r));
                let Phase::Answer(answer) = request.phase else {
                    unreachable!("answering")
                };
                w.ghost.answers[usize::from(request.intent)].push(answer);
            }
            Action::Work(i, succeeds) => {
                let limits = self.limits();
                let budget = self.spent(&w, i);
                let job = w.jobs[usize::from(i)].clone().expect("a live job");
                let number = job.live_attempt().expect("live").number;
                // Before the call, the worker reserves it (the attempt a create or a manual attempt reserved for
                // already as it is).
                let reserved = match self.has(Bug::WorkerUnreserved) {
                    true => Within::Yes(None),
                    false => {
                        self.within(&w, |l| l.reserve(&job, number, &limits, now, BOUND))
                            .1
                    }
                };
                let stamp = Stamp::new(token(9, number as u8), now);
                let job = w.jobs[usize::from(i)].as_mut().expect("a live job");
                let claimed = Transition::Claim {
                    number,
                    lease_expires_at: now + Duration::minutes(5),
                }
                .apply(job, &stamp);
                if claimed.is_err() {
                    return None;
                }
                let report = CallReport {
                    input_tokens: Some(USED - 1),
                    output_tokens: Some(1),
                    ..CallReport::default()
                };
                let answered = match reserved {
                    Within::Yes(after) => {
                        w.ghost.called += USED;
                        if let Some(after) = after {
                            // The reservation and the claim are two writes; the model makes them one step.
                            w.ledger = after;
                            w.rev += 1;
                        }
                        let job = w.jobs[usize::from(i)].as_mut().expect("a live job");
                        match succeeds {
                            true => Transition::Complete {
                                number,
                                result: serde_json::json!({"summary": "done"}),
                                report,
                            }
                            .apply(job, &stamp)
                            .map(|_| ()),
                            false => Transition::Fail {
                                number,
                                error: onejob_core::domain::ErrorInfo::new(
                                    "output_invalid",
                                    "broke",
                                ),
                                report,
                                failover: failover(budget),
                            }
                            .apply(job, &stamp)
                            .map(|_| ()),
                        }
                    }
                    // Refused by the budget: no call, and no failover.
                    Within::Beyond(limit) => Transition::Fail {
                        number,
                        error: onejob_core::domain::ErrorInfo::new("budget_exceeded", "spent"),
                        report: CallReport::default(),
                        failover: failover(Some(limit)),
                    }
                    .apply(w.jobs[usize::from(i)].as_mut().expect("a job"), &stamp)
                    .map(|_| ()),
                    Within::Check(_) => unreachable!("checked"),
                };
                answered.ok()?;
                // As the engine: the attempt's end is settled (its reservation, and its place if the job ended).
                let ended = w.jobs[usize::from(i)]
                    .as_ref()
                    .is_some_and(|j| !j.is_live());
                if limits.budget.is_some() || (ended && limits.keeps_places()) {
                    w.frees.push(i);
                }
            }
            Action::Free(f, lost) => {
                let i = match lost {
                    true => {
                        // It lands and its answer is lost: written again later.
                        w.faults -= 1;
                        w.frees[usize::from(f)]
                    }
                    false => w.frees.remove(usize::from(f)),
                };
                let job = w.jobs[usize::from(i)].clone().expect("a job");
                let before = w.ledger.day.tokens;
                if let Some(mut after) = w.ledger.settle(&job, now) {
                    if self.has(Bug::SettledTwice) && after.day.tokens == before {
                        after = after.spend(&Spend {
                            at: now,
                            tokens: USED,
                            nanos: 0,
                        });
                    }
                    self.store_note(&mut w, after);
                } else if self.has(Bug::SettledTwice) {
                    let after = w.ledger.spend(&Spend {
                        at: now,
                        tokens: USED,
                        nanos: 0,
                    });
                    self.store_note(&mut w, after);
                }
            }
            Action::ManualHold(a) => {
                let job = w.jobs[0].as_ref().expect("a failed job");
                let next = job.attempts.len() as u32 + 1;
                if !self.has(Bug::ManualUnheld) {
                    let limits = self.limits();
                    let (checked, within) = self.within(&w, |l| {
                        l.admit_attempt(job, next, &limits, now, Live::Places, BOUND)
                    });
                    match within {
                        Within::Yes(after) => {
                            if let Some(after) = after {
                                self.store_ledger(&mut w, after);
                            }
                        }
                        _ => {
                            if checked != w.ledger {
                                self.store_ledger(&mut w, checked);
                            }
                            w.manual[usize::from(a)] = Manual::Done;
                            return Some(w);
                        }
                    }
                }
                w.manual[usize::from(a)] = Manual::Held;
            }
            Action::ManualAdd(a) => {
                let job = w.jobs[0].as_mut().expect("a job");
                let add = Transition::AddAttempt {
                    provider: None,
                    failover: failover(None),
                };
                let stamp = Stamp::new(token(7, a), now);
                // Refused if the other's attempt is live: its hold's reservation stays until a check finds it
                // unused.
                let _ = add.apply(job, &stamp);
                w.manual[usize::from(a)] = Manual::Done;
            }
            Action::Tick => w.now += 1,
        }
        if self.has(Bug::PlacesKept)
            && let Action::Hold(..) = action
        {
            // The bug: what pruning let go, kept.
            for (place, kept) in &last.ledger.places {
                w.ledger.places.entry(place.clone()).or_insert(*kept);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(REPLAY, |_, w: &World| !w.ghost.refused_replay),
            Property::always(ONE_201, |_, w: &World| {
                (w.ghost.answers.iter())
                    .all(|a| a.iter().filter(|x| **x == Answer::Created).count() <= 1)
            }),
            Property::always(LIVE, |model: &Owners, w: &World| {
                let live = w.jobs.iter().filter(|j| Owners::live(j)).count();
                model.limits().live_jobs.is_none_or(|l| live <= l as usize)
            }),
            Property::always(BUDGET, |model: &Owners, w: &World| {
                model.limits().budget.is_none() || w.ghost.called <= BUDGET_TOKENS
            }),
            Property::always(SETTLED_ONCE, |model: &Owners, w: &World| {
                let counted = w.ledger.day.tokens;
                model.limits().budget.is_none()
                    || (counted <= w.ghost.called
                        && counted + w.ledger.reserved().tokens >= w.ghost.called)
            }),
            Property::always(ONCE, |_, w: &World| w.ghost.counted.iter().all(|c| *c <= 1)),
            Property::always(BOUNDED, |model: &Owners, w: &World| {
                let limits = model.limits();
                match limits.live_jobs {
                    Some(limit) => w.ledger.places.len() <= limit as usize,
                    None => {
                        // Fresh at the last admission, or reserving a call, or its job's while it is live or its
                        // end's settle is to be written (a settled reservation's place, until the job ends).
                        let held = (now_of(w.ghost.admitted_at) - OwnerLedger::CREATE_HELD)
                            .timestamp_millis();
                        let live: Vec<String> = (0..2u8)
                            .filter(|_| limits.budget.is_some())
                            .filter(|i| {
                                Owners::live(&w.jobs[usize::from(*i)]) || w.frees.contains(i)
                            })
                            .map(|i| model.place(i, 0))
                            .collect();
                        (w.ledger.places.iter()).all(|(intent, p)| {
                            p.at > held || p.reserved_for > 0 || live.contains(intent)
                        })
                    }
                }
            }),
            Property::sometimes(REACHED_REFUSED, |_, w: &World| {
                w.ghost.answers.iter().any(|a| a.contains(&Answer::Refused))
            }),
            Property::sometimes(REACHED_REPLAY, |_, w: &World| {
                (w.ghost.answers.iter())
                    .any(|a| a.contains(&Answer::Created) && a.contains(&Answer::Replayed))
            }),
        ]
    }
}

impl Owners {
    /// Request `r`'s job put, conditional on its intent's item: created if there is none, else the job there.
    fn put(&self, w: &mut World, r: u8) {
        let request = w.requests[usize::from(r)];
        let slot = &mut w.jobs[usize::from(request.intent)];
        let tok = token(1, request.id);
        let answer = match slot {
            None => {
                let stamp = Stamp::new(tok, now_of(w.now));
                *slot = Some(Job::new(
                    new_job(request.intent),
                    Duration::days(30),
                    &stamp,
                ));
                Answer::Created
            }
            Some(job) if job.created_by(&tok) => Answer::Created,
            Some(_) => Answer::Replayed,
        };
        w.requests[usize::from(r)].phase = Phase::Answer(answer);
    }
}

pub(crate) const REPLAY: &str =
    "18: a replay is never refused (an intent answered 201 is never answered 429)";
pub(crate) const ONE_201: &str = "2: one 201 per intent, across processes";
pub(crate) const LIVE: &str = "18: live jobs never pass the limit";
pub(crate) const BUDGET: &str = "18: the calls made never pass the budget";
pub(crate) const SETTLED_ONCE: &str =
    "18: each call is counted once: settled, or reserved until it is (never lost, never twice)";
pub(crate) const ONCE: &str = "18: an intent counts once among the minute's creates";
pub(crate) const BOUNDED: &str = "18: the owner's ledger is bounded by its limits";
pub(crate) const REACHED_REFUSED: &str = "a create is refused at a limit";
pub(crate) const REACHED_REPLAY: &str = "a double click across processes is one 201 and a replay";

/// The properties that must never break.
pub(crate) fn musts() -> [&'static str; 7] {
    [REPLAY, ONE_201, LIVE, BUDGET, SETTLED_ONCE, ONCE, BOUNDED]
}

/// Which property each broken variant breaks, and the limits it shows under.
pub(crate) fn caught_by(bug: Bug) -> (&'static str, Limited) {
    match bug {
        Bug::PlaceByRequest => (REPLAY, Limited::Intake),
        Bug::ManualUnheld => (LIVE, Limited::Attempts),
        Bug::WorkerUnreserved => (BUDGET, Limited::Budgeted),
        Bug::SettledTwice => (SETTLED_ONCE, Limited::Budgeted),
        Bug::PlacesKept => (BOUNDED, Limited::Rate),
    }
}
