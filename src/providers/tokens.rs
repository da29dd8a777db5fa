//! Counting tokens before a call: with the provider's own tokenizer where one is known (OpenAI models, through
//! tiktoken's encodings), conservatively otherwise.
//!
//! A count is a range. With a known tokenizer both ends are the exact count. Without one, the upper end is the
//! text's UTF-8 length (a byte-level BPE token is at least one byte) and the lower end a quarter of it over two
//! (English averages about four bytes a token). The upper end decides whether a prompt fits a context window; the
//! lower end decides whether a provider's reported usage is "far fewer than sent".
//!
//! The encodings known are the two of OpenAI's current chat models, `o200k_base` (GPT-4o, GPT-4.1, o-series and
//! later) and `cl100k_base` (GPT-4, GPT-3.5). Each is compiled into the binary and costs its size (3.6 and 1.7 MB);
//! older encodings (for completion-era models) are counted conservatively rather than carried.

use tiktoken_rs::tokenizer::{Tokenizer as Encoding, get_tokenizer};

use crate::config::{ProviderConfig, ProviderKind};

/// How one provider's prompts are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// The provider's own encoding, known from its model name.
    Known(Encoding),
    /// No known tokenizer: counted by bytes.
    Conservative,
}

/// A token count: the truth lies in `lower..=upper`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Count {
    pub lower: u64,
    pub upper: u64,
}

impl std::ops::Add for Count {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            lower: self.lower + other.lower,
            upper: self.upper + other.upper,
        }
    }
}

impl Tokenizer {
    pub fn for_provider(config: &ProviderConfig) -> Self {
        let known = match config.kind {
            ProviderKind::Openai => config.model.as_deref().and_then(get_tokenizer),
            ProviderKind::Anthropic | ProviderKind::Demo => None,
        };
        match known {
            Some(encoding @ (Encoding::O200kBase | Encoding::Cl100kBase)) => Self::Known(encoding),
            _ => Self::Conservative,
        }
    }

    /// The encoding's name, or `bytes` for the conservative count.
    pub fn name(self) -> String {
        match self {
            Self::Known(encoding) => format!("{encoding:?}"),
            Self::Conservative => "bytes".to_owned(),
        }
    }

    pub fn count(self, text: &str) -> Count {
        let bytes = text.len() as u64;
        // Each encoding by its own loader, so that no other encoding is linked in.
        let bpe = match self {
            Self::Known(Encoding::O200kBase) => Some(tiktoken_rs::o200k_base_singleton()),
            Self::Known(Encoding::Cl100kBase) => Some(tiktoken_rs::cl100k_base_singleton()),
            Self::Known(_) | Self::Conservative => None,
        };
        let exact = bpe.map(|bpe| bpe.encode_with_special_tokens(text).len() as u64);
        match exact {
            Some(n) => Count { lower: n, upper: n },
            None => Count {
                lower: bytes / 4,
                upper: bytes,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DemoBehavior;

    fn openai(model: &str) -> ProviderConfig {
        ProviderConfig {
            kind: ProviderKind::Openai,
            base_url: Some("http://x".into()),
            model: Some(model.into()),
            ..ProviderConfig::demo(DemoBehavior::Answer, 0)
        }
    }

    #[test]
    fn openai_models_are_counted_with_their_encoding() {
        let tokenizer = Tokenizer::for_provider(&openai("gpt-4o-mini"));
        assert_eq!(tokenizer.name(), "O200kBase");
        // "hello world" is two tokens in o200k_base.
        assert_eq!(tokenizer.count("hello world"), Count { lower: 2, upper: 2 });
    }

    #[test]
    fn older_encodings_are_not_carried_and_count_conservatively() {
        assert_eq!(
            Tokenizer::for_provider(&openai("gpt-4")).name(),
            "Cl100kBase"
        );
        assert_eq!(
            Tokenizer::for_provider(&openai("text-davinci-003")),
            Tokenizer::Conservative
        );
    }

    #[test]
    fn unknown_models_are_counted_conservatively() {
        let tokenizer = Tokenizer::for_provider(&openai("llama-local"));
        assert_eq!(tokenizer, Tokenizer::Conservative);
        let count = tokenizer.count("hello world!");
        assert_eq!(
            count,
            Count {
                lower: 3,
                upper: 12
            }
        );
        let exact = Tokenizer::for_provider(&openai("gpt-4o")).count("hello world!");
        assert!(count.lower <= exact.lower && exact.upper <= count.upper);
    }
}
