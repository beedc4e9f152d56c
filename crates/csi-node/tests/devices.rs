//! NodeService for a driver whose disks the controller attaches (a cloud
//! block store): the node learns everything from the request (the disk's
//! serial in the publish context, its access type in the volume context),
//! waits for the device under a by-id directory, formats it only when
//! empty and never reformats it. On a fake host: the devices are
//! `FakeBlockDevices` on a virtual clock, so nothing here reads the host's
//! `/dev` or sleeps.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use csi_driver::{CallContext, Method, Node};
use csi_node::testing::FakeHost;
use csi_node::testing::requests::*;
use csi_node::{
    NodeBackend, NodeError, NodeInfo, NodeService, StageState, VolumeContexts, VolumeInfo,
    VolumeLocator, VolumeSource, device_by_name,
};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use csi_store::FakeStore;
use mount_utils::{
    BlockDevices, DeviceNumber, ExecOutput, FakeExec, FsUsage, LoopDevices, ResizeFs,
    SafeFormatAndMount,
};
use tonic::Code;

const MIB: u64 = 1 << 20;
const SERIAL_KEY: &str = "serial";
const BY_ID: &str = "/dev/disk/by-id";
const TIMEOUT: Duration = Duration::from_secs(30);

/// The node half of a cloud block driver: no state of its own.
struct Disks;

