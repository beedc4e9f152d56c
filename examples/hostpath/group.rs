//! The GroupController service: write-order consistent group snapshots.
//!
//! The spec requires a group snapshot to be write-order consistent or to
//! fail. All volumes live on the state directory's filesystem, so freezing
//! it (FIFREEZE) stops every writer at one point in time while the members
//! are copied to the snapshot directory on another filesystem. The service
//! is offered only when that is possible: a dedicated filesystem for
//! `--statedir` (the root filesystem is never frozen) and a `--snapshotdir`
//! elsewhere.

use csi_proto::v1::*;
use csi_server::{CallContext, CsiError, CsiResult, GroupController};

use csi_kit::mount::freeze::FrozenFilesystem;

use crate::backend::Backend;
use crate::driver::{HostPath, blocking};
use crate::store::{GroupSnapshotRecord, IdKind, SnapshotRecord};

fn group_message(g: &GroupSnapshotRecord, snapshots: Vec<Snapshot>) -> VolumeGroupSnapshot {
    VolumeGroupSnapshot {
        group_snapshot_id: g.id.clone(),
        snapshots,
        creation_time: Some(prost_types::Timestamp {
            seconds: (g.created_unix_nanos / 1_000_000_000) as i64,
            nanos: (g.created_unix_nanos % 1_000_000_000) as i32,
        }),
        ready_to_use: true,
    }
}

impl HostPath {
    fn group_with_members(&self, id: &str) -> Option<(GroupSnapshotRecord, Vec<Snapshot>)> {
        self.store.read(|s| {
            let g = s.group_snapshots.get(id)?.clone();
            let snaps = g
                .snapshot_ids
                .iter()
                .filter_map(|sid| s.snapshots.get(sid))
                .map(Self::snapshot_message)
                .collect();
            Some((g, snaps))
        })
    }

    /// The spec asks the CO to send the member ids; a mismatch is INVALID_ARGUMENT.
    fn check_members(g: &GroupSnapshotRecord, ids: &[String]) -> CsiResult<()> {
        let mut given = ids.to_vec();
        let mut ours = g.snapshot_ids.clone();
        given.sort();
        ours.sort();
        if !ids.is_empty() && given != ours {
            return Err(CsiError::invalid(
                "snapshot_ids",
                format!("do not match the members of group snapshot {}", g.id),
            ));
        }
        Ok(())
    }
}

/// Copies every member while the volumes' filesystem is frozen: writes from
/// pods block for the duration, so the copies are one point in time. Nothing
/// here may write to the frozen filesystem (the state file is saved after
/// the thaw; copies go to the snapshot directory on another filesystem).
fn cut_consistently(backend: &Backend, plan: &[SnapshotRecord]) -> CsiResult<()> {
    let frozen = FrozenFilesystem::freeze(backend.root()).map_err(|e| {
        CsiError::FailedPrecondition(format!("cannot freeze the volumes' filesystem: {e}"))
    })?;
    let mut done: Vec<&SnapshotRecord> = Vec::new();
    for snap in plan {
        if let Err(e) = backend.snapshot(&snap.source_volume_id, &snap.id, snap.access) {
            drop(frozen);
            // Partial failure: remove what was cut (the spec's SHOULD).
            for s in &done {
                let _ = backend.delete_snapshot(&s.id, s.access);
            }
            return Err(e);
        }
        done.push(snap);
    }
    frozen
        .thaw()
        .map_err(|e| CsiError::Internal(format!("thawing the volumes' filesystem: {e}")))
}

#[csi_server::async_trait]
impl GroupController for HostPath {
    async fn create_volume_group_snapshot(
        &self,
        _ctx: &CallContext,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> CsiResult<CreateVolumeGroupSnapshotResponse> {
        let params: std::collections::BTreeMap<_, _> = req.parameters.clone().into_iter().collect();
        if let Some(existing) = self.store.read(|s| {
            s.group_snapshots
                .values()
                .find(|g| g.name == req.name)
                .cloned()
        }) {
            let mut a = existing.source_volume_ids.clone();
            let mut b = req.source_volume_ids.clone();
            a.sort();
            b.sort();
            if a != b || existing.parameters != params {
                return Err(CsiError::AlreadyExists(format!(
                    "group snapshot {:?} exists with other sources or parameters",
                    req.name
                )));
            }
            let (g, snaps) = self
                .group_with_members(&existing.id)
                .expect("group just read");
            return Ok(CreateVolumeGroupSnapshotResponse {
                group_snapshot: Some(group_message(&g, snaps)),
            });
        }
        let mut volumes = Vec::new();
        for id in &req.source_volume_ids {
            volumes.push(self.known_volume(id)?);
        }
        let group_id = IdKind::GroupSnapshot.generate();
        let cut: Vec<_> = volumes
            .iter()
            .map(|v| {
                Self::new_snapshot_record(v, &format!("{}-{}", req.name, v.id), Some(&group_id))
            })
            .collect();
        let (backend, plan) = (self.backend.clone(), cut.clone());
        blocking(move || cut_consistently(&backend, &plan)).await?;
        let record = GroupSnapshotRecord {
            id: group_id.clone(),
            name: req.name.clone(),
            source_volume_ids: req.source_volume_ids.clone(),
            snapshot_ids: cut.iter().map(|s| s.id.clone()).collect(),
            parameters: params,
            created_unix_nanos: cut
                .first()
                .map(|s| s.created_unix_nanos)
                .unwrap_or_default(),
        };
        self.store.update(|s| {
            for snap in &cut {
                s.snapshots.insert(snap.id.clone(), snap.clone());
            }
            s.group_snapshots.insert(group_id.clone(), record.clone());
            Ok(())
        })?;
        let snaps = cut.iter().map(Self::snapshot_message).collect();
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_message(&record, snaps)),
        })
    }

    async fn delete_volume_group_snapshot(
        &self,
        _ctx: &CallContext,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> CsiResult<DeleteVolumeGroupSnapshotResponse> {
        if !IdKind::GroupSnapshot.is_valid(&req.group_snapshot_id) {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        }
        let removed = self.store.update(|s| {
            let Some(g) = s.group_snapshots.get(&req.group_snapshot_id).cloned() else {
                return Ok(Vec::new());
            };
            Self::check_members(&g, &req.snapshot_ids)?;
            s.group_snapshots.remove(&g.id);
            Ok(g.snapshot_ids
                .iter()
                .filter_map(|id| s.snapshots.remove(id))
                .collect::<Vec<_>>())
        })?;
        for snap in removed {
            self.backend.delete_snapshot(&snap.id, snap.access)?;
        }
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }

    async fn get_volume_group_snapshot(
        &self,
        _ctx: &CallContext,
        req: GetVolumeGroupSnapshotRequest,
    ) -> CsiResult<GetVolumeGroupSnapshotResponse> {
        let (g, snaps) = IdKind::GroupSnapshot
            .is_valid(&req.group_snapshot_id)
            .then(|| self.group_with_members(&req.group_snapshot_id))
            .flatten()
            .ok_or_else(|| {
                CsiError::NotFound(format!(
                    "group snapshot {:?} does not exist",
                    req.group_snapshot_id
                ))
            })?;
        Self::check_members(&g, &req.snapshot_ids)?;
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(group_message(&g, snaps)),
        })
    }
}
