//! A small durable journal of node-side intents: what is (or may be)
//! attached, staged where, and published for which pods.
//!
//! Mounts found on disk do not tell everything after a restart: once the
//! last pod's mount is gone, a staged volume has no pod directory left to
//! find, and kubelet forgets to unstage it (kubernetes#85476). The node
//! [`NodeReconciler`](crate::node::NodeReconciler) writes an intent *before* each
//! attach, stage and publish and clears it only *after* the matching
//! detach, unstage or unpublish succeeded, so
//! [`ActualNodeState::reconstruct_with_journal`](crate::node::ActualNodeState::reconstruct_with_journal)
//! knows every step still owed.
//!
//! Records live behind a [`JournalStore`]: `FakeJournalStore` for tests
//! and [`RecordJournalStore`] on a csi-store [`RecordStore`]: with a
//! [`FileStore`], one small file per volume replaced
//! atomically (temp file, fsync, rename, fsync of the directory) in a
//! directory one process owns.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use csi_store::{FileStore, RecordStore, Table};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::mounts::MountIdentity;
use crate::types::{AttachInfo, Key};

/// A pod's publish intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishIntent {
    /// The pod's target path.
    pub target_path: PathBuf,
    /// What was mounted there once publish succeeded (if a mount table is
    /// configured); `None` while the publish is only intended.
    pub source: Option<MountIdentity>,
}

/// Everything owed for one volume on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeIntent<P> {
    /// The node attached the volume itself and owes a detach.
    pub attached: bool,
    /// What the last attach or verify-attached reported (device path,
    /// publish context), so a reconstructed volume need not attach again.
    pub attach_info: Option<AttachInfo>,
    /// Where the volume is (or may be) staged.
    pub staging_path: Option<PathBuf>,
    /// What was mounted at the staging path once stage succeeded.
    pub staged: Option<MountIdentity>,
    /// Pods the volume is (or may be) published for.
    pub pods: BTreeMap<P, PublishIntent>,
    /// The filesystem size the node has set the volume up at, as far as it
    /// is confirmed: the wanted size when it was first staged (or
    /// published), a size stage or publish reported, then each successful
    /// expansion's answer. Written only once an expansion succeeded, so a
    /// restart in the middle of one still sees the old size and expands
    /// again (kubelet keeps this in the PVC's status, not in memory).
    /// Owes nothing by itself.
    pub size: Option<u64>,
}

impl<P> Default for VolumeIntent<P> {
    fn default() -> Self {
        Self {
            attached: false,
            attach_info: None,
            staging_path: None,
            staged: None,
            pods: BTreeMap::new(),
            size: None,
        }
    }
}

impl<P> VolumeIntent<P> {
    /// Whether nothing is owed (the record can be dropped).
    pub fn is_empty(&self) -> bool {
        !self.attached && self.staging_path.is_none() && self.pods.is_empty()
    }
}

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The record store failed (I/O, full disk, directory locked by
    /// another process, ...).
    #[error("journal: {0}")]
    Store(#[from] csi_store::StoreError),
    /// A volume key could not be encoded as a record key.
    #[error("journal key does not encode: {0}")]
    Encode(serde_json::Error),
    /// A write was refused (fault injection in `FakeJournalStore`) or
    /// its task died.
    #[error("journal write failed: {0}")]
    Unavailable(String),
}

/// Durable storage of [`VolumeIntent`]s, one per volume.
pub trait JournalStore<V, P>: Debug + Send + Sync {
    /// Every stored record.
    fn load(&self) -> Result<BTreeMap<V, VolumeIntent<P>>, JournalError>;

    /// Stores `record` for `volume`; once this returns it survives a crash.
    fn put(&self, volume: &V, record: &VolumeIntent<P>) -> Result<(), JournalError>;

    /// Drops the record of `volume` (no error if there is none).
    fn remove(&self, volume: &V) -> Result<(), JournalError>;
}

/// A [`JournalStore`] in memory, for tests, with injected write failures.
/// Share it (`Arc`) between the journals of a "process" and its "restart".
#[cfg(feature = "testing")]
#[derive(Debug)]
pub struct FakeJournalStore<V, P> {
    records: Mutex<BTreeMap<V, VolumeIntent<P>>>,
    failing: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "testing")]
