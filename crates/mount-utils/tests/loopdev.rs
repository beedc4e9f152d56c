//! Real loop device tests. They need root.

mod common;

use common::{assert_no_loop_device_for, in_private_mount_ns_in_tempdir, sparse_file};
use mount_utils::{LoopDevice, LoopOptions, block, loopdev};

fn main() {
    common::run_root_tests(&[
        ("loop_attach_find_grow_detach", loop_attach_find_grow_detach),
        ("loop_read_only_and_direct_io", loop_read_only_and_direct_io),
        (
            "autoclear_detaches_a_kept_device_once_unused",
            autoclear_detaches_a_kept_device_once_unused,
        ),
        (
            "legacy_set_fd_path_attaches_with_autoclear",
            legacy_set_fd_path_attaches_with_autoclear,
        ),
        (
            "parallel_attaches_survive_the_free_device_race",
            parallel_attaches_survive_the_free_device_race,
        ),
    ])
}

const MIB: u64 = 1 << 20;

fn loop_attach_find_grow_detach() {
    in_private_mount_ns_in_tempdir("loop_attach_find_grow_detach", |tmp| {
        let backing = tmp.path().join("disk.img");
        sparse_file(&backing, 16 * MIB);

        let dev = LoopDevice::attach(&backing, &LoopOptions::default()).unwrap();
        assert!(dev.path().exists());
        assert_eq!(
            loopdev::find_by_backing_file(&backing).unwrap(),
            vec![dev.path().to_path_buf()]
        );
        assert_eq!(
            dev.backing_file().unwrap(),
            Some(backing.canonicalize().unwrap())
        );
        assert!(dev.is_autoclear().unwrap());
        assert!(!dev.is_read_only().unwrap());
        assert_eq!(dev.size().unwrap(), 16 * MIB);

        // Grow the file: the device only sees it after LOOP_SET_CAPACITY.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&backing)
            .unwrap()
            .set_len(40 * MIB)
            .unwrap();
        assert_eq!(dev.size().unwrap(), 16 * MIB);
        dev.set_capacity().unwrap();
        assert_eq!(dev.size().unwrap(), 40 * MIB);
        assert_eq!(block::device_size(dev.path()).unwrap(), 40 * MIB);

        // A second device can be attached to the same file.
        let dev2 = LoopDevice::attach(&backing, &LoopOptions::default()).unwrap();
        assert_eq!(loopdev::find_by_backing_file(&backing).unwrap().len(), 2);
        dev2.detach().unwrap();
        dev.detach().unwrap();
        assert_no_loop_device_for(&backing);
    });
}

fn loop_read_only_and_direct_io() {
    in_private_mount_ns_in_tempdir("loop_read_only_and_direct_io", |tmp| {
        let backing = tmp.path().join("ro.img");
        sparse_file(&backing, 8 * MIB);
        let opts = LoopOptions {
            read_only: true,
            ..LoopOptions::default()
        };
        let dev = LoopDevice::attach(&backing, &opts).unwrap();
        assert!(dev.is_read_only().unwrap());
        assert!(block::is_read_only(dev.path()).unwrap());
        drop(dev);
        assert_no_loop_device_for(&backing);

        let opts = LoopOptions {
            direct_io: true,
            block_size: 4096,
            ..LoopOptions::default()
        };
        let dev = LoopDevice::attach(&backing, &opts).unwrap();
        assert!(!block::is_read_only(dev.path()).unwrap());
        // The kernel may refuse direct I/O on some backing filesystems and
        // fall back to buffered I/O; either way the device must work.
        eprintln!("direct I/O in effect: {}", dev.is_direct_io().unwrap());
        let mut buf = vec![0u8; 4096];
        use std::io::Read;
        std::fs::File::open(dev.path())
            .unwrap()
            .read_exact(&mut buf)
            .unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        drop(dev);
        assert_no_loop_device_for(&backing);
    });
}

fn autoclear_detaches_a_kept_device_once_unused() {
    in_private_mount_ns_in_tempdir("autoclear_detaches_a_kept_device_once_unused", |tmp| {
        let backing = tmp.path().join("auto.img");
        sparse_file(&backing, 8 * MIB);
        let path = LoopDevice::attach(&backing, &LoopOptions::default())
            .unwrap()
            .keep();
        // Our fd was the last user, so autoclear already released it.
        assert_no_loop_device_for(&backing);

        // Without autoclear a kept device persists until detached.
        let opts = LoopOptions {
            autoclear: false,
            ..LoopOptions::default()
        };
        let path2 = LoopDevice::attach(&backing, &opts).unwrap().keep();
        assert_eq!(
            loopdev::find_by_backing_file(&backing).unwrap(),
            vec![path2.clone()]
        );
        let reopened = LoopDevice::open(&path2).unwrap();
        assert!(!reopened.is_autoclear().unwrap());
        drop(reopened); // open() handles do not detach
        assert_eq!(loopdev::find_by_backing_file(&backing).unwrap().len(), 1);
        loopdev::detach(&path2).unwrap();
        assert_no_loop_device_for(&backing);
        let _ = path;
    });
}

fn legacy_set_fd_path_attaches_with_autoclear() {
    in_private_mount_ns_in_tempdir("legacy_set_fd_path_attaches_with_autoclear", |tmp| {
        let backing = tmp.path().join("legacy.img");
        sparse_file(&backing, 8 * MIB);
        let opts = LoopOptions {
            legacy_ioctls: true,
            ..LoopOptions::default()
        };
        let dev = LoopDevice::attach(&backing, &opts).unwrap();
        assert_eq!(dev.size().unwrap(), 8 * MIB);
        assert!(dev.is_autoclear().unwrap());
        assert_eq!(
            loopdev::find_by_backing_file(&backing).unwrap(),
            vec![dev.path().to_path_buf()]
        );
        drop(dev);
        assert_no_loop_device_for(&backing);

        // Read-only follows the backing fd's mode on this path.
        let opts = LoopOptions {
            legacy_ioctls: true,
            read_only: true,
            ..LoopOptions::default()
        };
        let dev = LoopDevice::attach(&backing, &opts).unwrap();
        assert!(dev.is_read_only().unwrap());
        dev.detach().unwrap();
        assert_no_loop_device_for(&backing);
    });
}

fn parallel_attaches_survive_the_free_device_race() {
    in_private_mount_ns_in_tempdir("parallel_attaches_survive_the_free_device_race", |tmp| {
        let files: Vec<_> = (0..6)
            .map(|i| {
                let p = tmp.path().join(format!("race{i}.img"));
                sparse_file(&p, 4 * MIB);
                p
            })
            .collect();
        // Several threads asking LOOP_CTL_GET_FREE at once get the same
        // number; the losers must retry instead of failing.
        let devices: Vec<LoopDevice> = std::thread::scope(|s| {
            let handles: Vec<_> = files
                .iter()
                .map(|f| s.spawn(move || LoopDevice::attach(f, &LoopOptions::default()).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut paths: Vec<_> = devices.iter().map(|d| d.path().to_path_buf()).collect();
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), files.len());
        drop(devices);
        for f in &files {
            assert_no_loop_device_for(f);
        }
    });
}
