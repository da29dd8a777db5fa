//! Qualification: a provider keeps a contract or it does not, and a failed check names its reason. Each
//! misbehaviour is a real HTTP stand-in on loopback, spoken to in every wire format (openai, anthropic, and
//! Bedrock's Converse, signed) through the real clients; time is a manual clock, so "slower than the timeout"
//! needs no waiting. `bedrock.rs`: what each Bedrock answer means.

mod bedrock;
mod evidence;
mod shapes;
#[path = "../support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use onejob::clock::ManualClock;
use onejob::config::Config;
use onejob::contracts::{Contract, Contracts};
use onejob::domain::{
    ContractRef, FailoverDecision, Fingerprint, IdempotencyKey, Job, NewJob, Owner, ProviderName,
    Qualification, Stamp,
};
use onejob::engine::Engine;
use onejob::providers::Providers;
use onejob::providers::keys::ProviderKeys;
use onejob::providers::kinds::openai::OpenAiSettings;
use onejob::providers::qualify::{qualify, summary};
use onejob::providers::{
    ProviderConfig, ProviderEndpoint, ProviderKind, TokenLimitField, fingerprint,
};
use onejob::startup::{self, Process, Role};
use onejob::store::JobStore;
use onejob::store::sqlite::SqliteStore;
use onejob::worker::sweeper::sweep;
use serde_json::{Value, json};

use support::stand_in::{
    BEDROCK_MODEL, Gate, LATE_MS, Reply, StandIn, TIMEOUT_MS, anthropic, bedrock, endpoint, openai,
    timed,
};

/// A provider config for a stand-in's base URL.
type ProviderAt = fn(String) -> ProviderConfig;

/// The three wire formats.
const KINDS: [(&str, ProviderAt); 3] = [
    ("openai", openai),
    ("anthropic", anthropic),
    ("bedrock", bedrock),
];

/// The built-in contracts.
fn contracts() -> Contracts {
    Contracts::load(&[], &Default::default(), true, |_| true).unwrap()
}

fn summarize(contracts: &Contracts) -> &Contract {
    contracts
        .get(&ContractRef::parse("summarize@1").unwrap())
        .unwrap()
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(
        Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap(),
    ))
}

/// `config` as the configured provider `candidate`.
fn providers(config: ProviderConfig, clock: Arc<ManualClock>) -> Providers {
    let name = ProviderName::parse("candidate").unwrap();
    let keys = ProviderKeys::default().with_aws(support::stand_in::aws());
    Providers::from_config(&[(name, config)].into(), &keys, clock).unwrap()
}

/// Qualifies `config` for summarize@1, `runs` runs of each sample.
async fn qualify_summarize(config: ProviderConfig, runs: u32) -> Qualification {
    let clock = clock();
    let providers = providers(config, clock.clone());
    let name = ProviderName::parse("candidate").unwrap();
    let contracts = contracts();
    let candidate = providers.get(&name).unwrap();
    qualify(
        summarize(&contracts),
        &name,
        candidate,
        runs,
        &*clock,
        |_, _, _| {},
    )
    .await
}

fn good() -> Value {
    json!({"summary": "The meeting moved to Thursday."})
}

/// Every run of one qualification against a stand-in that always replies `reply` fails with `code`, and the
/// reason says `reason`; in both wire formats.
async fn fails_with(reply: Reply, code: &str, reason: &str) -> Vec<Qualification> {
    let mut all = Vec::new();
    for (kind, config) in KINDS {
        let stand_in = StandIn::spawn(vec![], reply.clone()).await;
        let evidence = qualify_summarize(config(stand_in.base_url()), 1).await;
        assert!(!evidence.passed, "{kind}: {evidence:?}");
        assert_eq!(evidence.runs.len(), 3, "{kind}: one run per sample");
        for run in &evidence.runs {
            let problem = run.problem.as_ref().expect("every run fails");
            assert_eq!(problem.code, code, "{kind}: {problem:?}");
            assert!(
                problem.message.contains(reason),
                "{kind}: {:?} should say {reason:?}",
                problem.message
            );
        }
        all.push(evidence);
    }
    all
}

