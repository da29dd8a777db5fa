//! An OpenAI-compatible client: `POST {base_url}/chat/completions` with a JSON-schema response format, a bearer
//! key read from `api_key_env`, and `Idempotency-Key: <job id>:<attempt>`.

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{Provider, ProviderOutcome, ProviderRequest};
use crate::config::ProviderConfig;
use crate::domain::ErrorInfo;

const SYSTEM_PROMPT: &str =
    "Answer with one JSON object that matches the given JSON Schema, and nothing else.";

#[derive(Debug)]
pub struct OpenAiProvider {
    http: reqwest::Client,
    url: String,
    model: String,
    /// Where the API key is read from at each call, so a rotated key needs no restart.
    api_key_env: Option<String>,
}

impl OpenAiProvider {
    pub fn new(config: &ProviderConfig, http: reqwest::Client) -> Self {
        let base = config.base_url.as_deref().unwrap_or_default();
        Self {
            http,
            url: format!("{}/chat/completions", base.trim_end_matches('/')),
            model: config.model.clone().unwrap_or_default(),
            api_key_env: config.api_key_env.clone(),
        }
    }

    fn body(&self, request: &ProviderRequest) -> Value {
        json!({
            "model": self.model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": request.prompt},
            ],
            "temperature": request.temperature,
            "max_tokens": request.max_output_tokens,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": request.contract.name(), "schema": request.output_schema},
            },
        })
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn call(&self, request: &ProviderRequest) -> ProviderOutcome {
        let mut call = self
            .http
            .post(&self.url)
            .header("Idempotency-Key", &request.idempotency_key)
            .json(&self.body(request));
        if let Some(key) = self
            .api_key_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
        {
            call = call.bearer_auth(key);
        }
        let response = match call.send().await {
            Ok(response) => response,
            // Refused or unreachable: nothing was sent, so nothing was done.
            Err(e) if e.is_connect() => {
                return ProviderOutcome::Failed(ErrorInfo::new("connection_failed", e.to_string()));
            }
            Err(e) => {
                return ProviderOutcome::Lost(ErrorInfo::new("connection_lost", e.to_string()));
            }
        };
        let status = response.status();
        let text = match response.text().await {
            Ok(text) => text,
            Err(e) => {
                return ProviderOutcome::Lost(ErrorInfo::new("connection_lost", e.to_string()));
            }
        };
        if !status.is_success() {
            let code = if status == StatusCode::TOO_MANY_REQUESTS {
                "rate_limited"
            } else {
                "provider_error"
            };
            return ProviderOutcome::Failed(ErrorInfo::new(
                code,
                format!("HTTP {status}: {}", snippet(&text)),
            ));
        }
        read_answer(&text)
    }
}

/// The JSON output inside a chat completion: `choices[0].message.content`, itself JSON text.
fn read_answer(text: &str) -> ProviderOutcome {
    let content = serde_json::from_str::<Value>(text).ok().and_then(|body| {
        body.pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let Some(content) = content else {
        return ProviderOutcome::Failed(ErrorInfo::new(
            "bad_response",
            format!("not a chat completion: {}", snippet(text)),
        ));
    };
    match serde_json::from_str(&content) {
        Ok(output) => ProviderOutcome::Answered(output),
        Err(_) => ProviderOutcome::Failed(ErrorInfo::new(
            "output_not_json",
            format!("the answer is not JSON: {}", snippet(&content)),
        )),
    }
}

fn snippet(text: &str) -> String {
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_from_the_first_choice() {
        let body = json!({"choices": [{"message": {"role": "assistant", "content": "{\"summary\": \"s\"}"}}]});
        assert_eq!(
            read_answer(&body.to_string()),
            ProviderOutcome::Answered(json!({"summary": "s"}))
        );
        let prose = json!({"choices": [{"message": {"content": "Here is a summary: s"}}]});
        assert!(
            matches!(read_answer(&prose.to_string()), ProviderOutcome::Failed(e) if e.code == "output_not_json")
        );
        assert!(
            matches!(read_answer("<html>"), ProviderOutcome::Failed(e) if e.code == "bad_response")
        );
    }
}
