//! Controller durability of both example drivers, over their real
//! sockets. One file over 700 lines: a list of cases sharing one setup.
//!
//! - a cancelled clone finishes once, and a retry meanwhile is ABORTED;
//! - a second instance on the same `--statedir` exits with a message;
//! - a full state filesystem: CreateVolume is RESOURCE_EXHAUSTED and
//!   leaves nothing, deletes and unpublish/unstage still work;
//! - the source of a snapshot or clone in flight cannot be deleted;
//! - hostpath `--capacity` is reserved atomically;
//! - data with no record is swept at start (never that of an unreadable
//!   record), DeleteVolume of an unrecorded id removes its data, and
//!   SIGKILL churn loses no acknowledged volume and leaves no orphan data;
//!   an earlier version's state file is imported, not swept.
//!
//! (Copies that keep owners, xattrs and hard links are tested in
//! hostpath's backend and in the tree-copy crate.) Tests that mount a tmpfs
//! need root and run in a private mount namespace; they say when skipped.

use e2e_support as support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use csi_kit::client::CsiClient;
use csi_kit::mount::{Mounter, require_root};
use csi_kit::proto::v1::volume_capability::access_mode::Mode;
use csi_kit::proto::v1::*;
use support::{Driver, calls, example_path, run_isolated_in_tempdir};
use tonic::Code;

const DRIVERS: [&str; 2] = ["hostpath", "loop-block"];
const MIB: i64 = 1 << 20;

/// The access each driver's controller tests use: hostpath's directories
/// exercise its tree copy; loop-block's disks are raw (no mkfs needed).
fn cap(driver: &str) -> VolumeCapability {
    let cap = if driver == "hostpath" {
        VolumeCapability::mount("")
    } else {
        VolumeCapability::block()
    };
    cap.with_access_mode(Mode::SingleNodeWriter)
}

fn create_req(driver: &str, name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange::exactly(bytes)),
        volume_capabilities: vec![cap(driver)],
        ..Default::default()
    }
}

fn from_volume(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    use volume_content_source::{Type, VolumeSource};
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: id.into(),
        })),
    });
    req
}

fn from_snapshot(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    use volume_content_source::{SnapshotSource, Type};
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: id.into(),
        })),
    });
    req
}

async fn create(client: &CsiClient, req: CreateVolumeRequest) -> Result<Volume, tonic::Status> {
    calls::try_create_volume(client, req).await
}

async fn snapshot(client: &CsiClient, volume: &str, name: &str) -> Result<Snapshot, tonic::Status> {
    let req = CreateSnapshotRequest {
        source_volume_id: volume.into(),
        name: name.into(),
        ..Default::default()
    };
    Ok(client
        .controller()
        .create_snapshot(req)
        .await?
        .into_inner()
        .snapshot
        .expect("snapshot"))
}

async fn delete(client: &CsiClient, id: &str) -> Result<(), tonic::Status> {
    let req = DeleteVolumeRequest {
        volume_id: id.into(),
        ..Default::default()
    };
    client.controller().delete_volume(req).await.map(drop)
}

async fn delete_snapshot(client: &CsiClient, id: &str) -> Result<(), tonic::Status> {
    let req = DeleteSnapshotRequest {
        snapshot_id: id.into(),
        ..Default::default()
    };
    client.controller().delete_snapshot(req).await.map(drop)
}

async fn listed_volumes(client: &CsiClient) -> BTreeSet<String> {
    let list = calls::list_volumes(client).await;
    list.entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect()
}

