//! Snapshots: copies of volumes, unique by name.

use super::{ApiError, Cloud, check_name, check_tags, paginate};
use crate::api::{CreateSnapshotRequest, PageRequest, Snapshot, SnapshotFilter, error_id};

impl Cloud {
    /// The snapshot with `id`.
    pub fn snapshot(&self, id: &str) -> Result<&Snapshot, ApiError> {
        self.snapshots
            .get(id)
            .ok_or_else(|| ApiError::not_found("snapshot", id))
    }

    /// Records a snapshot of `volume_id` with the provider-chosen `id`.
    pub fn create_snapshot(
        &mut self,
        volume_id: &str,
        req: &CreateSnapshotRequest,
        id: String,
        now: &str,
    ) -> Result<Snapshot, ApiError> {
        let volume = self.volume(volume_id)?;
        check_name("name", &req.name)?;
        check_tags(&req.tags)?;
        if self.snapshots.values().any(|s| s.name == req.name) {
            return Err(ApiError::new(
                409,
                error_id::NAME_TAKEN,
                format!("a snapshot named {:?} exists", req.name),
            ));
        }
        let snapshot = Snapshot {
            id: id.clone(),
            name: req.name.clone(),
            resource_id: volume.id.clone(),
            resource_type: "volume".to_owned(),
            regions: vec![volume.region.clone()],
            min_disk_size: volume.size_gigabytes,
            size_gigabytes: volume.size_gigabytes,
            tags: req.tags.clone(),
            created_at: now.to_owned(),
        };
        self.snapshots.insert(id, snapshot.clone());
        Ok(snapshot)
    }

    /// A page of snapshots, oldest first.
    pub fn list_snapshots(
        &self,
        filter: &SnapshotFilter,
        page: PageRequest,
    ) -> (Vec<Snapshot>, Option<u32>, u64) {
        let mut found: Vec<&Snapshot> = self
            .snapshots
            .values()
            .filter(|s| filter.name.as_ref().is_none_or(|n| *n == s.name))
            .filter(|s| {
                filter
                    .resource_id
                    .as_ref()
                    .is_none_or(|r| *r == s.resource_id)
            })
            .collect();
        found.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        paginate(found, page)
    }

    /// Deletes a snapshot (volumes made from it keep their data).
    pub fn delete_snapshot(&mut self, id: &str) -> Result<Snapshot, ApiError> {
        self.snapshots
            .remove(id)
            .ok_or_else(|| ApiError::not_found("snapshot", id))
    }
}
