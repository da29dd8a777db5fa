//! A provider's call slots (`max_in_flight`): who holds one, and until when. A slot is its attempt's; taking it again
//! is holding it (a duplicate message of a running attempt finds its attempt's slot, and takes no second one); a
//! slot held past its time is free (its holder died). Freed by the step that made the call — the one whose claim
//! succeeded — never by a step whose claim was refused (`engine::slots`). The rule is here, pure; the DynamoDB store
//! applies it to the provider's slots item in a write guarded by its revision, SQLite in the writer's transaction.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::time::Timestamp;

/// One provider's slots: each holder, until when (milliseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSlots {
    pub holders: BTreeMap<String, i64>,
}

impl CallSlots {
    /// `holder` takes one of `cap` slots until `until`, as the slots stand at `now`: the slots after, or `None`
    /// while all are held by others.
    pub fn take(&self, holder: &str, cap: u32, until: Timestamp, now: Timestamp) -> Option<Self> {
        let mut after = self.clone();
        let now = now.timestamp_millis();
        after.holders.retain(|h, end| h != holder && *end > now);
        if after.holders.len() >= cap as usize {
            return None;
        }
        after
            .holders
            .insert(holder.to_owned(), until.timestamp_millis());
        Some(after)
    }

    /// The slots once `holder` freed its own: `None` if it held none (nothing to write).
    pub fn free(&self, holder: &str) -> Option<Self> {
        let mut after = self.clone();
        after.holders.remove(holder)?;
        Some(after)
    }

    /// The slots held at `now`.
    pub fn held(&self, now: Timestamp) -> usize {
        let now = now.timestamp_millis();
        self.holders.values().filter(|end| **end > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn at(ms: i64) -> Timestamp {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn a_slot_is_its_holders_taken_again_and_free_once_its_time_ends() {
        let one = CallSlots::default()
            .take("job1#1", 1, at(100), at(0))
            .unwrap();
        // Taken again by its own attempt (a duplicate message): held, no second slot.
        let again = one.take("job1#1", 1, at(150), at(10)).unwrap();
        assert_eq!(again.held(at(10)), 1);
        assert_eq!(one.take("job2#1", 1, at(100), at(10)), None);
        // Past its time, the slot is free.
        assert!(one.take("job2#1", 1, at(200), at(100)).is_some());
        assert_eq!(one.free("job2#1"), None);
        assert_eq!(one.free("job1#1").unwrap().held(at(0)), 0);
    }
}
