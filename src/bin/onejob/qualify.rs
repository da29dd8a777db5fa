//! `onejob qualify` and `onejob providers`: a provider's qualification evidence, made and shown.

use std::process::ExitCode;

use crate::error::CliError;
use crate::storage::Storage;
use onejob::contracts::Contract;
use onejob::domain::{BreakerState, ContractRef, ProviderName};
use onejob::engine::Engine;
use onejob::providers::qualify;

pub(crate) async fn run_qualify(
    contract: &str,
    provider: &str,
    runs: u32,
    storage: &Storage,
) -> Result<ExitCode, CliError> {
    let (engine, place) = storage.engine().await?;
    let (contracts, providers) = (&engine.contracts, &engine.providers);
    let reference = ContractRef::parse(contract).map_err(|e| CliError::Usage(e.to_string()))?;
    let contract = contracts.get(&reference).ok_or_else(|| {
        let known: Vec<String> = contracts.iter().map(|c| c.reference.to_string()).collect();
        CliError::Usage(format!(
            "no contract {reference}; known: {}",
            known.join(", ")
        ))
    })?;
    let name = ProviderName::parse(provider).map_err(|e| CliError::Usage(e.to_string()))?;
    if providers.get(&name).is_none() {
        let known: Vec<String> = providers.iter().map(|(n, _)| n.to_string()).collect();
        return Err(CliError::Usage(format!(
            "no provider {name}; configured: {}",
            known.join(", ")
        )));
    }
    let passed = qualify_pair(&engine, contract, &name, runs).await?;
    println!("evidence stored in {place}");
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `onejob qualify --stale`: every pair whose qualification passed and that production suspects, or that grew too
/// old, is qualified again. Exit status 0 when all pass (or none needed it), 1 when one fails.
pub(crate) async fn requalify_stale(runs: u32, storage: &Storage) -> Result<ExitCode, CliError> {
    let (engine, place) = storage.engine().await?;
    let needed = engine.needing_requalification().await?;
    if needed.is_empty() {
        println!("every qualification stands: nothing to requalify");
        return Ok(ExitCode::SUCCESS);
    }
    let mut all_passed = true;
    for (name, reference, why) in needed {
        eprintln!("{name} for {reference}: {}", why.code);
        let contract = engine
            .contracts
            .get(&reference)
            .expect("a standing names a known contract");
        all_passed &= qualify_pair(&engine, contract, &name, runs).await?;
    }
    println!("evidence stored in {place}");
    Ok(if all_passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Qualifies `name` for `contract` through its real client, with progress, and stores the evidence; whether it
/// passed.
async fn qualify_pair(
    engine: &Engine,
    contract: &Contract,
    name: &ProviderName,
    runs: u32,
) -> Result<bool, CliError> {
    let reference = &contract.reference;
    if contract.samples.is_empty() {
        return Err(CliError::Usage(format!(
            "{reference} has no samples to qualify with; add [[samples]] to its file"
        )));
    }
    eprintln!(
        "qualifying {name} for {reference}: {} samples x {runs} runs at temperature {}",
        contract.samples.len(),
        contract.temperature
    );
    let evidence = engine
        .requalify(reference, name, runs, |run, done, total| {
            eprintln!("{}", qualify::progress_line(run, done, total));
        })
        .await?
        .expect("a configured provider and contract");
    print!("{}", qualify::summary(&evidence));
    Ok(evidence.passed)
}

pub(crate) async fn list_providers(storage: &Storage) -> Result<(), CliError> {
    let (engine, _) = storage.engine().await?;
    let providers = &engine.providers;
    let standings = engine.standings().await?;
    println!(
        "{:<16} {:<10} {:<14} {:<12} {:<25} problem",
        "provider", "kind", "contract", "standing", "checked at"
    );
    for (name, rows) in standings {
        let kind = providers.get(&name).map_or("", |p| p.config.kind());
        let (breaker, state) = engine.breaker(&name).await?;
        if state != BreakerState::Closed || !breaker.failures.is_empty() {
            let until = breaker
                .open_until
                .map_or_else(String::new, |t| format!(" until {t}"));
            println!(
                "{:<16} breaker {state}{until}: {} recent failures, opened {} times",
                name.as_str(),
                breaker.failures.len(),
                breaker.trips
            );
        }
        for row in rows {
            let checked = row.evidence.as_ref().map_or_else(
                || "-".to_owned(),
                |q| {
                    q.checked_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                },
            );
            // The operator's view: what production suspects (other owners' jobs) shows beside the standing.
            let suspicion = row.evidence.as_ref().and_then(|q| q.suspected.as_ref());
            let problem = match (&row.reason, suspicion) {
                (Some(p), _) => format!("{}: {}", p.code, p.message),
                (None, Some(s)) => format!(
                    "suspected, to be qualified again ({}): {} [{}]",
                    s.reason.code,
                    s.reason.message,
                    s.attempts.join(", ")
                ),
                (None, None) => "-".to_owned(),
            };
            println!(
                "{:<16} {:<10} {:<14} {:<12} {:<25} {problem}",
                name.as_str(),
                kind,
                row.contract.to_string(),
                row.standing.as_str(),
                checked
            );
        }
    }
    Ok(())
}
