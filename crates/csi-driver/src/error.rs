//! The one error type driver methods return, and its single mapping to a
//! gRPC status.

use tonic::{Code, Status};

/// A CSI error: one variant per gRPC code the spec assigns a meaning to.
///
/// Messages are sent to the CO and logged, so they must never contain
/// secrets. [`From<CsiError> for Status`](#impl-From<CsiError>-for-Status) is
/// the only place a `CsiError` becomes a status, and it never sets
/// `status.details` (the spec requires it empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsiError {
    /// A field is missing or invalid (3).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The field path, e.g. `volume_capabilities[0].access_mode`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The volume, snapshot or node does not exist (5).
    #[error("{0}")]
    NotFound(String),
    /// The resource exists with incompatible properties (6).
    #[error("{0}")]
    AlreadyExists(String),
    /// The system is not in a state that allows the call (9).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A size or offset is outside what the plugin supports (11).
    #[error("{0}")]
    OutOfRange(String),
    /// No capacity, or no topology that fits (8).
    #[error("{0}")]
    ResourceExhausted(String),
    /// Another operation on the same resource is in progress, or a paging
    /// token is invalid (10).
    #[error("{0}")]
    Aborted(String),
    /// The RPC is not implemented or not enabled (12).
    #[error("{0}")]
    Unimplemented(String),
    /// The secrets do not authenticate (16).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller lacks permission (7).
    #[error("{0}")]
    PermissionDenied(String),
    /// The backend is temporarily unreachable (14).
    #[error("{0}")]
    Unavailable(String),
    /// The operation did not finish in time (4).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The call was cancelled (1).
    #[error("{0}")]
    Cancelled(String),
    /// Anything else (13).
    #[error("{0}")]
    Internal(String),
}

impl CsiError {
    /// INVALID_ARGUMENT naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// INVALID_ARGUMENT for a required field that is empty or absent.
    pub fn required(field: impl Into<String>) -> Self {
        Self::invalid(field, "required")
    }

    /// UNIMPLEMENTED for the named RPC.
    pub fn unimplemented(rpc: &str) -> Self {
        Self::Unimplemented(format!("{rpc} is not implemented by this plugin"))
    }

    /// The code an OS error number has in CSI: RESOURCE_EXHAUSTED for a full
    /// disk or quota, DEADLINE_EXCEEDED for a timeout, INTERNAL otherwise (a
    /// driver that means NOT_FOUND or FAILED_PRECONDITION says so itself).
    /// For crates whose errors carry an errno (mount-utils' `csi` feature).
    pub fn from_os_error(errno: Option<i32>, message: impl Into<String>) -> Self {
        use std::io::ErrorKind;
        let message = message.into();
        match errno.map(|n| std::io::Error::from_raw_os_error(n).kind()) {
            Some(ErrorKind::StorageFull | ErrorKind::QuotaExceeded) => {
                Self::ResourceExhausted(message)
            }
            Some(ErrorKind::TimedOut) => Self::DeadlineExceeded(message),
            _ => Self::Internal(message),
        }
    }

    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::OutOfRange(_) => Code::OutOfRange,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::Aborted(_) => Code::Aborted,
            Self::Unimplemented(_) => Code::Unimplemented,
            Self::Unauthenticated(_) => Code::Unauthenticated,
            Self::PermissionDenied(_) => Code::PermissionDenied,
            Self::Unavailable(_) => Code::Unavailable,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::Cancelled(_) => Code::Cancelled,
            Self::Internal(_) => Code::Internal,
        }
    }

    /// Converts a status from another gRPC service (message kept, details
    /// dropped). `OK` and unknown codes become INTERNAL.
    pub fn from_status(status: &Status) -> Self {
        let m = status.message().to_owned();
        match status.code() {
            Code::InvalidArgument => Self::invalid("request", m),
            Code::NotFound => Self::NotFound(m),
            Code::AlreadyExists => Self::AlreadyExists(m),
            Code::FailedPrecondition => Self::FailedPrecondition(m),
            Code::OutOfRange => Self::OutOfRange(m),
            Code::ResourceExhausted => Self::ResourceExhausted(m),
            Code::Aborted => Self::Aborted(m),
            Code::Unimplemented => Self::Unimplemented(m),
            Code::Unauthenticated => Self::Unauthenticated(m),
            Code::PermissionDenied => Self::PermissionDenied(m),
            Code::Unavailable => Self::Unavailable(m),
            Code::DeadlineExceeded => Self::DeadlineExceeded(m),
            Code::Cancelled => Self::Cancelled(m),
            _ => Self::Internal(m),
        }
    }
}

