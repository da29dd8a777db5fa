//! Qualification: a provider keeps a contract or it does not, and a failed check names its reason. Each
//! misbehaviour is a real HTTP stand-in on loopback, spoken to in every wire format (openai, anthropic, and
//! Bedrock's Converse, signed) through the real clients; time is a manual clock, so "slower than the timeout"
//! needs no waiting. `bedrock.rs`: what each Bedrock answer means.

mod bedrock;
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

/// An engine on `store` whose chain is `primary` → `fallback` (the stand-in), with the built-in contracts and the
/// contract `files`.
fn engine(store: Arc<dyn JobStore>, files: &[PathBuf], fallback: ProviderConfig) -> Engine {
    let mut config = Config {
        contract_files: files.to_vec(),
        ..Config::default()
    };
    config
        .providers
        .insert(ProviderName::parse("fallback").unwrap(), fallback);
    config.providers.insert(
        ProviderName::parse("primary").unwrap(),
        ProviderConfig::demo(Default::default(), 0),
    );
    let clock = clock();
    let (process, _) = Process::local(store, clock);
    let keys = ProviderKeys::default();
    startup::engine(&config, Role::Command, &keys, process).unwrap()
}

/// A job on primary → fallback whose attempt 1 has ended, as the gate sees it.
fn job_after_primary() -> Job {
    let input = json!({"text": "x"});
    let mut job = Job::new(
        NewJob {
            owner: Owner::parse("alice").unwrap(),
            idempotency_key: IdempotencyKey::parse("k").unwrap(),
            fingerprint: Fingerprint::of_intent("summarize@1", &input, None),
            contract: ContractRef::parse("summarize@1").unwrap(),
            input,
            providers: vec![
                ProviderName::parse("primary").unwrap(),
                ProviderName::parse("fallback").unwrap(),
            ],
        },
        chrono::Duration::days(30),
        &Stamp::fresh(Utc::now()),
    );
    job.attempts[0].state = onejob::domain::AttemptState::Failed;
    job
}

/// What failover does for `job` on `engine`'s ledger.
async fn gate_says(engine: &Engine, job: &Job) -> String {
    match job.failover_decision(&engine.failover(job).await.unwrap()) {
        FailoverDecision::Queue(provider) => format!("queue {provider}"),
        FailoverDecision::Stop(error) => error.code,
    }
}

#[tokio::test]
async fn editing_the_prompt_or_the_model_voids_a_stored_qualification() {
    let stand_in = StandIn::answering(good()).await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn JobStore> =
        Arc::new(SqliteStore::open(&dir.path().join("onejob.db")).unwrap());
    let original = engine(store.clone(), &[], openai(stand_in.base_url()));
    let job = job_after_primary();
    assert_eq!(gate_says(&original, &job).await, "fallback_not_qualified");

    let name = ProviderName::parse("fallback").unwrap();
    let contract = summarize(&original.contracts);
    let evidence = qualify(
        contract,
        &name,
        original.providers.get(&name).unwrap(),
        1,
        &*original.clock,
        |_, _, _| {},
    )
    .await;
    assert!(evidence.passed, "{}", summary(&evidence));
    store.put_qualification(&evidence).await.unwrap();
    assert_eq!(gate_says(&original, &job).await, "queue fallback");

    // The same contract with one word of its prompt changed: a new fingerprint, no evidence for it.
    let edited = tempfile::tempdir().unwrap();
    let file = edited.path().join("summarize.toml");
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts/summarize.toml");
    let text = std::fs::read_to_string(built_in).unwrap();
    std::fs::write(
        &file,
        text.replace("You summarise texts.", "You summarise texts briefly."),
    )
    .unwrap();
    let after_edit = engine(store.clone(), &[file], openai(stand_in.base_url()));
    assert_ne!(
        summarize(&after_edit.contracts).fingerprint,
        contract.fingerprint
    );
    assert_eq!(gate_says(&after_edit, &job).await, "fallback_not_qualified");

    // The same provider on another model, or with a shorter timeout than it was qualified with.
    let other_model = timed(ProviderKind::Openai(OpenAiSettings(ProviderEndpoint {
        model: "gpt-4o".into(),
        ..endpoint(stand_in.base_url())
    })));
    let shorter_timeout = openai(stand_in.base_url()).with_timings(10, LATE_MS);
    for changed in [other_model, shorter_timeout] {
        let after_swap = engine(store.clone(), &[], changed);
        assert_eq!(gate_says(&after_swap, &job).await, "fallback_not_qualified");
    }
}

/// With `requalify_stale`, the sweeper qualifies again, through the real client, a provider whose evidence grew
/// old, and then has nothing left to do; without it, the sweeper never calls a provider.
#[tokio::test]
async fn the_sweeper_requalifies_stale_evidence_only_when_asked() {
    let stand_in = StandIn::answering(good()).await;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn JobStore> =
        Arc::new(SqliteStore::open(&dir.path().join("onejob.db")).unwrap());
    let mut engine = engine(store.clone(), &[], openai(stand_in.base_url()));
    let name = ProviderName::parse("fallback").unwrap();
    let evidence = qualify(
        summarize(&engine.contracts),
        &name,
        engine.providers.get(&name).unwrap(),
        1,
        &*engine.clock,
        |_, _, _| {},
    )
    .await;
    assert!(evidence.passed, "{}", summary(&evidence));
    let old = Qualification {
        checked_at: engine.clock.now() - Duration::days(31),
        ..evidence
    };
    store.put_qualification(&old).await.unwrap();
    let calls = stand_in.call_count();
    let needed = engine.needing_requalification().await.unwrap();
    assert_eq!(needed.len(), 1);
    assert_eq!(needed[0].2.code, "qualification_stale");

    assert_eq!(sweep(&engine, None).await.unwrap().requalified, 0);
    assert_eq!(stand_in.call_count(), calls, "off by default: no call");

    engine.settings.requalify_stale = true;
    assert_eq!(sweep(&engine, None).await.unwrap().requalified, 1);
    assert!(stand_in.call_count() > calls);
    let renewed = engine
        .qualification(&summarize(&engine.contracts).reference, &name)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (renewed.passed, renewed.checked_at),
        (true, engine.clock.now())
    );
    assert!(engine.needing_requalification().await.unwrap().is_empty());
    assert_eq!(sweep(&engine, None).await.unwrap().requalified, 0);
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

