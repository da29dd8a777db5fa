//! Time, injected. The server uses [`SystemClock`]; tests use [`ManualClock`] and move it by hand, so timeouts and
//! leases are exercised in milliseconds and without sleeping.

use std::fmt::Debug;
use std::sync::Mutex;

use chrono::{DateTime, Duration, DurationRound, Utc};

use crate::domain::Timestamp;

pub trait Clock: Send + Sync + Debug {
    /// Now, truncated to the millisecond (what the stores keep).
    fn now(&self) -> Timestamp;
}

fn to_millis(t: DateTime<Utc>) -> Timestamp {
    t.duration_trunc(Duration::milliseconds(1))
        .expect("a current time truncates to milliseconds")
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        to_millis(Utc::now())
    }
}

/// A clock that stands still until told to move.
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        Self(Mutex::new(to_millis(start)))
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().expect("clock lock");
        *now = to_millis(*now + by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().expect("clock lock")
    }
}