async fn listed_snapshots(client: &CsiClient) -> BTreeSet<String> {
    let list = calls::list_snapshots(client).await;
    list.entries
        .into_iter()
        .map(|e| e.snapshot.unwrap().snapshot_id)
        .collect()
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Names in a directory (empty if it does not exist).
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The ids a data directory holds data for (`<id>`, `<id>.img`, `<id>.tar`).
fn ids_with_data(dir: &Path) -> BTreeSet<String> {
    names(dir)
        .into_iter()
        .map(|n| {
            n.trim_end_matches(".img")
                .trim_end_matches(".tar")
                .to_owned()
        })
        .collect()
}

/// Where a volume's data is.
fn data_path(driver: &str, statedir: &Path, id: &str) -> PathBuf {
    if driver == "hostpath" {
        statedir.join("volumes").join(id)
    } else {
        statedir.join("volumes").join(format!("{id}.img"))
    }
}

/// Writes `bytes` of non-zero data into a volume, as a pod would.
fn fill_volume(driver: &str, statedir: &Path, id: &str, bytes: usize) {
    let path = data_path(driver, statedir, id);
    let file = if driver == "hostpath" {
        path.join("data")
    } else {
        path
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&file)
        .unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..bytes >> 20 {
        f.write_all(&chunk).unwrap();
    }
}

/// A tmpfs of `size` at `dir` (in the calling thread's mount namespace).
fn mount_tmpfs(dir: &Path, size: &str) {
    std::fs::create_dir_all(dir).unwrap();
    csi_kit::mount::LinuxMounter::new()
        .mount("tmpfs", dir, "tmpfs", &[&format!("size={size}")])
        .unwrap();
}

/// Fills the filesystem of `dir` with a file until it is full.
fn fill_filesystem(dir: &Path) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("filler"))
        .unwrap();
    let page = [1u8; 4096];
    loop {
        match f.write_all(&page) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return,
            Err(e) => panic!("filling {}: {e}", dir.display()),
        }
    }
}

async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The driver on a tmpfs state dir of `size`, and a 512 MiB volume "src"
/// holding 400 MiB of data (a copy of it takes long enough to cancel).
async fn driver_with_full_source(
    driver: &'static str,
    dir: &Path,
    size: &str,
) -> (PathBuf, Driver, CsiClient, Volume) {
    let statedir = dir.join("state");
    mount_tmpfs(&statedir, size);
    let d = Driver::start(driver, &statedir, &[]);
    let client = d.client().await;
    let src = create(&client, create_req(driver, "src", 512 * MIB))
        .await
        .unwrap();
    fill_volume(driver, &statedir, &src.volume_id, 400 << 20);
    (statedir, d, client, src)
}

