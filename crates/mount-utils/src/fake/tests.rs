use super::*;
use crate::options::Sensitive;
use crate::source::MountCheck;

fn p(s: &str) -> &Path {
    Path::new(s)
}

#[test]
fn mount_unmount_and_log() {
    let m = FakeMounter::new();
    m.mount("tmpfs", p("/mnt/a/"), "tmpfs", &["size=1m", "ro"])
        .unwrap();
    assert!(m.is_mount_point(p("/mnt/a")).unwrap());
    assert!(!m.is_likely_not_mount_point(p("/mnt/./a")).unwrap());
    let mi = &m.mount_points().unwrap()[0];
    assert!(mi.is_read_only());
    assert_eq!(mi.fs_type, "tmpfs");
    m.unmount(p("/mnt/a"), false).unwrap();
    assert!(!m.is_mount_point(p("/mnt/a")).unwrap());
    m.unmount(p("/mnt/a"), false).unwrap();
    assert_eq!(m.actions().len(), 2);
    assert!(matches!(
        &m.actions()[1],
        FakeAction::Unmount { lazy: false, .. }
    ));
    m.clear_actions();
    assert!(m.actions().is_empty());
}

#[test]
fn sensitive_options_are_recorded_but_redacted() {
    let m = FakeMounter::new();
    m.mount_sensitive(
        "//srv/share",
        p("/mnt/c"),
        "cifs",
        &["vers=3.0"],
        &[Sensitive::new("password=pw")],
    )
    .unwrap();
    let log = format!("{:?}", m.actions());
    assert!(!log.contains("password"), "{log}");
    match &m.actions()[0] {
        FakeAction::Mount {
            sensitive_options, ..
        } => assert_eq!(sensitive_options[0].expose(), "password=pw"),
        other => panic!("unexpected {other:?}"),
    }
    m.inject_error(FakeOp::Mount, "/mnt/d", Errno::EPERM);
    let err = m
        .mount_sensitive(
            "//srv/share",
            p("/mnt/d"),
            "cifs",
            &[],
            &[Sensitive::new("password=pw")],
        )
        .unwrap_err();
    assert_eq!(err.errno(), Some(Errno::EPERM));
    assert!(!err.to_string().contains("password"));
    assert!(!format!("{err:?}").contains("password"));
}

#[test]
fn bind_of_bind_resolves_to_original_source() {
    let m = FakeMounter::new();
    m.mount("/dev/sdb", p("/staging"), "ext4", &[]).unwrap();
    m.bind_mount(p("/staging"), p("/pod1"), false).unwrap();
    m.bind_mount(p("/pod1"), p("/pod2"), true).unwrap();
    m.mount("/pod2/sub", p("/pod3"), "", &["bind", "ro"])
        .unwrap();
    let mounts = m.mount_points().unwrap();
    assert_eq!(mounts.len(), 4);
    assert!(
        mounts
            .iter()
            .all(|e| e.source == "/dev/sdb" && e.fs_type == "ext4")
    );
    assert_eq!(mounts[3].root, p("/sub"));
    assert!(mounts[2].is_read_only() && mounts[3].is_read_only());
    let mut refs = m.mount_refs(p("/staging")).unwrap();
    refs.sort();
    assert_eq!(refs, vec![PathBuf::from("/pod1"), PathBuf::from("/pod2")]);
    assert!(m.mount_refs(p("/not-mounted")).unwrap().is_empty());
    // Binds of an unmounted directory share a device, so refs work too.
    m.bind_mount(p("/var/data"), p("/x"), false).unwrap();
    m.bind_mount(p("/var/data"), p("/y"), false).unwrap();
    assert_eq!(m.mount_refs(p("/x")).unwrap(), vec![PathBuf::from("/y")]);
}

#[test]
fn remount_changes_an_existing_mount() {
    let m = FakeMounter::new();
    let err = m.mount("", p("/r"), "", &["remount", "ro"]).unwrap_err();
    assert_eq!(err.errno(), Some(Errno::EINVAL));
    m.bind_mount(p("/src"), p("/r"), false).unwrap();
    m.mount("", p("/r"), "", &["remount", "bind", "ro"])
        .unwrap();
    let mounts = m.mount_points().unwrap();
    assert_eq!(mounts.len(), 1);
    assert!(mounts[0].is_read_only());
}

#[test]
fn unmount_busy_and_lazy() {
    let m = FakeMounter::new();
    m.mount("tmpfs", p("/a"), "tmpfs", &[]).unwrap();
    m.mount("tmpfs", p("/a/b"), "tmpfs", &[]).unwrap();
    let err = m.unmount(p("/a"), false).unwrap_err();
    assert_eq!(err.errno(), Some(Errno::EBUSY));
    m.unmount(p("/a"), true).unwrap();
    assert!(m.mount_points().unwrap().is_empty());
}

