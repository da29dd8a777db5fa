//! What the integration tests share: provider stand-ins and an engine rig.

#![allow(dead_code, unused_imports)] // Each test binary uses its own part of this module.

pub(crate) mod aws;
pub(crate) mod collector;
pub(crate) mod faulty;
pub(crate) mod process;
pub(crate) mod rig;
pub(crate) mod stand_in;
pub(crate) mod wire;

use onejob::domain::{CallReport, ProviderName, Qualification, RunEvidence};
use onejob::engine::Engine;
use onejob::store::JobStore;

/// Records in `store`, the engine's, that `provider` passed qualification for every contract it knows, under their
/// current fingerprints: the state a successful `onejob qualify` leaves behind.
pub(crate) async fn record_qualified(engine: &Engine, store: &dyn JobStore, provider: &str) {
    record_qualified_runs(engine, store, provider, Vec::new()).await;
}

/// [`record_qualified`], with one passed run in which the provider reported `model`.
pub(crate) async fn record_qualified_as(
    engine: &Engine,
    store: &dyn JobStore,
    provider: &str,
    model: &str,
) {
    let run = RunEvidence {
        sample: 0,
        run: 1,
        problem: None,
        elapsed_ms: 1,
        counted_prompt_tokens: None,
        report: Some(CallReport {
            model: Some(model.to_owned()),
            ..CallReport::default()
        }),
    };
    record_qualified_runs(engine, store, provider, vec![run]).await;
}

async fn record_qualified_runs(
    engine: &Engine,
    store: &dyn JobStore,
    provider: &str,
    runs: Vec<RunEvidence>,
) {
    let name = ProviderName::parse(provider).unwrap();
    let configured = engine.providers.get(&name).expect("a configured provider");
    for contract in engine.contracts.iter() {
        let evidence = Qualification {
            contract: contract.reference.clone(),
            contract_fingerprint: contract.fingerprint,
            provider: name.clone(),
            provider_fingerprint: configured.fingerprint,
            passed: true,
            runs_per_sample: 1,
            checked_at: engine.clock.now(),
            runs: runs.clone(),
            strikes: Vec::new(),
            suspected: None,
        };
        store.put_qualification(&evidence).await.unwrap();
    }
}

/// The sum of metric `name`'s samples in Prometheus text `text` whose labels include each `key="value"` of
/// `labels` (a histogram's `_bucket`, `_sum` and `_count` are series of their own names).
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
            series_name == name
                && labels
                    .iter()
                    .all(|(k, v)| series_labels.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, value)| value.parse::<f64>().unwrap())
        .sum()
}
