//! The service over local data, with its fakes (FakeControllerBackend, csi-store's FakeStore): repeat
//! rules, claims, capacity, full disks, the startup sweep and group settling.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use csi_controller::{Config, ControllerService, FakeControllerBackend, Res};
use csi_driver::{CallContext, Controller, CsiError, GroupController, Method, v1::*};
use csi_store::FakeStore;

type Mem = ControllerService<Arc<FakeControllerBackend>>;

const MIB: i64 = 1 << 20;

fn engine(config: Config) -> (Mem, Arc<FakeControllerBackend>, Arc<FakeStore>) {
    let store = Arc::new(FakeStore::new());
    let backend = Arc::new(FakeControllerBackend::new());
    let e = ControllerService::with_store(store.clone(), config, backend.clone()).unwrap();
    (e, backend, store)
}

fn ctx() -> CallContext {
    CallContext::detached(0, Method::CreateVolume)
}

fn create_req(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange::at_least(bytes)),
        volume_capabilities: vec![VolumeCapability::mount("")],
        ..Default::default()
    }
}

fn clone_req(name: &str, source: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_content_source: Some(csi_controller::ContentSource::Volume(source.into()).message()),
        ..create_req(name, MIB)
    }
}

async fn create(e: &Mem, req: CreateVolumeRequest) -> Result<Volume, CsiError> {
    Ok(e.create_volume(&ctx(), req).await?.volume.unwrap())
}

async fn delete(e: &Mem, id: &str) -> Result<(), CsiError> {
    let req = DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };
    e.delete_volume(&ctx(), req).await.map(drop)
}