#[test]
fn stacked_mounts_unmount_top_first() {
    let m = FakeMounter::new();
    m.mount("one", p("/s"), "tmpfs", &[]).unwrap();
    m.mount("two", p("/s"), "tmpfs", &[]).unwrap();
    m.unmount(p("/s"), false).unwrap();
    assert_eq!(m.mount_points().unwrap()[0].source, "one");
}

#[test]
fn injected_errors_per_path_and_op() {
    let m = FakeMounter::new();
    m.mount("tmpfs", p("/a"), "tmpfs", &[]).unwrap();
    m.inject_error(FakeOp::Unmount, "/a", Errno::EBUSY);
    assert_eq!(
        m.unmount(p("/a"), false).unwrap_err().errno(),
        Some(Errno::EBUSY)
    );
    // Other paths and operations are unaffected.
    m.unmount(p("/b"), false).unwrap();
    assert!(m.is_mount_point(p("/a")).unwrap());
    m.inject_error_any_path(FakeOp::MountPoints, Errno::EIO);
    assert_eq!(m.mount_points().unwrap_err().errno(), Some(Errno::EIO));
    m.inject_error_any_path(FakeOp::BindMount, Errno::EPERM);
    assert!(m.bind_mount(p("/a"), p("/c"), false).is_err());
    m.clear_errors();
    m.unmount(p("/a"), false).unwrap();
    assert!(m.mount_points().unwrap().is_empty());
}

#[test]
fn cleanup_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("t");
    std::fs::create_dir(&target).unwrap();
    let m = FakeMounter::new();
    m.mount("tmpfs", &target, "tmpfs", &[]).unwrap();
    m.mount("tmpfs", &target, "tmpfs", &[]).unwrap();
    m.cleanup_mount_point(&target).unwrap();
    assert!(!target.exists());
    assert!(m.mount_points().unwrap().is_empty());
    assert!(matches!(
        m.actions().last(),
        Some(FakeAction::Remove { .. })
    ));
    // Absent path: success, nothing logged.
    let n = m.actions().len();
    m.cleanup_mount_point(&target).unwrap();
    assert_eq!(m.actions().len(), n);
    // Non-empty directory is kept.
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("f"), b"x").unwrap();
    let err = m.cleanup_mount_point(&target).unwrap_err();
    assert_eq!(err.errno(), Some(Errno::ENOTEMPTY));
    assert!(target.join("f").exists());
}

#[test]
fn cleanup_of_corrupted_mount() {
    let m = FakeMounter::new();
    m.mount("fuse-daemon", p("/gone/mnt"), "fuse", &[]).unwrap();
    m.mark_corrupted("/gone/mnt", Errno::ENOTCONN);
    let err = m.is_mount_point(p("/gone/mnt")).unwrap_err();
    assert!(err.is_corrupted_mount());
    m.cleanup_mount_point(p("/gone/mnt")).unwrap();
    assert!(!m.is_mount_point(p("/gone/mnt")).unwrap());
    assert!(m.actions().contains(&FakeAction::Unmount {
        target: "/gone/mnt".into(),
        lazy: false
    }));
    // A non-corruption stat error is reported, not papered over.
    m.inject_error(FakeOp::Stat, "/x", Errno::EPERM);
    assert_eq!(
        m.cleanup_mount_point(p("/x")).unwrap_err().errno(),
        Some(Errno::EPERM)
    );
    m.inject_error(FakeOp::Stat, "/y", Errno::ENOENT);
    m.cleanup_mount_point(p("/y")).unwrap();
}

#[test]
fn ro_is_sticky_and_remount_changes_flags() {
    let m = FakeMounter::new();
    m.mount("/src", p("/a"), "", &["bind", "ro", "rw"]).unwrap();
    m.mount("tmpfs", p("/b"), "tmpfs", &["ro", "nosuid", "rw,remount"])
        .unwrap_err(); // remount of nothing
    m.mount("tmpfs", p("/b"), "tmpfs", &["ro", "nosuid", "rw"])
        .unwrap();
    let b = m.mounted_at(p("/b")).unwrap().unwrap();
    assert_eq!(b.mount_options, vec!["ro", "nosuid"]);
    assert!(m.mounted_at(p("/a")).unwrap().unwrap().is_read_only());
    m.remount(p("/b"), &["rw", "noexec"]).unwrap();
    let b = m.mounted_at(p("/b")).unwrap().unwrap();
    assert_eq!(b.mount_options, vec!["rw", "nosuid", "noexec"]);
    m.remount(p("/b"), &["bind", "ro", "suid"]).unwrap();
    let b = m.mounted_at(p("/b")).unwrap().unwrap();
    assert_eq!(b.mount_options, vec!["ro", "noexec"]);
    assert_eq!(
        m.remount(p("/c"), &["ro"]).unwrap_err().errno(),
        Some(Errno::EINVAL)
    );
    assert!(matches!(
        m.remount(p("/b"), &["bind", "size=1m"]),
        Err(MountError::InvalidArgument { .. })
    ));
    assert!(matches!(
        m.actions().last(),
        Some(FakeAction::Remount { .. })
    ));
}

