//! The [`Mounter`] trait.

use std::path::{Path, PathBuf};

use crate::block::DeviceNumber;
use crate::error::MountError;
use crate::mountinfo::MountInfo;
use crate::options::{RedactedOptions, Sensitive};
use crate::source::{FsUsage, MountCheck, MountSource};

/// Upper bound on unmounts at one path; mounts can be stacked.
pub(crate) const MAX_STACKED_UNMOUNTS: u32 = 32;

/// The arguments of one [`Mounter::mount_sensitive`], as
/// [`Mounter::mount_with`] receives them.
#[derive(Clone, Copy)]
pub struct MountArgs<'a> {
    /// The device, share or directory (with `bind`) to mount.
    pub source: &'a str,
    /// Where to mount it; must exist.
    pub target: &'a Path,
    /// The filesystem type; ignored with `bind`.
    pub fstype: &'a str,
    /// `mount(8)`-style options (see [`Mounter::mount`]).
    pub options: &'a [&'a str],
    /// Options that reach the kernel but never a log line or an error.
    pub sensitive_options: &'a [Sensitive],
}

impl<'a> MountArgs<'a> {
    /// A mount with no sensitive options.
    pub fn new(source: &'a str, target: &'a Path, fstype: &'a str, options: &'a [&'a str]) -> Self {
        MountArgs {
            source,
            target,
            fstype,
            options,
            sensitive_options: &[],
        }
    }

    /// The same mount with `sensitive_options` added.
    pub fn with_sensitive_options(self, sensitive_options: &'a [Sensitive]) -> Self {
        MountArgs {
            sensitive_options,
            ..self
        }
    }

    /// The options as errors and logs may show them.
    pub fn redacted_options(&self) -> RedactedOptions {
        RedactedOptions::new(self.options, self.sensitive_options)
    }
}

impl std::fmt::Debug for MountArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountArgs")
            .field("source", &self.source)
            .field("target", &self.target)
            .field("fstype", &self.fstype)
            .field("options", &self.redacted_options())
            .finish()
    }
}