impl VolumeLocator for Disks {
    fn source_in(
        &self,
        _volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeSource>, NodeError> {
        let field = format!("publish_context[{SERIAL_KEY}]");
        let serial = contexts.publish(SERIAL_KEY)?;
        let path = device_by_name(Path::new(BY_ID), serial, &field)?;
        Ok(Some(VolumeSource::Device(path)))
    }
}

impl NodeBackend for Disks {
    fn volume_in(
        &self,
        _volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeInfo>, NodeError> {
        let block = contexts
            .volume_context
            .get("access")
            .is_some_and(|a| a == "block");
        Ok(Some(VolumeInfo::new(block, 0)))
    }
}

struct World {
    host: FakeHost,
    exec: Arc<FakeExec>,
    node: NodeService<Disks>,
    store: FakeStore,
    dir: tempfile::TempDir,
}

fn world() -> World {
    let (host, exec) = (FakeHost::new(), Arc::new(FakeExec::new()));
    let formatter = SafeFormatAndMount::new(host.mounter(), exec.clone());
    let store = FakeStore::new();
    let node = NodeService::builder(Arc::new(Disks), NodeInfo::new("n1"), host.mounter())
        .volumes(|v| {
            v.loop_devices(host.loops())
                .block_devices(host.block_devices())
                .device_timeout(TIMEOUT)
                .filesystem_mount(Arc::new(formatter))
        })
        .resize_filesystems(ResizeFs::new(exec.clone()))
        .open(Arc::new(store.clone()))
        .unwrap();
    World {
        host,
        exec,
        node,
        store,
        dir: tempfile::tempdir().unwrap(),
    }
}

fn by_id(serial: &str) -> PathBuf {
    Path::new(BY_ID).join(serial)
}

fn stage(id: &str, serial: Option<&str>, staging: &Path, block: bool) -> NodeStageVolumeRequest {
    let mut req = stage_req(id, staging, cap(block, Mode::SingleNodeWriter, &[]));
    if let Some(s) = serial {
        req.publish_context.insert(SERIAL_KEY.into(), s.into());
    }
    if block {
        req.volume_context.insert("access".into(), "block".into());
    }
    req
}

fn ctx() -> CallContext {
    CallContext::detached(0, Method::NodeStageVolume)
}

#[tokio::test]
async fn an_attached_disk_is_waited_for_formatted_once_mounted_and_never_detached() {
    let w = world();
    let dev = DeviceNumber::new(8, 16);
    w.host
        .attach_device(&by_id("disk-1"), dev, 8 * MIB, Duration::from_secs(3));
    let staging = w.dir.path().join("staging");
    let target = w.dir.path().join("pod");

    w.exec.expect("blkid", ExecOutput::exit(2, ""));
    w.exec.expect("mkfs.ext4", ExecOutput::ok(""));
    let req = stage("vol-1", Some("disk-1"), &staging, false);
    w.node.node_stage_volume(&ctx(), req.clone()).await.unwrap();
    assert_eq!(w.host.block_devices().waited(), Duration::from_secs(3));
    let here = w.host.mounts_at(&staging);
    assert_eq!(here.len(), 1);
    assert_eq!((here[0].major, here[0].minor), (8, 16));
    assert_eq!(w.exec.pending(), 0, "blkid found nothing, mkfs ran");
    let stage_record = w.node.volumes().record("vol-1").unwrap().stage.unwrap();
    assert!(stage_record.formatted);
    assert_eq!(stage_record.source, VolumeSource::Device(by_id("disk-1")));

    // A repeat is OK and touches nothing (no blkid, no mkfs).
    w.node.node_stage_volume(&ctx(), req).await.unwrap();
    assert_eq!(w.exec.calls().len(), 2);

    let publish = publish_req(
        "vol-1",
        &staging,
        &target,
        cap(false, Mode::SingleNodeWriter, &[]),
    );
    w.node.node_publish_volume(&ctx(), publish).await.unwrap();
    w.host.set_usage(
        &target,
        FsUsage {
            total_bytes: 8 * MIB,
            ..Default::default()
        },
    );
    let stats = w
        .node
        .node_get_volume_stats(&ctx(), stats_req("vol-1", &target))
        .await
        .unwrap();
    assert!(!stats.volume_condition.unwrap().abnormal);
    assert_eq!(stats.usage[0].total, (8 * MIB) as i64);

    let unpublish = unpublish_req("vol-1", &target);
    w.node
        .node_unpublish_volume(&ctx(), unpublish)
        .await
        .unwrap();
    let unstage = unstage_req("vol-1", &staging);
    w.node.node_unstage_volume(&ctx(), unstage).await.unwrap();
    assert!(w.host.mounted().is_empty());
    assert!(w.node.volumes().records().is_empty());
    assert!(
        w.host
            .block_devices()
            .find(&by_id("disk-1"))
            .unwrap()
            .is_some(),
        "the controller detaches its disks, not the node"
    );
    assert!(w.host.detached().is_empty());
}

/// What the staging path shows after the mount is checked against the
/// device that was found and mounted: a node that turns out to be another
/// device fails the stage, and the volume is never recorded as staged.
#[tokio::test]
async fn a_mount_showing_another_device_than_the_one_found_fails_the_stage() {
    let w = world();
    let found = DeviceNumber::new(8, 16);
    w.host
        .attach_device(&by_id("disk-1"), found, MIB, Duration::ZERO);
    // Mounted, the node shows up as another device.
    w.host
        .fake()
        .add_block_device(by_id("disk-1"), DeviceNumber::new(8, 32));
    let staging = w.dir.path().join("staging");
    w.exec.expect("blkid", ExecOutput::exit(2, ""));
    w.exec.expect("mkfs.ext4", ExecOutput::ok(""));
    let req = stage("vol-1", Some("disk-1"), &staging, false);
    let e = w.node.node_stage_volume(&ctx(), req).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("does not show volume vol-1"), "{e}");
    let staged = w.node.volumes().record("vol-1").and_then(|r| r.stage);
    assert!(
        staged
            .as_ref()
            .is_none_or(|s| s.state == StageState::Staging),
        "{staged:?}"
    );
}

/// Found by the simulator (the CO tearing down a pod whose publish
/// failed): NodeUnpublish carries no contexts, so a driver that knows its
/// volumes only from them answered NOT_FOUND for a staged volume.
#[tokio::test]
async fn unpublishing_a_target_never_published_of_a_staged_volume_is_ok() {
    let w = world();
    w.host.attach_device(
        &by_id("disk-1"),
        DeviceNumber::new(8, 16),
        MIB,
        Duration::ZERO,
    );
    let staging = w.dir.path().join("staging");
    w.exec.expect("blkid", ExecOutput::exit(2, ""));
    w.exec.expect("mkfs.ext4", ExecOutput::ok(""));
    let req = stage("vol-1", Some("disk-1"), &staging, false);
    w.node.node_stage_volume(&ctx(), req).await.unwrap();
    let target = w.dir.path().join("pod-never-published");
    let unpublish = unpublish_req("vol-1", &target);
    w.node
        .node_unpublish_volume(&ctx(), unpublish)
        .await
        .unwrap();
    assert_eq!(
        w.host.mounts_at(&staging).len(),
        1,
        "the stage is untouched"
    );
    let unknown = unpublish_req("vol-2", &target);
    let e = w
        .node
        .node_unpublish_volume(&ctx(), unknown)
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::NotFound,
        "a volume neither staged nor known: {e}"
    );
    let unstage = unstage_req("vol-1", &staging);
    w.node.node_unstage_volume(&ctx(), unstage).await.unwrap();
}

