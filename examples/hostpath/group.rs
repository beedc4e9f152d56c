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
use crate::common::{get_group_snapshot, group_with_members, remove_group};
use crate::driver::{HostPath, blocking};
use crate::store::{GroupSnapshotRecord, IdKind, SnapshotRecord};

impl HostPath {
    fn group_with_members(&self, id: &str) -> Option<(GroupSnapshotRecord, Vec<Snapshot>)> {
        self.store.read(|s| {
            group_with_members(&s.group_snapshots, &s.snapshots, id, Self::snapshot_message)
        })
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
            existing.check_repeat(&req)?;
            let (g, snaps) = self
                .group_with_members(&existing.id)
                .expect("group just read");
            return Ok(CreateVolumeGroupSnapshotResponse {
                group_snapshot: Some(g.message(snaps)),
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
            group_snapshot: Some(record.message(snaps)),
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
        let removed = self
            .store
            .update(|s| remove_group(&mut s.group_snapshots, &mut s.snapshots, &req))?;
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
        get_group_snapshot(&req, |id| self.group_with_members(id))
    }
}
