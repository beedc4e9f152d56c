//! [`CachedTable`]: a table loaded into memory and written through.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, RwLock};

use crate::codec::{Codec, Json};
use crate::error::StoreError;
use crate::store::Quarantined;
use crate::table::Table;

const STRIPES: usize = 64;

/// A [`Table`] loaded into memory at startup and written through: each
/// change is made durable first and shown in memory after, so readers never
/// see what a crash could take back. Changes to one key are serialised
/// (striped locks); changes to different keys run concurrently, which lets
/// their directory syncs be shared. Cheap to clone.
///
/// ```
/// use csi_store::{CachedTable, FakeStore, StoreError, Table};
///
/// let store = FakeStore::new();
/// let (sizes, quarantined) =
///     CachedTable::load(Table::<u64>::new(&store, "sizes").unwrap()).unwrap();
/// assert!(quarantined.is_empty());
/// sizes.put("vol-1", 10).unwrap();
/// sizes
///     .update("vol-1", |v| {
///         *v.as_mut().unwrap() += 5;
///         Ok::<_, StoreError>(())
///     })
///     .unwrap();
/// assert_eq!(sizes.get("vol-1"), Some(15));
/// assert_eq!(sizes.read(|all| all.values().sum::<u64>()), 15);
/// ```
pub struct CachedTable<T, C = Json> {
    inner: Arc<Inner<T, C>>,
}

struct Inner<T, C> {
    table: Table<T, C>,
    map: RwLock<BTreeMap<String, T>>,
    stripes: Vec<Mutex<()>>,
    hasher: std::collections::hash_map::RandomState,
}

impl<T, C> Clone for CachedTable<T, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T, C> fmt::Debug for CachedTable<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedTable")
            .field("table", &self.inner.table.name())
            .finish_non_exhaustive()
    }
}

impl<T: Clone, C: Codec<T>> CachedTable<T, C> {
    /// Loads every record of `table`; returns the records that could not be
    /// read (quarantined, for the driver to log and keep the data of).
    pub fn load(table: Table<T, C>) -> Result<(Self, Vec<Quarantined>), StoreError> {
        let scan = table.scan()?;
        let cached = Self {
            inner: Arc::new(Inner {
                table,
                map: RwLock::new(scan.records.into_iter().collect()),
                stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
                hasher: Default::default(),
            }),
        };
        Ok((cached, scan.quarantined))
    }

    /// The table underneath.
    pub fn table(&self) -> &Table<T, C> {
        &self.inner.table
    }

    /// A copy of the value under `key`.
    pub fn get(&self, key: &str) -> Option<T> {
        self.map().get(key).cloned()
    }

    /// Whether `key` has a value.
    pub fn contains_key(&self, key: &str) -> bool {
        self.map().contains_key(key)
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether there are no records.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// Runs `f` over all records (under a read lock: keep it short, and do
    /// not call this table's methods from inside it).
    pub fn read<R>(&self, f: impl FnOnce(&BTreeMap<String, T>) -> R) -> R {
        f(&self.map())
    }

    /// Writes `value` under `key`; memory changes only once it is durable.
    pub fn put(&self, key: &str, value: T) -> Result<(), StoreError> {
        let _key = self.stripe(key);
        self.inner.table.put(key, &value)?;
        self.map_mut().insert(key.to_owned(), value);
        Ok(())
    }

    /// Removes `key`; `Ok(false)` if it was not there. Works on a full disk.
    pub fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let _key = self.stripe(key);
        let on_disk = self.inner.table.delete(key)?;
        let in_memory = self.map_mut().remove(key).is_some();
        Ok(on_disk || in_memory)
    }

    /// Read-modify-write of one key: `f` gets a copy of the current value
    /// (`None` if absent) and may change, set or clear it. If the result
    /// differs it is written (or deleted) durably, then shown in memory.
    /// An error from `f` or from the store leaves everything as it was.
    /// `f` runs under the key's lock: it must not call this table.
    pub fn update<R, E: From<StoreError>>(
        &self,
        key: &str,
        f: impl FnOnce(&mut Option<T>) -> Result<R, E>,
    ) -> Result<R, E>
    where
        T: PartialEq,
    {
        let _key = self.stripe(key);
        let current = self.get(key);
        let mut next = current.clone();
        let out = f(&mut next)?;
        if next != current {
            match next {
                Some(value) => {
                    self.inner.table.put(key, &value)?;
                    self.map_mut().insert(key.to_owned(), value);
                }
                None => {
                    self.inner.table.delete(key)?;
                    self.map_mut().remove(key);
                }
            }
        }
        Ok(out)
    }

    fn stripe(&self, key: &str) -> std::sync::MutexGuard<'_, ()> {
        let i = (self.inner.hasher.hash_one(key) as usize) % STRIPES;
        self.inner.stripes[i]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, T>> {
        self.inner.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn map_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, T>> {
        self.inner.map.write().unwrap_or_else(|e| e.into_inner())
    }
}
