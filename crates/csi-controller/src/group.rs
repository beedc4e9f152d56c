//! The GroupController RPCs (local data): members cut at one point in
//! time by the backend, recorded members first and group last, so the
//! startup settling finishes what a crash left half done.

use csi_driver::{CallContext, CsiError, CsiResult};
use csi_proto::v1::*;

use crate::backend::{ControllerBackend, GroupSnapshotBackend};
use crate::ids::IdKind;
use crate::records::{GroupSnapshotRecord, SnapshotRecord, VolumeRecord};
use crate::service::{ControllerService, not_found};
use crate::state::Res;
use crate::wire::{now_nanos, sorted};

impl<B: ControllerBackend> ControllerService<B> {
    fn group_cutter(&self) -> CsiResult<&dyn GroupSnapshotBackend> {
        (self.backend().group_snapshots())
            .filter(|_| self.catalog().is_none())
            .ok_or_else(|| CsiError::unimplemented("CreateVolumeGroupSnapshot"))
    }
}

impl<B: ControllerBackend> ControllerService<B> {
    pub(crate) async fn create_group_rpc(
        &self,
        _ctx: &CallContext,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> CsiResult<CreateVolumeGroupSnapshotResponse> {
        self.group_cutter()?;
        let mut claim = self.in_flight().claim(
            "CreateVolumeGroupSnapshot",
            &[(Res::GroupSnapshotName, &req.name)],
        )?;
        let existing = self.local()?.groups.by_name(&req.name);
        if let Some((g, members)) =
            existing.and_then(|g| self.local().ok()?.group_with_members(&g.id))
        {
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
        let plan: Vec<(SnapshotRecord, VolumeRecord)> = volumes
            .into_iter()
            .map(|v| {
                let snap = SnapshotRecord {
                    id: IdKind::Snapshot.generate(),
                    name: format!("{}-{}", req.name, v.id),
                    source_volume_id: v.id.clone(),
                    size_bytes: v.capacity_bytes,
                    access: v.access,
                    created_unix_nanos: created,
                    group_snapshot_id: Some(group_id.clone()),
                    parameters: sorted(&req.parameters),
                };
                (snap, v)
            })
            .collect();
        let ids: Vec<(Res, &str)> = plan
            .iter()
            .map(|(s, _)| (Res::Snapshot, s.id.as_str()))
            .collect();
        claim.also(&ids)?;
        let members: Vec<SnapshotRecord> = plan.iter().map(|(s, _)| s.clone()).collect();
        let record = GroupSnapshotRecord {
            id: group_id,
            name: req.name.clone(),
            source_volume_ids: req.source_volume_ids.clone(),
            snapshot_ids: members.iter().map(|s| s.id.clone()).collect(),
            parameters: sorted(&req.parameters),
            created_unix_nanos: created,
        };
        let (this, saved, cut) = (self.clone(), record.clone(), members.clone());
        self.run(claim, async move {
            let (cutter, t) = (this.group_cutter()?, this.local()?);
            cutter.cut_group(&plan).await?;
            if let Err(e) = t.save_group(&saved, &cut) {
                for s in &cut {
                    let _ = t.snapshots.remove(&s.id);
                    if let Some(snapshots) = this.backend().snapshots() {
                        let _ = snapshots.delete_snapshot(&s.id).await;
                    }
                }
                return Err(e);
            }
            Ok(())
        })
        .await?;
        tracing::info!(group = %record.id, volumes = ?record.source_volume_ids, "cut group snapshot");
        let messages = members.iter().map(SnapshotRecord::message).collect();
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(record.message(messages)),
        })
    }

    pub(crate) async fn delete_group_rpc(
        &self,
        _ctx: &CallContext,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> CsiResult<DeleteVolumeGroupSnapshotResponse> {
        let id = &req.group_snapshot_id;
        if !IdKind::GroupSnapshot.is_valid(id) {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        }
        let mut claim = self
            .in_flight()
            .claim("DeleteVolumeGroupSnapshot", &[(Res::GroupSnapshot, id)])?;
        let Some(g) = self.local()?.groups.get(id) else {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        };
        g.check_members(&req.snapshot_ids)?;
        // ABORTED while a volume is being restored from a member.
        let members: Vec<(Res, &str)> = g
            .snapshot_ids
            .iter()
            .map(|s| (Res::Snapshot, s.as_str()))
            .collect();
        claim.also(&members)?;
        let this = self.clone();
        self.run(claim, async move {
            // Records first, then data: a crash in between leaves data the
            // next start sweeps.
            for snap in this.local()?.remove_group(&g)? {
                if let Some(snapshots) = this.backend().snapshots() {
                    snapshots.delete_snapshot(&snap.id).await?;
                }
            }
            Ok(())
        })
        .await?;
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }

    pub(crate) async fn get_group_rpc(
        &self,
        _ctx: &CallContext,
        req: GetVolumeGroupSnapshotRequest,
    ) -> CsiResult<GetVolumeGroupSnapshotResponse> {
        let id = &req.group_snapshot_id;
        let (g, members) = IdKind::GroupSnapshot
            .is_valid(id)
            .then(|| self.local().ok()?.group_with_members(id))
            .flatten()
            .ok_or_else(|| not_found("group snapshot", id))?;
        g.check_members(&req.snapshot_ids)?;
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(g.message(members)),
        })
    }
}