impl From<std::io::Error> for CsiError {
    /// RESOURCE_EXHAUSTED for a full disk or quota, DEADLINE_EXCEEDED for a
    /// timeout, INTERNAL otherwise; the message is the error's.
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind;
        match e.kind() {
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded => {
                Self::ResourceExhausted(e.to_string())
            }
            ErrorKind::TimedOut => Self::DeadlineExceeded(e.to_string()),
            _ => Self::from_os_error(e.raw_os_error(), e.to_string()),
        }
    }
}

impl From<tower::BoxError> for CsiError {
    /// The error of a tower layer (e.g. `tower::timeout`) below or around
    /// the built-in ones: a `CsiError` stays itself, a timeout becomes
    /// DEADLINE_EXCEEDED, an overloaded service UNAVAILABLE, anything else
    /// INTERNAL with its message.
    fn from(e: tower::BoxError) -> Self {
        let e = match e.downcast::<CsiError>() {
            Ok(e) => return *e,
            Err(e) => e,
        };
        if e.is::<tower::timeout::error::Elapsed>() {
            Self::DeadlineExceeded("the call did not finish within the plugin's time limit".into())
        } else if e.is::<tower::load_shed::error::Overloaded>() {
            Self::Unavailable("the plugin is overloaded; retry later".into())
        } else {
            Self::Internal(e.to_string())
        }
    }
}

impl From<CsiError> for Status {
    fn from(e: CsiError) -> Self {
        // Status::new leaves details empty, as the spec requires.
        let mut message = e.to_string();
        if message.is_empty() {
            // The spec wants a human-readable message for every non-OK code.
            message = format!("{:?}", e.code());
        }
        Status::new(e.code(), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_maps_to_its_code_with_empty_details() {
        let cases = [
            (CsiError::required("volume_id"), Code::InvalidArgument),
            (CsiError::NotFound("x".into()), Code::NotFound),
            (CsiError::AlreadyExists("x".into()), Code::AlreadyExists),
            (
                CsiError::FailedPrecondition("x".into()),
                Code::FailedPrecondition,
            ),
            (CsiError::OutOfRange("x".into()), Code::OutOfRange),
            (
                CsiError::ResourceExhausted("x".into()),
                Code::ResourceExhausted,
            ),
            (CsiError::Aborted("x".into()), Code::Aborted),
            (CsiError::unimplemented("Foo"), Code::Unimplemented),
            (CsiError::Unauthenticated("x".into()), Code::Unauthenticated),
            (
                CsiError::PermissionDenied("x".into()),
                Code::PermissionDenied,
            ),
            (CsiError::Unavailable("x".into()), Code::Unavailable),
            (
                CsiError::DeadlineExceeded("x".into()),
                Code::DeadlineExceeded,
            ),
            (CsiError::Cancelled("x".into()), Code::Cancelled),
            (CsiError::Internal("x".into()), Code::Internal),
        ];
        for (err, code) in cases {
            let status = Status::from(err.clone());
            assert_eq!(status.code(), code, "{err:?}");
            assert!(status.details().is_empty());
            assert!(!status.message().is_empty());
            assert_eq!(CsiError::from_status(&status).code(), code);
        }
    }

    #[test]
    fn os_errors_map_to_the_codes_csi_gives_them() {
        use std::io::{Error, ErrorKind};
        let full = CsiError::from(Error::from_raw_os_error(ENOSPC));
        assert_eq!(full.code(), Code::ResourceExhausted);
        assert_eq!(
            CsiError::from(Error::from(ErrorKind::TimedOut)).code(),
            Code::DeadlineExceeded
        );
        assert_eq!(
            CsiError::from(Error::from(ErrorKind::NotFound)).code(),
            Code::Internal
        );
        assert_eq!(
            CsiError::from_os_error(Some(ENOSPC), "m").code(),
            Code::ResourceExhausted
        );
        assert_eq!(CsiError::from_os_error(None, "m").code(), Code::Internal);
    }

    /// ENOSPC on Linux.
    const ENOSPC: i32 = 28;

    #[test]
    fn tower_errors_keep_csi_errors_and_name_timeouts() {
        let boxed: tower::BoxError = Box::new(CsiError::NotFound("v".into()));
        assert_eq!(CsiError::from(boxed), CsiError::NotFound("v".into()));
        let boxed: tower::BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(CsiError::from(boxed).code(), Code::DeadlineExceeded);
    }

    #[test]
    fn invalid_argument_names_the_field() {
        let s = Status::from(CsiError::required("volume_capabilities[0].access_mode"));
        assert_eq!(s.message(), "volume_capabilities[0].access_mode: required");
        let s = Status::from(CsiError::Internal(String::new()));
        assert_eq!(s.message(), "Internal");
    }
}
