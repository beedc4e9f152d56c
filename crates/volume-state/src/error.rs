//! Error kinds that decide the next state after a failed operation, and the
//! mapping from gRPC status codes (as returned by CSI drivers) to them.

use std::time::Instant;

/// How a failed operation leaves the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The operation finished and failed: nothing was (or remains) done.
    Final,
    /// The operation may or may not have taken effect (timeout, cancelled,
    /// driver unavailable, aborted, resource exhausted).
    Uncertain,
    /// The operation did not start (e.g. a local precondition); nothing
    /// changed and it is simply retried.
    Transient,
}

/// An error returned by a [`VolumePlugin`](crate::VolumePlugin) call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?} error: {message}")]
pub struct PluginError {
    /// What the failure means for the state of the volume.
    pub kind: ErrorKind,
    /// Human-readable cause.
    pub message: String,
}

impl PluginError {
    /// A new error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A [`ErrorKind::Final`] error.
    pub fn final_error(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Final, message)
    }

    /// An [`ErrorKind::Uncertain`] error.
    pub fn uncertain(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Uncertain, message)
    }

    /// A [`ErrorKind::Transient`] error.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Transient, message)
    }

    /// An error for a CSI call that failed with `code` (see [`error_kind_for_code`]).
    #[cfg(feature = "csi")]
    pub fn from_code(code: tonic::Code, message: impl Into<String>) -> Self {
        Self::new(error_kind_for_code(code), message)
    }
}

/// Why the [`OperationGate`](crate::OperationGate) refused to start an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// An operation with a nesting key is already running.
    #[error("an operation on this volume is already pending")]
    AlreadyExists,
    /// The same operation failed recently and is inside its backoff window.
    #[error("operation in backoff until {until:?} after error: {last_error}")]
    Backoff {
        /// Earliest instant at which the operation may start again.
        until: Instant,
        /// Message of the failure that caused the backoff.
        last_error: String,
    },
}

/// The error kind a failed CSI call with `code` implies.
///
/// Like kubelet's CSI plugin: only codes saying "the call may still be in
/// progress" are uncertain; every other failure means the driver finished
/// the call. `Ok` is not a failure and maps to `Final` only for totality.
#[cfg(feature = "csi")]
pub fn error_kind_for_code(code: tonic::Code) -> ErrorKind {
    use tonic::Code;
    match code {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Unavailable
        | Code::Aborted
        | Code::ResourceExhausted => ErrorKind::Uncertain,
        Code::Ok
        | Code::Unknown
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss
        | Code::Unauthenticated => ErrorKind::Final,
    }
}

#[cfg(all(test, feature = "csi"))]
mod tests {
    use super::*;

    #[test]
    fn only_codes_of_calls_maybe_in_progress_are_uncertain() {
        let uncertain: Vec<i32> = (0..17)
            .filter(|c| error_kind_for_code(tonic::Code::from_i32(*c)) == ErrorKind::Uncertain)
            .collect();
        // Cancelled, DeadlineExceeded, ResourceExhausted, Aborted, Unavailable.
        assert_eq!(uncertain, vec![1, 4, 8, 10, 14]);
        // Numbers gRPC does not know are UNKNOWN: final.
        assert_eq!(
            error_kind_for_code(tonic::Code::from_i32(-1)),
            ErrorKind::Final
        );
        assert_eq!(
            error_kind_for_code(tonic::Code::from_i32(99)),
            ErrorKind::Final
        );
        let timeout = PluginError::from_code(tonic::Code::DeadlineExceeded, "t");
        assert_eq!(timeout.kind, ErrorKind::Uncertain);
        let missing = PluginError::from_code(tonic::Code::NotFound, "nf");
        assert_eq!(missing.kind, ErrorKind::Final);
    }
}
