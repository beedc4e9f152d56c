//! copy_tree and copy_file on real filesystems. Ownership of other users,
//! device nodes, trusted xattrs and mount points need root: those tests are
//! ignored when built without it.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tree_copy::{TreeStats, copy_file, copy_tree};

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn set_mtime(path: &Path, secs: i64) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let times = [libc_timespec(secs - 100), libc_timespec(secs)];
    // SAFETY: a valid path and two timespecs.
    let rc = unsafe { utimensat(-100, c.as_ptr(), times.as_ptr(), 0x100) };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

fn libc_timespec(secs: i64) -> Timespec {
    Timespec {
        tv_sec: secs,
        tv_nsec: 123_456_789,
    }
}

unsafe extern "C" {
    fn utimensat(
        dirfd: i32,
        path: *const std::ffi::c_char,
        times: *const Timespec,
        flags: i32,
    ) -> i32;
    fn lsetxattr(
        path: *const std::ffi::c_char,
        name: *const std::ffi::c_char,
        value: *const std::ffi::c_void,
        size: usize,
        flags: i32,
    ) -> i32;
    fn lgetxattr(
        path: *const std::ffi::c_char,
        name: *const std::ffi::c_char,
        value: *mut std::ffi::c_void,
        size: usize,
    ) -> isize;
    fn mknod(path: *const std::ffi::c_char, mode: u32, dev: u64) -> i32;
    fn lchown(path: *const std::ffi::c_char, uid: u32, gid: u32) -> i32;
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// Sets xattr `name`; false when the filesystem does not take it.
fn set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
    let n = CString::new(name).unwrap();
    // SAFETY: valid strings and a value buffer of the given size.
    unsafe {
        lsetxattr(
            cpath(path).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid strings and a buffer of the given size.
    let len = unsafe {
        lgetxattr(
            cpath(path).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (len >= 0).then(|| {
        buf.truncate(len as usize);
        buf
    })
}

fn chown(path: &Path, uid: u32, gid: u32) {
    // SAFETY: a valid path.
    assert_eq!(
        unsafe { lchown(cpath(path).as_ptr(), uid, gid) },
        0,
        "lchown {}",
        path.display()
    );
}

#[test]
fn keeps_modes_times_hard_links_symlinks_fifos_holes_and_xattrs() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    fs::create_dir_all(src.join("a/deep/er")).unwrap();
    fs::create_dir(src.join("b")).unwrap();
    fs::write(src.join("a/f"), b"shared data").unwrap();
    set_mode(&src.join("a/f"), 0o640);
    fs::hard_link(src.join("a/f"), src.join("b/g")).unwrap();
    fs::hard_link(src.join("a/f"), src.join("a/deep/er/h")).unwrap();
    fs::write(src.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("/etc", src.join("evil")).unwrap();
    std::os::unix::fs::symlink("a/f", src.join("rel")).unwrap();
    std::os::unix::fs::symlink("missing", src.join("dangling")).unwrap();
    let fifo = cpath(&src.join("pipe"));
    // SAFETY: a valid path; S_IFIFO | 0620.
    assert_eq!(unsafe { mknod(fifo.as_ptr(), 0o010620, 0) }, 0);
    let sparse = fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&sparse, &[7u8; 8192], 1 << 20).unwrap();
    drop(sparse);
    set_mode(&src.join("a"), 0o2750);
    set_mode(&src.join("b"), 0o1777);
    set_mode(&src, 0o705);
    let xattrs = set_xattr(&src.join("a/f"), "user.owner-note", b"keep me")
        && set_xattr(&src.join("b"), "user.dir-note", b"and me");
    set_mtime(&src.join("a/f"), 1_000_000_000);
    set_mtime(&src.join("a/deep"), 1_100_000_000);
    set_mtime(&src.join("a"), 1_200_000_000);

    let stats = copy_tree(&src, &dst).unwrap();
    assert_eq!(
        stats,
        TreeStats {
            dirs: 4,
            files: 3,
            symlinks: 3,
            specials: 1,
            hard_links: 2,
            bytes: 11 + 8192,
            skipped_mounts: 0,
        }
    );
    let meta = |p: &str| fs::symlink_metadata(dst.join(p)).unwrap();
    let orig = |p: &str| fs::symlink_metadata(src.join(p)).unwrap();
    assert_eq!(fs::read(dst.join("a/f")).unwrap(), b"shared data");
    for p in ["", "a", "b", "a/f", "pipe", "a/deep"] {
        assert_eq!(meta(p).mode(), orig(p).mode(), "mode of {p:?}");
    }
    for p in ["a/f", "a", "a/deep"] {
        assert_eq!(
            (meta(p).mtime(), meta(p).mtime_nsec()),
            (orig(p).mtime(), orig(p).mtime_nsec()),
            "mtime of {p}"
        );
    }
    assert_eq!(meta("a/f").ino(), meta("b/g").ino(), "hard link kept");
    assert_eq!(
        meta("a/f").ino(),
        meta("a/deep/er/h").ino(),
        "hard link kept"
    );
    assert_eq!(meta("a/f").nlink(), 3);
    assert_ne!(
        meta("a/f").ino(),
        orig("a/f").ino(),
        "a copy, not a link to the source"
    );
    assert_eq!(fs::read_link(dst.join("evil")).unwrap(), Path::new("/etc"));
    assert!(meta("evil").file_type().is_symlink(), "never followed");
    assert_eq!(fs::read_link(dst.join("rel")).unwrap(), Path::new("a/f"));
    assert_eq!(
        fs::read_link(dst.join("dangling")).unwrap(),
        Path::new("missing")
    );
    assert!(meta("pipe").file_type().is_fifo());
    assert_eq!(meta("empty").len(), 0);
    assert_eq!(meta("sparse").len(), 64 << 20);
    assert!(
        meta("sparse").blocks() * 512 < 4 << 20,
        "holes kept: {} blocks",
        meta("sparse").blocks()
    );
    let mut buf = [0u8; 8192];
    std::os::unix::fs::FileExt::read_exact_at(
        &fs::File::open(dst.join("sparse")).unwrap(),
        &mut buf,
        1 << 20,
    )
    .unwrap();
    assert_eq!(buf, [7u8; 8192]);
    if xattrs {
        assert_eq!(
            get_xattr(&dst.join("a/f"), "user.owner-note").as_deref(),
            Some(&b"keep me"[..])
        );
        assert_eq!(
            get_xattr(&dst.join("b/g"), "user.owner-note").as_deref(),
            Some(&b"keep me"[..])
        );
        assert_eq!(
            get_xattr(&dst.join("b"), "user.dir-note").as_deref(),
            Some(&b"and me"[..])
        );
    } else {
        eprintln!(
            "skipped the xattr checks: {} takes no user xattrs",
            tmp.path().display()
        );
    }
}

#[test]
fn an_existing_name_in_the_destination_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::create_dir_all(&dst).unwrap();
    fs::write(src.join("data"), b"new").unwrap();
    fs::write(dst.join("data"), b"old").unwrap();
    let err = copy_tree(&src, &dst).unwrap_err();
    assert!(err.to_string().contains("dst/data"), "{err}");
    assert!(!err.is_no_space());
    assert_eq!(
        fs::read(dst.join("data")).unwrap(),
        b"old",
        "never overwritten"
    );
    // A symlink as the source root is refused, not followed.
    std::os::unix::fs::symlink(&src, tmp.path().join("link")).unwrap();
    assert!(copy_tree(&tmp.path().join("link"), &tmp.path().join("dst2")).is_err());
}

#[test]
fn copy_file_keeps_holes_and_mode_and_refuses_links_and_existing_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.img"), tmp.path().join("b.img"));
    let f = fs::File::create(&a).unwrap();
    f.set_len(128 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[1u8; 4096], 0).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[2u8; 4096], 100 << 20).unwrap();
    drop(f);
    set_mode(&a, 0o640);
    assert_eq!(copy_file(&a, &b).unwrap(), 128 << 20);
    let m = fs::metadata(&b).unwrap();
    assert_eq!((m.len(), m.mode() & 0o7777), (128 << 20, 0o640));
    assert!(m.blocks() * 512 < 8 << 20, "holes kept");
    let mut buf = [0u8; 4096];
    std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(&b).unwrap(), &mut buf, 100 << 20)
        .unwrap();
    assert_eq!(buf, [2u8; 4096]);
    assert!(copy_file(&a, &b).is_err(), "existing destination");
    std::os::unix::fs::symlink(&a, tmp.path().join("link")).unwrap();
    let err = copy_file(&tmp.path().join("link"), &tmp.path().join("c.img")).unwrap_err();
    assert!(err.to_string().contains("link"), "{err}");
    assert!(!tmp.path().join("c.img").exists());
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn keeps_other_users_owners_setuid_devices_and_trusted_xattrs() {
    mount_utils::require_root!("keeps_other_users_owners_setuid_devices_and_trusted_xattrs");
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    fs::create_dir_all(src.join("home")).unwrap();
    fs::write(src.join("home/secret"), b"only for 1000").unwrap();
    chown(&src.join("home/secret"), 1000, 1000);
    set_mode(&src.join("home/secret"), 0o600);
    chown(&src.join("home"), 1001, 1002);
    set_mode(&src.join("home"), 0o700);
    fs::write(src.join("tool"), b"#!/bin/true\n").unwrap();
    chown(&src.join("tool"), 1000, 50);
    set_mode(&src.join("tool"), 0o6755);
    std::os::unix::fs::symlink("home/secret", src.join("link")).unwrap();
    chown(&src.join("link"), 1003, 1004);
    let null = cpath(&src.join("null"));
    // SAFETY: a valid path; S_IFCHR | 0666, device 1:3.
    assert_eq!(unsafe { mknod(null.as_ptr(), 0o020666, (1 << 8) | 3) }, 0);
    chown(&src, 1000, 1000);
    assert!(set_xattr(&src.join("tool"), "trusted.csi-kit", b"t"));

    copy_tree(&src, &dst).unwrap();
    let meta = |p: &str| fs::symlink_metadata(dst.join(p)).unwrap();
    let ids = |p: &str| (meta(p).uid(), meta(p).gid(), meta(p).mode() & 0o7777);
    assert_eq!(ids("home/secret"), (1000, 1000, 0o600));
    assert_eq!(ids("home"), (1001, 1002, 0o700));
    assert_eq!(
        ids("tool"),
        (1000, 50, 0o6755),
        "setuid/setgid survive the chown"
    );
    assert_eq!((meta("link").uid(), meta("link").gid()), (1003, 1004));
    assert_eq!(
        ids(""),
        (1000, 1000, fs::metadata(&src).unwrap().mode() & 0o7777)
    );
    assert!(meta("null").file_type().is_char_device());
    assert_eq!(
        meta("null").rdev(),
        fs::metadata(src.join("null")).unwrap().rdev()
    );
    assert_eq!(
        get_xattr(&dst.join("tool"), "trusted.csi-kit").as_deref(),
        Some(&b"t"[..])
    );
}

#[test]
#[ignore = "needs root: run by scripts/test.sh's root pass"]
fn directories_of_other_filesystems_are_skipped() {
    mount_utils::require_root!("directories_of_other_filesystems_are_skipped");
    let tmp = tempfile::tempdir().unwrap();
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    fs::create_dir_all(src.join("mnt")).unwrap();
    fs::write(src.join("kept"), b"x").unwrap();
    let mnt = src.join("mnt");
    let stats = mount_utils::testing::in_private_mount_ns("tree-copy-mounts", move || {
        use mount_utils::Mounter;
        let m = mount_utils::LinuxMounter::new();
        m.mount("tmpfs", &mnt, "tmpfs", &["size=1m"]).unwrap();
        fs::write(mnt.join("other-fs"), b"y").unwrap();
        copy_tree(&src, &dst).unwrap()
    });
    assert_eq!(stats.skipped_mounts, 1);
    assert_eq!(stats.files, 1);
    assert!(tmp.path().join("dst/kept").exists());
    assert!(!tmp.path().join("dst/mnt").exists());
}
