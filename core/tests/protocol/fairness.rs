//! Two owners' completion events through one process's deliverer, model-checked: bob's endpoint fails every try
//! (or is slow: the same to the deliverer), and bob has more events due, sooner, than a batch holds; alice's endpoint
//! takes hers. A batch takes what the domain's [`fair_batch`] takes of what is due and no other batch holds, and
//! starts a try of each within its owner's tries in flight ([`Hand`], the deliverer's rule); a try's answer comes
//! later, in any order — a slow endpoint's tries stay in flight while other batches run. A failed try is due again
//! after a backoff (bob's endpoint takes each event at its third try, so that every run ends and is judged). The
//! properties: alice's event goes out in the first batch that runs once it is due (bounded delay, whatever bob's
//! endpoint does), a batch can always start while another's tries are in flight, an endpoint never has more tries
//! in flight than its cap, and in every run that ends alice's event is delivered.

use stateright::{Model, Property};

use onejob_core::domain::event::{Hand, fair_batch};

use crate::world::{Tick, at};

/// Deliveries a batch takes at most.
const BATCH: usize = 2;
/// Bob's events: more than a batch.
const BOBS: usize = 3;
/// An endpoint's tries in flight at most, here (the deliverer's is [`ENDPOINT_IN_FLIGHT`]: the same rule, a bound
/// that bob's events can pass across two batches).
///
/// [`ENDPOINT_IN_FLIGHT`]: onejob_core::domain::event::ENDPOINT_IN_FLIGHT
const IN_FLIGHT: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bug {
    /// A batch takes the soonest due, whoever's (as before the fix): bob's backlog stands before alice's event.
    SoonestFirst,
    /// One batch at a time: a batch waits for the one whose tries are in flight (as before the fix), so bob's slow
    /// endpoint holds alice's event up.
    OneBatchAtATime,
    /// Each batch counts only its own tries of an endpoint: two batches start more than its cap.
    CapPerBatch,
}

impl Bug {
    pub(crate) const ALL: [Bug; 3] = [Bug::SoonestFirst, Bug::OneBatchAtATime, Bug::CapPerBatch];
}

