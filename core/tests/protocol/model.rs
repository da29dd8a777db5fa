//! The protocol as a [`stateright::Model`]: every action any actor may take next, and what it does. Each write
//! goes through the store as the real stores apply it — a [`Transition`] of the domain under the writer's
//! [`Stamp`], on a copy of the job that replaces the stored one only if the domain accepted it — and may fail
//! before it lands or land and lose its answer, after which its writer tries it again under the same token.

use chrono::Duration;
use onejob_core::domain::event::{Due, event_id};
use onejob_core::domain::{
    Applied, AttemptState, ClearedBy, Deliveries, Job, JobStatus, ProviderName, Refusal, SinkKind,
    Stamp, Transition,
};
use stateright::Model;

use crate::bugs::{Bug, found_over_slot, settled_from_updated_at, slot_looks_free};
use crate::properties::outcome;
use crate::world::*;

/// Which half of the protocol a model explores: the two meet at the stored job and its first message, and checking
/// them apart keeps each one's states within what a test can explore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// Two clients create under one key through the API and its store; nobody works the job.
    Intake,
    /// The job was made and its first message sent (or lost on the way): the workers, the sweeper, the providers,
    /// the deliverer and a person take it from there.
    Attempts,
}

/// The model: which half, which faults may happen and how often, how far the clock may go, and which bug (if
/// any) is in.
#[derive(Debug, Clone)]
pub(crate) struct Protocol {
    pub scenario: Scenario,
    /// Both clients send the same payload (a double click); else the second sends another under the same key.
    pub agree: bool,
    pub faults: Faults,
    /// The clock stops here: a run that reaches it is cut, not judged for liveness.
    pub max_clock: Tick,
    /// Runs are explored to this many steps (`None`: to their end); a run cut short is not judged for liveness.
    pub max_depth: Option<usize>,
    /// Reconcilers (the sweeps of `engine/reconcile.rs`, clearing `unknown` attempts) running at once: none, one,
    /// or two on the same job at the same moment — and as many of their lookups of one attempt in the queue.
    pub reconcilers: u8,
    /// What clears an `unknown` attempt of each provider of [`CHAIN`], where a reconciler runs.
    pub clears: [Clears; 3],
    pub bug: Option<Bug>,
}

/// One step of one actor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// Client `c` sends its create (again, after a lost answer or a 500).
    Send(u8),
    /// The API's create of request `i` meets the store.
    Create(u8, Fate),
    /// The API's tries ran out while the store failed: a 500.
    GiveUp(u8),
    /// The API sends attempt 1's message for request `i` (`true`: the queue does not take it).
    Dispatch(u8, bool),
    /// The API answers request `i` (`true`: the answer is lost on the way).
    Answer(u8, bool),
    /// Worker `w` receives message `m`.
    Receive(u8, u8),
    /// The queue delivers message `m` twice.
    Duplicate(u8),
    /// Worker `w`'s claim meets the store.
    Claim(u8, Fate),
    /// The provider's reply reaches worker `w`.
    Reply(u8, Reply),
    /// Worker `w` heard nothing in time: its `unknown` write goes out while it listens on.
    TimeOut(u8),
    /// Worker `w`'s `unknown` write meets the store.
    Mark(u8, Fate),
    /// Worker `w` takes the reply it heard.
    Take(u8),
    /// Worker `w`'s late window ends.
    StopListening(u8),
    /// Worker `w`'s write of its answer meets the store.
    Write(u8, Fate),
    /// Worker `w` gives up a write the store keeps failing (its time is out): an answer is logged whole, the
    /// message is left to come back.
    Abandon(u8),
    /// Worker `w` does what follows its write and deletes its message (`true`: arming the event fails, and the step
    /// fails with it).
    FollowUp(u8, bool),
    /// Worker `w` dies.
    Crash(u8),
    /// A write left in flight lands.
    Stray(u8),
    /// The sweeper makes a `started` attempt past its lease `unknown`.
    ExpireLease(u8),
    /// The sweeper sends a `queued` attempt nobody claimed again (`true`: the queue does not take it).
    Redispatch(u8, bool),
    /// The deliverer looks at the job's events (`true`: the endpoint fails the delivery).
    Deliver(bool),
    /// A person resolves an `unknown` attempt by cancelling it.
    Resolve(u8),
    /// The owner cancels the job.
    CancelJob,
    /// A reconciler's sweep finds the job's attempt `unknown` past its lease, its provider one that can be asked,
    /// and sends a lookup of it for a worker to ask (`true`: the queue does not take it).
    AskAbout(bool),
    /// Worker `w`, holding a lookup, reads the job and asks the provider (never calls it): what it learnt. `None`:
    /// nothing to write — the attempt is no longer due to be asked about, the provider has no record yet (the call
    /// may still run), or the lookup failed; the message is done with, and the next sweep asks again.
    Ask(u8, Option<Finding>),
    /// Worker `w`'s write of what its lookup learnt meets the store.
    WriteFound(u8, Fate),
    /// Reconciler `r` reads the job and, its attempt `unknown` past its lease and its policy's time, clears it.
    ClearByPolicy(u8),
    /// Reconciler `r`'s clear meets the store.
    Cleared(u8, Fate),
    /// Reconciler `r` gives up a clear the store keeps failing: the next sweep reads the job again.
    Unreconciled(u8),
    /// The clock moves to the next moment something is due.
    Tick,
}

