//! Backoff with full jitter, for every part of onejob that tries something again: the engine's store writes and the
//! client's requests. A random point in `0..=min(cap, base·2ⁿ)` spreads retries of many callers apart.

use std::time::Duration;

/// How long to wait before retry `n` (0-based): a random point in `0..=min(cap, base·2ⁿ)`.
pub fn full_jitter(base: Duration, cap: Duration, n: u32) -> Duration {
    let ceiling = base.saturating_mul(2u32.saturating_pow(n)).min(cap);
    ceiling.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

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
