//! What is kept about how an attempt went: a bounded error, and what the provider said about its call.

use serde::{Deserialize, Serialize};

/// A machine-readable reason with a human one, kept on a failed attempt or a failed job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorInfo {
    /// Stable, snake_case: clients branch on it.
    pub code: String,
    pub message: String,
}

impl ErrorInfo {
    /// The longest message kept, in bytes: an error may quote a provider's answer, and a job must stay within
    /// what every store accepts (invariant 11).
    pub const MAX_MESSAGE_BYTES: usize = 1024;

    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
        }
        .bounded()
    }

    /// The same error with its message cut to [`ErrorInfo::MAX_MESSAGE_BYTES`] (marked with `…`).
    pub fn bounded(mut self) -> Self {
        truncate(&mut self.message, Self::MAX_MESSAGE_BYTES);
        self
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, ending with `…` when something was cut.
fn truncate(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

/// What a provider said about one call besides its answer, recorded on the attempt for billing and operators.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CallReport {
    /// The model id the provider reports having used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Prompt tokens, as the provider counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Answer tokens, as the provider counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Of the prompt tokens, those the provider read from its prompt cache (billed at its cached rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    /// Of the answer tokens, those the model spent reasoning (billed as answer tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// What the call cost by the deployment's price table when it was recorded, in billionths of the table's
    /// currency; none when no price was configured for the provider, or it reported no usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_nanos: Option<u64>,
    /// The provider's `Retry-After`, in seconds: information for the operator. onejob never retries by itself; a
    /// retry is a new attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// The same wait to the millisecond, where the provider said it so (`retry-after-ms`): what a retry waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// What onejob noticed about the call without failing it: a reported prompt far smaller than typical text of
    /// its size (see `providers::tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CallReport {
    /// The longest model id kept, in bytes (the provider chooses it).
    pub const MAX_MODEL_BYTES: usize = 200;

    /// The longest note kept, in bytes.
    pub const MAX_NOTE_BYTES: usize = 400;

    /// `None` when the provider said nothing worth keeping; the model id cut to [`CallReport::MAX_MODEL_BYTES`], a
    /// note to [`CallReport::MAX_NOTE_BYTES`].
    pub fn into_option(mut self) -> Option<Self> {
        if let Some(model) = &mut self.model {
            truncate(model, Self::MAX_MODEL_BYTES);
        }
        if let Some(note) = &mut self.note {
            truncate(note, Self::MAX_NOTE_BYTES);
        }
        (self != Self::default()).then_some(self)
    }
}
