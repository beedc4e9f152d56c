//! `From<…> for csi_driver::CsiError` for this crate's errors, so `?` works
//! in driver methods (the `csi` feature). Messages never hold mount options,
//! which may be secret.

use csi_driver::CsiError;

use crate::{ExecError, FormatError, LoopError, MountError, ResizeError, ServerError};

fn by_errno(errno: Option<crate::Errno>, message: String) -> CsiError {
    CsiError::from_os_error(errno.map(|e| e as i32), message)
}

impl From<MountError> for CsiError {
    /// By the kernel's errno (see [`CsiError::from_os_error`]).
    fn from(e: MountError) -> Self {
        by_errno(e.errno(), e.to_string())
    }
}

impl From<FormatError> for CsiError {
    /// A device holding another filesystem or a partition table, or an
    /// unformatted device mounted read-only, is FAILED_PRECONDITION; an
    /// unsupported filesystem type INVALID_ARGUMENT; mount errors by errno;
    /// anything else INTERNAL.
    fn from(e: FormatError) -> Self {
        match e {
            FormatError::Mount(m) => m.into(),
            FormatError::FilesystemMismatch { .. }
            | FormatError::UnformattedReadOnly { .. }
            | FormatError::HasPartitionTable { .. } => CsiError::FailedPrecondition(e.to_string()),
            FormatError::UnsupportedFilesystem { .. } => {
                CsiError::invalid("volume_capability.mount.fs_type", e.to_string())
            }
            _ => CsiError::Internal(e.to_string()),
        }
    }
}

impl From<ResizeError> for CsiError {
    /// Probe failures as [`FormatError`]s, anything else INTERNAL.
    fn from(e: ResizeError) -> Self {
        match e {
            ResizeError::Probe(f) => f.into(),
            other => CsiError::Internal(other.to_string()),
        }
    }
}

impl From<LoopError> for CsiError {
    /// No free loop device is RESOURCE_EXHAUSTED; anything else by errno.
    fn from(e: LoopError) -> Self {
        match &e {
            LoopError::NoFreeDevice { .. } => CsiError::ResourceExhausted(e.to_string()),
            _ => by_errno(e.errno(), e.to_string()),
        }
    }
}

impl From<ExecError> for CsiError {
    /// INTERNAL: a tool the driver runs failed.
    fn from(e: ExecError) -> Self {
        CsiError::Internal(e.to_string())
    }
}

impl From<ServerError> for CsiError {
    /// A host that did not resolve is UNAVAILABLE (the CO retries; a
    /// resolver may answer later); a source naming no server
    /// FAILED_PRECONDITION.
    fn from(e: ServerError) -> Self {
        match e {
            ServerError::Lookup { .. } => CsiError::Unavailable(e.to_string()),
            ServerError::Malformed { .. } => CsiError::FailedPrecondition(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_driver::Code;

    #[test]
    fn errors_map_to_the_codes_csi_gives_them() {
        let e = CsiError::from(MountError::Unmount {
            target: "/mnt/x".into(),
            errno: crate::Errno::EBUSY,
        });
        assert_eq!(e.code(), Code::Internal);
        assert!(e.to_string().contains("/mnt/x"), "{e}");
        let e = CsiError::from(MountError::Unmount {
            target: "/mnt/x".into(),
            errno: crate::Errno::ENOSPC,
        });
        assert_eq!(e.code(), Code::ResourceExhausted);
        let e = CsiError::from(LoopError::NoFreeDevice { attempts: 3 });
        assert_eq!(e.code(), Code::ResourceExhausted);
        let e = CsiError::from(ServerError::Lookup {
            fs_type: "nfs".into(),
            host: "files.example".into(),
            reason: "not found".into(),
        });
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.to_string().contains("files.example"), "{e}");
        let e = CsiError::from(ServerError::Malformed {
            fs_type: "cifs".into(),
            source_text: "share".into(),
            expected: "//server/share",
        });
        assert_eq!(e.code(), Code::FailedPrecondition);
    }
}
