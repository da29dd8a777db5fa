//! Time, injected. The server uses [`SystemClock`]; tests use [`ManualClock`] and move it by hand, so timeouts,
//! leases and long polls are exercised in milliseconds and without sleeping.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Duration, DurationRound, Utc};
use tokio::sync::watch;

use crate::domain::Timestamp;

/// A boxed future, as the clock's `sleep` returns one.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

pub trait Clock: Send + Sync + Debug {
    /// Now, truncated to the millisecond (what the stores keep).
    fn now(&self) -> Timestamp;

    /// Resolves once this clock has moved `duration` past the moment of the call.
    fn sleep(&self, duration: Duration) -> Sleep;
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

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration.to_std().unwrap_or_default()))
    }
}

/// A clock that stands still until told to move; sleepers wake when it passes their deadline.
#[derive(Debug)]
pub struct ManualClock(watch::Sender<Timestamp>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        Self(watch::Sender::new(to_millis(start)))
    }

    pub fn advance(&self, by: Duration) {
        self.0.send_modify(|now| *now = to_millis(*now + by));
    }

    /// How many sleeps are waiting on this clock.
    pub fn sleepers(&self) -> usize {
        self.0.receiver_count()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.borrow()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        let mut now = self.0.subscribe();
        let deadline = *now.borrow() + duration;
        Box::pin(async move {
            // The sender lives as long as the clock; if the clock is gone, nobody will ever wake us.
            if now.wait_for(|t| *t >= deadline).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[tokio::test]
    async fn a_manual_sleep_wakes_only_when_the_clock_passes_its_deadline() {
        let clock = ManualClock::new(Utc.timestamp_millis_opt(0).unwrap());
        let mut sleep = clock.sleep(Duration::seconds(5));
        clock.advance(Duration::seconds(4));
        assert!(futures_poll_once(&mut sleep).await.is_none());
        clock.advance(Duration::seconds(1));
        assert!(futures_poll_once(&mut sleep).await.is_some());
        assert_eq!(clock.now().timestamp_millis(), 5_000);
    }

    /// Polls a future once: `Some` if it is ready.
    async fn futures_poll_once(f: &mut Sleep) -> Option<()> {
        tokio::select! {
            biased;
            () = f => Some(()),
            () = std::future::ready(()) => None,
        }
    }
}