#[tokio::test]
async fn a_well_behaved_provider_qualifies_in_both_wire_formats() {
    for (kind, config) in KINDS {
        let stand_in = StandIn::answering(good()).await;
        let mut seen = Vec::new();
        let clock = clock();
        let providers = providers(config(stand_in.base_url()), clock.clone());
        let name = ProviderName::parse("candidate").unwrap();
        let contracts = contracts();
        let evidence = qualify(
            summarize(&contracts),
            &name,
            providers.get(&name).unwrap(),
            2,
            &*clock,
            |run, done, total| seen.push((run.sample, run.run, done, total)),
        )
        .await;
        assert!(evidence.passed, "{kind}: {}", summary(&evidence));
        assert_eq!(evidence.runs.len(), 6, "{kind}: 3 samples x 2 runs");
        assert_eq!(stand_in.call_count(), 6, "{kind}: every run is a real call");
        assert_eq!(seen.first(), Some(&(0, 1, 1, 6)), "{kind}: progress");
        assert_eq!(seen.last(), Some(&(2, 2, 6, 6)), "{kind}: progress");
        let (temperature, budget, model) = match kind {
            "bedrock" => (
                "/inferenceConfig/temperature",
                "/inferenceConfig/maxTokens",
                BEDROCK_MODEL,
            ),
            _ => ("/temperature", "/max_tokens", "stand-in-model"),
        };
        for call in stand_in.calls() {
            assert_eq!(call.body.pointer(temperature), Some(&json!(0.0)), "{kind}");
            assert_eq!(call.body.pointer(budget), Some(&json!(256)), "{kind}");
        }
        if kind != "bedrock" {
            // Bedrock takes no idempotency key.
            let keys: std::collections::BTreeSet<String> = stand_in
                .calls()
                .iter()
                .map(|c| c.headers["idempotency-key"].to_str().unwrap().to_owned())
                .collect();
            assert_eq!(keys.len(), 6, "{kind}: a key of its own per run");
        }
        let run = &evidence.runs[0];
        let report = run.report.as_ref().unwrap();
        assert_eq!(report.model.as_deref(), Some(model), "{kind}");
        assert!(report.input_tokens.unwrap() > 0, "{kind}");
        assert!(run.counted_prompt_tokens.unwrap() > 0, "{kind}");
        assert!(summary(&evidence).contains("QUALIFIED"), "{kind}");
    }
}

#[tokio::test]
async fn an_extra_top_level_key_fails() {
    let reply = Reply::Answer(json!({"summary": "s", "confidence": 0.9}));
    fails_with(reply, "output_invalid", "confidence").await;
}

#[tokio::test]
async fn prose_instead_of_json_fails() {
    let reply = Reply::Prose("Sure! Here is a summary: the meeting moved.");
    fails_with(reply, "output_not_json", "Here is a summary").await;
}

#[tokio::test]
async fn wrong_field_names_fail() {
    // The model ignored the system prompt and named the field after the input.
    let reply = Reply::Answer(json!({"text": "The meeting moved."}));
    fails_with(
        reply,
        "output_invalid",
        "\"summary\" is a required property",
    )
    .await;
}

#[tokio::test]
async fn output_that_breaks_a_schema_constraint_fails() {
    let reply = Reply::Answer(json!({"summary": ""}));
    fails_with(reply, "output_invalid", "shorter than 1 character").await;
}

/// A provider that reports fewer prompt tokens than the prompt has for certain dropped part of it: where the
/// model's encoding is known (an OpenAI model: no token is longer than 128 bytes) the run fails. Where it is not
/// (the anthropic stand-in's model), nothing is certain: the run passes, with a note on its report.
#[tokio::test]
async fn a_silently_truncated_prompt_fails_where_the_models_encoding_is_known() {
    let truncating = StandIn::spawn(vec![], Reply::Truncated(good())).await;
    let evidence = qualify_summarize(openai(truncating.base_url()), 1).await;
    assert!(!evidence.passed, "{evidence:?}");
    for run in &evidence.runs {
        let problem = run.problem.as_ref().expect("every run fails");
        assert_eq!(problem.code, "prompt_truncated", "{problem:?}");
        assert!(
            problem.message.contains("reports 1 prompt tokens"),
            "{problem:?}"
        );
    }
    let unknown = StandIn::spawn(vec![], Reply::Truncated(good())).await;
    let evidence = qualify_summarize(anthropic(unknown.base_url()), 1).await;
    assert!(evidence.passed, "{evidence:?}");
    for run in &evidence.runs {
        let note = run
            .report
            .as_ref()
            .and_then(|r| r.note.as_deref())
            .unwrap_or_default();
        assert!(note.contains("reports 1 prompt tokens"), "{run:?}");
    }
}

