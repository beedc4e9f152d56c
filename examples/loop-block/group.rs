//! The GroupController service: write-order consistent group snapshots.
//!
//! The spec requires a group snapshot to be write-order consistent or to
//! fail. A member nobody has attached has no writer: its backing file is
//! copied as it is. A member in use through a filesystem (mount access,
//! staged on this host) is frozen (FIFREEZE on its staging mount): that
//! flushes what pods wrote through the loop device into the backing file
//! and blocks further writes until the thaw. Every member is frozen before
//! the first copy and thawed after the last, so all copies are one point in
//! time. A member attached as a raw block device cannot be frozen (no
//! filesystem of ours is on it), so a group including one is refused with
//! FAILED_PRECONDITION, as is any member attached without its filesystem
//! mounted where the record says.

use std::path::PathBuf;

use csi_proto::v1::*;
use csi_server::{CallContext, CsiError, CsiResult, GroupController};
use mount_utils::freeze::FrozenFilesystem;

use crate::backend::Backend;
use crate::common::state::Res;
use crate::common::{
    GroupSnapshotRecord, IdKind, blocking, get_group_snapshot, group_with_members, now_nanos,
    remove_group, save_group, sorted,
};
use crate::driver::LoopBlock;
use crate::store::{SnapshotRecord, VolumeRecord};

/// How a member is written to right now.
enum Writer {
    /// Not attached: nothing can write to it.
    Nobody,
    /// Through the filesystem mounted at this staging path.
    Filesystem(PathBuf),
}

impl LoopBlock {
    fn group_with_members(&self, id: &str) -> Option<(GroupSnapshotRecord, Vec<Snapshot>)> {
        group_with_members(
            &self.store.groups,
            &self.store.snapshots,
            id,
            Self::snapshot_message,
        )
    }

    /// Who writes to `volume` and how to stop them, or why nobody can be
    /// stopped.
    fn writer_of(&self, volume: &VolumeRecord) -> CsiResult<Writer> {
        let image = self.backend.volume_path(&volume.id);
        let devices = mount_utils::loopdev::find_by_backing_file(&image)
            .map_err(|e| CsiError::Internal(format!("looking up loop devices: {e}")))?;
        let Some(device) = devices.first() else {
            return Ok(Writer::Nobody);
        };
        let stage = self.node.volumes().record(&volume.id).and_then(|r| r.stage);
        let Some(staged) = stage.filter(|s| !s.capability.is_block()) else {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is attached as a raw block device, which cannot be frozen: \
                 a group snapshot of it would not be write-order consistent",
                volume.id
            )));
        };
        // The staging path must be the filesystem on this very device.
        if !mounted_from(&staged.path, device) {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is attached but its filesystem is not mounted at {}; cannot freeze it",
                volume.id,
                staged.path.display()
            )));
        }
        Ok(Writer::Filesystem(staged.path))
    }
}

/// Whether the filesystem at `path` lives on block device `device`.
fn mounted_from(path: &std::path::Path, device: &std::path::Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    match (std::fs::metadata(path), std::fs::metadata(device)) {
        (Ok(at), Ok(dev)) => dev.file_type().is_block_device() && at.dev() == dev.rdev(),
        _ => false,
    }
}

/// Freezes every member in use, copies every member, thaws. Copies go to
/// the state directory, never to a frozen filesystem; a failure removes
/// the copies already made.
fn cut_consistently(backend: &Backend, plan: &[(SnapshotRecord, Writer)]) -> CsiResult<()> {
    let mut frozen = Vec::new();
    for (snap, writer) in plan {
        if let Writer::Filesystem(staging) = writer {
            let f = FrozenFilesystem::freeze(staging).map_err(|e| {
                CsiError::FailedPrecondition(format!(
                    "cannot freeze the filesystem of volume {}: {e}",
                    snap.source_volume_id
                ))
            })?;
            frozen.push(f);
        }
    }
    for (i, (snap, _)) in plan.iter().enumerate() {
        if let Err(e) = backend.snapshot(&snap.source_volume_id, &snap.id) {
            drop(frozen);
            for (done, _) in &plan[..i] {
                let _ = backend.delete_snapshot(&done.id);
            }
            return Err(e);
        }
    }
    for f in frozen {
        f.thaw()
            .map_err(|e| CsiError::Internal(format!("thawing a member's filesystem: {e}")))?;
    }
    Ok(())
}