#[tokio::test]
async fn a_device_that_never_appears_is_not_found_naming_it_and_leaves_nothing() {
    let w = world();
    let staging = w.dir.path().join("staging");
    let req = stage("vol-1", Some("disk-9"), &staging, false);
    let e = w.node.node_stage_volume(&ctx(), req).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(e.to_string().contains("/dev/disk/by-id/disk-9"), "{e}");
    assert_eq!(
        w.host.block_devices().waited(),
        TIMEOUT,
        "virtual time only"
    );
    assert!(w.node.volumes().records().is_empty());
    assert!(w.host.mounted().is_empty() && !staging.exists());
    assert_eq!(w.store.counts(), (0, 0), "waited for before any record");
}

/// Waiting for the device is no effect: the intent names the device, so a
/// first stage writes its record twice (the intent before the format, the
/// outcome after the mount), not a third time in between.
#[tokio::test]
async fn a_first_stage_saves_its_intent_with_the_device_and_then_its_outcome() {
    let w = world();
    let dev = DeviceNumber::new(8, 32);
    let late = Duration::from_secs(2);
    w.host.attach_device(&by_id("disk-2"), dev, MIB, late);
    let staging = w.dir.path().join("staging");
    w.exec.expect("blkid", ExecOutput::exit(2, ""));
    w.exec.expect("mkfs.ext4", ExecOutput::ok(""));
    let req = stage("vol-2", Some("disk-2"), &staging, false);
    w.node.node_stage_volume(&ctx(), req).await.unwrap();
    assert_eq!(w.host.block_devices().waited(), late);
    assert_eq!(w.store.counts(), (2, 0));
    let staged = w.node.volumes().record("vol-2").unwrap().stage.unwrap();
    let device = staged.device.expect("the device is recorded");
    assert_eq!((device.major, device.minor), (8, 32));
    let unstage = unstage_req("vol-2", &staging);
    w.node.node_unstage_volume(&ctx(), unstage).await.unwrap();
    assert!(w.host.mounted().is_empty());
}

#[tokio::test]
async fn a_publish_context_without_its_key_or_with_a_path_is_invalid_naming_the_key() {
    let w = world();
    let staging = w.dir.path().join("staging");
    for serial in [None, Some(""), Some("../sda"), Some("..")] {
        let req = stage("vol-1", serial, &staging, false);
        let e = w.node.node_stage_volume(&ctx(), req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{serial:?}: {e}");
        assert!(e.to_string().contains("publish_context[serial]"), "{e}");
    }
    assert!(w.node.volumes().records().is_empty());
    assert_eq!(w.host.block_devices().looks(), 0, "refused before any look");
}

#[tokio::test]
async fn a_disk_holding_another_filesystem_is_never_reformatted() {
    let w = world();
    let dev = DeviceNumber::new(8, 32);
    w.host
        .attach_device(&by_id("disk-2"), dev, 8 * MIB, Duration::ZERO);
    let staging = w.dir.path().join("staging");
    w.exec.expect("blkid", ExecOutput::ok("TYPE=xfs\n"));
    let mut req = stage("vol-2", Some("disk-2"), &staging, false);
    req.volume_capability =
        Some(VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter));
    let e = w.node.node_stage_volume(&ctx(), req).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("xfs"), "{e}");
    let programs: Vec<String> = w.exec.calls().into_iter().map(|c| c.program).collect();
    assert_eq!(programs, ["blkid"], "no mkfs, no mount");
    assert!(w.host.mounted().is_empty());
    assert!(
        w.node.volumes().records().is_empty(),
        "a failed first stage is undone"
    );
}

