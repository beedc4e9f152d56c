//! Real-mount tests of the node-safety rules: read-only whatever the flags
//! say, no symlinks followed, only our own mounts touched. They need root
//! (reported as ignored otherwise) and run in private mount namespaces; loop
//! devices are autoclear or detached by guards.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{
    assert_no_loop_device_for, have_program, in_private_mount_ns_in_tempdir, sparse_file,
};
use mount_utils::{
    DeviceNumber, Errno, Exec, LinuxLoopDevices, LinuxMounter, LoopDevices, LoopOptions,
    MountCheck, MountError, MountSource, Mounter, SystemExec, same_device,
};

fn main() {
    common::run_root_tests(&[
        (
            "read_only_stays_read_only_whatever_the_flags_say",
            read_only_stays_read_only_whatever_the_flags_say,
        ),
        (
            "remount_changes_only_what_it_names",
            remount_changes_only_what_it_names,
        ),
        (
            "symlinked_targets_are_refused_never_followed",
            symlinked_targets_are_refused_never_followed,
        ),
        (
            "only_our_own_mounts_are_unmounted_or_removed",
            only_our_own_mounts_are_unmounted_or_removed,
        ),
        (
            "fs_usage_matches_what_was_written",
            fs_usage_matches_what_was_written,
        ),
        (
            "loop_devices_through_the_trait_and_device_identity",
            loop_devices_through_the_trait_and_device_identity,
        ),
        (
            "dead_fuse_mounts_are_recognised_and_cleaned_up_only_if_ours",
            dead_fuse_mounts_are_recognised_and_cleaned_up_only_if_ours,
        ),
    ])
}

const MIB: u64 = 1 << 20;

fn dir(base: &Path, name: &str) -> PathBuf {
    let d = base.join(name);
    fs::create_dir_all(&d).unwrap();
    d
}

fn assert_erofs(path: &Path) {
    let err = fs::write(path.join("probe"), b"x").unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EROFS),
        "{}: {err}",
        path.display()
    );
}

/// Both bind implementations: the new mount API and plain mount(2).
fn mounters() -> [LinuxMounter; 2] {
    [
        LinuxMounter::new(),
        LinuxMounter::new().with_legacy_mount_api(true),
    ]
}

fn read_only_stays_read_only_whatever_the_flags_say() {
    in_private_mount_ns_in_tempdir("read_only_stays_read_only_whatever_the_flags_say", |tmp| {
        let src = dir(tmp.path(), "src");
        let m = LinuxMounter::new();
        m.mount("tmpfs", &src, "tmpfs", &["size=1m", "nosuid", "nodev"])
            .unwrap();
        let s = src.to_str().unwrap();
        for (i, m) in mounters().iter().enumerate() {
            // The driver's ro first, then a caller's flags trying to undo it.
            for (j, flags) in [
                &["bind", "ro", "rw"][..],
                &["bind", "ro", "rw,exec,suid"],
                &["ro", "bind", "rw", "nosuid"],
            ]
            .iter()
            .enumerate()
            {
                let t = dir(tmp.path(), &format!("t{i}{j}"));
                m.mount(s, &t, "", flags).unwrap();
                assert_erofs(&t);
                let e = m.mounted_at(&t).unwrap().unwrap();
                assert!(e.is_read_only(), "{flags:?}: {:?}", e.mount_options);
                assert!(e.has_mount_option("nosuid") && e.has_mount_option("nodev"));
                m.unmount(&t, false).unwrap();
            }
            let t = dir(tmp.path(), &format!("b{i}"));
            m.bind_mount(&src, &t, true).unwrap();
            assert_erofs(&t);
            m.unmount(&t, false).unwrap();
        }
        // `remount` in the caller's flags cannot reach an existing mount
        // either: on a fresh target there is nothing to remount.
        let t = dir(tmp.path(), "remount");
        let err = m.mount(s, &t, "", &["bind", "ro", "remount"]).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL), "{err}");
        assert!(!m.is_mount_point(&t).unwrap());
        // A filesystem mount: ro then rw is still read-only.
        let t = dir(tmp.path(), "tmpfs");
        m.mount("tmpfs", &t, "tmpfs", &["ro", "size=1m", "rw"])
            .unwrap();
        assert_erofs(&t);
        // The source stays writable.
        fs::write(src.join("still-rw"), b"x").unwrap();
    });
}

