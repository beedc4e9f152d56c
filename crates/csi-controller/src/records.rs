//! The controller's records and their tables: volumes, snapshots and group
//! snapshots by id (with name indexes), attachments, and the names of
//! removed inline ephemeral volumes; plus the import of the whole-file
//! `state.json` of earlier versions and the settling of group snapshots a
//! crash left half saved.
//!
//! Ordering rule that keeps crashes harmless: data is made before its
//! record is saved, and a record is removed before its data. A crash can
//! leave data with no record, which the startup sweep removes (logged),
//! never a record without data.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::sync::{Arc, Mutex};

use csi_driver::{CsiError, CsiResult};
use csi_proto::v1::{
    CreateVolumeGroupSnapshotRequest, Snapshot, Topology, Volume, VolumeGroupSnapshot,
};
use csi_store::{CachedTable, FileStore, RecordStore, StoreError, Table};
use serde::{Deserialize, Serialize};

use crate::access::{Access, ContentSource};
use crate::state::{Records, load_table};
use crate::wire::{sorted, timestamp, to_map};

/// A volume the controller created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Its id (`vol-…`).
    pub id: String,
    /// The CreateVolume name (for an inline ephemeral volume: the CO's id).
    pub name: String,
    /// Its size.
    pub capacity_bytes: i64,
    /// The access type it was created for.
    pub access: Access,
    /// What it was filled from.
    pub source: Option<ContentSource>,
    /// The CreateVolume parameters (returned as the volume context).
    pub parameters: BTreeMap<String, String>,
    /// Its mutable parameters (CreateVolume, ControllerModifyVolume).
    #[serde(default)]
    pub mutable_parameters: BTreeMap<String, String>,
    /// The topology segment it is accessible from (empty without topology).
    #[serde(default)]
    pub topology: BTreeMap<String, String>,
    /// The CreateVolume request without its secrets (encoded protobuf), for
    /// the idempotency comparison of a repeated CreateVolume.
    #[serde(default)]
    pub request: Vec<u8>,
    /// Created for an inline ephemeral volume by NodePublish.
    #[serde(default)]
    pub ephemeral: bool,
}

impl VolumeRecord {
    /// The wire form.
    pub fn message(&self) -> Volume {
        Volume {
            capacity_bytes: self.capacity_bytes,
            volume_id: self.id.clone(),
            volume_context: to_map(&self.parameters),
            content_source: self.source.as_ref().map(ContentSource::message),
            accessible_topology: if self.topology.is_empty() {
                Vec::new()
            } else {
                vec![Topology {
                    segments: to_map(&self.topology),
                }]
            },
        }
    }
}

/// A snapshot of one volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Its id (`snap-…`).
    pub id: String,
    /// The CreateSnapshot name.
    pub name: String,
    /// The volume it was cut from.
    pub source_volume_id: String,
    /// The source's size when it was cut.
    pub size_bytes: i64,
    /// The source's access type.
    pub access: Access,
    /// When it was cut.
    pub created_unix_nanos: i128,
    /// The group snapshot it was cut in (then only the group is deleted).
    #[serde(default)]
    pub group_snapshot_id: Option<String>,
    /// The CreateSnapshot parameters, for the idempotency comparison.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

impl SnapshotRecord {
    /// The wire form.
    pub fn message(&self) -> Snapshot {
        Snapshot {
            size_bytes: self.size_bytes,
            snapshot_id: self.id.clone(),
            source_volume_id: self.source_volume_id.clone(),
            creation_time: Some(timestamp(self.created_unix_nanos)),
            ready_to_use: true,
            group_snapshot_id: self.group_snapshot_id.clone().unwrap_or_default(),
        }
    }
}

/// A group snapshot: member snapshots cut at one point in time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSnapshotRecord {
    /// Its id (`group-…`).
    pub id: String,
    /// The CreateVolumeGroupSnapshot name.
    pub name: String,
    /// The volumes, in the order asked.
    pub source_volume_ids: Vec<String>,
    /// The members.
    pub snapshot_ids: Vec<String>,
    /// The request's parameters.
    pub parameters: BTreeMap<String, String>,
    /// When it was cut.
    pub created_unix_nanos: i128,
}

