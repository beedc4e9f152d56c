//! The bookkeeping under the engine, usable alone:
//!
//! - [`open_state`]: the state directory's store, locked for the process's
//!   life (a second instance gets a message naming the holder's pid);
//! - [`Records`]: one table of records by id, in memory and written through
//!   (one file per record, so a change costs the same with 10 or 10,000
//!   records), with an index by name for the repeat checks;
//! - [`InFlight`] and [`Claim`]: the resources work is running on. A claim
//!   is moved into the blocking task doing the work, so it outlives a
//!   cancelled call: a retry meanwhile, or a delete of a clone's source,
//!   gets ABORTED instead of running a second copy or removing what is read;
//! - [`Ledger`]: capacity checked and reserved in one step.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use csi_driver::{CsiError, CsiResult};
use csi_store::{
    CachedTable, FileStore, FileSystem, Quarantined, RealFs, RecordStore, StoreError, Table,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Opens the store in a driver's state directory and takes its lock for
/// the life of the process. `before` runs once it is known that no other
/// instance holds the directory, before anything is written to it (a
/// filesystem left frozen by a crash is thawed there: taking the lock
/// writes the pid, which would block on a frozen filesystem).
pub fn open_state(dir: &Path, before: impl FnOnce()) -> Result<FileStore, String> {
    open_state_on(Arc::new(RealFs), dir, before)
}

/// [`open_state`] with the store's file operations made through `fs` (the
/// real ones counted by crash-points, in a driver's test builds).
pub fn open_state_on(
    fs: Arc<dyn FileSystem>,
    dir: &Path,
    before: impl FnOnce(),
) -> Result<FileStore, String> {
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    probe_lock(dir).map_err(|e| e.to_string())?;
    before();
    FileStore::open_on(fs, dir).map_err(|e| e.to_string())
}

/// Whether another process holds `dir`'s lock, found without writing.
fn probe_lock(dir: &Path) -> Result<(), StoreError> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    let path = dir.join(csi_store::LOCK_FILE);
    let Ok(mut file) = fs::File::open(&path) else {
        return Ok(()); // never locked: FileStore::open decides
    };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(()); // released when `file` closes
    }
    if std::io::Error::last_os_error().raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Ok(());
    }
    let mut text = String::new();
    let pid = file
        .read_to_string(&mut text)
        .ok()
        .and_then(|_| text.trim().parse().ok());
    Err(StoreError::Locked {
        dir: dir.to_owned(),
        pid,
    })
}

/// Logs records that could not be read: they were moved aside, and the
/// data of their ids is kept by the startup sweep.
pub fn report_quarantined(quarantined: &[Quarantined]) {
    for q in quarantined {
        tracing::error!(
            table = %q.table,
            key = ?q.key,
            reason = %q.reason,
            moved_to = ?q.moved_to,
            "unreadable record set aside; its data is kept"
        );
    }
}

/// Loads a cached table of `store`, logging what had to be set aside.
pub fn load_table<T>(store: &Arc<dyn RecordStore>, name: &str) -> Result<CachedTable<T>, StoreError>
where
    T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    let (table, quarantined) = CachedTable::load(Table::with_shared(store.clone(), name)?)?;
    report_quarantined(&quarantined);
    Ok(table)
}

/// One table of records by id, loaded at startup and written through, with
/// an index by name (records whose `name_of` is `None` are not indexed).
pub struct Records<T> {
    table: CachedTable<T>,
    names: RwLock<HashMap<String, String>>,
    name_of: fn(&T) -> Option<&str>,
}