impl Protocol {
    /// The worlds the model starts from: before anything happened, or (attempts) once the job was made, its
    /// first message queued or lost.
    pub(crate) fn starts(&self) -> Vec<World> {
        let blank = self.blank();
        if self.scenario == Scenario::Intake {
            return vec![blank];
        }
        let mut made = blank;
        let stamp = Stamp::new(Writer::Request { client: 0, n: 1 }.token(), at(0));
        made.job = Some(Job::new(intent(0, true), Duration::days(30), &stamp));
        made.ghost.jobs_made = 1;
        made.ghost.created = 1;
        made.clients[0].answer = Some(Answer::Created);
        made.clients[1].answer = Some(Answer::Replayed);
        let mut lost = made.clone();
        push(&mut made, 1, 0);
        if lost.faults.lost_sends == 0 {
            return vec![made];
        }
        lost.faults.lost_sends -= 1;
        vec![made, lost]
    }

    fn blank(&self) -> World {
        let idle = Client {
            sent: 0,
            waiting: false,
            answer: None,
        };
        World {
            now: 0,
            job: None,
            events: None,
            clients: [idle.clone(), idle],
            requests: Vec::new(),
            queue: Vec::new(),
            workers: [Worker::Idle; 2],
            gens: vec![0; 12],
            strays: Vec::new(),
            faults: self.faults,
            work: if self.reconciling() {
                vec![Work::None; 12]
            } else {
                Vec::new()
            },
            reconcilers: vec![Reconciler::Idle; usize::from(self.reconcilers)],
            asked_once: Default::default(),
            ghost: Ghost {
                calls: vec![0; 12],
                ..Ghost::default()
            },
        }
    }

    pub(crate) fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// Whether a reconciler runs: the provider's record of each call is kept, for it to ask.
    pub(crate) fn reconciling(&self) -> bool {
        self.reconcilers > 0
    }

    /// What clears an `unknown` attempt of `provider`: a person, unless a reconciler runs and the provider can be
    /// asked or has a policy.
    pub(crate) fn clears(&self, provider: &ProviderName) -> Clears {
        match CHAIN.iter().position(|p| *p == provider.as_str()) {
            Some(i) if self.reconciling() => self.clears[i],
            _ => Clears::Hold,
        }
    }

    /// The job as the deliverer and the arming see it.
    pub(crate) fn seen(&self, job: &Job) -> Job {
        if self.has(Bug::SettleFromUpdatedAt) {
            settled_from_updated_at(job)
        } else {
            job.clone()
        }
    }

    pub(crate) fn failover(&self) -> onejob_core::domain::Failover {
        let mut failover = failover();
        if self.has(Bug::FailoverUnqualified) {
            failover.qualified = CHAIN.map(provider).into();
        }
        failover
    }

