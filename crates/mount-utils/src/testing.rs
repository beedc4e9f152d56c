//! Helpers for tests that mount for real: run a closure in a private mount
//! namespace, skip when not root, and wait for loop devices to go away.
//!
//! ```
//! use mount_utils::testing::{in_private_mount_ns, is_root};
//!
//! if is_root() {
//!     in_private_mount_ns("doc-example", || {
//!         // Mounts made here vanish when the closure's thread ends,
//!         // even if it panics.
//!     });
//! } else {
//!     eprintln!("skipped: doc-example: needs root (euid != 0)");
//! }
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use nix::sched::CloneFlags;

/// Whether the process runs as root (real mounts and loop devices need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Fails the calling test unless running as root.
///
/// A root-only test is reported as ignored, never as passed, when it cannot
/// run: mark it `#[ignore = "needs root: run by scripts/test.sh's root pass"]`
/// (the test script runs ignored tests in a second pass when it is root;
/// this crate's own root tests use a libtest-mimic harness that decides at
/// run time instead) and call this first, so `cargo test -- --ignored` run
/// without root fails saying why instead of failing somewhere deeper.
#[macro_export]
macro_rules! require_root {
    ($name:expr) => {
        assert!(
            $crate::testing::is_root(),
            "{}: needs root (euid != 0); run it as root (scripts/test.sh's root pass)",
            $name
        );
    };
}

/// Moves the calling thread into a mount namespace of its own, with `/`
/// recursively private so nothing mounted here reaches the host. Panics
/// if that fails. [`in_private_mount_ns`] does it on a thread of its own.
pub fn enter_private_mount_ns() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare(CLONE_NEWNS)");
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("make / recursively private");
}

/// Runs `f` on a new thread with its own private mount namespace and
/// returns its result; a panic in `f` is re-raised here.
///
/// `unshare(CLONE_NEWNS)` affects only the calling thread (and processes it
/// spawns), and making `/` recursively private keeps mounts from reaching the
/// host. When the thread ends the namespace and every mount in it go away,
/// however `f` ended. Loop devices are not namespaced: attach them with
/// autoclear or detach them in a guard.
pub fn in_private_mount_ns<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    let result = std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn_scoped(scope, || {
                enter_private_mount_ns();
                f()
            })
            .expect("spawn test thread");
        handle.join()
    });
    match result {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// [`in_private_mount_ns`] with a temporary directory for the mounts: `f`
/// gets it, and it is removed once the namespace has ended. Removed inside
/// the namespace, a directory still holding a mount (one `f` leaves, or one
/// a failing assertion left) could not go, and would stay behind on the
/// host empty.
pub fn in_private_mount_ns_in_tempdir<T: Send>(
    name: &str,
    f: impl FnOnce(&tempfile::TempDir) -> T + Send,
) -> T {
    let tmp = tempfile::tempdir().expect("a temporary directory");
    // The namespace, and every mount in it, ends with its thread, before
    // `tmp` is dropped.
    in_private_mount_ns(name, || f(&tmp))
}

/// Waits up to 5 s (detach on last close can lag) until no loop device is
/// attached to `backing`; panics naming the devices otherwise.
pub fn assert_no_loop_device_for(backing: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let devs = crate::loopdev::find_by_backing_file(backing).expect("scan /sys/block");
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

/// Detaches every loop device whose backing file is under `dir`; returns
/// how many there were. For guards that must leave nothing attached even
/// after a crashed driver.
pub fn detach_loop_devices_under(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return 0;
    };
    let mut detached = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(backing.trim_end()).starts_with(dir)
            && crate::loopdev::detach(format!("/dev/{name}")).is_ok()
        {
            detached += 1;
        }
    }
    detached
}

/// Whether an external program is installed; prints why `test` is skipped if not.
pub fn have_program(test: &str, program: &str) -> bool {
    if crate::SystemExec::find_program(program).is_some() {
        return true;
    }
    eprintln!("skipped: {test}: {program} is not installed");
    false
}

/// A freshly formatted filesystem on a loop device, mounted at
/// [`path`](Self::path): a dedicated filesystem for a test (to freeze it,
/// fill it, or grow it). Unmounted and detached on drop; use it inside
/// [`in_private_mount_ns`] so a crash cannot leave the mount behind.
#[derive(Debug)]
pub struct ScratchFilesystem {
    mount_point: std::path::PathBuf,
    device: Option<crate::LoopDevice>,
}

impl ScratchFilesystem {
    /// Creates `dir/<name>.img` of `size` bytes, formats it with `fs_type`
    /// (`mkfs.<fs_type>` must exist) and mounts it at `dir/<name>`.
    pub fn new(dir: &Path, name: &str, size: u64, fs_type: &str) -> Result<Self, String> {
        Self::with_options(dir, name, size, fs_type, &[], &[])
    }

    /// Like [`new`](Self::new), passing `mkfs_args` to `mkfs.<fs_type>` and
    /// mounting with `mount_options` (e.g. `-O quota,project` and `prjquota`
    /// for ext4 project quotas).
    pub fn with_options(
        dir: &Path,
        name: &str,
        size: u64,
        fs_type: &str,
        mkfs_args: &[&str],
        mount_options: &[&str],
    ) -> Result<Self, String> {
        use crate::{Exec, Mounter};
        let image = dir.join(format!("{name}.img"));
        let mount_point = dir.join(name);
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size))
            .map_err(|e| format!("creating {}: {e}", image.display()))?;
        std::fs::create_dir_all(&mount_point).map_err(|e| e.to_string())?;
        let device = crate::LoopDevice::attach(&image, &crate::LoopOptions::default())
            .map_err(|e| e.to_string())?;
        let dev = device.path().to_string_lossy().into_owned();
        let mkfs = format!("mkfs.{fs_type}");
        let mut args = vec!["-q"];
        args.extend_from_slice(mkfs_args);
        args.push(&dev);
        let out = crate::SystemExec::new()
            .run(&mkfs, &args)
            .map_err(|e| e.to_string())?;
        if !out.success() {
            return Err(format!("{mkfs} failed: {}", out.stderr.trim()));
        }
        crate::LinuxMounter::new()
            .mount(&dev, &mount_point, fs_type, mount_options)
            .map_err(|e| e.to_string())?;
        Ok(Self {
            mount_point,
            device: Some(device),
        })
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        &self.mount_point
    }
}

impl Drop for ScratchFilesystem {
    fn drop(&mut self) {
        use crate::Mounter;
        let _ = crate::freeze::thaw(&self.mount_point);
        let _ = crate::LinuxMounter::new().unmount(&self.mount_point, true);
        // Autoclear: the device goes once the mount is gone.
        drop(self.device.take());
    }
}
