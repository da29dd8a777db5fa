//! What follows every write of a job's life, in one place and one order: the write is counted, the attempt it
//! queued is dispatched, the job's watchers (long polls) hear of it, and if it ended the job its completion event is
//! armed. Writers say what they did ([`Wrote`]); nothing else is written by hand after a write.

use chrono::Duration;
use tracing::Instrument;

use super::Engine;
use crate::domain::{AttemptRef, AttemptState, Job, JobId, Timestamp, WriteToken};
use crate::queue::Message;
use crate::store::StoreError;
use crate::telemetry::trace;

/// What a write did, for what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wrote {
    /// A create made the job, attempt 1 queued (counted with the create itself).
    Created,
    /// A manual attempt was queued.
    Added,
    /// Attempt `n` was claimed.
    Claimed(u32),
    /// Attempt `n` became `unknown`.
    Unknown(u32),
    /// Attempt `n`'s result won the slot.
    Won(u32),
    /// Attempt `n`'s result came too late and was discarded.
    Lost(u32),
    /// Attempt `n` failed; its retry or failover was queued in the same write.
    Failed(u32),
    /// Cancelled attempt `n`'s provider answered without a result after all: kept on it, nothing else moved.
    Late(u32),
    /// Attempt `n` was cancelled by this write; failover was queued in the same write.
    AttemptCancelled(u32),
    /// `unknown` attempt `n` was cleared by the reconciler without an answer (a lookup that found none, or its
    /// provider's policy); its retry or failover was queued in the same write.
    Cleared(u32),
    /// The job was cancelled by this write.
    JobCancelled,
    /// Nothing new: the write found the job as it wanted it (a replay, a cancel of what was cancelled). Its
    /// watchers and its event are told again all the same: this may be the repeat of a write whose answer was lost
    /// before they heard.
    Nothing,
}

impl Wrote {
    /// The attempt the write moved, if it names one.
    pub(super) fn attempt(self) -> Option<u32> {
        match self {
            Self::Claimed(n)
            | Self::Unknown(n)
            | Self::Won(n)
            | Self::Lost(n)
            | Self::Failed(n)
            | Self::Late(n)
            | Self::AttemptCancelled(n)
            | Self::Cleared(n) => Some(n),
            Self::Created | Self::Added | Self::JobCancelled | Self::Nothing => None,
        }
    }
}

impl Engine {
    /// After every write of `job`: counted, its queued attempt dispatched (if the write queued one), its watchers
    /// told, its completion event armed if it ended. An `Err` (the store would not arm the event through a write's
    /// budget) is for the caller to pass on as a failure: the write stands, and its client's retry, or its
    /// message's redelivery, arms it.
    pub(super) async fn follow_up(&self, job: &Job, wrote: Wrote) -> Result<(), StoreError> {
        let count = |state| {
            if let Some(n) = wrote.attempt() {
                self.metrics.attempt(job, n, state);
            }
        };
        match wrote {
            Wrote::Claimed(_) => count(AttemptState::Started),
            Wrote::Unknown(_) => count(AttemptState::Unknown),
            Wrote::Won(n) => {
                count(AttemptState::Succeeded);
                self.metrics.billed(job, n, "won");
            }
            Wrote::Lost(n) => {
                self.metrics.race_lost(job, n);
                self.metrics.billed(job, n, "discarded");
            }
            Wrote::Failed(n) => {
                count(AttemptState::Failed);
                self.metrics.billed(job, n, "failed");
            }
            Wrote::Late(n) => self.metrics.billed(job, n, "failed"),
            Wrote::AttemptCancelled(_) | Wrote::Cleared(_) => count(AttemptState::Cancelled),
            Wrote::Created | Wrote::Added | Wrote::JobCancelled | Wrote::Nothing => {}
        }
        // What left `unknown` with this write, by what.
        let cleared = wrote
            .attempt()
            .and_then(|n| job.attempt(n))
            .and_then(|a| a.cleared.map(|c| (a.number, c.by)));
        if let (Some((n, by)), false) = (cleared, matches!(wrote, Wrote::Late(_))) {
            self.metrics.unknown_cleared(job, n, by);
        }
        let ends = |wrote| {
            matches!(
                wrote,
                Wrote::Won(_) | Wrote::Failed(_) | Wrote::AttemptCancelled(_) | Wrote::Cleared(_)
            )
        };
        if ends(wrote) || wrote == Wrote::JobCancelled {
            self.metrics.ended(job);
        }
        // The attempt this write ended: what its reservation settled to, under a budget.
        let settled = match wrote {
            Wrote::Lost(n) => Some(n),
            Wrote::JobCancelled => job.attempts.last().map(|a| a.number),
            _ if ends(wrote) => wrote.attempt(),
            _ => None,
        };
        if let Some(n) = settled {
            self.settled_metric(job, n);
        }
        if ends(wrote) && !matches!(wrote, Wrote::Won(_))
            || matches!(wrote, Wrote::Created | Wrote::Added)
        {
            self.dispatch_queued(job).await;
        }
        self.changes
            .changed(&job.id, || job.is_final().then(|| job.clone()));
        let may_end = ends(wrote) || matches!(wrote, Wrote::JobCancelled | Wrote::Nothing);
        if may_end && job.live_attempt().is_none() {
            self.settle_place(job).await;
        }
        self.arm_deliveries(job).await
    }