fn remount_changes_only_what_it_names() {
    in_private_mount_ns_in_tempdir("remount_changes_only_what_it_names", |tmp| {
        let src = dir(tmp.path(), "src");
        let t = dir(tmp.path(), "t");
        let m = LinuxMounter::new();
        m.mount("tmpfs", &src, "tmpfs", &["size=1m"]).unwrap();
        m.mount(src.to_str().unwrap(), &t, "", &["bind", "nosuid"])
            .unwrap();
        m.remount(&t, &["bind", "ro"]).unwrap();
        assert_erofs(&t);
        let e = m.mounted_at(&t).unwrap().unwrap();
        assert!(e.has_mount_option("nosuid"), "{:?}", e.mount_options);
        // An explicit rw remount is the caller's intent: writable again.
        m.remount(&t, &["bind", "rw"]).unwrap();
        fs::write(t.join("w"), b"x").unwrap();
        assert!(
            m.mounted_at(&t)
                .unwrap()
                .unwrap()
                .has_mount_option("nosuid")
        );
        // Filesystem options: a tmpfs grows.
        m.remount(&src, &["size=2m"]).unwrap();
        assert_eq!(common::fs_size(&src), 2 * MIB);
        assert!(matches!(
            m.remount(&t, &["bind", "size=4m"]),
            Err(MountError::InvalidArgument { .. })
        ));
        let not_mounted = dir(tmp.path(), "plain");
        let err = m.remount(&not_mounted, &["ro"]).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
    });
}

fn symlinked_targets_are_refused_never_followed() {
    in_private_mount_ns_in_tempdir("symlinked_targets_are_refused_never_followed", |tmp| {
        let src = dir(tmp.path(), "src");
        let victim = dir(tmp.path(), "victim");
        let pods = dir(tmp.path(), "pods");
        std::os::unix::fs::symlink(&victim, pods.join("link")).unwrap();
        std::os::unix::fs::symlink(&victim, tmp.path().join("linkdir")).unwrap();
        let inside = tmp.path().join("linkdir/sub");
        fs::create_dir(victim.join("sub")).unwrap();
        for m in mounters() {
            let symlink = |r: Result<(), MountError>| {
                assert!(matches!(r, Err(MountError::Symlink { .. })), "{r:?}");
            };
            symlink(m.mount("tmpfs", &pods.join("link"), "tmpfs", &["size=1m"]));
            symlink(m.mount("tmpfs", &inside, "tmpfs", &["size=1m"]));
            symlink(m.bind_mount(&src, &pods.join("link"), false));
            symlink(m.bind_mount(&src, &inside, true));
            symlink(m.bind_mount(&pods.join("link"), &src, false));
            assert!(!m.is_mount_point(&victim).unwrap());
            assert!(!m.is_mount_point(&victim.join("sub")).unwrap());
        }
        // Something mounted at the link's destination is not reachable
        // through the link by unmount, cleanup or queries.
        let m = LinuxMounter::new();
        m.mount("tmpfs", &victim, "tmpfs", &["size=1m"]).unwrap();
        let link = pods.join("link");
        for r in [
            m.unmount(&link, false),
            m.unmount(&link, true),
            m.cleanup_mount_point(&link),
            m.remove_mount_point(&link),
            m.remount(&link, &["ro"]),
            m.is_mount_point(&link).map(drop),
            m.mounted_at(&link).map(drop),
            m.fs_usage(&link).map(drop),
            m.unmount_all(&link).map(drop),
        ] {
            assert!(matches!(r, Err(MountError::Symlink { .. })), "{r:?}");
        }
        assert!(m.is_mount_point(&victim).unwrap());
        assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
        m.unmount(&victim, false).unwrap();
    });
}