async fn wait_idle(e: &Mem) {
    for _ in 0..500 {
        if e.in_flight().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("work never finished");
}

#[tokio::test]
async fn repeats_answer_the_same_volume_and_differences_are_already_exists() {
    let (e, b, _) = engine(Config::new("n1"));
    let v = create(&e, create_req("pvc", MIB)).await.unwrap();
    assert_eq!(create(&e, create_req("pvc", MIB)).await.unwrap(), v);
    let other = create(&e, create_req("pvc", 2 * MIB)).await.unwrap_err();
    assert!(matches!(other, CsiError::AlreadyExists(_)), "{other:?}");
    assert_eq!(b.data().made, 1);
    let snap = CreateSnapshotRequest {
        name: "s".into(),
        source_volume_id: v.volume_id.clone(),
        ..Default::default()
    };
    let s = e.create_snapshot(&ctx(), snap.clone()).await.unwrap();
    assert_eq!(e.create_snapshot(&ctx(), snap).await.unwrap(), s);
    let elsewhere = CreateSnapshotRequest {
        name: "s".into(),
        source_volume_id: "vol-00000000000000000000000000000000".into(),
        ..Default::default()
    };
    assert!(matches!(
        e.create_snapshot(&ctx(), elsewhere).await,
        Err(CsiError::AlreadyExists(_))
    ));
    // Ids the engine could not have made are NOT_FOUND, never touched.
    assert!(matches!(
        e.known_volume("../../etc"),
        Err(CsiError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_work_keeps_its_claims_and_finishes_once() {
    let (e, b, _) = engine(Config::new("n1"));
    let src = create(&e, create_req("src", MIB)).await.unwrap();
    b.pause();
    // The CO gives up on a slow clone: the call is dropped, the copy goes on.
    let slow = tokio::time::timeout(
        Duration::from_millis(50),
        create(&e, clone_req("c", &src.volume_id)),
    );
    assert!(slow.await.is_err(), "the clone was paused");
    assert_eq!(
        e.in_flight().running(Res::VolumeName, "c"),
        Some("CreateVolume")
    );
    let retry = create(&e, clone_req("c", &src.volume_id))
        .await
        .unwrap_err();
    assert!(matches!(retry, CsiError::Aborted(_)), "{retry:?}");
    // Its source is claimed too: deleting it meanwhile is ABORTED.
    assert!(matches!(
        delete(&e, &src.volume_id).await,
        Err(CsiError::Aborted(_))
    ));
    b.resume();
    wait_idle(&e).await;
    let done = create(&e, clone_req("c", &src.volume_id)).await.unwrap();
    assert!(e.tables().unwrap().volumes.contains(&done.volume_id));
    assert_eq!(b.data().made, 2, "the clone ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_over_commit() {
    let config = Config {
        capacity: 100 * MIB,
        ..Config::new("n1")
    };
    let (e, b, _) = engine(config);
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let e = e.clone();
            tokio::spawn(async move { create(&e, create_req(&format!("pvc-{i}"), 10 * MIB)).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => assert!(matches!(e, CsiError::ResourceExhausted(_)), "{e:?}"),
        }
    }
    assert_eq!(ok, 10);
    assert_eq!(e.ledger().used(), 100 * MIB);
    assert_eq!(b.data().volumes.len(), 10);
    let cap = e
        .get_capacity(&ctx(), GetCapacityRequest::default())
        .await
        .unwrap();
    assert_eq!(cap.available_capacity, 0);
}

#[tokio::test]
async fn a_full_disk_is_resource_exhausted_and_leaves_nothing() {
    let (e, b, store) = engine(Config::new("n1"));
    b.full.store(true, Ordering::SeqCst);
    let err = create(&e, create_req("a", MIB)).await.unwrap_err();
    assert!(matches!(err, CsiError::ResourceExhausted(_)), "{err:?}");
    b.full.store(false, Ordering::SeqCst);
    // The data is made but its record cannot be saved: the data goes.
    store.set_full(true);
    assert!(create(&e, create_req("b", MIB)).await.is_err());
    assert!(b.data().volumes.is_empty() && e.tables().unwrap().volumes.is_empty());
    assert_eq!(e.ledger().used(), 0);
    store.set_full(false);
    let v = create(&e, create_req("c", MIB)).await.unwrap();
    // Deletes still work on a full disk, so space can be freed.
    store.set_full(true);
    delete(&e, &v.volume_id).await.unwrap();
    assert!(b.data().volumes.is_empty());
}

#[tokio::test]
async fn volumes_in_use_or_attached_are_not_deleted() {
    let config = Config {
        attach_limit: 1,
        ..Config::new("n1")
    };
    let (e, _, _) = engine(config);
    let (a, b) = (
        create(&e, create_req("a", MIB)).await.unwrap(),
        create(&e, create_req("b", MIB)).await.unwrap(),
    );
    let publish = |id: &str| ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: "n1".into(),
        volume_capability: Some(VolumeCapability::mount("")),
        ..Default::default()
    };
    let published = e
        .controller_publish_volume(&ctx(), publish(&a.volume_id))
        .await
        .unwrap();
    // The backend's attach answers the publish context.
    assert_eq!(published.publish_context["volume"], a.volume_id);
    let full = e
        .controller_publish_volume(&ctx(), publish(&b.volume_id))
        .await;
    assert!(
        matches!(full, Err(CsiError::ResourceExhausted(_))),
        "attach limit"
    );
    let err = delete(&e, &a.volume_id).await.unwrap_err();
    assert!(matches!(err, CsiError::FailedPrecondition(_)), "{err:?}");
    let unpublish = ControllerUnpublishVolumeRequest {
        volume_id: a.volume_id.clone(),
        ..Default::default()
    };
    e.controller_unpublish_volume(&ctx(), unpublish)
        .await
        .unwrap();
    delete(&e, &a.volume_id).await.unwrap();
    delete(&e, &a.volume_id).await.unwrap();
}

#[tokio::test]
async fn the_startup_sweep_removes_unowned_data_and_keeps_unreadable_records_data() {
    let store = Arc::new(FakeStore::new());
    let backend = Arc::new(FakeControllerBackend::new());
    let first =
        ControllerService::with_store(store.clone(), Config::new("n1"), backend.clone()).unwrap();
    let kept = create(&first, create_req("kept", MIB)).await.unwrap();
    let damaged = create(&first, create_req("damaged", MIB)).await.unwrap();
    drop(first);
    let orphan = "vol-0123456789abcdef0123456789abcdef";
    backend.insert_volume(orphan, MIB);
    store.insert_unreadable("volumes", &damaged.volume_id, "bad bytes");
    let e = ControllerService::with_store(store, Config::new("n1"), backend.clone()).unwrap();
    e.reconcile().await.unwrap();
    let left: Vec<String> = backend.data().volumes.into_keys().collect();
    let mut want = vec![kept.volume_id.clone(), damaged.volume_id.clone()];
    want.sort();
    assert_eq!(left, want);
    // DeleteVolume of an id with data and no record removes the data.
    backend.insert_volume(orphan, MIB);
    delete(&e, orphan).await.unwrap();
    assert!(!backend.data().volumes.contains_key(orphan));
}

#[tokio::test]
async fn group_snapshots_left_half_saved_are_settled_at_start() {
    let (e, b, _) = engine(Config::new("n1"));
    let (v1, v2) = (
        create(&e, create_req("a", MIB)).await.unwrap(),
        create(&e, create_req("b", MIB)).await.unwrap(),
    );
    let req = CreateVolumeGroupSnapshotRequest {
        name: "g".into(),
        source_volume_ids: vec![v1.volume_id.clone(), v2.volume_id.clone()],
        ..Default::default()
    };
    let g = e
        .create_volume_group_snapshot(&ctx(), req.clone())
        .await
        .unwrap();
    let g = g.group_snapshot.unwrap();
    let again = e.create_volume_group_snapshot(&ctx(), req).await.unwrap();
    assert_eq!(again.group_snapshot.unwrap(), g, "a repeat");
    assert_eq!(b.data().snapshots.len(), 2);
    // A member alone cannot be deleted.
    let member = DeleteSnapshotRequest {
        snapshot_id: g.snapshots[0].snapshot_id.clone(),
        ..Default::default()
    };
    assert!(e.delete_snapshot(&ctx(), member).await.is_err());
    // A crash halfway through removing the group: one member record gone.
    e.tables()
        .unwrap()
        .snapshots
        .remove(&g.snapshots[0].snapshot_id)
        .unwrap();
    e.reconcile().await.unwrap();
    assert!(e.tables().unwrap().groups.is_empty() && e.tables().unwrap().snapshots.is_empty());
    assert!(b.data().snapshots.is_empty(), "the members' data went too");
}

/// A backend that tells the node where a volume is through its volume
/// context, as a network filesystem's controller does.
struct Addressed;

#[csi_driver::async_trait]
impl csi_controller::ControllerBackend for Addressed {
    async fn create_volume(
        &self,
        v: &mut csi_controller::VolumeRecord,
    ) -> csi_controller::BackendResult<()> {
        v.parameters
            .insert("source".into(), format!("//files/volumes/{}", v.id));
        Ok(())
    }
    async fn delete_volume(&self, _: &str) -> csi_controller::BackendResult<bool> {
        Ok(false)
    }
}

#[tokio::test]
async fn the_first_answer_carries_what_the_backend_added_to_the_volume_context() {
    let store = Arc::new(FakeStore::new());
    let e = ControllerService::with_store(store, Config::new("n1"), Addressed).unwrap();
    let req = create_req("pvc-1", MIB);
    let first = e.create_volume(&ctx(), req.clone()).await.unwrap();
    let volume = first.volume.clone().unwrap();
    assert_eq!(
        volume.volume_context.get("source"),
        Some(&format!("//files/volumes/{}", volume.volume_id))
    );
    let again = e.create_volume(&ctx(), req).await.unwrap();
    assert_eq!(again, first, "a repeat answers the same volume");
}
