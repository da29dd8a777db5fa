use super::*;
use serde_json::json;

fn demo(p: &ProviderName) -> bool {
    ["demo", "demo-backup"].contains(&p.as_str())
}

fn built_in() -> Contracts {
    Contracts::load(&[], &BTreeMap::new(), true, demo).unwrap()
}

fn summarize() -> ContractRef {
    ContractRef::parse("summarize@1").unwrap()
}

/// Contract `x@1` on the demo provider, with these schemas (and samples).
fn contract_x(schemas: &str) -> String {
    contract_x_prompting("Answer.", schemas)
}

/// [`contract_x`] with this prompt.
fn contract_x_prompting(prompt: &str, schemas: &str) -> String {
    format!(
        r#"
        name = "x"
        version = 1
        prompt = "{prompt}"
        temperature = 0.0
        max_output_tokens = 10
        providers = ["demo"]
        {schemas}
        "#
    )
}

#[test]
fn the_built_in_summarize_contract_loads_and_checks_input() {
    let contracts = built_in();
    let summarize = contracts.get(&summarize()).unwrap();
    assert_eq!(summarize.temperature, 0.0);
    assert_eq!(summarize.providers.len(), 2);
    assert!(!summarize.samples.is_empty());
    assert!(summarize.input_errors(&json!({"text": "hello"})).is_empty());
    let errors = summarize.input_errors(&json!({"text": 3, "extra": true}));
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().any(|e| e.pointer == "/text"));
}

#[test]
fn the_compiled_in_contracts_are_the_folder() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".toml"))
        .collect();
    files.sort();
    let built_in: Vec<&str> = BUILT_IN.iter().map(|(name, _)| *name).collect();
    assert_eq!(files, built_in, "add the new contract to BUILT_IN");
    for (name, text) in BUILT_IN {
        assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), text);
    }
}

