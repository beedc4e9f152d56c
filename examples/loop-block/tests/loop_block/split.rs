//! loop-block with its controller and node as two processes.

use super::*;

/// loop-block split: `--mode controller` and `--mode node` as two
/// processes with their own state dirs and one data dir. The node learns
/// access type, size and tuning from the publish context alone, and puts
/// them back from its record after a "reboot" with no controller to ask.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn split_controller_and_node_serve_disks_from_the_publish_context() {
    require_root!("split_controller_and_node_serve_disks_from_the_publish_context");
    run_isolated_in_tempdir("loop-block-split", |dir| async move {
        let data = dir.join("data").to_string_lossy().into_owned();
        let start = |mode: &str| {
            let args = ["--mode", mode, "--datadir", &data, "--nodeid", "split-node"];
            Driver::start(LOOP_BLOCK, &dir.join(mode), &args)
        };
        let _detach = DetachUnder(PathBuf::from(&data));
        let (ctl_driver, mut node_driver) = (start("controller"), start("node"));
        let (ctl, mut node) = (ctl_driver.client().await, node_driver.client().await);
        let info = node.node().node_get_info(NodeGetInfoRequest {}).await;
        assert_eq!(info.unwrap().into_inner().node_id, "split-node");
        let list = node
            .controller()
            .list_volumes(ListVolumesRequest::default())
            .await;
        assert_eq!(list.unwrap_err().code(), Code::Unimplemented);
        let info = ctl.node().node_get_info(NodeGetInfoRequest {}).await;
        assert_eq!(info.unwrap_err().code(), Code::Unimplemented);

        let mut disks = Vec::new();
        for (name, cap) in [("pvc-fs", mount_cap("ext4")), ("pvc-raw", block_cap())] {
            let req = CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange::at_least(32 * MIB)),
                volume_capabilities: vec![cap.clone()],
                mutable_parameters: mutable(&[("readAheadKiB", "512")]),
                ..Default::default()
            };
            let (volume, node_id, publish_context) = create_and_attach_split(&ctl, req).await;
            let work = dir.join(name);
            std::fs::create_dir_all(work.join("staging")).unwrap();
            std::fs::create_dir_all(work.join("pods")).unwrap();
            let disk = Disk {
                client: node.clone(),
                image: Path::new(&data)
                    .join("volumes")
                    .join(format!("{}.img", volume.volume_id)),
                id: volume.volume_id,
                cap,
                node: node_id,
                publish_context,
                staging: work.join("staging"),
                target: work.join("pods/target"),
            };
            assert!(disk.image.is_file(), "the disk is in the shared data dir");
            disk.stage().await.unwrap();
            disk.publish().await.unwrap();
            assert_eq!(tuning_at(&disk.target), (512, false), "{name}: tuned");
            write_and_read_back(&disk.target, disk.cap.is_block(), &[0xa5; 64 << 10]);
            // A mount stage of a block disk (or the reverse) is refused:
            // the node knows the access type from the context.
            let other = if disk.cap.is_block() {
                mount_cap("ext4")
            } else {
                block_cap()
            };
            let e = disk.stage_with(other).await.unwrap_err();
            assert_eq!(e.code(), Code::FailedPrecondition, "{name}: {e:?}");
            disks.push(disk);
        }

        // The controller grows the file; the node grows the device and filesystem.
        let grown = ctl
            .controller()
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: disks[1].id.clone(),
                capacity_range: Some(CapacityRange::at_least(48 * MIB)),
                volume_capability: Some(disks[1].cap.clone()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(grown.capacity_bytes, 48 * MIB);
        let req = NodeExpandVolumeRequest {
            volume_id: disks[1].id.clone(),
            volume_path: disks[1].target.to_string_lossy().into(),
            staging_target_path: disks[1].staging.to_string_lossy().into(),
            volume_capability: Some(disks[1].cap.clone()),
            ..Default::default()
        };
        let expanded = node.node().node_expand_volume(req).await.unwrap();
        assert_eq!(expanded.into_inner().capacity_bytes, 48 * MIB);

        // The node "reboots": every mount and loop device is gone, and no
        // controller runs in its process to say how the disks were tuned.
        node_driver.kill();
        let mounter = LinuxMounter::new();
        for disk in &disks {
            mounter.unmount(&disk.target, false).unwrap();
            if !disk.cap.is_block() {
                mounter.unmount(&disk.staging, false).unwrap();
            }
            mount_utils::testing::detach_loop_devices_under(&disk.image);
        }
        node_driver.restart();
        node = node_driver.client().await;
        // A CO that detaches too early: the disk's loop device on this host
        // still keeps the controller from deleting it.
        let fs = &disks[0];
        let unpublish = ControllerUnpublishVolumeRequest {
            volume_id: fs.id.clone(),
            node_id: fs.node.clone(),
            ..Default::default()
        };
        let detached = ctl
            .controller()
            .controller_unpublish_volume(unpublish)
            .await;
        detached.unwrap();
        let delete = DeleteVolumeRequest {
            volume_id: fs.id.clone(),
            ..Default::default()
        };
        let e = ctl.controller().delete_volume(delete).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(
            e.message().contains("attached as /dev/loop"),
            "{}",
            e.message()
        );
        for disk in disks {
            assert_eq!(tuning_at(&disk.target), (512, false), "restored, tuned");
            Disk {
                client: node.clone(),
                ..disk
            }
            .tear_down_split(&ctl)
            .await;
        }
        assert_clean(&dir, Path::new(&data));
    });
}

/// Detaches every loop device of a disk under the data dir when dropped,
/// so a failing test leaves none (the drivers' own guards cover only their
/// state dirs).
struct DetachUnder(PathBuf);

impl Drop for DetachUnder {
    fn drop(&mut self) {
        mount_utils::testing::detach_loop_devices_under(&self.0);
    }
}

/// CreateVolume of `req` and ControllerPublish of its first capability on a
/// split controller, whose one node is `split-node`.
async fn create_and_attach_split(
    controller: &CsiClient,
    req: CreateVolumeRequest,
) -> (Volume, String, HashMap<String, String>) {
    let cap = req.volume_capabilities.first().cloned();
    let created = controller.controller().create_volume(req).await;
    let volume = created.expect("CreateVolume").into_inner().volume;
    let volume = volume.expect("volume");
    let node_id = "split-node".to_owned();
    let published = controller
        .controller()
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node_id.clone(),
            volume_capability: cap,
            ..Default::default()
        })
        .await
        .expect("ControllerPublishVolume");
    (volume, node_id, published.into_inner().publish_context)
}