#[tokio::test]
async fn a_block_disk_is_published_as_its_device_and_grows_on_expand() {
    let w = world();
    let dev = DeviceNumber::new(8, 48);
    let path = by_id("disk-3");
    w.host.attach_device(&path, dev, 8 * MIB, Duration::ZERO);
    let (staging, target) = (w.dir.path().join("staging"), w.dir.path().join("dev"));
    let req = stage("vol-3", Some("disk-3"), &staging, true);
    w.node.node_stage_volume(&ctx(), req).await.unwrap();
    assert!(
        w.exec.calls().is_empty(),
        "a block disk is never probed or formatted"
    );
    let mut publish = publish_req(
        "vol-3",
        &staging,
        &target,
        cap(true, Mode::SingleNodeWriter, &[]),
    );
    publish
        .volume_context
        .insert("access".into(), "block".into());
    w.node.node_publish_volume(&ctx(), publish).await.unwrap();
    let here = w.host.mounts_at(&target);
    assert_eq!(here.len(), 1, "the device node is bound at the target");

    let stats = w
        .node
        .node_get_volume_stats(&ctx(), stats_req("vol-3", &staging))
        .await
        .unwrap();
    assert_eq!(stats.usage[0].total, (8 * MIB) as i64);
    w.host.block_devices().resize(&path, 16 * MIB);
    let expand = NodeExpandVolumeRequest {
        volume_id: "vol-3".into(),
        volume_path: target.to_string_lossy().into(),
        ..Default::default()
    };
    let grown = w.node.node_expand_volume(&ctx(), expand).await.unwrap();
    assert_eq!(grown.capacity_bytes, (16 * MIB) as i64);

    w.node
        .node_unpublish_volume(&ctx(), unpublish_req("vol-3", &target))
        .await
        .unwrap();
    w.node
        .node_unstage_volume(&ctx(), unstage_req("vol-3", &staging))
        .await
        .unwrap();
    assert!(w.host.mounted().is_empty() && w.node.volumes().records().is_empty());
}

/// Block stats must not read a real loop device of the host. The fake's loop
/// device here claims 3 MiB for an image of 1 MiB on disk; reading a real
/// `/dev/loopN` would give its size or nothing (then the image's 1 MiB), never
/// the fake's 3 MiB.
#[tokio::test]
async fn block_stats_come_from_the_fake_host_never_from_a_real_device() {
    struct Image(PathBuf);
    impl VolumeLocator for Image {
        fn source(&self, _: &str) -> Option<VolumeSource> {
            Some(VolumeSource::Image(self.0.clone()))
        }
    }
    impl NodeBackend for Image {
        fn volume(&self, _: &str) -> Option<VolumeInfo> {
            Some(VolumeInfo::new(true, MIB as i64))
        }
    }
    let (dir, host) = (tempfile::tempdir().unwrap(), FakeHost::new());
    let image = dir.path().join("vol.img");
    std::fs::File::create(&image).unwrap().set_len(MIB).unwrap();
    host.loops().set_backing_file(&image, 3 * MIB);
    let node = NodeService::builder(Arc::new(Image(image)), NodeInfo::new("n1"), host.mounter())
        .volumes(|v| {
            v.loop_devices(host.loops())
                .block_devices(host.block_devices())
        })
        .open(Arc::new(FakeStore::new()))
        .unwrap();
    let staging = dir.path().join("staging");
    let req = stage_req("vol-1", &staging, cap(true, Mode::SingleNodeWriter, &[]));
    node.node_stage_volume(&ctx(), req).await.unwrap();
    let attached = host.loops().attached();
    assert_eq!(attached.len(), 1);
    assert_eq!(
        host.loops().info(&attached[0].path).unwrap().unwrap().size,
        3 * MIB
    );
    let stats = node
        .node_get_volume_stats(&ctx(), stats_req("vol-1", &staging))
        .await
        .unwrap();
    assert_eq!(
        stats.usage[0].total,
        (3 * MIB) as i64,
        "the fake's size, not the host's"
    );
    node.node_unstage_volume(&ctx(), unstage_req("vol-1", &staging))
        .await
        .unwrap();
}

