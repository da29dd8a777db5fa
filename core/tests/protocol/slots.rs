//! A provider's call slots, model-checked (`max_in_flight` of 1): two jobs' attempts, a message delivered twice,
//! two workers that may die mid-step, and leases that end. Each step takes its attempt's slot by the domain's
//! [`CallSlots`] rule, claims the attempt by the domain's own transition, calls, answers, and frees the slot — only
//! if its claim succeeded, or if its claim was refused because the attempt ended (a late duplicate, which took the
//! slot again). The property: calls in flight never pass the cap, whatever the duplicates do.

use std::hash::{Hash, Hasher};

use chrono::Duration;
use onejob_core::domain::{CallSlots, IdempotencyKey, Job, NewJob, Stamp, Transition, WriteToken};
use stateright::{Model, Property};

use crate::world::{Tick, at, intent};

const CAP: u32 = 1;
/// A claim's lease, in ticks (seconds): a slot taken lasts as long.
const LEASE: Tick = 3;

/// A broken variant, behind a seam of this model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bug {
    /// A step whose claim was refused frees its attempt's slot anyway (as before the fix): a duplicate message
    /// frees the running call's slot.
    FreeOnRefusedClaim,
}

#[derive(Debug, Clone)]
pub(crate) struct Slots {
    pub duplicates: u8,
    pub crashes: u8,
    pub max_clock: Tick,
    pub bug: Option<Bug>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    Idle,
    /// Holds message `m`'s attempt's slot; its claim is next.
    Holding {
        job: u8,
        delivery: u8,
    },
    /// Claimed and calling.
    Calling {
        job: u8,
        delivery: u8,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct World {
    pub now: Tick,
    pub slots: CallSlots,
    pub jobs: [Job; 2],
    /// Messages not yet taken: (job, delivery).
    pub queue: Vec<(u8, u8)>,
    pub workers: [Step; 2],
    pub duplicates: u8,
    pub crashes: u8,
    /// Calls in flight (a call whose worker died goes on until its lease ends: counted until then).
    pub in_flight: Vec<(u8, Tick)>,
    pub max_in_flight: usize,
    pub deliveries: [u8; 2],
}

impl Hash for World {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.now.hash(state);
        format!("{:?}{:?}", self.slots, self.jobs).hash(state);
        self.queue.hash(state);
        self.workers.hash(state);
        self.duplicates.hash(state);
        self.crashes.hash(state);
        self.in_flight.hash(state);
        self.max_in_flight.hash(state);
        self.deliveries.hash(state);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// Worker `w` takes message `m`, and its attempt's slot if one is free.
    Take(u8, u8),
    Duplicate(u8),
    Claim(u8),
    Answer(u8),
    Crash(u8),
    Tick,
}

fn holder(job: u8) -> String {
    format!("job{job}#1")
}

fn new_job(i: u8) -> NewJob {
    NewJob {
        idempotency_key: IdempotencyKey::parse(&format!("slot-{i}")).expect("a key"),
        ..intent(0, true)
    }
}

fn token(job: u8, delivery: u8) -> WriteToken {
    WriteToken::parse(&format!("{:08x}{:08x}{:016x}", job + 1, delivery, 0)).expect("a token")
}

impl Slots {
    fn free(w: &mut World, job: u8) {
        if let Some(after) = w.slots.free(&holder(job)) {
            w.slots = after;
        }
    }

    /// A worker's step ends: the message is done (or comes back, if `back`).
    fn idle(w: &mut World, wk: u8, back: Option<(u8, u8)>) {
        w.workers[usize::from(wk)] = Step::Idle;
        w.queue.extend(back);
        w.queue.sort();
    }
}

impl Model for Slots {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let stamp = Stamp::new(token(9, 0), at(0));
        let jobs = [0, 1].map(|i| Job::new(new_job(i), Duration::days(30), &stamp));
        vec![World {
            now: 0,
            slots: CallSlots::default(),
            jobs,
            queue: vec![(0, 1), (1, 1)],
            workers: [Step::Idle; 2],
            duplicates: self.duplicates,
            crashes: self.crashes,
            in_flight: Vec::new(),
            max_in_flight: 0,
            deliveries: [1, 1],
        }]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        let idle = (0u8..).zip(&w.workers).find(|(_, s)| **s == Step::Idle);
        for (m, message) in (0u8..).zip(&w.queue) {
            if let Some((wk, _)) = idle {
                actions.push(Action::Take(wk, m));
            }
            if w.duplicates > 0 && message.1 == 1 {
                actions.push(Action::Duplicate(m));
            }
        }
        for (wk, step) in (0u8..).zip(&w.workers) {
            match step {
                Step::Idle => continue,
                Step::Holding { .. } => actions.push(Action::Claim(wk)),
                Step::Calling { .. } => actions.push(Action::Answer(wk)),
            }
            if w.crashes > 0 {
                actions.push(Action::Crash(wk));
            }
        }
        // A claim follows its take at once (a call's slot lasts a lease from its take; the call ends within its
        // lease from the claim): the clock does not move between them.
        let holding = w.workers.iter().any(|s| matches!(s, Step::Holding { .. }));
        if w.now < self.max_clock && !holding {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        let now = at(w.now);
        match action {
            Action::Take(wk, m) => {
                let until = at(w.now + LEASE);
                // Every slot taken: the message waits, as it was, and comes back (no try, no step).
                let after = w
                    .slots
                    .take(&holder(w.queue[usize::from(m)].0), CAP, until, now)?;
                let (job, _) = w.queue.remove(usize::from(m));
                let delivery = w.deliveries[usize::from(job)] + 1;
                w.deliveries[usize::from(job)] = delivery;
                w.slots = after;
                w.workers[usize::from(wk)] = Step::Holding { job, delivery };
            }
            Action::Duplicate(m) => {
                w.duplicates -= 1;
                let again = w.queue[usize::from(m)];
                w.queue.push((again.0, again.1 + 10));
                w.queue.sort();
            }
            Action::Claim(wk) => {
                let Step::Holding { job, delivery } = w.workers[usize::from(wk)] else {
                    unreachable!("holding")
                };
                let claim = Transition::Claim {
                    number: 1,
                    lease_expires_at: at(w.now + LEASE),
                };
                let stamp = Stamp::new(token(job, delivery), now);
                if claim.apply(&mut w.jobs[usize::from(job)], &stamp).is_ok() {
                    w.in_flight.push((job, w.now + LEASE));
                    w.max_in_flight = w.max_in_flight.max(w.in_flight.len());
                    w.workers[usize::from(wk)] = Step::Calling { job, delivery };
                } else {
                    // Its claim refused (a duplicate): the step frees nothing — unless its attempt's call is over
                    // (it ended), when the slot it took again is freed — and the message is done.
                    let over = w.jobs[usize::from(job)].completed_by.is_some();
                    if over || self.bug == Some(Bug::FreeOnRefusedClaim) {
                        Slots::free(&mut w, job);
                    }
                    Slots::idle(&mut w, wk, None);
                }
            }
            Action::Answer(wk) => {
                let Step::Calling { job, delivery } = w.workers[usize::from(wk)] else {
                    unreachable!("calling")
                };
                let complete = Transition::Complete {
                    number: 1,
                    result: serde_json::json!({"summary": "done"}),
                    report: Default::default(),
                };
                let stamp = Stamp::new(token(job, delivery), now);
                complete.apply(&mut w.jobs[usize::from(job)], &stamp).ok()?;
                w.in_flight.retain(|(j, _)| *j != job);
                Slots::free(&mut w, job);
                Slots::idle(&mut w, wk, None);
            }
            Action::Crash(wk) => {
                w.crashes -= 1;
                let back = match w.workers[usize::from(wk)] {
                    Step::Holding { job, delivery } | Step::Calling { job, delivery } => {
                        Some((job, delivery))
                    }
                    Step::Idle => None,
                };
                // A call in flight goes on without its worker until its lease ends; the message comes back.
                Slots::idle(&mut w, wk, back);
            }
            Action::Tick => {
                w.now += 1;
                let now = w.now;
                w.in_flight.retain(|(_, until)| *until > now);
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(IN_FLIGHT, |_, w: &World| w.max_in_flight <= CAP as usize),
            Property::sometimes(BOTH_CALLED, |_, w: &World| {
                w.jobs.iter().all(|j| j.completed_by.is_some())
            }),
        ]
    }
}

pub(crate) const IN_FLIGHT: &str =
    "18: calls in flight never pass max_in_flight, whatever a duplicate does";
pub(crate) const BOTH_CALLED: &str = "both jobs are called, one at a time";
