//! The fake driver's GroupController service: group snapshots, whose
//! members are ordinary snapshots.

use std::collections::HashSet;

use csi_proto::v1::*;
use csi_server::{CallContext, CsiError, CsiResult, GroupController};

use super::state::{Grp, Snap};
use super::{FakeDriver, Fault, now};

#[csi_server::async_trait]
impl GroupController for FakeDriver {
    async fn create_volume_group_snapshot(
        &self,
        _: &CallContext,
        req: CreateVolumeGroupSnapshotRequest,
    ) -> CsiResult<CreateVolumeGroupSnapshotResponse> {
        let mut sources = req.source_volume_ids.clone();
        sources.sort();
        let mut st = self.lock();
        if let Some(g) = st.groups.values().find(|g| g.name == req.name) {
            if g.sources == sources && g.params == req.parameters {
                return Ok(CreateVolumeGroupSnapshotResponse {
                    group_snapshot: Some(g.group.clone()),
                });
            }
            return Err(CsiError::AlreadyExists(format!(
                "group snapshot {} exists with other sources",
                req.name
            )));
        }
        if let Some(id) = sources.iter().find(|id| !st.volumes.contains_key(*id)) {
            return Err(self.missing_volume(id));
        }
        let gid = st.next_id("group");
        let time = now();
        let mut snapshots = Vec::new();
        for src in &sources {
            let sid = st.next_id("snap");
            let snapshot = Snapshot {
                size_bytes: st.volumes[src].volume.capacity_bytes,
                snapshot_id: sid.clone(),
                source_volume_id: src.clone(),
                creation_time: Some(time),
                ready_to_use: true,
                group_snapshot_id: gid.clone(),
            };
            st.snapshots.insert(
                sid.clone(),
                Snap {
                    name: format!("{}/{sid}", req.name),
                    parameters: req.parameters.clone(),
                    snapshot: snapshot.clone(),
                },
            );
            snapshots.push(snapshot);
        }
        let group = VolumeGroupSnapshot {
            group_snapshot_id: gid.clone(),
            snapshots,
            creation_time: Some(time),
            ready_to_use: true,
        };
        st.groups.insert(
            gid,
            Grp {
                name: req.name,
                sources,
                params: req.parameters,
                group: group.clone(),
            },
        );
        Ok(CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(group),
        })
    }

    async fn delete_volume_group_snapshot(
        &self,
        _: &CallContext,
        req: DeleteVolumeGroupSnapshotRequest,
    ) -> CsiResult<DeleteVolumeGroupSnapshotResponse> {
        if req.snapshot_ids.is_empty() && self.has(Fault::RequiresSnapshotIds) {
            return Err(CsiError::required("snapshot_ids"));
        }
        let mut st = self.lock();
        let Some(g) = st.groups.get(&req.group_snapshot_id) else {
            return Ok(DeleteVolumeGroupSnapshotResponse {});
        };
        let members: HashSet<String> = g
            .group
            .snapshots
            .iter()
            .map(|s| s.snapshot_id.clone())
            .collect();
        if !req.snapshot_ids.is_empty()
            && req.snapshot_ids.iter().cloned().collect::<HashSet<_>>() != members
        {
            return Err(CsiError::invalid(
                "snapshot_ids",
                "do not match the group snapshot",
            ));
        }
        st.snapshots.retain(|id, _| !members.contains(id));
        st.groups.remove(&req.group_snapshot_id);
        Ok(DeleteVolumeGroupSnapshotResponse {})
    }

    async fn get_volume_group_snapshot(
        &self,
        _: &CallContext,
        req: GetVolumeGroupSnapshotRequest,
    ) -> CsiResult<GetVolumeGroupSnapshotResponse> {
        if req.snapshot_ids.is_empty() && self.has(Fault::RequiresSnapshotIds) {
            return Err(CsiError::required("snapshot_ids"));
        }
        let st = self.lock();
        let g = st.groups.get(&req.group_snapshot_id).ok_or_else(|| {
            CsiError::NotFound(format!(
                "group snapshot {} does not exist",
                req.group_snapshot_id
            ))
        })?;
        let members: HashSet<&String> = g.group.snapshots.iter().map(|s| &s.snapshot_id).collect();
        if !req.snapshot_ids.is_empty()
            && req.snapshot_ids.iter().collect::<HashSet<_>>() != members
        {
            return Err(CsiError::invalid(
                "snapshot_ids",
                "do not match the group snapshot",
            ));
        }
        Ok(GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(g.group.clone()),
        })
    }
}