/// A CreateVolume whose client gave up keeps copying; a retry meanwhile is
/// ABORTED (it used to start a second copy, leaving orphans).
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn a_cancelled_clone_finishes_once_and_a_retry_meanwhile_is_aborted() {
    require_root!("a_cancelled_clone_finishes_once_and_a_retry_meanwhile_is_aborted");
    for driver in DRIVERS {
        run_isolated_in_tempdir(&format!("{driver}-cancel"), move |dir| async move {
            let (statedir, d, client, src) = driver_with_full_source(driver, &dir, "2g").await;
            let req = from_volume(create_req(driver, "clone", 512 * MIB), &src.volume_id);
            let first =
                tokio::time::timeout(Duration::from_millis(20), create(&client, req.clone())).await;
            assert!(
                first.is_err(),
                "{driver}: the copy ended before the client gave up"
            );
            let retry = create(&client, req.clone()).await;
            assert_eq!(
                code(retry),
                Code::Aborted,
                "{driver}: a retry while the first copy runs"
            );
            let start = Instant::now();
            let clone = loop {
                match create(&client, req.clone()).await {
                    Ok(v) => break v,
                    Err(s) if s.code() == Code::Aborted => {
                        assert!(
                            start.elapsed() < Duration::from_secs(60),
                            "{driver}: never done"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(s) => panic!("{driver}: {s}\n{}", d.log_text()),
                }
            };
            let want: BTreeSet<String> = [src.volume_id.clone(), clone.volume_id.clone()].into();
            assert_eq!(listed_volumes(&client).await, want, "{driver}");
            assert_eq!(
                ids_with_data(&statedir.join("volumes")),
                want,
                "{driver}: one copy, no orphan"
            );
            let size = |id: &str| {
                let p = data_path(driver, &statedir, id);
                let p = if driver == "hostpath" {
                    p.join("data")
                } else {
                    p
                };
                let m = std::fs::metadata(p).unwrap();
                (m.len(), std::os::unix::fs::MetadataExt::blocks(&m))
            };
            assert_eq!(
                size(&clone.volume_id),
                size(&src.volume_id),
                "{driver}: a whole copy"
            );
            for id in [&clone.volume_id, &src.volume_id] {
                delete(&client, id).await.unwrap();
            }
        });
    }
}

/// Two instances on one state directory used to both run, the last to save
/// dropping the other's volumes.
#[test]
fn a_second_instance_on_the_same_statedir_exits_with_a_message() {
    for driver in DRIVERS {
        in_tempdir(|tmp| async move {
            let statedir = tmp.join("state");
            let first = Driver::start(driver, &statedir, &[]);
            let client = first.client().await;
            let kept = create(&client, create_req(driver, "kept", 8 * MIB))
                .await
                .unwrap();
            let holder = std::fs::read_to_string(statedir.join("LOCK")).unwrap();
            let mut second = Command::new(example_path(driver))
                .arg("--statedir")
                .arg(&statedir)
                .arg("--endpoint")
                .arg(format!("unix://{}", tmp.join("second.sock").display()))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let start = Instant::now();
            let status = loop {
                if let Some(status) = second.try_wait().unwrap() {
                    break status;
                }
                if start.elapsed() > Duration::from_secs(20) {
                    let _ = second.kill();
                    let _ = second.wait();
                    panic!("{driver}: the second instance kept running");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            let out = second.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!status.success(), "{driver}: {status}");
            assert!(
                stderr.contains(&format!(
                    "state directory {} is in use by another process (pid {})",
                    statedir.display(),
                    holder.trim()
                )),
                "{driver}: {stderr}"
            );
            assert!(!tmp.join("second.sock").exists());
            assert!(listed_volumes(&client).await.contains(&kept.volume_id));
            delete(&client, &kept.volume_id).await.unwrap();
        });
    }
}

/// On a full state filesystem CreateVolume used to answer INTERNAL and leave a
/// directory per call, and deletes, NodeUnpublish and NodeUnstage failed, so
/// space could never be freed through CSI.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn a_full_state_filesystem_refuses_creates_cleanly_and_still_frees_space() {
    require_root!("a_full_state_filesystem_refuses_creates_cleanly_and_still_frees_space");
    for driver in DRIVERS {
        run_isolated_in_tempdir(&format!("{driver}-full"), move |dir| async move {
            let statedir = dir.join("state");
            mount_tmpfs(&statedir, "8m");
            let args: &[&str] = if driver == "hostpath" {
                &["--enable-attach"]
            } else {
                &[]
            };
            let d = Driver::start(driver, &statedir, args);
            let client = d.client().await;
            let used = create(&client, create_req(driver, "in-use", MIB))
                .await
                .unwrap();
            let spare = create(&client, create_req(driver, "spare", MIB))
                .await
                .unwrap();
            let (volume, node, publish_context) =
                support::create_and_attach(&client, create_req(driver, "in-use", MIB)).await;
            assert_eq!(volume.volume_id, used.volume_id);
            let staging = dir.join("staging");
            let target = dir.join("target");
            let stage = NodeStageVolumeRequest {
                volume_id: used.volume_id.clone(),
                staging_target_path: staging.to_string_lossy().into(),
                volume_capability: Some(cap(driver)),
                publish_context: publish_context.clone(),
                ..Default::default()
            };
            client.node().node_stage_volume(stage).await.unwrap();
            let publish = NodePublishVolumeRequest {
                volume_id: used.volume_id.clone(),
                staging_target_path: staging.to_string_lossy().into(),
                target_path: target.to_string_lossy().into(),
                volume_capability: Some(cap(driver)),
                publish_context,
                ..Default::default()
            };
            client.node().node_publish_volume(publish).await.unwrap();

            fill_filesystem(&statedir);
            let volumes = names(&statedir.join("volumes"));
            let records = names(&statedir.join("tables/volumes"));
            for i in 0..3 {
                let r = create(&client, create_req(driver, &format!("full-{i}"), MIB)).await;
                assert_eq!(code(r), Code::ResourceExhausted, "{driver}: create {i}");
                assert_eq!(
                    names(&statedir.join("volumes")),
                    volumes,
                    "{driver}: no data left"
                );
                assert_eq!(
                    names(&statedir.join("tables/volumes")),
                    records,
                    "{driver}: no record or temporary file left"
                );
            }
            // Every step that frees space works on a full disk.
            delete(&client, &spare.volume_id).await.unwrap();
            assert!(!data_path(driver, &statedir, &spare.volume_id).exists());
            fill_filesystem(&statedir);
            calls::node_unpublish(&client, &used.volume_id, &target).await;
            fill_filesystem(&statedir);
            calls::node_unstage(&client, &used.volume_id, &staging).await;
            fill_filesystem(&statedir);
            calls::controller_unpublish(&client, &used.volume_id, &node).await;
            fill_filesystem(&statedir);
            delete(&client, &used.volume_id).await.unwrap();
            assert!(listed_volumes(&client).await.is_empty(), "{driver}");

            std::fs::remove_file(statedir.join("filler")).unwrap();
            let again = create(&client, create_req(driver, "after", MIB))
                .await
                .unwrap();
            delete(&client, &again.volume_id).await.unwrap();
            assert!(names(&statedir.join("volumes")).is_empty(), "{driver}");
            drop(d);
        });
    }
}

/// Runs `f` on a current-thread runtime with a fresh temporary directory,
/// removed after.
fn in_tempdir<F, Fut>(f: F)
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    rt.block_on(f(tmp.path().to_path_buf()));
}

/// Starts CreateVolume of `req` (a clone or a restore) and returns once its
/// copy is under way: when the volumes directory holds `count` entries.
async fn create_while_copying(
    client: &CsiClient,
    req: CreateVolumeRequest,
    statedir: &Path,
    count: usize,
    what: &str,
) -> tokio::task::JoinHandle<Result<Volume, tonic::Status>> {
    let task = {
        let client = client.clone();
        tokio::spawn(async move { create(&client, req).await })
    };
    wait_until(what, Duration::from_secs(20), || {
        names(&statedir.join("volumes")).len() == count
    })
    .await;
    task
}

/// DeleteVolume of a source while a snapshot or clone of it was being copied
/// returned OK, and the copy then reported OK for a source that no longer
/// existed.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn sources_of_snapshots_and_clones_in_flight_cannot_be_deleted() {
    require_root!("sources_of_snapshots_and_clones_in_flight_cannot_be_deleted");
    for driver in DRIVERS {
        run_isolated_in_tempdir(&format!("{driver}-source"), move |dir| async move {
            let (statedir, _d, client, src) = driver_with_full_source(driver, &dir, "3g").await;
            let snapshots = statedir.join("snapshots");

            let cut = {
                let (client, id) = (client.clone(), src.volume_id.clone());
                tokio::spawn(async move { snapshot(&client, &id, "snap").await })
            };
            wait_until("the snapshot's copy", Duration::from_secs(20), || {
                !names(&snapshots).is_empty()
            })
            .await;
            assert_eq!(
                code(delete(&client, &src.volume_id).await),
                Code::Aborted,
                "{driver}: DeleteVolume of a snapshot's source"
            );
            let snap = cut.await.unwrap().unwrap();
            assert!(
                listed_volumes(&client).await.contains(&src.volume_id),
                "{driver}"
            );

            let req = from_volume(create_req(driver, "clone", 512 * MIB), &src.volume_id);
            let clone = create_while_copying(&client, req, &statedir, 2, "the clone's copy").await;
            assert_eq!(
                code(delete(&client, &src.volume_id).await),
                Code::Aborted,
                "{driver}: DeleteVolume of a clone's source"
            );
            let clone = clone.await.unwrap().unwrap();

            let req = from_snapshot(create_req(driver, "restore", 512 * MIB), &snap.snapshot_id);
            let restore =
                create_while_copying(&client, req, &statedir, 3, "the restore's copy").await;
            assert_eq!(
                code(delete_snapshot(&client, &snap.snapshot_id).await),
                Code::Aborted,
                "{driver}: DeleteSnapshot of a restore's source"
            );
            let restored = restore.await.unwrap().unwrap();

            delete_snapshot(&client, &snap.snapshot_id).await.unwrap();
            for id in [&restored.volume_id, &clone.volume_id, &src.volume_id] {
                delete(&client, id).await.unwrap();
            }
            assert!(names(&statedir.join("volumes")).is_empty(), "{driver}");
            assert!(names(&snapshots).is_empty(), "{driver}");
        });
    }
}

