use serde_json::{Value, json};

use crate::helpers::{ALICE, TestApp, assert_problem, intent, json_with_status, summarize};

#[tokio::test]
async fn a_job_is_fetched_by_its_id() {
    let app = TestApp::spawn().await;
    let job = json_with_status(app.create(ALICE, "k", &summarize("x")).await, 201).await;
    let fetched =
        json_with_status(app.get_job(ALICE, job["id"].as_str().unwrap()).await, 200).await;
    assert_eq!(intent(&fetched), intent(&job));
    assert_problem(
        app.get_job(ALICE, "job_00000000000000000000000000000000")
            .await,
        404,
        "job_not_found",
    )
    .await;
    assert_problem(app.get_job(ALICE, "not-an-id").await, 404, "job_not_found").await;
}

#[tokio::test]
async fn jobs_are_listed_newest_first_page_by_page() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let job = json_with_status(
            app.create(ALICE, &format!("k{i}"), &summarize(&i.to_string()))
                .await,
            201,
        )
        .await;
        ids.push(job["id"].as_str().unwrap().to_owned());
        // Distinct creation times; too short for any demo provider to answer.
        app.clock.advance(chrono::Duration::milliseconds(1));
    }
    json_with_status(app.cancel_job(ALICE, &ids[1]).await, 200).await;

    let mut seen = Vec::new();
    let mut query = "?limit=2".to_owned();
    loop {
        let page = json_with_status(app.list_jobs(ALICE, &query).await, 200).await;
        seen.extend(
            page["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["idempotency_key"].clone()),
        );
        match page["next_cursor"].as_str() {
            Some(cursor) => query = format!("?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ["k4", "k3", "k2", "k1", "k0"]);

    let cancelled = json_with_status(app.list_jobs(ALICE, "?status=cancelled").await, 200).await;
    assert_eq!(cancelled["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(cancelled["jobs"][0]["id"], ids[1].as_str());
    assert_eq!(cancelled["next_cursor"], Value::Null);

    for bad in [
        "?limit=0",
        "?limit=101",
        "?limit=x",
        "?status=done",
        "?cursor=nope",
        "?sort=asc",
    ] {
        assert_problem(app.list_jobs(ALICE, bad).await, 400, "invalid_parameter").await;
    }
}

#[tokio::test]
async fn cancelling_a_job_is_idempotent() {
    let app = TestApp::spawn().await;
    let job = json_with_status(app.create(ALICE, "k", &summarize("x")).await, 201).await;
    let id = job["id"].as_str().unwrap();
    let once = json_with_status(app.cancel_job(ALICE, id).await, 200).await;
    assert_eq!(once["status"], "cancelled");
    assert_eq!(once["version"], 1);
    assert_eq!(once["attempts"][0]["state"], "cancelled");
    let twice = json_with_status(app.cancel_job(ALICE, id).await, 200).await;
    assert_eq!(twice, once);
    assert_problem(
        app.cancel_job(ALICE, "job_00000000000000000000000000000000")
            .await,
        404,
        "job_not_found",
    )
    .await;
}

#[tokio::test]
async fn jobs_survive_a_server_restart() {
    let app = TestApp::spawn().await;
    let job = json_with_status(app.create(ALICE, "k", &summarize("keep me")).await, 201).await;
    let app = app.restart().await;
    let fetched =
        json_with_status(app.get_job(ALICE, job["id"].as_str().unwrap()).await, 200).await;
    assert_eq!(intent(&fetched), intent(&job));
    let replay = json_with_status(app.create(ALICE, "k", &summarize("keep me")).await, 200).await;
    assert_eq!(replay["id"], job["id"]);
    assert_eq!(app.row_counts().await, (1, 1));
}

#[tokio::test]
async fn contracts_are_listed_with_their_schemas() {
    let app = TestApp::spawn().await;
    let list = json_with_status(app.get(ALICE, "/v1/contracts").await, 200).await;
    let summarize = list["contracts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["contract"] == "summarize@1")
        .unwrap();
    assert_eq!(summarize["input_schema"]["required"], json!(["text"]));
    assert_eq!(summarize["output_schema"]["required"], json!(["summary"]));
    assert_eq!(summarize["providers"], json!(["demo", "demo-backup"]));
    assert_problem(app.get("nope", "/v1/contracts").await, 401, "unauthorized").await;
}

#[tokio::test]
async fn health_and_unknown_routes() {
    let app = TestApp::spawn().await;
    let health = json_with_status(
        app.client.get(app.url("/healthz")).send().await.unwrap(),
        200,
    )
    .await;
    assert_eq!(health["status"], "ok");
    // What it serves, by fingerprint: no config file here, and the contracts it loaded.
    assert_eq!(health["config"], Value::Null);
    assert_eq!(
        health["contracts"].as_str().map(str::len),
        Some(64),
        "{health}"
    );
    assert_problem(app.get(ALICE, "/v2/nothing").await, 404, "not_found").await;
    let delete = app.client.delete(app.url("/v1/jobs")).send().await.unwrap();
    assert_problem(delete, 405, "method_not_allowed").await;
}

/// `/openapi.json` of a fresh server.
async fn openapi_document() -> Value {
    let app = TestApp::spawn().await;
    let answer = app.client.get(app.url("/openapi.json")).send().await;
    json_with_status(answer.unwrap(), 200).await
}

/// The document lists every route the router serves, with the codes each can answer.
#[tokio::test]
async fn the_openapi_document_describes_the_api() {
    let doc = openapi_document().await;
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let mut listed: Vec<&str> = paths.keys().map(String::as_str).collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            "/healthz",
            "/metrics",
            "/v1/contracts",
            "/v1/endpoint",
            "/v1/jobs",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/attempts",
            "/v1/jobs/{id}/attempts/{number}/cancel",
            "/v1/jobs/{id}/cancel",
            "/v1/jobs/{id}/events",
            "/v1/operator/jobs",
            "/v1/providers",
            "/v1/usage",
        ]
    );
    let create = &paths["/v1/jobs"]["post"]["responses"];
    for status in ["200", "201", "400", "401", "409", "413", "415", "422"] {
        assert!(create.get(status).is_some(), "POST /v1/jobs lacks {status}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

/// What client generators need to take the document as it is: nothing optional is declared nullable (an optional
/// header or body is absent, not `null`), every header an answer carries is declared, typed as what it is.
#[tokio::test]
async fn the_openapi_document_is_one_generators_take_as_it_is() {
    let doc = openapi_document().await;
    let paths = doc["paths"].as_object().unwrap();
    let mut unauthorized = 0;
    for (path, item) in paths {
        for (method, operation) in item.as_object().unwrap() {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                assert!(
                    !parameter["schema"].to_string().contains("null"),
                    "{method} {path}: {parameter}"
                );
            }
            if let Some(body) = operation.get("requestBody") {
                assert!(
                    !body.to_string().contains("null"),
                    "{method} {path}: {body}"
                );
            }
            if let Some(answer) = operation["responses"].get("401") {
                assert_eq!(
                    answer["headers"]["WWW-Authenticate"]["schema"]["type"], "string",
                    "{method} {path}"
                );
                unauthorized += 1;
            }
        }
    }
    assert_eq!(
        unauthorized, 15,
        "every operation but /healthz is behind a token"
    );
    let attempts = &paths["/v1/jobs/{id}/attempts"]["post"]["requestBody"];
    assert_eq!(attempts.get("required"), None, "{attempts}");
    assert_eq!(
        attempts["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/AddAttemptRequest"
    );
    let get = &paths["/v1/jobs/{id}"]["get"];
    let if_none_match = get["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "If-None-Match")
        .unwrap();
    assert_eq!(if_none_match["required"], false);
    assert_eq!(if_none_match["schema"]["type"], "string");
    for status in ["200", "304"] {
        assert_eq!(
            get["responses"][status]["headers"]["ETag"]["schema"]["type"],
            "string"
        );
    }
    let create = &paths["/v1/jobs"]["post"]["responses"];
    assert_eq!(
        create["201"]["headers"]["Location"]["schema"]["type"],
        "string"
    );
    assert_eq!(
        create["200"]["headers"]["Idempotent-Replayed"]["schema"]["type"],
        "boolean"
    );
}

#[tokio::test]
async fn the_page_is_served_with_its_assets_and_a_strict_policy() {
    let app = TestApp::spawn().await;
    for (path, kind, marker) in [
        ("/", "text/html", "<title>onejob</title>"),
        ("/assets/app.js", "text/javascript", "Idempotency-Key"),
        ("/assets/style.css", "text/css", ".timeline"),
    ] {
        // No token: the page is public; the API it calls is not.
        let response = reqwest::get(format!("http://{}{path}", app.addr))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert!(
            headers["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        assert!(
            headers["content-security-policy"]
                .to_str()
                .unwrap()
                .starts_with("default-src 'self'"),
            "{path}"
        );
        let plain = response.text().await.unwrap();
        assert!(plain.contains(marker), "{path}");
        // A browser takes it gzipped (the binary keeps it so): the same text.
        let gzipped = reqwest::Client::new()
            .get(format!("http://{}{path}", app.addr))
            .header("accept-encoding", "gzip, deflate, br")
            .send()
            .await
            .unwrap();
        assert_eq!(gzipped.headers()["content-encoding"], "gzip", "{path}");
        let packed = gzipped.bytes().await.unwrap();
        assert!(packed.len() < plain.len(), "{path}");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&packed[..]), &mut text)
            .unwrap();
        assert_eq!(text, plain, "{path}");
    }
}
