//! `FaultyStore`: a `JobStore` wrapper that fails the calls a test names, the way a real backend can fail:
//! before the write (nothing happened) or after it (the write committed, the answer was lost on the way back).
//! Either way the caller sees a `StoreError::Backend` and cannot tell which.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use onejob::domain::{
    AttemptRef, CallReport, Completion, ErrorInfo, Fingerprint, Job, JobCancel, JobId, NewJob,
    NextStep, Owner, ProviderName, Qualification, Timestamp,
};
use onejob::store::{CreateOutcome, JobPage, JobStore, ListQuery, StoreError};
use serde_json::Value;

/// The store calls a fault can hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Create,
    Claim,
    Complete,
    Fail,
}

/// When the fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The call fails before reaching the store.
    Before,
    /// The call reaches the store and commits; its answer is lost.
    After,
}

#[derive(Debug, thiserror::Error)]
#[error("injected fault: {0}")]
struct Injected(&'static str);

pub struct FaultyStore {
    inner: Arc<dyn JobStore>,
    /// Faults in order: the next call of the named kind takes the first matching one.
    plan: Mutex<VecDeque<(Call, Fault)>>,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore").finish_non_exhaustive()
    }
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn JobStore>, plan: Vec<(Call, Fault)>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            plan: Mutex::new(plan.into()),
        })
    }

    /// Whether every planned fault has struck.
    pub fn spent(&self) -> bool {
        self.plan.lock().unwrap().is_empty()
    }

    fn take(&self, call: Call) -> Option<Fault> {
        let mut plan = self.plan.lock().unwrap();
        let at = plan.iter().position(|(c, _)| *c == call)?;
        plan.remove(at).map(|(_, fault)| fault)
    }

    /// Runs `op` through the fault planned for `call`, if any.
    async fn through<T>(
        &self,
        call: Call,
        op: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.take(call) {
            None => op.await,
            Some(Fault::Before) => Err(StoreError::backend(Injected("before the write"))),
            Some(Fault::After) => {
                op.await?;
                Err(StoreError::backend(Injected("the answer was lost")))
            }
        }
    }
}

#[async_trait]
impl JobStore for FaultyStore {
    async fn create_job(&self, new: NewJob, now: Timestamp) -> Result<CreateOutcome, StoreError> {
        self.through(Call::Create, self.inner.create_job(new, now))
            .await
    }

    async fn get_job(&self, owner: &Owner, id: &JobId) -> Result<Option<Job>, StoreError> {
        self.inner.get_job(owner, id).await
    }

    async fn list_jobs(&self, owner: &Owner, query: &ListQuery) -> Result<JobPage, StoreError> {
        self.inner.list_jobs(owner, query).await
    }

    async fn add_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        provider: ProviderName,
        now: Timestamp,
    ) -> Result<(u32, Job), StoreError> {
        self.inner.add_attempt(owner, id, provider, now).await
    }

    async fn claim_attempt(
        &self,
        id: &JobId,
        number: u32,
        lease_expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        self.through(
            Call::Claim,
            self.inner.claim_attempt(id, number, lease_expires_at, now),
        )
        .await
    }

    async fn mark_unknown(
        &self,
        id: &JobId,
        number: u32,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        self.inner.mark_unknown(id, number, now).await
    }

    async fn complete_attempt(
        &self,
        id: &JobId,
        number: u32,
        result: Value,
        report: CallReport,
        now: Timestamp,
    ) -> Result<(Completion, Job), StoreError> {
        self.through(
            Call::Complete,
            self.inner.complete_attempt(id, number, result, report, now),
        )
        .await
    }

    async fn fail_attempt(
        &self,
        id: &JobId,
        number: u32,
        error: ErrorInfo,
        report: CallReport,
        next: NextStep,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        self.through(
            Call::Fail,
            self.inner
                .fail_attempt(id, number, error, report, next, now),
        )
        .await
    }

    async fn cancel_attempt(
        &self,
        owner: &Owner,
        id: &JobId,
        number: u32,
        next: NextStep,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        self.inner
            .cancel_attempt(owner, id, number, next, now)
            .await
    }

    async fn expired_leases(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.inner.expired_leases(now, limit).await
    }

    async fn stale_queued(
        &self,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<AttemptRef>, StoreError> {
        self.inner.stale_queued(before, limit).await
    }

    async fn put_qualification(&self, evidence: &Qualification) -> Result<(), StoreError> {
        self.inner.put_qualification(evidence).await
    }

    async fn qualification(
        &self,
        contract: &Fingerprint,
        provider: &Fingerprint,
    ) -> Result<Option<Qualification>, StoreError> {
        self.inner.qualification(contract, provider).await
    }

    async fn cancel_job(
        &self,
        owner: &Owner,
        id: &JobId,
        now: Timestamp,
    ) -> Result<(JobCancel, Job), StoreError> {
        self.inner.cancel_job(owner, id, now).await
    }
}
