//! What the model's world holds: the store's job and its deliveries, the clients and the API's requests, the
//! queue, the workers and what they hold, writes left in flight, what faults are left to inject, and the ghost —
//! what the properties are checked against, which no actor reads.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use chrono::{Duration, TimeZone, Utc};
use onejob_core::domain::{
    ClearedBy, ContractRef, Deliveries, Failover, Fingerprint, IdempotencyKey, Job, NewJob, Owner,
    ProviderName, RetryPolicy, Timestamp, WriteToken,
};
use serde_json::{Value, json};

/// The clock's unit: a tick is a second.
pub(crate) type Tick = u8;

/// No answer after this long: the attempt becomes `unknown` (a provider's `timeout_ms`).
pub(crate) const TIMEOUT: Tick = 1;
/// After the time-out, listening goes on this long (`late_result_ms`).
pub(crate) const LATE: Tick = 1;
/// A claim's lease: the longest listening, plus a margin (`lease_margin_ms`).
pub(crate) const LEASE: Tick = TIMEOUT + LATE + 1;
/// A `queued` attempt nobody claimed for this long is sent again (`redispatch_after_ms`).
pub(crate) const REDISPATCH_AFTER: Tick = 2;
/// An event delivery that failed is tried again after this long.
pub(crate) const DELIVERY_BACKOFF: Tick = 1;
/// A call that started this long ago cannot still be running, nor its record be on its way: a provider that can be
/// asked and has no record of it did not do the work (`lookup_absent_after_ms`, from the call's start). Past the
/// lease, as the default (15 minutes) is past any lease: the provider may go on with a call its worker gave up on.
pub(crate) const ABSENT_AFTER: Tick = LEASE + 1;
/// A provider that cannot be asked, with a policy: its `unknown` attempt is cleared this long after its time-out
/// (`unknown_retry_after_ms`), and never before its lease ends.
pub(crate) const POLICY_AFTER: Tick = 1;

/// The moment of `tick`.
pub(crate) fn at(tick: Tick) -> Timestamp {
    Utc.timestamp_opt(1_800_000_000 + i64::from(tick), 0)
        .single()
        .expect("a moment")
}

/// The first tick at or after `moment`.
pub(crate) fn tick_of(moment: Timestamp) -> Tick {
    let ms = (moment - at(0)).num_milliseconds();
    Tick::try_from((ms + 999).div_euclid(1000).max(0)).unwrap_or(Tick::MAX)
}

/// The provider chain: `a` the primary, `b` qualified for the contract, `c` not.
pub(crate) const CHAIN: [&str; 3] = ["a", "b", "c"];

pub(crate) fn provider(name: &str) -> ProviderName {
    ProviderName::parse(name).expect("a provider name")
}

/// What clears an `unknown` attempt of a provider without a person (`engine/reconcile.rs`), as it is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Clears {
    /// It keeps its calls and can be asked about them (OpenAI with stored completions): the reconciler asks.
    Asked,
    /// It cannot be asked, and has `unknown_retry_after_ms`: the reconciler clears it by policy.
    Policy,
    /// Neither: a person resolves it (`hold`).
    Hold,
}

/// What failover may do: only `b` is qualified; a provider that said it did no work is tried once more, two
/// seconds later; three attempts at most.
pub(crate) fn failover() -> Failover {
    Failover {
        qualified: [provider("b")].into(),
        max_attempts: 3,
        retry: Some(RetryPolicy {
            max_retries: 1,
            within: Duration::seconds(10),
            base: Duration::seconds(2),
            cap: Duration::seconds(2),
        }),
        jitter_permille: 0,
        budget: None,
    }
}