fn only_our_own_mounts_are_unmounted_or_removed() {
    in_private_mount_ns_in_tempdir("only_our_own_mounts_are_unmounted_or_removed", |tmp| {
        let staging = dir(tmp.path(), "staging");
        let target = dir(tmp.path(), "target");
        let m = LinuxMounter::new();
        m.mount("csi-test-vol", &staging, "tmpfs", &["size=1m"])
            .unwrap();
        fs::create_dir(staging.join("sub")).unwrap();
        // Recorded before the bind, as a node record would.
        let ours = m.bind_source(&staging).unwrap();
        let staged = m.mounted_at(&staging).unwrap().unwrap();
        assert_eq!(ours, MountSource::of_mount(&staged));
        assert_eq!(
            m.check_mounted(&target, &ours).unwrap(),
            MountCheck::NotMounted
        );

        // A foreign tmpfs at the target: refused, still mounted, kept.
        m.mount("foreign", &target, "tmpfs", &["size=1m"]).unwrap();
        fs::write(target.join("theirs"), b"x").unwrap();
        assert!(matches!(
            m.check_mounted(&target, &ours).unwrap(),
            MountCheck::Foreign(e) if e.source == "foreign"
        ));
        let err = m.cleanup_mount_point_owned(&target, &ours).unwrap_err();
        assert!(matches!(err, MountError::NotOurs { .. }), "{err}");
        assert!(m.unmount_if_source(&target, &ours).is_err());
        assert!(target.join("theirs").exists());

        // Ours stacked on top of it: ours goes, theirs stays.
        m.bind_mount(&staging, &target, false).unwrap();
        let e = m.mounted_at(&target).unwrap().unwrap();
        assert_eq!(
            (e.fs_type.as_str(), e.source.as_str()),
            ("tmpfs", "csi-test-vol")
        );
        assert!(m.check_mounted(&target, &ours).unwrap().is_ours());
        let err = m.cleanup_mount_point_owned(&target, &ours).unwrap_err();
        assert!(matches!(err, MountError::NotOurs { .. }));
        assert!(
            target.join("theirs").exists(),
            "the foreign mount is back on top"
        );
        m.unmount(&target, false).unwrap();

        // A bind of a subdirectory is another source.
        m.bind_mount(&staging.join("sub"), &target, false).unwrap();
        assert!(!m.check_mounted(&target, &ours).unwrap().is_ours());
        let sub = m.bind_source(&staging.join("sub")).unwrap();
        assert!(m.check_mounted(&target, &sub).unwrap().is_ours());
        assert!(m.unmount_if_source(&target, &sub).unwrap());

        // Ours, twice: both unmounted and the directory removed.
        m.bind_mount(&staging, &target, true).unwrap();
        m.bind_mount(&staging, &target, false).unwrap();
        m.cleanup_mount_point_owned(&target, &ours).unwrap();
        assert!(!target.exists());
        m.cleanup_mount_point_owned(&target, &ours).unwrap();

        // unmount_all keeps the directory.
        m.bind_mount(&staging, &staging.join("sub"), false).unwrap();
        let keep = dir(tmp.path(), "keep");
        m.mount("tmpfs", &keep, "tmpfs", &["size=1m"]).unwrap();
        m.mount("tmpfs", &keep, "tmpfs", &["size=1m"]).unwrap();
        assert_eq!(m.unmount_all(&keep).unwrap(), 2);
        assert!(keep.is_dir() && !m.is_mount_point(&keep).unwrap());
        assert_eq!(
            m.remove_mount_point(&staging).unwrap_err().errno(),
            Some(Errno::EBUSY)
        );
    });
}

fn fs_usage_matches_what_was_written() {
    in_private_mount_ns_in_tempdir("fs_usage_matches_what_was_written", |tmp| {
        let t = dir(tmp.path(), "t");
        let m = LinuxMounter::new();
        m.mount("tmpfs", &t, "tmpfs", &["size=4m", "nr_inodes=100"])
            .unwrap();
        let before = m.fs_usage(&t).unwrap();
        assert_eq!(before.total_bytes, 4 * MIB);
        assert_eq!(before.total_inodes, 100);
        fs::write(t.join("f"), vec![1u8; MIB as usize]).unwrap();
        let after = m.fs_usage(&t).unwrap();
        assert_eq!(after.used_bytes - before.used_bytes, MIB);
        assert_eq!(after.available_bytes, before.available_bytes - MIB);
        assert_eq!(after.used_inodes, before.used_inodes + 1);
        assert_eq!(after.used_inodes + after.free_inodes, 100);
    });
}