/// The property each broken variant breaks.
pub(crate) fn caught_by(bug: Bug) -> &'static str {
    match bug {
        Bug::SoonestFirst => FIRST_BATCH,
        Bug::OneBatchAtATime => NOT_BLOCKED,
        Bug::CapPerBatch => CAPPED,
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Fairness {
    pub max_clock: Tick,
    pub bug: Option<Bug>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Owner {
    Bob,
    Alice,
}

/// One job's delivery: whose, when due (`None`: delivered), tries so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Delivery {
    pub owner: Owner,
    pub due: Option<Tick>,
    pub tries: u8,
}

/// Bob's endpoint fails this many tries of each event before it takes one (so that runs end, and are judged).
const BOB_FAILS: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct World {
    pub now: Tick,
    pub deliveries: Vec<Delivery>,
    /// The tries in flight (the deliveries', by index), in the order they started.
    pub flying: Vec<usize>,
    /// What the process's batches hold, by delivery and by owner.
    pub hand: Hand<usize, Owner>,
    /// Batches run since alice's event was due, with it still untried.
    pub batches_waited: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// A batch: lists, takes and starts its tries.
    Batch,
    /// The try of delivery `i` answers.
    Answer(usize),
    Tick,
}

impl World {
    /// The deliveries due now that no batch holds, with their index.
    fn free_due(&self) -> impl Iterator<Item = (usize, &Delivery)> {
        (self.deliveries.iter().enumerate())
            .filter(|(i, d)| d.due.is_some_and(|t| t <= self.now) && !self.flying.contains(i))
    }

    fn alice_free_due(&self) -> bool {
        self.free_due().any(|(_, d)| d.owner == Owner::Alice)
    }
}

impl Model for Fairness {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        // Bob's settled first: his events are due before alice's — at the same moment, or a tick sooner (then bob's
        // tries may be in flight when hers comes due).
        (0..=1)
            .map(|alice_due| {
                let bob = Delivery {
                    owner: Owner::Bob,
                    due: Some(0),
                    tries: 0,
                };
                let mut deliveries = vec![bob; BOBS];
                deliveries.push(Delivery {
                    owner: Owner::Alice,
                    due: Some(alice_due),
                    tries: 0,
                });
                World {
                    now: 0,
                    deliveries,
                    flying: Vec::new(),
                    hand: Hand::default(),
                    batches_waited: 0,
                }
            })
            .collect()
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        let blocked = self.bug == Some(Bug::OneBatchAtATime) && !w.flying.is_empty();
        if w.free_due().next().is_some() && !blocked {
            actions.push(Action::Batch);
        }
        actions.extend(w.flying.iter().map(|i| Action::Answer(*i)));
        let later = w
            .deliveries
            .iter()
            .any(|d| d.due.is_some_and(|t| t > w.now));
        if w.now < self.max_clock && later {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        match action {
            Action::Batch => {
                let due: Vec<(usize, (Owner, onejob_core::domain::Timestamp))> = (w.free_due())
                    .map(|(i, d)| (i, (d.owner, at(d.due.expect("due")))))
                    .collect();
                let listed: Vec<(Owner, onejob_core::domain::Timestamp)> =
                    due.iter().map(|(_, d)| *d).collect();
                let taken: Vec<usize> = match self.bug {
                    Some(Bug::SoonestFirst) => {
                        let mut order: Vec<usize> = (0..listed.len()).collect();
                        order.sort_by_key(|i| (listed[*i].1, *i));
                        order.truncate(BATCH);
                        order
                    }
                    _ => fair_batch(&listed, BATCH),
                };
                let alice_due = w.alice_free_due();
                // The broken variant counts this batch's tries only.
                let mut own: Hand<usize, Owner> = Hand::default();
                for i in taken {
                    let (d, owner) = (due[i].0, due[i].1.0);
                    if !w.hand.take(&d) {
                        continue;
                    }
                    let counted = match self.bug {
                        Some(Bug::CapPerBatch) => own.start(&owner, IN_FLIGHT),
                        _ => w.hand.start(&owner, IN_FLIGHT),
                    };
                    if counted {
                        w.flying.push(d);
                    } else {
                        // Its endpoint has its tries in flight: it stays due, for a later batch.
                        w.hand.release(&d);
                    }
                }
                if alice_due && w.alice_free_due() {
                    w.batches_waited += 1;
                }
            }
            Action::Answer(i) => {
                w.flying.retain(|f| *f != i);
                let d = &mut w.deliveries[i];
                d.tries += 1;
                d.due = match d.owner {
                    Owner::Alice => None,
                    // Bob's endpoint fails: tried again a tick later.
                    Owner::Bob if d.tries <= BOB_FAILS => Some(w.now + 1),
                    Owner::Bob => None,
                };
                let owner = d.owner;
                w.hand.release(&i);
                w.hand.end(&owner);
            }
            Action::Tick => w.now += 1,
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(FIRST_BATCH, |_, w: &World| w.batches_waited == 0),
            Property::always(NOT_BLOCKED, |model: &Fairness, w: &World| {
                let mut next = Vec::new();
                model.actions(w, &mut next);
                !w.alice_free_due() || next.contains(&Action::Batch)
            }),
            Property::always(CAPPED, |_, w: &World| {
                let bobs = w
                    .flying
                    .iter()
                    .filter(|i| w.deliveries[**i].owner == Owner::Bob);
                bobs.count() <= IN_FLIGHT
            }),
            Property::always(DELIVERED, |model: &Fairness, w: &World| {
                let mut next = Vec::new();
                model.actions(w, &mut next);
                let ended = next.is_empty() && w.now < model.max_clock;
                !ended
                    || w.deliveries
                        .iter()
                        .any(|d| d.owner == Owner::Alice && d.due.is_none())
            }),
            Property::sometimes(BOB_TRIED, |_, w: &World| {
                w.deliveries
                    .iter()
                    .filter(|d| d.owner == Owner::Bob && d.due.is_some_and(|t| t > 0))
                    .count()
                    >= 2
            }),
            Property::sometimes(SIDE_BY_SIDE, |_, w: &World| {
                let bobs = w
                    .flying
                    .iter()
                    .filter(|i| w.deliveries[**i].owner == Owner::Bob);
                bobs.count() == IN_FLIGHT
            }),
        ]
    }
}

pub(crate) const FIRST_BATCH: &str =
    "14: an owner's due event goes out in the first batch, whatever another endpoint does";
pub(crate) const NOT_BLOCKED: &str = "14: a batch can start while another's tries are in flight (a slow endpoint holds up its own tries only)";
pub(crate) const CAPPED: &str =
    "14: an endpoint's tries in flight never pass its cap, whichever batch started them";
pub(crate) const DELIVERED: &str =
    "14: an owner's events are delivered, whatever another endpoint does (liveness)";
pub(crate) const BOB_TRIED: &str = "the failing endpoint is tried, and tried again";
pub(crate) const SIDE_BY_SIDE: &str = "the failing endpoint has its cap of tries in flight at once";
