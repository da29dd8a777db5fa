//! The writes a caller makes: a create, a manual attempt, cancelling an attempt or the job — each one intent,
//! repeated under its token while the store fails (invariant 11), and under an `Idempotency-Key` acting once
//! however often it is sent (invariants 2 and 17).

use std::collections::BTreeSet;

use super::follow_up::Wrote;
use super::in_flight::{Turn, led_by};
use super::{Actor, Engine};
use crate::domain::{
    AttemptCancel, Bound, IdempotencyKey, Job, JobCancel, JobId, NewJob, Owner, ProviderName,
    Refusal, WriteToken,
};
use crate::metrics::CreateKind;
use crate::store::{CreateOutcome, CreateTerms, Held, StoreError};
use crate::telemetry::trace;
use tracing::Instrument;
use tracing::field::Empty;

impl Engine {
    /// Creates the job, or finds the one its key names; a new job's attempt 1 is dispatched. A create whose answer
    /// was lost and that is repeated finds its own job: still `Created`. A create of an intent that this process
    /// is writing already answers from that write's job once it is committed (a replay or a conflict).
    ///
    /// The create is a span of the job's trace, made before the write (its start is the create's) and placed once
    /// the job is known: the root of a job it made, a child of the root of the job it found.
    pub async fn create_job(&self, new: NewJob) -> Result<CreateOutcome, StoreError> {
        self.create_job_as_sent(new, None).await
    }

    /// [`Engine::create_job`] of a create whose key came quoted: a job made under the key's `literal` text (quotes
    /// and all), before quoted keys were read as Structured Field strings, still answers it — a replay or a
    /// conflict — so that an intent keeps its job across that upgrade. One read more, for quoted keys only.
    pub async fn create_job_as_sent(
        &self,
        new: NewJob,
        literal: Option<&IdempotencyKey>,
    ) -> Result<CreateOutcome, StoreError> {
        let began = std::time::Instant::now();
        let span = tracing::info_span!("create", contract = %new.contract, outcome = Empty, job_id = Empty, trace_id = Empty);
        let token = WriteToken::new();
        let earlier = match literal {
            Some(literal) => self.find_job(&new.owner, literal).await?,
            None => None,
        };
        let outcome = match (
            earlier,
            self.creating.join(&new.owner, &new.idempotency_key),
        ) {
            (Some(job), _) => CreateOutcome::of_existing(job, &new.fingerprint, &token),
            (None, Turn::Follow(leader)) => match led_by(leader).await {
                Some(job) => CreateOutcome::of_existing(job, &new.fingerprint, &token),
                None => self.write_create(&new, &token).await?,
            },
            (None, Turn::Lead(lead)) => {
                let outcome = self.write_create(&new, &token).await?;
                lead.finish(outcome.job());
                outcome
            }
        };
        let job = outcome.job();
        span.record("job_id", tracing::field::display(&job.id));
        let kind = match &outcome {
            CreateOutcome::Created(job) => {
                trace::join_as_root(&span, &job.id);
                self.follow_up(job, Wrote::Created)
                    .instrument(span.clone())
                    .await?;
                CreateKind::Created
            }
            CreateOutcome::Replayed(_) => CreateKind::Replayed,
            CreateOutcome::Conflict(_) => CreateKind::Conflict,
        };
        if kind != CreateKind::Created {
            trace::join(&span, &job.id, None);
        }
        span.record("outcome", kind.as_str());
        (self.metrics).create(&new.owner, &new.contract, kind, began.elapsed());
        Ok(outcome)
    }

    async fn write_create(
        &self,
        new: &NewJob,
        token: &WriteToken,
    ) -> Result<CreateOutcome, StoreError> {
        let retention = self.settings.retention;
        let limits = self.settings.limits.of(&new.owner);
        // The job's worst case, where a budget or a token rate weighs it.
        let bound = match limits.budget.is_some() || limits.tokens_per_minute.is_some() {
            true => self.bound(&new.contract, &new.input, &new.providers),
            false => Bound::default(),
        };
        self.persist("create", token, self.write_deadline(), |stamp| {
            let job = Job::new(new.clone(), retention, &stamp);
            async move {
                let terms = CreateTerms {
                    stamp: &stamp,
                    limits,
                    bound,
                };
                self.store.create_within(job, terms).await
            }
        })
        .await
    }

