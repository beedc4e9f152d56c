//! The node record's rules with fakes (no root): FakeHost (FakeMounter +
//! fake loop devices), csi-store's FakeStore, and temporary directories for
//! the paths. One file over 700 lines: every case runs on the `Node`
//! harness below (and the `Twisted` mounter), which a split would have to
//! share through `common`, where root.rs would not use it.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use csi_driver::CsiError;
use csi_node::testing::FakeHost;
use csi_node::{
    Device, FilesystemMount, NodeError, NodeOutcome, NodeVolumes, PUBLISHED_TABLE, PublishState,
    STAGED_TABLE, StageState, VolumeLocator, VolumeSource,
};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_store::{CodecId, FakeStore, RawRecord, RecordStore};
use mount_utils::{
    DeviceNumber, Errno, ExecOutput, FakeAction, FakeExec, FakeOp, FsUsage, LoopOptions, MountArgs,
    MountError, MountInfo, MountSource, Mounter, SafeFormatAndMount,
};
use tonic::Code;

mod common;
use common::*;

/// A node: a temp dir with `data/<id>` directory volumes and
/// `images/<id>.img` image volumes, a fake host and a record store.
struct Node {
    dir: tempfile::TempDir,
    host: FakeHost,
    store: FakeStore,
    volumes: NodeVolumes,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        layout(dir.path());
        let host = FakeHost::new();
        let store = FakeStore::new();
        let volumes = open(dir.path(), host.mounter(), &host, &store, None);
        Self {
            dir,
            host,
            store,
            volumes,
        }
    }

    /// The same node after a plugin restart (mounts and devices kept).
    fn restart(&self) -> NodeVolumes {
        open(
            self.base(),
            self.host.mounter(),
            &self.host,
            &self.store,
            None,
        )
    }

    /// The same records after a reboot: no mounts, no loop devices.
    fn reboot(&mut self) -> NodeVolumes {
        self.host = FakeHost::new();
        self.volumes = self.restart();
        self.volumes.clone()
    }

    /// The same node with its records lost.
    fn forgetful(&self) -> NodeVolumes {
        open(
            self.base(),
            self.host.mounter(),
            &self.host,
            &FakeStore::new(),
            None,
        )
    }

    fn base(&self) -> &Path {
        self.dir.path()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.base().join(rel)
    }

    fn dir_volume(&self, id: &str) -> String {
        std::fs::create_dir(self.path(&format!("data/{id}"))).unwrap();
        id.to_owned()
    }

    fn image_volume(&self, id: &str) -> String {
        std::fs::write(self.path(&format!("images/{id}.img")), b"").unwrap();
        id.to_owned()
    }

    fn image(&self, id: &str) -> PathBuf {
        self.path(&format!("images/{id}.img"))
    }

    /// Loop devices attached now.
    fn attached(&self) -> usize {
        self.host.attached()
    }

    fn mounted(&self, path: &Path) -> Vec<MountInfo> {
        self.host.mounts_at(path)
    }
}

/// Every stored record, as `table/key`.
fn keys(store: &FakeStore) -> Vec<String> {
    [PUBLISHED_TABLE, STAGED_TABLE]
        .iter()
        .flat_map(|t| {
            let scan = store.scan(t).unwrap();
            scan.records
                .into_iter()
                .map(move |(k, _)| format!("{t}/{k}"))
        })
        .collect()
}

fn open(
    base: &Path,
    mounter: Arc<dyn Mounter>,
    host: &FakeHost,
    store: &FakeStore,
    fs: Option<Arc<dyn FilesystemMount>>,
) -> NodeVolumes {
    // Every device seam is the fake host's: nothing reads the real /dev.
    let mut b = NodeVolumes::builder(mounter, Arc::new(store.clone()), locator(base))
        .loop_devices(host.loops())
        .block_devices(host.block_devices());
    if let Some(fs) = fs {
        b = b.filesystem_mount(fs);
    }
    b.open().unwrap()
}

/// Stages and publishes a block image volume: (staging, target).
fn block_published(node: &Node, vol: &str) -> (PathBuf, PathBuf) {
    let staging = node.path(&format!("staging-{vol}"));
    let target = node.path(&format!("pods/{vol}"));
    node.volumes
        .stage(&stage(vol, &staging, block_cap()))
        .unwrap();
    node.volumes
        .publish(&publish(vol, Some(&staging), &target, block_cap(), false))
        .unwrap();
    (staging, target)
}

/// Stages and publishes a mount volume: (staging, target).
fn mount_published(node: &Node, vol: &str) -> (PathBuf, PathBuf) {
    let staging = node.path(&format!("staging-{vol}"));
    let target = node.path(&format!("pods/{vol}"));
    let cap = mount_cap(Mode::SingleNodeWriter);
    node.volumes
        .stage(&stage(vol, &staging, cap.clone()))
        .unwrap();
    node.volumes
        .publish(&publish(vol, Some(&staging), &target, cap, false))
        .unwrap();
    (staging, target)
}

