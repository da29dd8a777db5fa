//! Qualification: evidence, kept in the ledger, that a provider kept a contract (invariant 9, `docs/design.md`).
//!
//! It is stored under two fingerprints: the contract's (prompt, schemas, temperature, output budget) and the
//! provider's (kind, base URL, model, context window, timeout). Change any of them and the stored evidence no longer
//! applies: the pair is not found, and automatic failover refuses the provider.

use serde::{Deserialize, Serialize};

use super::fingerprint::Fingerprint;
use super::ids::{ContractRef, ProviderName};
use super::job::Timestamp;
use super::report::{CallReport, ErrorInfo};

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
    pub fn of(evidence: Option<&Qualification>) -> Self {
        match evidence {
            Some(q) if q.passed => Self::Qualified,
            Some(_) => Self::Failed,
            None => Self::Unqualified,
        }
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
    pub evidence: Option<Qualification>,
}
