//! Two owners' completion events through one deliverer, model-checked: bob's endpoint fails every try (or is
//! slow: the same to the deliverer), and bob has more events due, sooner, than a batch holds; alice's endpoint takes
//! hers. Each batch takes what the domain's [`fair_batch`] takes of what is due — what every store lists — and tries
//! it; a failed try is due again after a backoff (bob's endpoint takes each event at its third try, so that every
//! run ends and is judged). The properties: alice's event goes out in the first batch that
//! runs once it is due (bounded delay, whatever bob's endpoint does), and in every run that ends it is delivered.

use stateright::{Model, Property};

use onejob_core::domain::event::fair_batch;

use crate::world::{Tick, at};

/// Deliveries a batch takes at most.
const BATCH: usize = 2;
/// Bob's events: more than a batch.
const BOBS: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bug {
    /// A batch takes the soonest due, whoever's (as before the fix): bob's backlog stands before alice's event.
    SoonestFirst,
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
    /// Batches run since alice's event was due, with it still undelivered.
    pub batches_waited: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Batch,
    Tick,
}

impl Model for Fairness {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        // Bob's settled first: his events are due before alice's, at the same moment or sooner.
        let mut deliveries = vec![
            Delivery {
                owner: Owner::Bob,
                due: Some(0),
                tries: 0,
            };
            BOBS
        ];
        deliveries.push(Delivery {
            owner: Owner::Alice,
            due: Some(0),
            tries: 0,
        });
        vec![World {
            now: 0,
            deliveries,
            batches_waited: 0,
        }]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        if w.deliveries
            .iter()
            .any(|d| d.due.is_some_and(|t| t <= w.now))
        {
            actions.push(Action::Batch);
        }
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
                let due: Vec<(usize, (Owner, onejob_core::domain::Timestamp))> = (w
                    .deliveries
                    .iter())
                .enumerate()
                .filter_map(|(i, d)| d.due.filter(|t| *t <= w.now).map(|t| (i, (d.owner, at(t)))))
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
                    None => fair_batch(&listed, BATCH),
                };
                let alice_due = w
                    .deliveries
                    .iter()
                    .any(|d| d.owner == Owner::Alice && d.due.is_some_and(|t| t <= w.now));
                for i in taken {
                    let d = &mut w.deliveries[due[i].0];
                    d.tries += 1;
                    d.due = match d.owner {
                        Owner::Alice => None,
                        // Bob's endpoint fails: tried again a tick later.
                        Owner::Bob if d.tries <= BOB_FAILS => Some(w.now + 1),
                        Owner::Bob => None,
                    };
                }
                let delivered = w
                    .deliveries
                    .iter()
                    .any(|d| d.owner == Owner::Alice && d.due.is_none());
                if alice_due && !delivered {
                    w.batches_waited += 1;
                }
            }
            Action::Tick => w.now += 1,
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(FIRST_BATCH, |_, w: &World| w.batches_waited == 0),
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
        ]
    }
}

pub(crate) const FIRST_BATCH: &str =
    "14: an owner's due event goes out in the first batch, whatever another endpoint does";
pub(crate) const DELIVERED: &str =
    "14: an owner's events are delivered, whatever another endpoint does (liveness)";
pub(crate) const BOB_TRIED: &str = "the failing endpoint is tried, and tried again";