#[test]
fn unstage_of_a_published_volume_is_refused_and_keeps_its_device() {
    for block in [true, false] {
        let node = Node::new();
        let vol = node.image_volume("img-1");
        let (staging, target) = if block {
            block_published(&node, &vol)
        } else {
            mount_published(&node, &vol)
        };
        node.host.fake().clear_actions();
        let refused = |v: &NodeVolumes| code(v.unstage(&unstage(&vol, &staging)));
        assert_eq!(refused(&node.volumes), Code::FailedPrecondition);
        assert_eq!(
            node.attached(),
            1,
            "the device stays with the published volume"
        );
        assert!(node.host.detached().is_empty());
        assert_eq!(node.mounted(&target).len(), 1);
        assert!(node.host.fake().actions().is_empty(), "nothing was touched");

        // Also when the records are lost: the mount table shows the device in use.
        let forgetful = node.forgetful();
        assert_eq!(refused(&forgetful), Code::FailedPrecondition);
        assert_eq!(node.attached(), 1);

        node.volumes.unpublish(&unpublish(&vol, &target)).unwrap();
        for outcome in [NodeOutcome::Changed, NodeOutcome::Unchanged] {
            assert_eq!(
                node.volumes.unstage(&unstage(&vol, &staging)).unwrap(),
                outcome
            );
        }
        assert_eq!(node.attached(), 0);
        assert!(node.mounted(&staging).is_empty());
        assert!(!target.exists(), "the target NodePublish made is gone");
        assert!(node.volumes.records().is_empty());
    }
}

#[test]
fn read_only_wins_over_rw_flags() {
    let node = Node::new();
    let vol = node.dir_volume("dir-1");
    let asked = node.path("pods/asked");
    let rw = |mode| mount_cap(mode).with_mount_flags(["rw", "noexec"]);
    node.volumes
        .publish(&publish(
            &vol,
            None,
            &asked,
            rw(Mode::MultiNodeMultiWriter),
            true,
        ))
        .unwrap();
    let by_mode = node.path("pods/by-mode");
    node.volumes
        .publish(&publish(
            &vol,
            None,
            &by_mode,
            rw(Mode::MultiNodeReaderOnly),
            false,
        ))
        .unwrap();
    for t in [&asked, &by_mode] {
        let m = node.mounted(t);
        assert!(
            m[0].is_read_only(),
            "{}: {:?}",
            t.display(),
            m[0].mount_options
        );
    }
    let writable = node.path("pods/writable");
    node.volumes
        .publish(&publish(
            &vol,
            None,
            &writable,
            rw(Mode::MultiNodeMultiWriter),
            false,
        ))
        .unwrap();
    assert!(!node.mounted(&writable)[0].is_read_only());

    // Staging a filesystem for a reader-only mode mounts it read-only too.
    let image = node.image_volume("img-ro");
    let staging = node.path("staging-ro");
    node.volumes
        .stage(&stage(&image, &staging, rw(Mode::SingleNodeReaderOnly)))
        .unwrap();
    assert!(node.mounted(&staging)[0].is_read_only());
}

/// How [`Twisted`] departs from the fake host it wraps.
enum Twist {
    /// Makes mounts writable whatever it is asked (an old kernel, a bug).
    IgnoreReadOnly,
    /// Panics right after a successful mount or bind: the plugin
    /// "crashes" between the mount and the save.
    CrashAfterMount,
    /// Blocks each bind until told to go on.
    PauseBinds {
        entered: Mutex<Sender<()>>,
        release: Mutex<Receiver<()>>,
    },
}

/// A [`FakeHost`] with a [`Twist`].
struct Twisted {
    host: FakeHost,
    twist: Twist,
}

impl Twisted {
    fn after(&self, r: Result<(), MountError>) -> Result<(), MountError> {
        r?;
        if matches!(self.twist, Twist::CrashAfterMount) {
            panic!("crash after mounting");
        }
        Ok(())
    }
}

