//! The loop-block example over its real unix socket, as root, with real
//! loop devices, mkfs and mounts: the conformance suite in mount mode (ext4,
//! xfs when installed) and block mode, data surviving unstage/re-stage,
//! online expansion, re-attachment after a restart, and nothing (no mount,
//! no loop device) left behind. Group snapshots are in `loop_block/group.rs`,
//! controller and node as two processes in `loop_block/split.rs`.
//!
//! One file over 700 lines: a list of end-to-end cases over one driver
//! process helper; the two larger groups already have files of their own.

#[path = "loop_block/group.rs"]
mod group;
#[path = "loop_block/split.rs"]
mod split;
use e2e_support as support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use csi_client::CsiClient;
use csi_conformance::{Report, Status, SuiteAccessType};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_proto::v1::*;
use mount_utils::testing::{assert_no_loop_device_for, have_program};
use mount_utils::{LinuxMounter, Mounter, require_root};
use support::{
    Driver, assert_one_point_in_time, calls, create_and_attach, mounts_under, run_isolated,
    run_isolated_in_tempdir, spawn_ordered_writer,
};
use tonic::Code;

/// The driver under test, built by cargo for this package's tests.
const LOOP_BLOCK: &str = env!("CARGO_BIN_EXE_loop-block");

/// Runs the suite against a fresh loop-block; `fs_type` None means block.
async fn run_suite(fs_type: Option<&str>, size: i64, skip: &[&str]) -> Report {
    let dir = tempfile::tempdir().expect("tempdir");
    let statedir = dir.path().join("state");
    let driver = Driver::start(LOOP_BLOCK, &statedir, &[]);
    driver.client().await;
    let mut config = driver.suite_config(dir.path());
    config.volume_size = size;
    // A VolumeAttributesClass loop-block accepts, as csi-sanity is run with one.
    config.mutable_parameters = [("readAheadKiB".to_owned(), "256".to_owned())].into();
    config.access_type = match fs_type {
        Some(fs) => SuiteAccessType::Mount {
            fs_type: fs.to_owned(),
        },
        None => SuiteAccessType::Block,
    };
    for pattern in skip {
        config = config.skip(*pattern);
    }
    let report = driver.run_suite(config).await;
    let skipped: Vec<String> = report
        .results
        .iter()
        // One endpoint: the split-endpoint check has nothing to check.
        .filter(|r| r.id != "identity.split_endpoints")
        .filter_map(|r| match &r.status {
            Status::Skipped(why) => Some(format!("{}: {why}", r.id)),
            _ => None,
        })
        .filter(|s| !s.ends_with("not advertised"))
        .filter(|s| !skip.iter().any(|p| s.starts_with(p.trim_end_matches('*'))))
        .collect();
    assert_eq!(
        skipped,
        Vec::<String>::new(),
        "only what loop-block does not advertise may be skipped"
    );
    assert_clean(dir.path(), &statedir);
    report
}

/// No mount below `dir`, no loop device on any backing file in `statedir`.
fn assert_clean(dir: &Path, statedir: &Path) {
    let leftover = mounts_under(dir);
    assert!(leftover.is_empty(), "mounts left behind: {leftover:?}");
    for image in images(statedir) {
        assert_no_loop_device_for(&image);
    }
}

