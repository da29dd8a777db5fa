use super::*;

#[test]
fn env_tokens_add_to_the_file_and_bad_entries_are_refused() {
    let config = Config::load(None, Some("tA=alice, tB=bob")).unwrap();
    assert_eq!(config.tokens.len(), 2);
    assert_eq!(config.tokens["tB"].as_str(), "bob");
    assert!(Config::load(None, Some("no-equals-sign")).is_err());
    assert!(Config::load(None, Some("=alice")).is_err());
    assert!(Config::load(None, Some("t=")).is_err());
}

#[test]
fn unknown_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.toml");
    std::fs::write(&path, "contracts_dir = \"x\"\n").unwrap();
    let err = Config::load(Some(&path), None).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
}

#[test]
fn provider_keys_must_fit_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.toml");
    std::fs::write(&path, "[providers.x]\nkind = \"openai\"\nmodel = \"m\"\n").unwrap();
    let err = Config::load(Some(&path), None).unwrap_err();
    let said = crate::telemetry::error_chain(&err);
    assert!(said.contains("missing field `base_url`"), "{said}");
    std::fs::write(&path, "[providers.x]\nkind = \"demo\"\nmodel = \"m\"\n").unwrap();
    assert!(Config::load(Some(&path), None).is_err());
    std::fs::write(
        &path,
        "[providers.x]\nkind = \"demo\"\nbehavior = \"hang\"\n",
    )
    .unwrap();
    let config = Config::load(Some(&path), None).unwrap();
    assert_eq!(
        config.providers.values().next().unwrap(),
        &ProviderConfig::demo(DemoBehavior::Hang, 0)
    );
}

#[test]
fn chains_and_contract_files_come_from_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.toml");
    std::fs::write(
        &path,
        r#"
        contract_files = ["extra/mine.toml"]
        [chains]
        "summarize@1" = ["main"]
        "classify@1" = ["main"]
        [providers.main]
        kind = "openai"
        base_url = "https://llm.example/v1"
        model = "m"
        "#,
    )
    .unwrap();
    let config = Config::load(Some(&path), None).unwrap();
    assert_eq!(config.contract_files, [dir.path().join("extra/mine.toml")]);
    let err = config.contracts().unwrap_err();
    assert!(err.to_string().contains("extra/mine.toml"), "{err}");
    let without_files = Config {
        contract_files: Vec::new(),
        ..config
    };
    let contracts = without_files.contracts().unwrap();
    let summarize = contracts
        .get(&ContractRef::parse("summarize@1").unwrap())
        .unwrap();
    assert_eq!(summarize.providers, [ProviderName::parse("main").unwrap()]);
}

#[test]
fn the_retry_policy_comes_from_the_config() {
    let default = Config::default().engine_settings().retry;
    assert_eq!((default.max_retries, default.within.num_seconds()), (2, 60));
    let config =
        Config::parse("provider_retries = 0\nprovider_retry_within_ms = 5000", "t").unwrap();
    let retry = config.engine_settings().retry;
    assert_eq!(
        (retry.max_retries, retry.within.num_milliseconds()),
        (0, 5_000)
    );
}

#[test]
fn limits_are_checked() {
    for text in [
        "retention_days = 0",
        "max_attempts_per_job = 0",
        "max_attempts_per_job = 26",
        "provider_retries = 11",
        "qualification_max_age_days = 0",
        "breaker_cooldown_ms = 86400001",
        "provider_retry_within_ms = 86400001",
    ] {
        assert!(
            matches!(Config::parse(text, "t"), Err(ConfigError::Invalid(_))),
            "{text}"
        );
    }
    assert!(Config::parse("max_attempts_per_job = 25", "t").is_ok());
    let provider = Config::parse("[providers.p]\nkind = \"demo\"\nretries = 11", "t");
    assert!(
        matches!(&provider, Err(ConfigError::Provider { message, .. }) if message.contains("retries must be 0 to 10")),
        "{provider:?}"
    );
}

#[test]
fn the_example_config_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("onejob.example.toml");
    let config = Config::load(Some(&path), None).unwrap();
    assert!(!config.providers.is_empty());
    assert!(config.prices().per_million.contains_key("gpt-4.1-mini"));
    assert_eq!(config.limits.default.live_jobs, Some(50));
}

/// A deployed function's config at `text`, loaded as the function loads it.
fn deployed(text: &str) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("onejob.toml");
    std::fs::write(&path, text).unwrap();
    Config::load_deployed(&path)
}

#[test]
fn a_deployed_config_has_the_providers_it_names_and_no_demo_ones() {
    let err = deployed("retention_days = 7").unwrap_err();
    assert!(matches!(err, ConfigError::NoProviders(_)), "{err}");
    let message = err.to_string();
    assert!(message.contains("[providers.NAME]"), "{message}");
    assert!(message.contains("sam deploy"), "{message}");
    // An empty file is no better: the functions would otherwise serve the demo providers' answers.
    assert!(matches!(deployed(""), Err(ConfigError::NoProviders(_))));

    // Asked for by name, the demo provider is there, and only it.
    let demo = deployed(
        "built_in_contracts = false\n[providers.demo]\nkind = \"demo\"\nbehavior = \"fail\"",
    )
    .unwrap();
    assert_eq!(
        demo.providers
            .keys()
            .map(|p| p.as_str())
            .collect::<Vec<_>>(),
        ["demo"]
    );
    assert!(demo.contracts().unwrap().iter().next().is_none());
    // The built-in contracts' default chains need both demo providers: the start stops, with the fix.
    let with_built_ins = deployed("[providers.demo]\nkind = \"demo\"").unwrap();
    let err = with_built_ins.contracts().unwrap_err().to_string();
    assert!(
        err.contains("demo-backup, which is not a configured provider"),
        "{err}"
    );
}

#[test]
fn a_deployed_config_that_does_not_parse_names_the_file_and_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("onejob.toml");
    let err = Config::load_deployed(&missing).unwrap_err();
    assert!(
        err.to_string().contains(&missing.display().to_string()),
        "{err}"
    );

    let err = deployed("[providers.gpt]\nkind = \"openai\"\nmodel = \"x\"\n").unwrap_err();
    let chain = crate::telemetry::error_chain(&err);
    assert!(chain.contains("is not a valid onejob config"), "{chain}");
    assert!(chain.contains("line 1"), "{chain}");
    assert!(chain.contains("missing field `base_url`"), "{chain}");
}

#[test]
fn a_configs_fingerprint_is_its_texts() {
    let text = "[providers.demo]\nkind = \"demo\"\n";
    let fingerprint = |text: &str| deployed(text).unwrap().origin.unwrap().fingerprint;
    assert_eq!(fingerprint(text), fingerprint(text));
    assert_ne!(
        fingerprint(text),
        fingerprint(&format!("{text}# a comment\n"))
    );
    assert_eq!(Config::default().origin, None);
}