    /// Every moment after now at which something becomes due.
    pub(crate) fn deadlines(&self, w: &World) -> Vec<Tick> {
        let mut due = Vec::new();
        for worker in &w.workers {
            if let Worker::Listening {
                since,
                reply: None,
                marking,
                ..
            } = *worker
            {
                if marking == Marking::No {
                    due.push(since + TIMEOUT);
                }
                due.push(since + TIMEOUT + LATE);
            }
        }
        if let Some(job) = &w.job {
            for a in &job.attempts {
                match a.state {
                    AttemptState::Started => due.extend(a.lease_expires_at.map(tick_of)),
                    // The moments a reconciler may act on it: its lease's end, and its lookup's or policy's time.
                    AttemptState::Unknown if self.reconciling() => {
                        due.extend(a.lease_expires_at.map(tick_of));
                        let start = call_start(a);
                        match self.clears(&a.provider) {
                            Clears::Asked => due.push(start + ABSENT_AFTER),
                            Clears::Policy => due.push(start + TIMEOUT + POLICY_AFTER),
                            Clears::Hold => {}
                        }
                    }
                    AttemptState::Queued
                        if !self.has(Bug::NoRedispatch)
                            && !w.queue.iter().any(|m| u32::from(m.attempt) == a.number) =>
                    {
                        due.push(tick_of(a.dispatched_at) + REDISPATCH_AFTER)
                    }
                    _ => {}
                }
            }
        }
        due.extend(w.queue.iter().map(|m| m.not_before));
        if let Some(events) = &w.events {
            due.extend(events.deliveries.due_at.map(tick_of));
        }
        due.retain(|t| *t > w.now);
        due
    }

    /// A write at the store: `None` when its writer heard no answer (it failed before landing, or landed and
    /// its answer was lost), else what the domain said.
    pub(crate) fn write(
        &self,
        w: &mut World,
        transition: &Transition,
        writer: Writer,
        fate: Fate,
        stamp_at: Tick,
    ) -> Option<Result<Applied, Refusal>> {
        if fate != Fate::Lands {
            w.faults.store -= 1;
        }
        if fate == Fate::FailsBefore {
            return None;
        }
        let mut job = w.job.clone().expect("writes follow the create");
        let found = matches!(writer, Writer::Lookup { found: true, .. });
        if let Transition::Complete { number, .. } = transition {
            if self.has(Bug::CompleteWithoutSwap) {
                slot_looks_free(&mut job, *number);
            }
            if found && self.has(Bug::FoundWithoutSwap) {
                found_over_slot(&mut job, *number);
            }
        }
        let mut stamp = Stamp::new(writer.token(), at(stamp_at));
        if found && !self.has(Bug::FoundUnmarked) {
            stamp = stamp.looked_up();
        }
        let unknown: Vec<u32> = (job.attempts.iter())
            .filter(|a| a.state == AttemptState::Unknown)
            .map(|a| a.number)
            .collect();
        let applied = transition.apply(&mut job, &stamp);
        if applied.is_ok() {
            for n in unknown {
                if job
                    .attempt(n)
                    .is_some_and(|a| a.state != AttemptState::Unknown)
                {
                    (w.ghost.left_unknown).insert(number(n), leaves_unknown_by(transition, writer));
                }
            }
            w.job = Some(job);
        }
        (fate == Fate::Lands).then_some(applied)
    }

    /// What follows a write that may have ended the job: its event armed for the settle, if it has one.
    pub(crate) fn arm(&self, w: &mut World) {
        let Some(job) = w.job.as_ref().map(|j| self.seen(j)) else {
            return;
        };
        let Some(settles_at) = job.settles_at() else {
            return;
        };
        let id = event_id(&job, settles_at);
        match &mut w.events {
            None => {
                w.events = Some(Events {
                    deliveries: Deliveries::new(&job, settles_at),
                    armed: id,
                });
            }
            Some(events) if events.armed != id => {
                events.deliveries.due_at = Some(settles_at);
                events.armed = id;
            }
            Some(_) => {}
        }
    }

    /// Sends the job's `queued` attempt, as the write that queued it is followed up.
    pub(crate) fn dispatch_queued(&self, w: &mut World) {
        let Some(job) = &w.job else { return };
        if let Some(a) = job
            .live_attempt()
            .filter(|a| a.state == AttemptState::Queued)
        {
            let not_before = a.not_before.map_or(w.now, tick_of);
            push(w, number(a.number), not_before);
        }
    }

    /// The message worker `wk` holds, deleted (`ack`) or made visible again for another delivery.
    pub(crate) fn release(w: &mut World, wk: u8, ack: bool) {
        if let Some(i) = w.queue.iter().position(|m| m.held == Some(wk)) {
            if ack {
                w.queue.remove(i);
            } else {
                w.queue[i].held = None;
                w.queue.sort();
            }
        }
        w.workers[usize::from(wk)] = Worker::Idle;
    }