#[test]
fn prompts_render_strictly() {
    let contracts = built_in();
    let classify = contracts
        .get(&ContractRef::parse("classify@1").unwrap())
        .unwrap();
    let input = json!({"text": "charged twice", "labels": ["billing", "praise"], "max_labels": 1});
    let prompt = classify.render(&input).unwrap();
    assert!(
        prompt.contains(r#"From these labels: ["billing","praise"], pick at most 1"#),
        "{prompt}"
    );
    assert!(prompt.contains("Text:\ncharged twice"), "{prompt}");
    // An optional field left out renders as the schema's default: a valid input always renders.
    let input = json!({"text": "x", "labels": ["a"]});
    assert!(classify.input_errors(&input).is_empty());
    let prompt = classify.render(&input).unwrap();
    assert!(prompt.contains("pick at most 1 that fit"), "{prompt}");
    assert!(
        classify
            .samples
            .iter()
            .any(|s| s.get("max_labels").is_none())
    );
    let err = classify.render(&json!({"labels": ["a"]})).unwrap_err();
    assert!(err.contains("text"), "{err}");
}

#[test]
fn a_placeholder_no_valid_input_must_fill_is_refused_at_load() {
    let optional = r#"
        [input_schema]
        type = "object"
        required = ["title"]
        properties.title = { type = "string" }
        properties.text = { type = "string" }
        [output_schema]
        type = "object"
    "#;
    let x = |schemas: &str| parse(&contract_x_prompting("{{ title }}: {{ text }}", schemas));
    let err = x(optional).unwrap_err();
    assert!(err.contains("{{ text }}"), "{err}");
    let defaulted = optional.replace(
        r#"properties.text = { type = "string" }"#,
        r#"properties.text = { type = "string", default = "none" }"#,
    );
    let defaulted = x(&defaulted).unwrap();
    assert_eq!(defaulted.render(&json!({"title": "T"})).unwrap(), "T: none");
    let required = optional.replace(r#"required = ["title"]"#, r#"required = ["title", "text"]"#);
    assert!(x(&required).is_ok());
    let unclosed = parse(&contract_x_prompting("{{ title }}: {{ text", optional)).unwrap_err();
    assert!(unclosed.contains("without"), "{unclosed}");
}

/// An input schema that is not an object's would take `"just a string"`, `["a"]` or `42` — valid, as `required`
/// asks nothing of what is not an object — and no prompt could render from it: refused at load, and so is an output
/// schema no provider's structured output takes.
#[test]
fn a_schema_of_anything_but_an_object_is_refused_at_load() {
    let schemas = |input_type: &str, output_type: &str| {
        format!(
            r#"
            [input_schema]
            {input_type}
            required = ["title"]
            properties.title = {{ type = "string" }}
            [output_schema]
            {output_type}
            "#
        )
    };
    let x = |schemas: &str| parse(&contract_x_prompting("{{ title }}", schemas));
    assert!(x(&schemas(r#"type = "object""#, r#"type = "object""#)).is_ok());
    for input in ["", r#"type = "string""#, r#"type = ["object", "string"]"#] {
        let err = x(&schemas(input, r#"type = "object""#)).unwrap_err();
        assert!(
            err.contains("input_schema: the input is a JSON object"),
            "{input}: {err}"
        );
    }
    let err = x(&schemas(r#"type = "object""#, r#"type = "array""#)).unwrap_err();
    assert!(
        err.contains("output_schema: the output is a JSON object"),
        "{err}"
    );
}

#[test]
fn outputs_must_keep_the_schema_and_add_no_top_level_key() {
    let contracts = built_in();
    let summarize = contracts.get(&summarize()).unwrap();
    assert!(
        summarize
            .output_problems(&json!({"summary": "short"}))
            .is_empty()
    );
    assert_eq!(summarize.output_problems(&json!({"summary": ""})).len(), 1);
    assert_eq!(summarize.output_problems(&json!("prose")).len(), 1);
    let lenient = parse(&contract_x(
        r#"input_schema = { type = "object" }
        output_schema = { type = "object", properties = { a = { type = "string" } } }"#,
    ))
    .unwrap();
    let problems = lenient.output_problems(&json!({"a": "x", "b": 1}));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("\"b\""));
}

#[test]
fn a_chain_naming_an_unconfigured_provider_is_refused_with_the_fix() {
    let only_openai = |p: &ProviderName| p.as_str() == "openai";
    let err = Contracts::load(&[], &BTreeMap::new(), true, only_openai).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("runs on demo, which is not a configured provider"),
        "{message}"
    );
    assert!(message.contains("[chains]"), "{message}");
    let openai = ProviderName::parse("openai").unwrap();
    let chains: BTreeMap<_, _> = [
        (summarize(), vec![openai.clone()]),
        (
            ContractRef::parse("classify@1").unwrap(),
            vec![openai.clone()],
        ),
    ]
    .into();
    let contracts = Contracts::load(&[], &chains, true, only_openai).unwrap();
    assert_eq!(
        contracts.get(&summarize()).unwrap().providers,
        std::slice::from_ref(&openai)
    );
    let unknown: BTreeMap<_, _> = [(ContractRef::parse("nope@1").unwrap(), vec![openai])].into();
    let err = Contracts::load(&[], &unknown, true, |_: &ProviderName| true).unwrap_err();
    assert!(
        err.to_string().contains("there is no contract nope@1"),
        "{err}"
    );
}

#[test]
fn a_contract_file_adds_a_contract_or_replaces_a_built_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let built_in_text = BUILT_IN[1].1;
    let edited = dir.path().join("summarize.toml");
    std::fs::write(
        &edited,
        built_in_text.replace("You summarise texts.", "Be brief."),
    )
    .unwrap();
    let added = dir.path().join("echo.toml");
    std::fs::write(
        &added,
        built_in_text.replace("name = \"summarize\"", "name = \"echo\""),
    )
    .unwrap();
    let contracts =
        Contracts::load(&[edited.clone(), added], &BTreeMap::new(), true, demo).unwrap();
    assert_eq!(contracts.iter().count(), 3);
    assert_ne!(
        contracts.get(&summarize()).unwrap().fingerprint,
        built_in().get(&summarize()).unwrap().fingerprint
    );
    let twice = Contracts::load(&[edited.clone(), edited], &BTreeMap::new(), true, demo);
    assert!(twice.unwrap_err().to_string().contains("defined in"));
}

#[test]
fn a_sample_that_breaks_the_input_schema_is_refused() {
    let text = contract_x(
        r#"input_schema = { type = "object", required = ["text"] }
        output_schema = { type = "object" }
        samples = [{ nottext = 1 }]"#,
    );
    let err = parse(&text).unwrap_err();
    assert!(err.contains("samples[0]"), "{err}");
}

#[test]
fn a_contract_may_lower_retries_without_changing_its_fingerprint() {
    let text = BUILT_IN[1].1;
    let plain = parse(text).unwrap();
    assert_eq!(plain.retry, RetryLimits::default());
    let patient = parse(&format!("retries = 0\nretry_within_ms = 5000\n{text}")).unwrap();
    assert_eq!(
        patient.retry,
        RetryLimits {
            retries: Some(0),
            retry_within_ms: Some(5_000)
        }
    );
    assert_eq!(patient.fingerprint, plain.fingerprint);
    let err = parse(&format!("retries = 11\n{text}")).unwrap_err();
    assert!(err.contains("retries must be 0 to 10"), "{err}");
}

#[test]
fn a_contract_may_state_its_unknown_policy_one_way_without_changing_its_fingerprint() {
    let text = BUILT_IN[1].1;
    let plain = parse(text).unwrap();
    assert_eq!(plain.unknown, None);
    let held = parse(&format!("unknown = \"hold\"\n{text}")).unwrap();
    assert_eq!(held.unknown, Some(UnknownPolicy::Hold));
    let retried = parse(&format!("unknown_retry_after_ms = 60000\n{text}")).unwrap();
    assert_eq!(retried.unknown, Some(UnknownPolicy::RetryAfterMs(60_000)));
    assert_eq!(retried.fingerprint, plain.fingerprint);
    let both = parse(&format!(
        "unknown = \"hold\"\nunknown_retry_after_ms = 1\n{text}"
    ))
    .unwrap_err();
    assert!(both.contains("choose one"), "{both}");
    let long = parse(&format!("unknown_retry_after_ms = 86400001\n{text}")).unwrap_err();
    assert!(long.contains("at most a day"), "{long}");
    assert!(parse(&format!("unknown = \"retry\"\n{text}")).is_err());
}
