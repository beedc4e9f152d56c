//! Real mount tests. They need root and run in private mount namespaces.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::in_private_mount_ns_in_tempdir;
use mount_utils::{Errno, LinuxMounter, MountInfo, Mounter, Sensitive};

fn main() {
    common::run_root_tests(&[
        ("tmpfs_mount_and_unmount", tmpfs_mount_and_unmount),
        (
            "sensitive_options_reach_the_kernel_but_not_errors",
            sensitive_options_reach_the_kernel_but_not_errors,
        ),
        ("bind_and_read_only_bind", bind_and_read_only_bind),
        (
            "same_filesystem_bind_is_a_mount_point",
            same_filesystem_bind_is_a_mount_point,
        ),
        (
            "mount_refs_and_device_from_mount",
            mount_refs_and_device_from_mount,
        ),
        (
            "escaped_paths_round_trip_through_mountinfo",
            escaped_paths_round_trip_through_mountinfo,
        ),
        (
            "cleanup_of_busy_stacked_and_absent_paths",
            cleanup_of_busy_stacked_and_absent_paths,
        ),
        (
            "a_mount_busy_for_a_moment_is_unmounted",
            a_mount_busy_for_a_moment_is_unmounted,
        ),
        (
            "file_bind_mount_for_block_volumes",
            file_bind_mount_for_block_volumes,
        ),
        (
            "mounts_at_answers_what_the_table_says",
            mounts_at_answers_what_the_table_says,
        ),
    ])
}

fn entry_at(m: &LinuxMounter, path: &Path) -> Option<MountInfo> {
    m.mount_points()
        .unwrap()
        .into_iter()
        .rev()
        .find(|e| e.mount_point == path)
}

fn dir(base: &Path, name: &str) -> PathBuf {
    let d = base.join(name);
    fs::create_dir_all(&d).unwrap();
    d
}

fn tmpfs_mount_and_unmount() {
    in_private_mount_ns_in_tempdir("tmpfs_mount_and_unmount", |tmp| {
        let target = dir(tmp.path(), "t");
        let m = LinuxMounter::new();
        assert!(!m.is_mount_point(&target).unwrap());
        m.mount(
            "tmpfs",
            &target,
            "tmpfs",
            &["size=4m", "nosuid", "x-csi.ignored"],
        )
        .unwrap();
        assert!(m.is_mount_point(&target).unwrap());
        let e = entry_at(&m, &target).expect("mountinfo entry");
        assert_eq!(e.fs_type, "tmpfs");
        assert!(e.has_mount_option("nosuid"));
        assert!(e.has_super_option("size=4096k"), "{:?}", e.super_options);
        fs::write(target.join("f"), b"data").unwrap();

        m.unmount(&target, false).unwrap();
        assert!(!m.is_mount_point(&target).unwrap());
        assert!(!target.join("f").exists());
        // Not mounted, and absent: both success.
        m.unmount(&target, false).unwrap();
        m.unmount(&tmp.path().join("absent"), true).unwrap();
    });
}

fn sensitive_options_reach_the_kernel_but_not_errors() {
    in_private_mount_ns_in_tempdir("sensitive_options_reach_the_kernel_but_not_errors", |tmp| {
        let target = dir(tmp.path(), "t");
        let m = LinuxMounter::new();
        m.mount_sensitive(
            "tmpfs",
            &target,
            "tmpfs",
            &["mode=700"],
            &[Sensitive::new("size=2m")],
        )
        .unwrap();
        assert_eq!(common::fs_size(&target), 2 << 20);
        m.unmount(&target, false).unwrap();

        // tmpfs rejects an unknown option: the error must not show it.
        let err = m
            .mount_sensitive(
                "tmpfs",
                &target,
                "tmpfs",
                &[],
                &[Sensitive::new("hunter2secret=1")],
            )
            .unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EINVAL));
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"));
        assert!(err.to_string().contains("1 option"), "{err}");
    });
}

