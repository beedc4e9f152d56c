//! A small durable journal of node-side intents: what is (or may be)
//! attached, staged where, and published for which pods.
//!
//! Mounts found on disk do not tell everything after a restart: once the
//! last pod's mount is gone, a staged volume has no pod directory left to
//! find, and kubelet forgets to unstage it (kubernetes#85476). The node
//! [`Reconciler`](crate::node::Reconciler) writes an intent *before* each
//! attach, stage and publish and clears it only *after* the matching
//! detach, unstage or unpublish succeeded, so
//! [`ActualStateOfWorld::reconstruct_with_journal`](crate::node::ActualStateOfWorld::reconstruct_with_journal)
//! knows every step still owed.
//!
//! Records live behind a [`JournalStore`]: [`MemoryJournalStore`] for tests
//! and [`FileJournalStore`], one small file per volume replaced atomically
//! (temp file, fsync, rename, fsync of the directory).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::mounts::MountSource;
use crate::types::{AttachInfo, Key};

/// A pod's publish intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishRecord {
    /// The pod's target path.
    pub target_path: PathBuf,
    /// What was mounted there once publish succeeded (if a mount table is
    /// configured); `None` while the publish is only intended.
    pub source: Option<MountSource>,
}

/// Everything owed for one volume on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord<P> {
    /// The node attached the volume itself and owes a detach.
    pub attached: bool,
    /// What the last attach or verify-attached reported (device path,
    /// publish context), so a reconstructed volume need not attach again.
    pub attach_info: Option<AttachInfo>,
    /// Where the volume is (or may be) staged.
    pub staging_path: Option<PathBuf>,
    /// What was mounted at the staging path once stage succeeded.
    pub staged: Option<MountSource>,
    /// Pods the volume is (or may be) published for.
    pub pods: BTreeMap<P, PublishRecord>,
}

impl<P> Default for VolumeRecord<P> {
    fn default() -> Self {
        Self {
            attached: false,
            attach_info: None,
            staging_path: None,
            staged: None,
            pods: BTreeMap::new(),
        }
    }
}

impl<P> VolumeRecord<P> {
    /// Whether nothing is owed (the record can be dropped).
    pub fn is_empty(&self) -> bool {
        !self.attached && self.staging_path.is_none() && self.pods.is_empty()
    }
}

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// A file operation failed.
    #[error("journal {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A record file does not parse.
    #[error("journal record {path} is corrupt: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// A key could not be encoded.
    #[error("journal key does not encode: {0}")]
    Encode(serde_json::Error),
    /// Two volume keys map to the same file name (astronomically unlikely;
    /// refused rather than overwriting another volume's record).
    #[error("journal record {path} belongs to another volume")]
    Collision {
        /// The file.
        path: PathBuf,
    },
    /// A write was refused (fault injection in [`MemoryJournalStore`]) or
    /// its task died.
    #[error("journal write failed: {0}")]
    Unavailable(String),
}

/// Durable storage of [`VolumeRecord`]s, one per volume.
pub trait JournalStore<V, P>: Debug + Send + Sync {
    /// Every stored record.
    fn load(&self) -> Result<BTreeMap<V, VolumeRecord<P>>, JournalError>;

    /// Stores `record` for `volume`; once this returns it survives a crash.
    fn put(&self, volume: &V, record: &VolumeRecord<P>) -> Result<(), JournalError>;

    /// Drops the record of `volume` (no error if there is none).
    fn remove(&self, volume: &V) -> Result<(), JournalError>;
}

/// A [`JournalStore`] in memory, for tests. Share it (`Arc`) between the
/// journals of a "process" and its "restart".
#[derive(Debug)]
pub struct MemoryJournalStore<V, P> {
    records: Mutex<BTreeMap<V, VolumeRecord<P>>>,
    failing: std::sync::atomic::AtomicBool,
}

impl<V: Key, P: Key> Default for MemoryJournalStore<V, P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Key, P: Key> MemoryJournalStore<V, P> {
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

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<V, VolumeRecord<P>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self) -> Result<(), JournalError> {
        if self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(JournalError::Unavailable("injected failure".into()));
        }
        Ok(())
    }
}

impl<V: Key, P: Key> JournalStore<V, P> for MemoryJournalStore<V, P> {
    fn load(&self) -> Result<BTreeMap<V, VolumeRecord<P>>, JournalError> {
        Ok(self.lock().clone())
    }

