//! The driver's records, persisted in one JSON state file replaced
//! atomically on every change ([`crate::common::Store`]).
//!
//! Ordering rule that keeps crashes harmless: a backing file is created
//! before its record is saved, and a record is removed before its file. A
//! crash can leave an orphan file (reported at start), never a record
//! without data.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::common::{Access, GroupSnapshotRecord, Source};
use crate::tuning::Tuning;

/// A volume (a disk) the controller created.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub name: String,
    pub capacity_bytes: i64,
    pub access: Access,
    pub source: Option<Source>,
    pub parameters: BTreeMap<String, String>,
    /// The CreateVolume request without its secrets (encoded protobuf), for
    /// the idempotency comparison of a repeated CreateVolume.
    pub request: Vec<u8>,
    /// Nodes the disk is attached to (ControllerPublish), with the read-only flag.
    pub attached: BTreeMap<String, bool>,
    /// Its mutable parameters (CreateVolume, ControllerModifyVolume).
    #[serde(default)]
    pub tuning: Tuning,
}

/// A snapshot: a sparse copy of a disk's backing file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: i64,
    pub access: Access,
    pub created_unix_nanos: i128,
    /// The CreateSnapshot parameters, for the idempotency comparison.
    pub parameters: BTreeMap<String, String>,
    /// The group snapshot it was cut in, if any (then only the group can
    /// be deleted).
    #[serde(default)]
    pub group_snapshot_id: Option<String>,
}

/// Everything the driver remembers.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct State {
    pub volumes: BTreeMap<String, VolumeRecord>,
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    #[serde(default)]
    pub group_snapshots: BTreeMap<String, GroupSnapshotRecord>,
}

impl State {
    /// The volume created under `name`, if any.
    pub fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volumes.values().find(|v| v.name == name)
    }

    /// The snapshot created under `name` by CreateSnapshot, if any (group
    /// members have names of their own).
    pub fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots
            .values()
            .find(|s| s.group_snapshot_id.is_none() && s.name == name)
    }

    /// The group snapshot created under `name`, if any.
    pub fn group_by_name(&self, name: &str) -> Option<&GroupSnapshotRecord> {
        self.group_snapshots.values().find(|g| g.name == name)
    }

    /// Volumes attached to `node` (ControllerPublish).
    pub fn attached_to(&self, node: &str) -> usize {
        self.volumes
            .values()
            .filter(|v| v.attached.contains_key(node))
            .count()
    }
}

/// The state file plus the in-memory copy.
pub type Store = crate::common::Store<State>;