fn bind_and_read_only_bind() {
    in_private_mount_ns_in_tempdir("bind_and_read_only_bind", |tmp| {
        let src = dir(tmp.path(), "src");
        let rw = dir(tmp.path(), "rw");
        let ro = dir(tmp.path(), "ro");
        let m = LinuxMounter::new();
        // A source with nosuid,nodev,noexec that the read-only bind must keep.
        m.mount(
            "tmpfs",
            &src,
            "tmpfs",
            &["size=1m", "nosuid", "nodev", "noexec"],
        )
        .unwrap();
        fs::write(src.join("hello"), b"hi").unwrap();

        m.bind_mount(&src, &rw, false).unwrap();
        fs::write(rw.join("from-rw"), b"x").unwrap();
        assert!(src.join("from-rw").exists());

        m.bind_mount(&src, &ro, true).unwrap();
        assert_eq!(fs::read(ro.join("hello")).unwrap(), b"hi");
        let err = fs::write(ro.join("nope"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        let e = entry_at(&m, &ro).unwrap();
        assert!(e.is_read_only());
        for opt in ["nosuid", "nodev", "noexec"] {
            assert!(e.has_mount_option(opt), "{opt} lost: {:?}", e.mount_options);
        }
        // The source stays writable.
        fs::write(src.join("still-rw"), b"x").unwrap();

        // "bind,ro" as mount options goes through the same path.
        let ro2 = dir(tmp.path(), "ro2");
        m.mount(src.to_str().unwrap(), &ro2, "", &["bind", "ro"])
            .unwrap();
        let err = fs::write(ro2.join("nope"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));

        // "remount,bind,ro" flips an existing bind in place.
        m.mount("", &rw, "", &["remount", "bind", "ro"]).unwrap();
        let err = fs::write(rw.join("now-ro"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));

        for t in [&ro2, &ro, &rw, &src] {
            m.unmount(t, false).unwrap();
        }
    });
}

fn same_filesystem_bind_is_a_mount_point() {
    in_private_mount_ns_in_tempdir("same_filesystem_bind_is_a_mount_point", |tmp| {
        let a = dir(tmp.path(), "a");
        let b = dir(tmp.path(), "b");
        let m = LinuxMounter::new();
        m.bind_mount(&a, &b, false).unwrap();

        assert_eq!(
            m.is_mount_point_statx(&b).unwrap(),
            Some(true),
            "kernel lacks STATX_ATTR_MOUNT_ROOT?"
        );
        assert!(m.is_mount_point(&b).unwrap());
        assert!(m.is_mount_point_by_scan(&b).unwrap());
        assert!(!m.is_mount_point(&a).unwrap());
        assert!(!m.is_mount_point_by_scan(&a).unwrap());
        // The documented blind spot of the cheap heuristic.
        assert!(m.is_likely_not_mount_point(&b).unwrap());
        // It does see a different filesystem.
        let t = dir(tmp.path(), "t");
        m.mount("tmpfs", &t, "tmpfs", &["size=1m"]).unwrap();
        assert!(!m.is_likely_not_mount_point(&t).unwrap());
        assert!(m.is_likely_not_mount_point(&a).unwrap());

        // Absent paths are errors, not "false".
        let err = m.is_mount_point(&tmp.path().join("absent")).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOENT));
        m.unmount(&b, false).unwrap();
        m.unmount(&t, false).unwrap();
    });
}

fn mount_refs_and_device_from_mount() {
    in_private_mount_ns_in_tempdir("mount_refs_and_device_from_mount", |tmp| {
        let staging = dir(tmp.path(), "staging");
        let p1 = dir(tmp.path(), "p1");
        let p2 = dir(tmp.path(), "p2");
        let other = dir(tmp.path(), "other");
        let m = LinuxMounter::new();
        m.mount("csi-test-src", &staging, "tmpfs", &["size=1m"])
            .unwrap();
        fs::create_dir(staging.join("sub")).unwrap();
        m.bind_mount(&staging, &p1, false).unwrap();
        m.bind_mount(&p1, &p2, true).unwrap();
        // A bind of a subdirectory is a different root: not a reference.
        m.bind_mount(&staging.join("sub"), &other, false).unwrap();

        let mut refs = m.mount_refs(&staging).unwrap();
        refs.sort();
        assert_eq!(refs, vec![p1.clone(), p2.clone()]);
        assert_eq!(m.mount_refs(&p2).unwrap().len(), 2);
        assert!(m.mount_refs(&tmp.path().join("absent")).unwrap().is_empty());
        assert_eq!(
            mount_utils::block::device_from_mount(&m, &p2)
                .unwrap()
                .as_deref(),
            Some("csi-test-src")
        );

        for t in [&other, &p2, &p1, &staging] {
            m.cleanup_mount_point(t).unwrap();
        }
        assert!(!staging.exists());
    });
}

