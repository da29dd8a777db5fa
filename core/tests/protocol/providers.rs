//! A provider's shared state, model-checked (invariants 15, 21): its breaker and its qualification evidence, which
//! every owner's calls move, written by two workers' processes at once. Alice's requests are hostile — refused by
//! the provider for their input (a 400), or answered with prose that breaks the contract — and bob's are honest: the
//! provider answers as the qualified model, answers as another model, or fails (a 5xx). Each call's note is written
//! after its answer, as the engine writes it: the breaker by the domain's [`Breaker::saw`] on what the domain's
//! [`Health`] reads of the reply, then the evidence by [`Qualification::observe`], each a read and then a write
//! guarded by the revision read (another writer's write between them sends it back to read again), and a write may
//! land and lose its answer (then it is made again, from a new read).
//!
//! The properties: the breaker opens only on failures that tell of the provider's health, counted once each; an
//! owner's refusals never hold a failing provider's breaker closed; breaches, which an owner's input causes, never
//! void the standing; an answer as another model voids it at once.

use std::hash::{Hash, Hasher};

use chrono::Duration;
use onejob_core::domain::{
    Breaker, BreakerPolicy, ContractRef, ErrorInfo, Fingerprint, Health, ProviderName,
    Qualification, RunEvidence, Standing,
};
use stateright::{Model, Property};

use crate::world::at;

/// Failures that open the breaker.
const THRESHOLD: u32 = 3;

fn policy() -> BreakerPolicy {
    BreakerPolicy {
        threshold: THRESHOLD,
        window: Duration::minutes(1),
        cooldown: Duration::seconds(30),
        probe_lease: Duration::seconds(10),
        look_again: Duration::seconds(2),
    }
}

/// What one call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Reply {
    /// Bob's: a 5xx.
    Failing,
    /// Alice's: a 400 her input caused.
    Refused,
    /// Alice's: prose where the contract wants JSON, from the qualified model.
    Breach,
    /// Bob's: an answer from the qualified model.
    Answer,
    /// Bob's: an answer from another model than the one qualified.
    Drift,
}

impl Reply {
    const ALL: [Self; 5] = [
        Self::Failing,
        Self::Refused,
        Self::Breach,
        Self::Answer,
        Self::Drift,
    ];

    /// The failure's code, as the providers' clients give it.
    fn code(self) -> Option<&'static str> {
        match self {
            Self::Failing => Some("provider_error"),
            Self::Refused => Some("provider_refused"),
            Self::Breach => Some("output_not_json"),
            Self::Answer | Self::Drift => None,
        }
    }

    /// The model the reply reports.
    fn model(self) -> Option<&'static str> {
        match self {
            Self::Breach | Self::Answer => Some("m1"),
            Self::Drift => Some("m2"),
            Self::Failing | Self::Refused => None,
        }
    }
}

/// A broken variant, behind a seam of this model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bug {
    /// A refusal the request caused counts as the provider failing.
    RefusalsCount,
    /// A refusal the request caused closes the breaker, as an answer does (as before the fix): an owner's bad
    /// requests between the failures keep a failing provider's breaker from opening.
    RefusalsClose,
    /// Breaches take the standing away, as a changed model does.
    BreachesVoid,
    /// A failure written again after its answer was lost is counted under a new name.
    RepeatCounted,
}

impl Bug {
    pub(crate) const ALL: [Self; 4] = [
        Self::RefusalsCount,
        Self::RefusalsClose,
        Self::BreachesVoid,
        Self::RepeatCounted,
    ];
}

#[derive(Debug, Clone)]
pub(crate) struct Providers {
    /// Calls made at most.
    pub calls: u8,
    /// Writes that land and lose their answer.
    pub faults: u8,
    pub bug: Option<Bug>,
}

