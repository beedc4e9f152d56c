//! A restart with many volumes: the mount table and the list of loop
//! devices are read a bounded number of times whatever their number, and
//! calls on a volume wait (ABORTED) until the restore has put it back.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use csi_node::testing::{FakeCountingMounter, FakeHost};
use csi_node::{NodeOutcome, NodeVolumes};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_store::FakeStore;
use mount_utils::{AttachedLoop, LoopDeviceInfo, LoopDevices, LoopError, LoopOptions, Mounter};
use tonic::Code;

mod common;
use common::*;

/// Directory volumes staged with a mount and published, and image volumes
/// staged and published as raw block devices.
const DIRECTORY_VOLUMES: usize = 150;
const BLOCK_VOLUMES: usize = 50;

/// A node with every volume staged and published.
struct Busy {
    dir: tempfile::TempDir,
    store: FakeStore,
    /// Each volume's id, staging path and target.
    volumes: Vec<(String, PathBuf, PathBuf)>,
}

impl Busy {
    fn new(host: &FakeHost) -> Self {
        let dir = tempfile::tempdir().unwrap();
        layout(dir.path());
        let store = FakeStore::new();
        let node = open(dir.path(), host.mounter(), host.loops(), &store);
        let mut volumes = Vec::new();
        for i in 0..DIRECTORY_VOLUMES + BLOCK_VOLUMES {
            let block = i >= DIRECTORY_VOLUMES;
            let id = format!("vol-{i}");
            let cap = match block {
                true => block_cap(),
                false => mount_cap(Mode::SingleNodeWriter),
            };
            match block {
                true => std::fs::write(dir.path().join(format!("images/{id}.img")), b"").unwrap(),
                false => std::fs::create_dir(dir.path().join("data").join(&id)).unwrap(),
            }
            let staging = dir.path().join(format!("staging-{id}"));
            let target = dir.path().join(format!("pods/{id}"));
            node.stage(&stage(&id, &staging, cap.clone())).unwrap();
            node.publish(&publish(&id, Some(&staging), &target, cap, false))
                .unwrap();
            volumes.push((id, staging, target));
        }
        Self {
            dir,
            store,
            volumes,
        }
    }

    /// The node plugin started again on `host`, its reads of the mount
    /// table and of the loop devices counted.
    fn restart(
        &self,
        host: &FakeHost,
    ) -> (NodeVolumes, Arc<FakeCountingMounter>, Arc<CountingLoops>) {
        let counting = Arc::new(FakeCountingMounter::new(host.mounter()));
        let loops = Arc::new(CountingLoops {
            inner: host.loops(),
            scans: AtomicUsize::new(0),
        });
        let node = open(
            self.dir.path(),
            counting.clone(),
            loops.clone(),
            &self.store,
        );
        (node, counting, loops)
    }
}

fn open(
    base: &Path,
    mounter: Arc<dyn Mounter>,
    loops: Arc<dyn LoopDevices>,
    store: &FakeStore,
) -> NodeVolumes {
    // Fake devices only: nothing reads the real /dev.
    NodeVolumes::builder(mounter, Arc::new(store.clone()), locator(base))
        .loop_devices(loops)
        .block_devices(Arc::new(mount_utils::FakeBlockDevices::new()))
        .open()
        .unwrap()
}

/// Loop devices whose scans of every device (of `/sys/block` on Linux:
/// a search by backing file, or the whole list) are counted.
struct CountingLoops {
    inner: Arc<dyn LoopDevices>,
    scans: AtomicUsize,
}

impl CountingLoops {
    fn scans(&self) -> usize {
        self.scans.load(Ordering::SeqCst)
    }
}

impl LoopDevices for CountingLoops {
    fn attach(
        &self,
        backing_file: &Path,
        options: &LoopOptions,
    ) -> Result<AttachedLoop, LoopError> {
        self.inner.attach(backing_file, options)
    }

    fn find_by_backing_file(&self, backing_file: &Path) -> Result<Vec<PathBuf>, LoopError> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        self.inner.find_by_backing_file(backing_file)
    }

    fn attached(&self) -> Result<Vec<LoopDeviceInfo>, LoopError> {
        self.scans.fetch_add(1, Ordering::SeqCst);
        self.inner.attached()
    }

    fn info(&self, device: &Path) -> Result<Option<LoopDeviceInfo>, LoopError> {
        self.inner.info(device)
    }

    fn set_capacity(&self, device: &Path) -> Result<u64, LoopError> {
        self.inner.set_capacity(device)
    }

    fn detach(&self, device: &Path) -> Result<(), LoopError> {
        self.inner.detach(device)
    }
}

