//! Counting a prompt's tokens before a call, the same way for every provider, as a range of sound bounds and a
//! typical figure:
//! - the upper bound is the text's UTF-8 length: a token of a byte-level BPE (OpenAI's, Anthropic's) or of a
//!   tokenizer with byte fallback covers at least one byte. It decides whether a prompt fits a context window, so a
//!   prompt that does not fit is never sent.
//! - the lower bound is sound only where the model's encoding is known: OpenAI's encodings (`o200k_base`,
//!   `cl100k_base`, and the older ones) have no token longer than 128 bytes (a run of 128 spaces), so a text of `n`
//!   bytes is at least `⌈n / 128⌉` of their tokens. For any other model it is 0: nothing is known.
//! - the typical figure is a quarter of the bytes (English prose averages about four bytes a token). It is an average,
//!   not a bound: separator lines (`====`), runs of spaces or dashes count 4 to 30 times fewer tokens. A provider
//!   reporting far fewer than it is a note on the attempt's report, never a failure.
//!
//! A provider that reports fewer prompt tokens than the sound lower bound dropped part of the prompt: that, and
//! only that, is `prompt_truncated`.
//!
//! Exact counting was weighed and left out: OpenAI's two current encodings are 5.3 MB of data in every binary that
//! counts — a third of the worker function — plus a table built on each container's first count, to tighten a bound
//! that rarely binds (today's context windows hold more than the 256 KiB an input may be). BENCHMARKS.md has the
//! figures.

/// The longest token of any of OpenAI's encodings, in bytes (measured on the published `*.tiktoken` files).
pub const LONGEST_OPENAI_TOKEN: u64 = 128;

/// A token count: the truth lies in `lower..=upper`; `typical` is what English prose would come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Count {
    pub lower: u64,
    pub typical: u64,
    pub upper: u64,
}

impl std::ops::Add for Count {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            lower: self.lower + other.lower,
            typical: self.typical + other.typical,
            upper: self.upper + other.upper,
        }
    }
}

/// What is known of a model's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// One of OpenAI's: no token is longer than [`LONGEST_OPENAI_TOKEN`] bytes.
    OpenAi,
    /// Not known: only the byte bound holds.
    Unknown,
}

impl Encoding {
    /// The encoding of `model` as an OpenAI-compatible provider names it: OpenAI's own model families (GPT-3.5,
    /// GPT-4 and its `4o`, `4.1`, `4.5` successors, GPT-5, the `o` reasoning models, `gpt-oss`) use OpenAI's
    /// encodings; any other model, served by any other server, may use anything.
    pub fn of_openai_model(model: &str) -> Self {
        let model = model.rsplit('/').next().unwrap_or(model);
        let reasoning = model.len() > 1
            && model.starts_with('o')
            && model[1..].starts_with(|c: char| c.is_ascii_digit());
        if model.starts_with("gpt-") || model.starts_with("chatgpt-") || reasoning {
            Self::OpenAi
        } else {
            Self::Unknown
        }
    }

    /// The encoding of a configured provider's model, as far as its kind knows it.
    pub fn of(config: &super::ProviderConfig) -> Self {
        config.kind.kind().encoding()
    }

    /// How prompts are counted, as `GET /v1/providers` and `onejob providers` say it.
    pub fn method(self) -> &'static str {
        match self {
            Self::OpenAi => "bytes, at most 128 per token",
            Self::Unknown => "bytes",
        }
    }

    /// The token count of `text`, as a range.
    pub fn count(self, text: &str) -> Count {
        let bytes = text.len() as u64;
        let lower = match self {
            Self::OpenAi => bytes.div_ceil(LONGEST_OPENAI_TOKEN),
            Self::Unknown => 0,
        };
        Count {
            lower,
            typical: bytes / 4,
            upper: bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_brackets_the_real_one() {
        // "hello world!" is 3 tokens in o200k_base and in cl100k_base.
        let counted = Encoding::OpenAi.count("hello world!");
        assert_eq!(
            counted,
            Count {
                lower: 1,
                typical: 3,
                upper: 12
            }
        );
        // Measured with tiktoken on o200k_base: 4,000 bytes of `=` are 62 tokens, of spaces 32, fifty 80-column
        // separator lines 100 — far fewer than a quarter of the bytes, never fewer than the bound.
        for (text, real) in [
            ("=".repeat(4_000), 62),
            (" ".repeat(4_000), 32),
            (format!("{}\n", "=".repeat(79)).repeat(50), 100),
        ] {
            let counted = Encoding::OpenAi.count(&text);
            assert!(
                counted.lower <= real && real < counted.typical,
                "{counted:?}"
            );
        }
        // Non-Latin text: more bytes per character, never fewer tokens than bytes allow.
        assert_eq!(Encoding::Unknown.count("héllo").upper, 6);
        assert_eq!(Encoding::Unknown.count(&"x".repeat(1_000)).lower, 0);
    }

    #[test]
    fn openai_model_families_are_known_and_others_are_not() {
        for known in [
            "gpt-4o-mini",
            "gpt-4.1",
            "gpt-5",
            "gpt-5-mini-2025-08-07",
            "o1",
            "o3-mini",
            "o4-mini",
            "chatgpt-4o-latest",
            "gpt-oss-120b",
            "openai/gpt-oss-20b",
            "gpt-3.5-turbo",
        ] {
            assert_eq!(
                Encoding::of_openai_model(known),
                Encoding::OpenAi,
                "{known}"
            );
        }
        for unknown in [
            "llama3.1:8b",
            "mistral-large-latest",
            "gemini-2.5-flash",
            "claude-sonnet-4-5",
            "omni",
            "qwen2.5",
        ] {
            assert_eq!(
                Encoding::of_openai_model(unknown),
                Encoding::Unknown,
                "{unknown}"
            );
        }
    }
}