    pub(crate) fn fates(w: &World) -> &'static [Fate] {
        if w.faults.store > 0 {
            &[Fate::Lands, Fate::FailsBefore, Fate::AnswerLost]
        } else {
            &[Fate::Lands]
        }
    }
}

impl Model for Protocol {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        self.starts()
    }

    fn actions(&self, w: &World, actions: &mut Vec<Action>) {
        let fates = Self::fates(w);
        for (c, client) in (0u8..).zip(&w.clients) {
            if !client.waiting && client.answer.is_none() {
                actions.push(Action::Send(c));
            }
        }
        for (i, r) in (0u8..).zip(&w.requests) {
            match r.phase {
                Phase::Writing => {
                    actions.extend(fates.iter().map(|f| Action::Create(i, *f)));
                    if r.faulted {
                        actions.push(Action::GiveUp(i));
                    }
                }
                Phase::Dispatching => {
                    actions.push(Action::Dispatch(i, false));
                    if w.faults.lost_sends > 0 {
                        actions.push(Action::Dispatch(i, true));
                    }
                }
                Phase::Answering(_) => {
                    actions.push(Action::Answer(i, false));
                    if w.faults.lost_answers > 0 {
                        actions.push(Action::Answer(i, true));
                    }
                }
            }
        }
        if self.scenario == Scenario::Intake {
            return;
        }
        // The workers are alike (a step's token is its delivery's, not its worker's): the first idle one stands
        // for either, and of equal messages the first for all.
        let idle = (0u8..).zip(&w.workers).find(|(_, wk)| **wk == Worker::Idle);
        for (m, message) in (0u8..).zip(&w.queue) {
            let first = w.queue.iter().position(|o| o == message) == Some(usize::from(m));
            if !first || message.held.is_some() {
                continue;
            }
            if let Some((wk, _)) = idle
                && message.not_before <= w.now
            {
                actions.push(Action::Receive(wk, m));
            }
            if w.faults.duplicates > 0 {
                actions.push(Action::Duplicate(m));
            }
        }
        for (wk, worker) in (0u8..).zip(&w.workers) {
            self.worker_actions(w, wk, *worker, fates, actions);
        }
        actions.extend((0u8..).take(w.strays.len()).map(Action::Stray));
        self.sweeper_actions(w, actions);
        self.reconciler_actions(w, fates, actions);
        if let Some(job) = &w.job {
            for a in &job.attempts {
                // A person resolves what the reconciler would not; what it would, only as a fault (a race).
                let person = self.clears(&a.provider) == Clears::Hold;
                if a.state == AttemptState::Unknown && (person || w.faults.resolves > 0) {
                    actions.push(Action::Resolve(number(a.number)));
                }
            }
            if w.faults.cancels > 0
                && !matches!(job.status(), JobStatus::Succeeded | JobStatus::Cancelled)
            {
                actions.push(Action::CancelJob);
            }
        }
        if w.now < self.max_clock && !self.deadlines(w).is_empty() {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut w = last.clone();
        self.apply(&mut w, action);
        if let Some(job) = &w.job {
            if w.ghost.winner.is_none()
                && let (Some(n), Some(result)) = (job.completed_by, &job.result)
            {
                w.ghost.winner = Some((n, result.clone()));
            }
            if job.is_settled(at(w.now)) {
                w.ghost.settles.insert(outcome(job));
            }
        }
        Some(w)
    }

    fn properties(&self) -> Vec<stateright::Property<Self>> {
        crate::properties::all()
    }
}