fn escaped_paths_round_trip_through_mountinfo() {
    in_private_mount_ns_in_tempdir("escaped_paths_round_trip_through_mountinfo", |tmp| {
        let target = dir(tmp.path(), "with space\tand\\slash\nnewline");
        let m = LinuxMounter::new();
        m.mount("tmpfs", &target, "tmpfs", &["size=1m"]).unwrap();
        assert!(entry_at(&m, &target).is_some());
        assert!(m.is_mount_point_by_scan(&target).unwrap());
        m.cleanup_mount_point(&target).unwrap();
        assert!(!target.exists());
    });
}

/// As when a child forked elsewhere in the program holds a copy of a
/// descriptor inside the mount until it execs: the unmount waits for it.
fn a_mount_busy_for_a_moment_is_unmounted() {
    in_private_mount_ns_in_tempdir("a_mount_busy_for_a_moment_is_unmounted", |tmp| {
        let target = dir(tmp.path(), "busy");
        let m = LinuxMounter::new();
        m.mount("tmpfs", &target, "tmpfs", &["size=1m"]).unwrap();
        let open = fs::File::create(target.join("open")).unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(3));
            drop(open);
        });
        m.unmount(&target, false).unwrap();
        closer.join().unwrap();
        assert!(!m.is_mount_point(&target).unwrap());
    });
}

fn cleanup_of_busy_stacked_and_absent_paths() {
    in_private_mount_ns_in_tempdir("cleanup_of_busy_stacked_and_absent_paths", |tmp| {
        let target = dir(tmp.path(), "busy");
        let m = LinuxMounter::new();
        m.mount("tmpfs", &target, "tmpfs", &["size=1m"]).unwrap();
        let open = fs::File::create(target.join("open")).unwrap();
        let err = m.cleanup_mount_point(&target).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EBUSY), "{err}");
        assert!(m.is_mount_point(&target).unwrap(), "busy mount must stay");
        drop(open);
        m.cleanup_mount_point(&target).unwrap();
        assert!(!target.exists());
        // Absent: success, repeatedly.
        m.cleanup_mount_point(&target).unwrap();

        // Stacked mounts all go.
        let stacked = dir(tmp.path(), "stacked");
        m.mount("tmpfs", &stacked, "tmpfs", &["size=1m"]).unwrap();
        m.mount("tmpfs", &stacked, "tmpfs", &["size=1m"]).unwrap();
        m.cleanup_mount_point(&stacked).unwrap();
        assert!(!stacked.exists());

        // A directory with content is unmounted but kept.
        let full = dir(tmp.path(), "full");
        fs::write(full.join("keep"), b"x").unwrap();
        m.mount("tmpfs", &full, "tmpfs", &["size=1m"]).unwrap();
        let err = m.cleanup_mount_point(&full).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOTEMPTY));
        assert!(!m.is_mount_point(&full).unwrap());
        assert!(full.join("keep").exists());
    });
}

fn file_bind_mount_for_block_volumes() {
    in_private_mount_ns_in_tempdir("file_bind_mount_for_block_volumes", |tmp| {
        let src = tmp.path().join("device-file");
        fs::write(&src, b"payload").unwrap();
        let target = tmp.path().join("publish-target");
        fs::File::create(&target).unwrap();
        let m = LinuxMounter::new();
        m.bind_mount(&src, &target, false).unwrap();
        assert!(m.is_mount_point(&target).unwrap());
        assert_eq!(fs::read(&target).unwrap(), b"payload");
        m.cleanup_mount_point(&target).unwrap();
        assert!(!target.exists(), "empty placeholder file is removed");
        assert!(src.exists());
    });
}

