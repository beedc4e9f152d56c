//! The key cases with real mounts and loop devices: run as root, each in a
//! private mount namespace (its mounts vanish with it) with a guard that
//! detaches every loop device over its temporary directory. Built without
//! root, each is reported as ignored (`#[ignore]`; scripts/test.sh runs them
//! in its root pass).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_node::{NodeOutcome, NodeVolumes};
use csi_proto::v1::volume_capability::access_mode::Mode;
use csi_store::{FakeStore, FileStore, RecordStore};
use mount_utils::testing::{
    assert_no_loop_device_for, detach_loop_devices_under, have_program, in_private_mount_ns,
    is_root,
};
use mount_utils::{LinuxLoopDevices, LinuxMounter, Mounter, SafeFormatAndMount, SystemExec};
use tonic::Code;

mod common;
use common::*;

/// Detaches the loop devices over the test's files, however it ended.
struct LoopGuard(PathBuf);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        detach_loop_devices_under(&self.0);
    }
}

/// The mounters a lifecycle runs on: Linux asked about each path with
/// `statmount(2)` where the kernel has it, and the whole table read as on
/// kernels before 6.8 (each call then reads it once before its effects).
fn mounters() -> [(&'static str, LinuxMounter); 2] {
    [
        ("statmount", LinuxMounter::new()),
        ("mountinfo", LinuxMounter::new().with_statmount(false)),
    ]
}

/// Runs `f(base)` as root in a private mount namespace over a fresh
/// temporary directory with `data/`, `images/` and `pods/`.
fn as_root(name: &str, f: impl FnOnce(&Path) + Send + 'static) {
    // Built as root (so not marked ignored) but run without it: fail, never pass.
    assert!(is_root(), "{name}: needs root (euid != 0)");
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    layout(&base);
    let _guard = LoopGuard(base.clone());
    in_private_mount_ns(name, move || f(&base));
}

fn volumes<S: RecordStore + Clone + 'static>(base: &Path, store: &S) -> NodeVolumes {
    volumes_on(base, store, LinuxMounter::new())
}

fn volumes_on<S: RecordStore + Clone + 'static>(
    base: &Path,
    store: &S,
    mounter: LinuxMounter,
) -> NodeVolumes {
    let mounter: Arc<dyn Mounter> = Arc::new(mounter);
    NodeVolumes::builder(mounter.clone(), Arc::new(store.clone()), locator(base))
        .loop_devices(Arc::new(LinuxLoopDevices::new()))
        .filesystem_mount(Arc::new(SafeFormatAndMount::new(
            mounter,
            Arc::new(SystemExec::new()),
        )))
        .open()
        .unwrap()
}

fn image(base: &Path, id: &str, size: u64) -> PathBuf {
    let path = base.join("images").join(format!("{id}.img"));
    std::fs::File::create(&path).unwrap().set_len(size).unwrap();
    path
}