impl Mounter for Twisted {
    fn mount_with(&self, args: &MountArgs<'_>) -> Result<(), MountError> {
        let mut options = args.options.to_vec();
        if matches!(self.twist, Twist::IgnoreReadOnly) {
            options.retain(|o| *o != "ro");
        }
        let options = &options;
        self.after(self.host.mount_with(&MountArgs { options, ..*args }))
    }
    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        let read_only = match &self.twist {
            Twist::IgnoreReadOnly => false,
            Twist::PauseBinds { entered, release } => {
                entered.lock().unwrap().send(()).unwrap();
                release.lock().unwrap().recv().unwrap();
                read_only
            }
            Twist::CrashAfterMount => read_only,
        };
        self.after(self.host.bind_mount(source, target, read_only))
    }
    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError> {
        self.host.unmount(target, lazy)
    }
    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError> {
        self.host.mount_points()
    }
    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.host.is_mount_point(path)
    }
    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        self.host.is_likely_not_mount_point(path)
    }
    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError> {
        self.host.mount_refs(path)
    }
    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError> {
        self.host.cleanup_mount_point(path)
    }
    fn remount(&self, target: &Path, options: &[&str]) -> Result<(), MountError> {
        self.host.remount(target, options)
    }
    fn mounted_at(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        self.host.mounted_at(path)
    }
    fn block_device_at(&self, path: &Path) -> Result<Option<DeviceNumber>, MountError> {
        self.host.block_device_at(path)
    }
    fn bind_source(&self, source: &Path) -> Result<MountSource, MountError> {
        self.host.bind_source(source)
    }
    fn remove_mount_point(&self, path: &Path) -> Result<(), MountError> {
        self.host.remove_mount_point(path)
    }
    fn fs_usage(&self, path: &Path) -> Result<FsUsage, MountError> {
        self.host.fs_usage(path)
    }
}

/// The node's records and host, seen through a twisted mounter.
fn twisted(node: &Node, twist: Twist) -> NodeVolumes {
    open(
        node.base(),
        Arc::new(Twisted {
            host: node.host.clone(),
            twist,
        }),
        &node.host,
        &node.store,
        None,
    )
}

#[test]
fn a_mount_that_did_not_become_read_only_is_undone() {
    let node = Node::new();
    let vol = node.dir_volume("dir-1");
    let volumes = twisted(&node, Twist::IgnoreReadOnly);
    let target = node.path("pods/t");
    for flags in [vec![], vec!["noexec"]] {
        let cap = mount_cap(Mode::SingleNodeWriter).with_mount_flags(flags);
        let err = volumes
            .publish(&publish(&vol, None, &target, cap, true))
            .unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");
        assert!(
            node.mounted(&target).is_empty(),
            "the writable mount was undone"
        );
        assert!(!target.exists());
        assert!(volumes.records().is_empty());
    }
}

#[test]
fn flag_values_reach_no_error_record_debug_or_log_line() {
    let (logs, subscriber) = csi_node::testing::requests::log_capture();
    let mut seen = Vec::new();
    tracing::subscriber::with_default(subscriber, || {
        let node = Node::new();
        let vol = node.dir_volume("dir-1");
        let target = node.path("pods/t");
        let secret = |extra: &str| {
            mount_cap(Mode::SingleNodeWriter)
                .with_mount_flags(["noatime".to_string(), format!("password=hunter2{extra}")])
        };
        // A flag that would turn the publish into a remount.
        let err = node
            .volumes
            .publish(&publish(&vol, None, &target, secret(",remount"), false))
            .unwrap_err();
        seen.push(err.to_string());
        // A mount that fails.
        node.host
            .fake()
            .inject_error(FakeOp::Mount, &target, Errno::EPERM);
        let err = node
            .volumes
            .publish(&publish(&vol, None, &target, secret(""), false))
            .unwrap_err();
        seen.push(err.to_string());
        seen.push(CsiError::from(err).to_string());
        node.host.fake().clear_errors();
        // A whole lifecycle, with a restart and the records' Debug.
        node.volumes
            .publish(&publish(&vol, None, &target, secret(""), false))
            .unwrap();
        seen.push(format!("{:?}", node.volumes.records()));
        seen.push(format!("{:?}", node.restart().restore()));
        node.volumes.unpublish(&unpublish(&vol, &target)).unwrap();
    });
    seen.push(String::from_utf8(logs.lock().unwrap().clone()).unwrap());
    assert!(seen[2].contains("publishing at"), "{}", seen[2]);
    assert!(seen.last().unwrap().contains("published"), "logging works");
    for text in seen {
        assert!(!text.contains("hunter2"), "a flag value leaked: {text}");
    }
}

#[test]
fn unpublish_never_touches_a_foreign_mount() {
    let node = Node::new();
    let vol = node.dir_volume("dir-1");
    let foreign = node.path("pods/foreign");
    std::fs::create_dir(&foreign).unwrap();
    node.host.fake().add_mount("tmpfs", &foreign, "tmpfs");
    node.host.fake().clear_actions();
    assert_eq!(
        code(node.volumes.unpublish(&unpublish(&vol, &foreign))),
        Code::NotFound
    );
    assert_eq!(node.mounted(&foreign)[0].fs_type, "tmpfs");
    assert!(foreign.is_dir());
    assert!(node.host.fake().actions().is_empty());
}