impl<T> Records<T>
where
    T: Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Loads table `name` of `store` (records set aside are logged).
    pub fn load(
        store: &Arc<dyn RecordStore>,
        name: &str,
        name_of: fn(&T) -> Option<&str>,
    ) -> Result<Self, StoreError> {
        let table = load_table(store, name)?;
        let names = table.read(|all| {
            all.iter()
                .filter_map(|(id, v)| name_of(v).map(|n| (n.to_owned(), id.clone())))
                .collect()
        });
        Ok(Self {
            table,
            names: RwLock::new(names),
            name_of,
        })
    }

    /// A copy of the record `id`.
    pub fn get(&self, id: &str) -> Option<T> {
        self.table.get(id)
    }

    /// Whether `id` has a record.
    pub fn contains(&self, id: &str) -> bool {
        self.table.contains_key(id)
    }

    /// The record created under `name`.
    pub fn by_name(&self, name: &str) -> Option<T> {
        let id = self.names().get(name).cloned()?;
        self.table.get(&id)
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Runs `f` over every record (a read lock: keep it short).
    pub fn read<R>(&self, f: impl FnOnce(&BTreeMap<String, T>) -> R) -> R {
        self.table.read(f)
    }

    /// Writes the record `id`, durably, then shows it.
    pub fn put(&self, id: &str, value: T) -> Result<(), StoreError> {
        let name = (self.name_of)(&value).map(str::to_owned);
        self.table.put(id, value)?;
        if let Some(name) = name {
            self.names_mut().insert(name, id.to_owned());
        }
        Ok(())
    }

    /// Read-modify-write of one record (see [`CachedTable::update`]): `f`
    /// runs under the record's lock and may read other tables, not this one.
    pub fn update<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut Option<T>) -> CsiResult<R>,
    ) -> CsiResult<R> {
        let name_of = self.name_of;
        let mut names = (None, None);
        let out = self.table.update(id, |slot| {
            let before = slot.as_ref().and_then(name_of).map(str::to_owned);
            let out = f(slot)?;
            names = (before, slot.as_ref().and_then(name_of).map(str::to_owned));
            Ok::<_, CsiError>(out)
        })?;
        if names.0 != names.1 {
            let mut index = self.names_mut();
            if let Some(old) = names.0 {
                index.remove(&old);
            }
            if let Some(new) = names.1 {
                index.insert(new, id.to_owned());
            }
        }
        Ok(out)
    }

    /// Removes the record `id` (a delete works on a full disk); returns it.
    pub fn remove(&self, id: &str) -> CsiResult<Option<T>> {
        self.update(id, |slot| Ok(slot.take()))
    }

    fn names(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, String>> {
        self.names.read().unwrap_or_else(|e| e.into_inner())
    }

    fn names_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, String>> {
        self.names.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a claim covers: the kind of resource the server's lock keys name
/// (a claim never covers a path).
pub use csi_proto::methods::KeyKind as Res;

type Held = HashMap<(Res, String), &'static str>;

/// The resources work is running on, and which operation runs on each.
#[derive(Debug, Default)]
pub struct InFlight {
    held: Mutex<Held>,
}

/// Resources claimed for one operation; released when dropped. Moved into
/// the blocking task that does the work, so it is released when the work
/// ends, not when the call that started it is cancelled.
#[derive(Debug)]
pub struct Claim {
    map: Arc<InFlight>,
    op: &'static str,
    keys: Vec<(Res, String)>,
}

impl InFlight {
    /// An empty set.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Claims every one of `keys` for `op`, or none: ABORTED naming the
    /// busy resource and the operation running on it.
    pub fn claim(self: &Arc<Self>, op: &'static str, keys: &[(Res, &str)]) -> CsiResult<Claim> {
        let mut claim = Claim {
            map: self.clone(),
            op,
            keys: Vec::new(),
        };
        claim.also(keys)?;
        Ok(claim)
    }

    /// The operation running on `id`, if any.
    pub fn running(&self, res: Res, id: &str) -> Option<&'static str> {
        self.lock().get(&(res, id.to_owned())).copied()
    }

    /// How many resources are claimed.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is claimed.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Claim {
    /// Adds `keys` to this claim, all or none.
    pub fn also(&mut self, keys: &[(Res, &str)]) -> CsiResult<()> {
        let mut held = self.map.lock();
        let fresh: Vec<(Res, String)> = keys
            .iter()
            .map(|(r, id)| (*r, (*id).to_owned()))
            .filter(|k| !self.keys.contains(k))
            .collect();
        if let Some((key, op)) = fresh.iter().find_map(|k| held.get(k).map(|op| (k, *op))) {
            return Err(CsiError::Aborted(format!(
                "{} {:?} is busy: {op} is in progress on it",
                key.0.describe(),
                key.1
            )));
        }
        for key in fresh {
            held.insert(key.clone(), self.op);
            self.keys.push(key);
        }
        Ok(())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = self.map.lock();
        for key in &self.keys {
            held.remove(key);
        }
    }
}

/// Bytes promised to volumes (and to creates in progress), checked against
/// a limit and reserved in one step, so concurrent creates cannot all see
/// the same free capacity.
#[derive(Debug, Default)]
pub struct Ledger {
    used: Mutex<i64>,
}

/// Bytes reserved by [`Ledger::reserve`]; given back when dropped unless
/// [`Reservation::keep`] made them part of a volume.
#[derive(Debug)]
pub struct Reservation {
    ledger: Arc<Ledger>,
    bytes: i64,
}

impl Ledger {
    /// A ledger with `used` bytes already promised.
    pub fn new(used: i64) -> Arc<Self> {
        Arc::new(Self {
            used: Mutex::new(used),
        })
    }

    /// Reserves `bytes` if that keeps the total within `limit` (0 = no
    /// limit); otherwise `None`.
    pub fn reserve(self: &Arc<Self>, bytes: i64, limit: i64) -> Option<Reservation> {
        let mut used = self.lock();
        if limit > 0 && *used + bytes > limit {
            return None;
        }
        *used += bytes;
        Some(Reservation {
            ledger: self.clone(),
            bytes,
        })
    }

    /// Gives back the bytes of a removed volume.
    pub fn release(&self, bytes: i64) {
        *self.lock() -= bytes;
    }

    /// Bytes promised now.
    pub fn used(&self) -> i64 {
        *self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, i64> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Reservation {
    /// The bytes now belong to a volume (given back by [`Ledger::release`]).
    pub fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes != 0 {
            self.ledger.release(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_all_or_nothing_and_released_on_drop() {
        let map = InFlight::new();
        let a = map
            .claim(
                "CreateSnapshot",
                &[(Res::Volume, "v1"), (Res::SnapshotName, "s")],
            )
            .unwrap();
        let err = map
            .claim("DeleteVolume", &[(Res::Volume, "v2"), (Res::Volume, "v1")])
            .unwrap_err();
        assert_eq!(
            err,
            CsiError::Aborted("volume \"v1\" is busy: CreateSnapshot is in progress on it".into())
        );
        assert_eq!(
            map.running(Res::Volume, "v2"),
            None,
            "none of a refused claim"
        );
        let mut b = map
            .claim("CreateVolume", &[(Res::VolumeName, "v1")])
            .unwrap();
        b.also(&[(Res::Volume, "v3"), (Res::VolumeName, "v1")])
            .unwrap();
        assert!(b.also(&[(Res::Volume, "v1")]).is_err());
        assert_eq!(map.len(), 4);
        drop(a);
        drop(b);
        assert!(map.is_empty());
    }

    #[test]
    fn the_ledger_reserves_atomically_and_gives_back_unkept_reservations() {
        let ledger = Ledger::new(30);
        let r = ledger.reserve(60, 100).unwrap();
        assert!(ledger.reserve(20, 100).is_none(), "30 + 60 + 20 > 100");
        drop(r);
        assert_eq!(ledger.used(), 30);
        ledger.reserve(70, 100).unwrap().keep();
        assert_eq!(ledger.used(), 100);
        ledger.release(70);
        assert!(ledger.reserve(1 << 40, 0).is_some(), "0 = no limit");
    }

    #[test]
    fn records_keep_their_name_index_through_updates_and_removal() {
        #[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
        struct Rec {
            name: String,
        }
        let store: Arc<dyn RecordStore> = Arc::new(csi_store::FakeStore::new());
        let recs = Records::<Rec>::load(&store, "recs", |r| Some(&r.name)).unwrap();
        recs.put("id-1", Rec { name: "a".into() }).unwrap();
        assert_eq!(recs.by_name("a").unwrap().name, "a");
        recs.update("id-1", |r| {
            r.as_mut().unwrap().name = "b".into();
            Ok(())
        })
        .unwrap();
        assert!(recs.by_name("a").is_none());
        let err = recs.update("id-1", |r| {
            *r = None;
            Err::<(), _>(CsiError::FailedPrecondition("refused".into()))
        });
        assert!(err.is_err());
        assert!(
            recs.by_name("b").is_some(),
            "a refused change changes nothing"
        );
        drop(recs);
        let again = Records::<Rec>::load(&store, "recs", |r| Some(&r.name)).unwrap();
        assert!(again.by_name("b").is_some(), "the index is rebuilt at load");
        assert_eq!(again.remove("id-1").unwrap().unwrap().name, "b");
        assert!(again.by_name("b").is_none() && again.is_empty());
    }

    #[test]
    fn a_second_opener_is_told_who_holds_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let _first = open_state(dir.path(), || {}).unwrap();
        let mut ran = false;
        let err = open_state(dir.path(), || ran = true).unwrap_err();
        assert!(!ran, "nothing runs for a second instance");
        assert!(
            err.contains("is in use by another process")
                && err.contains(&std::process::id().to_string()),
            "{err}"
        );
    }
}