/// 40 concurrent 10 MiB creates against 100 MiB of `--capacity` used to succeed
/// 13–21 times.
#[test]
fn hostpath_capacity_is_checked_and_reserved_atomically() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tmp = tempfile::tempdir().unwrap();
        let statedir = tmp.path().join("state");
        let d = Driver::start("hostpath", &statedir, &["--capacity", "100Mi"]);
        let client = d.client().await;
        let calls: Vec<_> = (0..40)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    create(
                        &client,
                        create_req("hostpath", &format!("pvc-{i}"), 10 * MIB),
                    )
                    .await
                })
            })
            .collect();
        let mut created = Vec::new();
        for call in calls {
            match call.await.unwrap() {
                Ok(v) => created.push(v.volume_id),
                Err(s) => assert_eq!(s.code(), Code::ResourceExhausted, "{s}"),
            }
        }
        assert_eq!(created.len(), 10, "exactly the capacity");
        let capacity = || async {
            client
                .controller()
                .get_capacity(GetCapacityRequest::default())
                .await
                .unwrap()
                .into_inner()
                .available_capacity
        };
        assert_eq!(capacity().await, 0);
        delete(&client, &created[0]).await.unwrap();
        assert_eq!(capacity().await, 10 * MIB);
        let last = create(&client, create_req("hostpath", "pvc-last", 10 * MIB)).await;
        created[0] = last.unwrap().volume_id;
        assert_eq!(
            code(create(&client, create_req("hostpath", "pvc-over", MIB)).await),
            Code::ResourceExhausted
        );
        for id in &created {
            delete(&client, id).await.unwrap();
        }
        assert_eq!(capacity().await, 100 * MIB);
    });
}