#[test]
fn a_target_is_unpublished_only_for_the_volume_recorded_there() {
    let node = Node::new();
    let (a, b) = (node.image_volume("img-a"), node.image_volume("img-b"));
    let (staging_a, target_a) = mount_published(&node, &a);
    let (staging_b, _) = mount_published(&node, &b);
    node.host.fake().clear_actions();
    for who in ["vol-unknown", b.as_str()] {
        assert_eq!(
            code(node.volumes.unpublish(&unpublish(who, &target_a))),
            Code::NotFound,
            "{who}"
        );
    }
    assert_eq!(
        code(node.volumes.unstage(&unstage(&a, &staging_b))),
        Code::NotFound
    );
    assert!(node.host.fake().actions().is_empty(), "nothing was touched");
    assert_eq!(node.mounted(&target_a).len(), 1);
    assert_eq!(node.mounted(&staging_b).len(), 1);
    assert!(
        node.volumes
            .record(&a)
            .unwrap()
            .publication(&target_a)
            .is_some()
    );
    let _ = staging_a;
}

#[test]
fn stage_and_publish_refuse_a_path_holding_another_volume() {
    let node = Node::new();
    let (a, b) = (node.image_volume("img-a"), node.image_volume("img-b"));
    let (staging_a, target_a) = mount_published(&node, &a);
    let cap = mount_cap(Mode::SingleNodeWriter);
    node.host.fake().clear_actions();
    let devices = node.attached();

    // Recorded for another volume.
    assert_eq!(
        code(node.volumes.stage(&stage(&b, &staging_a, cap.clone()))),
        Code::AlreadyExists
    );
    // Merely mounted by someone else.
    let foreign = node.path("foreign");
    std::fs::create_dir(&foreign).unwrap();
    node.host.fake().add_mount("tmpfs", &foreign, "tmpfs");
    node.host.fake().clear_actions();
    assert_eq!(
        code(node.volumes.stage(&stage(&b, &foreign, cap.clone()))),
        Code::AlreadyExists
    );
    assert_eq!(
        node.attached(),
        devices,
        "refused before attaching anything"
    );

    let staging_b = node.path("staging-b");
    node.volumes
        .stage(&stage(&b, &staging_b, cap.clone()))
        .unwrap();
    node.host.fake().clear_actions();
    for target in [&target_a, &foreign] {
        assert_eq!(
            code(
                node.volumes
                    .publish(&publish(&b, Some(&staging_b), target, cap.clone(), false))
            ),
            Code::AlreadyExists,
            "{}",
            target.display()
        );
    }
    assert!(node.host.fake().actions().is_empty());
    assert!(node.volumes.record(&b).unwrap().publications.is_empty());
}

#[test]
fn a_repeat_stage_is_ok_only_when_the_path_shows_this_volume() {
    let node = Node::new();
    let vol = node.image_volume("img-1");
    let staging = node.path("staging");
    let req = stage(&vol, &staging, mount_cap(Mode::SingleNodeWriter));
    node.volumes.stage(&req).unwrap();
    node.host.fake().clear_actions();
    assert_eq!(node.volumes.stage(&req).unwrap(), NodeOutcome::Unchanged);
    assert!(node.host.fake().actions().is_empty());

    // Someone unmounts it and mounts their own filesystem there.
    node.host.unmount(&staging, false).unwrap();
    node.host.fake().add_mount("/dev/sdz", &staging, "ext4");
    assert_eq!(code(node.volumes.stage(&req)), Code::AlreadyExists);

    // Once that is gone, a repeat mounts this volume again.
    node.host.unmount(&staging, false).unwrap();
    assert_eq!(node.volumes.stage(&req).unwrap(), NodeOutcome::Changed);
    let m = node.mounted(&staging);
    assert_eq!((m.len(), m[0].source.as_str()), (1, "/dev/loop0"));
}