impl Protocol {
    fn worker_actions(
        &self,
        w: &World,
        wk: u8,
        worker: Worker,
        fates: &[Fate],
        actions: &mut Vec<Action>,
    ) {
        match worker {
            Worker::Idle => return,
            Worker::Claiming { faulted, .. } | Worker::Writing { faulted, .. } => {
                if matches!(worker, Worker::Claiming { .. }) {
                    actions.extend(fates.iter().map(|f| Action::Claim(wk, *f)));
                } else {
                    actions.extend(fates.iter().map(|f| Action::Write(wk, *f)));
                }
                if faulted {
                    actions.push(Action::Abandon(wk));
                }
            }
            Worker::Listening {
                attempt,
                since,
                reply,
                marking,
                ..
            } => {
                let late_over = w.now >= since + TIMEOUT + LATE;
                // Where a reconciler runs, the late window is kept to the tick (as in the worker, where it is a
                // timer): nothing is heard after it, whatever the clock did meanwhile. The provider's reply is one
                // that agrees with what a lookup said of the call.
                let heard = !(self.reconciling() && w.now > since + TIMEOUT + LATE);
                match reply {
                    None => {
                        if heard {
                            let agrees = |r: &&Reply| agrees(w.work.get(usize::from(attempt)), **r);
                            actions.extend(
                                Reply::ALL
                                    .iter()
                                    .filter(agrees)
                                    .map(|r| Action::Reply(wk, *r)),
                            );
                        }
                        if marking == Marking::No && w.now >= since + TIMEOUT {
                            actions.push(Action::TimeOut(wk));
                        }
                    }
                    Some(_) => actions.push(Action::Take(wk)),
                }
                if let Marking::Sending { .. } = marking {
                    actions.extend(fates.iter().map(|f| Action::Mark(wk, *f)));
                }
                let may_stop = matches!(
                    marking,
                    Marking::Written | Marking::Sending { faulted: true }
                );
                if late_over && may_stop && (reply.is_none() || self.has(Bug::UnbiasedLateWindow)) {
                    actions.push(Action::StopListening(wk));
                }
            }
            Worker::Asking { attempt } => self.ask_actions(w, wk, attempt, actions),
            Worker::Answering { faulted, .. } => {
                actions.extend(fates.iter().map(|f| Action::WriteFound(wk, *f)));
                if faulted {
                    actions.push(Action::Abandon(wk));
                }
            }
            Worker::Wrote { .. } => {
                actions.push(Action::FollowUp(wk, false));
                if w.faults.store > 0 {
                    actions.push(Action::FollowUp(wk, true));
                }
            }
        }
        if w.faults.crashes > 0 {
            actions.push(Action::Crash(wk));
        }
    }

    /// The reconcilers' steps: a clear in flight meets the store (or is given up after a fault); an idle
    /// reconciler (the first stands for either: they are alike) reads the job and acts on its `unknown` attempt once
    /// no worker can hear its answer (its lease ended): sends a lookup of it to the workers (while fewer are in the
    /// queue than reconcilers sweep), or clears it by its provider's policy.
    fn reconciler_actions(&self, w: &World, fates: &[Fate], actions: &mut Vec<Action>) {
        for (r, reconciler) in (0u8..).zip(&w.reconcilers) {
            if let Reconciler::Clearing { faulted, .. } = *reconciler {
                actions.extend(fates.iter().map(|f| Action::Cleared(r, *f)));
                if faulted {
                    actions.push(Action::Unreconciled(r));
                }
            }
        }
        let Some(a) = (w.job.iter())
            .flat_map(|job| &job.attempts)
            .find(|a| a.state == AttemptState::Unknown)
        else {
            return;
        };
        if !self.due(a, w.now) {
            return;
        }
        let n = number(a.number);
        match self.clears(&a.provider) {
            Clears::Hold => {}
            Clears::Policy => {
                let idle = (0u8..)
                    .zip(&w.reconcilers)
                    .find_map(|(r, x)| (*x == Reconciler::Idle).then_some(r));
                if let Some(r) = idle
                    && w.now >= call_start(a) + TIMEOUT + POLICY_AFTER
                {
                    actions.push(Action::ClearByPolicy(r));
                }
            }
            Clears::Asked => {
                let sent = (w.queue.iter())
                    .filter(|m| m.look_up && m.attempt == n)
                    .count();
                if sent < usize::from(self.reconcilers) && !w.asked_once.contains(&n) {
                    actions.push(Action::AskAbout(false));
                    if w.faults.lost_sends > 0 {
                        actions.push(Action::AskAbout(true));
                    }
                }
            }
        }
    }

    /// Whether the reconciler may act on `unknown` attempt `a` at `now`: once its lease ended (no worker can still
    /// hear its answer), or at once ([`Bug::BeforeLease`]).
    pub(crate) fn due(&self, a: &onejob_core::domain::Attempt, now: Tick) -> bool {
        a.lease_expires_at.is_none_or(|end| end <= at(now)) || self.has(Bug::BeforeLease)
    }