/// A probe changes nothing, so a first stage starts `blkid` before it saves
/// its intent (`blkid` runs while the record is flushed: mount-utils'
/// `Exec::start`); mkfs runs only once the intent is saved. The store's put
/// of the intent waits until `blkid` has started: probed after the save,
/// this stage would wait in vain and fail.
#[tokio::test]
async fn the_device_is_probed_as_the_intent_is_saved_and_formatted_after() {
    use csi_store::{CodecId, RawRecord, RawScan, RecordStore, StoreError};
    use mount_utils::{Exec, ExecError};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    #[derive(Debug, Default)]
    struct Seen {
        probing: AtomicBool,
        intent_saved: AtomicBool,
        formatted_after_intent: AtomicBool,
    }
    #[derive(Debug)]
    struct Gated(FakeStore, Arc<Seen>);
    impl RecordStore for Gated {
        fn put(
            &self,
            table: &str,
            key: &str,
            codec: CodecId,
            bytes: &[u8],
        ) -> Result<(), StoreError> {
            let first = !self.1.intent_saved.load(Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(5);
            while first && !self.1.probing.load(Ordering::SeqCst) {
                assert!(
                    Instant::now() < deadline,
                    "blkid never ran while the intent was saved"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            self.0.put(table, key, codec, bytes)?;
            self.1.intent_saved.store(true, Ordering::SeqCst);
            Ok(())
        }
        fn get(&self, table: &str, key: &str) -> Result<Option<RawRecord>, StoreError> {
            self.0.get(table, key)
        }
        fn delete(&self, table: &str, key: &str) -> Result<bool, StoreError> {
            self.0.delete(table, key)
        }
        fn scan(&self, table: &str) -> Result<RawScan, StoreError> {
            self.0.scan(table)
        }
        fn quarantine(
            &self,
            table: &str,
            key: &str,
            seen: &RawRecord,
            reason: &str,
        ) -> Result<Option<csi_store::Quarantined>, StoreError> {
            self.0.quarantine(table, key, seen, reason)
        }
        fn quarantined_keys(&self, table: &str) -> Result<Vec<String>, StoreError> {
            self.0.quarantined_keys(table)
        }
    }
    struct Watched(Arc<FakeExec>, Arc<Seen>);
    impl Exec for Watched {
        fn run(&self, program: &str, args: &[&str]) -> Result<ExecOutput, ExecError> {
            match program {
                "blkid" => self.1.probing.store(true, Ordering::SeqCst),
                _ => {
                    let saved = self.1.intent_saved.load(Ordering::SeqCst);
                    self.1.formatted_after_intent.store(saved, Ordering::SeqCst);
                }
            }
            self.0.run(program, args)
        }
    }

    let (host, exec, seen) = (FakeHost::new(), Arc::new(FakeExec::new()), Arc::default());
    let watched = Arc::new(Watched(exec.clone(), Arc::clone(&seen)));
    let formatter = SafeFormatAndMount::new(host.mounter(), watched);
    let store = FakeStore::new();
    let node = NodeService::builder(Arc::new(Disks), NodeInfo::new("n1"), host.mounter())
        .volumes(|v| {
            v.block_devices(host.block_devices())
                .device_timeout(TIMEOUT)
                .filesystem_mount(Arc::new(formatter))
        })
        .open(Arc::new(Gated(store.clone(), Arc::clone(&seen))))
        .unwrap();
    host.attach_device(
        &by_id("disk-3"),
        DeviceNumber::new(8, 48),
        MIB,
        Duration::ZERO,
    );
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    exec.expect("blkid", ExecOutput::exit(2, ""));
    exec.expect("mkfs.ext4", ExecOutput::ok(""));
    let req = stage("vol-3", Some("disk-3"), &staging, false);
    node.node_stage_volume(&ctx(), req).await.unwrap();
    let programs: Vec<String> = exec.calls().into_iter().map(|c| c.program).collect();
    assert_eq!(programs, ["blkid", "mkfs.ext4"], "probed once");
    assert!(
        seen.formatted_after_intent.load(Ordering::SeqCst),
        "mkfs after the intent"
    );
    assert_eq!(store.counts(), (2, 0), "the intent, then the outcome");
    assert_eq!(host.mounts_at(&staging).len(), 1);
}
