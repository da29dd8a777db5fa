//! What each action does to the world: the API's create, the worker's claim, time-out and write, the sweeper's and
//! a person's writes, the deliverer — each write through [`Protocol::write`], as the stores apply it.

use chrono::Duration;
use onejob_core::domain::event::Due;
use onejob_core::domain::{
    Applied, AttemptState, CallReport, ClearedBy, ErrorInfo, Job, Refusal, SinkKind, Stamp,
    Transition,
};
use serde_json::json;

use crate::bugs::Bug;
use crate::model::{Action, Protocol};
use crate::world::*;

impl Protocol {
    /// Does `action` to `w`.
    pub(crate) fn apply(&self, w: &mut World, action: Action) {
        match action {
            Action::Send(c) => {
                let client = &mut w.clients[usize::from(c)];
                client.sent += 1;
                client.waiting = true;
                w.requests.push(Request {
                    client: c,
                    n: client.sent,
                    phase: Phase::Writing,
                    faulted: false,
                });
            }
            Action::Create(i, fate) => self.create(w, usize::from(i), fate),
            Action::GiveUp(i) => {
                w.requests[usize::from(i)].phase = Phase::Answering(Answer::Unavailable);
                w.ghost.gave_up = true;
            }
            Action::Dispatch(i, lost) => {
                if lost {
                    w.faults.lost_sends -= 1;
                } else {
                    push(w, 1, w.now);
                }
                w.requests[usize::from(i)].phase = Phase::Answering(Answer::Created);
            }
            Action::Answer(i, lost) => {
                let request = w.requests.remove(usize::from(i));
                let Phase::Answering(answer) = request.phase else {
                    unreachable!("answering")
                };
                if answer == Answer::Created {
                    w.ghost.created += 1;
                }
                let client = &mut w.clients[usize::from(request.client)];
                client.waiting = false;
                if lost {
                    w.faults.lost_answers -= 1;
                } else if answer != Answer::Unavailable {
                    client.answer = Some(answer);
                }
            }
            Action::Receive(wk, m) => {
                let message = &mut w.queue[usize::from(m)];
                message.held = Some(wk);
                let (attempt, look_up) = (message.attempt, message.look_up);
                w.queue.sort();
                if look_up {
                    w.workers[usize::from(wk)] = Worker::Asking { attempt };
                    return;
                }
                let delivery = &mut w.gens[usize::from(attempt)];
                *delivery += 1;
                w.workers[usize::from(wk)] = Worker::Claiming {
                    attempt,
                    delivery: *delivery,
                    faulted: false,
                };
            }
            Action::Duplicate(m) => {
                w.faults.duplicates -= 1;
                let again = w.queue[usize::from(m)].clone();
                push(w, again.attempt, again.not_before);
            }
            Action::Claim(wk, fate) => self.claim(w, wk, fate),
            Action::Reply(wk, reply) => {
                if let Worker::Listening {
                    attempt,
                    reply: heard,
                    ..
                } = &mut w.workers[usize::from(wk)]
                {
                    *heard = Some(reply);
                    let attempt = *attempt;
                    w.ghost.raced |= reply != Reply::Lost && w.ghost.reconciled.contains(&attempt);
                    if let Some(work) = w.work.get_mut(usize::from(attempt)) {
                        match reply {
                            Reply::Result | Reply::Broken => *work = Work::Done(reply),
                            Reply::RateLimited => *work = Work::NotDone,
                            Reply::Lost => {}
                        }
                    }
                }
                // A ready answer is taken before any timer (invariant 16): nothing the worker does comes
                // between, and a time-out write in flight goes on as a stray. Only the broken race holds it.
                if !self.has(Bug::UnbiasedLateWindow) {
                    self.apply(w, Action::Take(wk));
                }
            }
            Action::TimeOut(wk) => {
                if let Worker::Listening { marking, .. } = &mut w.workers[usize::from(wk)] {
                    *marking = Marking::Sending { faulted: false };
                }
            }
            Action::Mark(wk, fate) => self.mark(w, wk, fate),
            Action::Take(wk) => {
                let Worker::Listening {
                    attempt,
                    delivery,
                    reply: Some(reply),
                    marking,
                    ..
                } = w.workers[usize::from(wk)]
                else {
                    unreachable!("a reply to take")
                };
                if let Marking::Sending { .. } = marking {
                    w.strays.push((attempt, delivery));
                }
                if matches!(reply, Reply::RateLimited | Reply::Broken) {
                    w.ghost.definite.insert(attempt);
                }
                w.workers[usize::from(wk)] = Worker::Writing {
                    attempt,
                    delivery,
                    reply,
                    answered: w.now,
                    faulted: false,
                };
            }
            Action::StopListening(wk) => {
                let Worker::Listening {
                    attempt,
                    reply,
                    marking,
                    ..
                } = w.workers[usize::from(wk)]
                else {
                    unreachable!("listening")
                };
                if reply.is_some_and(|r| r != Reply::Lost) {
                    w.ghost.dropped.insert(attempt);
                }
                if marking == Marking::Written {
                    w.workers[usize::from(wk)] = Worker::Wrote { attempt };
                } else {
                    Self::release(w, wk, false);
                }
            }
            Action::Write(wk, fate) => self.write_answer(w, wk, fate),
            Action::Abandon(wk) => {
                match w.workers[usize::from(wk)] {
                    Worker::Writing { attempt, reply, .. }
                    | Worker::Answering {
                        attempt,
                        finding: Finding::Found(reply),
                        ..
                    } if reply != Reply::Lost => {
                        w.ghost.logged.insert(attempt);
                    }
                    _ => {}
                }
                Self::release(w, wk, false);
            }
            Action::FollowUp(wk, arm_fails) => {
                self.dispatch_queued(w);
                if arm_fails {
                    w.faults.store -= 1;
                    Self::release(w, wk, false);
                } else {
                    self.arm(w);
                    Self::release(w, wk, true);
                }
            }
            Action::Crash(wk) => {
                w.faults.crashes -= 1;
                Self::release(w, wk, false);
            }
            Action::Stray(i) => {
                let (attempt, delivery) = w.strays.remove(usize::from(i));
                let marked = Transition::MarkUnknown {
                    number: u32::from(attempt),
                    call_id: None,
                };
                let now = w.now;
                self.write(
                    w,
                    &marked,
                    Writer::Step { attempt, delivery },
                    Fate::Lands,
                    now,
                );
                self.arm(w);
            }
            Action::ExpireLease(n) => {
                let marked = Transition::MarkUnknown {
                    number: u32::from(n),
                    call_id: None,
                };
                let now = w.now;
                self.write(w, &marked, Writer::Sweeper { attempt: n }, Fate::Lands, now);
                self.arm(w);
            }
            Action::Redispatch(n, lost) => {
                let again = Transition::Redispatch {
                    number: u32::from(n),
                };
                let now = w.now;
                self.write(w, &again, Writer::Sweeper { attempt: n }, Fate::Lands, now);
                if lost {
                    w.faults.lost_sends -= 1;
                } else {
                    push(w, n, now);
                }
            }
            Action::Deliver(fails) => self.deliver(w, fails),
            Action::Resolve(n) => {
                let job = w.job.as_ref().expect("a job");
                let provider = &job.attempt(u32::from(n)).expect("the attempt").provider;
                if self.clears(provider) != Clears::Hold {
                    w.faults.resolves -= 1;
                }
                let cancel = Transition::CancelAttempt {
                    number: u32::from(n),
                    failover: self.failover(),
                };
                let now = w.now;
                self.write(w, &cancel, Writer::Person { attempt: n }, Fate::Lands, now);
                self.dispatch_queued(w);
                self.arm(w);
            }
            Action::CancelJob => {
                w.faults.cancels -= 1;
                let now = w.now;
                self.write(
                    w,
                    &Transition::CancelJob,
                    Writer::Person { attempt: 0 },
                    Fate::Lands,
                    now,
                );
                self.arm(w);
            }
            Action::AskAbout(lost) => {
                let job = w.job.as_ref().expect("a job");
                let a = (job.attempts.iter()).find(|a| a.state == AttemptState::Unknown);
                let n = number(a.expect("an unknown attempt").number);
                if self.has(Bug::AskOnce) {
                    w.asked_once.insert(n);
                }
                if lost {
                    w.faults.lost_sends -= 1;
                } else {
                    push_look_up(w, n);
                }
            }
            Action::Ask(wk, finding) => self.ask(w, wk, finding),
            Action::WriteFound(wk, fate) => self.write_found(w, wk, fate),
            Action::ClearByPolicy(r) => {
                let job = w.job.as_ref().expect("a job");
                let a = (job.attempts.iter()).find(|a| a.state == AttemptState::Unknown);
                w.reconcilers[usize::from(r)] = Reconciler::Clearing {
                    attempt: number(a.expect("an unknown attempt").number),
                    faulted: false,
                };
            }
            Action::Cleared(r, fate) => self.clear_by_policy(w, r, fate),
            Action::Unreconciled(r) => {
                if !self.has(Bug::UnarmedAfterReconciler) {
                    self.arm(w);
                }
                w.reconcilers[usize::from(r)] = Reconciler::Idle;
            }
            Action::Tick => {
                w.now = self.deadlines(w).into_iter().min().expect("something due");
            }
        }
    }