    fn put(&self, volume: &V, record: &VolumeRecord<P>) -> Result<(), JournalError> {
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

/// A [`JournalStore`] in a directory: one JSON file per volume, replaced
/// atomically (write a temp file, fsync it, rename it over the record,
/// fsync the directory), so a crash leaves the old or the new record.
/// One process per directory.
#[derive(Debug)]
pub struct FileJournalStore<V, P> {
    dir: PathBuf,
    _keys: std::marker::PhantomData<fn() -> (V, P)>,
}

#[derive(Serialize, Deserialize)]
struct FileRecord<V, P> {
    volume: V,
    attached: bool,
    attach_info: Option<AttachInfo>,
    staging_path: Option<PathBuf>,
    staged: Option<MountSource>,
    // A list, not a map: JSON map keys must be strings.
    pods: Vec<(P, PublishRecord)>,
}

const RECORD_SUFFIX: &str = ".json";
const TEMP_SUFFIX: &str = ".tmp";
/// Longest escaped key used as a file name as is; longer ones are hashed.
const MAX_PLAIN_NAME: usize = 200;

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// FNV-1a, 64 bits: stable across builds (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A file name for a key: readable for plain ids, always safe.
fn file_stem<V: Serialize>(volume: &V) -> Result<String, JournalError> {
    let json = serde_json::to_string(volume).map_err(JournalError::Encode)?;
    let text = serde_json::from_str::<String>(&json).unwrap_or_else(|_| json.clone());
    let mut escaped = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            escaped.push(char::from(b));
        } else {
            escaped.push_str(&format!("%{b:02x}"));
        }
    }
    if escaped.len() <= MAX_PLAIN_NAME {
        return Ok(format!("v-{escaped}"));
    }
    let mut cut = 100;
    while !escaped.is_char_boundary(cut) {
        cut -= 1;
    }
    Ok(format!(
        "h-{:016x}-{}",
        fnv1a(json.as_bytes()),
        &escaped[..cut]
    ))
}

fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))
}

impl<V, P> FileJournalStore<V, P>
where
    V: Key + Serialize + DeserializeOwned,
    P: Key + Serialize + DeserializeOwned,
{
    /// A store in `dir`, created (mode 0700) if missing. Temp files of
    /// writes a crash interrupted are removed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, JournalError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = dir.into();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_error(&dir))?;
        for entry in fs::read_dir(&dir).map_err(io_error(&dir))? {
            let path = entry.map_err(io_error(&dir))?.path();
            if path.to_string_lossy().ends_with(TEMP_SUFFIX) {
                fs::remove_file(&path).map_err(io_error(&path))?;
            }
        }
        Ok(Self {
            dir,
            _keys: std::marker::PhantomData,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, volume: &V) -> Result<PathBuf, JournalError> {
        Ok(self
            .dir
            .join(format!("{}{RECORD_SUFFIX}", file_stem(volume)?)))
    }

    fn read(path: &Path) -> Result<FileRecord<V, P>, JournalError> {
        let data = fs::read(path).map_err(io_error(path))?;
        serde_json::from_slice(&data).map_err(|source| JournalError::Corrupt {
            path: path.to_path_buf(),
            source,
        })
    }
}

impl<V, P> JournalStore<V, P> for FileJournalStore<V, P>
where
    V: Key + Serialize + DeserializeOwned,
    P: Key + Serialize + DeserializeOwned,
{
    fn load(&self) -> Result<BTreeMap<V, VolumeRecord<P>>, JournalError> {
        let mut out = BTreeMap::new();
        for entry in fs::read_dir(&self.dir).map_err(io_error(&self.dir))? {
            let path = entry.map_err(io_error(&self.dir))?.path();
            if !path.to_string_lossy().ends_with(RECORD_SUFFIX) {
                continue;
            }
            let file = Self::read(&path)?;
            out.insert(
                file.volume,
                VolumeRecord {
                    attached: file.attached,
                    attach_info: file.attach_info,
                    staging_path: file.staging_path,
                    staged: file.staged,
                    pods: file.pods.into_iter().collect(),
                },
            );
        }
        Ok(out)
    }

    fn put(&self, volume: &V, record: &VolumeRecord<P>) -> Result<(), JournalError> {
        let path = self.record_path(volume)?;
        // Only hashed names can collide; escaped ones are injective.
        let hashed = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("h-"));
        if hashed && path.exists() && Self::read(&path).is_ok_and(|f| f.volume != *volume) {
            return Err(JournalError::Collision { path });
        }
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
        };
        let data = serde_json::to_vec(&file).map_err(JournalError::Encode)?;
        let temp = path.with_extension(&TEMP_SUFFIX[1..]);
        let write = || -> std::io::Result<()> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&temp)?;
            f.write_all(&data)?;
            f.sync_all()
        };
        write().map_err(io_error(&temp))?;
        fs::rename(&temp, &path).map_err(io_error(&path))?;
        sync_dir(&self.dir)
    }

    fn remove(&self, volume: &V) -> Result<(), JournalError> {
        let path = self.record_path(volume)?;
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&path)(e)),
        }
    }
}