impl<V: Key, P: Key> Default for FakeJournalStore<V, P> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "testing")]
impl<V: Key, P: Key> FakeJournalStore<V, P> {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            records: Mutex::new(BTreeMap::new()),
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Makes every write fail (or succeed again).
    pub fn set_failing(&self, failing: bool) {
        self.failing
            .store(failing, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<V, VolumeIntent<P>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self) -> Result<(), JournalError> {
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(JournalError::Unavailable("injected failure".into()));
        }
        Ok(())
    }
}

#[cfg(feature = "testing")]
impl<V: Key, P: Key> JournalStore<V, P> for FakeJournalStore<V, P> {
    fn load(&self) -> Result<BTreeMap<V, VolumeIntent<P>>, JournalError> {
        Ok(self.lock().clone())
    }

    fn put(&self, volume: &V, record: &VolumeIntent<P>) -> Result<(), JournalError> {
        self.check()?;
        self.lock().insert(volume.clone(), record.clone());
        Ok(())
    }

    fn remove(&self, volume: &V) -> Result<(), JournalError> {
        self.check()?;
        self.lock().remove(volume);
        Ok(())
    }
}

/// A [`JournalStore`] on a csi-store [`RecordStore`]: one record per
/// volume (JSON) in the table [`RecordJournalStore::TABLE`].
///
/// [`open`](Self::open) gives it a [`FileStore`] of
/// its own; [`with_store`](Self::with_store) shares a driver's store (or a
/// [`FakeStore`](csi_store::FakeStore) with injected faults).
#[derive(Debug)]
pub struct RecordJournalStore<V, P> {
    table: Table<FileRecord<V, P>>,
}

#[derive(Serialize, Deserialize)]
struct FileRecord<V, P> {
    volume: V,
    attached: bool,
    attach_info: Option<AttachInfo>,
    staging_path: Option<PathBuf>,
    staged: Option<MountIdentity>,
    // A list, not a map: JSON map keys must be strings.
    pods: Vec<(P, PublishIntent)>,
    // Absent from records written before sizes were kept.
    #[serde(default)]
    size: Option<u64>,
}

/// The record key of a volume: a string key as is, anything else as JSON.
fn record_key<V: Serialize>(volume: &V) -> Result<String, JournalError> {
    let json = serde_json::to_value(volume).map_err(JournalError::Encode)?;
    Ok(match json {
        serde_json::Value::String(key) => key,
        other => other.to_string(),
    })
}

impl<V, P> RecordJournalStore<V, P>
where
    V: Key + Serialize + DeserializeOwned,
    P: Key + Serialize + DeserializeOwned,
{
    /// The table the records live in.
    pub const TABLE: &'static str = "volume-intents";

    /// A journal in `dir` (created if missing), which this process then
    /// owns: a second open fails with [`StoreError::Locked`](csi_store::StoreError::Locked).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, JournalError> {
        Self::with_store(Arc::new(FileStore::open(dir)?))
    }

    /// A journal in `store` (table [`TABLE`](Self::TABLE)).
    pub fn with_store(store: Arc<dyn RecordStore>) -> Result<Self, JournalError> {
        Ok(Self {
            table: Table::with_shared(store, Self::TABLE)?,
        })
    }
}

