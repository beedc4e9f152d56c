//! The GroupController service: group snapshots cut while the driver holds
//! the member volumes still.
//!
//! Consistency: every member is synced (syncfs) and then copied in turn while
//! the group's volumes are locked against other CSI operations. Writes that
//! pods issue during the cut are not frozen, because a directory volume
//! shares the host filesystem and freezing it would freeze the host.

use csi_proto::v1::*;
use csi_server::{CallContext, CsiError, CsiResult, GroupController};

use crate::driver::HostPath;
use crate::store::{GroupSnapshotRecord, IdKind, VolumeRecord};

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

fn sync_volume(host: &HostPath, v: &VolumeRecord) {
    if let Ok(f) = std::fs::File::open(host.backend.volume_path(&v.id, v.access)) {
        let _ = nix::unistd::syncfs(&f);
    }
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
        for v in &volumes {
            sync_volume(self, v);
        }
        let group_id = IdKind::GroupSnapshot.generate();
        let mut cut = Vec::new();
        for v in &volumes {
            match self
                .cut_snapshot(v, &format!("{}-{}", req.name, v.id), Some(&group_id))
                .await
            {
                Ok(s) => cut.push(s),
                Err(e) => {
                    // Partial failure: remove what was cut (the spec's SHOULD).
                    for s in &cut {
                        let _ = self.backend.delete_snapshot(&s.id, s.access);
                    }
                    return Err(e);
                }
            }
        }
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
