//! Shared helpers for the root tests. Each test binary uses a subset, hence
//! the dead_code allowance.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use nix::sched::CloneFlags;

/// Returns from the test (with the standard skip line) unless running as root.
#[macro_export]
macro_rules! require_root {
    ($name:expr) => {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: {}: needs root (euid != 0)", $name);
            return;
        }
    };
}

/// Runs `f` on a fresh thread with its own private mount namespace.
///
/// `unshare(CLONE_NEWNS)` affects only the calling thread, and making `/`
/// recursively private keeps our mounts from propagating to the host. When
/// the thread ends, its namespace and every mount in it go away, even if `f`
/// panicked halfway. Panics are re-raised in the test thread.
pub fn in_private_mount_ns<F: FnOnce() + Send + 'static>(name: &str, f: F) {
    let handle = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .expect("make / recursively private");
            f();
        })
        .expect("spawn test thread");
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

/// Creates a sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let f = std::fs::File::create(path).expect("create backing file");
    f.set_len(size).expect("set_len");
}

/// Waits (up to 5 s: detaching on last close can lag) until no loop device
/// is attached to `backing`, and fails the test otherwise.
pub fn assert_no_loop_device_for(backing: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let devs = mount_utils::loopdev::find_by_backing_file(backing).expect("scan /sys/block");
        if devs.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "loop devices still attached to {}: {devs:?}",
                backing.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether an external program is installed; prints the skip reason if not.
pub fn have_program(test: &str, program: &str) -> bool {
    if mount_utils::SystemExec::find_program(program).is_some() {
        return true;
    }
    eprintln!("skipped: {test}: {program} is not installed");
    false
}

/// Total size in bytes of the filesystem mounted at `path`.
pub fn fs_size(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).expect("statvfs");
    s.blocks() * s.fragment_size()
}