fn mounts_at(path: &Path) -> Vec<mount_utils::MountInfo> {
    let mut table = LinuxMounter::new().mount_points().unwrap();
    table.retain(|m| m.mount_point == path);
    table
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_block_unstage_while_published_keeps_the_device() {
    for (how, mounter) in mounters() {
        let name = format!("root_block_unstage_while_published_keeps_the_device ({how})");
        as_root(&name, move |base| {
            let img = image(base, "img-1", 8 << 20);
            let store = FakeStore::new();
            let v = volumes_on(base, &store, mounter);
            let (staging, target) = (base.join("staging"), base.join("pods/t"));
            v.stage(&stage("img-1", &staging, block_cap())).unwrap();
            v.publish(&publish(
                "img-1",
                Some(&staging),
                &target,
                block_cap(),
                false,
            ))
            .unwrap();
            let device = v.record("img-1").unwrap().stage.unwrap().device.unwrap();
            assert_eq!(
                mounts_at(&target)[0].root,
                Path::new("/").join(device.path.file_name().unwrap())
            );
            // Writes through the target reach the image.
            std::fs::write(&target, b"through the target").unwrap();
            // The pod's volumeDevices path (a link to the device) reports it healthy.
            let link = base.join("pods/device-link");
            std::os::unix::fs::symlink(&device.path, &link).unwrap();
            assert!(!v.volume_condition("img-1", &s(&link)).unwrap().abnormal);
            assert_eq!(
                code(v.volume_condition("img-1", &s(&base.join("images")))),
                Code::NotFound
            );
            std::fs::remove_file(&link).unwrap();

            assert_eq!(
                code(v.unstage(&unstage("img-1", &staging))),
                Code::FailedPrecondition
            );
            let attached = mount_utils::loopdev::find_by_backing_file(&img).unwrap();
            assert_eq!(attached, std::slice::from_ref(&device.path));

            v.unpublish(&unpublish("img-1", &target)).unwrap();
            assert!(!target.exists());
            v.unstage(&unstage("img-1", &staging)).unwrap();
            assert_no_loop_device_for(&img);
            assert!(
                std::fs::read(&img)
                    .unwrap()
                    .starts_with(b"through the target")
            );
        });
    }
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_read_only_wins_over_rw() {
    as_root("root_read_only_wins_over_rw", |base| {
        std::fs::create_dir(base.join("data/dir-1")).unwrap();
        let v = volumes(base, &FakeStore::new());
        for (name, mode, readonly) in [
            ("asked", Mode::SingleNodeWriter, true),
            ("reader", Mode::SingleNodeReaderOnly, false),
        ] {
            let target = base.join("pods").join(name);
            let cap = mount_cap(mode).with_mount_flags(["rw", "noatime"]);
            v.publish(&publish("dir-1", None, &target, cap, readonly))
                .unwrap();
            assert!(mounts_at(&target)[0].is_read_only(), "{name}");
            let err = std::fs::write(target.join("f"), b"x").unwrap_err();
            assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{name}");
            v.unpublish(&unpublish("dir-1", &target)).unwrap();
        }
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_foreign_mounts_and_symlinks_are_never_touched() {
    as_root(
        "root_foreign_mounts_and_symlinks_are_never_touched",
        |base| {
            std::fs::create_dir(base.join("data/dir-1")).unwrap();
            let v = volumes(base, &FakeStore::new());
            let cap = mount_cap(Mode::SingleNodeWriter);
            let foreign = base.join("pods/foreign");
            std::fs::create_dir(&foreign).unwrap();
            LinuxMounter::new()
                .mount("tmpfs", &foreign, "tmpfs", &["size=1m"])
                .unwrap();
            std::fs::write(foreign.join("theirs"), b"x").unwrap();

            assert_eq!(
                code(v.unpublish(&unpublish("dir-1", &foreign))),
                Code::NotFound
            );
            assert_eq!(
                code(v.publish(&publish("dir-1", None, &foreign, cap.clone(), false))),
                Code::AlreadyExists
            );
            assert_eq!(
                code(v.stage(&stage("dir-1", &foreign, cap.clone()))),
                Code::AlreadyExists
            );
            assert_eq!(mounts_at(&foreign)[0].fs_type, "tmpfs");
            assert!(foreign.join("theirs").exists());

            // A symlink target: refused, its destination never mounted on.
            let elsewhere = base.join("elsewhere");
            std::fs::create_dir(&elsewhere).unwrap();
            let link = base.join("pods/link");
            std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
            assert_eq!(
                code(v.publish(&publish("dir-1", None, &link, cap.clone(), false))),
                Code::FailedPrecondition
            );
            assert!(mounts_at(&elsewhere).is_empty() && mounts_at(&link).is_empty());

            // Another volume id at a recorded target: NOT_FOUND, still mounted.
            let target = base.join("pods/t");
            v.publish(&publish("dir-1", None, &target, cap, false))
                .unwrap();
            assert_eq!(
                code(v.unpublish(&unpublish("vol-x", &target))),
                Code::NotFound
            );
            assert_eq!(mounts_at(&target).len(), 1);
            v.unpublish(&unpublish("dir-1", &target)).unwrap();
            assert!(mounts_at(&target).is_empty() && !target.exists());
        },
    );
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_block_publish_refuses_a_file_with_data() {
    as_root("root_block_publish_refuses_a_file_with_data", |base| {
        let img = image(base, "img-1", 8 << 20);
        let v = volumes(base, &FakeStore::new());
        let staging = base.join("staging");
        v.stage(&stage("img-1", &staging, block_cap())).unwrap();
        let target = base.join("pods/user-file");
        std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o644)
            .open(&target)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"user data"))
            .unwrap();
        assert_eq!(
            code(v.publish(&publish(
                "img-1",
                Some(&staging),
                &target,
                block_cap(),
                false
            ))),
            Code::FailedPrecondition
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"user data");
        assert!(mounts_at(&target).is_empty());
        v.unstage(&unstage("img-1", &staging)).unwrap();
        assert_no_loop_device_for(&img);
    });
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_a_lost_record_is_cleaned_up_by_device_number() {
    if !have_program(
        "root_a_lost_record_is_cleaned_up_by_device_number",
        "mkfs.ext4",
    ) {
        return;
    }
    as_root(
        "root_a_lost_record_is_cleaned_up_by_device_number",
        |base| {
            let img = image(base, "img-1", 32 << 20);
            let v = volumes(base, &FakeStore::new());
            let staging = base.join("staging");
            v.stage(&stage("img-1", &staging, mount_cap(Mode::SingleNodeWriter)))
                .unwrap();
            assert_eq!(mounts_at(&staging)[0].fs_type, "ext4");

            // The record is lost: a fresh store. The mount is recognised by its
            // device number and cleaned up; the device is found by its image.
            let forgetful = volumes(base, &FakeStore::new());
            assert_eq!(
                forgetful.unstage(&unstage("img-1", &staging)).unwrap(),
                NodeOutcome::Changed
            );
            assert!(mounts_at(&staging).is_empty());
            assert_no_loop_device_for(&img);

            // A device left attached by a crash before any record: detached.
            let dev = mount_utils::LoopDevice::attach(
                &img,
                &mount_utils::LoopOptions {
                    autoclear: false,
                    ..Default::default()
                },
            )
            .unwrap()
            .keep();
            assert!(dev.exists());
            forgetful.unstage(&unstage("img-1", &staging)).unwrap();
            assert_no_loop_device_for(&img);
        },
    );
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_restart_restores_and_never_reformats_a_damaged_volume() {
    if !have_program(
        "root_restart_restores_and_never_reformats_a_damaged_volume",
        "mkfs.ext4",
    ) {
        return;
    }
    as_root(
        "root_restart_restores_and_never_reformats_a_damaged_volume",
        |base| {
            let good = image(base, "img-good", 32 << 20);
            let bad = image(base, "img-bad", 32 << 20);
            // Records on disk, as a driver keeps them.
            let store = FileStore::open(base.join("state")).unwrap();
            let v = volumes(base, &store);
            let cap = mount_cap(Mode::SingleNodeWriter);
            let mut paths = Vec::new();
            for id in ["img-good", "img-bad"] {
                let staging = base.join(format!("staging-{id}"));
                let target = base.join("pods").join(id);
                v.stage(&stage(id, &staging, cap.clone())).unwrap();
                v.publish(&publish(id, Some(&staging), &target, cap.clone(), false))
                    .unwrap();
                std::fs::write(target.join("data"), id).unwrap();
                paths.push((staging, target));
            }
            // "Reboot": every mount and device is gone; img-bad's first blocks
            // are wiped.
            let m = LinuxMounter::new();
            for (staging, target) in &paths {
                m.unmount(target, false).unwrap();
                m.unmount(staging, false).unwrap();
            }
            detach_loop_devices_under(base);
            assert_no_loop_device_for(&good);
            assert_no_loop_device_for(&bad);
            let f = std::fs::OpenOptions::new().write(true).open(&bad).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 1 << 20], 0).unwrap();
            drop(f);

            let restarted = volumes(base, &store);
            let report = restarted.restore();
            assert_eq!(report.healthy, ["img-good"]);
            assert!(
                report.abnormal["img-bad"].contains("refusing to format"),
                "{report:?}"
            );
            let (good_staging, good_target) = &paths[0];
            assert_eq!(
                std::fs::read(good_target.join("data")).unwrap(),
                b"img-good"
            );
            assert!(
                !restarted
                    .volume_condition("img-good", &s(good_target))
                    .unwrap()
                    .abnormal
            );
            let (bad_staging, bad_target) = &paths[1];
            assert!(
                restarted
                    .volume_condition("img-bad", &s(bad_target))
                    .unwrap()
                    .abnormal
            );
            assert!(mounts_at(bad_staging).is_empty());
            // Never formatted again: still no filesystem on it.
            let blkid = SystemExec::new();
            let out = mount_utils::Exec::run(&blkid, "blkid", &["-p", &s(&bad)]).unwrap();
            assert_eq!(out.code, Some(2), "img-bad was reformatted");

            for (id, (staging, target)) in ["img-good", "img-bad"].into_iter().zip(&paths) {
                restarted.unpublish(&unpublish(id, target)).unwrap();
                restarted.unstage(&unstage(id, staging)).unwrap();
            }
            assert!(mounts_at(good_staging).is_empty());
            assert_no_loop_device_for(&good);
            assert_no_loop_device_for(&bad);
        },
    );
}

/// A filesystem mounted by type and source (tmpfs) with the real kernel:
/// made in the private directory, moved to the staging path with its mount
/// id kept, published, cleaned up. The test's directory is made a shared
/// mount first, as `/` is on most hosts: `MS_MOVE` refuses a mount under a
/// shared parent, which the private directory's own private mount avoids.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_tmpfs_is_moved_to_its_staging_path_and_known_by_its_mount_id() {
    for (how, mounter) in mounters() {
        as_root(&format!("root_tmpfs ({how})"), move |base| {
            tmpfs_lifecycle(base, mounter)
        });
    }
}

fn tmpfs_lifecycle(base: &Path, mounter: LinuxMounter) {
    let mounter = shared_base_on(base, mounter);
    let tmpfs = csi_node::FilesystemSource::new("tmpfs", "csi-kit-test").options(["size=1m"]);
    let locator: Arc<dyn csi_node::VolumeLocator> =
        Arc::new(move |_: &str| Some(csi_node::VolumeSource::Filesystem(tmpfs.clone())));
    let store = FakeStore::new();
    let v = NodeVolumes::builder(mounter.clone(), Arc::new(store), locator)
        .private_mounts(base.join("private"))
        .open()
        .unwrap();
    let cap = mount_cap(Mode::SingleNodeWriter);
    let cap = csi_proto::v1::VolumeCapability {
        access_type: Some(csi_proto::v1::volume_capability::AccessType::Mount(
            Default::default(),
        )),
        ..cap
    };
    let (staging, target) = (base.join("staging"), base.join("pods/t"));
    assert_eq!(
        v.stage(&stage("fs-1", &staging, cap.clone())).unwrap(),
        NodeOutcome::Changed
    );
    let here = mounts_at(&staging);
    assert_eq!((here.len(), here[0].fs_type.as_str()), (1, "tmpfs"));
    let saved = v.record("fs-1").unwrap().stage.unwrap().mount_id;
    assert_eq!(saved, Some(here[0].mount_id), "MS_MOVE kept the id");
    assert!(mounts_at(&base.join("private/fs-1")).is_empty());
    std::fs::write(staging.join("file"), b"data").unwrap();

    v.publish(&publish(
        "fs-1",
        Some(&staging),
        &target,
        cap.clone(),
        false,
    ))
    .unwrap();
    assert_eq!(std::fs::read(target.join("file")).unwrap(), b"data");
    v.unpublish(&unpublish("fs-1", &target)).unwrap();
    v.unstage(&unstage("fs-1", &staging)).unwrap();
    assert!(mounts_at(&staging).is_empty() && v.records().is_empty());
}

/// A read-only FUSE filesystem of one file, `hello.txt`, naming its volume.
struct HelloFs {
    text: Vec<u8>,
    hung: Arc<Hang>,
}

/// Makes every [`HelloFs`] hang, as a daemon whose server went away does,
/// and counts the requests that came meanwhile.
#[derive(Default)]
struct Hang {
    on: std::sync::atomic::AtomicBool,
    requests: std::sync::atomic::AtomicUsize,
}

impl Hang {
    fn wait(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.on.load(SeqCst) {
            self.requests.fetch_add(1, SeqCst);
        }
        while self.on.load(SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

const TTL: std::time::Duration = std::time::Duration::from_secs(1);
const HELLO: fuser::INodeNo = fuser::INodeNo(2);

impl HelloFs {
    fn attr(&self, ino: fuser::INodeNo) -> Option<fuser::FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            fuser::INodeNo::ROOT => (fuser::FileType::Directory, 0o755, 0, 2),
            HELLO => (
                fuser::FileType::RegularFile,
                0o444,
                self.text.len() as u64,
                1,
            ),
            _ => return None,
        };
        let at = std::time::UNIX_EPOCH;
        Some(fuser::FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: at,
            mtime: at,
            ctime: at,
            crtime: at,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 512,
        })
    }
}

impl fuser::Filesystem for HelloFs {
    fn lookup(
        &self,
        _: &fuser::Request,
        parent: fuser::INodeNo,
        name: &std::ffi::OsStr,
        reply: fuser::ReplyEntry,
    ) {
        self.hung.wait();
        match (parent, name.to_str(), self.attr(HELLO)) {
            (fuser::INodeNo::ROOT, Some("hello.txt"), Some(a)) => {
                reply.entry(&TTL, &a, fuser::Generation(0))
            }
            _ => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn getattr(
        &self,
        _: &fuser::Request,
        ino: fuser::INodeNo,
        _: Option<fuser::FileHandle>,
        reply: fuser::ReplyAttr,
    ) {
        self.hung.wait();
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _: &fuser::Request,
        ino: fuser::INodeNo,
        _: fuser::FileHandle,
        offset: u64,
        size: u32,
        _: fuser::OpenFlags,
        _: Option<fuser::LockOwner>,
        reply: fuser::ReplyData,
    ) {
        self.hung.wait();
        if ino != HELLO {
            return reply.error(fuser::Errno::ENOENT);
        }
        let start = (offset as usize).min(self.text.len());
        let end = (start + size as usize).min(self.text.len());
        reply.data(&self.text[start..end]);
    }

    fn readdir(
        &self,
        _: &fuser::Request,
        ino: fuser::INodeNo,
        _: fuser::FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectory,
    ) {
        self.hung.wait();
        if ino != fuser::INodeNo::ROOT {
            return reply.error(fuser::Errno::ENOENT);
        }
        let entries = [
            (fuser::INodeNo::ROOT, fuser::FileType::Directory, "."),
            (fuser::INodeNo::ROOT, fuser::FileType::Directory, ".."),
            (HELLO, fuser::FileType::RegularFile, "hello.txt"),
        ];
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _: &fuser::Request, _: fuser::INodeNo, reply: fuser::ReplyStatfs) {
        self.hung.wait();
        reply.statfs(0, 0, 0, 0, 0, 512, 255, 512);
    }
}

/// A FUSE driver serving each volume in this process (a real one would
/// hand the connection to its daemon).
#[derive(Default)]
struct HelloFuse {
    sessions: std::sync::Mutex<Vec<fuser::BackgroundSession>>,
    hung: Arc<Hang>,
}

impl csi_node::VolumeLocator for HelloFuse {
    fn source(&self, volume_id: &str) -> Option<csi_node::VolumeSource> {
        let fs = csi_node::FilesystemSource::new("fuse.csikit-hello", format!("hello:{volume_id}"));
        Some(csi_node::VolumeSource::Filesystem(fs.options(["ro"])))
    }

    fn serve_fuse(
        &self,
        volume_id: &str,
        _: &csi_node::FilesystemSource,
        connection: mount_utils::FuseConnection,
    ) -> Result<(), csi_node::NodeError> {
        let fs = HelloFs {
            text: format!("volume {volume_id}\n").into_bytes(),
            hung: self.hung.clone(),
        };
        let (acl, config) = (fuser::SessionACL::All, fuser::Config::default());
        let served = fuser::Session::from_fd(fs, connection.into_fd(), acl, config)
            .and_then(fuser::Session::spawn);
        let failed =
            |e: std::io::Error| csi_node::NodeError::io("serving", Path::new(volume_id), &e);
        self.sessions.lock().unwrap().push(served.map_err(failed)?);
        Ok(())
    }
}

impl HelloFuse {
    /// Waits for every session served so far to end (their connections
    /// unmounted or aborted); whether each ended cleanly.
    fn sessions_end(&self) -> Vec<bool> {
        let sessions = std::mem::take(&mut *self.sessions.lock().unwrap());
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let results: Vec<_> = sessions.into_iter().map(|s| s.join().is_ok()).collect();
            let _ = done.send(results);
        });
        let ended = ended.recv_timeout(std::time::Duration::from_secs(10));
        ended.expect("the daemon's sessions end")
    }
}

/// Whether the test can mount FUSE filesystems (`name` says why not).
fn have_fuse(name: &str) -> bool {
    let found = Path::new(mount_utils::FUSE_DEVICE).exists();
    if !found {
        eprintln!(
            "{name}: skipped, no {} on this host",
            mount_utils::FUSE_DEVICE
        );
    }
    found
}

/// A real mounter, with `base` made a shared mount of itself (once), as
/// `/` is on most hosts: `MS_MOVE` refuses a mount under a shared parent,
/// which the private directory's own private mount avoids.
fn shared_base(base: &Path) -> Arc<dyn Mounter> {
    shared_base_on(base, LinuxMounter::new())
}

fn shared_base_on(base: &Path, mounter: LinuxMounter) -> Arc<dyn Mounter> {
    let mounter: Arc<dyn Mounter> = Arc::new(mounter);
    if !mounter.is_mount_point(base).unwrap() {
        let b = base.to_string_lossy();
        mounter.mount(&b, base, "", &["bind", "shared"]).unwrap();
    }
    mounter
}

/// A node plugin of [`HelloFuse`] over `store`, its private directory under
/// `base` ([`shared_base`]).
fn fuse_node(base: &Path, store: Arc<FakeStore>) -> (NodeVolumes, Arc<HelloFuse>) {
    let mounter = shared_base(base);
    let driver = Arc::new(HelloFuse::default());
    let locator: Arc<dyn csi_node::VolumeLocator> = driver.clone();
    let v = NodeVolumes::builder(mounter, store, locator)
        .private_mounts(base.join("private"))
        .open()
        .unwrap();
    (v, driver)
}

/// A FUSE volume `fu-1` staged and published (reader-only) by a
/// [`fuse_node`].
struct StagedFuse {
    v: NodeVolumes,
    driver: Arc<HelloFuse>,
    store: Arc<FakeStore>,
    staging: PathBuf,
    target: PathBuf,
}

/// Runs `f` as root over a staged and published FUSE volume; skipped
/// without /dev/fuse.
fn with_staged_fuse(name: &'static str, f: impl FnOnce(&Path, StagedFuse) + Send + 'static) {
    if !have_fuse(name) {
        return;
    }
    as_root(name, move |base| {
        let store = Arc::new(FakeStore::new());
        let (v, driver) = fuse_node(base, store.clone());
        let cap = mount_cap(Mode::SingleNodeReaderOnly);
        let (staging, target) = (base.join("staging"), base.join("pods/f"));
        v.stage(&stage("fu-1", &staging, cap.clone())).unwrap();
        v.publish(&publish("fu-1", Some(&staging), &target, cap, true))
            .unwrap();
        let staged = StagedFuse {
            v,
            driver,
            store,
            staging,
            target,
        };
        f(base, staged)
    });
}

/// A FUSE filesystem with the real kernel: the node opens /dev/fuse, mounts
/// through it (no fusermount, no libfuse), the driver's daemon serves the
/// connection, and what it serves is read through the staging path and a
/// publication; unstaging ends the daemon's session and leaves no mount.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_a_fuse_volume_is_served_through_the_connection_the_node_mounted() {
    let name = "root_a_fuse_volume_is_served_through_the_connection_the_node_mounted";
    with_staged_fuse(name, |_, staged| {
        let StagedFuse {
            v,
            driver,
            staging,
            target,
            ..
        } = staged;
        let here = mounts_at(&staging);
        assert_eq!(here.len(), 1, "{here:?}");
        assert_eq!(here[0].fs_type, "fuse.csikit-hello");
        let saved = v.record("fu-1").unwrap().stage.unwrap().mount_id;
        assert_eq!(saved, Some(here[0].mount_id));
        let read = std::fs::read_to_string(staging.join("hello.txt")).unwrap();
        assert_eq!(read, "volume fu-1\n");

        let read = std::fs::read_to_string(target.join("hello.txt")).unwrap();
        assert_eq!(read, "volume fu-1\n");
        let refused = std::fs::write(target.join("new"), b"x").unwrap_err();
        assert!(refused.raw_os_error().is_some(), "{refused}");
        v.unpublish(&unpublish("fu-1", &target)).unwrap();
        v.unstage(&unstage("fu-1", &staging)).unwrap();
        assert!(mounts_at(&staging).is_empty() && mounts_at(&target).is_empty());
        assert!(v.records().is_empty());
        // Unmounted, the connection ends and so does the daemon's session.
        assert_eq!(driver.sessions_end(), [true]);
    });
}

/// A restart whose FUSE daemon died (its connection aborted through the
/// kernel's fusectl, as when the daemon is killed): the staging path and
/// the publication answer ENOTCONN, and the restore takes both down and
/// mounts the volume anew through a connection the new driver serves,
/// then binds the publication again.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_a_fuse_volume_whose_daemon_died_is_mounted_anew_by_the_restore() {
    let name = "root_a_fuse_volume_whose_daemon_died_is_mounted_anew_by_the_restore";
    with_staged_fuse(name, |base, staged| {
        let StagedFuse {
            v,
            driver,
            store,
            staging,
            target,
        } = staged;
        let old = mounts_at(&staging)[0].clone();
        drop(v);

        let connections = Path::new("/sys/fs/fuse/connections");
        let fusectl = LinuxMounter::new();
        if !fusectl.is_mount_point(connections).unwrap() {
            fusectl
                .mount("fusectl", connections, "fusectl", &[])
                .unwrap();
        }
        std::fs::write(connections.join(old.minor.to_string()).join("abort"), b"1").unwrap();
        assert_eq!(driver.sessions_end(), [true], "the daemon is gone");
        let dead = std::fs::symlink_metadata(&staging).unwrap_err();
        assert_eq!(dead.raw_os_error(), Some(nix::libc::ENOTCONN), "{dead}");

        let (v, driver) = fuse_node(base, store);
        let report = v.restore();
        assert!(report.abnormal.is_empty(), "{report:?}");
        assert_eq!(report.healthy, ["fu-1"]);
        let here = mounts_at(&staging);
        assert_eq!(here.len(), 1, "{here:?}");
        let served = driver.sessions.lock().unwrap().len();
        assert_eq!(
            served, 1,
            "mounted anew, through a connection the new driver serves"
        );
        let saved = v.record("fu-1").unwrap().stage.unwrap().mount_id;
        assert_eq!(saved, Some(here[0].mount_id));
        for path in [&staging, &target] {
            let read = std::fs::read_to_string(path.join("hello.txt")).unwrap();
            assert_eq!(read, "volume fu-1\n", "{}", path.display());
        }
        assert_eq!(mounts_at(&target).len(), 1);
        assert!(
            std::fs::write(target.join("new"), b"x").is_err(),
            "still read-only"
        );
        v.unpublish(&unpublish("fu-1", &target)).unwrap();
        v.unstage(&unstage("fu-1", &staging)).unwrap();
        assert!(mounts_at(&staging).is_empty() && mounts_at(&target).is_empty());
        assert!(mounts_at(&base.join("private/fu-1")).is_empty());
        assert_eq!(driver.sessions_end(), [true]);
    });
}