#[test]
fn a_symlink_target_or_staging_path_is_never_followed() {
    let node = Node::new();
    let vol = node.dir_volume("dir-1");
    let elsewhere = node.path("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = node.path("pods/link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let cap = mount_cap(Mode::SingleNodeWriter);
    assert_eq!(
        code(
            node.volumes
                .publish(&publish(&vol, None, &link, cap.clone(), false))
        ),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(node.volumes.stage(&stage(&vol, &link, cap))),
        Code::FailedPrecondition
    );
    assert!(node.host.mounted().is_empty());
    assert!(link.is_symlink());
    // Unpublish of an unrecorded symlink: OK, the link is left alone.
    assert_eq!(
        node.volumes.unpublish(&unpublish(&vol, &link)).unwrap(),
        NodeOutcome::Unchanged
    );
    assert!(link.is_symlink() && elsewhere.is_dir());
}

#[test]
fn block_publish_never_mounts_over_a_file_with_data() {
    let node = Node::new();
    let vol = node.image_volume("img-1");
    let staging = node.path("staging");
    node.volumes
        .stage(&stage(&vol, &staging, block_cap()))
        .unwrap();
    let target = node.path("pods/user-file");
    std::fs::write(&target, b"the user's data").unwrap();
    assert_eq!(
        code(
            node.volumes
                .publish(&publish(&vol, Some(&staging), &target, block_cap(), false))
        ),
        Code::FailedPrecondition
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"the user's data");
    assert!(node.mounted(&target).is_empty());
    assert!(node.volumes.record(&vol).unwrap().publications.is_empty());

    let empty = node.path("pods/empty");
    std::fs::write(&empty, b"").unwrap();
    node.volumes
        .publish(&publish(&vol, Some(&staging), &empty, block_cap(), false))
        .unwrap();
    assert_eq!(node.mounted(&empty)[0].root, Path::new("/dev/loop0"));
}

fn crashes(f: impl FnOnce()) {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    assert!(result.is_err(), "the call was expected to crash");
}

#[test]
fn a_crash_between_publish_mount_and_save_is_completed_by_a_retry_or_undone_by_unpublish() {
    for retry in [true, false] {
        let node = Node::new();
        let vol = node.dir_volume("dir-1");
        let target = node.path("pods/t");
        let cap = mount_cap(Mode::SingleNodeWriter);
        let req = publish(&vol, None, &target, cap, false);
        crashes(|| {
            let _ = twisted(&node, Twist::CrashAfterMount).publish(&req);
        });
        assert_eq!(node.mounted(&target).len(), 1, "mounted, then crashed");
        let restarted = node.restart();
        let state = |r: &NodeVolumes| r.record(&vol).unwrap().publications[0].state;
        // A bind mount is its own evidence: no intent record is saved.
        assert!(
            restarted.record(&vol).is_none(),
            "only the outcome is saved"
        );
        if retry {
            assert_eq!(restarted.publish(&req).unwrap(), NodeOutcome::Changed);
            assert_eq!(node.mounted(&target).len(), 1, "not mounted twice");
            assert_eq!(state(&restarted), PublishState::Published);
            assert_eq!(restarted.publish(&req).unwrap(), NodeOutcome::Unchanged);
        } else {
            restarted.unpublish(&unpublish(&vol, &target)).unwrap();
            assert!(node.mounted(&target).is_empty() && !target.exists());
            assert!(keys(&node.store).is_empty());
        }
    }
}

#[test]
fn a_crash_while_staging_leaves_a_record_unstage_cleans_up() {
    let node = Node::new();
    let vol = node.image_volume("img-1");
    let staging = node.path("staging");
    crashes(|| {
        let _ = twisted(&node, Twist::CrashAfterMount).stage(&stage(
            &vol,
            &staging,
            mount_cap(Mode::SingleNodeWriter),
        ));
    });
    assert_eq!(node.attached(), 1);
    let restarted = node.restart();
    let st = restarted.record(&vol).unwrap().stage.unwrap();
    assert_eq!(st.state, StageState::Staging);
    assert_eq!(st.device.unwrap().path, Path::new("/dev/loop0"));
    restarted.unstage(&unstage(&vol, &staging)).unwrap();
    assert_eq!(node.attached(), 0);
    assert!(node.mounted(&staging).is_empty());
    assert!(restarted.records().is_empty());
}

#[test]
fn a_lost_record_neither_leaks_a_mount_or_device_nor_frees_someone_elses() {
    let node = Node::new();
    let vol = node.image_volume("img-1");
    let staging = node.path("staging");
    // Attached, then the plugin died before saving: found by backing file.
    let attach = || {
        node.host
            .loops()
            .attach_existing(node.image(&vol), &LoopOptions::default())
    };
    attach();
    let outcome = node.volumes.unstage(&unstage(&vol, &staging)).unwrap();
    assert_eq!(outcome, NodeOutcome::Changed);
    assert_eq!(node.host.detached(), [PathBuf::from("/dev/loop0")]);

    node.volumes
        .stage(&stage(&vol, &staging, mount_cap(Mode::SingleNodeWriter)))
        .unwrap();
    let forgetful = node.forgetful();
    // Verifiably this volume (its device number in mountinfo): cleaned up.
    forgetful.unstage(&unstage(&vol, &staging)).unwrap();
    assert!(node.mounted(&staging).is_empty());
    assert_eq!(node.attached(), 0);

    // Someone else's filesystem at the path: not this volume, not touched
    // (and the device stays: it may be theirs to use).
    node.host.fake().add_mount("tmpfs", &staging, "tmpfs");
    attach();
    assert_eq!(
        code(forgetful.unstage(&unstage(&vol, &staging))),
        Code::NotFound
    );
    assert_eq!(node.mounted(&staging).len(), 1);
    assert_eq!(node.attached(), 1);
}

#[test]
fn failed_calls_leave_no_record_mount_device_or_directory() {
    let node = Node::new();
    let vol = node.image_volume("img-1");
    let staging = node.path("staging");
    node.host
        .fake()
        .inject_error(FakeOp::Mount, &staging, Errno::EIO);
    assert_eq!(
        code(
            node.volumes
                .stage(&stage(&vol, &staging, mount_cap(Mode::SingleNodeWriter)))
        ),
        Code::Internal
    );
    assert!(node.volumes.records().is_empty() && keys(&node.store).is_empty());
    assert_eq!(
        node.attached(),
        0,
        "the device attached for it was detached"
    );
    assert!(!staging.exists());
    node.host.fake().clear_errors();

    let dir = node.dir_volume("dir-1");
    let target = node.path("pods/t");
    node.host
        .fake()
        .inject_error(FakeOp::BindMount, &target, Errno::EIO);
    let req = publish(
        &dir,
        None,
        &target,
        mount_cap(Mode::SingleNodeWriter),
        false,
    );
    assert_eq!(code(node.volumes.publish(&req)), Code::Internal);
    assert!(node.volumes.records().is_empty());
    assert!(!target.exists());
}

#[test]
fn a_full_record_store_fails_before_anything_is_mounted() {
    let node = Node::new();
    let vol = node.dir_volume("dir-1");
    let target = node.path("pods/t");
    node.store.set_full(true);
    let req = publish(
        &vol,
        None,
        &target,
        mount_cap(Mode::SingleNodeWriter),
        false,
    );
    assert_eq!(code(node.volumes.publish(&req)), Code::ResourceExhausted);
    assert!(
        node.host.mounted().is_empty(),
        "the outcome could not be saved, so the mount is undone"
    );
    node.store.set_full(false);
    node.volumes.publish(&req).unwrap();
}

#[test]
fn a_full_record_store_still_lets_unpublish_and_unstage_free_space() {
    let node = Node::new();
    let vol = node.image_volume("img-1");
    let (staging, target) = mount_published(&node, &vol);
    node.store.set_full(true);
    node.volumes.unpublish(&unpublish(&vol, &target)).unwrap();
    node.volumes.unstage(&unstage(&vol, &staging)).unwrap();
    assert!(node.host.mounted().is_empty());
    assert_eq!(node.attached(), 0);
    assert!(keys(&node.store).is_empty() && node.volumes.records().is_empty());
}

#[test]
fn a_formatted_volume_is_never_formatted_again() {
    let mut node = Node::new();
    let vol = node.image_volume("img-1");
    let staging = node.path("staging");
    let exec = Arc::new(FakeExec::new());
    let with_formatter = |node: &Node| {
        let sfm = SafeFormatAndMount::new(node.host.mounter(), exec.clone());
        open(
            node.base(),
            node.host.mounter(),
            &node.host,
            &node.store,
            Some(Arc::new(sfm)),
        )
    };
    exec.expect("blkid", ExecOutput::exit(2, ""));
    exec.expect("mkfs.ext4", ExecOutput::ok(""));
    let req = stage(&vol, &staging, mount_cap(Mode::SingleNodeWriter));
    with_formatter(&node).stage(&req).unwrap();
    let staged = node.restart().record(&vol).unwrap().stage.unwrap();
    assert!(staged.formatted && staged.state == StageState::Staged);

    // Reboot; the first blocks of the image got damaged: blkid finds nothing.
    node.reboot();
    exec.expect("blkid", ExecOutput::exit(2, ""));
    let volumes = with_formatter(&node);
    let report = volumes.restore();
    assert!(
        report.abnormal[&vol].contains("refusing to format"),
        "{report:?}"
    );
    let condition = volumes.volume_condition(&vol, &s(&staging)).unwrap();
    assert!(condition.abnormal);
    // The CO retries NodeStage: still refused.
    exec.expect("blkid", ExecOutput::exit(2, ""));
    assert_eq!(code(volumes.stage(&req)), Code::FailedPrecondition);
    let mkfs = exec
        .calls()
        .iter()
        .filter(|c| c.program.starts_with("mkfs"))
        .count();
    assert_eq!(mkfs, 1, "formatted once, when it was new");
    assert!(node.mounted(&staging).is_empty());
}

#[test]
fn bad_records_do_not_stop_the_plugin() {
    let mut node = Node::new();
    let good = node.dir_volume("dir-good");
    let (good_staging, good_target) = mount_published(&node, &good);
    let gone = node.image_volume("img-gone");
    let gone_staging = node.path("staging-gone");
    node.volumes
        .stage(&stage(&gone, &gone_staging, block_cap()))
        .unwrap();
    let filed = node.dir_volume("dir-filed");
    let filed_target = node.path("pods/filed");
    node.volumes
        .publish(&publish(
            &filed,
            None,
            &filed_target,
            mount_cap(Mode::SingleNodeWriter),
            false,
        ))
        .unwrap();
    let json = |bytes: &[u8]| RawRecord {
        codec: CodecId::JSON,
        bytes: bytes.to_vec(),
    };
    node.store.insert_raw(
        STAGED_TABLE,
        "vol-corrupt",
        json(b"{\"volume_id\": \"vol-corrupt\", \"stage\": 7"),
    );
    node.store
        .insert_unreadable(STAGED_TABLE, "vol-checksum", "checksum mismatch");
    let broken = node.path("pods/broken");
    node.store
        .insert_raw(PUBLISHED_TABLE, &s(&broken), json(b"\x00garbage"));

    // Reboot: mounts and loop devices are gone; the image was deleted; the
    // target directory was replaced by a file.
    std::fs::remove_file(node.image(&gone)).unwrap();
    std::fs::remove_dir(&filed_target).unwrap();
    std::fs::write(&filed_target, b"not a directory").unwrap();
    let volumes = node.reboot();
    let report = volumes.restore();
    assert_eq!(report.healthy, [good.as_str()]);
    let abnormal: Vec<&str> = report.abnormal.keys().map(String::as_str).collect();
    let broken_key = broken.display().to_string();
    assert_eq!(
        abnormal,
        [
            broken_key.as_str(),
            "dir-filed",
            "img-gone",
            "vol-checksum",
            "vol-corrupt"
        ]
    );
    assert!(report.abnormal["img-gone"].contains("image"));
    assert!(report.abnormal["dir-filed"].contains("regular file"));
    assert_eq!(std::fs::read(&filed_target).unwrap(), b"not a directory");

    // The good volume is back and healthy; the others report abnormal.
    assert_eq!(node.mounted(&good_staging).len(), 1);
    assert_eq!(node.mounted(&good_target).len(), 1);
    let ok = volumes.volume_condition(&good, &s(&good_target)).unwrap();
    assert!(!ok.abnormal, "{ok:?}");
    for (vol, path) in [
        ("dir-whatever", broken.clone()),
        ("img-gone", gone_staging.clone()),
        ("dir-filed", filed_target.clone()),
        ("vol-corrupt", node.path("anywhere")),
    ] {
        let c = volumes.volume_condition(vol, &s(&path)).unwrap();
        assert!(c.abnormal, "{vol}: {c:?}");
    }
    assert_eq!(
        code(volumes.volume_condition(&good, &s(&node.path("elsewhere")))),
        Code::NotFound
    );

    // Everything else is served: a new volume stages and publishes.
    let new = node.image_volume("img-new");
    let staging = node.path("staging-new");
    volumes.stage(&stage(&new, &staging, block_cap())).unwrap();
    // The corrupt record's volume can be staged afresh, which clears it.
    std::fs::write(node.image("vol-corrupt"), b"").unwrap();
    volumes
        .stage(&stage("vol-corrupt", &node.path("staging-c"), block_cap()))
        .unwrap();
    assert!(!volumes.abnormal().contains_key("vol-corrupt"));
}

#[test]
fn a_reboot_restores_staged_and_published_volumes_with_new_devices() {
    let mut node = Node::new();
    let first = node.image_volume("img-a");
    let vol = node.image_volume("img-b");
    let (staging, target) = block_published(&node, &vol);
    let _ = first;
    node.reboot();
    // Another image takes loop0 first after the reboot.
    node.host
        .loops()
        .attach_existing(node.image("img-a"), &LoopOptions::default());
    let report = node.volumes.restore();
    assert_eq!(report.healthy, [vol.as_str()]);
    let dev = node
        .volumes
        .record(&vol)
        .unwrap()
        .stage
        .unwrap()
        .device
        .unwrap();
    assert_eq!(dev.path, Path::new("/dev/loop1"));
    assert_eq!(node.mounted(&target)[0].root, Path::new("/dev/loop1"));
    assert!(
        !node
            .volumes
            .volume_condition(&vol, &s(&staging))
            .unwrap()
            .abnormal
    );
    let at_target = node.volumes.volume_condition(&vol, &s(&target)).unwrap();
    assert!(!at_target.abnormal, "{at_target:?}");
    let rec = node.volumes.record_at(&vol, &s(&target)).unwrap();
    assert_eq!(
        rec.stage.unwrap().device.unwrap().path,
        Path::new("/dev/loop1")
    );
    for (path, want) in [
        ("/elsewhere", Code::NotFound),
        ("relative", Code::NotFound),
        ("", Code::InvalidArgument),
    ] {
        assert_eq!(code(node.volumes.record_at(&vol, path)), want, "{path:?}");
        assert_eq!(
            code(node.volumes.volume_condition(&vol, path)),
            want,
            "{path:?}"
        );
    }
    // Unstaging still refuses while published, then detaches the new device.
    assert_eq!(
        code(node.volumes.unstage(&unstage(&vol, &staging))),
        Code::FailedPrecondition
    );
    node.volumes.unpublish(&unpublish(&vol, &target)).unwrap();
    node.volumes.unstage(&unstage(&vol, &staging)).unwrap();
    assert_eq!(node.host.attached(), 1, "img-a's device stays");
}

#[test]
fn a_call_on_a_busy_volume_or_path_is_aborted() {
    let node = Node::new();
    let (a, b) = (node.dir_volume("dir-a"), node.dir_volume("dir-b"));
    let (entered_tx, entered) = channel();
    let (release, release_rx) = channel();
    let volumes = twisted(
        &node,
        Twist::PauseBinds {
            entered: Mutex::new(entered_tx),
            release: Mutex::new(release_rx),
        },
    );
    let target = node.path("pods/t");
    let req = publish(&a, None, &target, mount_cap(Mode::SingleNodeWriter), false);
    let (v, r) = (volumes.clone(), req.clone());
    let first = std::thread::spawn(move || v.publish(&r));
    entered.recv().unwrap();
    assert_eq!(code(volumes.publish(&req)), Code::Aborted, "same volume");
    let other = publish(&b, None, &target, mount_cap(Mode::SingleNodeWriter), false);
    assert_eq!(code(volumes.publish(&other)), Code::Aborted, "same path");
    assert_eq!(
        code(volumes.unpublish(&unpublish(&a, &target))),
        Code::Aborted
    );
    release.send(()).unwrap();
    assert_eq!(first.join().unwrap().unwrap(), NodeOutcome::Changed);
    assert_eq!(code(volumes.publish(&other)), Code::AlreadyExists);
}

#[test]
fn records_are_one_per_stage_and_publication_and_deleted_when_undone() {
    let node = Node::new();
    let vol = node.image_volume("img-1");
    let (staging, target) = block_published(&node, &vol);
    assert_eq!(
        keys(&node.store),
        [
            format!("{PUBLISHED_TABLE}/{}", target.display()),
            format!("{STAGED_TABLE}/{vol}")
        ]
    );
    let reloaded = node.restart();
    assert_eq!(reloaded.records(), node.volumes.records());
    node.volumes.unpublish(&unpublish(&vol, &target)).unwrap();
    node.volumes.unstage(&unstage(&vol, &staging)).unwrap();
    assert!(keys(&node.store).is_empty());
    let actions = node.host.fake().actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, FakeAction::BindMount { .. }))
    );
}

