//! The pure core: identifiers, the intent's fingerprint, jobs, attempts and their transitions. No I/O, no async.

pub mod fingerprint;
pub mod ids;
pub mod job;
pub mod qualification;

pub use fingerprint::Fingerprint;
pub use ids::{ContractRef, IdempotencyKey, JobId, Owner, ParseError, ProviderName, WriteToken};
pub use job::{
    Attempt, AttemptCancel, AttemptRef, AttemptState, CallReport, Completion, ErrorInfo, Failover,
    Job, JobCancel, JobStatus, MAX_INPUT_BYTES, NewJob, NextStep, Refusal, Stamp, Timestamp,
    expiry,
};
pub use qualification::{Qualification, RunEvidence, Standing};