/// A FUSE daemon that stops answering (as one whose server went away, or
/// a hard NFS mount of a server that is down): unpublishing and unstaging
/// its volume ask the filesystem nothing (every look at the paths uses
/// cached attributes, the read-only check the mount table), so they finish
/// and leave nothing, where a plain `lstat` would wait for ever.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_a_fuse_volume_whose_daemon_hangs_is_unpublished_and_unstaged() {
    let name = "root_a_fuse_volume_whose_daemon_hangs_is_unpublished_and_unstaged";
    with_staged_fuse(name, |_, staged| {
        use std::sync::atomic::Ordering::SeqCst;
        let StagedFuse {
            v,
            driver,
            staging,
            target,
            ..
        } = staged;
        driver.hung.on.store(true, SeqCst);
        // Past the attributes' time to live: a fresh look would ask now.
        std::thread::sleep(TTL + std::time::Duration::from_millis(200));

        let (done, finished) = std::sync::mpsc::channel();
        let (t, s) = (target.clone(), staging.clone());
        std::thread::spawn(move || {
            let unpublished = v
                .unpublish(&unpublish("fu-1", &t))
                .map_err(|e| e.to_string());
            let unstaged = v.unstage(&unstage("fu-1", &s)).map_err(|e| e.to_string());
            let _ = done.send((unpublished, unstaged, v.records().is_empty()));
        });
        let finished = finished.recv_timeout(std::time::Duration::from_secs(10));
        driver.hung.on.store(false, SeqCst);
        let Ok((unpublished, unstaged, forgotten)) = finished else {
            panic!("the teardown waited on the hung daemon");
        };
        unpublished.unwrap();
        unstaged.unwrap();
        assert!(forgotten);
        assert_eq!(
            driver.hung.requests.load(SeqCst),
            0,
            "nothing was asked of the daemon"
        );
        assert!(mounts_at(&staging).is_empty() && mounts_at(&target).is_empty());
        assert_eq!(driver.sessions_end(), [true]);
    });
}