#[csi_server::async_trait]
impl GroupController for LoopBlock {
    async fn create_volume_group_snapshot(
        &self,
        _ctx: &CallContext,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> CsiResult<CreateVolumeGroupSnapshotResponse> {
        let mut claim = self.in_flight.claim(
            "CreateVolumeGroupSnapshot",
            &[(Res::GroupSnapshotName, &req.name)],
        )?;
        let existing = self.store.groups.by_name(&req.name).map(|g| g.id);
        if let Some((g, members)) = existing.and_then(|id| self.group_with_members(&id)) {
            g.check_repeat(&req)?;
            return Ok(CreateVolumeGroupSnapshotResponse {
                group_snapshot: Some(g.message(members)),
            });
        }
        let mut volumes: Vec<VolumeRecord> = Vec::new();
        for id in &req.source_volume_ids {
            if volumes.iter().any(|v| &v.id == id) {
                return Err(CsiError::invalid(
                    "source_volume_ids",
                    format!("volume {id} is listed twice"),
                ));
            }
            // The members stay while they are copied.
            claim.also(&[(Res::Volume, id)])?;
            volumes.push(self.known_volume(id)?);
        }
        let group_id = IdKind::GroupSnapshot.generate();
        let created = now_nanos();
        let members: Vec<SnapshotRecord> = volumes
            .iter()
            .map(|v| SnapshotRecord {
                id: IdKind::Snapshot.generate(),
                name: format!("{}/{}", req.name, v.id),
                source_volume_id: v.id.clone(),
                size_bytes: v.capacity_bytes,
                access: v.access,
                created_unix_nanos: created,
                parameters: sorted(&req.parameters),
                group_snapshot_id: Some(group_id.clone()),
            })
            .collect();
        let ids: Vec<(Res, &str)> = members
            .iter()
            .map(|s| (Res::Snapshot, s.id.as_str()))
            .collect();
        claim.also(&ids)?;
        let record = GroupSnapshotRecord {
            id: group_id,
            name: req.name.clone(),
            source_volume_ids: req.source_volume_ids.clone(),
            snapshot_ids: members.iter().map(|s| s.id.clone()).collect(),
            parameters: sorted(&req.parameters),
            created_unix_nanos: created,
        };
        {
            // No member gets attached or detached while the cut is planned and made.
            let _exclusive = self.attachments.write().await;
            let mut plan = Vec::new();
            for (snap, volume) in members.iter().zip(&volumes) {
                plan.push((snap.clone(), self.writer_of(volume)?));
            }
            let (this, saved) = (self.clone(), record.clone());
            blocking(move || {
                let _claim = claim;
                cut_consistently(&this.backend, &plan)?;
                let members: Vec<_> = plan
                    .iter()
                    .map(|(s, _)| (s.id.clone(), s.clone()))
                    .collect();
                if let Err(e) =
                    save_group(&this.store.groups, &this.store.snapshots, &saved, &members)
                {
                    for (s, _) in &plan {
                        let _ = this.store.snapshots.remove(&s.id);
                        let _ = this.backend.delete_snapshot(&s.id);
                    }
                    return Err(e);
                }
                Ok(())
            })
            .await?;
        }
        tracing::info!(group = %record.id, volumes = ?record.source_volume_ids, "cut group snapshot");
        let messages = members.iter().map(Self::snapshot_message).collect();
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(record.message(messages)),
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
        // ABORTED while a disk is being restored from a member.
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
            // Records first, then data: a crash in between leaves copies the
            // next start removes.
            let removed = remove_group(&this.store.groups, &this.store.snapshots, &req)?;
            removed
                .iter()
                .try_for_each(|snap| this.backend.delete_snapshot(&snap.id))
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
