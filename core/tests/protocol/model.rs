//! The protocol as a [`stateright::Model`]: every action any actor may take next, and what it does. Each write
//! goes through the store as the real stores apply it — a [`Transition`] of the domain under the writer's
//! [`Stamp`], on a copy of the job that replaces the stored one only if the domain accepted it — and may fail
//! before it lands or land and lose its answer, after which its writer tries it again under the same token.

use chrono::Duration;
use onejob_core::domain::event::{Due, event_id};
use onejob_core::domain::{
    Applied, AttemptState, Deliveries, Job, JobStatus, Refusal, SinkKind, Stamp, Transition,
};
use stateright::Model;

use crate::bugs::{Bug, settled_from_updated_at, slot_looks_free};
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
            ghost: Ghost {
                calls: vec![0; 12],
                ..Ghost::default()
            },
        }
    }

    pub(crate) fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
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
        let stored = w.job.as_mut().expect("writes follow the create");
        let mut job = stored.clone();
        if self.has(Bug::CompleteWithoutSwap)
            && let Transition::Complete { number, .. } = transition
        {
            slot_looks_free(&mut job, *number);
        }
        let stamp = Stamp::new(writer.token(), at(stamp_at));
        let applied = transition.apply(&mut job, &stamp);
        if applied.is_ok() {
            *stored = job;
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
        if let Some(job) = &w.job {
            for a in &job.attempts {
                if a.state == AttemptState::Unknown {
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
                since,
                reply,
                marking,
                ..
            } => {
                let late_over = w.now >= since + TIMEOUT + LATE;
                match reply {
                    None => {
                        actions.extend(Reply::ALL.iter().map(|r| Action::Reply(wk, *r)));
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
