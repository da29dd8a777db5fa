//! Backoff with full jitter, for every part of onejob that tries something again: the engine's store writes and the
//! client's requests. A random point in `0..=min(cap, base·2ⁿ)` spreads retries of many callers apart. And what a
//! server's `Retry-After` asks for, in either of its forms.

use std::time::{Duration, SystemTime};

/// How long to wait before retry `n` (0-based): a random point in `0..=min(cap, base·2ⁿ)`.
pub fn full_jitter(base: Duration, cap: Duration, n: u32) -> Duration {
    let ceiling = base.saturating_mul(2u32.saturating_pow(n)).min(cap);
    ceiling.mul_f64(fastrand::f64())
}

/// How long a `Retry-After` value asks to wait (RFC 9110 §10.2.3): a number of seconds, or an HTTP-date counted
/// from `now` (a date already past asks for no wait). `None` for anything else.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = httpdate::parse_http_date("Tue, 01 Dec 2026 10:00:00 GMT").unwrap();
        assert_eq!(retry_after(" 12 ", now), Some(Duration::from_secs(12)));
        assert_eq!(
            retry_after("Tue, 01 Dec 2026 10:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        // The two obsolete date forms a recipient must still accept.
        assert_eq!(
            retry_after("Tuesday, 01-Dec-26 10:01:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            retry_after("Tue Dec  1 10:00:05 2026", now),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            retry_after("Tue, 01 Dec 2026 09:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-1", now), None);
    }

    #[test]
    fn waits_grow_up_to_the_cap_and_are_spread() {
        let (base, cap) = (Duration::from_millis(200), Duration::from_secs(5));
        for n in 0..40 {
            let ceiling = (base * 2u32.saturating_pow(n.min(20))).min(cap);
            for _ in 0..50 {
                assert!(full_jitter(base, cap, n) <= ceiling);
            }
        }
        let waits: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| full_jitter(base, cap, 3)).collect();
        assert!(waits.len() > 10, "jittered: {waits:?}");
    }
}
