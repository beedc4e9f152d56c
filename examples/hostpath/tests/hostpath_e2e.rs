//! End-to-end behaviour of the hostpath example beyond the conformance
//! suite: idempotency with the mount table, security of ids and fields,
//! inline ephemeral volumes, restart reconciliation, and crash safety under
//! SIGKILL. Runs as root in a private mount namespace per test.
//!
//! One file over 700 lines: each test shares the driver-process setup at
//! its top, and splitting them would only spread that setup.

use e2e_support as support;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use csi_client::CsiClient;
use csi_node::testing::requests;
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use mount_utils::require_root;
use support::{
    Driver, assert_one_point_in_time, calls, mounts_under, run_isolated, spawn_ordered_writer,
};
use tonic::Code;

/// The driver under test, built by cargo for this package's tests.
const HOSTPATH: &str = env!("CARGO_BIN_EXE_hostpath");

const MARKER: &str = "SECRET-MARKER-e2e-91c3";

fn secrets() -> HashMap<String, String> {
    [("password".to_string(), MARKER.to_string())].into()
}

fn mount_cap() -> VolumeCapability {
    VolumeCapability::mount("").with_access_mode(Mode::SingleNodeWriter)
}

fn block_cap() -> VolumeCapability {
    VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter)
}

async fn create(
    client: &CsiClient,
    name: &str,
    cap: VolumeCapability,
) -> Result<Volume, tonic::Status> {
    let req = CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange::at_least(8 << 20)),
        volume_capabilities: vec![cap],
        secrets: secrets(),
        ..Default::default()
    };
    calls::try_create_volume(client, req).await
}

fn stage_req(id: &str, staging: &Path, cap: VolumeCapability) -> NodeStageVolumeRequest {
    let secrets = secrets();
    NodeStageVolumeRequest {
        secrets,
        ..requests::stage_req(id, staging, cap)
    }
}

fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: VolumeCapability,
) -> NodePublishVolumeRequest {
    let secrets = secrets();
    NodePublishVolumeRequest {
        secrets,
        ..requests::publish_req(id, staging, target, cap)
    }
}

/// Tears a staged and published volume down and deletes it.
/// Makes `staging` and the parent of `target`, then stages and publishes
/// mount volume `id` there.
async fn stage_and_publish(client: &CsiClient, id: &str, staging: &Path, target: &Path) {
    std::fs::create_dir_all(staging).unwrap();
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    client
        .node()
        .node_stage_volume(stage_req(id, staging, mount_cap()))
        .await
        .unwrap();
    client
        .node()
        .node_publish_volume(publish_req(id, staging, target, mount_cap()))
        .await
        .unwrap();
}