    fn create(&self, w: &mut World, i: usize, fate: Fate) {
        let (client, n) = (w.requests[i].client, w.requests[i].n);
        if fate != Fate::Lands {
            w.faults.store -= 1;
            w.requests[i].faulted = true;
        }
        if fate == Fate::FailsBefore {
            return;
        }
        let token = Writer::Request { client, n }.token();
        let new = intent(client, self.agree);
        let fingerprint = new.fingerprint;
        let make = |w: &mut World, new| {
            let stamp = Stamp::new(token.clone(), at(w.now));
            w.job = Some(Job::new(new, Duration::days(30), &stamp));
            w.ghost.jobs_made += 1;
            Answer::Created
        };
        let answer = match &w.job {
            Some(job)
                if job.created_by(&token)
                    && !(self.has(Bug::RepeatWithoutToken) && w.requests[i].faulted) =>
            {
                Answer::Created
            }
            Some(_) if self.has(Bug::UnconditionalCreate) => make(w, new),
            None => make(w, new),
            Some(job) if job.fingerprint != fingerprint => {
                if self.has(Bug::ConflictAnswered) {
                    Answer::Replayed
                } else {
                    Answer::Conflict
                }
            }
            Some(_) if self.has(Bug::ReplayAnswersCreated) => Answer::Created,
            Some(_) => Answer::Replayed,
        };
        if fate == Fate::AnswerLost {
            return;
        }
        let job = w.job.as_ref().expect("a job is there");
        if answer != Answer::Conflict && job.fingerprint != fingerprint {
            w.ghost.answered_foreign = true;
        }
        w.requests[i].phase = if answer == Answer::Created {
            Phase::Dispatching
        } else {
            Phase::Answering(answer)
        };
    }

