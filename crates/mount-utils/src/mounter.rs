//! The [`Mounter`] trait.

use std::path::{Path, PathBuf};

use crate::error::MountError;
use crate::mountinfo::MountInfo;
use crate::options::Sensitive;

/// Mount-table operations a CSI node plugin needs.
///
/// Implemented by [`LinuxMounter`](crate::LinuxMounter) (real syscalls) and
/// [`FakeMounter`](crate::FakeMounter) (in memory, for unit tests). The trait
/// is object safe, so drivers can hold an `Arc<dyn Mounter>` and swap in the
/// fake in tests.
///
/// Idempotency: [`unmount`](Mounter::unmount) of something not mounted and
/// [`cleanup_mount_point`](Mounter::cleanup_mount_point) of an absent path
/// succeed, because CSI retries every call.
pub trait Mounter: Send + Sync {
    /// Mounts `source` on `target`.
    ///
    /// `options` are `mount(8)`-style (`ro`, `nosuid`, `size=1m`, `bind`,
    /// ...); see [`MountOptions::parse`](crate::MountOptions::parse). With
    /// `bind`, `fstype` is ignored and a read-only bind is made really
    /// read-only as in [`bind_mount`](Mounter::bind_mount).
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
    ) -> Result<(), MountError>;

    /// Bind-mounts `source` on `target`. With `read_only`, the bind is
    /// remounted `MS_RDONLY` while keeping the source's `nosuid`, `nodev`
    /// and `noexec`; if that fails the bind is undone.
    fn bind_mount(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError>;

    /// Unmounts `target` (`lazy`: `MNT_DETACH`). A path that is not mounted
    /// or does not exist is success.
    fn unmount(&self, target: &Path, lazy: bool) -> Result<(), MountError>;

    /// The mount table of the caller's mount namespace.
    fn mount_points(&self) -> Result<Vec<MountInfo>, MountError>;

    /// Whether `path` is the root of a mount, bind mounts of the same
    /// filesystem included. Fails if `path` cannot be inspected (absent,
    /// or a corrupted mount: see [`MountError::is_corrupted_mount`]).
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
    /// target of a block-volume bind). Absent paths are success.
    fn cleanup_mount_point(&self, path: &Path) -> Result<(), MountError>;
}
