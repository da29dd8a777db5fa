//! Time as every store keeps it.

use chrono::{DateTime, Utc};

/// A point in time, UTC, with millisecond precision (what every store keeps).
pub type Timestamp = DateTime<Utc>;