/// Data no record owns was left after a crash, and DeleteVolume of
/// a well-formed id without a record left its data. The sweep at start
/// removes it, logged, but keeps the data of a record that could not be
/// read and anything that is not the driver's; an earlier version's state
/// file is imported, so its volumes are not swept.
#[test]
fn startup_sweeps_unowned_data_and_keeps_unreadable_records_data() {
    for driver in DRIVERS {
        in_tempdir(|tmp| async move {
            let statedir = tmp.join("state");
            let mut d = Driver::start(driver, &statedir, &[]);
            let client = d.client().await;
            let kept = create(&client, create_req(driver, "kept", 8 * MIB))
                .await
                .unwrap();
            let damaged = create(&client, create_req(driver, "damaged", 8 * MIB))
                .await
                .unwrap();
            let snap = snapshot(&client, &kept.volume_id, "snap").await.unwrap();
            d.kill();

            // What a crash leaves: data of unacknowledged creates and
            // half-done deletes, temporaries, and someone else's file.
            let volumes = statedir.join("volumes");
            let snapshots = statedir.join("snapshots");
            let orphan = "vol-0123456789abcdef0123456789abcdef";
            let orphan_snap = "snap-0123456789abcdef0123456789abcdef";
            let mut planted = vec![data_path(driver, &statedir, orphan)];
            if driver == "hostpath" {
                std::fs::create_dir_all(volumes.join(orphan)).unwrap();
                std::fs::write(volumes.join(orphan).join("data"), b"x").unwrap();
                let image = volumes.join("vol-fedcba9876543210fedcba9876543210.img");
                std::fs::write(&image, b"x").unwrap();
                planted.push(image);
                std::fs::create_dir_all(snapshots.join(orphan_snap)).unwrap();
                planted.push(snapshots.join(orphan_snap));
                let partial = snapshots.join(format!("{orphan_snap}.tar.partial"));
                std::fs::write(&partial, b"x").unwrap();
                planted.push(partial);
            } else {
                std::fs::write(volumes.join(format!("{orphan}.img")), b"x").unwrap();
                let copy = snapshots.join(format!("{orphan_snap}.img"));
                std::fs::write(&copy, b"x").unwrap();
                planted.push(copy);
            }
            let foreign = volumes.join("README.txt");
            std::fs::write(&foreign, b"not the driver's").unwrap();
            std::fs::write(
                statedir.join("tables/volumes").join(&damaged.volume_id),
                b"torn",
            )
            .unwrap();
            // Damage after a checkpoint: otherwise csi-store's journal
            // (state on a disk) would replay the record's last write over it.
            let _ = std::fs::remove_file(statedir.join("journal"));

            d.restart();
            let client = d.client().await;
            let listed = listed_volumes(&client).await;
            assert!(listed.contains(&kept.volume_id), "{driver}");
            assert!(!listed.contains(&damaged.volume_id), "{driver}: set aside");
            assert!(listed_snapshots(&client).await.contains(&snap.snapshot_id));
            for p in &planted {
                assert!(!p.exists(), "{driver}: {} was not swept", p.display());
            }
            assert!(foreign.exists(), "{driver}: not the driver's, not touched");
            assert!(
                data_path(driver, &statedir, &damaged.volume_id).exists(),
                "{driver}: the data of an unreadable record is kept"
            );
            let log = d.log_text();
            assert!(
                log.contains("unreadable record set aside"),
                "{driver}: {log}"
            );
            assert!(
                log.contains("removing it") && log.contains(orphan),
                "{driver}: {log}"
            );
            assert!(log.contains("not touched"), "{driver}");

            // DeleteVolume/DeleteSnapshot of ids without records remove their data.
            let lost = "vol-00000000000000000000000000000001";
            let lost_snap = "snap-00000000000000000000000000000001";
            if driver == "hostpath" {
                std::fs::create_dir_all(volumes.join(lost).join("sub")).unwrap();
                std::fs::create_dir_all(snapshots.join(lost_snap)).unwrap();
            } else {
                std::fs::write(volumes.join(format!("{lost}.img")), b"x").unwrap();
                std::fs::write(snapshots.join(format!("{lost_snap}.img")), b"x").unwrap();
            }
            delete(&client, lost).await.unwrap();
            delete_snapshot(&client, lost_snap).await.unwrap();
            assert!(!data_path(driver, &statedir, lost).exists(), "{driver}");
            assert!(
                !names(&snapshots).iter().any(|n| n.starts_with(lost_snap)),
                "{driver}"
            );
            delete_snapshot(&client, &snap.snapshot_id).await.unwrap();
            delete(&client, &kept.volume_id).await.unwrap();
        });
    }
}

