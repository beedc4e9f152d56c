//! The driver's records, persisted in one JSON state file that is replaced
//! atomically on every change (temp file, fsync, rename, fsync dir).
//!
//! Ordering rule that keeps crashes harmless: backing data is created before
//! its record is saved, and a record is removed before its backing data. A
//! crash can leave an orphan file (reported at start), never a record
//! without data.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use csi_server::CsiError;
use csi_server::persist::JsonStateFile;
use serde::{Deserialize, Serialize};

/// How a volume is accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    /// A directory, bind-mounted.
    Mount,
    /// A file attached as a loop device, exposed as a device node.
    Block,
}

/// Where a volume's initial contents came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Restored from a snapshot.
    Snapshot(String),
    /// Cloned from a volume.
    Volume(String),
}

/// A volume the controller created.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub name: String,
    pub capacity_bytes: i64,
    pub access: Access,
    pub source: Option<Source>,
    pub parameters: BTreeMap<String, String>,
    pub mutable_parameters: BTreeMap<String, String>,
    /// The topology segment the volume is accessible from (empty without topology).
    pub topology: BTreeMap<String, String>,
    /// The CreateVolume request without its secrets (encoded protobuf), for
    /// csi-server's idempotency comparison of a repeated CreateVolume.
    pub request: Vec<u8>,
    /// Nodes the volume is ControllerPublished to, with the read-only flag.
    pub published_nodes: BTreeMap<String, bool>,
    /// Created for an inline ephemeral volume by NodePublish.
    pub ephemeral: bool,
}

/// A snapshot of one volume.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: i64,
    pub access: Access,
    pub created_unix_nanos: i128,
    pub group_snapshot_id: Option<String>,
    /// The CreateSnapshot parameters, for the idempotency comparison.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

/// A group snapshot: several snapshots cut together.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupSnapshotRecord {
    pub id: String,
    pub name: String,
    pub source_volume_ids: Vec<String>,
    pub snapshot_ids: Vec<String>,
    pub parameters: BTreeMap<String, String>,
    pub created_unix_nanos: i128,
}

/// A volume staged on this node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StagedRecord {
    pub staging_path: PathBuf,
    /// Encoded capability the volume was staged with.
    pub capability: Vec<u8>,
    /// The loop device of a block volume.
    pub loop_device: Option<PathBuf>,
}

/// A volume published at a target path on this node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublishedRecord {
    pub volume_id: String,
    /// The NodePublish request without its secrets (encoded protobuf), for
    /// the repeat table.
    pub request: Vec<u8>,
    pub readonly: bool,
}

/// Everything the driver remembers.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub volumes: BTreeMap<String, VolumeRecord>,
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    pub group_snapshots: BTreeMap<String, GroupSnapshotRecord>,
    /// Node side: volume id → where it is staged.
    pub staged: BTreeMap<String, StagedRecord>,
    /// Node side: target path → what is published there.
    pub published: BTreeMap<PathBuf, PublishedRecord>,
    /// Names of inline ephemeral volumes removed by NodeUnpublish, newest
    /// last, so a retried NodeUnpublish stays OK (bounded).
    #[serde(default)]
    pub retired_ephemeral: std::collections::VecDeque<String>,
}

/// How many retired ephemeral volume names are remembered.
const RETIRED_EPHEMERAL_KEPT: usize = 1024;

impl State {
    /// Records that the ephemeral volume `name` was removed.
    pub fn retire_ephemeral(&mut self, name: &str) {
        if self.retired_ephemeral.len() >= RETIRED_EPHEMERAL_KEPT {
            self.retired_ephemeral.pop_front();
        }
        self.retired_ephemeral.push_back(name.to_owned());
    }

    /// The volume created under `name`, if any.
    pub fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volumes.values().find(|v| v.name == name)
    }

    /// The snapshot created under `name`, if any.
    pub fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots.values().find(|s| s.name == name)
    }

    /// Targets where `volume_id` is published on this node.
    pub fn targets_of(&self, volume_id: &str) -> BTreeSet<PathBuf> {
        self.published
            .iter()
            .filter(|(_, p)| p.volume_id == volume_id)
            .map(|(t, _)| t.clone())
            .collect()
    }
}

/// The state file plus the in-memory copy. Short critical sections only:
/// slow I/O (copies, mounts) happens outside the lock.
pub struct Store {
    state: Mutex<State>,
    file: JsonStateFile<State>,
}

impl Store {
    /// Loads `dir/state.json` (empty when absent).
    pub fn open(dir: &Path) -> Result<Self, csi_server::persist::PersistError> {
        let file = JsonStateFile::new(dir.join("state.json"));
        let state = file.load()?;
        Ok(Self {
            state: Mutex::new(state),
            file,
        })
    }

    /// Reads the state.
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Changes the state and saves it before returning. If saving fails the
    /// in-memory change is rolled back, so memory never runs ahead of disk.
    pub fn update<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, CsiError>,
    ) -> Result<T, CsiError> {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let before = serde_json::to_vec(&*guard).map_err(|e| CsiError::Internal(e.to_string()))?;
        let out = f(&mut guard)?;
        if let Err(e) = self.file.save(&guard) {
            *guard = serde_json::from_slice(&before).expect("state we just serialized decodes");
            return Err(CsiError::Internal(format!("saving state: {e}")));
        }
        Ok(out)
    }
}

/// Kinds of generated ids, each with its prefix.
#[derive(Debug, Clone, Copy)]
pub enum IdKind {
    Volume,
    Snapshot,
    GroupSnapshot,
}

impl IdKind {
    fn prefix(self) -> &'static str {
        match self {
            IdKind::Volume => "vol-",
            IdKind::Snapshot => "snap-",
            IdKind::GroupSnapshot => "group-",
        }
    }

    /// A fresh id.
    pub fn generate(self) -> String {
        format!("{}{}", self.prefix(), uuid::Uuid::new_v4().simple())
    }

    /// Whether `id` is one this driver could have generated. Ids become
    /// paths, so anything else (`../../etc`, `a/b`, NUL) is rejected before
    /// it touches the filesystem.
    pub fn is_valid(self, id: &str) -> bool {
        id.strip_prefix(self.prefix()).is_some_and(|hex| {
            hex.len() == 32
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated_before_use_as_paths() {
        let id = IdKind::Volume.generate();
        assert!(IdKind::Volume.is_valid(&id));
        assert!(!IdKind::Snapshot.is_valid(&id));
        for bad in [
            "../../etc",
            "vol-../../etc",
            "vol-",
            "vol-a/b",
            "vol-\0",
            &format!("{id}x"),
            &id.to_uppercase(),
        ] {
            assert!(!IdKind::Volume.is_valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn failed_saves_roll_back_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store
            .update(|s| {
                s.group_snapshots.clear();
                Ok(())
            })
            .unwrap();
        // Make the directory unwritable for the temp file by replacing it with a file.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, b"").unwrap();
        let store2 = Store {
            state: Mutex::new(State::default()),
            file: JsonStateFile::new(blocked.join("state.json")),
        };
        let err = store2.update(|s| {
            s.snapshots.insert(
                "x".into(),
                SnapshotRecord {
                    id: "x".into(),
                    name: "n".into(),
                    source_volume_id: "v".into(),
                    size_bytes: 1,
                    access: Access::Mount,
                    created_unix_nanos: 0,
                    group_snapshot_id: None,
                    parameters: BTreeMap::new(),
                },
            );
            Ok(())
        });
        assert!(err.is_err());
        assert!(
            store2.read(|s| s.snapshots.is_empty()),
            "memory rolled back"
        );
    }
}
