//! Conversions between stored records and wire messages: maps, time
//! stamps and pages.

use std::collections::{BTreeMap, HashMap};

use csi_driver::CsiResult;
use csi_driver::helpers::paging::{Page, paginate};

pub use csi_driver::helpers::confirm::confirmed;

/// Nanoseconds since the epoch (0 if the clock is before it).
pub fn now_nanos() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// A protobuf timestamp from [`now_nanos`]-style nanoseconds.
pub fn timestamp(nanos: i128) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (nanos / 1_000_000_000) as i64,
        nanos: (nanos % 1_000_000_000) as i32,
    }
}

/// A wire map from a stored (sorted) one.
pub fn to_map(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A stored (sorted, so records are stable) map from a wire one.
pub fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// One page of `all` (csi-driver's paging rules), each entry mapped by `entry`.
pub fn page<T, E>(
    all: Vec<&T>,
    max_entries: i32,
    starting_token: &str,
    entry: impl Fn(&T) -> E,
) -> CsiResult<(Vec<E>, String)> {
    paginate(all, max_entries, starting_token).map(
        |Page {
             entries,
             next_token,
         }| (entries.into_iter().map(entry).collect(), next_token),
    )
}