impl<V, P> JournalStore<V, P> for RecordJournalStore<V, P>
where
    V: Key + Serialize + DeserializeOwned,
    P: Key + Serialize + DeserializeOwned,
{
    fn load(&self) -> Result<BTreeMap<V, VolumeIntent<P>>, JournalError> {
        let scan = self.table.scan()?;
        for q in &scan.quarantined {
            // Set aside by the store (kept for an operator); what it owed
            // is lost to reconstruction, so say so loudly.
            tracing::error!(key = ?q.key, reason = %q.reason, moved_to = ?q.moved_to, "unreadable journal record set aside");
        }
        Ok(scan
            .records
            .into_iter()
            .map(|(_, file)| {
                let record = VolumeIntent {
                    attached: file.attached,
                    attach_info: file.attach_info,
                    staging_path: file.staging_path,
                    staged: file.staged,
                    pods: file.pods.into_iter().collect(),
                    size: file.size,
                };
                (file.volume, record)
            })
            .collect())
    }

    fn put(&self, volume: &V, record: &VolumeIntent<P>) -> Result<(), JournalError> {
        let file = FileRecord {
            volume: volume.clone(),
            attached: record.attached,
            attach_info: record.attach_info.clone(),
            staging_path: record.staging_path.clone(),
            staged: record.staged.clone(),
            pods: record
                .pods
                .iter()
                .map(|(p, r)| (p.clone(), r.clone()))
                .collect(),
            size: record.size,
        };
        Ok(self.table.put(&record_key(volume)?, &file)?)
    }

    fn remove(&self, volume: &V) -> Result<(), JournalError> {
        self.table.delete(&record_key(volume)?)?;
        Ok(())
    }
}

/// The journal: an in-memory copy of the records, written through to a
/// [`JournalStore`]. Writes are serialised, so concurrent publishes of one
/// volume never lose each other's intent.
#[derive(Debug)]
pub struct Journal<V, P> {
    store: Arc<dyn JournalStore<V, P>>,
    records: Mutex<BTreeMap<V, VolumeIntent<P>>>,
    writer: tokio::sync::Mutex<()>,
}

impl<V: Key, P: Key> Journal<V, P> {
    /// Opens the journal, loading what `store` holds (the intents of the
    /// previous run).
    pub fn open(store: Arc<dyn JournalStore<V, P>>) -> Result<Self, JournalError> {
        let records = store.load()?;
        Ok(Self {
            store,
            records: Mutex::new(records),
            writer: tokio::sync::Mutex::new(()),
        })
    }

    /// All records, for [`reconstruct_with_journal`](crate::node::ActualNodeState::reconstruct_with_journal).
    pub fn records(&self) -> BTreeMap<V, VolumeIntent<P>> {
        self.lock().clone()
    }