impl csi_node::NodeBackend for HelloFuse {
    fn volume(&self, _: &str) -> Option<csi_node::VolumeInfo> {
        Some(csi_node::VolumeInfo::new(false, 0))
    }
}

/// NodeGetVolumeStats of a FUSE volume whose daemon stops answering: the
/// first call waits a bounded time for the filesystem's usage and answers
/// the volume abnormal; the calls after it answer at once while that look
/// is still unanswered (one thread waits on the daemon, not one per call,
/// so a driver's small blocking pool is never used up by them).
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_stats_of_a_fuse_volume_whose_daemon_hangs_answer_abnormal_in_bounded_time() {
    use csi_driver::{CallContext, Method, Node};
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};
    let name = "root_stats_of_a_fuse_volume_whose_daemon_hangs_answer_abnormal_in_bounded_time";
    if !have_fuse(name) {
        return;
    }
    as_root(name, |base| {
        let mounter = shared_base(base);
        let driver = Arc::new(HelloFuse::default());
        let info = csi_node::NodeInfo::new("n1");
        let node = csi_node::NodeService::builder(driver.clone(), info, mounter)
            .volumes(|v| v.private_mounts(base.join("private")))
            .open(Arc::new(FakeStore::new()))
            .unwrap();
        let cap = mount_cap(Mode::SingleNodeReaderOnly);
        let (staging, target) = (base.join("staging"), base.join("pods/f"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let ctx = CallContext::detached(0, Method::NodeGetVolumeStats);
            let req = stage("fu-1", &staging, cap.clone());
            node.node_stage_volume(&ctx, req).await.unwrap();
            let req = publish("fu-1", Some(&staging), &target, cap, true);
            node.node_publish_volume(&ctx, req).await.unwrap();
            let stats = |path: &Path| {
                let req = csi_node::testing::requests::stats_req("fu-1", path);
                node.node_get_volume_stats(&ctx, req)
            };
            let healthy = stats(&target).await.unwrap().volume_condition.unwrap();
            assert!(!healthy.abnormal, "{healthy:?}");

            driver.hung.on.store(true, SeqCst);
            std::thread::sleep(TTL + Duration::from_millis(200));
            let started = Instant::now();
            for _ in 0..6 {
                let condition = stats(&target).await.unwrap().volume_condition.unwrap();
                assert!(condition.abnormal, "{condition:?}");
                assert!(
                    condition.message.contains("does not answer"),
                    "{condition:?}"
                );
            }
            let took = started.elapsed();
            assert!(took < Duration::from_secs(9), "six calls took {took:?}");
            assert_eq!(
                driver.hung.requests.load(SeqCst),
                1,
                "one look waits on the daemon"
            );

            driver.hung.on.store(false, SeqCst);
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let condition = stats(&target).await.unwrap().volume_condition.unwrap();
                if !condition.abnormal {
                    break;
                }
                assert!(Instant::now() < deadline, "{condition:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let req = unpublish("fu-1", &target);
            node.node_unpublish_volume(&ctx, req).await.unwrap();
            let req = unstage("fu-1", &staging);
            node.node_unstage_volume(&ctx, req).await.unwrap();
        });
        assert!(mounts_at(&staging).is_empty() && mounts_at(&target).is_empty());
        assert_eq!(driver.sessions_end(), [true]);
    });
}