/// The journal: an in-memory copy of the records, written through to a
/// [`JournalStore`]. Writes are serialised, so concurrent publishes of one
/// volume never lose each other's intent.
#[derive(Debug)]
pub struct Journal<V, P> {
    store: Arc<dyn JournalStore<V, P>>,
    records: Mutex<BTreeMap<V, VolumeRecord<P>>>,
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

    /// All records, for [`reconstruct_with_journal`](crate::node::ActualStateOfWorld::reconstruct_with_journal).
    pub fn records(&self) -> BTreeMap<V, VolumeRecord<P>> {
        self.lock().clone()
    }

    /// One volume's record.
    pub fn get(&self, volume: &V) -> Option<VolumeRecord<P>> {
        self.lock().get(volume).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<V, VolumeRecord<P>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes one volume's record and makes the change durable before
    /// returning; an emptied record is removed. On error nothing changed.
    pub async fn update(
        &self,
        volume: &V,
        change: impl FnOnce(&mut VolumeRecord<P>),
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

    fn record(pod: &str) -> VolumeRecord<String> {
        let mut r = VolumeRecord {
            attached: true,
            attach_info: Some(AttachInfo {
                device_path: Some("/dev/vdb".into()),
                publish_context: [("lun".to_string(), "3".to_string())].into(),
            }),
            staging_path: Some("/staging/v".into()),
            staged: Some(MountSource {
                device: (8, 16),
                root: "/".into(),
                fs_type: "ext4".into(),
                source: "/dev/vdb".into(),
                boot_id: Some("b1".into()),
            }),
            pods: BTreeMap::new(),
        };
        r.pods.insert(
            pod.to_string(),
            PublishRecord {
                target_path: format!("/pods/{pod}/v").into(),
                source: None,
            },
        );
        r
    }

    #[test]
    fn file_store_round_trips_and_replaces_records_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileJournalStore::<String, String>::open(dir.path().join("j")).unwrap();
        let odd = "pvc/../x y\u{e9}".to_string();
        store.put(&"pvc-1".to_string(), &record("a")).unwrap();
        store.put(&odd, &record("b")).unwrap();
        store.put(&"pvc-1".to_string(), &record("c")).unwrap();
        let long = "x".repeat(300);
        store.put(&long, &record("d")).unwrap();
        // A write a crash interrupted leaves a temp file; open removes it.
        fs::write(store.dir().join("v-pvc-2.tmp"), b"{partial").unwrap();
        let reopened = FileJournalStore::<String, String>::open(store.dir()).unwrap();
        let loaded = reopened.load().unwrap();
        assert_eq!(loaded.len(), 3);
        assert_eq!(loaded["pvc-1"], record("c"));
        assert_eq!(loaded[&odd], record("b"));
        assert_eq!(loaded[&long], record("d"));
        let mut names: Vec<String> = fs::read_dir(store.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert!(names.iter().all(|n| n.ends_with(".json") && n.len() < 255));
        assert!(names.contains(&"v-pvc-1.json".to_string()), "{names:?}");
        reopened.remove(&"pvc-1".to_string()).unwrap();
        reopened.remove(&"pvc-1".to_string()).unwrap();
        assert_eq!(reopened.load().unwrap().len(), 2);
    }

    #[test]
    fn a_corrupt_record_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileJournalStore::<String, String>::open(dir.path()).unwrap();
        fs::write(dir.path().join("v-x.json"), b"not json").unwrap();
        let err = store.load().unwrap_err();
        assert!(matches!(err, JournalError::Corrupt { .. }));
        assert!(err.to_string().contains("v-x.json"), "{err}");
    }

    #[test]
    fn integer_keys_work_in_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileJournalStore::<u32, u64>::open(dir.path()).unwrap();
        let mut r = VolumeRecord::<u64> {
            staging_path: Some("/s".into()),
            ..VolumeRecord::default()
        };
        r.pods.insert(
            7,
            PublishRecord {
                target_path: "/t".into(),
                source: None,
            },
        );
        store.put(&42, &r).unwrap();
        assert_eq!(store.load().unwrap()[&42], r);
    }

    #[tokio::test]
    async fn journal_updates_are_durable_and_empty_records_disappear() {
        let store = Arc::new(MemoryJournalStore::<String, String>::new());
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
