//! `onejob qualify` and `onejob providers`: the ledger's evidence, made and shown.

use std::process::ExitCode;

use crate::error::CliError;
use crate::ledger::Ledger;
use onejob::clock::SystemClock;
use onejob::domain::{ContractRef, ProviderName};
use onejob::providers::qualify;

pub async fn run_qualify(
    contract: &str,
    provider: &str,
    runs: u32,
    ledger: &Ledger,
) -> Result<ExitCode, CliError> {
    let (engine, place) = ledger.engine().await?;
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
    let configured = providers.get(&name).ok_or_else(|| {
        let known: Vec<String> = providers.iter().map(|(n, _)| n.to_string()).collect();
        CliError::Usage(format!(
            "no provider {name}; configured: {}",
            known.join(", ")
        ))
    })?;
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
    let evidence = qualify::qualify(
        contract,
        &name,
        configured,
        runs,
        &SystemClock,
        |run, done, total| {
            eprintln!("{}", qualify::progress_line(run, done, total));
        },
    )
    .await;
    engine.record_qualification(&evidence).await?;
    print!("{}", qualify::summary(&evidence));
    println!("evidence stored in {place}");
    Ok(if evidence.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub async fn list_providers(ledger: &Ledger) -> Result<(), CliError> {
    let (engine, _) = ledger.engine().await?;
    let providers = &engine.providers;
    let standings = engine.standings().await?;
    println!(
        "{:<16} {:<10} {:<14} {:<12} {:<25} problem",
        "provider", "kind", "contract", "standing", "checked at"
    );
    for (name, rows) in standings {
        let kind = providers.get(&name).map_or("", |p| p.config.kind());
        for row in rows {
            let checked = row.evidence.as_ref().map_or_else(
                || "-".to_owned(),
                |q| {
                    q.checked_at
                        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                },
            );
            let problem = row
                .evidence
                .as_ref()
                .and_then(|q| q.first_problem())
                .map_or_else(|| "-".to_owned(), |p| format!("{}: {}", p.code, p.message));
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
