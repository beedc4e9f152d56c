//! Real format, fsck, mount and resize tests on loop devices. They need
//! root; xfs and btrfs parts need their tools and say so when missing.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{assert_no_loop_device_for, fs_size, have_program, in_private_mount_ns, sparse_file};
use mount_utils::{
    DiskFormat, Exec, FormatError, LinuxMounter, LoopDevice, LoopOptions, Mounter, ResizeFs,
    SafeFormatAndMount, SystemExec,
};

fn main() {
    common::run_root_tests(&[
        (
            "format_and_mount_ext4_then_refuse_to_reformat",
            format_and_mount_ext4_then_refuse_to_reformat,
        ),
        (
            "resize_ext4_after_growing_the_backing_file",
            resize_ext4_after_growing_the_backing_file,
        ),
        ("format_mount_and_grow_xfs", format_mount_and_grow_xfs),
        ("format_mount_and_grow_btrfs", format_mount_and_grow_btrfs),
        (
            "a_failing_test_leaves_no_mount_or_loop_device",
            a_failing_test_leaves_no_mount_or_loop_device,
        ),
    ])
}

const MIB: u64 = 1 << 20;

/// A sparse backing file on a loop device and an empty mount target, in a
/// temporary directory (gone when it is dropped): (directory, backing
/// file, target, device, device path).
fn loop_disk(
    file: impl AsRef<Path>,
    size: u64,
) -> (tempfile::TempDir, PathBuf, PathBuf, LoopDevice, String) {
    let tmp = tempfile::tempdir().unwrap();
    let backing = tmp.path().join(file);
    sparse_file(&backing, size);
    let target = tmp.path().join("mnt");
    fs::create_dir(&target).unwrap();
    let dev = LoopDevice::attach(&backing, &LoopOptions::default()).unwrap();
    let device = dev.path().to_str().unwrap().to_owned();
    (tmp, backing, target, dev, device)
}

/// Grows the backing file to `len` and the loop device with it, checking
/// that the filesystem at `target` needed no resize before and needs one
/// now. Returns the resizer and the filesystem's size before.
fn grow_disk(
    backing: &Path,
    dev: &LoopDevice,
    device: &str,
    target: &Path,
    len: u64,
) -> (ResizeFs, u64) {
    let resizer = ResizeFs::new(Arc::new(SystemExec::new()));
    assert!(!resizer.need_resize(device, target).unwrap());
    let before = fs_size(target);
    fs::OpenOptions::new()
        .write(true)
        .open(backing)
        .unwrap()
        .set_len(len)
        .unwrap();
    dev.set_capacity().unwrap();
    assert!(resizer.need_resize(device, target).unwrap());
    (resizer, before)
}

fn sfm() -> SafeFormatAndMount {
    SafeFormatAndMount::new(Arc::new(LinuxMounter::new()), Arc::new(SystemExec::new()))
}

fn fs_type_at(path: &Path) -> Option<String> {
    LinuxMounter::new()
        .mount_points()
        .unwrap()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path)
        .map(|m| m.fs_type)
}

fn format_and_mount_ext4_then_refuse_to_reformat() {
    if !have_program("format_and_mount_ext4_then_refuse_to_reformat", "mkfs.ext4") {
        return;
    }
    in_private_mount_ns("format_and_mount_ext4_then_refuse_to_reformat", || {
        let (_tmp, backing, target, dev, device) = loop_disk("ext4.img", 64 * MIB);
        let s = sfm();
        let m = LinuxMounter::new();

        assert_eq!(s.probe(&device).unwrap(), DiskFormat::Unformatted);
        // Never formatted for a read-only mount.
        let err = s
            .format_and_mount(&device, &target, "ext4", &["ro"], &[])
            .unwrap_err();
        assert!(
            matches!(err, FormatError::UnformattedReadOnly { .. }),
            "{err}"
        );
        assert_eq!(s.probe(&device).unwrap(), DiskFormat::Unformatted);

        s.format_and_mount(&device, &target, "", &["noatime"], &["-L", "csitest"])
            .unwrap();
        assert_eq!(fs_type_at(&target).as_deref(), Some("ext4"));
        fs::write(target.join("keep-me"), b"data").unwrap();
        m.unmount(&target, false).unwrap();

        // Existing ext4: fsck + mount, not a reformat (the file survives).
        s.format_and_mount(&device, &target, "ext4", &[], &[])
            .unwrap();
        assert_eq!(fs::read(target.join("keep-me")).unwrap(), b"data");
        m.unmount(&target, false).unwrap();

        // A different type is refused, and the data is untouched.
        let err = s
            .format_and_mount(&device, &target, "xfs", &[], &[])
            .unwrap_err();
        match &err {
            FormatError::FilesystemMismatch {
                existing,
                requested,
                ..
            } => {
                assert_eq!((existing.as_str(), requested.as_str()), ("ext4", "xfs"));
            }
            other => panic!("expected FilesystemMismatch, got {other}"),
        }
        assert!(!m.is_mount_point(&target).unwrap());
        s.format_and_mount(&device, &target, "ext4", &["ro"], &[])
            .unwrap();
        assert_eq!(fs::read(target.join("keep-me")).unwrap(), b"data");
        m.cleanup_mount_point(&target).unwrap();

        drop(dev);
        assert_no_loop_device_for(&backing);
    });
}

