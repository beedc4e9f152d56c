//! DeleteVolumeGroupSnapshot under a fault between a member's record and
//! its data: the CO's retry must finish the delete, leaking no data (a
//! violation csi-sim found).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use csi_controller::{
    BackendResult, Config, ControllerBackend, ControllerService, DataOnDisk, FakeControllerBackend,
    GroupSnapshotBackend, SnapshotBackend, SnapshotRecord, VolumeRecord,
};
use csi_driver::{CallContext, Controller, CsiError, GroupController, Method, async_trait, v1::*};
use csi_store::FakeStore;

/// A [`FakeControllerBackend`] whose next snapshot delete fails with an
/// I/O error.
struct FailingDelete {
    inner: FakeControllerBackend,
    fail_next: AtomicBool,
}

#[async_trait]
impl ControllerBackend for FailingDelete {
    async fn create_volume(&self, volume: &mut VolumeRecord) -> BackendResult<()> {
        self.inner.create_volume(volume).await
    }
    async fn delete_volume(&self, id: &str) -> BackendResult<bool> {
        self.inner.delete_volume(id).await
    }
    fn snapshots(&self) -> Option<&dyn SnapshotBackend> {
        Some(self)
    }
    fn group_snapshots(&self) -> Option<&dyn GroupSnapshotBackend> {
        self.inner.group_snapshots()
    }
    fn data(&self) -> DataOnDisk {
        ControllerBackend::data(&self.inner)
    }
}

#[async_trait]
impl SnapshotBackend for FailingDelete {
    async fn create_snapshot(&self, snapshot: &mut SnapshotRecord) -> BackendResult<()> {
        self.inner.create_snapshot(snapshot).await
    }
    async fn delete_snapshot(&self, id: &str) -> BackendResult<bool> {
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(CsiError::Internal("removing snapshot data: I/O error".into()).into());
        }
        self.inner.delete_snapshot(id).await
    }
}

fn ctx() -> CallContext {
    CallContext::detached(0, Method::CreateVolume)
}

#[tokio::test]
async fn a_group_delete_that_fails_between_a_members_record_and_its_data_leaks_nothing() {
    let backend = Arc::new(FailingDelete {
        inner: FakeControllerBackend::new(),
        fail_next: AtomicBool::new(false),
    });
    let store = Arc::new(FakeStore::new());
    let e = ControllerService::with_store(store, Config::new("n1"), backend.clone()).unwrap();
    let mut sources = Vec::new();
    for name in ["a", "b"] {
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange::at_least(1 << 20)),
            volume_capabilities: vec![VolumeCapability::mount("")],
            ..Default::default()
        };
        let volume = e.create_volume(&ctx(), req).await.unwrap().volume.unwrap();
        sources.push(volume.volume_id);
    }
    let req = CreateVolumeGroupSnapshotRequest {
        name: "g".into(),
        source_volume_ids: sources,
        ..Default::default()
    };
    let g = e.create_volume_group_snapshot(&ctx(), req).await.unwrap();
    let id = g.group_snapshot.unwrap().group_snapshot_id;
    assert_eq!(backend.inner.data().snapshots.len(), 2);
    let delete = DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.clone(),
        ..Default::default()
    };
    backend.fail_next.store(true, Ordering::SeqCst);
    let failed = e.delete_volume_group_snapshot(&ctx(), delete.clone()).await;
    assert!(failed.is_err(), "the fault is reported: {failed:?}");
    // The first member's record is gone, its data is not: the group stays
    // for the CO's retry, which finishes the delete.
    assert!(e.tables().unwrap().groups.contains(&id));
    assert_eq!(backend.inner.data().snapshots.len(), 2);
    e.delete_volume_group_snapshot(&ctx(), delete.clone())
        .await
        .unwrap();
    let tables = e.tables().unwrap();
    assert!(tables.groups.is_empty() && tables.snapshots.is_empty());
    assert!(
        backend.inner.data().snapshots.is_empty(),
        "no member's data is left: {:?}",
        backend.inner.data()
    );
    // Another retry is still OK.
    e.delete_volume_group_snapshot(&ctx(), delete)
        .await
        .unwrap();
}