/// What client `c` asks for: the two clients agree (a double click) unless told otherwise (the same key, another
/// payload).
pub(crate) fn intent(client: u8, agree: bool) -> NewJob {
    let input: Value = if agree || client == 0 {
        json!({"text": "The projector broke."})
    } else {
        json!({"text": "Something else entirely."})
    };
    NewJob {
        owner: Owner::parse("alice").expect("an owner"),
        idempotency_key: IdempotencyKey::parse("order-42").expect("a key"),
        fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
        contract: ContractRef::parse("summarize@1").expect("a contract"),
        input,
        providers: CHAIN.map(provider).to_vec(),
    }
}

/// Who writes: each write that may be repeated carries its writer's token, made here from who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    /// Client `c`'s `n`th request, as the API writes it.
    Request { client: u8, n: u8 },
    /// A worker's step on attempt `attempt`, its `delivery`th delivery.
    Step { attempt: u8, delivery: u8 },
    /// The sweeper's time-out of an attempt.
    Sweeper { attempt: u8 },
    /// A person resolving an attempt, or the owner cancelling the job.
    Person { attempt: u8 },
    /// Reconciler `r`'s clear of attempt `attempt` by policy.
    Reconciler { r: u8, attempt: u8 },
    /// Worker `wk`'s write of what its lookup of attempt `attempt` learnt: an answer found (`found`), or a clear.
    /// Each is a fresh token in the engine; one per worker, attempt and kind is as fresh here, as a lookup writes
    /// only while its attempt is `unknown`, and its write moves it on once it lands.
    Lookup { wk: u8, attempt: u8, found: bool },
}

impl Writer {
    pub(crate) fn token(self) -> WriteToken {
        let (kind, a, b) = match self {
            Self::Request { client, n } => (1, client, n),
            Self::Step { attempt, delivery } => (2, attempt, delivery),
            Self::Sweeper { attempt } => (3, attempt, 0),
            Self::Person { attempt } => (4, attempt, 0),
            Self::Reconciler { r, attempt } => (5, r, attempt),
            Self::Lookup { wk, attempt, found } => (6 + u8::from(found), wk, attempt),
        };
        WriteToken::parse(&format!("{kind:08x}{a:08x}{b:08x}{:08x}", 0)).expect("32 hex digits")
    }
}

/// A write's fate at the store: it lands and answers, fails before it lands, or lands and its answer is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Fate {
    Lands,
    FailsBefore,
    AnswerLost,
}

/// What the API answers a create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Answer {
    /// 201: this request made the job.
    Created,
    /// 200 `Idempotent-Replayed`.
    Replayed,
    /// 409 `idempotency_key_reused`.
    Conflict,
    /// 500: the store did not answer in time.
    Unavailable,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Client {
    /// Requests sent so far.
    pub sent: u8,
    /// A request is out, not answered yet.
    pub waiting: bool,
    /// The answer it kept (a lost answer or a 500 leaves it to send again).
    pub answer: Option<Answer>,
}

/// A create inside the API.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Request {
    pub client: u8,
    pub n: u8,
    pub phase: Phase,
    /// The store failed one of its tries: it may give up.
    pub faulted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// The create's conditional write, tried under the request's token.
    Writing,
    /// Made the job: attempt 1's message to send.
    Dispatching,
    /// The answer to send back.
    Answering(Answer),
}

/// A queue message: an attempt, not delivered before `not_before`, held by a worker (invisible) or not; a
/// reconciler's lookup (`look_up`: ask its provider about the call) or the attempt's own step.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Message {
    pub attempt: u8,
    pub not_before: Tick,
    pub held: Option<u8>,
    pub look_up: bool,
}

/// What a provider's reply means (`providers::Reply`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reply {
    /// An answer that keeps the contract.
    Result,
    /// 429: the work was not done (retried on the same provider).
    RateLimited,
    /// An answer that breaks the contract: definite, the work was done and is worthless.
    Broken,
    /// The connection was lost after sending: the provider may have done the work.
    Lost,
}

impl Reply {
    pub(crate) const ALL: [Self; 4] = [Self::Result, Self::RateLimited, Self::Broken, Self::Lost];
}