impl GroupSnapshotRecord {
    /// The wire form, with the members' messages.
    pub fn message(&self, snapshots: Vec<Snapshot>) -> VolumeGroupSnapshot {
        VolumeGroupSnapshot {
            group_snapshot_id: self.id.clone(),
            snapshots,
            creation_time: Some(timestamp(self.created_unix_nanos)),
            ready_to_use: true,
        }
    }

    /// A repeated CreateVolumeGroupSnapshot under this group's name must
    /// name the same volumes (in any order) and parameters.
    pub fn check_repeat(&self, req: &CreateVolumeGroupSnapshotRequest) -> CsiResult<()> {
        let mut ours = self.source_volume_ids.clone();
        let mut theirs = req.source_volume_ids.clone();
        ours.sort();
        theirs.sort();
        if ours != theirs || self.parameters != sorted(&req.parameters) {
            return Err(CsiError::AlreadyExists(format!(
                "group snapshot {:?} exists with other source volumes or parameters",
                req.name
            )));
        }
        Ok(())
    }

    /// `snapshot_ids` sent by the CO must be exactly the members (in any
    /// order); none sent is not a mismatch (proto3 cannot tell empty from absent).
    pub fn check_members(&self, ids: &[String]) -> CsiResult<()> {
        let mut given = ids.to_vec();
        let mut ours = self.snapshot_ids.clone();
        given.sort();
        ours.sort();
        if !ids.is_empty() && given != ours {
            return Err(CsiError::invalid(
                "snapshot_ids",
                format!("not the members of group snapshot {}", self.id),
            ));
        }
        Ok(())
    }
}

/// How many retired ephemeral volume names are remembered.
const RETIRED_EPHEMERAL_KEPT: usize = 1024;

/// Attachments of one volume: node → read-only.
pub type Attached = BTreeMap<String, bool>;

/// A driver's controller tables. (What the node staged and published is
/// csi-node's, in its own store.)
pub struct Tables {
    /// Volumes by id, indexed by name (inline ephemeral ones are not).
    pub volumes: Records<VolumeRecord>,
    /// Snapshots by id, indexed by name (group members are not).
    pub snapshots: Records<SnapshotRecord>,
    /// Group snapshots by id, indexed by name.
    pub groups: Records<GroupSnapshotRecord>,
    /// Volume id → the nodes it is ControllerPublished to. Its own record,
    /// so that the last unpublish is a delete, which works on a full disk.
    pub attachments: CachedTable<Attached>,
    /// Names of removed inline ephemeral volumes (with when), so a retried
    /// NodeUnpublish stays OK (bounded).
    pub retired_ephemeral: CachedTable<i128>,
    /// Held while ControllerPublish counts a node's attachments against an
    /// attach limit and records one more.
    attach_gate: Mutex<()>,
    /// Volumes whose records were set aside as unreadable: data kept.
    pub quarantined_volumes: BTreeSet<String>,
    /// Snapshots whose records were set aside as unreadable: data kept.
    pub quarantined_snapshots: BTreeSet<String>,
}

impl Tables {
    /// Loads every table of `store` and logs the records set aside.
    pub fn open(store: Arc<dyn RecordStore>) -> Result<Self, StoreError> {
        let keys = |t: &str| -> Result<BTreeSet<String>, StoreError> {
            Ok(store.quarantined_keys(t)?.into_iter().collect())
        };
        let tables = Self {
            volumes: Records::load(&store, "volumes", |v: &VolumeRecord| {
                (!v.ephemeral).then_some(v.name.as_str())
            })?,
            snapshots: Records::load(&store, "snapshots", |s: &SnapshotRecord| {
                s.group_snapshot_id.is_none().then_some(s.name.as_str())
            })?,
            groups: Records::load(&store, "group_snapshots", |g: &GroupSnapshotRecord| {
                Some(g.name.as_str())
            })?,
            attachments: load_table(&store, "attachments")?,
            retired_ephemeral: load_table(&store, "retired_ephemeral")?,
            attach_gate: Mutex::new(()),
            quarantined_volumes: keys("volumes")?,
            quarantined_snapshots: keys("snapshots")?,
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
            tables.attachments.delete(&id)?;
        }
        Ok(tables)
    }