fn loop_devices_through_the_trait_and_device_identity() {
    in_private_mount_ns_in_tempdir(
        "loop_devices_through_the_trait_and_device_identity",
        |tmp| {
            let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
            sparse_file(&a, 16 * MIB);
            sparse_file(&b, 8 * MIB);
            let loops = LinuxLoopDevices::new();
            let m = LinuxMounter::new();
            {
                let dev_a = loops.attach(&a, &LoopOptions::default()).unwrap();
                let dev_b = loops.attach(&b, &LoopOptions::default()).unwrap();
                let info = dev_a.info().clone();
                assert_eq!(info.backing_file, a.canonicalize().unwrap());
                assert_eq!(info.size, 16 * MIB);
                assert!(info.autoclear && !info.read_only);
                assert_eq!(
                    info.device,
                    DeviceNumber::of_block_device(&info.path).unwrap()
                );
                assert_eq!(loops.info(&info.path).unwrap(), Some(info.clone()));
                assert_eq!(
                    loops.find_by_backing_file(&a).unwrap(),
                    vec![info.path.clone()]
                );

                // Raw block publish: the device node bound onto a file.
                let target = tmp.path().join("publish");
                fs::File::create(&target).unwrap();
                let expected = m.bind_source(&info.path).unwrap();
                assert_eq!(expected, MountSource::DeviceNode(info.device));
                m.bind_mount(&info.path, &target, false).unwrap();
                assert_eq!(m.block_device_at(&target).unwrap(), Some(info.device));
                assert!(same_device(&target, &info.path).unwrap());
                assert!(!same_device(&target, dev_b.path()).unwrap());
                assert!(m.check_mounted(&target, &expected).unwrap().is_ours());
                let other = MountSource::DeviceNode(dev_b.info().device);
                assert!(!m.check_mounted(&target, &other).unwrap().is_ours());
                m.cleanup_mount_point_owned(&target, &expected).unwrap();
                assert!(!target.exists());

                // Growth through the trait.
                fs::File::options()
                    .write(true)
                    .open(&a)
                    .unwrap()
                    .set_len(32 * MIB)
                    .unwrap();
                assert_eq!(loops.set_capacity(&info.path).unwrap(), 32 * MIB);

                // A filesystem on the device is `Device(rdev)` at the staging path.
                if have_program("loop_devices_through_the_trait", "mkfs.ext4") {
                    let dev = info.path.to_str().unwrap();
                    let out = SystemExec::new().run("mkfs.ext4", &["-q", dev]).unwrap();
                    assert!(out.success(), "{}", out.stderr);
                    let staging = dir(tmp.path(), "staging");
                    m.mount(dev, &staging, "ext4", &["ro", "rw"]).unwrap();
                    assert_erofs(&staging);
                    let staged = MountSource::Device(info.device);
                    assert!(m.check_mounted(&staging, &staged).unwrap().is_ours());
                    let wrong = MountSource::Device(dev_b.info().device);
                    assert!(m.unmount_if_source(&staging, &wrong).is_err());
                    assert!(m.unmount_if_source(&staging, &staged).unwrap());
                }
                dev_b.detach().unwrap();
                // Dropping dev_a's handle detaches it.
            }
            assert_no_loop_device_for(&a);
            assert_no_loop_device_for(&b);

            // Kept devices stay until detached; info of a detached one is None.
            let kept = loops
                .attach(
                    &a,
                    &LoopOptions {
                        autoclear: false,
                        ..LoopOptions::default()
                    },
                )
                .unwrap()
                .keep();
            let guard = DetachGuard(kept.path.clone());
            assert_eq!(
                loops.find_by_backing_file(&a).unwrap(),
                vec![kept.path.clone()]
            );
            loops.detach(&kept.path).unwrap();
            loops.detach(&kept.path).unwrap();
            assert_no_loop_device_for(&a);
            assert_eq!(loops.info(&kept.path).unwrap(), None);
            drop(guard);
        },
    );
}

/// Detaches a non-autoclear device even if the test fails before it does.
struct DetachGuard(PathBuf);

impl Drop for DetachGuard {
    fn drop(&mut self) {
        let _ = LinuxLoopDevices::new().detach(&self.0);
    }
}

/// A FUSE mount whose daemon is gone: every access fails with ENOTCONN.
/// Made without a daemon by closing the `/dev/fuse` descriptor right after
/// mounting.
fn dead_fuse_mount(m: &LinuxMounter, target: &Path, name: &str) {
    use std::os::fd::AsRawFd;
    let dev = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .unwrap();
    let data = format!("fd={},rootmode=40000,user_id=0,group_id=0", dev.as_raw_fd());
    m.mount(name, target, "fuse", &[&data]).unwrap();
    drop(dev);
}

fn dead_fuse_mounts_are_recognised_and_cleaned_up_only_if_ours() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!(
            "skipped: dead_fuse_mounts_are_recognised_and_cleaned_up_only_if_ours: no /dev/fuse"
        );
        return;
    }
    in_private_mount_ns_in_tempdir("dead_fuse_mounts", |tmp| {
        let m = LinuxMounter::new();
        let ours = dir(tmp.path(), "ours");
        dead_fuse_mount(&m, &ours, "fuse-ours");
        // A fresh look fails; the cached one still sees a mount point.
        assert!(mount_utils::is_disconnected(
            &ours,
            std::time::Duration::from_secs(2)
        ));
        assert!(m.is_mount_point(&ours).unwrap());
        let entry = m.mounted_at(&ours).unwrap().expect("found by path");
        assert_eq!(
            (entry.fs_type.as_str(), entry.source.as_str()),
            ("fuse", "fuse-ours")
        );
        let expected = MountSource::of_mount(&entry);
        assert!(m.check_mounted(&ours, &expected).unwrap().is_ours());

        // Someone else's dead mount is left alone.
        let theirs = dir(tmp.path(), "theirs");
        dead_fuse_mount(&m, &theirs, "fuse-theirs");
        let err = m.cleanup_mount_point_owned(&theirs, &expected).unwrap_err();
        assert!(matches!(err, MountError::NotOurs { .. }), "{err}");
        assert!(m.mounted_at(&theirs).unwrap().is_some());

        m.cleanup_mount_point_owned(&ours, &expected).unwrap();
        assert!(!ours.exists());
        // The unconditional cleanup still handles a dead mount.
        m.cleanup_mount_point(&theirs).unwrap();
        assert!(!theirs.exists());
    });
}
