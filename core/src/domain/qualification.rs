//! Qualification: evidence, kept in the store beside the jobs, that a provider kept a contract (invariant 9, `docs/design.md`).
//!
//! It is stored under two fingerprints: the contract's (prompt, schemas, temperature, output budget) and the
//! provider's (kind, base URL, model, context window, timeout). Change any of them and the stored evidence no longer
//! applies: the pair is not found, and automatic failover refuses the provider.
//!
//! Evidence ages: older than the deployment's `qualification_max_age_days`, it no longer qualifies. Production keeps
//! watching (invariant 15). The model an answer reports is the provider's own evidence, not an owner's input: a
//! provider that answers as a model qualification never saw is no longer the provider that was qualified, and that
//! voids its standing at once (`model_changed`). Answers that break the contract are suspicion, not proof: an owner
//! controls its inputs, and "answer in prose" is enough to make a model break any contract. A provider whose answers
//! break the contract [`Qualification::STRIKES`] times becomes *suspected*: its standing is unchanged. Either way
//! the operator sees why and which attempts showed it, and the sweeper (where `requalify_stale` lets it spend on
//! it) qualifies it again on the contract's own samples — inputs onejob controls: a pass restores the standing,
//! a failure takes it away.

use std::collections::BTreeSet;

use chrono::Duration;
use serde::{Deserialize, Serialize};

use super::fingerprint::Fingerprint;
use super::ids::{ContractRef, ProviderName};
use super::report::{CallReport, ErrorInfo};
use super::time::Timestamp;

/// The outcome of `onejob qualify <contract> <provider>`, with every run as evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qualification {
    pub contract: ContractRef,
    pub contract_fingerprint: Fingerprint,
    pub provider: ProviderName,
    pub provider_fingerprint: Fingerprint,
    /// Every run passed every check.
    pub passed: bool,
    pub runs_per_sample: u32,
    pub checked_at: Timestamp,
    pub runs: Vec<RunEvidence>,
    /// Production's contract breaches since it passed (attempts, as `job_id#n`), up to [`Self::STRIKES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strikes: Vec<String>,
    /// Why production suspects the provider, if it does: cause to qualify it again — a loss of the standing only
    /// for `model_changed`, which the provider's own answer showed. (Evidence written before suspicion existed
    /// calls it `lost`.)
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "lost")]
    pub suspected: Option<Suspicion>,
}

/// What production saw that calls for a new qualification: other owners' jobs, so an operator's view, never an
/// owner's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspicion {
    /// `model_changed` or `contract_broken`, with what was seen (codes and model ids, never an answer's text).
    pub reason: ErrorInfo,
    pub at: Timestamp,
    /// The attempts that showed it (`job_id#n`).
    pub attempts: Vec<String>,
}

impl Suspicion {
    /// The reason code of a standing voided by the provider's own answer: the model it answered as is not the one
    /// qualified.
    pub const MODEL_CHANGED: &'static str = "model_changed";

    /// Whether it voids the standing (the provider's evidence), rather than only calling for a new qualification.
    pub fn voids(&self) -> bool {
        self.reason.code == Self::MODEL_CHANGED
    }
}

/// One run of one sample input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvidence {
    /// Index into the contract's `samples`.
    pub sample: usize,
    /// 1..=runs_per_sample.
    pub run: u32,
    /// Why the run failed; `None` when it passed.
    pub problem: Option<ErrorInfo>,
    pub elapsed_ms: u64,
    /// The prompt's size as onejob counted it (the provider's tokenizer where known, an upper bound otherwise).
    pub counted_prompt_tokens: Option<u64>,
    pub report: Option<CallReport>,
}

impl Qualification {
    /// Contract breaches in production that take a standing away.
    pub const STRIKES: usize = 3;

    /// The model ids the provider reported while it was qualified.
    pub fn models(&self) -> BTreeSet<&str> {
        self.runs
            .iter()
            .filter_map(|r| r.report.as_ref()?.model.as_deref())
            .collect()
    }

