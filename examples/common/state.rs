//! The drivers' durable state on csi-store and the guards around the work
//! that changes it, shared by hostpath and loop-block:
//!
//! - [`open_state`]: the state directory's store, locked for the process's
//!   life (a second instance gets a message naming the holder's pid);
//! - [`Records`]: one table of records by id, in memory and written through
//!   (one file per record, so a change costs the same with 10 or 10,000
//!   records), with an index by name for CreateVolume's repeat check;
//! - [`InFlight`] and [`Claim`]: the volumes, snapshots and names that
//!   work is running on. A claim is moved into the blocking task doing the
//!   work, so it outlives a cancelled call: a retry meanwhile, or a
//!   DeleteVolume of a clone's source, gets ABORTED instead of running a
//!   second copy or removing what is being read;
//! - [`Ledger`]: capacity checked and reserved in one step;
//! - [`data_by_id`]: what a data directory holds, for the startup sweep of
//!   data no record owns.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use csi_server::{CsiError, CsiResult};
use csi_store::{CachedTable, FileStore, Quarantined, StoreError, Table};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::IdKind;

/// Opens the store in the driver's state directory and takes its lock for
/// the life of the process. `before` runs once it is known that no other
/// instance holds the directory, before anything is written to it (a
/// filesystem left frozen by a crash is thawed there: taking the lock
/// writes the pid, which would block on a frozen filesystem).
pub fn open_state(dir: &Path, before: impl FnOnce()) -> Result<FileStore, String> {
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    probe_lock(dir).map_err(|e| e.to_string())?;
    before();
    FileStore::open(dir).map_err(|e| e.to_string())
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

/// The whole-file state of earlier versions (`state.json`), with a
/// driver's record types.
#[derive(serde::Deserialize)]
struct LegacyState<S> {
    /// Kept as JSON: the attachments inside them move to their own table.
    volumes: BTreeMap<String, serde_json::Value>,
    snapshots: BTreeMap<String, S>,
    #[serde(default = "BTreeMap::new")]
    group_snapshots: BTreeMap<String, super::GroupSnapshotRecord>,
    /// Node-side records of older versions: csi-node keeps its own now.
    #[serde(default)]
    staged: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    retired_ephemeral: Vec<String>,
}

/// The state file an earlier version kept in the state directory.
pub const LEGACY_STATE: &str = "state.json";

/// Moves the controller records of an earlier version's `state.json` into
/// the tables (`volumes`, `attachments`, `snapshots`, `group_snapshots`,
/// `retired_ephemeral` with its order) and renames the file
/// `state.json.imported`: without this an upgrade would find every
/// volume's data unrecorded and sweep it. Repeating an interrupted import
/// rewrites the same records.
pub fn import_state_file<V, S>(store: &FileStore) -> Result<(), String>
where
    V: Serialize + DeserializeOwned,
    S: Serialize + DeserializeOwned,
{
    let path = store.dir().join(LEGACY_STATE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let fail = |e: &dyn fmt::Display| format!("importing {}: {e}", path.display());
    let mut legacy: LegacyState<S> = serde_json::from_slice(&bytes).map_err(|e| fail(&e))?;
    if !legacy.staged.is_empty() {
        tracing::warn!(
            volumes = legacy.staged.len(),
            "the earlier version's staged volumes are not imported: restage them (csi-node keeps its own records)"
        );
    }
    // Earlier versions kept a volume's attachments inside its record, as
    // `published_nodes` (hostpath) or `attached` (loop-block).
    let mut attachments = BTreeMap::new();
    let mut volumes = BTreeMap::new();
    for (id, mut value) in std::mem::take(&mut legacy.volumes) {
        if let Some(fields) = value.as_object_mut() {
            for key in ["published_nodes", "attached"] {
                let nodes: Option<BTreeMap<String, bool>> = fields
                    .remove(key)
                    .and_then(|v| serde_json::from_value(v).ok());
                if let Some(nodes) = nodes.filter(|n| !n.is_empty()) {
                    attachments.insert(id.clone(), nodes);
                }
            }
        }
        let volume: V = serde_json::from_value(value).map_err(|e| fail(&e))?;
        volumes.insert(id, volume);
    }
    fn put_all<'a, T: Serialize + DeserializeOwned + 'a>(
        store: &FileStore,
        table: &str,
        items: impl IntoIterator<Item = (String, &'a T)>,
    ) -> Result<(), StoreError> {
        let table = Table::<T>::new(store, table)?;
        items
            .into_iter()
            .try_for_each(|(key, value)| table.put(&key, value))
    }
    (|| {
        put_all(
            store,
            "volumes",
            volumes.iter().map(|(k, v)| (k.clone(), v)),
        )?;
        let attached = attachments.iter().map(|(k, v)| (k.clone(), v));
        put_all(store, "attachments", attached)?;
        put_all(
            store,
            "snapshots",
            legacy.snapshots.iter().map(|(k, v)| (k.clone(), v)),
        )?;
        put_all(
            store,
            "group_snapshots",
            legacy.group_snapshots.iter().map(|(k, v)| (k.clone(), v)),
        )?;
        let order: Vec<i128> = (0..legacy.retired_ephemeral.len() as i128).collect();
        put_all(
            store,
            "retired_ephemeral",
            legacy.retired_ephemeral.iter().cloned().zip(order.iter()),
        )
    })()
    .map_err(|e| fail(&e))?;
    let done = store.dir().join(format!("{LEGACY_STATE}.imported"));
    fs::rename(&path, &done).map_err(|e| fail(&e))?;
    tracing::info!(
        volumes = volumes.len(),
        snapshots = legacy.snapshots.len(),
        file = %done.display(),
        "imported the state file of an earlier version"
    );
    Ok(())
}

/// A driver's controller tables: volumes, snapshots and group snapshots by
/// id (with name indexes) and attachments, and the ids whose records were
/// set aside as unreadable, whose data is never swept. (What the node
/// staged and published is csi-node's, in its own store.)
pub struct Tables<V, S> {
    pub volumes: Records<V>,
    pub snapshots: Records<S>,
    pub groups: Records<super::GroupSnapshotRecord>,
    /// Volume id → the nodes it is ControllerPublished to (with the
    /// read-only flag). Its own record, so that the last unpublish is a
    /// delete, which works on a full disk.
    pub attachments: CachedTable<BTreeMap<String, bool>>,
    /// Held while ControllerPublish counts a node's attachments against an
    /// attach limit and records one more.
    attach_gate: Mutex<()>,
    pub quarantined_volumes: std::collections::BTreeSet<String>,
    pub quarantined_snapshots: std::collections::BTreeSet<String>,
}

impl<V, S> Tables<V, S>
where
    V: Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static,
    S: Clone + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Loads every table of the locked store `files` (importing an earlier
    /// version's state file first) and logs the records set aside.
    /// `volume_name` and `snapshot_name` say which records CreateVolume and
    /// CreateSnapshot find by name.
    pub fn open(
        files: &FileStore,
        volume_name: fn(&V) -> Option<&str>,
        snapshot_name: fn(&S) -> Option<&str>,
    ) -> Result<Self, String> {
        import_state_file::<V, S>(files)?;
        let err = |e: StoreError| e.to_string();
        let (volumes, q1) = Records::load(files, "volumes", volume_name).map_err(err)?;
        let (snapshots, q2) = Records::load(files, "snapshots", snapshot_name).map_err(err)?;
        let (groups, q3) = Records::load(
            files,
            "group_snapshots",
            |g: &super::GroupSnapshotRecord| Some(g.name.as_str()),
        )
        .map_err(err)?;
        let (attachments, q4) =
            CachedTable::load(Table::new(files, "attachments").map_err(err)?).map_err(err)?;
        for q in [&q1, &q2, &q3, &q4] {
            report_quarantined(q);
        }
        let keys = |t: &str| -> Result<std::collections::BTreeSet<String>, String> {
            let keys = csi_store::RecordStore::quarantined_keys(files, t).map_err(err)?;
            Ok(keys.into_iter().collect())
        };
        let tables = Self {
            quarantined_volumes: keys("volumes")?,
            quarantined_snapshots: keys("snapshots")?,
            volumes,
            snapshots,
            groups,
            attachments,
            attach_gate: Mutex::new(()),
        };
        // An attachment saved as its volume's DeleteVolume ran (the CO's
        // calls for one volume are serialised, so only after a crash).
        let stale: Vec<String> = tables.attachments.read(|all| {
            all.keys()
                .filter(|id| {
                    !tables.volumes.contains(id) && !tables.quarantined_volumes.contains(*id)
                })
                .cloned()
                .collect()
        });
        for id in stale {
            tracing::warn!(volume = %id, "attachment of a volume that does not exist; removing it");
            tables.attachments.delete(&id).map_err(err)?;
        }
        Ok(tables)
    }

    /// ControllerPublish's bookkeeping: records that `volume_id` (which
    /// must exist: NOT_FOUND otherwise) is attached to `node`, under the
    /// repeat and single-node rules of [`super::record_attachment`] and an
    /// attach limit (0 = none, RESOURCE_EXHAUSTED when reached).
    pub fn attach(
        &self,
        volume_id: &str,
        node: &str,
        readonly: bool,
        multi_node: bool,
        limit: i64,
    ) -> CsiResult<()> {
        // Counting reads every attachment: only with a limit, and then
        // under the gate so two publishes cannot both take the last slot.
        let _gate = (limit > 0).then(|| self.attach_gate.lock().unwrap_or_else(|e| e.into_inner()));
        let attached_here = if limit > 0 {
            self.attachments.read(|all| {
                all.values()
                    .filter(|nodes| nodes.contains_key(node))
                    .count()
            })
        } else {
            0
        };
        // Under the volume's lock, which DeleteVolume's check also takes.
        self.volumes.update(volume_id, |volume| {
            if volume.is_none() {
                return Err(CsiError::NotFound(format!(
                    "volume {volume_id} does not exist"
                )));
            }
            self.attachments.update(volume_id, |slot| {
                let mut nodes = slot.take().unwrap_or_default();
                let new_here = !nodes.contains_key(node);
                super::check_attach_limit(node, attached_here, new_here, limit)?;
                super::record_attachment(volume_id, &mut nodes, node, readonly, multi_node)?;
                *slot = Some(nodes);
                Ok::<_, CsiError>(())
            })
        })
    }

    /// ControllerUnpublish's bookkeeping: an empty node id detaches from
    /// every node; a volume or node that is not attached is fine. The last
    /// node's removal deletes the record, which works on a full disk.
    pub fn detach(&self, req: &csi_proto::v1::ControllerUnpublishVolumeRequest) -> CsiResult<()> {
        self.attachments.update(&req.volume_id, |slot| {
            if let Some(nodes) = slot {
                super::forget_attachment(nodes, req);
                if nodes.is_empty() {
                    *slot = None;
                }
            }
            Ok::<_, CsiError>(())
        })
    }

    /// The nodes `volume_id` is attached to.
    pub fn attached_nodes(&self, volume_id: &str) -> Vec<String> {
        self.attachments
            .get(volume_id)
            .map(|nodes| nodes.into_keys().collect())
            .unwrap_or_default()
    }
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
    /// Loads `table`; returns the records that had to be set aside.
    pub fn load(
        store: &FileStore,
        table: &str,
        name_of: fn(&T) -> Option<&str>,
    ) -> Result<(Self, Vec<Quarantined>), StoreError> {
        let (table, quarantined) = CachedTable::load(Table::new(store, table)?)?;
        let names = table.read(|all| {
            all.iter()
                .filter_map(|(id, v)| name_of(v).map(|n| (n.to_owned(), id.clone())))
                .collect()
        });
        let records = Self {
            table,
            names: RwLock::new(names),
            name_of,
        };
        Ok((records, quarantined))
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

/// What a claim covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Res {
    Volume,
    VolumeName,
    Snapshot,
    SnapshotName,
    GroupSnapshot,
    GroupSnapshotName,
}

impl fmt::Display for Res {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Res::Volume => "volume",
            Res::VolumeName => "volume name",
            Res::Snapshot => "snapshot",
            Res::SnapshotName => "snapshot name",
            Res::GroupSnapshot => "group snapshot",
            Res::GroupSnapshotName => "group snapshot name",
        })
    }
}

/// The resources work is running on, and which operation runs on each.
#[derive(Debug, Default)]
pub struct InFlight {
    held: Mutex<HashMap<(Res, String), &'static str>>,
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

    fn lock(&self) -> MutexGuard<'_, HashMap<(Res, String), &'static str>> {
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
                key.0, key.1
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

/// Data by id: (id, path) pairs.
pub type DataById = Vec<(String, PathBuf)>;

/// What a driver's data directories hold: (volume data, snapshot data,
/// entries that are not this driver's).
pub type DataOnDisk = (DataById, DataById, Vec<PathBuf>);

/// What a driver's data directory holds: entries named `<id><suffix>` for
/// an id of `kind` (with the id), and every other entry.
pub fn data_by_id(dir: &Path, kind: IdKind, suffixes: &[&str]) -> (DataById, Vec<PathBuf>) {
    let (mut ours, mut other) = (Vec::new(), Vec::new());
    let Ok(entries) = fs::read_dir(dir) else {
        return (ours, other);
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let id = name.to_str().and_then(|n| {
            suffixes
                .iter()
                .filter_map(|s| n.strip_suffix(s))
                .find(|id| kind.is_valid(id))
        });
        match id {
            Some(id) => ours.push((id.to_owned(), entry.path())),
            None => other.push(entry.path()),
        }
    }
    ours.sort();
    other.sort();
    (ours, other)
}

/// Removes a file or a whole directory (symlinks are removed, never
/// followed); an absent one is fine.
pub fn remove_path(path: &Path) -> std::io::Result<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
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
        assert_eq!(map.running(Res::Volume, "v1"), Some("CreateSnapshot"));
        // The same id as another kind of resource is another resource.
        let mut b = map
            .claim("CreateVolume", &[(Res::VolumeName, "v1")])
            .unwrap();
        b.also(&[(Res::Volume, "v3"), (Res::VolumeName, "v1")])
            .unwrap();
        assert!(b.also(&[(Res::Volume, "v1")]).is_err());
        assert_eq!(map.len(), 4);
        drop(a);
        drop(b);
        assert_eq!(map.len(), 0);
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
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        let (recs, q) = Records::<Rec>::load(&store, "recs", |r| Some(&r.name)).unwrap();
        assert!(q.is_empty());
        recs.put("id-1", Rec { name: "a".into() }).unwrap();
        assert_eq!(recs.by_name("a").unwrap().name, "a");
        recs.update("id-1", |r| {
            r.as_mut().unwrap().name = "b".into();
            Ok(())
        })
        .unwrap();
        assert!(recs.by_name("a").is_none());
        assert!(recs.by_name("b").is_some());
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
        let (again, _) = Records::<Rec>::load(&store, "recs", |r| Some(&r.name)).unwrap();
        assert!(again.by_name("b").is_some(), "the index is rebuilt at load");
        assert_eq!(again.remove("id-1").unwrap().unwrap().name, "b");
        assert!(again.by_name("b").is_none());
        assert_eq!(again.len(), 0);
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

    #[test]
    fn data_is_sorted_by_id_and_foreign_names_are_set_apart() {
        let dir = tempfile::tempdir().unwrap();
        let id = IdKind::Volume.generate();
        fs::create_dir(dir.path().join(&id)).unwrap();
        fs::write(dir.path().join(format!("{id}.img")), b"").unwrap();
        fs::write(dir.path().join("lost+found"), b"").unwrap();
        fs::write(dir.path().join(format!("{id}.bak")), b"").unwrap();
        let (ours, other) = data_by_id(dir.path(), IdKind::Volume, &["", ".img"]);
        assert_eq!(ours.len(), 2);
        assert!(ours.iter().all(|(i, _)| i == &id));
        assert_eq!(other.len(), 2);
        for (_, p) in &ours {
            remove_path(p).unwrap();
            remove_path(p).unwrap();
        }
        assert!(!dir.path().join(&id).exists());
    }
}
