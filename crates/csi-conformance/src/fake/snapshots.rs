//! The fake driver's snapshots (CreateSnapshot, DeleteSnapshot,
//! ListSnapshots, GetSnapshot), served through its Controller impl.

use csi_proto::v1::*;
use csi_server::helpers::idempotency::compare_snapshot;
use csi_server::helpers::paging::paginate;
use csi_server::{CsiError, CsiResult};

use super::state::Snap;
use super::{FakeDriver, Fault, now};

impl FakeDriver {
    pub(super) fn snapshot_create(
        &self,
        req: CreateSnapshotRequest,
    ) -> CsiResult<CreateSnapshotResponse> {
        self.check_name(&req.name)?;
        let mut st = self.lock();
        if let Some(s) = st.snapshots.values().find(|s| s.name == req.name) {
            compare_snapshot(&s.snapshot, &s.parameters, &req)?;
            return Ok(CreateSnapshotResponse {
                snapshot: Some(s.snapshot.clone()),
            });
        }
        let size = st
            .volumes
            .get(&req.source_volume_id)
            .map(|v| v.volume.capacity_bytes)
            .ok_or_else(|| self.missing_volume(&req.source_volume_id))?;
        let id = st.next_id("snap");
        let snapshot = Snapshot {
            size_bytes: size,
            snapshot_id: id.clone(),
            source_volume_id: req.source_volume_id,
            creation_time: Some(now()),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        };
        st.snapshots.insert(
            id,
            Snap {
                name: req.name,
                parameters: req.parameters,
                snapshot: snapshot.clone(),
            },
        );
        Ok(CreateSnapshotResponse {
            snapshot: Some(snapshot),
        })
    }

    pub(super) fn snapshot_delete(
        &self,
        req: DeleteSnapshotRequest,
    ) -> CsiResult<DeleteSnapshotResponse> {
        let mut st = self.lock();
        if st
            .snapshots
            .get(&req.snapshot_id)
            .is_some_and(|s| !s.snapshot.group_snapshot_id.is_empty())
        {
            return Err(CsiError::invalid(
                "snapshot_id",
                "the snapshot belongs to a group; delete the group snapshot",
            ));
        }
        let removed = st.snapshots.remove(&req.snapshot_id);
        if let Some(s) = removed.filter(|_| self.has(Fault::ListsDeleted)) {
            st.deleted_snapshots.push(s.snapshot);
        }
        Ok(DeleteSnapshotResponse {})
    }

    pub(super) fn snapshot_list(
        &self,
        req: ListSnapshotsRequest,
    ) -> CsiResult<ListSnapshotsResponse> {
        let st = self.lock();
        let source = req.source_volume_id.as_str();
        if self.has(Fault::UnknownSourceNotFound)
            && !source.is_empty()
            && !st.volumes.contains_key(source)
        {
            return Err(CsiError::NotFound(format!(
                "volume {source} does not exist"
            )));
        }
        let snapshots = st.snapshots.values().map(|s| &s.snapshot);
        let all: Vec<list_snapshots_response::Entry> = snapshots
            .chain(&st.deleted_snapshots)
            .filter(|s| req.snapshot_id.is_empty() || s.snapshot_id == req.snapshot_id)
            .filter(|s| source.is_empty() || s.source_volume_id == source)
            .map(|s| list_snapshots_response::Entry {
                snapshot: Some(Snapshot {
                    creation_time: s
                        .creation_time
                        .filter(|_| !self.has(Fault::ListedSnapshotsWithoutTime)),
                    ..s.clone()
                }),
            })
            .collect();
        let max = self.page_size(req.max_entries);
        let page = paginate(all, max, &req.starting_token)?;
        Ok(ListSnapshotsResponse {
            entries: page.entries,
            next_token: page.next_token,
        })
    }

    pub(super) fn snapshot_get(&self, req: GetSnapshotRequest) -> CsiResult<GetSnapshotResponse> {
        let st = self.lock();
        let s = st.snapshots.get(&req.snapshot_id).ok_or_else(|| {
            CsiError::NotFound(format!("snapshot {} does not exist", req.snapshot_id))
        })?;
        Ok(GetSnapshotResponse {
            snapshot: Some(s.snapshot.clone()),
        })
    }
}
