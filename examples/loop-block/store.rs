//! The driver's records, one crash-safe file each in csi-store tables under
//! the state directory, which the process locks for its life
//! ([`crate::common::state`]).
//!
//! Ordering rule that keeps crashes harmless: a backing file is created
//! before its record is saved, and a record is removed before its file. A
//! crash can leave a file with no record, which the next start removes
//! (logged), never a record without data.

use std::collections::BTreeMap;

use csi_store::FileStore;
use serde::{Deserialize, Serialize};

use crate::common::state::Tables;

pub use crate::common::{Access, Source};
use crate::tuning::Tuning;

/// A volume (a disk) the controller created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Its mutable parameters (CreateVolume, ControllerModifyVolume).
    #[serde(default)]
    pub tuning: Tuning,
}

/// A snapshot: a sparse copy of a disk's backing file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// Everything the driver remembers: one table per kind of record.
pub type Store = Tables<VolumeRecord, SnapshotRecord>;

/// Opens the tables in the locked state directory `files`.
pub fn open(files: &FileStore) -> Result<Store, String> {
    Tables::open(
        files,
        |v: &VolumeRecord| Some(v.name.as_str()),
        // Group members have names of their own.
        |s: &SnapshotRecord| s.group_snapshot_id.is_none().then_some(s.name.as_str()),
    )
}
