//! Counting a prompt's tokens before a call, conservatively, the same way for every provider: a range whose upper
//! end is the text's UTF-8 length (a byte-level BPE token — OpenAI's, Anthropic's — is at least one byte) and whose
//! lower end is a quarter of it (English averages about four bytes a token). The upper end decides whether a prompt
//! fits a context window, so a prompt that does not fit is never sent; the lower end decides whether a provider's
//! reported usage is "far fewer than sent".
//!
//! Exact counting was weighed and left out: OpenAI's two current encodings (`o200k_base`, `cl100k_base`) are 5.3 MB
//! of data in every binary that counts — a third of the worker function — plus a table built on each container's
//! first count, to tighten a bound that rarely binds (today's context windows hold more than the 256 KiB an input
//! may be). BENCHMARKS.md has the figures.

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

/// How prompts are counted, as `GET /v1/providers` and `onejob providers` say it.
pub const METHOD: &str = "bytes";

/// The token count of `text`, as a range.
pub fn count(text: &str) -> Count {
    let bytes = text.len() as u64;
    Count {
        lower: bytes / 4,
        upper: bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_brackets_the_real_one() {
        // "hello world!" is 3 tokens in o200k_base and in cl100k_base.
        let counted = count("hello world!");
        assert_eq!(
            counted,
            Count {
                lower: 3,
                upper: 12
            }
        );
        assert!(counted.lower <= 3 && 3 <= counted.upper);
        // Non-Latin text: more bytes per character, never fewer tokens than bytes allow.
        assert_eq!(count("héllo").upper, 6);
    }
}