#[test]
fn symlinks_are_refused_everywhere() {
    let m = FakeMounter::new();
    m.add_symlink("/pods/link");
    m.mount("tmpfs", p("/real"), "tmpfs", &[]).unwrap();
    let symlink =
        |r: Result<(), MountError>| assert!(matches!(r, Err(MountError::Symlink { .. })), "{r:?}");
    symlink(m.mount("tmpfs", p("/pods/link"), "tmpfs", &[]));
    symlink(m.mount("tmpfs", p("/pods/link/sub"), "tmpfs", &[]));
    symlink(m.bind_mount(p("/pods/link"), p("/x"), false));
    symlink(m.bind_mount(p("/real"), p("/pods/link/t"), true));
    symlink(m.unmount(p("/pods/link"), false));
    symlink(m.cleanup_mount_point(p("/pods/link/t")));
    symlink(m.remove_mount_point(p("/pods/link")));
    symlink(m.remount(p("/pods/link"), &["ro"]));
    symlink(m.is_mount_point(p("/pods/link")).map(drop));
    symlink(m.mounted_at(p("/pods/link/t")).map(drop));
    symlink(m.bind_source(p("/pods/link")).map(drop));
    symlink(m.fs_usage(p("/pods/link")).map(drop));
    assert_eq!(m.actions().len(), 1, "only the first mount happened");
    // Real symlinks on disk count too.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::os::unix::fs::symlink("d", dir.path().join("l")).unwrap();
    symlink(m.mount("tmpfs", &dir.path().join("l"), "tmpfs", &[]));
    m.mount("tmpfs", &dir.path().join("d"), "tmpfs", &[])
        .unwrap();
}

/// Issue 22: a fake's device node is the fake's, never a file of the host.
/// A block device registered where the host happens to have a symlink (a
/// real `/dev/loop0` may be anything on a contributor's machine) binds as
/// the device: the host's path is not looked at.
#[test]
fn a_device_node_of_the_fake_is_not_looked_up_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let (node, target) = (dir.path().join("disk"), dir.path().join("t"));
    std::fs::create_dir(&target).unwrap();
    // On the host the path is a symlink; in the fake it is a device.
    std::os::unix::fs::symlink("elsewhere", &node).unwrap();
    let m = FakeMounter::new();
    m.add_block_device(&node, DeviceNumber::new(259, 3));
    m.bind_mount(&node, &target, false).unwrap();
    assert!(m.is_mount_point(&target).unwrap());
    assert!(matches!(
        m.bind_source(&node).unwrap(),
        MountSource::DeviceNode(d) if d == DeviceNumber::new(259, 3)
    ));
}

#[test]
fn device_numbers_match_loop_devices_and_nodes() {
    use crate::{FakeLoopDevices, LoopDevices, LoopOptions};
    let loops = FakeLoopDevices::new();
    loops.set_backing_file("/img/v1", 1 << 20);
    let dev = loops
        .attach(p("/img/v1"), &LoopOptions::default())
        .unwrap()
        .keep();
    let m = FakeMounter::new();
    let dev_path = dev.path.to_str().unwrap();
    m.mount(dev_path, p("/staging/v1"), "ext4", &[]).unwrap();
    let staged = MountSource::Device(dev.device);
    assert!(
        m.check_mounted(p("/staging/v1"), &staged)
            .unwrap()
            .is_ours()
    );
    // Raw block publish: a bind of the device node onto a file.
    let node = m.bind_source(&dev.path).unwrap();
    assert_eq!(node, MountSource::DeviceNode(dev.device));
    m.bind_mount(&dev.path, p("/pods/a/dev"), false).unwrap();
    assert_eq!(
        m.block_device_at(p("/pods/a/dev")).unwrap(),
        Some(dev.device)
    );
    assert!(m.check_mounted(p("/pods/a/dev"), &node).unwrap().is_ours());
    let other = MountSource::DeviceNode(DeviceNumber::new(7, 9));
    assert!(matches!(
        m.check_mounted(p("/pods/a/dev"), &other).unwrap(),
        MountCheck::Foreign(_)
    ));
    // Pseudo filesystems get a fresh device per mount, paths keep theirs.
    m.mount("tmpfs", p("/t1"), "tmpfs", &[]).unwrap();
    m.mount("tmpfs", p("/t2"), "tmpfs", &[]).unwrap();
    m.mount("/dev/sdz", p("/s1"), "xfs", &[]).unwrap();
    m.mount("/dev/sdz", p("/s2"), "xfs", &[]).unwrap();
    let dev_of = |s: &str| m.mounted_at(p(s)).unwrap().unwrap().device();
    assert_ne!(dev_of("/t1"), dev_of("/t2"));
    assert_eq!(dev_of("/s1"), dev_of("/s2"));
    m.add_block_device("/dev/sdz", DeviceNumber::new(8, 16));
    m.mount("/dev/sdz", p("/s3"), "xfs", &[]).unwrap();
    assert_eq!(dev_of("/s3"), DeviceNumber::new(8, 16));
}

