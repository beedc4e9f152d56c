//! Project quotas on a real ext4 (and xfs when installed): a directory in a
//! project cannot grow past its limit, statfs shows the limit, and raising
//! the limit lets it grow. Kernels built without quota support refuse the
//! `prjquota` mount option; the tests then say so and skip.

mod common;

use std::io::Write;
use std::path::Path;

use mount_utils::quota;
use mount_utils::testing::{ScratchFilesystem, have_program, in_private_mount_ns_in_tempdir};

fn main() {
    common::run_root_tests(&[
        (
            "ext4_project_quota_limits_a_directory",
            ext4_project_quota_limits_a_directory,
        ),
        (
            "xfs_project_quota_limits_a_directory",
            xfs_project_quota_limits_a_directory,
        ),
    ])
}

const MIB: u64 = 1 << 20;

fn write_mib(path: &Path, mib: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![7u8; MIB as usize];
    for _ in 0..mib {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

/// A filesystem mounted with `prjquota`, or `None` (with the skip reason
/// printed) when the kernel has no quota support.
fn quota_fs(
    test: &str,
    dir: &Path,
    fs_type: &str,
    size: u64,
    mkfs_args: &[&str],
) -> Option<ScratchFilesystem> {
    match ScratchFilesystem::with_options(dir, "q", size, fs_type, mkfs_args, &["prjquota"]) {
        Ok(fs) => Some(fs),
        Err(e) if e.contains("EINVAL") => {
            eprintln!(
                "skipped: {test}: the kernel refuses prjquota on {fs_type} (built without quota support?): {e}"
            );
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn exercise(fs: &ScratchFilesystem) {
    assert!(
        quota::supported(fs.path()),
        "project quotas enabled: {:?}",
        quota::get(fs.path(), 0)
    );
    let vol = fs.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    quota::set_project(&vol, 42).unwrap();
    quota::set_limit(fs.path(), 42, 8 * MIB).unwrap();
    assert_eq!(quota::get(fs.path(), 42).unwrap().limit_bytes, 8 * MIB);

    // statfs on the directory reports the project's limit, as df shows it.
    let st = nix::sys::statvfs::statvfs(&vol).unwrap();
    assert_eq!(st.blocks() * st.fragment_size(), 8 * MIB);

    let err = write_mib(&vol.join("big"), 16).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    std::fs::remove_file(vol.join("big")).unwrap();

    quota::set_limit(fs.path(), 42, 32 * MIB).unwrap();
    write_mib(&vol.join("big"), 16).unwrap();
    let q = quota::get(fs.path(), 42).unwrap();
    assert!(q.used_bytes >= 16 * MIB, "{q:?}");
    quota::clear(fs.path(), 42).unwrap();
    assert_eq!(quota::get(fs.path(), 42).unwrap().limit_bytes, 0);
}

fn ext4_project_quota_limits_a_directory() {
    const TEST: &str = "ext4_project_quota_limits_a_directory";
    if !have_program(TEST, "mkfs.ext4") {
        return;
    }
    in_private_mount_ns_in_tempdir(TEST, |tmp| {
        let plain = ScratchFilesystem::new(tmp.path(), "plain", 64 * MIB, "ext4").unwrap();
        assert!(
            !quota::supported(plain.path()),
            "no project quotas without the feature"
        );
        if let Some(fs) = quota_fs(
            TEST,
            tmp.path(),
            "ext4",
            128 * MIB,
            &["-O", "quota,project"],
        ) {
            exercise(&fs);
        }
    });
}

fn xfs_project_quota_limits_a_directory() {
    const TEST: &str = "xfs_project_quota_limits_a_directory";
    if !have_program(TEST, "mkfs.xfs") {
        return;
    }
    in_private_mount_ns_in_tempdir(TEST, |tmp| {
        if let Some(fs) = quota_fs(TEST, tmp.path(), "xfs", 320 * MIB, &[]) {
            exercise(&fs);
        }
    });
}
