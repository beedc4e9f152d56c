//! Error type shared by every [`Mounter`](crate::Mounter) implementation.

use std::path::PathBuf;

use nix::errno::Errno;

use crate::mountinfo::ParseError;

/// Failure of a mount-table operation.
///
/// Every variant carries the `errno` the kernel returned so callers can
/// branch on it (see [`MountError::errno`]). Messages never include mount
/// data: sensitive options are shown as `<redacted>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    /// `mount(2)` failed.
    #[error("mount {device:?} on {target:?} (type {fstype:?}, options {options:?}): {errno}")]
    Mount {
        /// Mount source (device, path or pseudo name).
        device: String,
        /// Mount target.
        target: PathBuf,
        /// Filesystem type; empty for bind mounts.
        fstype: String,
        /// Non-sensitive options; sensitive ones appear as `<redacted>`.
        options: String,
        /// Kernel error.
        errno: Errno,
    },
    /// Remounting a bind mount (for example to make it read-only) failed.
    /// The bind mount has been undone.
    #[error("remount {target:?} with flags {flags}: {errno}")]
    Remount {
        /// Mount target.
        target: PathBuf,
        /// Human-readable flag list.
        flags: String,
        /// Kernel error.
        errno: Errno,
    },
    /// Changing the propagation type (shared, private, ...) failed.
    #[error("set propagation {propagation} on {target:?}: {errno}")]
    Propagation {
        /// Mount target.
        target: PathBuf,
        /// Requested propagation option.
        propagation: String,
        /// Kernel error.
        errno: Errno,
    },
    /// `umount2(2)` failed for a reason other than "not mounted".
    #[error("unmount {target:?}: {errno}")]
    Unmount {
        /// Mount target.
        target: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// `stat`/`statx` of a path failed.
    #[error("stat {path:?}: {errno}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// Reading the mount table failed.
    #[error("read {path:?}: {errno}")]
    ReadMountInfo {
        /// Usually `/proc/thread-self/mountinfo`.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// The mount table could not be parsed.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// Removing a mount point directory failed (`ENOTEMPTY` when it still
    /// has content).
    #[error("remove {path:?}: {errno}")]
    Remove {
        /// The path.
        path: PathBuf,
        /// Kernel error.
        errno: Errno,
    },
    /// The path is still a mount point after unmounting it repeatedly.
    #[error("{path:?} is still mounted after {attempts} unmounts")]
    StillMounted {
        /// The path.
        path: PathBuf,
        /// How many unmounts were done.
        attempts: u32,
    },
    /// A path or option cannot be passed to the kernel (interior NUL byte).
    #[error("invalid argument {what}: contains a NUL byte")]
    InvalidArgument {
        /// Which argument (never its value, which may be secret).
        what: &'static str,
    },
}

impl MountError {
    /// The kernel error behind this failure, if there is one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            MountError::Mount { errno, .. }
            | MountError::Remount { errno, .. }
            | MountError::Propagation { errno, .. }
            | MountError::Unmount { errno, .. }
            | MountError::Stat { errno, .. }
            | MountError::ReadMountInfo { errno, .. }
            | MountError::Remove { errno, .. } => Some(*errno),
            MountError::Parse(_)
            | MountError::StillMounted { .. }
            | MountError::InvalidArgument { .. } => None,
        }
    }

    /// Whether this error means the path is a broken mount (see
    /// [`is_corrupted_mount_errno`]).
    pub fn is_corrupted_mount(&self) -> bool {
        self.errno().is_some_and(is_corrupted_mount_errno)
    }
}

/// Errors that `stat` returns on a mount point whose filesystem is gone or
/// unreachable (a dead FUSE daemon, a stale NFS handle, a removed device).
///
/// Such a path is still mounted and must be unmounted before it can be
/// removed, so [`Mounter::cleanup_mount_point`](crate::Mounter::cleanup_mount_point)
/// unmounts it instead of failing.
pub fn is_corrupted_mount_errno(errno: Errno) -> bool {
    matches!(
        errno,
        Errno::ENOTCONN
            | Errno::ESTALE
            | Errno::EIO
            | Errno::EACCES
            | Errno::EHOSTDOWN
            | Errno::ENODEV
    )
}

/// Errno of an I/O error, `EIO` when it has none (synthetic errors).
pub(crate) fn io_errno(err: &std::io::Error) -> Errno {
    err.raw_os_error()
        .map(Errno::from_raw)
        .unwrap_or(Errno::EIO)
}