/// The time-out's `unknown` write, sent while listening goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Marking {
    No,
    Sending { faulted: bool },
    Written,
}

/// A worker, and the step it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Worker {
    Idle,
    /// Its claim of `attempt` is being written.
    Claiming {
        attempt: u8,
        delivery: u8,
        faulted: bool,
    },
    /// It called the provider at `since` and listens; `reply` is what reached it.
    Listening {
        attempt: u8,
        delivery: u8,
        since: Tick,
        reply: Option<Reply>,
        marking: Marking,
    },
    /// It writes what `reply`, taken at `answered`, means.
    Writing {
        attempt: u8,
        delivery: u8,
        reply: Reply,
        answered: Tick,
        faulted: bool,
    },
    /// It wrote; what follows the write (the attempt it queued dispatched, the event armed) and the message's
    /// deletion are left.
    Wrote {
        attempt: u8,
    },
    /// It holds a reconciler's lookup of `attempt`: it reads the job, and asks the provider if it is still due.
    Asking {
        attempt: u8,
    },
    /// It writes what its lookup of `attempt`, at `asked`, learnt.
    Answering {
        attempt: u8,
        finding: Finding,
        asked: Tick,
        faulted: bool,
    },
}

/// What the provider did with an attempt's call, as far as it is settled: its record, which a lookup reads. Kept only
/// where a reconciler may ask; it is settled when the worker hears a definite reply, or when a lookup answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Work {
    /// No call was made.
    None,
    /// The call was made, at the tick it holds, and nobody knows yet what came of it: the provider may have done
    /// the work, or may still until [`ABSENT_AFTER`] from then.
    Running(Tick),
    /// The provider did the work: a result, or an answer that breaks the contract (paid either way).
    Done(Reply),
    /// The provider did not do the work, and will not (a 429, or a call it never ran).
    NotDone,
}

impl Work {
    /// Whether the provider did the work, or may still: the call is paid for in some run from here.
    pub(crate) fn maybe_paid(self) -> bool {
        matches!(self, Self::Running(_) | Self::Done(_))
    }
}

/// What a lookup learnt about an `unknown` attempt's call, and so will write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Finding {
    /// The provider's answer (a result, or one that breaks the contract): a late answer.
    Found(Reply),
    /// No record, taken as absence (once the call, as the engine counts it, cannot still be running): the work
    /// was not done, and the attempt is cleared and retried.
    Absent,
}

/// A reconciler (a sweeper process's), and the step it is in: the lookups it sends are the workers' to ask; a
/// clear by policy it writes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reconciler {
    Idle,
    /// It read the job, found `attempt` `unknown` past its lease and its policy's time come, and clears it.
    Clearing {
        attempt: u8,
        faulted: bool,
    },
}

/// The job's completion events as the store keeps them: the deliveries and the settle they were armed for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Events {
    pub deliveries: Deliveries,
    pub armed: String,
}

/// Faults still to inject; each is spent when it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Faults {
    /// A store write that fails before it lands, or lands and loses its answer.
    pub store: u8,
    /// An answer the API sent that never reaches its client.
    pub lost_answers: u8,
    /// A worker that dies mid-step.
    pub crashes: u8,
    /// A message the queue delivers twice.
    pub duplicates: u8,
    /// A message the queue does not take.
    pub lost_sends: u8,
    /// A delivery the owner's endpoint does not take.
    pub endpoint: u8,
    /// The owner cancels the job.
    pub cancels: u8,
    /// A person resolves an `unknown` attempt the reconciler would clear (one it would not is a person's anyway).
    pub resolves: u8,
}

impl Faults {
    pub(crate) const NONE: Self = Self {
        store: 0,
        lost_answers: 0,
        crashes: 0,
        duplicates: 0,
        lost_sends: 0,
        endpoint: 0,
        cancels: 0,
        resolves: 0,
    };
}

