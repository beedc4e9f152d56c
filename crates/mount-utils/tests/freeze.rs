//! FIFREEZE/FITHAW on a real filesystem: writes block while frozen and
//! complete after the thaw; the root filesystem is refused.

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use mount_utils::freeze::{FreezeError, FrozenFilesystem, same_filesystem, thaw};
use mount_utils::testing::{ScratchFilesystem, have_program, in_private_mount_ns_in_tempdir};

fn main() {
    common::run_root_tests(&[
        ("writes_wait_for_the_thaw", writes_wait_for_the_thaw),
        (
            "the_root_filesystem_is_never_frozen",
            the_root_filesystem_is_never_frozen,
        ),
    ])
}

fn writes_wait_for_the_thaw() {
    if !have_program("writes_wait_for_the_thaw", "mkfs.ext4") {
        return;
    }
    in_private_mount_ns_in_tempdir("writes_wait_for_the_thaw", |tmp| {
        let fs = ScratchFilesystem::new(tmp.path(), "scratch", 64 << 20, "ext4").unwrap();
        assert!(!same_filesystem(fs.path(), tmp.path()).unwrap());
        assert!(!thaw(fs.path()).unwrap(), "not frozen yet");

        let frozen = FrozenFilesystem::freeze(fs.path()).unwrap();
        assert!(
            matches!(
                FrozenFilesystem::freeze(fs.path()),
                Err(FreezeError::Ioctl { .. })
            ),
            "already frozen"
        );
        let (done_tx, done_rx) = mpsc::channel();
        let file = fs.path().join("written-while-frozen");
        let writer = std::thread::spawn(move || {
            std::fs::write(&file, b"data").unwrap();
            std::fs::File::open(&file).unwrap().sync_all().unwrap();
            done_tx.send(()).unwrap();
        });
        assert!(
            done_rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a write finished on a frozen filesystem"
        );
        frozen.thaw().unwrap();
        assert_eq!(open_fds_on(fs.path()), 0, "thaw closes its file");
        done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the write completes after the thaw");
        writer.join().unwrap();

        // A guard dropped without an explicit thaw thaws too.
        drop(FrozenFilesystem::freeze(fs.path()).unwrap());
        std::fs::write(fs.path().join("after-drop"), b"ok").unwrap();
    });
}

/// This process's open file descriptors that name `path`.
fn open_fds_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == path))
        .count()
}

fn the_root_filesystem_is_never_frozen() {
    let err = FrozenFilesystem::freeze(Path::new("/")).unwrap_err();
    assert!(matches!(err, FreezeError::RootFilesystem(_)), "{err}");
}
