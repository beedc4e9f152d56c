//! Shared helpers for the root tests. Each test binary uses a subset, hence
//! the dead_code allowance.
#![allow(dead_code, unused_imports)]

use std::path::Path;

pub use mount_utils::testing::{
    assert_no_loop_device_for, have_program, in_private_mount_ns, in_private_mount_ns_in_tempdir,
};

/// Creates a sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let f = std::fs::File::create(path).expect("create backing file");
    f.set_len(size).expect("set_len");
}

/// Total size in bytes of the filesystem mounted at `path`.
pub fn fs_size(path: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(path).expect("statvfs");
    s.blocks() * s.fragment_size()
}

/// Runs `tests` with libtest's command line (filters, `--list`,
/// `--ignored`, ...). When not root they are reported as ignored, saying
/// why, never as passed. For test binaries with `harness = false`.
pub fn run_root_tests(tests: &[(&'static str, fn())]) -> ! {
    let root = mount_utils::testing::is_root();
    let mut args = libtest_mimic::Arguments::from_args();
    // One at a time unless asked otherwise: descriptors are per process, so
    // a child one test forks (mkfs, fsck) holds, until it execs, every file
    // another test has open, and that test would find its mount busy (an
    // unmount waits that out; other checks of a busy mount would not).
    args.test_threads.get_or_insert(1);
    if !root && !args.list {
        eprintln!(
            "{} root-only tests reported as ignored: needs root (euid != 0)",
            tests.len()
        );
    }
    let trials = tests
        .iter()
        .map(|&(name, test)| {
            libtest_mimic::Trial::test(name, move || {
                test();
                Ok(())
            })
            .with_ignored_flag(!root)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit()
}
