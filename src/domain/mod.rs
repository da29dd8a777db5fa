//! The pure core: identifiers, the intent's fingerprint, jobs, attempts and their transitions. No I/O, no async.

pub mod fingerprint;
pub mod ids;
pub mod job;
pub mod qualification;

pub use fingerprint::Fingerprint;
pub use ids::{ContractRef, IdempotencyKey, JobId, Owner, ParseError, ProviderName};
pub use job::{
    Attempt, AttemptRef, AttemptState, CallReport, Completion, ErrorInfo, Job, JobCancel,
    JobStatus, NewJob, NextStep, Refusal, Timestamp,
};
pub use qualification::{Qualification, RunEvidence, Standing};
