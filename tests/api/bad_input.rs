//! Every bad create answers its status and stable code, and the store is left exactly as it was.

use onejob::config::Config;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{ALICE, TestApp, assert_problem, config, json_with_status, summarize};

const AUTH: (&str, &[u8]) = ("authorization", b"Bearer token-alice");
const JSON: (&str, &[u8]) = ("content-type", b"application/json");

/// (what is wrong, headers, body, status, code)
type Case<'a> = (&'a str, Vec<(&'a str, &'a [u8])>, String, u16, &'a str);

fn key(value: &[u8]) -> (&'static str, &[u8]) {
    ("idempotency-key", value)
}

#[tokio::test]
async fn bad_creates_are_refused_with_their_code_and_change_nothing() {
    let app = TestApp::spawn().await;
    json_with_status(app.create(ALICE, "existing", &summarize("x")).await, 201).await;
    assert_eq!(app.row_counts().await, (1, 1));

    let valid = summarize("fine").to_string();
    let long_key = vec![b'k'; 256];
    let deep = format!(
        r#"{{"contract": "summarize@1", "input": {{"text": "x", "n": {}1{}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let big = summarize(&"x".repeat(300 * 1024)).to_string();
    let with = |input: serde_json::Value| input.to_string();
    let cases: Vec<Case> = vec![
        (
            "no credential",
            vec![key(b"n1"), JSON],
            valid.clone(),
            401,
            "unauthorized",
        ),
        (
            "unknown token",
            vec![("authorization", b"Bearer nope"), key(b"n1"), JSON],
            valid.clone(),
            401,
            "unauthorized",
        ),
        (
            "not a bearer",
            vec![
                ("authorization", b"Basic dG9rZW4tYWxpY2U6"),
                key(b"n1"),
                JSON,
            ],
            valid.clone(),
            401,
            "unauthorized",
        ),
        (
            "no key",
            vec![AUTH, JSON],
            valid.clone(),
            400,
            "missing_idempotency_key",
        ),
        (
            "empty key",
            vec![AUTH, key(b""), JSON],
            valid.clone(),
            400,
            "invalid_idempotency_key",
        ),
        (
            "256-character key",
            vec![AUTH, key(&long_key), JSON],
            valid.clone(),
            400,
            "invalid_idempotency_key",
        ),
        (
            "non-ASCII key",
            vec![AUTH, key("clé".as_bytes()), JSON],
            valid.clone(),
            400,
            "invalid_idempotency_key",
        ),
        (
            "key with a space",
            vec![AUTH, key(b"a b"), JSON],
            valid.clone(),
            400,
            "invalid_idempotency_key",
        ),
        (
            "text/plain",
            vec![AUTH, key(b"n1"), ("content-type", b"text/plain")],
            valid.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "no content type",
            vec![AUTH, key(b"n1")],
            valid.clone(),
            415,
            "unsupported_media_type",
        ),
        (
            "malformed JSON",
            vec![AUTH, key(b"n1"), JSON],
            r#"{"contract": "#.into(),
            400,
            "malformed_json",
        ),
        (
            "empty body",
            vec![AUTH, key(b"n1"), JSON],
            String::new(),
            400,
            "malformed_json",
        ),
        (
            "body over the limit",
            vec![AUTH, key(b"n1"), JSON],
            big,
            413,
            "body_too_large",
        ),
        (
            "nested too deep",
            vec![AUTH, key(b"n1"), JSON],
            deep,
            400,
            "json_too_deep",
        ),
        (
            "unknown field",
            vec![AUTH, key(b"n1"), JSON],
            with(json!({"contract": "summarize@1", "input": {"text": "x"}, "priority": 1})),
            422,
            "invalid_request",
        ),
        (
            "missing input",
            vec![AUTH, key(b"n1"), JSON],
            with(json!({"contract": "summarize@1"})),
            422,
            "invalid_request",
        ),
        (
            "contract of the wrong type",
            vec![AUTH, key(b"n1"), JSON],
            with(json!({"contract": 1, "input": {"text": "x"}})),
            422,
            "invalid_request",
        ),
        (
            "an empty array body",
            vec![AUTH, key(b"n1"), JSON],
            "[]".into(),
            422,
            "invalid_request",
        ),
        (
            // serde reads a struct from its fields in order; the API's bodies are objects.
            "an array of the fields in order",
            vec![AUTH, key(b"n1"), JSON],
            with(json!(["summarize@1", {"text": "x"}, ["demo"]])),
            422,
            "invalid_request",
        ),
        (
            "a string body",
            vec![AUTH, key(b"n1"), JSON],
            with(json!("summarize@1")),
            422,
            "invalid_request",
        ),
        (
            "a null body",
            vec![AUTH, key(b"n1"), JSON],
            "null".into(),
            422,
            "invalid_request",
        ),
        (
            "no providers",
            vec![AUTH, key(b"n1"), JSON],
            with(json!({"contract": "summarize@1", "input": {"text": "x"}, "providers": []})),
            422,
            "invalid_request",
        ),
        (
            "a provider twice",
            vec![AUTH, key(b"n1"), JSON],
            with(
                json!({"contract": "summarize@1", "input": {"text": "x"}, "providers": ["demo", "demo"]}),
            ),
            422,
            "invalid_request",
        ),
        (
            "unknown contract version",
            vec![AUTH, key(b"n1"), JSON],
            with(json!({"contract": "summarize@9", "input": {"text": "x"}})),
            422,
            "unknown_contract",
        ),
        (
            "contract without version",
            vec![AUTH, key(b"n1"), JSON],
            with(json!({"contract": "summarize", "input": {"text": "x"}})),
            422,
            "unknown_contract",
        ),
        (
            "unknown provider",
            vec![AUTH, key(b"n1"), JSON],
            with(
                json!({"contract": "summarize@1", "input": {"text": "x"}, "providers": ["demo", "nope"]}),
            ),
            422,
            "unknown_provider",
        ),
        (
            "input breaking the schema",
            vec![AUTH, key(b"n1"), JSON],
            with(json!({"contract": "summarize@1", "input": {"text": 5}})),
            422,
            "invalid_input",
        ),
    ];
    for (name, headers, body, status, code) in cases {
        let response = app.create_raw(&headers, body).await;
        if status == 401 {
            assert_eq!(
                response.headers()["www-authenticate"],
                "Bearer realm=\"onejob\"",
                "{name}"
            );
        }
        let actual = response.status().as_u16();
        assert_eq!(actual, status, "{name}");
        assert_problem(response, status, code).await;
        assert_eq!(app.row_counts().await, (1, 1), "{name} changed the store");
    }
}

#[tokio::test]
async fn an_input_error_says_where_the_input_breaks_the_schema() {
    let app = TestApp::spawn().await;
    let body =
        json!({"contract": "classify@1", "input": {"text": "x", "labels": [], "max_labels": 0}});
    let problem = assert_problem(app.create(ALICE, "k", &body).await, 422, "invalid_input").await;
    let pointers: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pointer"].as_str().unwrap())
        .collect();
    assert!(
        pointers.contains(&"/labels") && pointers.contains(&"/max_labels"),
        "{problem}"
    );
    assert_eq!(app.row_counts().await, (0, 0));
}

#[tokio::test]
async fn the_body_limit_is_configurable() {
    let mut config = config();
    config.body_limit_bytes = 1024;
    let app = TestApp::spawn_with(config).await;
    let problem = assert_problem(
        app.create(ALICE, "k", &summarize(&"x".repeat(2000))).await,
        413,
        "body_too_large",
    )
    .await;
    assert_eq!(problem["limit"], 1024);
    json_with_status(app.create(ALICE, "k", &summarize("short")).await, 201).await;
}

/// A chunked body declares no length: the limit must hold while it streams in.
#[tokio::test]
async fn a_chunked_body_over_the_limit_is_refused() {
    let app = TestApp::spawn().await;
    let chunk = "x".repeat(64 * 1024);
    let mut request = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer token-alice\r\nIdempotency-Key: chunked\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        app.addr
    );
    for _ in 0..5 {
        request.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    request.push_str("0\r\n\r\n");
    let mut stream = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    // The server may answer and close before it has read everything; the answer is what matters.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"code\":\"body_too_large\""), "{answer}");
    assert_eq!(app.row_counts().await, (0, 0));
}

/// serde reads a struct from an array of its fields in order; no body of the API is an array, on any route.
#[tokio::test]
async fn the_attempt_and_endpoint_bodies_refuse_arrays_of_their_fields() {
    let app = TestApp::spawn_with(Config {
        allow_private_endpoints: true,
        ..config()
    })
    .await;
    let job = json_with_status(app.create(ALICE, "k", &summarize("x")).await, 201).await;
    let attempts = format!("/v1/jobs/{}/attempts", job["id"].as_str().unwrap());
    let refused = app.post_json(ALICE, &attempts, &json!(["demo"])).await;
    assert_problem(refused, 422, "invalid_request").await;

    let endpoint = app
        .client
        .put(app.url("/v1/endpoint"))
        .bearer_auth(ALICE)
        .json(&json!(["http://127.0.0.1:9/hook"]))
        .send()
        .await
        .unwrap();
    assert_problem(endpoint, 422, "invalid_request").await;
    assert_eq!(app.get(ALICE, "/v1/endpoint").await.status(), 404);
    assert_eq!(app.row_counts().await, (1, 1));
}
