//! What this process read from the store a moment ago: kept for `provider_state_cache_ms`, so that a worker spares a read whose
//! answer would change nothing — a provider's breaker that was clean, the stored evidence for a pair that an
//! ordinary answer leaves as it is. Anything that may change what is stored still reads the store first. The
//! window is the deployment's `provider_state_cache_ms` (100 ms by default: under load, a read per provider per
//! window instead of one per attempt; idle, every attempt reads).
//!
//! The price is the window itself: a breaker opened by another process is seen by this one up to a window later,
//! and an answer that would have closed a breaker another process just started counting leaves it counting.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct Recent<K, V> {
    /// How long a read stands in for the next ones.
    window: Duration,
    seen: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash, V: Clone> Recent<K, V> {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// What was read for `key` within the window, if anything.
    pub(super) fn get(&self, key: &K) -> Option<V> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(key)
            .filter(|(at, _)| at.elapsed() < self.window)
            .map(|(_, value)| value.clone())
    }

    pub(super) fn put(&self, key: K, value: V) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(key, (Instant::now(), value));
    }

    pub(super) fn forget(&self, key: &K) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_stands_for_the_window_and_not_after_it_or_once_forgotten() {
        let recent = Recent::new(Duration::from_secs(3600));
        assert_eq!(recent.get(&"a"), None);
        recent.put("a", 1);
        assert_eq!(recent.get(&"a"), Some(1));
        recent.forget(&"a");
        assert_eq!(recent.get(&"a"), None);
        // An entry older than the window: put, then aged by hand.
        recent.put("b", 2);
        recent.seen.lock().unwrap().get_mut(&"b").unwrap().0 -= recent.window;
        assert_eq!(recent.get(&"b"), None);
        // A window of 0: nothing stands in.
        let never = Recent::new(Duration::ZERO);
        never.put("a", 1);
        assert_eq!(never.get(&"a"), None);
    }
}