fn resize_ext4_after_growing_the_backing_file() {
    if !have_program("resize_ext4_after_growing_the_backing_file", "resize2fs") {
        return;
    }
    in_private_mount_ns("resize_ext4_after_growing_the_backing_file", || {
        let (_tmp, backing, target, dev, device) = loop_disk("grow.img", 64 * MIB);
        sfm()
            .format_and_mount(&device, &target, "ext4", &[], &[])
            .unwrap();
        let (resizer, before) = grow_disk(&backing, &dev, &device, &target, 128 * MIB);
        assert_eq!(mount_utils::block::device_size(&device).unwrap(), 128 * MIB);
        let m = LinuxMounter::new();
        if has_cap_sys_resource() {
            resizer.resize(&device, &target).unwrap();
        } else {
            // Online ext4 growth (EXT4_IOC_RESIZE_FS) needs CAP_SYS_RESOURCE,
            // which some sandboxes drop; grow it offline instead.
            eprintln!(
                "note: resize_ext4_after_growing_the_backing_file: no CAP_SYS_RESOURCE, \
                 testing offline ext4 resize instead of online"
            );
            m.unmount(&target, false).unwrap();
            let fsck = SystemExec::new()
                .run("e2fsck", &["-f", "-p", &device])
                .unwrap();
            assert!(matches!(fsck.code, Some(0 | 1)), "{fsck:?}");
            resizer.resize(&device, &target).unwrap();
            m.mount(&device, &target, "ext4", &[]).unwrap();
        }
        let after = fs_size(&target);
        assert!(after > before + 50 * MIB, "before {before}, after {after}");
        assert!(!resizer.need_resize(&device, &target).unwrap());

        m.cleanup_mount_point(&target).unwrap();
        drop(dev);
        assert_no_loop_device_for(&backing);
    });
}

/// Whether this process may grow an ext4 filesystem online.
fn has_cap_sys_resource() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    eff & (1 << CAP_SYS_RESOURCE) != 0
}

/// xfs and btrfs share the flow: format, mount, grow, check.
fn format_mount_grow(test: &'static str, fstype: &'static str, size: u64) {
    in_private_mount_ns(test, move || {
        let (tmp, backing, target, dev, device) = loop_disk(format!("{fstype}.img"), size);
        let s = sfm();
        s.format_and_mount(&device, &target, fstype, &[], &[])
            .unwrap();
        assert_eq!(fs_type_at(&target).as_deref(), Some(fstype));
        let err = s
            .format_and_mount(&device, &tmp.path().join("x"), "ext4", &[], &[])
            .unwrap_err();
        assert!(
            matches!(err, FormatError::FilesystemMismatch { .. }),
            "{err}"
        );

        let (resizer, before) = grow_disk(&backing, &dev, &device, &target, size * 2);
        resizer.resize(&device, &target).unwrap();
        let after = fs_size(&target);
        assert!(after > before, "before {before}, after {after}");
        assert!(!resizer.need_resize(&device, &target).unwrap());

        LinuxMounter::new().cleanup_mount_point(&target).unwrap();
        drop(dev);
        assert_no_loop_device_for(&backing);
    });
}

fn format_mount_and_grow_xfs() {
    let t = "format_mount_and_grow_xfs";
    if !have_program(t, "mkfs.xfs")
        || !have_program(t, "xfs_growfs")
        || !have_program(t, "xfs_info")
    {
        return;
    }
    // xfs wants at least 300 MiB.
    format_mount_grow(t, "xfs", 320 * MIB);
}

fn format_mount_and_grow_btrfs() {
    let t = "format_mount_and_grow_btrfs";
    if !have_program(t, "mkfs.btrfs") || !have_program(t, "btrfs") {
        return;
    }
    format_mount_grow(t, "btrfs", 256 * MIB);
}

fn a_failing_test_leaves_no_mount_or_loop_device() {
    if !have_program("a_failing_test_leaves_no_mount_or_loop_device", "mkfs.ext4") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let backing = tmp.path().join("fail.img");
    sparse_file(&backing, 32 * MIB);
    let target = tmp.path().join("mnt");
    fs::create_dir(&target).unwrap();
    let (b, t) = (backing.clone(), target.clone());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        in_private_mount_ns("a_failing_test_leaves_no_mount_or_loop_device", move || {
            let dev = LoopDevice::attach(&b, &LoopOptions::default()).unwrap();
            let device = dev.path().to_str().unwrap().to_owned();
            sfm()
                .format_and_mount(&device, &t, "ext4", &[], &[])
                .unwrap();
            assert!(LinuxMounter::new().is_mount_point(&t).unwrap());
            panic!("deliberate failure with a mounted loop device (expected in this test)");
        })
    }));
    assert!(result.is_err(), "the inner test body must have failed");
    // The mount lived only in the dead thread's namespace...
    assert!(!LinuxMounter::new().is_mount_point(&target).unwrap());
    // ...and the loop device went with it (handle dropped while unwinding,
    // autoclear on the last close).
    assert_no_loop_device_for(&backing);
}
