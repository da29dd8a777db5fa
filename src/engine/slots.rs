//! Each provider's calls in flight, across every worker and function: a provider with `max_in_flight` takes a call
//! only while one of its slots is free (held in the store, each until its call's listening would end, so a worker
//! that dies frees its slot by then). A burst of jobs then waits queued instead of earning 429s; waiting is not a
//! try: no attempt is made, none is charged, and the message comes back.
//!
//! A slot is its attempt's, and it is freed by the step that makes the call: the one whose claim succeeded. A
//! duplicate message of a running attempt finds the slot its attempt holds (taking it again is holding it), and
//! its claim is refused: it frees nothing, so the running call keeps its slot — unless the refusal says the call is
//! over (the attempt succeeded, failed or was discarded), when the slot it took again would otherwise stay taken
//! until its time ends. A step whose take landed but whose answer was lost comes back as a redelivery that finds the
//! slot its own attempt's.

use chrono::Duration;

use super::Engine;
use crate::domain::AttemptRef;
use crate::queue::Message;
use crate::store::{CallSlot, StoreError};

/// How soon an attempt waiting for a slot looks again.
const LOOK_AGAIN: Duration = Duration::seconds(1);

/// The holder of an attempt's slot.
fn holder(attempt: &AttemptRef) -> String {
    format!("{}#{}", attempt.job_id, attempt.number)
}

impl Engine {
    /// Takes a slot of the provider the message names for its attempt, if the provider is capped; while all are
    /// taken, puts the message off (the attempt stays queued, without a try). Whether the step goes on — also when
    /// the attempt is no longer queued, for the claim to refuse.
    pub(super) async fn take_slot(&self, message: &Message) -> Result<bool, StoreError> {
        let Some(provider) = &message.provider else {
            return Ok(true);
        };
        let Some(cap) = (self.providers.get(provider)).and_then(|p| p.config.limits.max_in_flight)
        else {
            return Ok(true);
        };
        let now = self.clock.now();
        let slot = CallSlot {
            cap,
            until: now + self.lease(),
            now,
        };
        let held = (self.store)
            .take_call_slot(provider, &holder(&message.attempt), slot)
            .await?;
        if held {
            return Ok(true);
        }
        let attempt = &message.attempt;
        tracing::info!(job_id = %attempt.job_id, attempt = attempt.number, %provider, cap, "every call slot taken: the attempt waits, queued, without a try");
        let put_off = self.dispatch_again(attempt, LOOK_AGAIN).await?;
        if put_off {
            self.metrics.slot_wait(provider);
        }
        Ok(!put_off)
    }

    /// Frees the slot the message's attempt held, if its provider is capped: by the step that claimed the attempt
    /// and made the call, once it is done. Advisory: a store that fails here is logged, and the slot frees itself
    /// when its time ends.
    pub(super) async fn free_slot(&self, message: &Message) {
        let Some(provider) = &message.provider else {
            return;
        };
        if (self.providers.get(provider)).is_none_or(|p| p.config.limits.max_in_flight.is_none()) {
            return;
        }
        if let Err(e) = (self.store)
            .free_call_slot(provider, &holder(&message.attempt))
            .await
        {
            tracing::warn!(%provider, error = %crate::telemetry::error_chain(&e), "call slot not freed: it frees itself at its lease's end");
        }
    }
}
