//! What a write costs in write capacity units, by DynamoDB's documented sizing rules, for the items this store
//! writes:
//!
//! - an item's size is the sum of its attribute names and values (UTF-8 strings and binary values by their length;
//!   numbers about one byte per two significant digits, plus one; 3 bytes per map or list and 1 per element);
//! - a `PutItem` or `UpdateItem` costs one unit per started KiB of the larger of the item before and after (a
//!   create whose input is kept apart writes two items: the input's and the job's);
//! - each global secondary index the write touches costs one unit per started KiB of its entry (the table's key,
//!   the index's key and the projected attributes — none more here: both indexes hold keys only): an entry that
//!   appears is a put, one that goes is a delete (sized as it was), one whose key changes is both, one whose key
//!   stays but whose projected attributes change is a put (which keys-only entries never are);
//! - a write whose condition fails is charged as well, by the larger of the item and what it would have written
//!   (a replay's create, a lost race): `write_units` counts the writes that land.
//!
//! The figures are what the item encoding gives for a job's states; they are an estimate of the bill (DynamoDB
//! rounds the same way), not a measurement.

use aws_sdk_dynamodb::types::AttributeValue;

use super::Item;
use super::item::{encode, encode_input};
use crate::domain::Job;

/// The units one write costs: on the table and on each index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteUnits {
    pub table: u64,
    pub by_owner: u64,
    pub sweep: u64,
}

impl WriteUnits {
    pub fn total(self) -> u64 {
        self.table + self.by_owner + self.sweep
    }
}

/// The units of the write that turns the item of `before` (none for a create) into the item of `after`.
pub fn write_units(before: Option<&Job>, after: &Job) -> WriteUnits {
    // Every write bumps `rev`, so every write changes the item (and each index entry that projects it).
    let old = before.map(|job| encode(job, 1));
    let new = encode(after, if before.is_some() { 2 } else { 1 });
    // A create writes an input kept apart first, in an item of its own that no later write touches.
    let input = match before {
        None => encode_input(after).map_or(0, |item| units(size(&item))),
        Some(_) => 0,
    };
    WriteUnits {
        table: input + units(old.as_ref().map_or(0, size).max(size(&new))),
        by_owner: index_units(old.as_ref(), &new, ["owner", "created_key"]),
        sweep: index_units(old.as_ref(), &new, ["sweep_pk", "sweep_at"]),
    }
}

/// The size DynamoDB counts for the item that holds `job` (without its input when that is kept apart). An item may
/// be at most 400 KB.
pub fn item_size(job: &Job) -> usize {
    size(&encode(job, 1))
}

fn size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(text) => text.len(),
        AttributeValue::B(bytes) => bytes.as_ref().len(),
        AttributeValue::N(number) => {
            let digits = number.trim_start_matches('-').trim_start_matches('0');
            digits
                .chars()
                .filter(char::is_ascii_digit)
                .count()
                .div_ceil(2)
                + 1
        }
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(name, value)| name.len() + value_size(value) + 1)
                .sum::<usize>()
        }
        AttributeValue::L(list) => 3 + list.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        _ => 1,
    }
}

fn units(bytes: usize) -> u64 {
    bytes.div_ceil(1024).max(1) as u64
}

/// The units a keys-only index with key `keys` pays for the change from `old` to `new`.
fn index_units(old: Option<&Item>, new: &Item, keys: [&str; 2]) -> u64 {
    // The entry: the table's key and the index's, or none when the item lacks an index key (a sparse index).
    let entry = |item: &Item| -> Option<Item> {
        ["pk", keys[0], keys[1]]
            .iter()
            .map(|k| Some(((*k).to_owned(), item.get(*k)?.clone())))
            .collect()
    };
    let cost = |entry: &Option<Item>| entry.as_ref().map_or(0, |e| units(size(e)));
    let (was, is) = (old.and_then(entry), entry(new));
    if was == is { 0 } else { cost(&was) + cost(&is) }
}