/// A locator that tunes devices and counts how often.
struct Tuning {
    base: PathBuf,
    prepared: Mutex<Vec<(String, PathBuf)>>,
    fail: bool,
}

impl VolumeLocator for Tuning {
    fn source(&self, volume_id: &str) -> Option<VolumeSource> {
        locator(&self.base).source(volume_id)
    }

    fn prepare_device(&self, volume_id: &str, device: &Device) -> Result<(), NodeError> {
        if self.fail {
            return Err(NodeError::failed_precondition("cannot tune"));
        }
        self.prepared
            .lock()
            .unwrap()
            .push((volume_id.to_owned(), device.path.clone()));
        Ok(())
    }
}

#[test]
fn the_driver_prepares_each_device_when_staged_and_when_restored() {
    let mut node = Node::new();
    let vol = node.image_volume("img-1");
    let staging = node.path("staging");
    let with = |node: &Node, fail: bool| {
        let tuning = Arc::new(Tuning {
            base: node.base().to_path_buf(),
            prepared: Mutex::new(Vec::new()),
            fail,
        });
        let v = NodeVolumes::builder(
            node.host.mounter(),
            Arc::new(node.store.clone()),
            tuning.clone(),
        )
        .loop_devices(node.host.loops())
        .block_devices(node.host.block_devices())
        .open()
        .unwrap();
        (v, tuning)
    };
    let (failing, _) = with(&node, true);
    assert_eq!(
        code(failing.stage(&stage(&vol, &staging, block_cap()))),
        Code::FailedPrecondition
    );
    assert_eq!(node.attached(), 0, "undone");
    let (v, tuning) = with(&node, false);
    v.stage(&stage(&vol, &staging, block_cap())).unwrap();
    node.reboot();
    let (v, after) = with(&node, false);
    assert_eq!(v.restore().healthy, [vol.as_str()]);
    let dev = PathBuf::from("/dev/loop0");
    assert_eq!(
        *tuning.prepared.lock().unwrap(),
        [(vol.clone(), dev.clone())]
    );
    assert_eq!(*after.prepared.lock().unwrap(), [(vol, dev)]);
}