    fn claim(&self, w: &mut World, wk: u8, fate: Fate) {
        let Worker::Claiming {
            attempt, delivery, ..
        } = w.workers[usize::from(wk)]
        else {
            unreachable!("claiming")
        };
        let writer = Writer::Step { attempt, delivery };
        let number = u32::from(attempt);
        let taken = w
            .job
            .as_ref()
            .and_then(|j| j.attempt(number))
            .map(|a| a.state);
        let claim = Transition::Claim {
            number,
            lease_expires_at: at(w.now + LEASE),
        };
        let now = w.now;
        let claimed = if self.has(Bug::ClaimWithoutToken) && taken == Some(AttemptState::Started) {
            if fate != Fate::Lands {
                w.faults.store -= 1;
            }
            (fate == Fate::Lands).then_some(Ok(Applied::Claimed))
        } else {
            self.write(w, &claim, writer, fate, now)
        };
        match claimed {
            None => {
                w.workers[usize::from(wk)] = Worker::Claiming {
                    attempt,
                    delivery,
                    faulted: true,
                };
            }
            Some(Ok(_)) => {
                // A claim that took so long that the call's window would outlast its lease (a repeat that found
                // itself keeps the first try's lease): where a reconciler runs, it is not called, and the lease runs
                // out on no call (the product's `too_late_to_call`).
                let leased = (w.job.as_ref())
                    .and_then(|j| j.attempt(number))
                    .and_then(|a| a.lease_expires_at)
                    .map_or(Tick::MAX, tick_of);
                if self.reconciling()
                    && !self.has(Bug::ListensPastLease)
                    && w.now + TIMEOUT + LATE > leased
                {
                    return Self::release(w, wk, true);
                }
                let mine = w
                    .job
                    .as_ref()
                    .and_then(|j| j.attempt(number))
                    .is_some_and(|a| {
                        a.state == AttemptState::Started && a.writer == Some(writer.token())
                    });
                w.ghost.unclaimed_call |= !mine;
                w.ghost.calls[usize::from(attempt)] += 1;
                if let Some(work @ Work::None) = w.work.get_mut(usize::from(attempt)) {
                    *work = Work::Running(w.now);
                }
                w.workers[usize::from(wk)] = Worker::Listening {
                    attempt,
                    delivery,
                    since: w.now,
                    reply: None,
                    marking: Marking::No,
                };
            }
            Some(Err(Refusal::NotYet { not_before, .. })) => {
                Self::release(w, wk, true);
                push(w, attempt, tick_of(not_before));
            }
            Some(Err(_)) => {
                if !self.has(Bug::NoRearm) {
                    self.arm(w);
                }
                Self::release(w, wk, true);
            }
        }
    }

