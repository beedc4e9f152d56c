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

    /// Builds an error from a gRPC status code (see [`error_kind_for_grpc_code`]).
    pub fn from_grpc(code: i32, message: impl Into<String>) -> Self {
        Self::new(error_kind_for_grpc_code(code), message)
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

/// gRPC status codes (numeric values as on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
#[allow(missing_docs)] // the names are the gRPC spec's
pub enum GrpcCode {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl GrpcCode {
    /// All codes, in numeric order.
    pub const ALL: [GrpcCode; 17] = [
        GrpcCode::Ok,
        GrpcCode::Cancelled,
        GrpcCode::Unknown,
        GrpcCode::InvalidArgument,
        GrpcCode::DeadlineExceeded,
        GrpcCode::NotFound,
        GrpcCode::AlreadyExists,
        GrpcCode::PermissionDenied,
        GrpcCode::ResourceExhausted,
        GrpcCode::FailedPrecondition,
        GrpcCode::Aborted,
        GrpcCode::OutOfRange,
        GrpcCode::Unimplemented,
        GrpcCode::Internal,
        GrpcCode::Unavailable,
        GrpcCode::DataLoss,
        GrpcCode::Unauthenticated,
    ];

    /// The code for a numeric value; unknown values map to `Unknown`, as gRPC does.
    pub fn from_i32(code: i32) -> Self {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
            .unwrap_or(GrpcCode::Unknown)
    }

    /// The error kind a failed CSI call with this code implies.
    ///
    /// Like kubelet's CSI plugin: only codes saying "the call may still be in
    /// progress" are uncertain; every other failure means the driver finished
    /// the call. `Ok` is not a failure and maps to `Final` only for totality.
    pub fn error_kind(self) -> ErrorKind {
        match self {
            GrpcCode::Cancelled
            | GrpcCode::DeadlineExceeded
            | GrpcCode::Unavailable
            | GrpcCode::Aborted
            | GrpcCode::ResourceExhausted => ErrorKind::Uncertain,
            GrpcCode::Ok
            | GrpcCode::Unknown
            | GrpcCode::InvalidArgument
            | GrpcCode::NotFound
            | GrpcCode::AlreadyExists
            | GrpcCode::PermissionDenied
            | GrpcCode::FailedPrecondition
            | GrpcCode::OutOfRange
            | GrpcCode::Unimplemented
            | GrpcCode::Internal
            | GrpcCode::DataLoss
            | GrpcCode::Unauthenticated => ErrorKind::Final,
        }
    }
}

/// Maps a numeric gRPC status code to an [`ErrorKind`] (see [`GrpcCode::error_kind`]).
pub fn error_kind_for_grpc_code(code: i32) -> ErrorKind {
    GrpcCode::from_i32(code).error_kind()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes_round_trip_and_map_to_kinds() {
        for (i, code) in GrpcCode::ALL.iter().enumerate() {
            assert_eq!(GrpcCode::from_i32(i as i32), *code);
            assert_eq!(*code as i32, i as i32);
        }
        let uncertain: Vec<i32> = (0..17)
            .filter(|c| error_kind_for_grpc_code(*c) == ErrorKind::Uncertain)
            .collect();
        // Cancelled, DeadlineExceeded, ResourceExhausted, Aborted, Unavailable.
        assert_eq!(uncertain, vec![1, 4, 8, 10, 14]);
        assert_eq!(error_kind_for_grpc_code(-1), ErrorKind::Final);
        assert_eq!(error_kind_for_grpc_code(99), ErrorKind::Final);
        assert_eq!(PluginError::from_grpc(4, "t").kind, ErrorKind::Uncertain);
        assert_eq!(PluginError::from_grpc(5, "nf").kind, ErrorKind::Final);
    }
}