/// Every backing file and snapshot copy of a driver instance.
fn images(statedir: &Path) -> Vec<PathBuf> {
    ["volumes", "snapshots"]
        .iter()
        .filter_map(|d| std::fs::read_dir(statedir.join(d)).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .collect()
}

/// Suite patterns to skip for a filesystem that cannot be grown online here.
fn online_growth_skips(fs_type: &str) -> Vec<&'static str> {
    if fs_type.starts_with("ext") && !support::has_cap_sys_resource() {
        eprintln!(
            "note: node.expand_volume skipped for {fs_type}: growing a mounted ext4 needs \
             CAP_SYS_RESOURCE, which this process lacks (CapEff bit 24)"
        );
        vec!["node.expand_volume"]
    } else {
        Vec::new()
    }
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn loop_block_conformance_mount_ext4() {
    require_root!("loop_block_conformance_mount_ext4");
    if !have_program("loop_block_conformance_mount_ext4", "mkfs.ext4") {
        return;
    }
    run_isolated("loop-block-ext4", || async {
        let skips = online_growth_skips("ext4");
        run_suite(Some("ext4"), 32 << 20, &skips).await;
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn loop_block_conformance_mount_default_fs() {
    require_root!("loop_block_conformance_mount_default_fs");
    run_isolated("loop-block-default-fs", || async {
        // An empty fs_type: the driver formats ext4.
        let skips = online_growth_skips("ext4");
        run_suite(Some(""), 32 << 20, &skips).await;
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn loop_block_conformance_mount_xfs() {
    require_root!("loop_block_conformance_mount_xfs");
    if !have_program("loop_block_conformance_mount_xfs", "mkfs.xfs") {
        return;
    }
    run_isolated("loop-block-xfs", || async {
        // mkfs.xfs refuses filesystems under 300 MiB; sparse files keep it cheap.
        run_suite(Some("xfs"), 320 << 20, &[]).await;
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn loop_block_conformance_block() {
    require_root!("loop_block_conformance_block");
    run_isolated("loop-block-block", || async {
        run_suite(None, 16 << 20, &[]).await;
    });
}

/// One disk driven through the whole CO flow by hand.
#[derive(Clone)]
struct Disk {
    client: CsiClient,
    id: String,
    cap: VolumeCapability,
    node: String,
    publish_context: HashMap<String, String>,
    staging: PathBuf,
    target: PathBuf,
    image: PathBuf,
}

impl Disk {
    /// CreateVolume + ControllerPublish to this node.
    async fn create(
        client: &CsiClient,
        driver: &Driver,
        name: &str,
        cap: VolumeCapability,
        size: i64,
    ) -> Disk {
        let req = CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange::at_least(size)),
            volume_capabilities: vec![cap],
            ..Default::default()
        };
        Disk::create_from(client, driver, req).await
    }

    /// CreateVolume of `req` (one capability) + ControllerPublish to this node.
    async fn create_from(client: &CsiClient, driver: &Driver, req: CreateVolumeRequest) -> Disk {
        let (name, cap) = (req.name.clone(), req.volume_capabilities[0].clone());
        let (volume, node, publish_context) = create_and_attach(client, req).await;
        let work = driver.statedir.with_file_name(&name);
        std::fs::create_dir_all(work.join("staging")).unwrap();
        std::fs::create_dir_all(work.join("pods")).unwrap();
        Disk {
            client: client.clone(),
            image: driver
                .statedir
                .join("volumes")
                .join(format!("{}.img", volume.volume_id)),
            id: volume.volume_id,
            cap,
            node,
            publish_context,
            staging: work.join("staging"),
            target: work.join("pods/target"),
        }
    }

    async fn stage(&self) -> Result<(), tonic::Status> {
        self.stage_with(self.cap.clone()).await
    }

    async fn stage_with(&self, cap: VolumeCapability) -> Result<(), tonic::Status> {
        let req = NodeStageVolumeRequest {
            volume_id: self.id.clone(),
            publish_context: self.publish_context.clone(),
            staging_target_path: self.staging.to_string_lossy().into(),
            volume_capability: Some(cap),
            ..Default::default()
        };
        self.client.node().node_stage_volume(req).await.map(drop)
    }

    async fn publish_at(&self, target: &Path, readonly: bool) -> Result<(), tonic::Status> {
        let req = NodePublishVolumeRequest {
            volume_id: self.id.clone(),
            publish_context: self.publish_context.clone(),
            staging_target_path: self.staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(self.cap.clone()),
            readonly,
            ..Default::default()
        };
        self.client.node().node_publish_volume(req).await.map(drop)
    }

    async fn publish(&self) -> Result<(), tonic::Status> {
        self.publish_at(&self.target, false).await
    }

    async fn unpublish(&self) {
        calls::node_unpublish(&self.client, &self.id, &self.target).await;
    }

    async fn unstage(&self) {
        calls::node_unstage(&self.client, &self.id, &self.staging).await;
    }

    async fn delete(&self) -> Result<(), tonic::Status> {
        let req = DeleteVolumeRequest {
            volume_id: self.id.clone(),
            ..Default::default()
        };
        self.client.controller().delete_volume(req).await.map(drop)
    }

    /// Unpublish, unstage, ControllerUnpublish, DeleteVolume; then nothing
    /// of the disk may remain.
    async fn tear_down(&self) {
        self.unpublish().await;
        self.unstage().await;
        self.tear_down_detached().await;
    }

    /// [`tear_down`](Self::tear_down) with the Controller service on its
    /// own endpoint (`controller`, a split run).
    async fn tear_down_split(&self, controller: &CsiClient) {
        self.unpublish().await;
        self.unstage().await;
        let at_controller = Disk {
            client: controller.clone(),
            ..self.clone()
        };
        at_controller.tear_down_detached().await;
    }

    /// ControllerUnpublish and DeleteVolume of an unstaged disk.
    async fn tear_down_detached(&self) {
        calls::controller_unpublish(&self.client, &self.id, &self.node).await;
        calls::delete_volume(&self.client, &self.id).await;
        assert_no_loop_device_for(&self.image);
        assert!(!self.image.exists(), "backing file removed");
    }

    async fn stats_total(&self, path: &Path) -> i64 {
        let req = NodeGetVolumeStatsRequest {
            volume_id: self.id.clone(),
            volume_path: path.to_string_lossy().into(),
            staging_target_path: self.staging.to_string_lossy().into(),
        };
        let usage = self
            .client
            .node()
            .node_get_volume_stats(req)
            .await
            .expect("NodeGetVolumeStats")
            .into_inner()
            .usage;
        usage
            .iter()
            .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
            .expect("bytes usage")
            .total
    }

    /// ControllerExpandVolume then NodeExpandVolume on the published target.
    async fn expand(&self, bytes: i64) -> Result<i64, tonic::Status> {
        let grown = self
            .client
            .controller()
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: self.id.clone(),
                capacity_range: Some(CapacityRange::at_least(bytes)),
                volume_capability: Some(self.cap.clone()),
                ..Default::default()
            })
            .await?
            .into_inner();
        assert!(grown.node_expansion_required);
        assert_eq!(grown.capacity_bytes, bytes);
        let req = NodeExpandVolumeRequest {
            volume_id: self.id.clone(),
            volume_path: self.target.to_string_lossy().into(),
            capacity_range: Some(CapacityRange::at_least(bytes)),
            staging_target_path: self.staging.to_string_lossy().into(),
            volume_capability: Some(self.cap.clone()),
            ..Default::default()
        };
        let node = self.client.node().node_expand_volume(req).await?;
        Ok(node.into_inner().capacity_bytes)
    }
}

fn mount_cap(fs: &str) -> VolumeCapability {
    VolumeCapability::mount(fs).with_access_mode(Mode::SingleNodeWriter)
}

fn block_cap() -> VolumeCapability {
    VolumeCapability::block().with_access_mode(Mode::SingleNodeWriter)
}

/// The mount at exactly `path` in this thread's namespace.
fn mount_at(path: &Path) -> Option<mount_utils::MountInfo> {
    let text = std::fs::read("/proc/thread-self/mountinfo").expect("mountinfo");
    mount_utils::parse_mountinfo(&text)
        .expect("parse mountinfo")
        .into_iter()
        .rfind(|m| m.mount_point == path)
}

const MIB: i64 = 1 << 20;

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn data_survives_unpublish_unstage_and_restage() {
    require_root!("data_survives_unpublish_unstage_and_restage");
    run_isolated("loop-block-data", || async {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start(LOOP_BLOCK, &dir.path().join("state"), &[]);
        let client = driver.client().await;
        let cap = mount_cap("ext4").with_mount_flags(["noatime"]);
        let disk = Disk::create(&client, &driver, "pvc-data", cap, 64 * MIB).await;
        assert_eq!(
            std::fs::metadata(&disk.image).unwrap().len(),
            64 << 20,
            "sparse backing file of the requested size"
        );
        disk.stage().await.unwrap();
        disk.publish().await.unwrap();
        let staged = mount_at(&disk.staging).expect("staging mounted");
        assert_eq!(staged.fs_type, "ext4");
        assert!(staged.source.starts_with("/dev/loop"), "{}", staged.source);
        let published = mount_at(&disk.target).expect("target mounted");
        assert!(published.has_mount_option("noatime"), "mount flags applied");

        // The single-writer rules.
        let other = disk.target.with_file_name("other");
        let second = disk.publish_at(&other, false).await;
        assert_eq!(second.unwrap_err().code(), Code::FailedPrecondition);
        let restage = disk.stage_with(mount_cap("xfs")).await;
        assert_eq!(restage.unwrap_err().code(), Code::AlreadyExists);
        assert_eq!(
            disk.delete().await.unwrap_err().code(),
            Code::FailedPrecondition,
            "DeleteVolume while attached"
        );

        let data = b"written through a published loop-block mount\n".repeat(1000);
        std::fs::write(disk.target.join("data"), &data).unwrap();
        disk.unpublish().await;
        disk.unstage().await;
        assert_eq!(mounts_under(dir.path()), Vec::<PathBuf>::new());
        assert_no_loop_device_for(&disk.image);

        // Re-staging must find the filesystem, not format it again.
        disk.stage().await.unwrap();
        disk.publish().await.unwrap();
        assert_eq!(std::fs::read(disk.target.join("data")).unwrap(), data);
        assert!(
            driver.log_text().matches("formatting").count() == 1,
            "formatted exactly once"
        );
        disk.tear_down().await;
        assert_eq!(mounts_under(dir.path()), Vec::<PathBuf>::new());
    });
}

/// Grows a published filesystem volume from 320 to 640 MiB and checks
/// `df` (statvfs) of the target and NodeGetVolumeStats see it.
async fn grow_published_filesystem(fs: &str) {
    let dir = tempfile::tempdir().unwrap();
    let driver = Driver::start(LOOP_BLOCK, &dir.path().join("state"), &[]);
    let client = driver.client().await;
    let disk = Disk::create(&client, &driver, "pvc-grow", mount_cap(fs), 320 * MIB).await;
    disk.stage().await.unwrap();
    disk.publish().await.unwrap();
    let df = |p: &Path| {
        let st = nix::sys::statvfs::statvfs(p).unwrap();
        st.blocks() as i64 * st.fragment_size() as i64
    };
    let before = df(&disk.target);
    assert_eq!(disk.stats_total(&disk.target).await, before);
    let capacity = disk.expand(640 * MIB).await.unwrap_or_else(|e| {
        panic!(
            "expanding {fs}: {e}\n--- driver log ---\n{}",
            driver.log_tail(80)
        )
    });
    assert_eq!(
        capacity,
        640 * MIB,
        "NodeExpandVolume reports the device size"
    );
    let after = df(&disk.target);
    assert!(
        after > before + 250 * MIB,
        "{fs}: df size {before} -> {after} bytes"
    );
    assert_eq!(disk.stats_total(&disk.target).await, after);
    // Repeating is harmless.
    assert_eq!(disk.expand(640 * MIB).await.unwrap(), 640 * MIB);
    disk.tear_down().await;
    assert_eq!(mounts_under(dir.path()), Vec::<PathBuf>::new());
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn expansion_while_published_grows_df_size() {
    require_root!("expansion_while_published_grows_df_size");
    let mut grown = Vec::new();
    if support::has_cap_sys_resource() {
        run_isolated("loop-block-grow-ext4", || grow_published_filesystem("ext4"));
        grown.push("ext4");
    } else {
        eprintln!(
            "skipped: online ext4 growth: this process lacks CAP_SYS_RESOURCE (CapEff bit 24), \
             which resize2fs needs on a mounted ext4; the loop capacity refresh is tested in \
             block mode below"
        );
    }
    if have_program("expansion_while_published_grows_df_size (xfs)", "mkfs.xfs") {
        run_isolated("loop-block-grow-xfs", || grow_published_filesystem("xfs"));
        grown.push("xfs");
    }
    println!("online filesystem growth tested for: {grown:?}");
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn expansion_refreshes_the_loop_device_of_a_published_block_volume() {
    require_root!("expansion_refreshes_the_loop_device_of_a_published_block_volume");
    run_isolated("loop-block-grow-block", || async {
        let dir = tempfile::tempdir().unwrap();
        let driver = Driver::start(LOOP_BLOCK, &dir.path().join("state"), &[]);
        let client = driver.client().await;
        let disk = Disk::create(&client, &driver, "pvc-grow-block", block_cap(), 16 * MIB).await;
        disk.stage().await.unwrap();
        disk.publish().await.unwrap();
        let size = |p: &Path| mount_utils::block::device_size(p).unwrap() as i64;
        assert_eq!(
            size(&disk.target),
            16 * MIB,
            "device node bind-mounted at the target"
        );
        assert_eq!(disk.stats_total(&disk.target).await, 16 * MIB);
        assert_eq!(disk.expand(48 * MIB).await.unwrap(), 48 * MIB);
        assert_eq!(size(&disk.target), 48 * MIB, "loop capacity refreshed");
        assert_eq!(disk.stats_total(&disk.target).await, 48 * MIB);
        disk.tear_down().await;
        assert_eq!(mounts_under(dir.path()), Vec::<PathBuf>::new());
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn restart_reattaches_loop_devices_and_remounts_staged_volumes() {
    require_root!("restart_reattaches_loop_devices_and_remounts_staged_volumes");
    run_isolated("loop-block-restart", || async {
        let dir = tempfile::tempdir().unwrap();
        let mut driver = Driver::start(LOOP_BLOCK, &dir.path().join("state"), &[]);
        let client = driver.client().await;
        let fs = Disk::create(&client, &driver, "pvc-fs", mount_cap("ext4"), 32 * MIB).await;
        let raw = Disk::create(&client, &driver, "pvc-raw", block_cap(), 16 * MIB).await;
        for disk in [&fs, &raw] {
            disk.stage().await.unwrap();
            disk.publish().await.unwrap();
        }
        std::fs::write(fs.target.join("data"), b"before the reboot").unwrap();
        for disk in [&fs, &raw] {
            modify(&client, &disk.id, &[("readAheadKiB", "2048")])
                .await
                .unwrap();
        }

        // A crash and a "reboot": every mount and loop device is gone.
        driver.kill();
        let mounter = LinuxMounter::new();
        for path in [&fs.target, &fs.staging, &raw.target] {
            mounter.unmount(path, false).unwrap();
        }
        for image in [&fs.image, &raw.image] {
            mount_utils::testing::detach_loop_devices_under(image);
            assert_no_loop_device_for(image);
        }
        assert_eq!(mounts_under(dir.path()), Vec::<PathBuf>::new());

        driver.restart();
        let client = driver.client().await;
        assert!(
            mounter.is_mount_point(&fs.staging).unwrap(),
            "staging remounted"
        );
        assert!(
            mounter.is_mount_point(&fs.target).unwrap(),
            "target re-bound"
        );
        assert_eq!(
            std::fs::read(fs.target.join("data")).unwrap(),
            b"before the reboot"
        );
        let devices = mount_utils::loopdev::find_by_backing_file(&raw.image).unwrap();
        assert_eq!(devices.len(), 1, "block volume re-attached: {devices:?}");
        assert_eq!(
            mount_utils::block::device_size(&raw.target).unwrap(),
            16 << 20,
            "raw target bound to the new device"
        );
        for disk in [&fs, &raw] {
            assert_eq!(
                tuning_at(&disk.target),
                (2048, false),
                "re-attached with its parameters"
            );
        }
        for disk in [
            Disk {
                client: client.clone(),
                ..fs
            },
            Disk { client, ..raw },
        ] {
            disk.tear_down().await;
        }
        assert_eq!(mounts_under(dir.path()), Vec::<PathBuf>::new());
    });
}

/// The sysfs directory of the loop device behind a published target (the
/// device itself for block access, the filesystem's device for mount).
fn sysfs_of(target: &Path) -> PathBuf {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(target).expect("target");
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}"))
}

/// What the kernel applies to the disk behind `target`: read-ahead in KiB
/// and whether the loop device does direct I/O.
fn tuning_at(target: &Path) -> (u32, bool) {
    let sys = sysfs_of(target);
    let read = |f: &str| std::fs::read_to_string(sys.join(f)).expect("sysfs");
    let kib = read("queue/read_ahead_kb")
        .trim()
        .parse()
        .expect("read_ahead_kb");
    (kib, read("loop/dio").trim() == "1")
}

fn mutable(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

async fn modify(client: &CsiClient, id: &str, pairs: &[(&str, &str)]) -> Result<(), tonic::Status> {
    let req = ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: mutable(pairs),
        ..Default::default()
    };
    client
        .controller()
        .controller_modify_volume(req)
        .await
        .map(drop)
}

/// Writes and reads back through the published disk (a file on the
/// filesystem, or the raw device), synced so it reaches the backing file.
fn write_and_read_back(target: &Path, block: bool, data: &[u8]) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let path = if block {
        target.to_owned()
    } else {
        target.join("probe")
    };
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(!block)
        .truncate(false)
        .open(&path)
        .expect("open");
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = vec![0; data.len()];
    f.read_exact(&mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn modify_volume_retunes_the_attached_disk_and_every_later_attachment() {
    require_root!("modify_volume_retunes_the_attached_disk_and_every_later_attachment");
    run_isolated_in_tempdir("loop-block-modify", |dir| async move {
        let driver = Driver::start(LOOP_BLOCK, &dir.join("state"), &[]);
        let client = driver.client().await;
        for (name, cap) in [("pvc-fs", mount_cap("ext4")), ("pvc-raw", block_cap())] {
            let block = cap.is_block();
            // Created with a VolumeAttributesClass.
            let req = CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange::at_least(32 * MIB)),
                volume_capabilities: vec![cap],
                mutable_parameters: mutable(&[("readAheadKiB", "512")]),
                ..Default::default()
            };
            let disk = Disk::create_from(&client, &driver, req).await;
            disk.stage().await.unwrap();
            disk.publish().await.unwrap();
            assert_eq!(
                tuning_at(&disk.target),
                (512, false),
                "{name}: applied at attach"
            );

            // Changed while in use: the kernel applies it at once.
            modify(
                &client,
                &disk.id,
                &[("readAheadKiB", "4096"), ("directIO", "true")],
            )
            .await
            .unwrap();
            assert_eq!(
                tuning_at(&disk.target),
                (4096, true),
                "{name}: applied while published"
            );
            write_and_read_back(&disk.target, block, &[0x5a; 64 << 10]);

            // A key the driver does not know: INVALID_ARGUMENT naming it, nothing applied.
            let err = modify(
                &client,
                &disk.id,
                &[("readAheadKiB", "8"), ("iops", "3000")],
            )
            .await
            .unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            assert!(err.message().contains("iops"), "{}", err.message());
            let err = modify(&client, &disk.id, &[("readAheadKiB", "a lot")])
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument);
            assert!(err.message().contains("readAheadKiB"), "{}", err.message());
            assert_eq!(
                tuning_at(&disk.target),
                (4096, true),
                "{name}: nothing applied"
            );
            let missing = format!("vol-{}", "0".repeat(32));
            let err = modify(&client, &missing, &[("readAheadKiB", "8")]).await;
            assert_eq!(err.unwrap_err().code(), Code::NotFound);

            // Changed while detached: the next attachment has it, with the
            // values not sent kept.
            disk.unpublish().await;
            disk.unstage().await;
            assert_no_loop_device_for(&disk.image);
            modify(&client, &disk.id, &[("readAheadKiB", "1024")])
                .await
                .unwrap();
            disk.stage().await.unwrap();
            disk.publish().await.unwrap();
            assert_eq!(
                tuning_at(&disk.target),
                (1024, true),
                "{name}: applied at re-attach"
            );
            modify(&client, &disk.id, &[("directIO", "false")])
                .await
                .unwrap();
            assert_eq!(tuning_at(&disk.target), (1024, false));
            disk.tear_down().await;
        }

        // CreateVolume with a mutable parameter the driver does not accept.
        let err = client
            .controller()
            .create_volume(CreateVolumeRequest {
                name: "pvc-bad-vac".into(),
                capacity_range: Some(CapacityRange::at_least(MIB)),
                volume_capabilities: vec![block_cap()],
                mutable_parameters: mutable(&[("XXX_FakeKey", "XXX_FakeValue")]),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("XXX_FakeKey"), "{}", err.message());
        assert_eq!(
            images(&driver.statedir),
            Vec::<PathBuf>::new(),
            "nothing created"
        );
        assert_clean(&dir, &driver.statedir);
    });
}