/// The state file of an earlier version is imported, attachments included, and
/// its volumes' data is not swept.
#[test]
fn an_earlier_state_file_is_imported_not_swept() {
    for driver in DRIVERS {
        in_tempdir(|tmp| async move {
            let statedir = tmp.join("state");
            let id = "vol-0123456789abcdef0123456789abcdef";
            std::fs::create_dir_all(statedir.join("volumes")).unwrap();
            let access = if driver == "hostpath" {
                "Mount"
            } else {
                "Block"
            };
            let (attached, extra) = if driver == "hostpath" {
                (
                    "published_nodes",
                    r#","mutable_parameters":{},"topology":{},"ephemeral":false"#,
                )
            } else {
                ("attached", "")
            };
            let volume = format!(
                r#"{{"id":"{id}","name":"old","capacity_bytes":8388608,"access":"{access}","source":null,"parameters":{{}},"request":[],"{attached}":{{"node-1":false}}{extra}}}"#
            );
            let state = format!(
                r#"{{"volumes":{{"{id}":{volume}}},"snapshots":{{}},"staged":{{}},"published":{{}}}}"#
            );
            std::fs::write(statedir.join("state.json"), state).unwrap();
            let data = data_path(driver, &statedir, id);
            if driver == "hostpath" {
                std::fs::create_dir_all(&data).unwrap();
            } else {
                std::fs::write(&data, vec![0u8; 8 << 20]).unwrap();
            }
            let d = Driver::start(driver, &statedir, &["--nodeid", "node-1"]);
            let client = d.client().await;
            let req = ControllerGetVolumeRequest {
                volume_id: id.into(),
            };
            let got = client.controller().controller_get_volume(req).await;
            let got = got.unwrap_or_else(|e| panic!("{driver}: {e}\n{}", d.log_text()));
            let status = got.into_inner().status.unwrap();
            assert_eq!(
                status.published_node_ids,
                vec!["node-1".to_string()],
                "{driver}"
            );
            assert!(data.exists(), "{driver}: imported, not swept");
            assert!(statedir.join("state.json.imported").exists());
            assert!(!statedir.join("state.json").exists());
        });
    }
}