/// `mounts_at` (from statmount where the kernel has it) against the whole
/// table, field for field, over the kinds of mount a node plugin makes.
fn mounts_at_answers_what_the_table_says() {
    in_private_mount_ns_in_tempdir("mounts_at_answers_what_the_table_says", |tmp| {
        use nix::mount::{MsFlags, mount};
        let m = LinuxMounter::new();
        let flagged = dir(tmp.path(), "flagged");
        m.mount(
            "tmpfs",
            &flagged,
            "tmpfs",
            &[
                "size=1m",
                "mode=0700",
                "nosuid",
                "nodev",
                "noexec",
                "noatime",
            ],
        )
        .unwrap();
        let sub = dir(&flagged, "sub");
        let ro = dir(tmp.path(), "ro");
        m.bind_mount(&sub, &ro, true).unwrap();
        let stacked = dir(tmp.path(), "stacked");
        m.mount("first", &stacked, "tmpfs", &["size=1m"]).unwrap();
        m.mount("second", &stacked, "tmpfs", &["size=2m", "ro"])
            .unwrap();
        let odd = dir(tmp.path(), "with space\tand\\slash");
        m.mount("odd source", &odd, "tmpfs", &["size=1m"]).unwrap();
        let shared = dir(tmp.path(), "shared");
        m.mount("tmpfs", &shared, "tmpfs", &["size=1m"]).unwrap();
        let none = None::<&str>;
        mount(none, &shared, none, MsFlags::MS_SHARED, none).unwrap();
        let slave = dir(tmp.path(), "slave");
        m.bind_mount(&shared, &slave, false).unwrap();
        mount(none, &slave, none, MsFlags::MS_SLAVE, none).unwrap();
        let unbindable = dir(tmp.path(), "unbindable");
        m.mount("tmpfs", &unbindable, "tmpfs", &["size=1m"])
            .unwrap();
        mount(none, &unbindable, none, MsFlags::MS_UNBINDABLE, none).unwrap();
        let plain = dir(tmp.path(), "plain");

        let table = m.mount_points().unwrap();
        // Kernels before 6.8 answer from the whole table.
        let read_whole = m.clone().with_statmount(false);
        assert!(read_whole.path_queries_read_whole_table());
        let cases = [
            (Path::new("/"), 1),
            (flagged.as_path(), 1),
            (ro.as_path(), 1),
            (stacked.as_path(), 2),
            (odd.as_path(), 1),
            (shared.as_path(), 1),
            (slave.as_path(), 1),
            (unbindable.as_path(), 1),
            (plain.as_path(), 0),
            (&tmp.path().join("absent"), 0),
        ];
        for (path, count) in cases {
            let expected: Vec<MountInfo> = table
                .iter()
                .filter(|e| e.mount_point == path)
                .cloned()
                .collect();
            assert_eq!(expected.len(), count, "{}: the table", path.display());
            for m in [&m, &read_whole] {
                assert_eq!(
                    m.mounts_at(path).unwrap(),
                    expected,
                    "{}: mounts_at against the table",
                    path.display()
                );
            }
        }
        // containing_mount: the deepest mount point above the path, the
        // topmost mount there.
        let file = sub.join("file");
        fs::write(&file, b"x").unwrap();
        for path in [
            file.as_path(),
            sub.as_path(),
            ro.as_path(),
            stacked.as_path(),
            plain.as_path(),
            odd.as_path(),
            Path::new("/"),
        ] {
            let expected = table
                .iter()
                .filter(|e| path.starts_with(&e.mount_point))
                .max_by_key(|e| e.mount_point.components().count())
                .map(|deepest| {
                    table
                        .iter()
                        .rfind(|e| e.mount_point == deepest.mount_point)
                        .unwrap()
                        .clone()
                });
            for m in [&m, &read_whole] {
                assert_eq!(
                    m.containing_mount(path).unwrap(),
                    expected,
                    "{}: containing_mount against the table",
                    path.display()
                );
            }
        }

        let top = m.mounts_at(&stacked).unwrap();
        assert!(
            top[1].is_read_only() && !top[0].is_read_only(),
            "bottom first"
        );
        for t in [
            &unbindable,
            &slave,
            &shared,
            &odd,
            &stacked,
            &stacked,
            &ro,
            &flagged,
        ] {
            m.unmount(t, false).unwrap();
        }
    });
}
