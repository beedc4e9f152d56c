//! [`NodeError`]: why a node operation was refused or failed, mapped once to
//! a CSI code.

use std::path::{Path, PathBuf};

use csi_driver::CsiError;
use csi_store::StoreError;
use mount_utils::{Errno, FormatError, LoopError, MountError, ServerError};

/// Why a node operation was refused (a rule) or failed (an effect).
///
/// Messages name volumes, paths and fields, never a mount flag or option
/// value: mount errors keep only the action, the path and the errno.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// A refusal with the spec's code (INVALID_ARGUMENT naming the field,
    /// NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, ABORTED, ...), from
    /// the rules or from a driver hook.
    #[error(transparent)]
    Csi(#[from] CsiError),
    /// A mount-table operation failed (INTERNAL).
    #[error("{action} {}: {}", path.display(), errno_text(*errno))]
    Mount {
        /// What was being done (`mounting`, `unmounting`, ...).
        action: &'static str,
        /// The path it was done on.
        path: PathBuf,
        /// The kernel's answer, when there was one.
        errno: Option<Errno>,
    },
    /// A loop-device operation failed (INTERNAL).
    #[error("{action} {}: {}", path.display(), errno_text(*errno))]
    Loop {
        /// What was being done.
        action: &'static str,
        /// The device or backing file.
        path: PathBuf,
        /// The kernel's answer, when there was one.
        errno: Option<Errno>,
    },
    /// A file operation on a staging or target path failed (INTERNAL).
    #[error("{action} {}: {reason}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error's text.
        reason: String,
    },
    /// Saving or loading a record failed (INTERNAL; RESOURCE_EXHAUSTED
    /// when the disk is full).
    #[error("node record store: {reason}")]
    Store {
        /// What went wrong.
        reason: String,
        /// The store's disk is full.
        full: bool,
    },
}

impl From<ServerError> for NodeError {
    /// As mount-utils maps it to a CSI code: UNAVAILABLE for a host that
    /// did not resolve, FAILED_PRECONDITION for a source naming no server.
    fn from(e: ServerError) -> Self {
        CsiError::from(e).into()
    }
}

fn errno_text(errno: Option<Errno>) -> String {
    errno.map_or_else(|| "failed".to_owned(), |e| e.desc().to_owned())
}

impl NodeError {
    /// Whether this is the record store's disk being full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Self::Store { full: true, .. })
    }

    /// INVALID_ARGUMENT naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CsiError::invalid(field, reason).into()
    }

    /// NOT_FOUND: the volume is unknown, or not the one at the path.
    pub fn not_found(message: impl Into<String>) -> Self {
        CsiError::NotFound(message.into()).into()
    }

    /// ALREADY_EXISTS: the path holds another volume, or this one with
    /// other arguments.
    pub fn already_exists(message: impl Into<String>) -> Self {
        CsiError::AlreadyExists(message.into()).into()
    }

    /// FAILED_PRECONDITION: the node is not in a state that allows the call.
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        CsiError::FailedPrecondition(message.into()).into()
    }

    /// ABORTED: another operation on the volume or path is in flight.
    pub fn aborted(message: impl Into<String>) -> Self {
        CsiError::Aborted(message.into()).into()
    }

    /// Whether this is NOT_FOUND.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Csi(CsiError::NotFound(_)))
    }

    /// An I/O failure on `path`.
    pub fn io(action: &'static str, path: &Path, e: &std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_path_buf(),
            reason: e
                .raw_os_error()
                .map(|n| Errno::from_raw(n).desc().to_owned())
                .unwrap_or_else(|| e.kind().to_string()),
        }
    }

    /// A mount failure while doing `action` on `path`; only the errno of
    /// `e` is kept (its text may list options).
    pub fn mount(action: &'static str, path: &Path, e: &MountError) -> Self {
        Self::Mount {
            action,
            path: path.to_path_buf(),
            errno: e.errno(),
        }
    }

    /// A failure finding or reading the attached device at `path`: one that
    /// is not a block device is FAILED_PRECONDITION, the rest INTERNAL.
    pub fn block_device(path: &Path, e: &mount_utils::BlockDeviceError) -> Self {
        match e {
            mount_utils::BlockDeviceError::Io { action, errno, .. } => Self::Io {
                action,
                path: path.to_path_buf(),
                reason: errno.desc().to_owned(),
            },
            other => Self::failed_precondition(other.to_string()),
        }
    }

    /// A loop-device failure while doing `action` on `path`.
    pub fn loop_device(action: &'static str, path: &Path, e: &LoopError) -> Self {
        Self::Loop {
            action,
            path: path.to_path_buf(),
            errno: e.errno(),
        }
    }

    /// What [`SafeFormatAndMount`](mount_utils::SafeFormatAndMount) said,
    /// for a device staged at `target`: refusals (another filesystem, a
    /// partition table, errors fsck cannot fix, no filesystem on a volume
    /// that must not be formatted) are FAILED_PRECONDITION, an unsupported
    /// type names the field, the rest is INTERNAL. No tool output or
    /// option reaches the message.
    pub fn format(device: &Path, target: &Path, e: &FormatError) -> Self {
        let dev = device.display();
        match e {
            FormatError::FilesystemMismatch {
                existing,
                requested,
                ..
            } => Self::failed_precondition(format!(
                "{dev} already holds {existing}, not {requested}; refusing to format it"
            )),
            FormatError::UnformattedReadOnly { .. } => Self::failed_precondition(format!(
                "{dev} holds no filesystem and the volume is read-only"
            )),
            FormatError::HasPartitionTable { pttype, .. } => Self::failed_precondition(format!(
                "{dev} holds a {pttype} partition table; refusing to format it"
            )),
            FormatError::HasFilesystemErrors { .. } => Self::failed_precondition(format!(
                "the filesystem on {dev} has errors fsck could not correct"
            )),
            FormatError::FilesystemMissing { .. } => Self::failed_precondition(format!(
                "{dev} was formatted for this volume but holds no filesystem now; \
                 refusing to format it again"
            )),
            FormatError::UnsupportedFilesystem { fstype } => Self::invalid(
                "volume_capability.mount.fs_type",
                format!("{fstype:?} is not a filesystem this plugin can create"),
            ),
            FormatError::Mount(m) => Self::mount("mounting", target, m),
            other => Self::Io {
                action: "preparing the filesystem on",
                path: device.to_path_buf(),
                reason: match other {
                    FormatError::ProbeFailed { code, .. } => format!("blkid exited with {code:?}"),
                    FormatError::FormatFailed { code, .. } => format!("mkfs exited with {code:?}"),
                    FormatError::FsckFailed { code, .. } => format!("fsck exited with {code:?}"),
                    _ => "a tool could not be run".to_owned(),
                },
            },
        }
    }
}

impl From<StoreError> for NodeError {
    /// Store errors name tables, keys and files, never record contents.
    fn from(e: StoreError) -> Self {
        NodeError::Store {
            full: e.is_no_space(),
            reason: e.to_string(),
        }
    }
}

impl From<NodeError> for CsiError {
    fn from(e: NodeError) -> Self {
        let message = e.to_string();
        match e {
            NodeError::Store { full: true, .. } => CsiError::ResourceExhausted(message),
            NodeError::Mount { .. }
            | NodeError::Loop { .. }
            | NodeError::Io { .. }
            | NodeError::Store { .. } => CsiError::Internal(message),
            NodeError::Csi(c) => c,
        }
    }
}