/// A disk the controller attached (here a loop device), named by a link as
/// udev's `/dev/disk/by-id` names are: found through the link (mounts never
/// follow one, so the node behind it is what is mounted), formatted on
/// first use only, never detached by the node, and not formatted again
/// when staged a second time.
#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn root_an_attached_disk_named_by_a_link_is_formatted_once_and_never_detached() {
    let name = "root_an_attached_disk_named_by_a_link_is_formatted_once_and_never_detached";
    if !have_program(name, "mkfs.ext4") {
        return;
    }
    for (how, mounter) in mounters() {
        as_root(&format!("{name} ({how})"), move |base| {
            attached_disk_lifecycle(base, mounter)
        });
    }
}

fn attached_disk_lifecycle(base: &Path, mounter: LinuxMounter) {
    use mount_utils::{LinuxBlockDevices, LoopDevices, LoopOptions};
    let img = image(base, "disk-1", 16 << 20);
    let loops = LinuxLoopDevices::new();
    // Left attached as a controller's attach leaves a disk (no autoclear).
    let opts = LoopOptions {
        autoclear: false,
        ..LoopOptions::default()
    };
    let dev = loops.attach(&img, &opts).unwrap().keep();
    let link = base.join("by-id/disk-1");
    std::fs::create_dir(base.join("by-id")).unwrap();
    std::os::unix::fs::symlink(&dev.path, &link).unwrap();
    let source = link.clone();
    let locator: Arc<dyn csi_node::VolumeLocator> =
        Arc::new(move |_: &str| Some(csi_node::VolumeSource::Device(source.clone())));
    let mounter: Arc<dyn Mounter> = Arc::new(mounter);
    let formatter = SafeFormatAndMount::new(mounter.clone(), Arc::new(SystemExec::new()));
    let v = NodeVolumes::builder(mounter, Arc::new(FakeStore::new()), locator)
        .block_devices(Arc::new(LinuxBlockDevices))
        .filesystem_mount(Arc::new(formatter))
        .open()
        .unwrap();
    let staging = base.join("staging");
    let req = stage("disk-1", &staging, mount_cap(Mode::SingleNodeWriter));
    v.stage(&req).unwrap();
    let here = mounts_at(&staging);
    assert_eq!(here.len(), 1);
    assert_eq!(
        (here[0].major, here[0].minor),
        (dev.device.major, dev.device.minor)
    );
    let recorded = v.record("disk-1").unwrap().stage.unwrap().device.unwrap();
    assert_eq!(recorded.path, dev.path, "the node behind the link");
    std::fs::write(staging.join("file"), b"kept").unwrap();
    v.unstage(&unstage("disk-1", &staging)).unwrap();
    assert!(mounts_at(&staging).is_empty());
    assert!(
        loops.info(&dev.path).unwrap().is_some(),
        "never detached by the node"
    );

    v.stage(&req).unwrap();
    assert_eq!(
        std::fs::read(staging.join("file")).unwrap(),
        b"kept",
        "not reformatted"
    );
    v.unstage(&unstage("disk-1", &staging)).unwrap();
    assert!(mounts_at(&staging).is_empty() && v.records().is_empty());
}