    fn mark(&self, w: &mut World, wk: u8, fate: Fate) {
        let Worker::Listening {
            attempt, delivery, ..
        } = w.workers[usize::from(wk)]
        else {
            unreachable!("listening")
        };
        let number = u32::from(attempt);
        let transition = if self.has(Bug::TimeoutFails) {
            Transition::Fail {
                number,
                error: ErrorInfo::new("timeout", "no answer in time"),
                report: CallReport::default(),
                failover: self.failover(),
            }
        } else {
            Transition::MarkUnknown {
                number,
                call_id: None,
            }
        };
        let now = w.now;
        let written = self.write(
            w,
            &transition,
            Writer::Step { attempt, delivery },
            fate,
            now,
        );
        if self.has(Bug::UnknownFailsOver) && matches!(written, Some(Ok(Applied::MarkedUnknown))) {
            fail_over_from_unknown(
                w.job.as_mut().expect("a job"),
                number,
                &self.failover(),
                at(now),
            );
            self.dispatch_queued(w);
        }
        if written.is_some() {
            self.arm(w);
        }
        if let Worker::Listening { marking, .. } = &mut w.workers[usize::from(wk)] {
            *marking = match written {
                Some(_) => Marking::Written,
                None => Marking::Sending { faulted: true },
            };
        }
    }