    /// The job has no live attempt: what its last call reserved is settled against its owner's budget from its
    /// record, and the place it held is free if it is no longer live (where the owner keeps places: a live-jobs
    /// limit, a budget). Advisory: a store that fails here is logged; a reservation not settled is settled by the
    /// job's next reservation, or checked against its job when the owner reaches a limit.
    async fn settle_place(&self, job: &Job) {
        if !self.settings.limits.of(&job.owner).keeps_places() {
            return;
        }
        if let Err(e) = self.store.settle_place(job, self.clock.now()).await {
            tracing::warn!(job_id = %job.id, error = %crate::telemetry::error_chain(&e), "the job's reservation and place were not settled: they are checked at the limit");
        }
    }

    /// Under a budget, what attempt `n` of `job` (ended) settled to, counted ([`crate::metrics::Metrics::budget`]).
    fn settled_metric(&self, job: &Job, n: u32) {
        if self.settings.limits.of(&job.owner).budget.is_none() {
            return;
        }
        let provider = job.attempt(n).map(|a| &a.provider);
        if let Some(cost) = job.settlement(n, self.bound_of(job, provider)) {
            self.metrics.budget(&job.owner, "settled", cost);
        }
    }

    /// Dispatches the job's queued attempt, if the last write queued one. A failure to dispatch is logged, not
    /// returned: the write stands, and the sweeper dispatches the attempt again.
    async fn dispatch_queued(&self, job: &Job) {
        let Some(attempt) = job
            .live_attempt()
            .filter(|a| a.state == AttemptState::Queued)
        else {
            return;
        };
        self.metrics
            .attempt(job, attempt.number, AttemptState::Queued);
        let message = Message::new(
            AttemptRef {
                job_id: job.id.clone(),
                number: attempt.number,
            },
            Some(attempt.provider.clone()),
        );
        self.dispatch_at(&message, attempt.not_before).await;
    }

    /// Sends `message`, delivered no sooner than `not_before` (if given); a failure is logged, and the sweeper
    /// sends it again later.
    pub(super) async fn dispatch_at(&self, message: &Message, not_before: Option<Timestamp>) {
        let delay = not_before.map_or_else(Duration::zero, |t| t - self.clock.now());
        let (job_id, attempt) = (&message.attempt.job_id, message.attempt.number);
        let span =
            tracing::info_span!("dispatch", %job_id, attempt, trace_id = tracing::field::Empty);
        trace::join(&span, job_id, None);
        let sent = self
            .dispatcher
            .dispatch(message, delay)
            .instrument(span)
            .await;
        if let Err(e) = sent {
            tracing::warn!(%job_id, attempt, error = %e, "dispatch failed; the sweeper will retry");
        }
    }

    /// After a write: if it ended the job, its owner's endpoint (if any) is to hear of it once it settles. Tried
    /// again like a write while the store fails (arming twice is arming once); logged, and an `Err`, if it never
    /// lands.
    pub(super) async fn arm_deliveries(&self, job: &Job) -> Result<(), StoreError> {
        let Some(settles_at) = job.settles_at() else {
            return Ok(());
        };
        let armed = self
            .persist(
                "arm deliveries",
                &WriteToken::new(),
                self.write_deadline(),
                |_| self.store.arm_deliveries(job, settles_at),
            )
            .await;
        match armed {
            Ok(true) => self.deliveries_due.notify_one(),
            Ok(false) => {}
            Err(ref e) => {
                tracing::error!(job_id = %job.id, error = %crate::telemetry::error_chain(e), "the job's completion event could not be scheduled; failing the step so that it comes back");
            }
        }
        armed.map(|_| ())
    }

    /// For a message whose claim was refused (its attempt is not queued), what is left of the step that took its
    /// attempt on: if the job ended, its deliveries are armed again — that step may have stopped between its write
    /// and the arming (a Lambda out of time), and left its message to come back; arming twice is arming once. And
    /// if the attempt's call is over, the call slot this message took again is freed: nobody else would free it
    /// before its time ends (a call that may still run keeps it).
    pub(super) async fn dropped(&self, message: &Message) -> Result<(), StoreError> {
        let attempt = &message.attempt;
        let Some(job) = self
            .store
            .read_job(&attempt.job_id, self.clock.now())
            .await?
        else {
            return Ok(());
        };
        if (job.attempt(attempt.number)).is_some_and(|a| a.state.call_over()) {
            self.free_slot(message).await;
        }
        self.arm_deliveries(&job).await
    }

    /// After a write given up (it may have landed) by a step no message brings back: the job as the store has it,
    /// its deliveries armed if it ended. Best effort: what fails is logged.
    pub(super) async fn arm_what_landed(&self, job_id: &JobId) {
        let armed = match self.store.read_job(job_id, self.clock.now()).await {
            Ok(Some(job)) => self.arm_deliveries(&job).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = armed {
            tracing::error!(%job_id, error = %crate::telemetry::error_chain(&e), "a write given up may have ended the job: its event could not be armed");
        }
    }
}