#[test]
fn a_restart_reads_the_mount_table_once_however_many_volumes_are_published() {
    let host = FakeHost::new();
    let busy = Busy::new(&host);
    let mounts_before = host.mounted().len();
    let (node, counting, loops) = busy.restart(&host);
    let report = node.restore();
    assert_eq!(report.healthy.len(), busy.volumes.len(), "{report:?}");
    assert!(report.abnormal.is_empty(), "{report:?}");
    assert_eq!(counting.table_reads(), 1, "one read for all volumes");
    assert_eq!(loops.scans(), 1, "one list of loop devices for all images");
    assert_eq!(host.mounted().len(), mounts_before, "nothing mounted twice");
    for (id, staging, target) in &busy.volumes {
        let at_target = node.volume_condition(id, &s(target)).unwrap();
        assert!(!at_target.abnormal, "{id}: {at_target:?}");
        assert!(!node.volume_condition(id, &s(staging)).unwrap().abnormal);
    }
    // NodeUnpublish asks about its target alone; NodeUnstage reads the
    // table once to find every use of a volume with a device (detaching it
    // under an unrecorded use would hand it on), and not at all for a
    // directory, whose binds stay valid without the stage.
    for (i, (id, staging, target)) in busy.volumes.iter().enumerate() {
        let before = counting.table_reads();
        node.unpublish(&unpublish(id, target)).unwrap();
        assert_eq!(counting.table_reads(), before, "{id}: unpublish");
        node.unstage(&unstage(id, staging)).unwrap();
        let reads = usize::from(i >= DIRECTORY_VOLUMES);
        assert_eq!(counting.table_reads(), before + reads, "{id}: unstage");
    }
    assert!(host.mounted().is_empty(), "{:?}", host.mounted());
    assert_eq!(host.attached(), 0);
}

#[test]
fn calls_on_an_image_volume_look_up_its_recorded_device_not_every_device() {
    let host = FakeHost::new();
    let busy = Busy::new(&host);
    let (node, _, loops) = busy.restart(&host);
    node.restore();
    let scans = loops.scans();
    let images = &busy.volumes[DIRECTORY_VOLUMES..];
    for (id, staging, target) in &images[1..] {
        node.unpublish(&unpublish(id, target)).unwrap();
        node.unstage(&unstage(id, staging)).unwrap();
    }
    assert_eq!(loops.scans(), scans, "each record named its device");
    // Its device detached behind the plugin's back: the record names none
    // that holds the image, so every device is looked at.
    let (id, staging, target) = &images[0];
    node.unpublish(&unpublish(id, target)).unwrap();
    let device = node.record(id).unwrap().stage.unwrap().device.unwrap();
    host.loops().detach(&device.path).unwrap();
    node.unstage(&unstage(id, staging)).unwrap();
    assert_eq!(loops.scans(), scans + 1, "its devices looked for");
    assert_eq!(host.attached(), 0);
}

#[test]
fn a_reboot_mounts_everything_again_reading_the_table_once() {
    let busy = Busy::new(&FakeHost::new());
    // After a reboot: no mounts, no loop devices, the same records.
    let host = FakeHost::new();
    let (node, counting, loops) = busy.restart(&host);
    let report = node.restore();
    assert_eq!(report.healthy.len(), busy.volumes.len(), "{report:?}");
    assert_eq!(counting.table_reads(), 1, "one read for all volumes");
    assert_eq!(loops.scans(), 1, "what it attaches needs no second list");
    for (id, staging, target) in &busy.volumes {
        assert!(!host.mounts_at(target).is_empty(), "{id} published again");
        let at_target = node.volume_condition(id, &s(target)).unwrap();
        assert!(!at_target.abnormal, "{id}: {at_target:?}");
        let block = node
            .record(id)
            .unwrap()
            .stage
            .unwrap()
            .capability
            .is_block();
        assert_eq!(
            host.mounts_at(staging).is_empty(),
            block,
            "{id} staged again"
        );
    }
    assert_eq!(host.attached(), BLOCK_VOLUMES);
}