    fn write_answer(&self, w: &mut World, wk: u8, fate: Fate) {
        let Worker::Writing {
            attempt,
            delivery,
            reply,
            answered,
            ..
        } = w.workers[usize::from(wk)]
        else {
            unreachable!("writing")
        };
        let number = u32::from(attempt);
        let transition = match reply {
            Reply::Result => Transition::Complete {
                number,
                result: result(attempt),
                report: CallReport::default(),
            },
            Reply::RateLimited | Reply::Broken => Transition::Fail {
                number,
                error: if reply == Reply::RateLimited {
                    ErrorInfo::new("rate_limited", "429")
                } else {
                    ErrorInfo::new("output_invalid", "the answer breaks the contract")
                },
                report: CallReport::default(),
                failover: self.failover(),
            },
            Reply::Lost => Transition::MarkUnknown {
                number,
                call_id: None,
            },
        };
        // A result's every try is stamped with when it came (`Engine::complete`); the rest with their own time.
        let stamp_at = if reply == Reply::Result {
            answered
        } else {
            w.now
        };
        match self.write(
            w,
            &transition,
            Writer::Step { attempt, delivery },
            fate,
            stamp_at,
        ) {
            None => {
                w.workers[usize::from(wk)] = Worker::Writing {
                    attempt,
                    delivery,
                    reply,
                    answered,
                    faulted: true,
                };
            }
            Some(written) => {
                // Refused, it is dropped — unless a lookup found this very answer and wrote it first.
                if written.is_err() && reply != Reply::Lost && !w.ghost.found.contains(&attempt) {
                    w.ghost.dropped.insert(attempt);
                }
                w.workers[usize::from(wk)] = Worker::Wrote { attempt };
            }
        }
    }

    /// Worker `wk`'s lookup learns `finding` about the attempt it asks about (the job read anew): nothing, and the
    /// message is done with; or what it settles of the provider's work (an answer found was done; no record, once the
    /// call cannot still run, was not), to write.
    fn ask(&self, w: &mut World, wk: u8, finding: Option<Finding>) {
        let Worker::Asking { attempt } = w.workers[usize::from(wk)] else {
            unreachable!("asking")
        };
        let Some(finding) = finding else {
            if !self.has(Bug::UnarmedAfterReconciler) {
                self.arm(w);
            }
            return Self::release(w, wk, true);
        };
        let work = &mut w.work[usize::from(attempt)];
        match finding {
            Finding::Found(reply) => {
                *work = Work::Done(reply);
                if reply == Reply::Broken {
                    w.ghost.definite.insert(attempt);
                }
            }
            // No record, and the call, from when it was made, cannot still be running: the work was not done.
            // Before, the provider may still do it, whatever the reconciler takes it for.
            Finding::Absent => {
                if let Work::Running(since) = *work
                    && w.now >= since + ABSENT_AFTER
                {
                    *work = Work::NotDone;
                }
            }
        }
        if self.has(Bug::LookupCalls) {
            w.ghost.calls[usize::from(attempt)] += 1;
        }
        w.workers[usize::from(wk)] = Worker::Answering {
            attempt,
            finding,
            asked: w.now,
            faulted: false,
        };
    }

    /// Worker `wk`'s write of what its lookup learnt: an answer found, as a late answer under the lookup's stamp (a
    /// result by compare-and-swap, every try stamped when it was found; a failure with its failover), or a clear
    /// by lookup. Once the store answers it, what follows it is the step's as after any answer; a refusal (a late
    /// answer, a person or another lookup got there first) is no error, and is followed by nothing.
    fn write_found(&self, w: &mut World, wk: u8, fate: Fate) {
        let Worker::Answering {
            attempt,
            finding,
            asked,
            ..
        } = w.workers[usize::from(wk)]
        else {
            unreachable!("answering")
        };
        let number = u32::from(attempt);
        let transition = match finding {
            Finding::Found(Reply::Result) => Transition::Complete {
                number,
                result: result(attempt),
                report: CallReport::default(),
            },
            Finding::Found(_) => Transition::Fail {
                number,
                error: ErrorInfo::new("output_invalid", "the answer breaks the contract"),
                report: CallReport::default(),
                failover: self.failover(),
            },
            Finding::Absent => Transition::ClearUnknown {
                number,
                by: ClearedBy::Lookup,
                failover: self.failover(),
            },
        };
        let found = matches!(finding, Finding::Found(_));
        let writer = Writer::Lookup { wk, attempt, found };
        let stamp_at = if finding == Finding::Found(Reply::Result) {
            asked
        } else {
            w.now
        };
        let written = self.write(w, &transition, writer, fate, stamp_at);
        self.moved(w, number, writer, found);
        match written {
            None => {
                if let Worker::Answering { faulted, .. } = &mut w.workers[usize::from(wk)] {
                    *faulted = true;
                }
            }
            Some(Ok(_)) => w.workers[usize::from(wk)] = Worker::Wrote { attempt },
            Some(Err(_)) => Self::release(w, wk, true),
        }
    }

