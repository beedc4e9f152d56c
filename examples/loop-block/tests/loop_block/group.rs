//! Group snapshots of loop-block disks in use: members frozen and cut at
//! one point in time, and a filesystem a crash left frozen thawed at start.

use super::*;

/// Lines in a file (0 when absent).
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Restores a snapshot into a new disk, mounts it and counts the lines of
/// `log` there, then removes the disk.
async fn lines_in_snapshot(client: &CsiClient, driver: &Driver, snap: &Snapshot) -> usize {
    let req = CreateVolumeRequest {
        name: format!("restore-{}", snap.snapshot_id),
        capacity_range: Some(CapacityRange::at_least(snap.size_bytes)),
        volume_capabilities: vec![mount_cap("ext4")],
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: snap.snapshot_id.clone(),
                },
            )),
        }),
        ..Default::default()
    };
    let restored = Disk::create_from(client, driver, req).await;
    restored
        .stage()
        .await
        .expect("the copy mounts: a clean filesystem");
    restored.publish().await.unwrap();
    let n = lines(&restored.target.join("log"));
    restored.tear_down().await;
    n
}

async fn group_snapshot(
    client: &CsiClient,
    name: &str,
    ids: &[&str],
) -> Result<VolumeGroupSnapshot, tonic::Status> {
    let req = CreateVolumeGroupSnapshotRequest {
        name: name.into(),
        source_volume_ids: ids.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let resp = client
        .group_controller()
        .create_volume_group_snapshot(req)
        .await?;
    Ok(resp.into_inner().group_snapshot.expect("group snapshot"))
}

async fn delete_group(client: &CsiClient, group: VolumeGroupSnapshot) {
    let req = DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id,
        snapshot_ids: group.snapshots.into_iter().map(|s| s.snapshot_id).collect(),
        ..Default::default()
    };
    client
        .group_controller()
        .delete_volume_group_snapshot(req)
        .await
        .expect("DeleteVolumeGroupSnapshot");
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn group_snapshots_freeze_the_members_and_cut_them_at_one_point_in_time() {
    require_root!("group_snapshots_freeze_the_members_and_cut_them_at_one_point_in_time");
    if !have_program("group_snapshots_freeze_the_members...", "mkfs.ext4") {
        return;
    }
    run_isolated_in_tempdir("loop-block-group", |dir| async move {
        let driver = Driver::start(LOOP_BLOCK, &dir.join("state"), &[]);
        let client = driver.client().await;
        let mut disks = Vec::new();
        for name in ["pvc-a", "pvc-b"] {
            let disk = Disk::create(&client, &driver, name, mount_cap("ext4"), 128 * MIB).await;
            disk.stage().await.unwrap();
            disk.publish().await.unwrap();
            disks.push(disk);
        }
        // A pod appends i to A's log, then i to B's, never syncing: in any
        // point-in-time copy of both, B <= A <= B + 1, and the copies only
        // see the lines if the freeze flushed them through the loop devices.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Bounded, so the 128 MiB filesystems never fill up.
        let writer = spawn_ordered_writer(
            disks[0].target.join("log"),
            disks[1].target.join("log"),
            stop.clone(),
            4_000_000,
        );
        while lines(&disks[1].target.join("log")) < 1000 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let ids = [disks[0].id.as_str(), disks[1].id.as_str()];
        for round in 0..3 {
            let group = group_snapshot(&client, &format!("group-{round}"), &ids)
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", driver.log_tail(80)));
            assert_eq!(group.snapshots.len(), 2);
            let mut counts = HashMap::new();
            for snap in &group.snapshots {
                assert_eq!(snap.group_snapshot_id, group.group_snapshot_id);
                let n = lines_in_snapshot(&client, &driver, snap).await;
                counts.insert(snap.source_volume_id.clone(), n);
            }
            assert_one_point_in_time(round, counts[ids[0]], counts[ids[1]], 1000);
            // A member is deleted with its group only.
            let err = client
                .controller()
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: group.snapshots[0].snapshot_id.clone(),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            delete_group(&client, group).await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let written = writer.join().unwrap();
        assert!(
            written >= 1000,
            "the writer never blocked for good ({written})"
        );

        // A raw block member in use cannot be frozen: refused, nothing cut,
        // and the other member is not left frozen.
        let raw = Disk::create(&client, &driver, "pvc-raw", block_cap(), 16 * MIB).await;
        raw.stage().await.unwrap();
        raw.publish().await.unwrap();
        let snapshots_before = images(&driver.statedir).len();
        let err = group_snapshot(&client, "group-raw", &[ids[0], &raw.id])
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains(&raw.id), "{}", err.message());
        assert_eq!(
            images(&driver.statedir).len(),
            snapshots_before,
            "nothing cut"
        );
        std::fs::write(disks[0].target.join("after"), b"not frozen").unwrap();
        // Detached, it has no writer and can be cut with the others.
        raw.unpublish().await;
        raw.unstage().await;
        let group = group_snapshot(&client, "group-raw", &[ids[0], &raw.id])
            .await
            .unwrap();
        delete_group(&client, group).await;
        raw.tear_down_detached().await;
        for disk in &disks {
            disk.tear_down().await;
        }
        assert_clean(&dir, &driver.statedir);
    });
}

/// Thaws a filesystem frozen with `fsfreeze` when dropped, so a failing
/// test does not leave it frozen.
struct Unfreeze(PathBuf);

impl Drop for Unfreeze {
    fn drop(&mut self) {
        let _ = mount_utils::freeze::thaw(&self.0);
    }
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn a_filesystem_left_frozen_by_a_crash_is_thawed_at_start() {
    require_root!("a_filesystem_left_frozen_by_a_crash_is_thawed_at_start");
    if !have_program("a_filesystem_left_frozen_by_a_crash...", "fsfreeze") {
        return;
    }
    run_isolated_in_tempdir("loop-block-thaw", |dir| async move {
        let mut driver = Driver::start(LOOP_BLOCK, &dir.join("state"), &[]);
        let client = driver.client().await;
        let disk = Disk::create(&client, &driver, "pvc-frozen", mount_cap("ext4"), 32 * MIB).await;
        disk.stage().await.unwrap();
        disk.publish().await.unwrap();
        // The driver dies in the middle of a group snapshot: frozen, and
        // the freezing process gone.
        let status = std::process::Command::new("fsfreeze")
            .arg("--freeze")
            .arg(&disk.staging)
            .status()
            .unwrap();
        assert!(status.success());
        let _guard = Unfreeze(disk.staging.clone());
        driver.kill();
        let (tx, rx) = std::sync::mpsc::channel();
        let file = disk.target.join("written-by-a-pod");
        std::thread::spawn(move || {
            std::fs::write(&file, b"data").unwrap();
            std::fs::File::open(&file).unwrap().sync_all().unwrap();
            let _ = tx.send(());
        });
        let wait = std::time::Duration::from_millis(300);
        assert!(rx.recv_timeout(wait).is_err(), "the pod's write waits");

        driver.restart();
        let client = driver.client().await;
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("the restarted driver thawed the filesystem");
        assert!(
            driver
                .log_text()
                .contains("thawed a filesystem left frozen")
        );
        Disk { client, ..disk }.tear_down().await;
        assert_clean(&dir, &driver.statedir);
    });
}
