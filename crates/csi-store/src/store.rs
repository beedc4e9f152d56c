//! The seam: what a store of records does, in bytes.

use std::fmt;
use std::path::PathBuf;

use crate::codec::CodecId;
use crate::error::StoreError;
use crate::key::{check_key, check_table, shorten};

/// The largest encoded value a record may hold (16 MiB).
pub const MAX_RECORD_LEN: usize = 16 << 20;

/// A record as stored: the codec tag and the encoded value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    /// The codec that wrote `bytes`.
    pub codec: CodecId,
    /// The encoded value.
    pub bytes: Vec<u8>,
}

/// A record that could not be read and was set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantined {
    /// Its table.
    pub table: String,
    /// Its key, when the file name says it.
    pub key: Option<String>,
    /// Why it was set aside (no contents).
    pub reason: String,
    /// Where the file went; `None` if it could not be moved (it is then
    /// reported again by the next scan) or the store keeps no files.
    pub moved_to: Option<PathBuf>,
}

/// Every readable record of a table, by key, and what was set aside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawScan {
    /// Records in key order.
    pub records: Vec<(String, RawRecord)>,
    /// Records found unreadable during this scan.
    pub quarantined: Vec<Quarantined>,
}

/// A durable map from (table, key) to a record.
///
/// Implementations: [`crate::FileStore`] (one crash-safe file per record)
/// and `FakeStore` (feature `testing`: a fake for drivers' unit tests). Both are
/// `Send + Sync` and cheap to clone; the calls block, so async code runs
/// them in `spawn_blocking`. Usually reached through [`crate::Table`].
///
/// Contract, which both implementations follow:
/// - `put` and `delete` return once the change is durable; an error means
///   the change did not happen, except an I/O error after the write reached
///   its final name (a failed journal flush or directory sync), whose outcome is
///   unknown.
/// - [`StoreError::NoSpace`] from `put` leaves nothing behind, and `delete`
///   works on a full filesystem.
/// - A record that cannot be read is moved aside and reported, never
///   returned and never fatal to `scan`.
pub trait RecordStore: Send + Sync + fmt::Debug {
    /// Writes (creates or replaces) a record.
    fn put(&self, table: &str, key: &str, codec: CodecId, bytes: &[u8]) -> Result<(), StoreError>;

    /// Reads a record. An unreadable one is quarantined and returned as
    /// [`StoreError::Corrupt`]; the next `get` finds nothing.
    fn get(&self, table: &str, key: &str) -> Result<Option<RawRecord>, StoreError>;

    /// Removes a record; `Ok(false)` when there was none (also durable).
    fn delete(&self, table: &str, key: &str) -> Result<bool, StoreError>;

    /// Every readable record of `table` (empty if it never had one), for
    /// loading state at startup and finding orphans. Unreadable records are
    /// quarantined and listed in [`RawScan::quarantined`].
    fn scan(&self, table: &str) -> Result<RawScan, StoreError>;

    /// Sets the record at `key` aside, if it still is `seen` (a codec could
    /// not decode it). `Ok(None)` when it changed or went away meanwhile.
    fn quarantine(
        &self,
        table: &str,
        key: &str,
        seen: &RawRecord,
        reason: &str,
    ) -> Result<Option<Quarantined>, StoreError>;

    /// Keys of every record of `table` that was ever quarantined and is
    /// still in quarantine, so startup cleanup keeps their data.
    fn quarantined_keys(&self, table: &str) -> Result<Vec<String>, StoreError>;
}

/// The checks every implementation makes before it touches one record:
/// table name and key, so both give the same errors.
pub(crate) fn check_at(table: &str, key: &str) -> Result<(), StoreError> {
    check_table(table)?;
    check_key(key)
}

/// The checks every implementation makes before a put: [`check_at`] and
/// size.
pub(crate) fn check_put(table: &str, key: &str, len: usize) -> Result<(), StoreError> {
    check_at(table, key)?;
    if len > MAX_RECORD_LEN {
        return Err(StoreError::TooLarge {
            table: table.to_owned(),
            key: shorten(key),
            len,
            max: MAX_RECORD_LEN,
        });
    }
    Ok(())
}