    /// Queues a new attempt by hand: on `provider`, or on the next untried provider of the chain that is qualified
    /// (else the primary). The caller's explicit choice needs no qualification. Sent under an `Idempotency-Key`
    /// (`key`), the request acts once (invariant 17): sent again, it answers with the attempt it queued
    /// (`replayed`), whatever that attempt did since; another request under the key is refused.
    pub async fn add_attempt(
        &self,
        actor: &Actor,
        id: &JobId,
        provider: Option<ProviderName>,
        key: Option<&IdempotencyKey>,
    ) -> Result<AddedAttempt, StoreError> {
        let job = self.acted_on(actor, id).await?;
        let owner = &job.owner;
        let failover = match &provider {
            Some(_) => self.failover_to(&job, BTreeSet::new()).await?,
            None => self.failover(&job).await?,
        };
        // The job is the owner's, and so are its limits, whoever asks (an operator bypasses none).
        let limits = self.settings.limits.of(owner);
        let bound = self.bound_of(&job, provider.as_ref());
        let asked = format!("attempt {}", provider.as_ref().map_or("", |p| p.as_str()));
        let request =
            key.map(|key| WriteToken::for_request(owner, id, &actor.scope(), key, &asked));
        // A fresh token of its own, and the request kept apart: a repeat of this write after a lost answer finds
        // its token (created, 201); the same request sent again finds its request (replayed, 200).
        let token = WriteToken::new();
        let written = self
            .persist("add attempt", &token, self.write_deadline(), |stamp| {
                let (provider, failover) = (provider.clone(), &failover);
                let stamp = (stamp.serving(request.clone())).by_operator(actor.operator());
                async move {
                    let held = Held { limits, bound };
                    self.store
                        .add_attempt(owner, id, provider, failover, held, &stamp)
                        .await
                }
            })
            .await;
        let (number, job, replayed) = match written {
            Ok((number, job)) => (number, job, false),
            Err(StoreError::Refused(Refusal::RequestDone { number })) => {
                (number, self.existing_job(owner, id).await?, true)
            }
            Err(e) => return Err(e),
        };
        let wrote = if replayed {
            Wrote::Nothing
        } else {
            Wrote::Added
        };
        self.follow_up(&job, wrote).await?;
        Ok(AddedAttempt {
            number,
            job,
            replayed,
        })
    }

    /// The token of `actor`'s API write to job `id`: the request's own when it came under an `Idempotency-Key`, so
    /// that the same request sent again finds its write (invariant 17); else a fresh one.
    fn caller_token(
        actor: &Actor,
        owner: &Owner,
        id: &JobId,
        key: Option<&IdempotencyKey>,
        asked: &str,
    ) -> WriteToken {
        key.map_or_else(WriteToken::new, |key| {
            WriteToken::for_request(owner, id, &actor.scope(), key, asked)
        })
    }

    /// Resolves a live attempt out of band; automatic failover follows, decided on the state written.
    /// Cancelling a cancelled attempt answers the job as it is; so does this cancel sent again under its
    /// `Idempotency-Key` (`key`), whatever its attempt did since.
    pub async fn cancel_attempt(
        &self,
        actor: &Actor,
        id: &JobId,
        number: u32,
        key: Option<&IdempotencyKey>,
    ) -> Result<Job, StoreError> {
        let job = self.acted_on(actor, id).await?;
        let owner = &job.owner;
        let failover = self.failover(&job).await?;
        let asked = format!("cancel attempt {number}");
        let token = Self::caller_token(actor, owner, id, key, &asked);
        let (outcome, job) = self
            .persist("cancel attempt", &token, self.write_deadline(), |stamp| {
                let failover = &failover;
                let stamp = stamp.by_operator(actor.operator());
                async move {
                    self.store
                        .cancel_attempt(owner, id, number, failover, &stamp)
                        .await
                }
            })
            .await?;
        // Also when it was cancelled before, by this very call perhaps, whose first answer was lost before the
        // job's watchers and endpoint heard. If the event could not be armed, the call fails: the cancel stands,
        // and the client's repeat arms it.
        let wrote = match outcome {
            AttemptCancel::Cancelled => {
                tracing::info!(job_id = %job.id, attempt = number, "attempt cancelled");
                Wrote::AttemptCancelled(number)
            }
            AttemptCancel::AlreadyCancelled => Wrote::Nothing,
        };
        self.follow_up(&job, wrote).await?;
        Ok(job)
    }

    /// Cancels the job; idempotent, and under an `Idempotency-Key` (`key`) its repeat is this cancel's.
    pub async fn cancel_job(
        &self,
        actor: &Actor,
        id: &JobId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Job, StoreError> {
        let owner = &match actor {
            Actor::Owner(owner) => owner.clone(),
            Actor::Operator(_) => self.acted_on(actor, id).await?.owner,
        };
        let token = Self::caller_token(actor, owner, id, key, "cancel");
        let (outcome, job) = self
            .persist("cancel job", &token, self.write_deadline(), |stamp| {
                let stamp = stamp.by_operator(actor.operator());
                async move { self.store.cancel_job(owner, id, &stamp).await }
            })
            .await?;
        // Also when it was cancelled before: that may have been this very call, whose first answer was lost.
        let wrote = match outcome {
            JobCancel::Cancelled => {
                tracing::info!(job_id = %job.id, "job cancelled");
                Wrote::JobCancelled
            }
            JobCancel::AlreadyCancelled => Wrote::Nothing,
        };
        self.follow_up(&job, wrote).await?;
        Ok(job)
    }
}

/// What a manual attempt came to.
#[derive(Debug, Clone)]
pub struct AddedAttempt {
    pub number: u32,
    pub job: Job,
    /// The request was sent before under its `Idempotency-Key`: nothing new was queued.
    pub replayed: bool,
}