async fn unpublish_unstage_delete(client: &CsiClient, id: &str, staging: &Path, target: &Path) {
    calls::node_unpublish(client, id, target).await;
    calls::node_unstage(client, id, staging).await;
    calls::delete_volume(client, id).await;
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn every_rpc_repeated_ten_times_gives_one_result_and_one_mount() {
    require_root!("every_rpc_repeated_ten_times_gives_one_result_and_one_mount");
    run_isolated("hostpath-idempotency", || async {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start(HOSTPATH, &dir.path().join("state"), &[]);
        let client = driver.client().await;
        let (staging, target) = (dir.path().join("staging"), dir.path().join("pods/target"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();

        let ids: BTreeSet<String> = {
            let mut ids = BTreeSet::new();
            for _ in 0..10 {
                ids.insert(
                    create(&client, "pvc-repeat", mount_cap())
                        .await
                        .unwrap()
                        .volume_id,
                );
            }
            ids
        };
        assert_eq!(
            ids.len(),
            1,
            "CreateVolume returned different volumes: {ids:?}"
        );
        let id = ids.into_iter().next().unwrap();
        for _ in 0..10 {
            client
                .node()
                .node_stage_volume(stage_req(&id, &staging, mount_cap()))
                .await
                .unwrap();
        }
        for _ in 0..10 {
            client
                .node()
                .node_publish_volume(publish_req(&id, &staging, &target, mount_cap()))
                .await
                .unwrap();
        }
        let mounts = mounts_under(dir.path());
        assert_eq!(
            mounts.iter().filter(|m| **m == staging).count(),
            1,
            "{mounts:?}"
        );
        assert_eq!(
            mounts.iter().filter(|m| **m == target).count(),
            1,
            "{mounts:?}"
        );
        std::fs::write(target.join("data"), b"written through the publish").unwrap();
        for _ in 0..10 {
            let req = NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.to_string_lossy().into(),
            };
            client.node().node_unpublish_volume(req).await.unwrap();
        }
        assert!(
            !target.exists(),
            "NodeUnpublish must remove the target it created"
        );
        for _ in 0..10 {
            let req = NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.to_string_lossy().into(),
            };
            client.node().node_unstage_volume(req).await.unwrap();
        }
        assert_eq!(mounts_under(dir.path()), Vec::<std::path::PathBuf>::new());
        for _ in 0..10 {
            let req = DeleteVolumeRequest {
                volume_id: id.clone(),
                secrets: secrets(),
            };
            client.controller().delete_volume(req).await.unwrap();
        }
        let list = calls::list_volumes(&client).await;
        assert!(list.entries.is_empty());
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn hostile_ids_fields_and_access_types_are_refused_and_secrets_never_logged() {
    require_root!("hostile_ids_fields_and_access_types_are_refused_and_secrets_never_logged");
    run_isolated("hostpath-security", || async {
        let dir = tempfile::tempdir().unwrap();
        let sentinel = dir.path().join("sentinel");
        std::fs::create_dir_all(sentinel.join("keep")).unwrap();
        let driver = Driver::start(HOSTPATH, &dir.path().join("state"), &[]);
        let client = driver.client().await;
        let staging = dir.path().join("staging");
        std::fs::create_dir_all(&staging).unwrap();

        // Ids that would escape the state directory if used as paths.
        for hostile in [
            "../../etc",
            "../sentinel",
            "../../sentinel/keep",
            "vol-/../../x",
            "/etc/passwd",
            "a\u{0}b",
        ] {
            let del = client
                .controller()
                .delete_volume(DeleteVolumeRequest {
                    volume_id: hostile.into(),
                    secrets: secrets(),
                })
                .await;
            assert!(
                matches!(code(del), Code::Ok | Code::InvalidArgument),
                "{hostile:?}"
            );
            let get = client
                .controller()
                .controller_get_volume(ControllerGetVolumeRequest {
                    volume_id: hostile.into(),
                })
                .await;
            assert!(
                matches!(code(get), Code::NotFound | Code::InvalidArgument),
                "{hostile:?}"
            );
            let stage = client
                .node()
                .node_stage_volume(stage_req(hostile, &staging, mount_cap()))
                .await;
            assert!(
                matches!(code(stage), Code::NotFound | Code::InvalidArgument),
                "{hostile:?}"
            );
            let snap = client
                .controller()
                .create_snapshot(CreateSnapshotRequest {
                    source_volume_id: hostile.into(),
                    name: format!("snap-{}", hostile.len()),
                    secrets: secrets(),
                    ..Default::default()
                })
                .await;
            assert!(
                matches!(code(snap), Code::NotFound | Code::InvalidArgument),
                "{hostile:?}"
            );
        }
        assert!(
            sentinel.join("keep").is_dir(),
            "a hostile id touched a path outside the state dir"
        );
        assert_eq!(mounts_under(dir.path()), Vec::<std::path::PathBuf>::new());

        // Oversized and malformed fields: INVALID_ARGUMENT naming the field.
        let long = "x".repeat(129);
        let err = create(&client, &long, mount_cap()).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("name"), "{}", err.message());
        let err = client
            .controller()
            .create_volume(CreateVolumeRequest {
                name: "big-params".into(),
                volume_capabilities: vec![mount_cap()],
                parameters: [("k".to_string(), "v".repeat(5000))].into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("parameters"), "{}", err.message());
        let err = client
            .node()
            .node_get_info(NodeGetInfoRequest {})
            .await
            .map(|_| ());
        assert!(err.is_ok());

        // Wrong access types.
        let err = client
            .controller()
            .create_volume(CreateVolumeRequest {
                name: "mixed".into(),
                volume_capabilities: vec![mount_cap(), block_cap()],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let vol = create(&client, "pvc-mount-only", mount_cap())
            .await
            .unwrap();
        let err = client
            .node()
            .node_stage_volume(stage_req(&vol.volume_id, &staging, block_cap()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());

        // Secrets and mount flags never reach the log, at debug level.
        let flagged = VolumeCapability::mount("")
            .with_mount_flags([format!("context={MARKER}")])
            .with_access_mode(Mode::SingleNodeWriter);
        let _ = create(&client, "pvc-flags", flagged).await;
        let log = driver.log_text();
        assert!(
            log.contains("CreateVolume"),
            "the driver logs requests at debug level"
        );
        assert!(
            !log.contains(MARKER),
            "a secret or mount flag reached the log"
        );
    });
}

/// The answers csi-sanity expects, from the driver as users run it: the
/// Go driver's flags (--attach-limit, --accepted-mutable-parameter-name),
/// group snapshots offered (state on its own filesystem).
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn csi_sanity_answers() {
    require_root!("csi_sanity_answers");
    if !mount_utils::testing::have_program("csi_sanity_answers", "mkfs.ext4") {
        return;
    }
    run_isolated("hostpath-sanity-answers", || async {
        let dir = tempfile::tempdir().unwrap();
        let state =
            mount_utils::testing::ScratchFilesystem::new(dir.path(), "state", 64 << 20, "ext4")
                .unwrap();
        let snapdir = format!("--snapshotdir={}", dir.path().join("snapshots").display());
        let args = [
            "--enable-attach",
            "--attach-limit=3",
            "--accepted-mutable-parameter-name=iops",
            &snapdir,
        ];
        let driver = Driver::start(HOSTPATH, state.path(), &args);
        let client = driver.client().await;
        let info = client
            .node()
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.max_volumes_per_node, 3, "--attach-limit is reported");

        // Mutable parameters: unaccepted keys are refused and nothing is made.
        let with_params = |name: &str, params: &[(&str, &str)]| CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![mount_cap()],
            mutable_parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let mut c = client.controller();
        let err = c
            .create_volume(with_params("pvc-fake", &[("XXX_FakeKey", "XXX_FakeValue")]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("XXX_FakeKey"), "{}", err.message());
        let listed = calls::list_volumes(&client).await.entries;
        assert!(listed.is_empty(), "a refused CreateVolume made {listed:?}");
        let id = calls::create_volume(&client, with_params("pvc-iops", &[("iops", "100")]))
            .await
            .volume_id;
        let modify = calls::modify_request;
        let missing = c
            .controller_modify_volume(modify("non-existing-volume-id", &[]))
            .await;
        assert_eq!(code(missing), Code::NotFound);
        c.controller_modify_volume(modify(&id, &[])).await.unwrap();
        let fake = c
            .controller_modify_volume(modify(&id, &[("XXX_FakeKey", "x")]))
            .await;
        assert_eq!(code(fake), Code::InvalidArgument);
        c.controller_modify_volume(modify(&id, &[("iops", "200")]))
            .await
            .unwrap();

        // Required fields before the staging rule; relative paths name no volume.
        let mut n = client.node();
        let publish = n
            .node_publish_volume(NodePublishVolumeRequest::default())
            .await;
        assert_eq!(code(publish), Code::InvalidArgument);
        let stats = n
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: "some/path".into(),
                ..Default::default()
            })
            .await;
        assert_eq!(code(stats), Code::NotFound);
        let expand = n
            .node_expand_volume(NodeExpandVolumeRequest {
                volume_id: "vol-unknown".into(),
                volume_path: "some/path".into(),
                ..Default::default()
            })
            .await;
        assert_eq!(code(expand), Code::NotFound);

        // Group snapshots by id alone.
        let mut g = client.group_controller();
        let get = g
            .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest {
                group_snapshot_id: "group-unknown".into(),
                ..Default::default()
            })
            .await;
        assert_eq!(code(get), Code::NotFound);
        g.delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: "group-unknown".into(),
            ..Default::default()
        })
        .await
        .unwrap();

        c.delete_volume(DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn inline_ephemeral_volume_lives_and_dies_with_its_publish() {
    require_root!("inline_ephemeral_volume_lives_and_dies_with_its_publish");
    run_isolated("hostpath-ephemeral", || async {
        let dir = tempfile::tempdir().unwrap();
        let statedir = dir.path().join("state");
        let driver = Driver::start(HOSTPATH, &statedir, &[]);
        let client = driver.client().await;
        let target = dir.path().join("pod/vol");
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let req = NodePublishVolumeRequest {
            volume_id: "csi-0123456789abcdef".into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(mount_cap()),
            volume_context: [(
                "csi.storage.k8s.io/ephemeral".to_string(),
                "true".to_string(),
            )]
            .into(),
            ..Default::default()
        };
        client
            .node()
            .node_publish_volume(req.clone())
            .await
            .unwrap();
        client.node().node_publish_volume(req).await.unwrap();
        assert_eq!(mounts_under(dir.path()), vec![target.clone()]);
        let volumes = || std::fs::read_dir(statedir.join("volumes")).unwrap().count();
        assert_eq!(volumes(), 1);
        let unpublish = NodeUnpublishVolumeRequest {
            volume_id: "csi-0123456789abcdef".into(),
            target_path: target.to_string_lossy().into(),
        };
        client
            .node()
            .node_unpublish_volume(unpublish.clone())
            .await
            .unwrap();
        client
            .node()
            .node_unpublish_volume(unpublish)
            .await
            .unwrap();
        assert_eq!(
            volumes(),
            0,
            "the ephemeral volume is deleted with its publish"
        );
        assert!(mounts_under(dir.path()).is_empty());
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn staged_block_volume_is_reattached_after_a_restart() {
    require_root!("staged_block_volume_is_reattached_after_a_restart");
    run_isolated("hostpath-reattach", || async {
        let dir = tempfile::tempdir().unwrap();
        let statedir = dir.path().join("state");
        let mut driver = Driver::start(HOSTPATH, &statedir, &[]);
        let client = driver.client().await;
        let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/dev"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let vol = create(&client, "pvc-block", block_cap()).await.unwrap();
        client
            .node()
            .node_stage_volume(stage_req(&vol.volume_id, &staging, block_cap()))
            .await
            .unwrap();
        // Simulate a reboot: the driver dies and the loop device disappears.
        driver.kill();
        let image = statedir
            .join("volumes")
            .join(format!("{}.img", vol.volume_id));
        for dev in mount_utils::loopdev::find_by_backing_file(&image).unwrap() {
            mount_utils::loopdev::detach(&dev).unwrap();
        }
        mount_utils::testing::assert_no_loop_device_for(&image);
        driver.restart();
        let client = driver.client().await;
        assert_eq!(
            mount_utils::loopdev::find_by_backing_file(&image)
                .unwrap()
                .len(),
            1,
            "re-attached on start"
        );
        client
            .node()
            .node_publish_volume(publish_req(&vol.volume_id, &staging, &target, block_cap()))
            .await
            .unwrap();
        let meta = std::fs::metadata(&target).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(
            meta.file_type().is_block_device(),
            "the target is the device node"
        );
        calls::node_unpublish(&client, &vol.volume_id, &target).await;
        calls::node_unstage(&client, &vol.volume_id, &staging).await;
        mount_utils::testing::assert_no_loop_device_for(&image);
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn sigkill_during_churn_never_loses_a_volume_or_corrupts_state() {
    require_root!("sigkill_during_churn_never_loses_a_volume_or_corrupts_state");
    run_isolated("hostpath-crash", || async {
        let dir = tempfile::tempdir().unwrap();
        let statedir = dir.path().join("state");
        let mut driver = Driver::start(HOSTPATH, &statedir, &[]);
        let started = Instant::now();
        // Volumes whose CreateVolume returned OK and that no DeleteVolume touched.
        let mut confirmed: BTreeSet<String> = BTreeSet::new();
        let rounds = 8;
        for round in 0..rounds {
            let client = driver.client().await;
            let churn = {
                let client = client.clone();
                let confirmed_before = confirmed.clone();
                tokio::spawn(async move {
                    let mut created = BTreeSet::new();
                    let mut deleting = BTreeSet::new();
                    for i in 0.. {
                        let cap = if i % 2 == 0 { mount_cap() } else { block_cap() };
                        let Ok(v) = create(&client, &format!("crash-{round}-{i}"), cap).await
                        else {
                            break;
                        };
                        created.insert(v.volume_id.clone());
                        let snap = client
                            .controller()
                            .create_snapshot(CreateSnapshotRequest {
                                source_volume_id: v.volume_id.clone(),
                                name: format!("crash-snap-{round}-{i}"),
                                ..Default::default()
                            })
                            .await;
                        let Ok(snap) = snap else { break };
                        let snap_id = snap.into_inner().snapshot.unwrap().snapshot_id;
                        if client
                            .controller()
                            .delete_snapshot(DeleteSnapshotRequest {
                                snapshot_id: snap_id,
                                ..Default::default()
                            })
                            .await
                            .is_err()
                        {
                            break;
                        }
                        if i % 3 == 0 {
                            deleting.insert(v.volume_id.clone());
                            if client
                                .controller()
                                .delete_volume(DeleteVolumeRequest {
                                    volume_id: v.volume_id,
                                    ..Default::default()
                                })
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                    }
                    let _ = confirmed_before;
                    (created, deleting)
                })
            };
            // Kill at a different point of the churn each round.
            tokio::time::sleep(Duration::from_millis(40 + 37 * round as u64)).await;
            driver.kill();
            let (created, deleting) = churn.await.unwrap();
            confirmed.extend(created.difference(&deleting).cloned());
            driver.restart();
            let client = driver.client().await;
            let list = client
                .controller()
                .list_volumes(ListVolumesRequest::default())
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "round {round}: the driver cannot list after a crash: {e}\n{}",
                        driver.log_text()
                    )
                })
                .into_inner();
            let listed: BTreeSet<String> = list
                .entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone())
                .collect();
            let lost: Vec<_> = confirmed.difference(&listed).collect();
            assert!(
                lost.is_empty(),
                "round {round}: volumes lost after SIGKILL: {lost:?}"
            );
            for e in &list.entries {
                let cond = e
                    .status
                    .as_ref()
                    .and_then(|s| s.volume_condition.as_ref())
                    .unwrap();
                assert!(
                    !cond.abnormal,
                    "round {round}: a listed volume has no data: {}",
                    cond.message
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "crash test exceeded its time bound"
            );
        }
        assert!(mounts_under(dir.path()).is_empty());
        assert!(!confirmed.is_empty(), "the churn created volumes");
        // Everything still deletes cleanly after the crashes (snapshots a
        // kill left behind first: a volume with snapshots is not deletable).
        let client = driver.client().await;
        let snaps = calls::list_snapshots(&client).await;
        for e in snaps.entries {
            let snapshot_id = e.snapshot.unwrap().snapshot_id;
            client
                .controller()
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        for id in &confirmed {
            calls::delete_volume(&client, id).await;
        }
        driver.stop();
        assert!(
            !statedir.join("csi.sock").exists(),
            "socket removed on SIGTERM"
        );
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn group_snapshots_are_write_order_consistent() {
    require_root!("group_snapshots_are_write_order_consistent");
    if !mount_utils::testing::have_program(
        "group_snapshots_are_write_order_consistent",
        "mkfs.ext4",
    ) {
        return;
    }
    run_isolated("hostpath-group-consistency", || async {
        let dir = tempfile::tempdir().unwrap();
        let state =
            mount_utils::testing::ScratchFilesystem::new(dir.path(), "state", 256 << 20, "ext4")
                .unwrap();
        let snapdir = format!("--snapshotdir={}", dir.path().join("snapshots").display());
        let driver = Driver::start(HOSTPATH, state.path(), &[&snapdir]);
        let client = driver.client().await;
        let caps = calls::plugin_capabilities(&client).await;
        assert!(
            caps.capabilities.iter().any(|c| c.service_type()
                == Some(plugin_capability::service::Type::GroupControllerService)),
            "group snapshots are offered on a dedicated state filesystem"
        );

        // Two volumes published like a pod's, and a writer that appends i to
        // A and then i to B: in any point-in-time copy, B <= A <= B + 1.
        let mut targets = Vec::new();
        let mut ids = Vec::new();
        for name in ["a", "b"] {
            let id = create(&client, &format!("pvc-{name}"), mount_cap())
                .await
                .unwrap()
                .volume_id;
            let staging = dir.path().join(format!("staging-{name}"));
            let target = dir.path().join(format!("pod/{name}"));
            stage_and_publish(&client, &id, &staging, &target).await;
            targets.push(target);
            ids.push(id);
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = spawn_ordered_writer(
            targets[0].join("log"),
            targets[1].join("log"),
            stop.clone(),
            u64::MAX,
        );
        let count = |path: &Path| {
            std::fs::read_to_string(path)
                .map(|t| t.lines().count())
                .unwrap_or(0)
        };
        while count(&targets[1].join("log")) < 1000 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        for round in 0..3 {
            let req = CreateVolumeGroupSnapshotRequest {
                name: format!("group-{round}"),
                source_volume_ids: ids.clone(),
                ..Default::default()
            };
            let group = client
                .group_controller()
                .create_volume_group_snapshot(req)
                .await
                .unwrap()
                .into_inner()
                .group_snapshot
                .unwrap();
            let mut lines = Vec::new();
            for snap in &group.snapshots {
                let req = CreateVolumeRequest {
                    name: format!("restore-{round}-{}", snap.snapshot_id),
                    capacity_range: Some(CapacityRange::at_least(8 << 20)),
                    volume_capabilities: vec![mount_cap()],
                    volume_content_source: Some(VolumeContentSource {
                        r#type: Some(volume_content_source::Type::Snapshot(
                            volume_content_source::SnapshotSource {
                                snapshot_id: snap.snapshot_id.clone(),
                            },
                        )),
                    }),
                    ..Default::default()
                };
                let restored = calls::create_volume(&client, req).await;
                let data = state
                    .path()
                    .join("volumes")
                    .join(&restored.volume_id)
                    .join("log");
                lines.push((snap.source_volume_id.clone(), count(&data)));
                calls::delete_volume(&client, &restored.volume_id).await;
            }
            let of = |id: &String| lines.iter().find(|(v, _)| v == id).unwrap().1;
            assert_one_point_in_time(round, of(&ids[0]), of(&ids[1]), 1000);
            let member_ids = group
                .snapshots
                .iter()
                .map(|s| s.snapshot_id.clone())
                .collect();
            client
                .group_controller()
                .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest {
                    group_snapshot_id: group.group_snapshot_id,
                    snapshot_ids: member_ids,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written = writer.join().unwrap();
        assert!(written > 1000);
        for (id, target) in ids.iter().zip(&targets) {
            let staging = dir.path().join(format!(
                "staging-{}",
                target.file_name().unwrap().to_string_lossy()
            ));
            unpublish_unstage_delete(&client, id, &staging, target).await;
        }
        drop(driver);
        drop(state);
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn directory_volume_capacity_is_a_quota_that_expansion_raises() {
    const TEST: &str = "directory_volume_capacity_is_a_quota_that_expansion_raises";
    require_root!(TEST);
    if !mount_utils::testing::have_program(TEST, "mkfs.ext4") {
        return;
    }
    run_isolated("hostpath-quota", || async {
        let dir = tempfile::tempdir().unwrap();
        let state = match mount_utils::testing::ScratchFilesystem::with_options(
            dir.path(),
            "state",
            256 << 20,
            "ext4",
            &["-O", "quota,project"],
            &["prjquota"],
        ) {
            Ok(fs) => fs,
            Err(e) if e.contains("EINVAL") => {
                eprintln!(
                    "skipped: {TEST}: the kernel refuses prjquota (built without quota support?): {e}"
                );
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let driver = Driver::start(HOSTPATH, state.path(), &[]);
        let client = driver.client().await;
        let id = create(&client, "pvc-quota", mount_cap())
            .await
            .unwrap()
            .volume_id;
        let (staging, target) = (dir.path().join("staging"), dir.path().join("pod/vol"));
        stage_and_publish(&client, &id, &staging, &target).await;
        let size = |p: &Path| {
            let st = nix::sys::statvfs::statvfs(p).unwrap();
            st.blocks() * st.fragment_size()
        };
        assert_eq!(size(&target), 8 << 20, "the pod sees the volume's capacity");
        let write = |mib: usize| std::fs::write(target.join("data"), vec![1u8; mib << 20]);
        assert_eq!(write(16).unwrap_err().raw_os_error(), Some(libc::EDQUOT));
        client
            .controller()
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: id.clone(),
                capacity_range: Some(CapacityRange::at_least(32 << 20)),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(size(&target), 32 << 20, "expansion raised the quota");
        write(16).unwrap();
        unpublish_unstage_delete(&client, &id, &staging, &target).await;
        drop(driver);
        drop(state);
    });
}
