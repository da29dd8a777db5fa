//! `FaultyStore`: a `JobStore` wrapper that fails the calls a test names, the way a real backend can fail:
//! before the write (nothing happened) or after it (the write committed, the answer was lost on the way back).
//! Either way the caller sees a `StoreError::Backend` and cannot tell which.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use onejob::domain::{
    Applied, AttemptRef, Bound, Breaker, Deliveries, Endpoint, Fingerprint, IdempotencyKey, Job,
    JobId, Owner, OwnerLedger, OwnerLimits, ProviderName, Qualification, Timestamp, Transition,
};
use onejob::store::{
    CallSlot, CreateOutcome, CreateTerms, EventStore, JobPage, JobStore, JobWrite, ListQuery,
    ProviderStore, StoreError,
};

/// The store calls a fault can hit: every write, and the reads the engine and the sweeper make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Create,
    Get,
    AddAttempt,
    Claim,
    MarkUnknown,
    Complete,
    Fail,
    CancelAttempt,
    ClearUnknown,
    Redispatch,
    CancelJob,
    ExpiredLeases,
    StaleQueued,
    Purge,
    Qualification,
    PutQualification,
    ReplaceQualification,
    Breaker,
    PutBreaker,
    Endpoint,
    PutEndpoint,
    ArmDeliveries,
    Deliveries,
    PutDeliveries,
    DueDeliveries,
    Reserve,
    OwnerLedger,
    SettlePlace,
    NeedingAPerson,
    TakeCallSlot,
    FreeCallSlot,
}

impl Call {
    /// The calls that write.
    pub(crate) const WRITES: [Call; 10] = [
        Call::Create,
        Call::AddAttempt,
        Call::Claim,
        Call::MarkUnknown,
        Call::Complete,
        Call::Fail,
        Call::CancelAttempt,
        Call::ClearUnknown,
        Call::Redispatch,
        Call::CancelJob,
    ];
}

/// When the fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The call fails before reaching the store.
    Before,
    /// The call reaches the store and commits; its answer is lost.
    After,
    /// The call goes through untouched: a plan passes over it to strike a later call of the same kind.
    Pass,
    /// The call stalls before reaching the store (a write lock held, a throttled table) until the test releases
    /// it ([`FaultyStore::release`]) after it stalled, then goes through.
    Stall,
}

#[derive(Debug, thiserror::Error)]
#[error("injected fault: {0}")]
struct Injected(&'static str);

pub(crate) struct FaultyStore {
    inner: Arc<dyn JobStore>,
    /// Faults in order: the next call of the named kind takes the first matching one.
    plan: Mutex<VecDeque<(Call, Fault)>>,
    /// Every call made, in order, with whether a fault struck it.
    seen: tokio::sync::watch::Sender<Vec<(Call, Option<Fault>)>>,
    /// Moved on by [`FaultyStore::release`]: the calls stalled before it go on.
    released: tokio::sync::watch::Sender<u64>,
    /// Every call that came back (its answer, or its fault), in order.
    finished: tokio::sync::watch::Sender<Vec<Call>>,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore").finish_non_exhaustive()
    }
}