/// Text that packs many bytes a token (separator lines: 64 bytes a token in OpenAI's encodings) is reported as
/// far fewer tokens than a quarter of its bytes: honest, so every run passes, with a note, in both wire formats.
#[tokio::test]
async fn a_prompt_of_few_tokens_for_its_bytes_is_noted_not_failed() {
    for (kind, config) in KINDS {
        let packed = StandIn::spawn(vec![], Reply::Packed(good(), 64)).await;
        let evidence = qualify_summarize(config(packed.base_url()), 1).await;
        assert!(evidence.passed, "{kind}: {evidence:?}");
        assert!(
            evidence
                .runs
                .iter()
                .all(|r| r.report.as_ref().is_some_and(|r| r.note.is_some())),
            "{kind}: {evidence:?}"
        );
    }
}

#[tokio::test]
async fn http_500_fails() {
    fails_with(
        Reply::Status(500, "upstream exploded"),
        "provider_error",
        "HTTP 500",
    )
    .await;
}

#[tokio::test]
async fn http_429_fails_and_keeps_retry_after_for_the_operator() {
    let all = fails_with(Reply::RateLimited(7), "rate_limited", "Retry-After: 7 s").await;
    for evidence in all {
        let report = evidence.runs[0].report.as_ref().unwrap();
        assert_eq!(report.retry_after_s, Some(7));
    }
}

#[tokio::test]
async fn a_context_window_too_small_fails_without_a_call() {
    for (kind, config) in KINDS {
        let stand_in = StandIn::answering(good()).await;
        // The output budget alone is 256 tokens.
        let mut small = config(stand_in.base_url());
        small.limits.context_window = Some(300);
        let evidence = qualify_summarize(small, 1).await;
        assert!(!evidence.passed, "{kind}");
        let problem = evidence.first_problem().unwrap();
        assert_eq!(problem.code, "context_window_exceeded", "{kind}");
        assert!(
            problem.message.contains("context window of 300"),
            "{kind}: {problem:?}"
        );
        assert_eq!(stand_in.call_count(), 0, "{kind}: nothing is sent");
    }
}

#[tokio::test]
async fn an_answer_slower_than_the_timeout_fails() {
    for (kind, config) in KINDS {
        let gate = Gate::new();
        let stand_in = StandIn::spawn(vec![], Reply::Held(gate.clone())).await;
        let clock = clock();
        let providers = providers(config(stand_in.base_url()), clock.clone());
        let name = ProviderName::parse("candidate").unwrap();
        let contracts = contracts();
        let run = qualify(
            summarize(&contracts),
            &name,
            providers.get(&name).unwrap(),
            1,
            &*clock,
            |_, _, _| {},
        );
        let drive = async {
            // Each call is held; once it is in, the provider's timeout passes.
            for n in 1..=3 {
                stand_in.received(n).await;
                clock.advance(Duration::milliseconds(TIMEOUT_MS as i64));
            }
        };
        let (evidence, ()) = tokio::join!(run, drive);
        gate.open(good());
        assert!(!evidence.passed, "{kind}");
        for run in &evidence.runs {
            let problem = run.problem.as_ref().unwrap();
            assert_eq!(problem.code, "timeout", "{kind}");
            assert!(problem.message.contains("timeout_ms = 1000"), "{kind}");
            assert_eq!(run.elapsed_ms, TIMEOUT_MS, "{kind}");
        }
    }
}

#[tokio::test]
async fn one_failed_run_among_passes_fails_the_qualification_and_the_table_says_where() {
    let stand_in = StandIn::spawn(
        vec![
            Reply::Answer(good()),
            Reply::Answer(good()),
            Reply::Answer(good()),
            Reply::Answer(good()),
            Reply::Prose("I would rather not."),
        ],
        Reply::Answer(good()),
    )
    .await;
    let evidence = qualify_summarize(openai(stand_in.base_url()), 2).await;
    assert!(!evidence.passed);
    let failed: Vec<(usize, u32)> = evidence
        .runs
        .iter()
        .filter(|r| r.problem.is_some())
        .map(|r| (r.sample, r.run))
        .collect();
    assert_eq!(failed, vec![(2, 1)]);
    let table = summary(&evidence);
    assert!(table.contains("NOT QUALIFIED"), "{table}");
    assert!(
        table.contains("3        1/2     run 1: output_not_json"),
        "{table}"
    );
    assert!(table.contains("1        2/2     -"), "{table}");
}