/// SIGKILL at different points of concurrent churn (create, snapshot, delete)
/// never loses an acknowledged volume, and after each restart every piece of
/// data belongs to a listed volume or snapshot.
#[test]
fn sigkill_churn_loses_no_acknowledged_volume_and_leaves_no_orphan_data() {
    for driver in DRIVERS {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(churn(driver));
    }
}

async fn churn(driver: &'static str) {
    let tmp = tempfile::tempdir().unwrap();
    let statedir = tmp.path().join("state");
    let mut d = Driver::start(driver, &statedir, &[]);
    let started = Instant::now();
    // Acknowledged by CreateVolume and never handed to DeleteVolume.
    let mut confirmed: BTreeSet<String> = BTreeSet::new();
    for round in 0..6u64 {
        let client = d.client().await;
        let workers: Vec<_> = (0..3u64)
            .map(|w| {
                let client = client.clone();
                tokio::spawn(async move {
                    let (mut created, mut deleting) = (BTreeSet::new(), BTreeSet::new());
                    for i in 0.. {
                        let name = format!("churn-{round}-{w}-{i}");
                        let Ok(v) = create(&client, create_req(driver, &name, 8 * MIB)).await
                        else {
                            break;
                        };
                        created.insert(v.volume_id.clone());
                        let Ok(s) = snapshot(&client, &v.volume_id, &format!("{name}-s")).await
                        else {
                            break;
                        };
                        if delete_snapshot(&client, &s.snapshot_id).await.is_err() {
                            break;
                        }
                        if i % 2 == 0 {
                            deleting.insert(v.volume_id.clone());
                            if delete(&client, &v.volume_id).await.is_err() {
                                break;
                            }
                        }
                    }
                    (created, deleting)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(60 + 41 * round)).await;
        d.kill();
        for w in workers {
            let (created, deleting) = w.await.unwrap();
            confirmed.extend(created.difference(&deleting).cloned());
        }
        d.restart();
        let client = d.client().await;
        let volumes = listed_volumes(&client).await;
        let snapshots = listed_snapshots(&client).await;
        let lost: Vec<_> = confirmed.difference(&volumes).collect();
        assert!(lost.is_empty(), "{driver} round {round}: lost {lost:?}");
        assert_eq!(
            ids_with_data(&statedir.join("volumes")),
            volumes,
            "{driver} round {round}: volume data and records differ\n{}",
            d.log_text()
        );
        assert_eq!(
            ids_with_data(&statedir.join("snapshots")),
            snapshots,
            "{driver} round {round}: snapshot data and records differ"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{driver}: too slow"
        );
    }
    assert!(!confirmed.is_empty(), "{driver}: the churn created volumes");
    let client = d.client().await;
    for id in listed_snapshots(&client).await {
        delete_snapshot(&client, &id).await.unwrap();
    }
    for id in listed_volumes(&client).await {
        delete(&client, &id).await.unwrap();
    }
    assert!(names(&statedir.join("volumes")).is_empty());
}
