//! `onejob qualify <contract> <provider>`: every sample input of the contract, `runs` times each, at the
//! contract's temperature, through the provider's real client and the same [`checks`] the worker applies, each
//! call bounded by the provider's timeout. The provider passes only if every run passes every check. The
//! evidence is stored under both fingerprints; the failover gate ([`crate::engine::Engine::failover`])
//! reads it there.

use std::fmt::Write as _;

use super::checks;
use super::{ConfiguredProvider, ProviderOutcome};
use crate::clock::Clock;
use crate::contracts::Contract;
use crate::domain::{CallReport, ErrorInfo, ProviderName, Qualification, RunEvidence, Timestamp};

/// The default number of runs of each sample.
pub const DEFAULT_RUNS: u32 = 3;

/// Runs the qualification; `progress` hears of each run as it ends, with how many are done of how many.
pub async fn qualify(
    contract: &Contract,
    name: &ProviderName,
    provider: &ConfiguredProvider,
    runs_per_sample: u32,
    clock: &dyn Clock,
    mut progress: impl FnMut(&RunEvidence, usize, usize),
) -> Qualification {
    let checked_at = clock.now();
    let total = contract.samples.len() * runs_per_sample as usize;
    let mut runs = Vec::with_capacity(total);
    for (sample, input) in contract.samples.iter().enumerate() {
        for run in 1..=runs_per_sample {
            // A key of its own per run: a provider that honours idempotency keys must not replay an earlier run.
            let key = format!(
                "qualify:{}:{name}:{}:{sample}:{run}",
                contract.reference,
                checked_at.timestamp_millis()
            );
            let evidence = one_run(contract, provider, input, key, clock, sample, run).await;
            progress(&evidence, runs.len() + 1, total);
            runs.push(evidence);
        }
    }
    Qualification {
        contract: contract.reference.clone(),
        contract_fingerprint: contract.fingerprint,
        provider: name.clone(),
        provider_fingerprint: provider.fingerprint,
        passed: !runs.is_empty() && runs.iter().all(|r| r.problem.is_none()),
        runs_per_sample,
        checked_at,
        runs,
        strikes: Vec::new(),
        suspected: None,
    }
}

async fn one_run(
    contract: &Contract,
    provider: &ConfiguredProvider,
    input: &serde_json::Value,
    key: String,
    clock: &dyn Clock,
    sample: usize,
    run: u32,
) -> RunEvidence {
    let started = clock.now();
    let mut evidence = RunEvidence {
        sample,
        run,
        problem: None,
        elapsed_ms: 0,
        counted_prompt_tokens: None,
        report: None,
    };
    let prepared = match checks::prepare(contract, provider, input, key) {
        Ok(prepared) => prepared,
        Err(problem) => {
            evidence.problem = Some(problem);
            return evidence;
        }
    };
    evidence.counted_prompt_tokens = Some(prepared.sent_tokens.upper);
    let reply = tokio::select! {
        reply = provider.client.call(&prepared.request) => Some(reply),
        () = clock.sleep(provider.config.timeout()) => None,
    };
    evidence.elapsed_ms = elapsed_ms(started, clock.now());
    let Some(reply) = reply else {
        evidence.problem = Some(ErrorInfo::new(
            "timeout",
            format!(
                "no answer within the provider's timeout_ms = {}",
                provider.config.timeout_ms()
            ),
        ));
        return evidence;
    };
    let mut report = reply.report.clone();
    checks::annotate(&prepared, &mut report);
    evidence.problem = match &reply.outcome {
        ProviderOutcome::Answered(output) => {
            checks::check_answer(contract, &prepared, output, &report)
                .err()
                .map(|problem| reply.redacted(problem))
        }
        ProviderOutcome::Failed(problem) | ProviderOutcome::Lost(problem) => Some(problem.clone()),
    };
    evidence.report = CallReport::into_option(report);
    evidence
}

fn elapsed_ms(from: Timestamp, to: Timestamp) -> u64 {
    u64::try_from((to - from).num_milliseconds()).unwrap_or(0)
}

/// One line of progress: `[ 2/9] sample 1, run 2: pass (312 ms)`.
pub fn progress_line(run: &RunEvidence, done: usize, total: usize) -> String {
    let width = total.to_string().len();
    let verdict = match &run.problem {
        None => "pass".to_owned(),
        Some(problem) => format!("FAIL {}", problem.code),
    };
    format!(
        "[{done:>width$}/{total}] sample {}, run {}: {verdict} ({} ms)",
        run.sample + 1,
        run.run,
        run.elapsed_ms
    )
}

/// The verdict and a table with a row per sample: runs passed, and what failed and why.
pub fn summary(q: &Qualification) -> String {
    let mut out = String::new();
    let verdict = if q.passed {
        "QUALIFIED"
    } else {
        "NOT QUALIFIED"
    };
    let _ = writeln!(
        out,
        "{} on {}: {verdict} ({} runs of each sample)",
        q.contract, q.provider, q.runs_per_sample
    );
    let _ = writeln!(out, "{:<8} {:<7} failures", "sample", "passed");
    let samples = q.runs.iter().map(|r| r.sample).max().map_or(0, |m| m + 1);
    for sample in 0..samples {
        let runs: Vec<&RunEvidence> = q.runs.iter().filter(|r| r.sample == sample).collect();
        let passed = runs.iter().filter(|r| r.problem.is_none()).count();
        let mut failures = runs
            .iter()
            .filter_map(|r| r.problem.as_ref().map(|p| (r.run, p)));
        let first = failures
            .next()
            .map_or_else(|| "-".to_owned(), |(run, p)| describe(run, p));
        let _ = writeln!(
            out,
            "{:<8} {:<7} {first}",
            sample + 1,
            format!("{passed}/{}", runs.len())
        );
        for (run, problem) in failures {
            let _ = writeln!(out, "{:<16} {}", "", describe(run, problem));
        }
    }
    out
}

fn describe(run: u32, problem: &ErrorInfo) -> String {
    format!("run {run}: {}: {}", problem.code, problem.message)
}
