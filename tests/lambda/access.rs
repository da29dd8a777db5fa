//! Who may call the functions: owners and operators by the authorizer's JWT claims, and the page open to all.

use super::*;

/// Without the authorizer's claims there is no owner: 401, whatever bearer token the request carries.
#[tokio::test]
async fn a_request_without_jwt_claims_is_unauthorized() {
    let Some(f) = functions().await else { return };
    let mut unclaimed = event("api-create.json");
    unclaimed["requestContext"]
        .as_object_mut()
        .unwrap()
        .remove("authorizer");
    let (status, problem) = f.api_event(unclaimed).await;
    assert_eq!((status, &problem["code"]), (401, &json!("unauthorized")));
    let mut local_token = event("api-get.json");
    local_token["requestContext"]
        .as_object_mut()
        .unwrap()
        .remove("authorizer");
    local_token["headers"]["authorization"] = json!("Bearer dev-token-alice");
    assert_eq!(f.api_event(local_token).await.0, 401);
}

/// On AWS an operator is a caller whose JWT holds the configured claim (here the Cognito group
/// `onejob-operators`, as API Gateway hands a groups array over): it lists every owner's jobs that need a person,
/// settles one on its owner's behalf, and the job records the operator's `sub`. A caller without the group is an
/// owner: the view is not theirs.
#[tokio::test]
async fn an_operator_on_aws_is_a_jwt_claim_and_the_job_records_its_sub() {
    let Some(f) = functions().await else { return };
    let (status, created) = f.api("api-create.json").await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let operator = json!({"sub": "ops-7", "cognito:groups": "[support onejob-operators]"});
    let owner = json!({"sub": "alice", "cognito:groups": "[support]"});

    let (status, refused) = f
        .api_event(api_call("GET", "/v1/operator/jobs", owner.clone()))
        .await;
    assert_eq!((status, &refused["code"]), (403, &json!("forbidden")));
    // Stop waiting on alice's queued attempt: her chain's fallback is not qualified, so the job fails.
    let path = format!("/v1/jobs/{id}/attempts/1/cancel");
    let (status, job) = f.api_event(api_call("POST", &path, operator.clone())).await;
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["interventions"][0]["by"], "ops-7", "{job}");
    assert_eq!(job["interventions"][0]["action"], "attempt_cancelled");

    let (status, page) = f
        .api_event(api_call("GET", "/v1/operator/jobs?status=failed", operator))
        .await;
    assert_eq!(status, 200, "{page}");
    let listed: Vec<&str> = (page["jobs"].as_array().unwrap().iter())
        .map(|j| j["id"].as_str().unwrap())
        .collect();
    assert!(listed.contains(&id), "{page}");
    // Alice sees who settled her job.
    let (_, seen) = f.api_event(event_for("api-get.json", id)).await;
    assert_eq!(seen["interventions"], job["interventions"]);
}

/// The page and its assets hold no data: the api function serves them without the authorizer's claims (the
/// template routes them without the JWT authorizer), while every `/v1` route still demands the claims.
#[tokio::test]
async fn the_page_is_public_and_the_api_is_not() {
    let Some(f) = functions().await else { return };
    let anonymous = |method: &str, path: &str| {
        let mut event = event("api-get.json");
        event["rawPath"] = json!(path);
        event["requestContext"]["http"]["path"] = json!(path);
        event["requestContext"]["http"]["method"] = json!(method);
        let context = event["requestContext"].as_object_mut().unwrap();
        context.remove("authorizer");
        event["headers"]
            .as_object_mut()
            .unwrap()
            .remove("authorization");
        event
    };
    for path in [
        "/",
        "/assets/app.js",
        "/assets/style.css",
        "/healthz",
        "/openapi.json",
    ] {
        let (status, body) = f.api_raw(anonymous("GET", path)).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let (_, page) = f.api_raw(anonymous("GET", "/")).await;
    assert!(page.contains("<html"), "{page}");
    for (method, path) in [
        ("GET", "/v1/jobs"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/contracts"),
        ("GET", "/v1/providers"),
        (
            "GET",
            "/v1/jobs/job_c93ad8e3d05dd0142f00a17c6f511a74_mx3xkao0",
        ),
        (
            "POST",
            "/v1/jobs/job_c93ad8e3d05dd0142f00a17c6f511a74_mx3xkao0/cancel",
        ),
    ] {
        let (status, body) = f.api_raw(anonymous(method, path)).await;
        assert_eq!(status, 401, "{method} {path}: {body}");
    }
}
