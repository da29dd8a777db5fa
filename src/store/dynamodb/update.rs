//! The update expressions of the one-request transitions, built with their placeholders, and the sparse sweep
//! index's keys.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{SWEEP_SHARDS, n, s};
use crate::domain::{Attempt, AttemptState, Job, JobId, Stamp, Timestamp};

/// The two kinds of sweep entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sweep {
    /// A `queued` attempt of an open job, by when it was last dispatched.
    Queued,
    /// A `started` attempt of a job not cancelled, by the end of its lease.
    Started,
    /// A job's deliveries of completion events, by when they are due (their item, not the job's), where their owner
    /// has no endpoint (only the bus hears of its jobs) or they were armed before each owner had a lane.
    Events,
    /// An owner's lane of deliveries (its endpoint's item), by when the lane is next due: the deliveries of an owner
    /// with an endpoint are in a lane of their own (`LANE#<owner>`), so that no owner's backlog stands before another
    /// owner's events.
    Lanes,
    /// A job `unknown` (its live attempt may still be working) or `failed`, that needs a person: by when it came
    /// to be so (the operators' view).
    Unknown,
    Failed,
}

impl Sweep {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Started => "STARTED",
            Self::Events => "EVENTS",
            Self::Lanes => "LANES",
            Self::Unknown => "UNKNOWN",
            Self::Failed => "FAILED",
        }
    }
}

pub(super) struct AttemptUpdate {
    sets: Vec<String>,
    removes: Vec<String>,
    condition: String,
    names: HashMap<String, String>,
    values: HashMap<String, AttributeValue>,
    touch: bool,
    writer: bool,
}

impl AttemptUpdate {
    /// An update of attempt `number` by the write `stamp`, bumping `rev` and (unless told otherwise) `updated_at`
    /// and the attempt's `writer`.
    pub(super) fn new(number: u32, stamp: &Stamp) -> Self {
        Self {
            sets: vec!["rev = rev + :one".into()],
            removes: Vec::new(),
            condition: String::new(),
            names: HashMap::from([
                ("#attempts".to_owned(), "attempts".to_owned()),
                ("#n".to_owned(), number.to_string()),
                ("#state".to_owned(), "state".to_owned()),
            ]),
            values: HashMap::from([
                (":one".to_owned(), n(1)),
                (":zero".to_owned(), n(0)),
                (":now".to_owned(), n(stamp.now.timestamp_millis())),
                (":token".to_owned(), s(stamp.token.as_str())),
            ]),
            touch: true,
            writer: true,
        }
    }

    pub(super) fn condition(&mut self, condition: &str) {
        self.condition = condition.to_owned();
    }

    pub(super) fn set(&mut self, clause: &str) {
        self.sets.push(clause.to_owned());
    }

    pub(super) fn remove(&mut self, path: &str) {
        self.removes.push(path.to_owned());
    }

    pub(super) fn value(&mut self, name: &str, value: AttributeValue) {
        self.values.insert(name.to_owned(), value);
    }

    pub(super) fn name(&mut self, placeholder: &str, name: &str) {
        self.names.insert(placeholder.to_owned(), name.to_owned());
    }

    /// Leaves `updated_at` alone (a completion's time is kept in the slot).
    pub(super) fn no_updated_at(&mut self) {
        self.touch = false;
    }

    /// Leaves the attempt's `writer` alone: the write does not move an attempt.
    pub(super) fn no_writer(&mut self) {
        self.writer = false;
    }

    pub(super) fn sweep(&mut self, kind: Sweep, id: &JobId, at: Timestamp) {
        self.set("sweep_pk = :sweep_pk, sweep_at = :sweep_at");
        self.value(":sweep_pk", s(&sweep_key(kind, id)));
        self.value(":sweep_at", n(at.timestamp_millis()));
    }

    pub(super) fn finish(
        mut self,
    ) -> (
        String,
        String,
        HashMap<String, String>,
        HashMap<String, AttributeValue>,
    ) {
        if self.touch {
            self.sets.push("updated_at = :now".into());
        }
        if self.writer {
            self.sets.push("#attempts.#n.writer = :token".into());
        }
        let mut expression = format!("SET {}", self.sets.join(", "));
        if !self.removes.is_empty() {
            expression.push_str(&format!(" REMOVE {}", self.removes.join(", ")));
        }
        // DynamoDB refuses placeholders that the expressions do not use.
        let used = format!("{expression} {}", self.condition);
        self.names.retain(|k, _| used.contains(k.as_str()));
        self.values.retain(|k, _| contains_placeholder(&used, k));
        (expression, self.condition, self.names, self.values)
    }
}

fn contains_placeholder(text: &str, placeholder: &str) -> bool {
    text.match_indices(placeholder).any(|(i, _)| {
        text[i + placeholder.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

pub(super) fn sweep_key(kind: Sweep, id: &JobId) -> String {
    sharded(kind, id.intent())
}

/// The sweep index's partition of `kind` that `text` falls in.
pub(super) fn sharded(kind: Sweep, text: &str) -> String {
    let shard = text
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
        % SWEEP_SHARDS;
    format!("{}#{shard}", kind.as_str())
}

/// The sweep entry a live attempt of `job` has, if any: a queued attempt of an open job (its message may be
/// lost), a started attempt of a job not cancelled (its worker may have died; also after another attempt won).
pub(super) fn sweep_kind(job: &Job, live: &Attempt) -> Option<Sweep> {
    match live.state {
        AttemptState::Queued if job.completed_by.is_none() && job.cancelled_at.is_none() => {
            Some(Sweep::Queued)
        }
        AttemptState::Started if job.cancelled_at.is_none() => Some(Sweep::Started),
        _ => None,
    }
}