    /// What worker `wk`'s lookup of `attempt` may learn, on the job as it reads it now: nothing (always: the lookup
    /// may fail); for an attempt still `unknown` and due, the provider's answer if it did the work or may have by
    /// now, and its word that it has no record — taken as absence once the call, as the engine counts it (from its
    /// claim, `started_at`), cannot still be running.
    fn ask_actions(&self, w: &World, wk: u8, attempt: u8, actions: &mut Vec<Action>) {
        actions.push(Action::Ask(wk, None));
        let Some(a) = (w.job.as_ref())
            .and_then(|j| j.attempt(u32::from(attempt)))
            .filter(|a| a.state == AttemptState::Unknown && self.due(a, w.now))
        else {
            return;
        };
        let absent = w.now >= call_start(a) + ABSENT_AFTER;
        let found = |x| Action::Ask(wk, Some(Finding::Found(x)));
        match w.work[usize::from(attempt)] {
            Work::Done(reply) => actions.push(found(reply)),
            // The provider did the work by now (its answer is found), or not yet, or never.
            Work::Running(_) => actions.extend([Reply::Result, Reply::Broken].map(found)),
            Work::None | Work::NotDone => {}
        }
        if !matches!(w.work[usize::from(attempt)], Work::Done(_))
            && (absent || self.has(Bug::AbsenceTooEarly))
        {
            actions.push(Action::Ask(wk, Some(Finding::Absent)));
        }
    }

    fn sweeper_actions(&self, w: &World, actions: &mut Vec<Action>) {
        let now = at(w.now);
        if let Some(job) = &w.job {
            let open = !matches!(job.status(), JobStatus::Succeeded | JobStatus::Cancelled);
            for a in &job.attempts {
                let n = number(a.number);
                match a.state {
                    AttemptState::Started if a.lease_expires_at.is_some_and(|end| end <= now) => {
                        actions.push(Action::ExpireLease(n));
                    }
                    // Only a message that is gone is sent again: a slow queue's second message is the
                    // duplicate fault's.
                    AttemptState::Queued
                        if open
                            && !self.has(Bug::NoRedispatch)
                            && !w.queue.iter().any(|m| m.attempt == n)
                            && tick_of(a.dispatched_at) + REDISPATCH_AFTER <= w.now =>
                    {
                        actions.push(Action::Redispatch(n, false));
                        if w.faults.lost_sends > 0 {
                            actions.push(Action::Redispatch(n, true));
                        }
                    }
                    _ => {}
                }
            }
            if let Some(events) = &w.events
                && events.deliveries.due_at.is_some_and(|t| t <= now)
            {
                actions.push(Action::Deliver(false));
                let due = events
                    .deliveries
                    .due(&self.seen(job), now, &[SinkKind::Endpoint]);
                if w.faults.endpoint > 0 && matches!(due, Due::Deliver(_)) {
                    actions.push(Action::Deliver(true));
                }
            }
        }
    }
}

/// When attempt `a`'s call started (its claim), or at the latest could have: what the reconciler counts from.
pub(crate) fn call_start(a: &onejob_core::domain::Attempt) -> Tick {
    tick_of(a.started_at.unwrap_or(a.created_at))
}

/// Whether a provider's `reply` to a call agrees with what is settled of its work: a lookup that found an answer
/// found the one the worker hears (or the connection is lost), and no record means no work.
pub(crate) fn agrees(work: Option<&Work>, reply: Reply) -> bool {
    match work {
        Some(Work::Done(done)) => reply == *done || reply == Reply::Lost,
        Some(Work::NotDone) => matches!(reply, Reply::RateLimited | Reply::Lost),
        _ => true,
    }
}

/// How an attempt that `transition`, written by `writer`, moves out of `unknown` must say it left: the answer a
/// worker heard (late), or one a lookup found, a clear's own `by`, or a person.
fn leaves_unknown_by(transition: &Transition, writer: Writer) -> ClearedBy {
    match (transition, writer) {
        (Transition::ClearUnknown { by, .. }, _) => *by,
        (Transition::CancelAttempt { .. } | Transition::CancelJob, _) => ClearedBy::Person,
        (_, Writer::Lookup { found: true, .. }) => ClearedBy::Lookup,
        _ => ClearedBy::LateAnswer,
    }
}