/// `onejob qualify` and `onejob providers`, run as a user would, on the built-in demo providers.
#[test]
fn the_command_line_qualifies_reports_and_stores() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("onejob.db");
    let onejob = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_onejob"))
            .args(args)
            .arg("--db")
            .arg(&db)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("ONEJOB_CONFIG")
            .env_remove("ONEJOB_STORE")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (status, text) = onejob(&["qualify", "summarize@1", "demo-backup", "--runs", "1"]);
    assert_eq!(status, Some(0), "{text}");
    assert!(text.contains("[3/3] sample 3, run 1: pass"), "{text}");
    assert!(
        text.contains("summarize@1 on demo-backup: QUALIFIED"),
        "{text}"
    );

    let (status, text) = onejob(&["qualify", "summarize@1", "demo-sloppy", "--runs", "1"]);
    assert_eq!(status, Some(1), "{text}");
    assert!(text.contains("NOT QUALIFIED"), "{text}");
    assert!(
        text.contains(
            "run 1: output_invalid: Additional properties are not allowed ('note' was unexpected)"
        ),
        "{text}"
    );

    let (status, text) = onejob(&["qualify", "summarize@9", "demo-backup"]);
    assert_eq!(status, Some(2), "{text}");
    assert!(
        text.contains("no contract summarize@9; known: classify@1, summarize@1"),
        "{text}"
    );

    let (status, text) = onejob(&["providers"]);
    assert_eq!(status, Some(0), "{text}");
    let line = |provider: &str, contract: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{provider:<16} ")) && l.contains(contract))
            .unwrap_or_else(|| panic!("no line for {provider} {contract} in {text}"))
            .to_owned()
    };
    assert!(
        line("demo-backup", "summarize@1").contains(" qualified "),
        "{text}"
    );
    assert!(
        line("demo-backup", "classify@1").contains(" unqualified "),
        "{text}"
    );
    // Another demo provider that answers alike but slower is another provider.
    assert!(
        line("demo", "summarize@1").contains(" unqualified "),
        "{text}"
    );
    assert!(
        line("demo-sloppy", "summarize@1").contains(" failed "),
        "{text}"
    );
    assert!(
        line("demo-sloppy", "summarize@1").contains("output_invalid"),
        "{text}"
    );

    // Nothing has aged yet: --stale has nothing to do.
    let (status, text) = onejob(&["qualify", "--stale", "--runs", "1"]);
    assert_eq!(status, Some(0), "{text}");
    assert!(text.contains("nothing to requalify"), "{text}");

    // The evidence grows old (checked in 2020): unqualified, with the reason, until `--stale` renews it — and only
    // it: evidence that failed is not stale, it failed.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE qualifications SET evidence = json_set(evidence, '$.checked_at', '2020-01-01T00:00:00Z')",
        [],
    )
    .unwrap();
    drop(conn);
    let (_, text) = onejob(&["providers"]);
    let backup = text
        .lines()
        .find(|l| l.starts_with("demo-backup ") && l.contains("summarize@1"))
        .unwrap();
    assert!(backup.contains(" unqualified "), "{text}");
    assert!(backup.contains("qualification_stale"), "{text}");
    let (status, text) = onejob(&["qualify", "--stale", "--runs", "1"]);
    assert_eq!(status, Some(0), "{text}");
    assert!(
        text.contains("demo-backup for summarize@1: qualification_stale"),
        "{text}"
    );
    assert!(
        text.contains("summarize@1 on demo-backup: QUALIFIED"),
        "{text}"
    );
    assert!(!text.contains("demo-sloppy"), "{text}");
    let (_, text) = onejob(&["providers"]);
    let backup = text
        .lines()
        .find(|l| l.starts_with("demo-backup ") && l.contains("summarize@1"))
        .unwrap();
    assert!(backup.contains(" qualified "), "{text}");
}
