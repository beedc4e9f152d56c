//! The driver's records, persisted in one JSON state file that is replaced
//! atomically on every change (temp file, fsync, rename, fsync dir).
//!
//! Ordering rule that keeps crashes harmless: backing data is created before
//! its record is saved, and a record is removed before its backing data. A
//! crash can leave an orphan file (reported at start), never a record
//! without data.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a volume is accessed: a directory, bind-mounted (Mount), or a file
/// attached as a loop device and exposed as a device node (Block).
pub use crate::common::Access;
/// Where a volume's initial contents came from.
pub use crate::common::Source;

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
pub use crate::common::GroupSnapshotRecord;

/// Everything the driver remembers.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct State {
    pub volumes: BTreeMap<String, VolumeRecord>,
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    pub group_snapshots: BTreeMap<String, GroupSnapshotRecord>,
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
}

/// The state file plus the in-memory copy (see [`crate::common::Store`]).
pub type Store = crate::common::Store<State>;

pub use crate::common::IdKind;
