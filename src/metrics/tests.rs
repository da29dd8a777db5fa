use super::*;

fn summarize() -> ContractRef {
    ContractRef::new("summarize", 1).unwrap()
}

fn alice() -> Owner {
    Owner::parse("alice").unwrap()
}

fn openai() -> ProviderName {
    ProviderName::parse("openai").unwrap()
}

#[test]
fn prometheus_text_has_each_histograms_buckets_under_its_labels() {
    let metrics = Metrics::prometheus();
    metrics.create(
        &alice(),
        &summarize(),
        CreateKind::Created,
        Duration::from_millis(3),
    );
    metrics.create(
        &alice(),
        &summarize(),
        CreateKind::Replayed,
        Duration::from_micros(300),
    );
    metrics.provider_call(&openai(), "gpt-x", "answered", Duration::from_millis(1_200));
    metrics.breaker_trip(&openai());
    metrics.store_retry();
    metrics.event_try(SinkKind::Endpoint, EventTry::Rejected, Duration::ZERO);
    metrics.event_try(SinkKind::Bus, EventTry::Delivered, Duration::from_secs(90));
    let text = metrics.render().unwrap();
    for line in [
        "onejob_event_tries_total{sink=\"endpoint\",outcome=\"rejected\"} 1",
        "onejob_event_tries_total{sink=\"bus\",outcome=\"delivered\"} 1",
        "onejob_event_delivery_seconds_bucket{sink=\"bus\",le=\"60\"} 0",
        "onejob_event_delivery_seconds_bucket{sink=\"bus\",le=\"300\"} 1",
        "# TYPE onejob_create_seconds histogram",
        "onejob_create_seconds_bucket{contract=\"summarize\",outcome=\"created\",le=\"0.0025\"} 0",
        "onejob_create_seconds_bucket{contract=\"summarize\",outcome=\"created\",le=\"0.005\"} 1",
        "onejob_create_seconds_bucket{contract=\"summarize\",outcome=\"replayed\",le=\"0.001\"} 1",
        "onejob_create_seconds_count{contract=\"summarize\",outcome=\"created\"} 1",
        "onejob_provider_call_seconds_bucket{provider=\"openai\",model=\"gpt-x\",outcome=\"answered\",le=\"1\"} 0",
        "onejob_provider_call_seconds_bucket{provider=\"openai\",model=\"gpt-x\",outcome=\"answered\",le=\"2.5\"} 1",
        "onejob_creates_total{contract=\"summarize\",outcome=\"created\"} 1",
        "onejob_calls_avoided_total{owner=\"alice\",contract=\"summarize\",outcome=\"replayed\"} 1",
        "onejob_breaker_trips_total{provider=\"openai\"} 1",
        "onejob_store_retries_total 1",
        "# HELP onejob_breaker_trips_total Times a provider's breaker opened.",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from:\n{text}"
        );
    }
    assert!(
        text.contains("# HELP onejob_create_seconds How long a create took"),
        "{text}"
    );
}

