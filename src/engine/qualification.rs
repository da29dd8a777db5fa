//! The qualification evidence as the engine reads and writes it: what failover may do (the evidence of each untried
//! provider of a job's chain), every provider's standing, what production shows of a standing (a suspicion, never a
//! loss: invariant 15), and qualifying again.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::Duration;
use futures_util::future::try_join_all;

use super::Engine;
use crate::domain::{
    ContractRef, ContractStanding, ErrorInfo, Failover, Job, ProviderName, Qualification, Standing,
    Suspicion,
};
use crate::store::StoreError;

/// Reads and compare-and-swaps of a provider's evidence before a production note on it is given up.
const NOTE_TRIES: usize = 3;

impl Engine {
    /// What failover may do for `job`: the providers of its chain not tried yet that are qualified for the
    /// contract's current fingerprint (invariant 9), one read of the evidence each, and the attempt limit. Providers
    /// are only ever tried, never untried, so this stays right for any later state of the job.
    /// The owner's budget is read too, where it has one: spent, no attempt is queued (invariant 18).
    pub async fn failover(&self, job: &Job) -> Result<Failover, StoreError> {
        let untried: Vec<&ProviderName> = job.untried_providers().collect();
        let standings = try_join_all(
            untried
                .iter()
                .map(|provider| self.qualification(&job.contract, provider)),
        )
        .await?;
        let qualified = untried
            .into_iter()
            .zip(standings)
            .filter(|(_, evidence)| self.standing(evidence.as_ref()).0 == Standing::Qualified)
            .map(|(provider, _)| provider.clone())
            .collect();
        self.failover_to(job, qualified).await
    }

    /// What failover may do for `job` towards `qualified`: the attempt limit, and the owner's budget.
    pub(super) async fn failover_to(
        &self,
        job: &Job,
        qualified: BTreeSet<ProviderName>,
    ) -> Result<Failover, StoreError> {
        Ok(Failover {
            qualified,
            max_attempts: self.settings.max_attempts,
            retry: None,
            jitter_permille: 0,
            budget: self.budget_left(job, None).await?,
        })
    }

    /// The stored qualification of `provider` for `contract`'s current fingerprint, if any.
    pub async fn qualification(
        &self,
        contract: &ContractRef,
        provider: &ProviderName,
    ) -> Result<Option<Qualification>, StoreError> {
        let (Some(contract), Some(provider)) =
            (self.contracts.get(contract), self.providers.get(provider))
        else {
            return Ok(None);
        };
        self.store
            .qualification(&contract.fingerprint, &provider.fingerprint)
            .await
    }

    /// Each provider's standing for each contract, as the stored evidence has it for their current fingerprints.
    pub async fn standings(
        &self,
    ) -> Result<Vec<(ProviderName, Vec<ContractStanding>)>, StoreError> {
        let mut out = Vec::new();
        for (name, provider) in self.providers.iter() {
            let mut rows = Vec::new();
            for contract in self.contracts.iter() {
                let evidence = self
                    .store
                    .qualification(&contract.fingerprint, &provider.fingerprint)
                    .await?;
                let (standing, reason) = self.standing(evidence.as_ref());
                rows.push(ContractStanding {
                    contract: contract.reference.clone(),
                    standing,
                    reason,
                    evidence,
                });
            }
            out.push((name.clone(), rows));
        }
        Ok(out)
    }

    /// Where `evidence` leaves its provider now, and why not qualified.
    fn standing(&self, evidence: Option<&Qualification>) -> (Standing, Option<ErrorInfo>) {
        evidence.map_or((Standing::Unqualified, None), |q| {
            q.standing(self.clock.now(), self.settings.qualification_max_age)
        })
    }

