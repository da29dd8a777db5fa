//! The owners' model's world: the api processes' creates, the manual attempts, the ledger, the jobs, and the ghost the
//! properties read.

use super::*;

/// A create in an api process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// It reads the intent's item.
    Read,
    /// It holds its intent to the owner's limits (the ledger's guarded write); `faulted`: a try failed.
    Hold { faulted: bool },
    /// Its job's conditional put.
    Put,
    /// Its put is slow: in flight, it lands later.
    Landing,
    /// What it answers.
    Answer(Answer),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Answer {
    Created,
    Replayed,
    Refused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Request {
    pub intent: u8,
    /// Which process, and which request of the model: its token.
    pub id: u8,
    pub phase: Phase,
}

/// A manual attempt, by the owner (0) or an operator (1), on intent 0's job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Manual {
    Idle,
    /// Its place is held: the attempt's write is next.
    Held,
    Done,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct World {
    pub now: Tick,
    pub ledger: OwnerLedger,
    pub rev: u32,
    /// The intents' items: intent 0, intent 1.
    pub jobs: [Option<Job>; 2],
    pub requests: Vec<Request>,
    pub manual: [Manual; 2],
    /// Intents whose attempt ended, the settle of its reservation (and, the job ended, of its place) to be written:
    /// from the job as it then reads.
    pub frees: Vec<u8>,
    pub faults: u8,
    pub slow_puts: u8,
    pub ghost: Ghost,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Ghost {
    /// Every answer, by intent.
    pub answers: [Vec<Answer>; 2],
    /// A create refused while another create of its intent was past its hold (its job to come).
    pub refused_replay: bool,
    /// Times the ledger counted each intent among the minute's creates.
    pub counted: [u8; 2],
    /// The tokens of the calls made (each reports [`super::USED`]): what the provider bills.
    pub called: u64,
    /// The tick of the last ledger write that admitted a create or an attempt: it dropped the places past their
    /// time first.
    pub admitted_at: Tick,
}

impl Hash for World {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.now.hash(state);
        format!("{:?}{:?}", self.ledger, self.jobs).hash(state);
        self.rev.hash(state);
        self.requests.hash(state);
        self.manual.hash(state);
        self.frees.hash(state);
        self.faults.hash(state);
        self.slow_puts.hash(state);
        self.ghost.hash(state);
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    Read(u8),
    Hold(u8, bool),
    Put(u8, bool),
    Land(u8),
    Answer(u8),
    /// The worker answers intent `i`'s live attempt: a result, or a failure (with failover).
    Work(u8, bool),
    /// The `f`th pending settle of an ended attempt (its reservation, its place): `true` when it lands and its
    /// answer is lost (it is written again).
    Free(u8, bool),
    ManualHold(u8),
    ManualAdd(u8),
    Tick,
}
