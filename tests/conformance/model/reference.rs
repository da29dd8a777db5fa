//! The reference the store is held to: jobs by key, moved by the domain's own transitions, and the design's
//! invariants on one job.

use super::*;

/// The reference: jobs by key (expired ones stay until a create replaces them), moved by the domain's transitions,
/// and the clock.
pub(super) struct Model {
    pub(super) owner: Owner,
    pub(super) jobs: BTreeMap<usize, Job>,
    pub(super) now: Timestamp,
    /// Each job's outcome and settle as last seen (invariant 14).
    pub(super) settles: BTreeMap<JobId, (JobStatus, Option<Timestamp>)>,
}

impl Model {
    pub(super) fn key(&self, key: usize) -> IdempotencyKey {
        IdempotencyKey::parse(&format!("key-{key}")).unwrap()
    }

    /// The id a step uses for `key`: its job's (even expired), else the id it would have had at the start.
    pub(super) fn id(&self, key: usize) -> JobId {
        self.jobs.get(&key).map_or_else(
            || JobId::derive(&self.owner, &self.key(key), at(0)),
            |job| job.id.clone(),
        )
    }

    /// The job `key` names now, unless it expired.
    pub(super) fn live(&self, key: usize) -> Option<&Job> {
        self.jobs.get(&key).filter(|job| !job.is_expired(self.now))
    }

    pub(super) fn new_job(&self, key: usize, input: u8) -> NewJob {
        let input = json!({"text": format!("input {input}")});
        NewJob {
            owner: self.owner.clone(),
            idempotency_key: self.key(key),
            fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
            contract: onejob::domain::ContractRef::parse("summarize@1").unwrap(),
            input,
            providers: PROVIDERS
                .iter()
                .map(|p| ProviderName::parse(p).unwrap())
                .collect(),
        }
    }

    /// Applies `apply` to the model's job `key`: `Err(None)` when there is no such job (or it expired).
    pub(super) fn apply<T>(
        &mut self,
        key: usize,
        apply: impl FnOnce(&mut Job) -> Result<T, Refusal>,
    ) -> Result<T, Option<Refusal>> {
        let now = self.now;
        let job = self
            .jobs
            .get_mut(&key)
            .filter(|job| !job.is_expired(now))
            .ok_or(None)?;
        let mut after = job.clone();
        let out = apply(&mut after).map_err(Some)?;
        *job = after;
        Ok(out)
    }
}

/// The design's invariants, on one job.
pub(super) fn check_invariants(job: &Job) {
    let live = job.attempts.iter().filter(|a| a.state.is_live()).count();
    assert!(live <= 1, "two live attempts: {job:?}");
    let winners: Vec<u32> = job
        .attempts
        .iter()
        .filter(|a| a.state == AttemptState::Succeeded)
        .map(|a| a.number)
        .collect();
    assert!(winners.len() <= 1, "two winners: {job:?}");
    assert_eq!(winners.first().copied(), job.completed_by, "{job:?}");
    assert_eq!(job.result.is_some(), job.completed_by.is_some(), "{job:?}");
    assert!(job.version <= 1, "{job:?}");
    assert!(
        job.attempts.len() <= MAX_ATTEMPTS as usize,
        "past the limit: {job:?}"
    );
    // A cancel ends every live attempt; a result ends every queued one. (A result may win while a later attempt
    // is still started — a cancelled attempt answering while the slot was free.)
    if job.cancelled_at.is_some() {
        assert_eq!(live, 0, "a cancelled job with a live attempt: {job:?}");
    }
    if job.completed_by.is_some() {
        assert!(
            job.attempts.iter().all(|a| a.state != AttemptState::Queued),
            "a succeeded job with a queued attempt: {job:?}"
        );
    }
}

/// The write on the model: what it says, and the job it names.
pub(super) fn on_model(model: &mut Model, write: &Write, stamp: &Stamp) -> (usize, Said) {
    let now = stamp.now;
    let lease = now + Duration::seconds(1);
    let answer = |a: &dyn std::fmt::Debug| format!("{a:?}");
    match *write {
        Write::Create { key, input } => {
            let new = model.new_job(key, input);
            let outcome = match model.live(key) {
                None => {
                    let job = Job::new(new, MODEL_RETENTION, stamp);
                    model.jobs.insert(key, job.clone());
                    CreateOutcome::Created(job)
                }
                Some(job) if job.created_by(&stamp.token) => CreateOutcome::Created(job.clone()),
                Some(job) if job.fingerprint == new.fingerprint => {
                    CreateOutcome::Replayed(job.clone())
                }
                Some(job) => CreateOutcome::Conflict(job.clone()),
            };
            (key, Ok(answer(&outcome)))
        }
        Write::Claim { key, attempt } => (
            key,
            model.apply(key, |j| j.claim(attempt, lease, stamp).map(|()| answer(j))),
        ),
        Write::TimeOut { key, attempt } => (
            key,
            model.apply(key, |j| {
                j.mark_unknown(attempt, None, stamp).map(|()| answer(j))
            }),
        ),
        Write::Complete { key, attempt } => (
            key,
            model.apply(key, |j| {
                let c = j.complete(attempt, result(attempt), CallReport::default(), stamp)?;
                Ok(answer(&(c, j.clone())))
            }),
        ),
        Write::Fail {
            key,
            attempt,
            qualified,
        } => (
            key,
            model.apply(key, |j| {
                j.fail(
                    attempt,
                    error(),
                    CallReport::default(),
                    &failover(qualified),
                    stamp,
                )
                .map(|()| answer(j))
            }),
        ),
        Write::CancelAttempt {
            key,
            attempt,
            qualified,
            ..
        } => (
            key,
            model.apply(key, |j| {
                let c = j.cancel_attempt(attempt, &failover(qualified), stamp)?;
                Ok(answer(&(c, j.clone())))
            }),
        ),
        Write::Retry {
            key,
            provider: p,
            qualified,
            ..
        } => (
            key,
            model.apply(key, |j| {
                let n = j.add_attempt(p.map(provider), &failover(qualified), stamp)?;
                Ok(answer(&(n, j.clone())))
            }),
        ),
        Write::CancelJob { key } => (
            key,
            model.apply(key, |j| {
                let c = j.cancel(stamp)?;
                Ok(answer(&(c, j.clone())))
            }),
        ),
        Write::Redispatch { key, attempt } => (
            key,
            model.apply(key, |j| j.redispatch(attempt, now).map(|()| answer(j))),
        ),
    }
}

pub(super) fn result(attempt: u32) -> serde_json::Value {
    json!({"summary": format!("from attempt {attempt}")})
}

pub(super) fn error() -> ErrorInfo {
    ErrorInfo::new("provider_error", "HTTP 500")
}