    /// Whether what a production attempt (`job_id#n`) showed — the model it reported, and whether its answer broke
    /// the contract — changes this evidence. Only passed evidence that is not voided changes; a model is compared
    /// only when qualification saw one (and voids a standing already suspected of breaches too); a breach counts
    /// only until the provider is suspected, and once per attempt.
    pub fn notices(&self, attempt: &str, model: Option<&str>, broke: Option<&ErrorInfo>) -> bool {
        if !self.passed || self.suspected.as_ref().is_some_and(Suspicion::voids) {
            return false;
        }
        self.unseen(model).is_some()
            || (self.suspected.is_none()
                && broke.is_some()
                && !self.strikes.iter().any(|a| a == attempt))
    }

    /// `model`, if qualification saw models and not this one: an answer from it is not the qualified provider's.
    pub fn unseen<'m>(&self, model: Option<&'m str>) -> Option<&'m str> {
        let known = self.models();
        model.filter(|m| !known.is_empty() && !known.contains(m))
    }

    /// Records what a production attempt showed (see [`Self::notices`]): a model qualification never saw voids the
    /// standing at once (`model_changed`), a breach is a strike, and [`Self::STRIKES`] of them make the provider
    /// suspected (its standing unchanged). Whether the evidence changed (and must be stored).
    pub fn observe(
        &mut self,
        attempt: &str,
        model: Option<&str>,
        broke: Option<&ErrorInfo>,
        now: Timestamp,
    ) -> bool {
        if !self.notices(attempt, model, broke) {
            return false;
        }
        if let Some(model) = self.unseen(model) {
            let seen: Vec<&str> = self.models().into_iter().collect();
            let message = format!("answered as {model}; qualified as {}", seen.join(", "));
            self.suspected = Some(Suspicion {
                reason: ErrorInfo::new(Suspicion::MODEL_CHANGED, message),
                at: now,
                attempts: vec![attempt.to_owned()],
            });
            return true;
        }
        let Some(problem) = broke else {
            return false;
        };
        self.strikes.push(attempt.to_owned());
        if self.strikes.len() >= Self::STRIKES {
            let message = format!(
                "{} answers broke the contract in production, the last with {}: qualify it again on the \
                 contract's samples",
                self.strikes.len(),
                problem.code,
            );
            self.suspected = Some(Suspicion {
                reason: ErrorInfo::new("contract_broken", message),
                at: now,
                attempts: self.strikes.clone(),
            });
        }
        true
    }

    /// Where this evidence leaves the provider at `now`, and why it does not qualify (or no longer does) when it
    /// passed once. A provider that answered as a model qualification never saw stands unqualified until it is
    /// qualified again; a suspicion of contract breaches changes nothing here.
    pub fn standing(&self, now: Timestamp, max_age: Duration) -> (Standing, Option<ErrorInfo>) {
        if !self.passed {
            return (Standing::Failed, self.first_problem().cloned());
        }
        if let Some(voided) = self.suspected.as_ref().filter(|s| s.voids()) {
            return (Standing::Unqualified, Some(voided.reason.clone()));
        }
        if now - self.checked_at > max_age {
            let days = max_age.num_days();
            let reason = ErrorInfo::new(
                "qualification_stale",
                format!("qualified more than {days} days ago: run `onejob qualify --stale`"),
            );
            return (Standing::Unqualified, Some(reason));
        }
        (Standing::Qualified, None)
    }

    /// The first problem of the first failed run, for one-line summaries.
    pub fn first_problem(&self) -> Option<&ErrorInfo> {
        self.runs.iter().find_map(|r| r.problem.as_ref())
    }
}

/// Where a provider stands for a contract's current fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// Passed qualification: automatic failover may go to it.
    Qualified,
    /// Qualification ran and failed.
    Failed,
    /// No qualification for the current fingerprints (never run, or voided by a change).
    Unqualified,
}

impl Standing {
    /// The standing `evidence` gives at `now`, evidence older than `max_age` qualifying no more.
    pub fn of(evidence: Option<&Qualification>, now: Timestamp, max_age: Duration) -> Self {
        evidence.map_or(Self::Unqualified, |q| q.standing(now, max_age).0)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qualified => "qualified",
            Self::Failed => "failed",
            Self::Unqualified => "unqualified",
        }
    }
}

/// Where one provider stands for one contract.
#[derive(Debug, Clone)]
pub struct ContractStanding {
    pub contract: ContractRef,
    pub standing: Standing,
    /// Why it does not stand qualified (a failed run's problem, a loss in production, stale evidence).
    pub reason: Option<ErrorInfo>,
    pub evidence: Option<Qualification>,
}
