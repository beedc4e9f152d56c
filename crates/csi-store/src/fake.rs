//! [`FakeStore`]: the in-memory fake for drivers' unit tests.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::codec::CodecId;
use crate::error::StoreError;
use crate::key::{check_table, shorten};
use crate::store::{Quarantined, RawRecord, RawScan, RecordStore, check_at, check_put};

/// Records in memory, with the same rules and errors as
/// [`crate::FileStore`] (key and table checks, size limit, quarantine of
/// unreadable records) and injectable faults: a full disk
/// ([`FakeStore::set_full`]) and unreadable records
/// ([`FakeStore::insert_unreadable`], [`FakeStore::insert_raw`]).
///
/// ```
/// use csi_store::{FakeStore, Table};
///
/// let store = FakeStore::new();
/// let volumes: Table<u64> = Table::new(&store, "volumes").unwrap();
/// volumes.put("vol-1", &42).unwrap();
///
/// store.set_full(true);
/// assert!(volumes.put("vol-2", &7).unwrap_err().is_no_space());
/// assert!(volumes.delete("vol-1").unwrap(), "deletes work on a full disk");
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeStore {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    tables: BTreeMap<String, BTreeMap<String, Slot>>,
    quarantine: BTreeMap<String, Vec<String>>,
    full: bool,
    puts: u64,
    deletes: u64,
}

#[derive(Debug, Clone)]
enum Slot {
    Good(RawRecord),
    Unreadable(&'static str),
}

impl FakeStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// While `full`, puts fail with [`StoreError::NoSpace`] and store
    /// nothing; deletes still work.
    pub fn set_full(&self, full: bool) {
        self.lock().full = full;
    }

    /// Stores a record whose file would be unreadable (a torn or garbage
    /// file): the next `get` or `scan` quarantines it with `reason`.
    pub fn insert_unreadable(&self, table: &str, key: &str, reason: &'static str) {
        self.lock()
            .tables
            .entry(table.to_owned())
            .or_default()
            .insert(key.to_owned(), Slot::Unreadable(reason));
    }

    /// Stores raw bytes under any codec tag, e.g. to test what a table does
    /// with a record written by another codec or with bytes it cannot decode.
    pub fn insert_raw(&self, table: &str, key: &str, record: RawRecord) {
        self.lock()
            .tables
            .entry(table.to_owned())
            .or_default()
            .insert(key.to_owned(), Slot::Good(record));
    }

    /// Puts that stored a record, and deletes, so far.
    pub fn counts(&self) -> (u64, u64) {
        let i = self.lock();
        (i.puts, i.deletes)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn set_aside(&mut self, table: &str, key: &str, reason: String) -> Quarantined {
        if let Some(t) = self.tables.get_mut(table) {
            t.remove(key);
        }
        self.quarantine
            .entry(table.to_owned())
            .or_default()
            .push(key.to_owned());
        Quarantined {
            table: table.to_owned(),
            key: Some(key.to_owned()),
            reason,
            moved_to: None,
        }
    }
}

impl RecordStore for FakeStore {
    fn put(&self, table: &str, key: &str, codec: CodecId, bytes: &[u8]) -> Result<(), StoreError> {
        check_put(table, key, bytes.len())?;
        let mut i = self.lock();
        if i.full {
            return Err(StoreError::NoSpace {
                dir: PathBuf::from("<memory>"),
                table: table.to_owned(),
                key: shorten(key),
            });
        }
        i.puts += 1;
        let record = RawRecord {
            codec,
            bytes: bytes.to_vec(),
        };
        i.tables
            .entry(table.to_owned())
            .or_default()
            .insert(key.to_owned(), Slot::Good(record));
        Ok(())
    }

    fn get(&self, table: &str, key: &str) -> Result<Option<RawRecord>, StoreError> {
        check_at(table, key)?;
        let mut i = self.lock();
        match i.tables.get(table).and_then(|t| t.get(key)).cloned() {
            None => Ok(None),
            Some(Slot::Good(r)) => Ok(Some(r)),
            Some(Slot::Unreadable(reason)) => {
                i.set_aside(table, key, reason.to_owned());
                Err(StoreError::Corrupt {
                    table: table.to_owned(),
                    key: shorten(key),
                    reason: reason.to_owned(),
                    moved_to: None,
                })
            }
        }
    }

    fn delete(&self, table: &str, key: &str) -> Result<bool, StoreError> {
        check_at(table, key)?;
        let mut i = self.lock();
        i.deletes += 1;
        Ok(i.tables
            .get_mut(table)
            .and_then(|t| t.remove(key))
            .is_some())
    }

    fn scan(&self, table: &str) -> Result<RawScan, StoreError> {
        check_table(table)?;
        let mut i = self.lock();
        let mut scan = RawScan::default();
        let slots: Vec<(String, Slot)> = i
            .tables
            .get(table)
            .map(|t| t.iter().map(|(k, s)| (k.clone(), s.clone())).collect())
            .unwrap_or_default();
        for (key, slot) in slots {
            match slot {
                Slot::Good(r) => scan.records.push((key, r)),
                Slot::Unreadable(reason) => {
                    let q = i.set_aside(table, &key, reason.to_owned());
                    scan.quarantined.push(q);
                }
            }
        }
        Ok(scan)
    }

    fn quarantine(
        &self,
        table: &str,
        key: &str,
        seen: &RawRecord,
        reason: &str,
    ) -> Result<Option<Quarantined>, StoreError> {
        check_at(table, key)?;
        let mut i = self.lock();
        let same = matches!(i.tables.get(table).and_then(|t| t.get(key)),
            Some(Slot::Good(r)) if r == seen);
        Ok(same.then(|| i.set_aside(table, key, reason.to_owned())))
    }

    fn quarantined_keys(&self, table: &str) -> Result<Vec<String>, StoreError> {
        check_table(table)?;
        let mut keys = self
            .lock()
            .quarantine
            .get(table)
            .cloned()
            .unwrap_or_default();
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}
