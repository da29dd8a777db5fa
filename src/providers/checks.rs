//! The checks every call of a contract on a provider passes through, in production (the worker) and in
//! qualification (`onejob qualify`) alike, so that a qualification tests exactly what failover will rely on:
//! - before the call: the prompt renders strictly, and with the output budget it fits the provider's context
//!   window (counted conservatively: see [`crate::providers::tokens`]);
//! - after it: the provider did not report fewer prompt tokens than the prompt has for certain (a truncated or
//!   dropped prompt; far fewer than typical is only a note on the report), the answer is not larger than kept,
//!   keeps the output schema and adds no top-level key.

use serde_json::Value;

use crate::contracts::Contract;
use crate::domain::{CallReport, ErrorInfo};
use crate::providers::tokens::{Count, Encoding};
use crate::providers::{ConfiguredProvider, ProviderRequest, SYSTEM_PROMPT};

/// The largest result kept, as JSON text. A job item (input up to the body limit, result, attempts) must fit a
/// DynamoDB item (400 KB); a larger answer fails its attempt with `result_too_large`, and nothing is written.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// Tokens a chat format adds around the messages (roles, separators), counted on top of their text.
const FORMAT_OVERHEAD: u64 = 16;

/// A call ready to send.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub request: ProviderRequest,
    /// The rendered prompt alone.
    pub prompt_tokens: Count,
    /// Everything sent: system prompt, prompt, schema, format overhead.
    pub sent_tokens: Count,
}

/// Renders the prompt and checks that it fits. An `Err` is a definite failure: nothing is sent.
pub fn prepare(
    contract: &Contract,
    provider: &ConfiguredProvider,
    input: &Value,
    idempotency_key: String,
) -> Result<Prepared, ErrorInfo> {
    let prompt = contract
        .render(input)
        .map_err(|e| ErrorInfo::new("prompt_render_failed", e))?;
    let encoding = Encoding::of(&provider.config);
    let prompt_tokens = encoding.count(&prompt);
    let sent_tokens = prompt_tokens
        + encoding.count(SYSTEM_PROMPT)
        + encoding.count(&contract.output_schema.to_string())
        + Count {
            upper: FORMAT_OVERHEAD,
            ..Count::default()
        };
    if let Some(window) = provider.config.context_window() {
        let budget = u64::from(contract.max_output_tokens);
        let needed = sent_tokens.upper + budget;
        if needed > window {
            return Err(ErrorInfo::new(
                "context_window_exceeded",
                format!(
                    "the prompt counts up to {} tokens ({}) and the output budget is {budget}: {needed} do not fit \
                     the provider's context window of {window}",
                    sent_tokens.upper,
                    encoding.method(),
                ),
            ));
        }
    }
    let request = ProviderRequest {
        idempotency_key,
        contract: contract.reference.clone(),
        prompt,
        input: input.clone(),
        output_schema: contract.output_schema.clone(),
        temperature: contract.temperature,
        max_output_tokens: contract.max_output_tokens,
    };
    Ok(Prepared {
        request,
        prompt_tokens,
        sent_tokens,
    })
}

/// `report` with a note when the provider reports far fewer prompt tokens than typical text of the prompt's size
/// would have (under half a quarter of its bytes): part of the prompt may have been dropped, or it is text that
/// packs many bytes a token (separator lines, runs of spaces). Not knowing which, onejob notes it and fails nothing.
pub fn annotate(prepared: &Prepared, report: &mut CallReport) {
    let typical = prepared.prompt_tokens.typical;
    if let Some(reported) = report
        .input_tokens
        .filter(|r| r.saturating_mul(2) < typical)
    {
        report.note = Some(format!(
            "the provider reports {reported} prompt tokens where prose of the prompt's size would have about \
             {typical}: if the prompt is not made of long runs (separator lines, spaces), part of it was dropped"
        ));
    }
}

/// The error codes of answers that came back and broke the contract (rather than failing to come): what counts
/// against a provider's qualification in production.
const CONTRACT_BREACHES: [&str; 4] = [
    "output_invalid",
    "output_not_json",
    "output_truncated",
    "prompt_truncated",
];

/// Whether `error` says the provider answered and broke the contract.
pub fn breaks_contract(error: &ErrorInfo) -> bool {
    CONTRACT_BREACHES.contains(&error.code.as_str())
}

/// Holds an answer to the contract. An `Err` fails the attempt (or the qualification run) with its reason.
pub fn check_answer(
    contract: &Contract,
    prepared: &Prepared,
    output: &Value,
    report: &CallReport,
) -> Result<(), ErrorInfo> {
    if let Some(reported) = report.input_tokens {
        let least = prepared.prompt_tokens.lower;
        if reported < least {
            return Err(ErrorInfo::new(
                "prompt_truncated",
                format!(
                    "the provider reports {reported} prompt tokens, yet the prompt alone has at least {least} in \
                     the model's encoding: it truncated or dropped part of it"
                ),
            ));
        }
    }
    let size = output.to_string().len();
    if size > MAX_RESULT_BYTES {
        return Err(ErrorInfo::new(
            "result_too_large",
            format!("the result is {size} bytes of JSON; at most {MAX_RESULT_BYTES} are kept"),
        ));
    }
    let problems = contract.output_problems(output);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ErrorInfo::new("output_invalid", problems.join("; ")))
    }
}