/// Mount-table operations a CSI node plugin needs.
///
/// Implemented by [`LinuxMounter`](crate::LinuxMounter) (real syscalls) and
/// `FakeMounter` (in memory, for unit tests; feature `testing`). The trait
/// is object safe, so drivers can hold an `Arc<dyn Mounter>` and swap in the
/// fake in tests.
///
/// Safety rules every implementation keeps:
/// - **No symlinks.** Targets, bind sources and paths to unmount, inspect or
///   remove are resolved without following symbolic links; a link anywhere
///   in the path is [`MountError::Symlink`] (see [`nofollow`](crate::nofollow)).
/// - **Read-only means read-only.** `ro` in the options, or
///   `read_only` in [`bind_mount`](Mounter::bind_mount), gives a read-only
///   mount whatever else the options say (a later `rw`, `remount`, ...), and
///   the result is checked.
/// - **Options are never shown.** Errors and logs carry
///   [`RedactedOptions`](crate::RedactedOptions), never an option's value.
/// - **Only ours.** [`check_mounted`](Mounter::check_mounted),
///   [`unmount_if_source`](Mounter::unmount_if_source) and
///   [`cleanup_mount_point_owned`](Mounter::cleanup_mount_point_owned) compare
///   the mount with an expected [`MountSource`] before touching it. The
///   older [`unmount`](Mounter::unmount) and
///   [`cleanup_mount_point`](Mounter::cleanup_mount_point) do not; use them
///   only on paths nobody else can mount on.
///
/// Idempotency: [`unmount`](Mounter::unmount) of something not mounted and
/// [`cleanup_mount_point`](Mounter::cleanup_mount_point) of an absent path
/// succeed, because CSI retries every call.
pub trait Mounter: Send + Sync {
    /// Mounts `source` on `target`, which must exist.
    ///
    /// `options` are `mount(8)`-style (`ro`, `nosuid`, `size=1m`, `bind`,
    /// ...); see [`MountOptions::parse`](crate::MountOptions::parse). `ro` is
    /// sticky: put the driver's own `ro` first and the CO's mount flags after
    /// it, and they cannot make the mount writable. With `bind`, `fstype` is
    /// ignored and the bind is made as in [`bind_mount`](Mounter::bind_mount).
    /// With `remount`, the existing mount at `target` is changed instead
    /// (prefer [`remount`](Mounter::remount)).
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
    ) -> Result<(), MountError> {
        self.mount_sensitive(source, target, fstype, options, &[])
    }

    /// Like [`mount`](Mounter::mount), with extra options that reach the
    /// kernel but never a log line, an error message or `Debug` output.
    fn mount_sensitive(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        options: &[&str],
        sensitive_options: &[Sensitive],
    ) -> Result<(), MountError> {
        let args = MountArgs::new(source, target, fstype, options);
        self.mount_with(&args.with_sensitive_options(sensitive_options))
    }

    /// [`mount_sensitive`](Mounter::mount_sensitive) with its arguments in
    /// one value: the method implementations provide, so that wrappers pass
    /// a mount on in one line.
    fn mount_with(&self, args: &MountArgs<'_>) -> Result<(), MountError>;

    /// Bind-mounts `source` on `target`. With `read_only` the bind is
    /// read-only from the moment it appears where the kernel has the new
    /// mount API (`open_tree` + `mount_setattr` + `move_mount`), otherwise
    /// it is bound and then remounted read-only (undone if that fails); the
    /// source's `nosuid`, `nodev` and `noexec` are kept either way.
    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError>;

    /// Changes the options of the mount at `target` (which must be a mount
    /// point). With `bind` among the options only the per-mount flags change
    /// (`ro`, `nosuid`, `nodev`, `noexec`, atime), the others keeping their
    /// current state; without it the filesystem is remounted and
    /// filesystem-specific options apply. `ro` is sticky as in
    /// [`mount`](Mounter::mount) and checked afterwards.
    fn remount(&self, target: &Path, options: &[&str]) -> Result<(), MountError>;

    /// Unmounts `target` (`lazy`: `MNT_DETACH`). A path that is not mounted
    /// or does not exist is success. [`LinuxMounter`](crate::LinuxMounter)
    /// tries a busy mount again for a moment before it reports `EBUSY`.
    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError>;

    /// Moves the topmost mount at `from` to `to` (`MS_MOVE`), keeping its
    /// mount id, so a mount made where only this process mounts can be
    /// recognised by that id wherever it is moved. Neither path may be or
    /// pass through a symlink. Unsupported by default (`EOPNOTSUPP`).
    fn move_mount(&self, from: &Path, to: &Path) -> Result<(), MountError> {
        Err(MountError::Mount {
            device: from.display().to_string(),
            target: to.to_path_buf(),
            fstype: String::new(),
            options: crate::RedactedOptions::from_flag_names(vec!["move"]),
            errno: nix::errno::Errno::EOPNOTSUPP,
        })
    }

    /// The mount table of the caller's mount namespace.
    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError>;

    /// The entries of [`mount_points`](Mounter::mount_points) whose mount id
    /// and device `keep` accepts, in table order. Linux parses only those
    /// lines: on a node with thousands of mounts, finding a volume's few
    /// costs little more than reading the table.
    fn mount_points_where(
        &self,
        keep: &dyn Fn(u32, DeviceNumber) -> bool,
    ) -> Result<Vec<MountInfo>, MountError> {
        let mut mounts = self.mount_points()?;
        mounts.retain(|m| keep(m.mount_id, m.device()));
        Ok(mounts)
    }

    /// Every mount stacked at `path`, bottom first (empty when nothing is
    /// mounted there). `path` is compared as given with the table's mount
    /// points, so it should be absolute with no symlinks. Linux answers
    /// from the mounts at `path` alone where the kernel can
    /// (`statmount(2)`), not from the whole table.
    fn mounts_at(&self, path: &Path) -> Result<Vec<MountInfo>, MountError> {
        let abs = crate::nofollow::absolute(path)?;
        Ok(crate::mountinfo::stacked_at(self.mount_points()?, &abs))
    }

    /// Whether each [`mounts_at`](Mounter::mounts_at) and
    /// [`containing_mount`](Mounter::containing_mount) reads the whole
    /// table: the default implementations do, and Linux does on kernels
    /// without `statmount(2)` (before 6.8). A caller with several questions
    /// about paths then reads the table once ([`mount_points`](Mounter::mount_points))
    /// and answers them from it.
    fn path_queries_read_whole_table(&self) -> bool {
        true
    }

    /// The mount `path` is on: the topmost at the deepest mount point that
    /// is `path` or above it (compared as given, like
    /// [`mounts_at`](Mounter::mounts_at)); `None` if there is none. Linux
    /// asks the kernel about that mount alone where it can.
    fn containing_mount(&self, path: &Path) -> Result<Option<MountInfo>, MountError> {
        let abs = crate::nofollow::absolute(path)?;
        Ok(crate::mountinfo::containing_mount(&self.mount_points()?, &abs).cloned())
    }

    /// The topmost mount at `path`: its mountinfo entry (device number,
    /// root, source, filesystem type, options), or `None` when `path` is not
    /// a mount point or does not exist. Answers "what exactly is mounted
    /// here?"; see [`check_mounted`](Mounter::check_mounted).
    fn mounted_at(&self, path: &Path) -> Result<Option<MountInfo>, MountError>;

    /// The `st_rdev` of the block device node at `path` (through mounts, so
    /// the device bind-mounted on a raw block publish target), or `None` if
    /// `path` is absent or not a block device.
    fn block_device_at(&self, path: &Path) -> Result<Option<DeviceNumber>, MountError>;

    /// What a bind mount of `source` shows in mountinfo, to record before
    /// binding it: [`MountSource::DeviceNode`] for a block device node,
    /// otherwise [`MountSource::Bind`] with the filesystem containing
    /// `source` and its path inside it.
    fn bind_source(&self, source: &Path) -> Result<MountSource, MountError>;

    /// Whether `path` is the root of a mount, bind mounts of the same
    /// filesystem included. Fails if `path` cannot be inspected (absent,
    /// or a corrupted mount: see [`MountError::is_corrupted_mount`]).
    /// `LinuxMounter` asks only what the kernel has cached, so a mount whose
    /// server or FUSE daemon is gone or hangs is still answered for, as a
    /// mount point.
    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError>;

    /// Cheap heuristic: `true` when `path` is on the same device as its
    /// parent. It is wrong for bind mounts within one filesystem (reports
    /// `true` although mounted); use [`is_mount_point`](Mounter::is_mount_point)
    /// when that matters.
    fn is_likely_not_mount_point(&self, path: &Path) -> Result<bool, MountError>;

    /// Other mount points showing the same directory of the same
    /// filesystem as the mount at `path` (same `major:minor` and root):
    /// answers "is this staging path still published somewhere?". Empty when
    /// `path` is not mounted or absent.
    fn mount_refs(&self, path: &Path) -> Result<Vec<PathBuf>, MountError>;

    /// Unmounts `path` if it is mounted (also when the mount is corrupted),
    /// then removes it if it is an empty directory or an empty file (the
    /// target of a block-volume bind). Absent paths are success. Does not
    /// check whose mount it is: see
    /// [`cleanup_mount_point_owned`](Mounter::cleanup_mount_point_owned).
    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError>;

    /// Removes `path` if it is an empty directory or an empty file and
    /// nothing is mounted on it; absent is success. Content is never
    /// removed (`ENOTEMPTY`), nor a mount point (`EBUSY`).
    fn remove_mount_point(&self, path: &Path) -> Result<(), MountError>;

    /// Space and inode usage of the filesystem at `path` (`statvfs`).
    fn fs_usage(&self, path: &Path) -> Result<FsUsage, MountError>;

    /// Compares the topmost mount at `path` with `expected`: the
    /// "is what is mounted here exactly this volume?" check behind every
    /// idempotent repeat and every teardown.
    fn check_mounted(&self, path: &Path, expected: &MountSource) -> Result<MountCheck, MountError> {
        let Some(info) = self.mounted_at(path)? else {
            return Ok(MountCheck::NotMounted);
        };
        let node = match expected {
            MountSource::DeviceNode(_) => self.block_device_at(path)?,
            _ => None,
        };
        Ok(if expected.matches(&info, node) {
            MountCheck::Ours(info)
        } else {
            MountCheck::Foreign(info)
        })
    }

    /// Unmounts the topmost mount at `path` if it is `expected`; `Ok(true)`
    /// when it did, `Ok(false)` when nothing was mounted, and
    /// [`MountError::NotOurs`] (nothing touched) when something else is.
    fn unmount_if_source(&self, path: &Path, expected: &MountSource) -> Result<bool, MountError> {
        match self.check_mounted(path, expected)? {
            MountCheck::NotMounted => Ok(false),
            MountCheck::Ours(_) => self.unmount(path, false).map(|()| true),
            MountCheck::Foreign(found) => Err(not_ours(path, &found, expected)),
        }
    }

    /// Unmounts every `expected` mount stacked at `path`, then removes it
    /// if it is an empty directory or file. Stops with
    /// [`MountError::NotOurs`] at the first mount that is something else,
    /// leaving it and the path in place. Absent paths are success.
    fn cleanup_mount_point_owned(
        &self,
        path: &Path,
        expected: &MountSource,
    ) -> Result<(), MountError> {
        for _ in 0..MAX_STACKED_UNMOUNTS {
            if !self.unmount_if_source(path, expected)? {
                return self.remove_mount_point(path);
            }
        }
        Err(MountError::StillMounted {
            path: path.to_path_buf(),
            attempts: MAX_STACKED_UNMOUNTS,
        })
    }

    /// Unmounts everything stacked at `path` and keeps the path (a
    /// directory the driver reuses). Returns how many mounts went.
    fn unmount_all(&self, path: &Path) -> Result<u32, MountError> {
        for n in 0..MAX_STACKED_UNMOUNTS {
            if self.mounted_at(path)?.is_none() {
                return Ok(n);
            }
            self.unmount(path, false)?;
        }
        Err(MountError::StillMounted {
            path: path.to_path_buf(),
            attempts: MAX_STACKED_UNMOUNTS,
        })
    }
}

fn not_ours(path: &Path, found: &MountInfo, expected: &MountSource) -> MountError {
    MountError::NotOurs {
        path: path.to_path_buf(),
        found: MountSource::of_mount(found),
        expected: expected.clone(),
    }
}