#[test]
fn owned_teardown_leaves_foreign_mounts_and_directories() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let m = FakeMounter::new();
    m.mount("/dev/sdb", p("/staging"), "ext4", &[]).unwrap();
    let ours = m.bind_source(p("/staging")).unwrap();
    assert_eq!(
        m.check_mounted(&target, &ours).unwrap(),
        MountCheck::NotMounted
    );
    // A foreign tmpfs at the target: refused, kept, directory kept.
    m.add_mount("tmpfs", &target, "tmpfs");
    let err = m.cleanup_mount_point_owned(&target, &ours).unwrap_err();
    assert!(matches!(err, MountError::NotOurs { .. }), "{err}");
    assert!(err.to_string().contains("left alone"), "{err}");
    assert!(m.unmount_if_source(&target, &ours).is_err());
    assert!(m.is_mount_point(&target).unwrap() && target.exists());
    // Ours on top of it: ours goes, the foreign one stops the cleanup.
    m.bind_mount(p("/staging"), &target, false).unwrap();
    let err = m.cleanup_mount_point_owned(&target, &ours).unwrap_err();
    assert!(matches!(err, MountError::NotOurs { .. }));
    assert_eq!(m.mounted_at(&target).unwrap().unwrap().fs_type, "tmpfs");
    m.unmount(&target, false).unwrap();
    // Ours twice: both go and the directory is removed.
    m.bind_mount(p("/staging"), &target, false).unwrap();
    m.bind_mount(p("/staging"), &target, false).unwrap();
    assert!(m.unmount_if_source(&target, &ours).unwrap());
    m.cleanup_mount_point_owned(&target, &ours).unwrap();
    assert!(!target.exists());
    assert!(!m.unmount_if_source(&target, &ours).unwrap());
    m.cleanup_mount_point_owned(&target, &ours).unwrap();
}

#[test]
fn unmount_all_keeps_the_directory_and_remove_refuses_mounts() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t");
    std::fs::create_dir(&t).unwrap();
    let m = FakeMounter::new();
    for _ in 0..3 {
        m.mount("tmpfs", &t, "tmpfs", &[]).unwrap();
    }
    assert_eq!(
        m.remove_mount_point(&t).unwrap_err().errno(),
        Some(Errno::EBUSY)
    );
    assert_eq!(m.unmount_all(&t).unwrap(), 3);
    assert_eq!(m.unmount_all(&t).unwrap(), 0);
    assert!(t.exists());
    m.remove_mount_point(&t).unwrap();
    assert!(!t.exists());
    m.remove_mount_point(&t).unwrap();
}

#[test]
fn usage_is_set_per_path_or_read_from_disk() {
    let m = FakeMounter::new();
    let u = FsUsage {
        total_bytes: 100,
        used_bytes: 40,
        available_bytes: 60,
        total_inodes: 10,
        used_inodes: 1,
        free_inodes: 9,
    };
    m.set_usage("/staging", u);
    assert_eq!(m.fs_usage(p("/staging/sub")).unwrap(), u);
    let dir = tempfile::tempdir().unwrap();
    assert!(m.fs_usage(dir.path()).unwrap().total_bytes > 0);
    assert_eq!(
        m.fs_usage(p("/nowhere")).unwrap_err().errno(),
        Some(Errno::ENOENT)
    );
}

#[test]
fn usable_as_trait_object() {
    let m: std::sync::Arc<dyn Mounter> = std::sync::Arc::new(FakeMounter::new());
    m.mount("tmpfs", p("/z"), "tmpfs", &[]).unwrap();
    assert!(m.is_mount_point(p("/z")).unwrap());
}
