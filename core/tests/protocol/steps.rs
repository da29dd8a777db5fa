//! What each action does to the world: the API's create, the worker's claim, time-out and write, the sweeper's and
//! a person's writes, the deliverer — each write through [`Protocol::write`], as the stores apply it.

use chrono::Duration;
use onejob_core::domain::event::Due;
use onejob_core::domain::{
    Applied, AttemptState, CallReport, ErrorInfo, Job, Refusal, SinkKind, Stamp, Transition,
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
                let attempt = message.attempt;
                w.queue.sort();
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
                if let Worker::Listening { reply: heard, .. } = &mut w.workers[usize::from(wk)] {
                    *heard = Some(reply);
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
                if let Worker::Writing { attempt, reply, .. } = w.workers[usize::from(wk)]
                    && reply != Reply::Lost
                {
                    w.ghost.logged.insert(attempt);
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
                let mine = w
                    .job
                    .as_ref()
                    .and_then(|j| j.attempt(number))
                    .is_some_and(|a| {
                        a.state == AttemptState::Started && a.writer == Some(writer.token())
                    });
                w.ghost.unclaimed_call |= !mine;
                w.ghost.calls[usize::from(attempt)] += 1;
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
            Transition::MarkUnknown { number }
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
            Reply::Lost => Transition::MarkUnknown { number },
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
                if written.is_err() && reply != Reply::Lost {
                    w.ghost.dropped.insert(attempt);
                }
                w.workers[usize::from(wk)] = Worker::Wrote { attempt };
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