/// What happened, as the properties need it; no actor reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Ghost {
    /// Jobs the store made for the key.
    pub jobs_made: u8,
    /// 201s the API sent.
    pub created: u8,
    /// A request answered with a job whose payload was not its own.
    pub answered_foreign: bool,
    /// Some request gave up on the store (a 500).
    pub gave_up: bool,
    /// Provider calls per attempt (index: attempt number).
    pub calls: Vec<u8>,
    /// A call made for an attempt the caller had not claimed.
    pub unclaimed_call: bool,
    /// The first result to win, and the attempt it came from.
    pub winner: Option<(u32, Value)>,
    /// Answers a worker held that were neither written nor logged.
    pub dropped: BTreeSet<u8>,
    /// Answers a worker could not write, logged whole for an operator.
    pub logged: BTreeSet<u8>,
    /// Attempts whose provider answered definitely that the work failed or was not done.
    pub definite: BTreeSet<u8>,
    /// The outcomes the job settled to (its status, the result's attempt, and for a failure its attempts).
    pub settles: BTreeSet<(u8, u32, usize)>,
    /// Event ids the deliverer sent, and those the endpoint took.
    pub sent: BTreeSet<String>,
    pub delivered: BTreeSet<String>,
    /// How each attempt that left `unknown` did, as the write that moved it says (who wrote it, and what).
    pub left_unknown: BTreeMap<u8, ClearedBy>,
    /// Attempts a reconciler's write (a lookup's, a clear by policy) moved, and those whose answer a lookup found
    /// and wrote.
    pub reconciled: BTreeSet<u8>,
    pub found: BTreeSet<u8>,
    /// A worker heard an answer of an attempt a reconciler had moved already.
    pub raced: bool,
}

/// The whole world.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct World {
    pub now: Tick,
    /// The store's item for (owner, key).
    pub job: Option<Job>,
    pub events: Option<Events>,
    pub clients: [Client; 2],
    pub requests: Vec<Request>,
    /// Kept sorted: the queue has no order.
    pub queue: Vec<Message>,
    pub workers: [Worker; 2],
    /// How often each attempt's message was delivered (its steps' tokens).
    pub gens: Vec<u8>,
    /// `unknown` writes a step sent and stopped waiting for (it took an answer meanwhile): the store may still
    /// apply them, or never.
    pub strays: Vec<(u8, u8)>,
    pub faults: Faults,
    /// What the provider did with each attempt's call (index: attempt number); empty where nothing asks.
    pub work: Vec<Work>,
    pub reconcilers: Vec<Reconciler>,
    /// Attempts a reconciler sent a lookup of ([`crate::bugs::Bug::AskOnce`] only).
    pub asked_once: BTreeSet<u8>,
    pub ghost: Ghost,
}

/// States are told apart by a hash: the job and its events by their full text (neither is `Hash`: a JSON value).
impl Hash for World {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.now.hash(state);
        format!("{:?}{:?}", self.job, self.events).hash(state);
        self.clients.hash(state);
        self.requests.hash(state);
        self.queue.hash(state);
        self.workers.hash(state);
        self.gens.hash(state);
        self.strays.hash(state);
        self.faults.hash(state);
        self.work.hash(state);
        self.reconcilers.hash(state);
        self.asked_once.hash(state);
        self.ghost.hash(state);
    }
}

/// Attempt `n`'s number as the model keeps it.
pub(crate) fn number(n: u32) -> u8 {
    u8::try_from(n).expect("few attempts")
}

/// Queues a message for `attempt`, not to be delivered before `not_before`.
pub(crate) fn push(w: &mut World, attempt: u8, not_before: Tick) {
    w.queue.push(Message {
        attempt,
        not_before,
        held: None,
        look_up: false,
    });
    w.queue.sort();
}

/// Queues a reconciler's lookup of `attempt`.
pub(crate) fn push_look_up(w: &mut World, attempt: u8) {
    w.queue.push(Message {
        attempt,
        not_before: w.now,
        held: None,
        look_up: true,
    });
    w.queue.sort();
}
