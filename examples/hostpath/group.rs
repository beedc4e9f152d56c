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
use crate::common::state::Res;
use crate::common::{get_group_snapshot, group_with_members, remove_group, save_group};
use crate::driver::{HostPath, blocking};
use crate::store::{GroupSnapshotRecord, IdKind, SnapshotRecord};

impl HostPath {
    fn group_with_members(&self, id: &str) -> Option<(GroupSnapshotRecord, Vec<Snapshot>)> {
        group_with_members(
            &self.store.groups,
            &self.store.snapshots,
            id,
            Self::snapshot_message,
        )
    }
}

/// Copies every member while the volumes' filesystem is frozen: writes from
/// pods block for the duration, so the copies are one point in time. Nothing
/// here may write to the frozen filesystem (records are saved after the
/// thaw; copies go to the snapshot directory on another filesystem).
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
        let mut claim = self.in_flight.claim(
            "CreateVolumeGroupSnapshot",
            &[(Res::GroupSnapshotName, &req.name)],
        )?;
        if let Some(existing) = self.store.groups.by_name(&req.name) {
            existing.check_repeat(&req)?;
            let (g, snaps) = self.group_with_members(&existing.id).ok_or_else(|| {
                CsiError::Aborted(format!("group snapshot {} is changing", existing.id))
            })?;
            return Ok(CreateVolumeGroupSnapshotResponse {
                group_snapshot: Some(g.message(snaps)),
            });
        }
        // The members stay while they are copied.
        let sources: Vec<(Res, &str)> = req
            .source_volume_ids
            .iter()
            .map(|id| (Res::Volume, id.as_str()))
            .collect();
        claim.also(&sources)?;
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
        let ids: Vec<(Res, &str)> = cut.iter().map(|s| (Res::Snapshot, s.id.as_str())).collect();
        claim.also(&ids)?;
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
        let (this, plan, saved) = (self.clone(), cut.clone(), record.clone());
        blocking(move || {
            let _claim = claim;
            cut_consistently(&this.backend, &plan)?;
            let members: Vec<_> = plan.iter().map(|s| (s.id.clone(), s.clone())).collect();
            if let Err(e) = save_group(&this.store.groups, &this.store.snapshots, &saved, &members)
            {
                for s in &plan {
                    let _ = this.store.snapshots.remove(&s.id);
                    let _ = this.backend.delete_snapshot(&s.id, s.access);
                }
                return Err(e);
            }
            Ok(())
        })
        .await?;
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
        let mut claim = self.in_flight.claim(
            "DeleteVolumeGroupSnapshot",
            &[(Res::GroupSnapshot, &req.group_snapshot_id)],
        )?;
        // ABORTED while a volume is being restored from a member.
        if let Some(g) = self.store.groups.get(&req.group_snapshot_id) {
            let members: Vec<(Res, &str)> = g
                .snapshot_ids
                .iter()
                .map(|id| (Res::Snapshot, id.as_str()))
                .collect();
            claim.also(&members)?;
        }
        let this = self.clone();
        blocking(move || {
            let _claim = claim;
            // Records first, then data: a crash in between leaves data the
            // next start sweeps.
            let removed = remove_group(&this.store.groups, &this.store.snapshots, &req)?;
            for snap in removed {
                this.backend.delete_snapshot(&snap.id, snap.access)?;
            }
            Ok(())
        })
        .await?;
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