impl FaultyStore {
    pub(crate) fn new(inner: Arc<dyn JobStore>, plan: Vec<(Call, Fault)>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            plan: Mutex::new(plan.into()),
            seen: tokio::sync::watch::Sender::new(Vec::new()),
            released: tokio::sync::watch::Sender::new(0),
            finished: tokio::sync::watch::Sender::new(Vec::new()),
        })
    }

    /// Lets every call stalled so far go on (a stall planned later stalls until the next release).
    pub(crate) fn release(&self) {
        self.released.send_modify(|generation| *generation += 1);
    }

    /// Waits (on the store's own record, not on time) until `n` calls of this kind came back.
    pub(crate) async fn finished(&self, call: Call, n: usize) {
        let mut finished = self.finished.subscribe();
        let done = finished.wait_for(|done| done.iter().filter(|c| **c == call).count() >= n);
        tokio::time::timeout(std::time::Duration::from_secs(20), done)
            .await
            .unwrap_or_else(|_| panic!("{call:?} never came back {n} times"))
            .expect("the store lives");
    }

    /// Waits (on the store's own record, not on time) until `n` calls of this kind were made.
    pub(crate) async fn made(&self, call: Call, n: usize) {
        let mut seen = self.seen.subscribe();
        let made = seen.wait_for(|seen| seen.iter().filter(|(c, _)| *c == call).count() >= n);
        tokio::time::timeout(std::time::Duration::from_secs(20), made)
            .await
            .unwrap_or_else(|_| panic!("{call:?} was never called {n} times"))
            .expect("the store lives");
    }

    /// Whether every planned fault has struck.
    pub(crate) fn spent(&self) -> bool {
        self.plan.lock().unwrap().is_empty()
    }

    /// How many calls of this kind were made (faulted or not).
    pub(crate) fn calls(&self, call: Call) -> usize {
        let seen = self.seen.borrow();
        seen.iter().filter(|(c, _)| *c == call).count()
    }

    /// Adds faults to the plan.
    pub(crate) fn plan(&self, faults: &[(Call, Fault)]) {
        self.plan.lock().unwrap().extend(faults.iter().copied());
    }

    /// Drops the faults not spent yet: the store is back.
    pub(crate) fn clear(&self) {
        self.plan.lock().unwrap().clear();
    }

    fn take(&self, call: Call) -> Option<Fault> {
        let mut plan = self.plan.lock().unwrap();
        let fault = plan
            .iter()
            .position(|(c, _)| *c == call)
            .and_then(|at| plan.remove(at))
            .map(|(_, fault)| fault);
        self.seen.send_modify(|seen| seen.push((call, fault)));
        fault
    }

    /// Runs `op` through the fault planned for `call`, if any.
    async fn through<T>(
        &self,
        call: Call,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // Read before the call is recorded: a release the test makes once it sees the call is a later one.
        let stalled = *self.released.borrow();
        let answer = self.faulted(call, stalled, op).await;
        self.finished.send_modify(|done| done.push(call));
        answer
    }

    /// `op` through the fault planned for `call`, a stall released after `stalled`.
    async fn faulted<T>(
        &self,
        call: Call,
        stalled: u64,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.take(call) {
            None | Some(Fault::Pass) => op.await,
            Some(Fault::Stall) => {
                let mut released = self.released.subscribe();
                released
                    .wait_for(|generation| *generation > stalled)
                    .await
                    .expect("the store lives");
                op.await
            }
            Some(Fault::Before) => Err(StoreError::backend(Injected("before the write"))),
            Some(Fault::After) => {
                op.await?;
                Err(StoreError::backend(Injected("the answer was lost")))
            }
        }
    }
}

#[async_trait]
impl EventStore for FaultyStore {
    async fn endpoint(&self, owner: &Owner) -> Result<Option<Endpoint>, StoreError> {
        self.through(Call::Endpoint, self.inner.endpoint(owner))
            .await
    }

    async fn put_endpoint(
        &self,
        owner: &Owner,
        endpoint: Option<&Endpoint>,
    ) -> Result<(), StoreError> {
        let op = self.inner.put_endpoint(owner, endpoint);
        self.through(Call::PutEndpoint, op).await
    }

    async fn arm_deliveries(&self, job: &Job, due_at: Timestamp) -> Result<bool, StoreError> {
        let op = self.inner.arm_deliveries(job, due_at);
        self.through(Call::ArmDeliveries, op).await
    }

    async fn deliveries(&self, id: &JobId) -> Result<Option<(Deliveries, u64)>, StoreError> {
        self.through(Call::Deliveries, self.inner.deliveries(id))
            .await
    }

    async fn put_deliveries(&self, deliveries: &Deliveries, rev: u64) -> Result<bool, StoreError> {
        let op = self.inner.put_deliveries(deliveries, rev);
        self.through(Call::PutDeliveries, op).await
    }

    async fn due_deliveries(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<(Deliveries, u64)>, StoreError> {
        let op = self.inner.due_deliveries(now, limit);
        self.through(Call::DueDeliveries, op).await
    }
}

#[async_trait]
impl ProviderStore for FaultyStore {
    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError> {
        let op = self.inner.put_qualification(evidence);
        self.through(Call::PutQualification, op).await
    }

    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError> {
        let op = self.inner.qualification(contract, provider);
        self.through(Call::Qualification, op).await
    }