    /// Reconciler `r`'s clear by policy meets the store; once it answers, what follows it (the retry or failover
    /// it queued dispatched, the event armed) follows, and a refusal (someone got there first) is no error.
    fn clear_by_policy(&self, w: &mut World, r: u8, fate: Fate) {
        let Reconciler::Clearing { attempt, .. } = w.reconcilers[usize::from(r)] else {
            unreachable!("clearing")
        };
        let number = u32::from(attempt);
        let clear = Transition::ClearUnknown {
            number,
            by: ClearedBy::Policy,
            failover: self.failover(),
        };
        let writer = Writer::Reconciler { r, attempt };
        let now = w.now;
        let written = self.write(w, &clear, writer, fate, now);
        self.moved(w, number, writer, false);
        match written {
            None => {
                if let Reconciler::Clearing { faulted, .. } = &mut w.reconcilers[usize::from(r)] {
                    *faulted = true;
                }
                return;
            }
            Some(Ok(_)) => {
                self.dispatch_queued(w);
                self.arm(w);
            }
            Some(Err(_)) => {}
        }
        w.reconcilers[usize::from(r)] = Reconciler::Idle;
    }

    /// Notes, for the properties, that a reconciler's write (`writer`'s) moved attempt `number`, and if it wrote an
    /// answer a lookup `found`.
    fn moved(&self, w: &mut World, number: u32, writer: Writer, found: bool) {
        let moved = (w.job.as_ref())
            .and_then(|j| j.attempt(number))
            .is_some_and(|a| a.writer == Some(writer.token()));
        if moved {
            w.ghost.reconciled.insert(crate::world::number(number));
            if found {
                w.ghost.found.insert(crate::world::number(number));
            }
        }
    }

    fn deliver(&self, w: &mut World, fails: bool) {
        let now = at(w.now);
        let job = self.seen(w.job.as_ref().expect("events follow the job"));
        let events = w.events.as_mut().expect("armed");
        match events.deliveries.due(&job, now, &[SinkKind::Endpoint]) {
            Due::Later(when) => events.deliveries.due_at = when,
            Due::Done => events.deliveries.due_at = None,
            Due::Deliver(due) => {
                let mut tried = Vec::new();
                for event in due {
                    w.ghost.sent.insert(event.id.clone());
                    if !fails {
                        w.ghost.delivered.insert(event.id.clone());
                    }
                    tried.push((event, fails.then(|| "HTTP 500".to_owned())));
                }
                if fails {
                    w.faults.endpoint -= 1;
                }
                events.deliveries.record(&tried, now, |_| {
                    Duration::seconds(i64::from(DELIVERY_BACKOFF))
                });
            }
        }
    }
}

/// What the model's provider puts in a result: which attempt made it, so an overwrite shows.
fn result(attempt: u8) -> serde_json::Value {
    json!({"summary": format!("from attempt {attempt}")})
}

/// The broken time-out of [`Bug::UnknownFailsOver`]: the next provider queued as if the attempt had failed, while
/// it stays `unknown`.
fn fail_over_from_unknown(
    job: &mut Job,
    number: u32,
    failover: &onejob_core::domain::Failover,
    now: onejob_core::domain::Timestamp,
) {
    let Some(i) = job.attempts.iter().position(|a| a.number == number) else {
        return;
    };
    job.attempts[i].state = AttemptState::Failed;
    let _ = job.add_attempt(
        None,
        failover,
        &Stamp::new(Writer::Sweeper { attempt: 0 }.token(), now),
    );
    job.attempts[i].state = AttemptState::Unknown;
}
