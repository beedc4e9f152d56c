//! [`Table`]: typed records over any [`RecordStore`].

use std::fmt;
use std::sync::Arc;

use crate::codec::{Codec, Json, Marker};
use crate::error::StoreError;
use crate::key::{check_key, check_table, shorten};
use crate::store::{Quarantined, RawRecord, RecordStore};

/// Records of type `T`, encoded by `C` ([`Json`] by default, or
/// [`crate::Prost`] for CSI messages), in one table of a store. Cheap to
/// clone; clones share the store.
pub struct Table<T, C = Json> {
    store: Arc<dyn RecordStore>,
    name: Arc<str>,
    _codec: Marker<T, C>,
}

impl<T, C> Clone for Table<T, C> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            name: self.name.clone(),
            _codec: Default::default(),
        }
    }
}

impl<T, C> fmt::Debug for Table<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("name", &self.name)
            .field("store", &self.store)
            .finish()
    }
}

/// Every readable record of a table, and the ones set aside.
#[derive(Debug, Clone)]
pub struct Scan<T> {
    /// Records in key order.
    pub records: Vec<(String, T)>,
    /// Records that could not be read or decoded, moved to quarantine
    /// during this scan.
    pub quarantined: Vec<Quarantined>,
}

impl<T, C> Table<T, C> {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<dyn RecordStore> {
        &self.store
    }
}

impl<T, C: Codec<T>> Table<T, C> {
    /// The table `name` (1–64 of `[a-z0-9_-]`) of `store`.
    pub fn new<S: RecordStore + Clone + 'static>(
        store: &S,
        name: &str,
    ) -> Result<Self, StoreError> {
        Self::with_shared(Arc::new(store.clone()), name)
    }

    /// The table `name` of a shared store.
    pub fn with_shared(store: Arc<dyn RecordStore>, name: &str) -> Result<Self, StoreError> {
        check_table(name)?;
        Ok(Self {
            store,
            name: name.into(),
            _codec: Default::default(),
        })
    }

    /// Writes `value` under `key`, durably, before returning.
    pub fn put(&self, key: &str, value: &T) -> Result<(), StoreError> {
        check_key(key)?;
        let bytes = C::encode(value).map_err(|reason| StoreError::Encode {
            table: self.name.to_string(),
            key: shorten(key),
            reason,
        })?;
        self.store.put(&self.name, key, C::ID, &bytes)
    }

    /// The value under `key`. A record that cannot be decoded is
    /// quarantined and returned as [`StoreError::Corrupt`].
    pub fn get(&self, key: &str) -> Result<Option<T>, StoreError> {
        let Some(raw) = self.store.get(&self.name, key)? else {
            return Ok(None);
        };
        self.decode(key, raw)
            .map(Some)
            .map_err(|(reason, q)| StoreError::Corrupt {
                table: self.name.to_string(),
                key: shorten(key),
                reason,
                moved_to: q.and_then(|q| q.moved_to),
            })
    }

    /// Removes `key`; `Ok(false)` if it was not there. Works on a full disk.
    pub fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.store.delete(&self.name, key)
    }

    /// Every record of the table, decoded, in key order. Records that
    /// cannot be read or decoded are quarantined and listed, never fatal.
    pub fn scan(&self) -> Result<Scan<T>, StoreError> {
        let raw = self.store.scan(&self.name)?;
        let mut scan = Scan {
            records: Vec::with_capacity(raw.records.len()),
            quarantined: raw.quarantined,
        };
        for (key, record) in raw.records {
            match self.decode(&key, record) {
                Ok(value) => scan.records.push((key, value)),
                Err((_, Some(q))) => scan.quarantined.push(q),
                // Rewritten during the scan: read it again.
                Err((_, None)) => {
                    if let Ok(Some(value)) = self.get(&key) {
                        scan.records.push((key, value));
                    }
                }
            }
        }
        scan.records.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(scan)
    }

    /// Keys of this table's records in quarantine (this run's and earlier
    /// ones), so startup cleanup does not remove their data.
    pub fn quarantined_keys(&self) -> Result<Vec<String>, StoreError> {
        self.store.quarantined_keys(&self.name)
    }

    /// Decodes a record, quarantining it when that fails.
    fn decode(&self, key: &str, raw: RawRecord) -> Result<T, (String, Option<Quarantined>)> {
        let result = if raw.codec != C::ID {
            Err(format!(
                "written with codec {}, this table reads {}",
                raw.codec,
                C::ID
            ))
        } else {
            C::decode(&raw.bytes)
        };
        result.map_err(|reason| {
            let q = match self.store.quarantine(&self.name, key, &raw, &reason) {
                Ok(q) => q,
                Err(e) => {
                    tracing::warn!(table = %self.name, key, error = %e, "could not quarantine an undecodable record");
                    Some(Quarantined {
                        table: self.name.to_string(),
                        key: Some(key.to_owned()),
                        reason: reason.clone(),
                        moved_to: None,
                    })
                }
            };
            (reason, q)
        })
    }
}