/// An openai provider on `model` at `stand_in`, its endpoint as `shape` leaves it.
fn shaped(
    stand_in: &StandIn,
    model: &str,
    shape: impl FnOnce(&mut ProviderEndpoint),
) -> ProviderConfig {
    let mut endpoint = ProviderEndpoint {
        model: model.into(),
        ..endpoint(stand_in.base_url())
    };
    shape(&mut endpoint);
    timed(ProviderKind::Openai(OpenAiSettings(endpoint)))
}

/// Today's reasoning models refuse `max_tokens` and any temperature but theirs: a provider on one qualifies by
/// its family's default (gpt-5, o-series), or, under a name that does not tell (a deployment, a server of its
/// own), once its settings say so — and not before.
#[tokio::test]
async fn a_reasoning_model_answers_once_its_settings_say_so() {
    let samples = 3;
    // A name that does not tell: the legacy fields go out and are refused, definitely, one call per run.
    let stand_in = StandIn::spawn(vec![], Reply::Reasoning(good())).await;
    let evidence = qualify_summarize(shaped(&stand_in, "team-reasoner", |_| {}), 1).await;
    assert!(!evidence.passed);
    assert_eq!(evidence.first_problem().unwrap().code, "provider_refused");
    assert_eq!(stand_in.calls().len(), samples);

    let settled = shaped(&stand_in, "team-reasoner", |e| {
        e.token_limit_field = Some(TokenLimitField::MaxCompletionTokens);
        e.send_temperature = Some(false);
        e.reasoning_effort = Some("low".into());
    });
    let evidence = qualify_summarize(settled, 1).await;
    assert!(evidence.passed, "{evidence:?}");
    let sent = stand_in.calls().last().unwrap().body.clone();
    assert_eq!(sent["max_completion_tokens"], 256);
    assert_eq!(sent["reasoning_effort"], "low");
    assert!(
        sent.get("max_tokens").is_none() && sent.get("temperature").is_none(),
        "{sent}"
    );
    assert_eq!(stand_in.calls().len(), 2 * samples);

    // A family the name tells: no setting needed.
    for model in ["gpt-5-mini", "o4-mini", "openai/gpt-5"] {
        let evidence = qualify_summarize(shaped(&stand_in, model, |_| {}), 1).await;
        assert!(evidence.passed, "{model}: {evidence:?}");
    }
    // And a model that takes both still gets them.
    let classic = StandIn::answering(good()).await;
    assert!(
        qualify_summarize(shaped(&classic, "gpt-4.1-mini", |_| {}), 1)
            .await
            .passed
    );
    let sent = classic.calls()[0].body.clone();
    assert_eq!(
        (&sent["max_tokens"], &sent["temperature"]),
        (&json!(256), &json!(0.0))
    );
}

/// Azure OpenAI's shape — a deployment's path, an `api-version`, the key in `api-key` — and a server's own headers
/// and body fields, all from the provider's settings; each is part of its fingerprint.
#[tokio::test]
async fn an_azure_style_endpoint_is_reached_as_its_settings_say() {
    let stand_in = StandIn::answering(good()).await;
    let azure = |e: &mut ProviderEndpoint| {
        e.base_url = stand_in
            .base_url()
            .replace("/v1", "/openai/deployments/team-gpt");
        e.query = [("api-version".to_owned(), "2024-10-21".to_owned())].into();
        e.api_key_header = Some("api-key".into());
        e.headers = [("x-team".to_owned(), "support".to_owned())].into();
        e.body = [("user".to_owned(), json!("onejob"))].into_iter().collect();
    };
    let evidence = qualify_summarize(shaped(&stand_in, "gpt-4.1-mini", azure), 1).await;
    assert!(evidence.passed, "{evidence:?}");
    let call = stand_in.calls().pop().unwrap();
    assert_eq!(
        call.uri.path(),
        "/openai/deployments/team-gpt/chat/completions"
    );
    assert_eq!(call.uri.query(), Some("api-version=2024-10-21"));
    assert_eq!(call.headers["api-key"], env!("CARGO_PKG_NAME"));
    assert!(call.headers.get("authorization").is_none());
    assert_eq!(call.headers["x-team"], "support");
    assert_eq!(call.body["user"], "onejob");

    let plain = fingerprint(&shaped(&stand_in, "gpt-4.1-mini", |_| {}));
    let shaped_too = fingerprint(&shaped(&stand_in, "gpt-4.1-mini", |e| {
        e.send_temperature = Some(false)
    }));
    assert_ne!(
        plain, shaped_too,
        "another request shape is another provider to qualify"
    );
    // A setting that fights onejob's own fields is refused when the config is read.
    let fights = shaped(&stand_in, "gpt-4.1-mini", |e| {
        e.body = [("max_tokens".to_owned(), json!(5))].into_iter().collect();
    });
    assert!(fights.check().unwrap_err().contains("token_limit_field"));
}