    /// One volume's record.
    pub fn get(&self, volume: &V) -> Option<VolumeIntent<P>> {
        self.lock().get(volume).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<V, VolumeIntent<P>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes one volume's record and makes the change durable before
    /// returning; an emptied record is removed. On error nothing changed.
    pub async fn update(
        &self,
        volume: &V,
        change: impl FnOnce(&mut VolumeIntent<P>),
    ) -> Result<(), JournalError> {
        let _writing = self.writer.lock().await;
        let before = self.get(volume);
        let mut record = before.clone().unwrap_or_default();
        change(&mut record);
        let after = (!record.is_empty()).then_some(record);
        if after == before {
            return Ok(());
        }
        let store = self.store.clone();
        let key = volume.clone();
        let written = after.clone();
        // Files are fsynced: keep that off the async worker threads.
        tokio::task::spawn_blocking(move || match &written {
            Some(record) => store.put(&key, record),
            None => store.remove(&key),
        })
        .await
        .map_err(|e| JournalError::Unavailable(e.to_string()))??;
        let mut records = self.lock();
        match after {
            Some(record) => records.insert(volume.clone(), record),
            None => records.remove(volume),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pod: &str) -> VolumeIntent<String> {
        let mut r = VolumeIntent {
            attached: true,
            attach_info: Some(AttachInfo {
                device_path: Some("/dev/vdb".into()),
                publish_context: [("lun".to_string(), "3".to_string())].into(),
            }),
            staging_path: Some("/staging/v".into()),
            staged: Some(MountIdentity {
                device: (8, 16),
                root: "/".into(),
                fs_type: "ext4".into(),
                source: "/dev/vdb".into(),
                boot_id: Some("b1".into()),
            }),
            pods: BTreeMap::new(),
            size: Some(1 << 30),
        };
        r.pods.insert(
            pod.to_string(),
            PublishIntent {
                target_path: format!("/pods/{pod}/v").into(),
                source: None,
            },
        );
        r
    }

    #[test]
    fn file_store_round_trips_any_key_and_owns_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let store = RecordJournalStore::<String, String>::open(&path).unwrap();
        let odd = "pvc/../x y\u{e9}".to_string();
        let long = "x".repeat(300);
        store.put(&"pvc-1".to_string(), &record("a")).unwrap();
        store.put(&odd, &record("b")).unwrap();
        store.put(&"pvc-1".to_string(), &record("c")).unwrap();
        store.put(&long, &record("d")).unwrap();
        let second = RecordJournalStore::<String, String>::open(&path);
        assert!(
            matches!(
                second,
                Err(JournalError::Store(csi_store::StoreError::Locked { .. }))
            ),
            "{second:?}"
        );
        drop(store);
        let reopened = RecordJournalStore::<String, String>::open(&path).unwrap();
        let loaded = reopened.load().unwrap();
        assert_eq!(loaded.len(), 3);
        assert_eq!(loaded["pvc-1"], record("c"));
        assert_eq!(loaded[&odd], record("b"));
        assert_eq!(loaded[&long], record("d"));
        reopened.remove(&"pvc-1".to_string()).unwrap();
        reopened.remove(&"pvc-1".to_string()).unwrap();
        assert_eq!(reopened.load().unwrap().len(), 2);
    }

    #[test]
    fn integer_keys_work_in_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = RecordJournalStore::<u32, u64>::open(dir.path()).unwrap();
        let mut r = VolumeIntent::<u64> {
            staging_path: Some("/s".into()),
            ..VolumeIntent::default()
        };
        r.pods.insert(
            7,
            PublishIntent {
                target_path: "/t".into(),
                source: None,
            },
        );
        store.put(&42, &r).unwrap();
        assert_eq!(store.load().unwrap()[&42], r);
    }

    #[test]
    fn an_unreadable_record_is_set_aside_and_the_others_load() {
        let mem = Arc::new(csi_store::FakeStore::new());
        let store = RecordJournalStore::<String, String>::with_store(mem.clone()).unwrap();
        store.put(&"good".to_string(), &record("a")).unwrap();
        mem.insert_unreadable(RecordJournalStore::<String, String>::TABLE, "bad", "torn");
        let loaded = store.load().unwrap();
        assert_eq!(loaded.keys().collect::<Vec<_>>(), ["good"]);
        // A full disk fails the write with the store's error.
        mem.set_full(true);
        let err = store.put(&"new".to_string(), &record("b")).unwrap_err();
        assert!(matches!(err, JournalError::Store(_)), "{err}");
    }

    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn journal_updates_are_durable_and_empty_records_disappear() {
        let store = Arc::new(FakeJournalStore::<String, String>::new());
        let journal = Journal::open(store.clone()).unwrap();
        let v = "v".to_string();
        journal
            .update(&v, |r| r.staging_path = Some("/s".into()))
            .await
            .unwrap();
        assert_eq!(store.load().unwrap()[&v].staging_path, Some("/s".into()));
        store.set_failing(true);
        let err = journal.update(&v, |r| r.attached = true).await;
        assert!(matches!(err, Err(JournalError::Unavailable(_))));
        assert!(!journal.get(&v).unwrap().attached, "unchanged on error");
        store.set_failing(false);
        journal.update(&v, |r| r.staging_path = None).await.unwrap();
        assert!(journal.get(&v).is_none());
        assert!(store.load().unwrap().is_empty());
        // A restart sees what the previous run left.
        journal.update(&v, |r| r.attached = true).await.unwrap();
        let reopened = Journal::open(store).unwrap();
        assert!(reopened.records()[&v].attached);
    }
}
