//! The driver's records, one crash-safe file each in csi-store tables under
//! the state directory, which the process locks for its life
//! ([`crate::common::state`]).
//!
//! Ordering rule that keeps crashes harmless: backing data is created before
//! its record is saved, and a record is removed before its backing data. A
//! crash can leave data with no record, which the next start removes
//! (logged), never a record without data.

use std::collections::BTreeMap;

use csi_server::CsiResult;
use csi_store::{CachedTable, FileStore, Table};
use serde::{Deserialize, Serialize};

use crate::common::state::{Tables, report_quarantined};

/// How a volume is accessed: a directory, bind-mounted (Mount), or a file
/// attached as a loop device and exposed as a device node (Block).
pub use crate::common::Access;
/// Where a volume's initial contents came from.
pub use crate::common::Source;

/// A volume the controller created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Created for an inline ephemeral volume by NodePublish.
    pub ephemeral: bool,
}

/// A snapshot of one volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// How many retired ephemeral volume names are remembered.
const RETIRED_EPHEMERAL_KEPT: usize = 1024;

/// Everything the driver remembers: the tables both drivers keep, and the
/// names of removed inline ephemeral volumes (with when), so a retried
/// NodeUnpublish stays OK (bounded).
pub struct Store {
    pub tables: Tables<VolumeRecord, SnapshotRecord>,
    pub retired_ephemeral: CachedTable<i128>,
}

impl std::ops::Deref for Store {
    type Target = Tables<VolumeRecord, SnapshotRecord>;

    fn deref(&self) -> &Self::Target {
        &self.tables
    }
}

impl Store {
    /// Opens the tables in the locked state directory `files`.
    pub fn open(files: FileStore) -> Result<Self, String> {
        let tables = Tables::open(
            &files,
            |v: &VolumeRecord| (!v.ephemeral).then_some(v.name.as_str()),
            |s: &SnapshotRecord| s.group_snapshot_id.is_none().then_some(s.name.as_str()),
        )?;
        let table = Table::new(&files, "retired_ephemeral").map_err(|e| e.to_string())?;
        let (retired_ephemeral, quarantined) =
            CachedTable::load(table).map_err(|e| e.to_string())?;
        report_quarantined(&quarantined);
        Ok(Self {
            tables,
            retired_ephemeral,
        })
    }

    /// Whether an existing volume `id` is attached or has snapshots;
    /// checked inside the update that removes its record (the node side
    /// is asked separately).
    pub fn in_use(&self, id: &str) -> Option<&'static str> {
        if self.attachments.contains_key(id) {
            return Some("is in use");
        }
        if self
            .snapshots
            .read(|all| all.values().any(|s| s.source_volume_id == id))
        {
            return Some("has snapshots; delete them first");
        }
        None
    }

    /// Records that the ephemeral volume `name` was removed, forgetting the
    /// oldest beyond the bound.
    pub fn retire_ephemeral(&self, name: &str) -> CsiResult<()> {
        self.retired_ephemeral
            .put(name, crate::common::now_nanos())?;
        while self.retired_ephemeral.len() > RETIRED_EPHEMERAL_KEPT {
            let oldest = self.retired_ephemeral.read(|all| {
                all.iter()
                    .min_by_key(|(_, when)| **when)
                    .map(|(n, _)| n.clone())
            });
            match oldest {
                Some(n) => self.retired_ephemeral.delete(&n)?,
                None => break,
            };
        }
        Ok(())
    }
}

pub use crate::common::IdKind;