#[test]
fn an_emf_document_per_label_set_carries_its_dimensions_and_what_came_since_the_last() {
    let metrics = Metrics::emf();
    metrics.create(
        &alice(),
        &summarize(),
        CreateKind::Created,
        Duration::from_millis(4),
    );
    metrics.create(
        &alice(),
        &summarize(),
        CreateKind::Created,
        Duration::from_millis(6),
    );
    metrics.provider_call(&openai(), "gpt-x", "failed", Duration::from_millis(500));
    metrics.store_retry();
    let lines = metrics.drain_emf(1_000);
    let documents: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(documents.len(), 3, "{lines:?}");
    let created = documents
        .iter()
        .find(|d| d["outcome"] == "created")
        .expect("the creates' document");
    assert_eq!(created["contract"], "summarize");
    assert_eq!(created["onejob_creates_total"], 2);
    assert_eq!(
        created["onejob_create_seconds"],
        serde_json::json!([0.004, 0.006])
    );
    let directive = &created["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(created["_aws"]["Timestamp"], 1_000);
    assert_eq!(directive["Namespace"], "onejob");
    assert_eq!(
        directive["Dimensions"],
        serde_json::json!([["contract", "outcome"], []]),
        "by its labels, and over the whole service"
    );
    assert_eq!(
        directive["Metrics"],
        serde_json::json!([
            {"Name": "onejob_create_seconds", "Unit": "Seconds"},
            {"Name": "onejob_creates_total", "Unit": "Count"},
        ])
    );
    let call = documents
        .iter()
        .find(|d| d["provider"] == "openai")
        .expect("the call's document");
    assert_eq!(
        (&call["model"], &call["outcome"]),
        (&serde_json::json!("gpt-x"), &serde_json::json!("failed"))
    );
    assert_eq!(
        call["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        serde_json::json!([["provider", "model", "outcome"], []])
    );
    let retries = documents
        .iter()
        .find(|d| d.get("onejob_store_retries_total").is_some())
        .expect("the retries' document");
    assert_eq!(
        retries["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
        serde_json::json!([[]])
    );
    assert_eq!(
        metrics.drain_emf(2_000),
        Vec::<String>::new(),
        "nothing new"
    );
    metrics.store_retry();
    assert_eq!(metrics.drain_emf(3_000).len(), 1);
}

#[test]
fn an_emf_histogram_of_more_than_a_hundred_values_spans_documents() {
    let metrics = Metrics::emf();
    for ms in 0..250 {
        metrics.create(
            &alice(),
            &summarize(),
            CreateKind::Created,
            Duration::from_millis(ms),
        );
    }
    let documents: Vec<serde_json::Value> = metrics
        .drain_emf(1_000)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sizes: Vec<usize> = documents
        .iter()
        .map(|d| d["onejob_create_seconds"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [100, 100, 50]);
    let counts: Vec<&serde_json::Value> = documents
        .iter()
        .map(|d| &d["onejob_creates_total"])
        .collect();
    assert_eq!(
        counts,
        [
            &serde_json::json!(250),
            &serde_json::Value::Null,
            &serde_json::Value::Null
        ]
    );
    assert_eq!(documents[2]["onejob_create_seconds"][49], 0.249);
}

#[test]
fn two_engines_count_apart() {
    let (a, b) = (Metrics::prometheus(), Metrics::prometheus());
    a.store_retry();
    assert!(
        a.render()
            .unwrap()
            .contains("onejob_store_retries_total 1\n")
    );
    assert!(!b.render().unwrap().contains("onejob_store_retries_total 1"));
    assert_eq!(Metrics::emf().render(), None);
    assert_eq!(a.drain_emf(0), Vec::<String>::new());
}

/// Every alarm of the template on onejob's own namespace watches a metric the functions publish, by a set of
/// dimensions they publish it under (CloudWatch matches a metric by its exact dimensions).
#[test]
fn the_templates_alarms_watch_what_the_functions_publish() {
    let template = include_str!("../../template.yaml");
    let mut watched = 0;
    let mut lines = template.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line != "Namespace: onejob" {
            continue;
        }
        let name = lines
            .next()
            .and_then(|l| l.strip_prefix("MetricName: "))
            .expect("the metric's name follows its namespace");
        let mut dimensions = Vec::new();
        for line in lines.by_ref() {
            match line.strip_prefix("- { Name: ") {
                Some(rest) => dimensions.push(rest.split(',').next().unwrap()),
                None if line == "Dimensions:" => {}
                None => break,
            }
        }
        let spec = METRICS
            .iter()
            .find(|spec| spec.name == name)
            .unwrap_or_else(|| panic!("an alarm watches {name}, which is not published"));
        assert!(
            spec.labels == dimensions.as_slice() || spec.rollups.contains(&dimensions.as_slice()),
            "{name} is not published by {dimensions:?}"
        );
        watched += 1;
    }
    assert_eq!(watched, 2, "the races lost and the unknown attempts");
}