    /// ControllerPublish's bookkeeping: records that `volume_id` (which
    /// must exist: NOT_FOUND otherwise) is attached to `node`. A repeat
    /// with the same read-only flag is OK, another flag ALREADY_EXISTS, a
    /// second node for a single-node capability FAILED_PRECONDITION, a
    /// node at its attach `limit` (0 = none) RESOURCE_EXHAUSTED.
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
            self.attachments
                .read(|all| all.values().filter(|n| n.contains_key(node)).count())
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
                if let Some(was) = nodes.get(node) {
                    if *was != readonly {
                        return Err(CsiError::AlreadyExists(format!(
                            "volume {volume_id} is published to {node} with readonly={was}"
                        )));
                    }
                } else if let Some(other) = nodes.keys().next().filter(|_| !multi_node) {
                    return Err(CsiError::FailedPrecondition(format!(
                        "volume {volume_id} is published to node {other}"
                    )));
                } else if limit > 0 && attached_here as i64 >= limit {
                    return Err(CsiError::ResourceExhausted(format!(
                        "node {node} has reached its limit of {limit} attached volumes"
                    )));
                }
                nodes.insert(node.to_owned(), readonly);
                *slot = Some(nodes);
                Ok::<_, CsiError>(())
            })
        })
    }

    /// ControllerUnpublish's bookkeeping: an empty node id detaches from
    /// every node; a volume or node that is not attached is fine. The last
    /// node's removal deletes the record, which works on a full disk.
    pub fn detach(&self, volume_id: &str, node: &str) -> CsiResult<()> {
        self.attachments.update(volume_id, |slot| {
            if let Some(nodes) = slot {
                if node.is_empty() {
                    nodes.clear();
                } else {
                    nodes.remove(node);
                }
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

    /// Records that the ephemeral volume `name` was removed, forgetting the
    /// oldest beyond the bound.
    pub fn retire_ephemeral(&self, name: &str) -> CsiResult<()> {
        self.retired_ephemeral.put(name, crate::wire::now_nanos())?;
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

    /// A group and its members' messages.
    pub fn group_with_members(&self, id: &str) -> Option<(GroupSnapshotRecord, Vec<Snapshot>)> {
        let g = self.groups.get(id)?;
        let members = g
            .snapshot_ids
            .iter()
            .filter_map(|sid| self.snapshots.get(sid))
            .map(|s| s.message())
            .collect();
        Some((g, members))
    }

    /// Saves a new group snapshot: its members first, then the group, so a
    /// crash in between leaves members without a group, which
    /// [`Self::settle_groups`] removes at the next start.
    pub fn save_group(
        &self,
        group: &GroupSnapshotRecord,
        members: &[SnapshotRecord],
    ) -> CsiResult<()> {
        for snap in members {
            self.snapshots.put(&snap.id, snap.clone())?;
        }
        self.groups.put(&group.id, group.clone())?;
        Ok(())
    }

    /// Removes a group snapshot's records: the members first, then the
    /// group (a crash in between leaves a group missing members, which
    /// [`Self::settle_groups`] finishes removing); returns the members so
    /// their data can be removed after.
    pub fn remove_group(&self, g: &GroupSnapshotRecord) -> CsiResult<Vec<SnapshotRecord>> {
        let mut removed = Vec::new();
        for id in &g.snapshot_ids {
            removed.extend(self.snapshots.remove(id)?);
        }
        self.groups.remove(&g.id)?;
        Ok(removed)
    }

    /// Startup check after a crash in the middle of saving or removing a
    /// group snapshot: a group missing a member (none of them quarantined)
    /// and members of a group that does not exist are removed. Returns the
    /// removed snapshots, whose data goes too.
    pub fn settle_groups(&self) -> CsiResult<Vec<SnapshotRecord>> {
        let broken: Vec<GroupSnapshotRecord> = self.groups.read(|all| {
            all.values()
                .filter(|g| {
                    g.snapshot_ids.iter().any(|id| {
                        !self.snapshots.contains(id) && !self.quarantined_snapshots.contains(id)
                    })
                })
                .cloned()
                .collect()
        });
        let mut removed = Vec::new();
        for g in broken {
            tracing::warn!(group = %g.id, "group snapshot left half saved or half removed by a crash; removing it");
            removed.extend(self.remove_group(&g)?);
        }
        let strays: Vec<String> = self.snapshots.read(|all| {
            all.iter()
                .filter(|(_, s)| {
                    s.group_snapshot_id
                        .as_deref()
                        .is_some_and(|g| !self.groups.contains(g))
                })
                .map(|(id, _)| id.clone())
                .collect()
        });
        for id in strays {
            tracing::warn!(snapshot = %id, "member of a group snapshot that was never saved; removing it");
            removed.extend(self.snapshots.remove(&id)?);
        }
        Ok(removed)
    }
}

/// The whole-file state of earlier versions (`state.json`).
#[derive(Deserialize)]
struct LegacyState {
    /// Kept as JSON: the attachments inside them move to their own table.
    volumes: BTreeMap<String, serde_json::Value>,
    snapshots: BTreeMap<String, SnapshotRecord>,
    #[serde(default)]
    group_snapshots: BTreeMap<String, GroupSnapshotRecord>,
    /// Node-side records of older versions: csi-node keeps its own now.
    #[serde(default)]
    staged: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    retired_ephemeral: Vec<String>,
}

/// The state file an earlier version kept in the state directory.
pub const LEGACY_STATE: &str = "state.json";

/// Moves the records of an earlier version's `state.json` into the tables
/// and renames the file `state.json.imported`: without this an upgrade
/// would find every volume's data unrecorded and sweep it. Repeating an
/// interrupted import rewrites the same records.
pub fn import_state_file(store: &FileStore) -> Result<(), String> {
    let path = store.dir().join(LEGACY_STATE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("reading {}: {e}", path.display())),
    };
    let fail = |e: &dyn std::fmt::Display| format!("importing {}: {e}", path.display());
    let legacy: LegacyState = serde_json::from_slice(&bytes).map_err(|e| fail(&e))?;
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
    for (id, mut value) in legacy.volumes {
        if let Some(fields) = value.as_object_mut() {
            for key in ["published_nodes", "attached"] {
                let nodes: Option<Attached> = fields
                    .remove(key)
                    .and_then(|v| serde_json::from_value(v).ok());
                if let Some(nodes) = nodes.filter(|n| !n.is_empty()) {
                    attachments.insert(id.clone(), nodes);
                }
            }
        }
        let volume: VolumeRecord = serde_json::from_value(value).map_err(|e| fail(&e))?;
        volumes.insert(id, volume);
    }
    fn put_all<T: Serialize + serde::de::DeserializeOwned>(
        store: &FileStore,
        table: &str,
        items: &BTreeMap<String, T>,
    ) -> Result<(), StoreError> {
        let table = Table::<T>::new(store, table)?;
        items
            .iter()
            .try_for_each(|(key, value)| table.put(key, value))
    }
    let retired: BTreeMap<String, i128> = (legacy.retired_ephemeral.iter().cloned())
        .zip(0..)
        .collect();
    (|| {
        put_all(store, "volumes", &volumes)?;
        put_all(store, "attachments", &attachments)?;
        put_all(store, "snapshots", &legacy.snapshots)?;
        put_all(store, "group_snapshots", &legacy.group_snapshots)?;
        put_all(store, "retired_ephemeral", &retired)
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