    /// What production attempt `number` of `job` showed about its provider's qualification for the job's contract:
    /// the model it answered as, and whether its answer broke the contract. A provider that answers as a model its
    /// qualification never saw, or breaks the contract [`Qualification::STRIKES`] times, becomes suspected (kept in
    /// the evidence, with the attempts): cause to qualify it again, never a loss of standing (invariant 15). The note
    /// is a compare-and-swap on the evidence as read, so it never overwrites a qualification written meanwhile. A
    /// store that fails is logged: watching never fails an attempt.
    pub(super) async fn observe(
        &self,
        job: &Job,
        number: u32,
        model: Option<&str>,
        broke: Option<&ErrorInfo>,
    ) {
        let (Some(attempt), Some(contract)) =
            (job.attempt(number), self.contracts.get(&job.contract))
        else {
            return;
        };
        let Some(provider) = self.providers.get(&attempt.provider) else {
            return;
        };
        let pair = (contract.fingerprint, provider.fingerprint);
        let name = format!("{}#{number}", job.id);
        let unchanged = |evidence: &Option<Qualification>| {
            evidence
                .as_ref()
                .is_none_or(|q| !q.notices(&name, model, broke))
        };
        if self
            .evidence
            .get(&pair)
            .is_some_and(|seen| unchanged(&seen))
        {
            return;
        }
        for _ in 0..NOTE_TRIES {
            let read = match self.store.qualification(&pair.0, &pair.1).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(error = %e, "the evidence could not be read to watch the provider's standing");
                    return;
                }
            };
            if unchanged(&read) {
                self.evidence.put(pair, Arc::new(read));
                return;
            }
            let Some(seen) = read else {
                return;
            };
            let mut evidence = seen.clone();
            evidence.observe(&name, model, broke, self.clock.now());
            self.evidence.forget(&pair);
            match self.store.replace_qualification(&seen, &evidence).await {
                Ok(true) => {
                    if let Some(suspicion) = evidence
                        .suspected
                        .as_ref()
                        .filter(|_| seen.suspected.is_none())
                    {
                        tracing::warn!(provider = %attempt.provider, contract = %job.contract, code = %suspicion.reason.code, "provider suspected, to be qualified again: {}", suspicion.reason.message);
                    }
                    return;
                }
                // The evidence changed meanwhile (a qualification, another note): noted on it as it is now.
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the provider's standing could not be written");
                    return;
                }
            }
        }
    }

    /// Why an answer of attempt `number` of `job`, reporting `model`, may not stand, if it may not: an attempt on
    /// another provider than the job's primary is there as a qualified provider (failover goes only to one), and an
    /// answer as a model its qualification never saw is not that provider's (invariant 15: the provider's own
    /// evidence) — a definite failure, `model_changed`; [`Engine::observe`] then voids the standing. The primary
    /// needs no qualification, and evidence that cannot be read never decides a job.
    pub(super) async fn unqualified_answer(
        &self,
        job: &Job,
        number: u32,
        model: Option<&str>,
    ) -> Option<ErrorInfo> {
        let attempt = job.attempt(number)?;
        if job.providers.first() == Some(&attempt.provider) {
            return None;
        }
        let (contract, provider) = (
            self.contracts.get(&job.contract)?,
            self.providers.get(&attempt.provider)?,
        );
        let pair = (contract.fingerprint, provider.fingerprint);
        let evidence = match self.evidence.get(&pair) {
            Some(seen) => seen,
            None => match self.store.qualification(&pair.0, &pair.1).await {
                Ok(read) => {
                    let read = Arc::new(read);
                    self.evidence.put(pair, read.clone());
                    read
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the evidence could not be read to hold an answer to its qualification");
                    return None;
                }
            },
        };
        let evidence = evidence.as_ref().as_ref().filter(|q| q.passed)?;
        let unseen = evidence.unseen(model)?;
        let qualified: Vec<&str> = evidence.models().into_iter().collect();
        Some(ErrorInfo::new(
            Suspicion::MODEL_CHANGED,
            format!(
                "{} answered as {unseen}, not as the model it was qualified as ({}): the answer is not a qualified \
                 provider's",
                attempt.provider,
                qualified.join(", ")
            ),
        ))
    }

    /// The pairs whose qualification passed and is now too old or suspected in production, with why: what the
    /// sweeper qualifies again on the contract's samples (suspected ones first).
    pub async fn needing_requalification(
        &self,
    ) -> Result<Vec<(ProviderName, ContractRef, ErrorInfo)>, StoreError> {
        let (mut suspected, mut stale) = (Vec::new(), Vec::new());
        for (name, rows) in self.standings().await? {
            for row in rows {
                let Some(evidence) = row.evidence.as_ref().filter(|q| q.passed) else {
                    continue;
                };
                if let Some(suspicion) = &evidence.suspected {
                    suspected.push((name.clone(), row.contract, suspicion.reason.clone()));
                } else if let Some(why) = row.reason {
                    stale.push((name.clone(), row.contract, why));
                }
            }
        }
        suspected.extend(stale);
        Ok(suspected)
    }

    /// The longest a qualification of `provider` for `contract` may take, `runs` runs of each sample, each bounded
    /// by the provider's timeout.
    pub fn longest_qualification(
        &self,
        contract: &ContractRef,
        provider: &ProviderName,
        runs: u32,
    ) -> Duration {
        let (Some(contract), Some(provider)) =
            (self.contracts.get(contract), self.providers.get(provider))
        else {
            return Duration::zero();
        };
        let calls =
            i32::try_from(contract.samples.len() as u64 * u64::from(runs)).unwrap_or(i32::MAX);
        provider.config.timeout() * calls
    }

    /// Qualifies `provider` for `contract` through its real client (`runs` runs of each sample, `progress` told of
    /// each) and stores the evidence. `None` when either is not configured.
    pub async fn requalify(
        &self,
        contract: &ContractRef,
        provider: &ProviderName,
        runs: u32,
        progress: impl FnMut(&crate::domain::RunEvidence, usize, usize),
    ) -> Result<Option<Qualification>, StoreError> {
        let (Some(contract), Some(configured)) =
            (self.contracts.get(contract), self.providers.get(provider))
        else {
            return Ok(None);
        };
        let evidence = crate::providers::qualify::qualify(
            contract,
            provider,
            configured,
            runs,
            &*self.clock,
            progress,
        )
        .await;
        self.evidence
            .forget(&(contract.fingerprint, configured.fingerprint));
        self.store.put_qualification(&evidence).await?;
        Ok(Some(evidence))
    }
}