/// A note being written: the call's number and reply; whether it is a write made again after a lost answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Note {
    pub call: u8,
    pub reply: Reply,
    pub again: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Writer {
    Idle,
    /// The breaker as read, at its revision.
    Breaker(Note, Breaker, u32),
    /// The evidence as read, at its revision.
    Evidence(Note, Box<Qualification>, u32),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct World {
    pub calls: u8,
    /// Notes of calls answered, not yet taken by a writer.
    pub notes: Vec<Note>,
    pub breaker: Breaker,
    pub breaker_rev: u32,
    pub evidence: Qualification,
    pub evidence_rev: u32,
    pub writers: [Writer; 2],
    pub faults: u8,
    pub ghost: Ghost,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Ghost {
    /// Distinct calls that failed for the provider's health, whose note reached the breaker.
    pub failing: Vec<u8>,
    /// Of those, the ones since the last answer's note.
    pub failing_since_answer: Vec<u8>,
    /// An answer as another model was noted on the evidence.
    pub drift_noted: bool,
}

impl Hash for World {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.calls.hash(state);
        self.notes.hash(state);
        format!("{:?}{:?}{:?}", self.breaker, self.evidence, self.writers).hash(state);
        self.breaker_rev.hash(state);
        self.evidence_rev.hash(state);
        self.faults.hash(state);
        self.ghost.hash(state);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// A call is made and answered with this reply; its note waits for a writer.
    Call(Reply),
    /// Writer `w` takes note `n` and reads the breaker.
    Take(u8, u8),
    /// Writer `w` writes what it read, if the revision it read still stands (else it reads again); `lost`: it
    /// lands and its answer is lost.
    Write(u8, bool),
}

/// Evidence that qualification passed, with the model `m1`.
fn qualified() -> Qualification {
    Qualification {
        contract: ContractRef::parse("summarize@1").expect("a contract"),
        contract_fingerprint: Fingerprint::of_value(&serde_json::json!("summarize@1")),
        provider: ProviderName::parse("b").expect("a name"),
        provider_fingerprint: Fingerprint::of_value(&serde_json::json!("b")),
        passed: true,
        runs_per_sample: 1,
        checked_at: at(0),
        runs: vec![RunEvidence {
            sample: 0,
            run: 1,
            problem: None,
            elapsed_ms: 1,
            counted_prompt_tokens: None,
            report: Some(onejob_core::domain::CallReport {
                model: Some("m1".into()),
                ..Default::default()
            }),
        }],
        strikes: Vec::new(),
        suspected: None,
    }
}

impl Providers {
    fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// What the reply tells of the provider's health: the domain's reading, or a broken one.
    fn health(&self, reply: Reply) -> Health {
        match (reply, self.bug) {
            (Reply::Refused, Some(Bug::RefusalsCount)) => Health::Failing,
            (Reply::Refused, Some(Bug::RefusalsClose)) => Health::Answered,
            (_, _) => reply.code().map_or(Health::Answered, Health::of_failure),
        }
    }

    /// The attempt a note names in the shared state (`job_id#n`).
    fn attempt(&self, note: Note) -> String {
        match note.again && self.has(Bug::RepeatCounted) {
            true => format!("job{}#1 again", note.call),
            false => format!("job{}#1", note.call),
        }
    }

    /// The note applied to the breaker as read: `None` when it changes nothing (nothing is written).
    fn on_breaker(&self, note: Note, mut breaker: Breaker) -> Option<Breaker> {
        let health = self.health(note.reply);
        (breaker.saw(health, &self.attempt(note), at(0), &policy())).then_some(breaker)
    }

    /// The note applied to the evidence as read: `None` when it changes nothing.
    fn on_evidence(&self, note: Note, mut evidence: Qualification) -> Option<Qualification> {
        let broke = (note.reply == Reply::Breach)
            .then(|| ErrorInfo::new("output_not_json", "the answer is not JSON"));
        let changed = evidence.observe(
            &self.attempt(note),
            note.reply.model(),
            broke.as_ref(),
            at(0),
        );
        if self.has(Bug::BreachesVoid) && broke.is_some() {
            evidence.suspected = Some(onejob_core::domain::Suspicion {
                reason: ErrorInfo::new(onejob_core::domain::Suspicion::MODEL_CHANGED, "breach"),
                at: at(0),
                attempts: Vec::new(),
            });
            return Some(evidence);
        }
        changed.then_some(evidence)
    }

    /// Writer `w` goes on to the evidence, from a new read.
    fn to_evidence(w: &mut World, wk: usize, note: Note) {
        w.writers[wk] = Writer::Evidence(note, Box::new(w.evidence.clone()), w.evidence_rev);
    }
}

impl Model for Providers {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            calls: 0,
            notes: Vec::new(),
            breaker: Breaker::default(),
            breaker_rev: 0,
            evidence: qualified(),
            evidence_rev: 0,
            writers: [Writer::Idle, Writer::Idle],
            faults: self.faults,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        if w.calls < self.calls {
            actions.extend(Reply::ALL.map(Action::Call));
        }
        for (wk, writer) in (0u8..).zip(&w.writers) {
            match writer {
                Writer::Idle => {
                    // The notes are taken in any order: any of them by the first idle writer.
                    if wk == 0 || w.writers[0] != Writer::Idle {
                        actions.extend((0u8..).take(w.notes.len()).map(|n| Action::Take(wk, n)));
                    }
                }
                Writer::Breaker(..) | Writer::Evidence(..) => {
                    actions.push(Action::Write(wk, false));
                    if w.faults > 0 {
                        actions.push(Action::Write(wk, true));
                    }
                }
            }
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        match action {
            Action::Call(reply) => {
                w.notes.push(Note {
                    call: w.calls,
                    reply,
                    again: false,
                });
                w.calls += 1;
            }
            Action::Take(wk, n) => {
                let note = w.notes.remove(usize::from(n));
                w.writers[usize::from(wk)] =
                    Writer::Breaker(note, w.breaker.clone(), w.breaker_rev);
            }
            Action::Write(wk, lost) => {
                let wk = usize::from(wk);
                match w.writers[wk].clone() {
                    Writer::Breaker(note, read, rev) => {
                        let Some(after) = self.on_breaker(note, read) else {
                            // Nothing to write: on to the evidence.
                            Self::to_evidence(&mut w, wk, note);
                            return Some(w);
                        };
                        if rev != w.breaker_rev {
                            // Another writer wrote between: read again.
                            w.writers[wk] = Writer::Breaker(note, w.breaker.clone(), w.breaker_rev);
                            return Some(w);
                        }
                        w.breaker = after;
                        w.breaker_rev += 1;
                        let health = note
                            .reply
                            .code()
                            .map_or(Health::Answered, Health::of_failure);
                        match health {
                            Health::Failing => {
                                for seen in
                                    [&mut w.ghost.failing, &mut w.ghost.failing_since_answer]
                                {
                                    if !seen.contains(&note.call) {
                                        seen.push(note.call);
                                    }
                                }
                            }
                            Health::Answered => w.ghost.failing_since_answer.clear(),
                            Health::Silent => {}
                        }
                        if lost {
                            // It landed, and its answer was lost: made again, from a new read.
                            w.faults -= 1;
                            let again = Note {
                                again: true,
                                ..note
                            };
                            w.writers[wk] =
                                Writer::Breaker(again, w.breaker.clone(), w.breaker_rev);
                        } else {
                            Self::to_evidence(&mut w, wk, note);
                        }
                    }
                    Writer::Evidence(note, read, rev) => {
                        let Some(after) = self.on_evidence(note, *read) else {
                            w.writers[wk] = Writer::Idle;
                            return Some(w);
                        };
                        if rev != w.evidence_rev {
                            Self::to_evidence(&mut w, wk, note);
                            return Some(w);
                        }
                        w.evidence = after;
                        w.evidence_rev += 1;
                        w.ghost.drift_noted |= note.reply == Reply::Drift;
                        if lost {
                            w.faults -= 1;
                            Self::to_evidence(
                                &mut w,
                                wk,
                                Note {
                                    again: true,
                                    ..note
                                },
                            );
                        } else {
                            w.writers[wk] = Writer::Idle;
                        }
                    }
                    Writer::Idle => unreachable!("a writer at work"),
                }
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(OPENS_ON_HEALTH, |_, w: &World| {
                w.breaker.trips == 0 || w.ghost.failing.len() >= THRESHOLD as usize
            }),
            Property::always(NOT_HELD_CLOSED, |_, w: &World| {
                w.ghost.failing_since_answer.len() < THRESHOLD as usize || w.breaker.trips > 0
            }),
            Property::always(STANDING, |_, w: &World| {
                let (standing, _) = w.evidence.standing(at(0), Duration::days(30));
                (standing == Standing::Qualified) != w.ghost.drift_noted
            }),
            Property::sometimes(OPENED, |_, w: &World| w.breaker.trips > 0),
            Property::sometimes(SUSPECTED, |_, w: &World| {
                w.evidence.suspected.is_some() && !w.ghost.drift_noted
            }),
        ]
    }
}

pub(crate) const OPENS_ON_HEALTH: &str =
    "15: a breaker opens only on failures of the provider's health, each counted once";
pub(crate) const NOT_HELD_CLOSED: &str =
    "15: an owner's refusals never hold a failing provider's breaker closed";
pub(crate) const STANDING: &str =
    "15: breaches never void the standing; an answer as another model voids it at once";
pub(crate) const OPENED: &str = "the breaker opens";
pub(crate) const SUSPECTED: &str = "breaches make the provider suspected, its standing kept";

/// Which property each broken variant breaks.
pub(crate) fn caught_by(bug: Bug) -> &'static str {
    match bug {
        Bug::RefusalsCount | Bug::RepeatCounted => OPENS_ON_HEALTH,
        Bug::RefusalsClose => NOT_HELD_CLOSED,
        Bug::BreachesVoid => STANDING,
    }
}