#[test]
fn calls_on_a_volume_not_yet_restored_are_aborted_and_others_served() {
    let host = FakeHost::new();
    let busy = Busy::new(&host);
    let (node, _, _) = busy.restart(&host);
    node.begin_restore();
    let (id, staging, target) = &busy.volumes[0];
    let cap = mount_cap(Mode::SingleNodeWriter);
    let aborted = [
        code(node.stage(&stage(id, staging, cap.clone()))),
        code(node.publish(&publish(id, Some(staging), target, cap.clone(), false))),
        code(node.unpublish(&unpublish(id, target))),
        code(node.unstage(&unstage(id, staging))),
        code(node.volume_condition(id, &s(target))),
        code(node.record_at(id, &s(target))),
    ];
    assert_eq!(aborted, [Code::Aborted; 6]);
    // Another volume at a path a restoring one holds waits too.
    std::fs::create_dir(busy.dir.path().join("data/new")).unwrap();
    let taken = publish("new", None, target, cap.clone(), false);
    assert_eq!(code(node.publish(&taken)), Code::Aborted);
    // A volume the restore is not about is served meanwhile.
    let elsewhere = busy.dir.path().join("pods/new");
    node.publish(&publish("new", None, &elsewhere, cap.clone(), false))
        .unwrap();

    let report = node.restore();
    assert_eq!(report.healthy.len(), busy.volumes.len(), "{report:?}");
    assert!(!node.volume_condition(id, &s(target)).unwrap().abnormal);
    assert!(node.record("new").is_some(), "not the restore's to touch");
    node.unpublish(&unpublish(id, target)).unwrap();
    node.unpublish(&unpublish("new", &elsewhere)).unwrap();
}

#[test]
fn a_restart_that_finds_everything_in_place_asks_where_each_volume_is_once() {
    let host = FakeHost::new();
    let busy = Busy::new(&host);
    let asked = Arc::new(AtomicUsize::new(0));
    let (inner, counter) = (locator(busy.dir.path()), asked.clone());
    let counting = move |id: &str| {
        counter.fetch_add(1, Ordering::SeqCst);
        inner.source(id)
    };
    let node = NodeVolumes::builder(
        host.mounter(),
        Arc::new(busy.store.clone()),
        Arc::new(counting),
    )
    .loop_devices(host.loops())
    .open()
    .unwrap();
    let before = asked.load(Ordering::SeqCst);
    let report = node.restore();
    assert_eq!(report.healthy.len(), busy.volumes.len(), "{report:?}");
    // Its stage and its publication share what identifies its mounts.
    assert_eq!(asked.load(Ordering::SeqCst) - before, busy.volumes.len());
}

/// On a kernel without `statmount(2)` each question about a path reads the
/// whole table, so a call reads it once before its effects and answers
/// every question from that; only what it changed is asked again.
#[test]
fn without_statmount_each_call_reads_the_table_once_before_its_effects() {
    let host = FakeHost::new();
    let busy = Busy::new(&host);
    let counting = Arc::new(FakeCountingMounter::without_statmount(host.mounter()));
    let node = open(busy.dir.path(), counting.clone(), host.loops(), &busy.store);
    let reads = |f: &dyn Fn()| {
        let before = counting.table_reads();
        f();
        counting.table_reads() - before
    };
    const CHANGED: NodeOutcome = NodeOutcome::Changed;
    for (i, (id, staging, target)) in busy.volumes.iter().enumerate() {
        let block = i >= DIRECTORY_VOLUMES;
        let cap = match block {
            true => block_cap(),
            false => mount_cap(Mode::SingleNodeWriter),
        };
        let publish = publish(id, Some(staging), target, cap.clone(), false);
        let calls = [
            reads(&|| assert!(!node.volume_condition(id, &s(target)).unwrap().abnormal)),
            reads(&|| assert_eq!(node.unpublish(&unpublish(id, target)).unwrap(), CHANGED)),
            reads(&|| assert_eq!(node.unstage(&unstage(id, staging)).unwrap(), CHANGED)),
            reads(&|| {
                assert_eq!(
                    node.stage(&stage(id, staging, cap.clone())).unwrap(),
                    CHANGED
                )
            }),
            reads(&|| assert_eq!(node.publish(&publish).unwrap(), CHANGED)),
        ];
        // A mount made is checked after it (a raw block stage makes none):
        // the mounts at that path are read again.
        let stage_mounts = usize::from(!block);
        assert_eq!(calls, [1, 1, 1, 1 + stage_mounts, 2], "{id}");
    }
}