    async fn replace_qualification(
        &self,
        seen: &Qualification,
        evidence: &Qualification,
    ) -> Result<bool, StoreError> {
        let op = self.inner.replace_qualification(seen, evidence);
        self.through(Call::ReplaceQualification, op).await
    }

    async fn breaker(&self, provider: &ProviderName) -> Result<(Breaker, u64), StoreError> {
        let op = self.inner.breaker(provider);
        self.through(Call::Breaker, op).await
    }

    async fn put_breaker(
        &self,
        provider: &ProviderName,
        breaker: &Breaker,
        rev: u64,
    ) -> Result<bool, StoreError> {
        let op = self.inner.put_breaker(provider, breaker, rev);
        self.through(Call::PutBreaker, op).await
    }

    async fn take_call_slot(
        &self,
        provider: &ProviderName,
        holder: &str,
        slot: CallSlot,
    ) -> Result<bool, StoreError> {
        let op = self.inner.take_call_slot(provider, holder, slot);
        self.through(Call::TakeCallSlot, op).await
    }

    async fn free_call_slot(
        &self,
        provider: &ProviderName,
        holder: &str,
    ) -> Result<(), StoreError> {
        let op = self.inner.free_call_slot(provider, holder);
        self.through(Call::FreeCallSlot, op).await
    }
}

#[async_trait]
impl JobStore for FaultyStore {
    async fn create_within(
        &self,
        job: Job,
        terms: CreateTerms<'_>,
    ) -> Result<CreateOutcome, StoreError> {
        let op = self.inner.create_within(job, terms);
        self.through(Call::Create, op).await
    }

    async fn reserve(
        &self,
        job: &Job,
        attempt: u32,
        limits: &OwnerLimits,
        bound: Bound,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let op = self.inner.reserve(job, attempt, limits, bound, now);
        self.through(Call::Reserve, op).await
    }

    async fn owner_ledger(&self, owner: &Owner) -> Result<OwnerLedger, StoreError> {
        let op = self.inner.owner_ledger(owner);
        self.through(Call::OwnerLedger, op).await
    }

    async fn settle_place(&self, job: &Job, now: Timestamp) -> Result<(), StoreError> {
        self.through(Call::SettlePlace, self.inner.settle_place(job, now))
            .await
    }

    async fn needing_a_person(
        &self,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        let op = self.inner.needing_a_person(query, now);
        self.through(Call::NeedingAPerson, op).await
    }

    async fn read_job(&self, id: &JobId, now: Timestamp) -> Result<Option<Job>, StoreError> {
        self.through(Call::Get, self.inner.read_job(id, now)).await
    }

    async fn find_job(
        &self,
        owner: &Owner,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Job>, StoreError> {
        self.through(Call::Get, self.inner.find_job(owner, key, now))
            .await
    }

    async fn list_jobs(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        self.inner.list_jobs(owner, query, now).await
    }

    async fn list_bills(
        &self,
        owner: &Owner,
        query: &ListQuery,
        now: Timestamp,
    ) -> Result<JobPage, StoreError> {
        self.inner.list_bills(owner, query, now).await
    }

    async fn apply(&self, id: &JobId, write: JobWrite<'_>) -> Result<(Applied, Job), StoreError> {
        let call = match write.transition {
            Transition::AddAttempt { .. } => Call::AddAttempt,
            Transition::Claim { .. } => Call::Claim,
            Transition::MarkUnknown { .. } => Call::MarkUnknown,
            Transition::Complete { .. } => Call::Complete,
            Transition::Fail { .. } => Call::Fail,
            Transition::CancelAttempt { .. } => Call::CancelAttempt,
            Transition::ClearUnknown { .. } => Call::ClearUnknown,
            Transition::Redispatch { .. } => Call::Redispatch,
            Transition::CancelJob => Call::CancelJob,
        };
        self.through(call, self.inner.apply(id, write)).await
    }

    async fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        let op = self.inner.expired_leases(now, limit);
        self.through(Call::ExpiredLeases, op).await
    }

    async fn stale_queued(
        &self,
        before: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        let op = self.inner.stale_queued(before, now, limit);
        self.through(Call::StaleQueued, op).await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let op = self.inner.purge_expired(now, limit);
        self.through(Call::Purge, op).await
    }
}
