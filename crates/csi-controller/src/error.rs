//! [`BackendError`]: how a backend reports a failure, and its one mapping
//! to a gRPC code (the table is in the crate docs).

use std::time::Duration;

use csi_driver::CsiError;

/// A backend's failure. Messages reach the CO and the log: never put a
/// token, a secret or a mount flag in one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The provider is busy or unreachable for now (HTTP 429 or 5xx, a
    /// timeout, a refused connection). Retried with backoff within the
    /// call's deadline, waiting at least `retry_after` when the provider
    /// said (429's Retry-After); UNAVAILABLE if it never succeeds.
    #[error("the storage provider is busy or unreachable: {message}")]
    Transient {
        /// What failed (no secrets).
        message: String,
        /// How long the provider asked callers to wait.
        retry_after: Option<Duration>,
    },
    /// The volume, snapshot or node does not exist: NOT_FOUND.
    #[error("{0}")]
    NotFound(String),
    /// It exists with other properties, or the provider reports a
    /// conflict: ALREADY_EXISTS.
    #[error("{0}")]
    Conflict(String),
    /// The provider refused the credentials (HTTP 401/403):
    /// UNAUTHENTICATED. The message never contains the credentials.
    #[error("the storage provider refused the credentials: {0}")]
    Unauthorized(String),
    /// A request field the provider cannot take: INVALID_ARGUMENT naming it.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The field (or `parameters.<key>`).
        field: String,
        /// Why.
        reason: String,
    },
    /// No capacity or quota left: RESOURCE_EXHAUSTED.
    #[error("{0}")]
    Exhausted(String),
    /// The provider answered something that cannot be read (garbage, a
    /// proxy's error page, a missing field): INTERNAL, nothing recorded.
    #[error("the storage provider's answer could not be read: {0}")]
    Malformed(String),
    /// Any CSI error as it is (what the crate's helpers return).
    #[error(transparent)]
    Csi(#[from] CsiError),
}

/// The result of a backend method.
pub type BackendResult<T> = Result<T, BackendError>;

impl BackendError {
    /// A transient failure without a Retry-After.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::Transient {
            message: message.into(),
            retry_after: None,
        }
    }

    /// Whether a retry may succeed without anything changing.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }
}

/// The single mapping to a gRPC code (through [`CsiError`]).
impl From<BackendError> for CsiError {
    fn from(e: BackendError) -> Self {
        let message = e.to_string();
        match e {
            BackendError::Transient { .. } => CsiError::Unavailable(message),
            BackendError::NotFound(_) => CsiError::NotFound(message),
            BackendError::Conflict(_) => CsiError::AlreadyExists(message),
            BackendError::Unauthorized(_) => CsiError::Unauthenticated(message),
            BackendError::InvalidArgument { field, reason } => CsiError::invalid(field, reason),
            BackendError::Exhausted(_) => CsiError::ResourceExhausted(message),
            BackendError::Malformed(_) => CsiError::Internal(message),
            BackendError::Csi(e) => e,
        }
    }
}

impl From<std::io::Error> for BackendError {
    fn from(e: std::io::Error) -> Self {
        Self::Csi(e.into())
    }
}

impl From<csi_store::StoreError> for BackendError {
    fn from(e: csi_store::StoreError) -> Self {
        Self::Csi(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_driver::Code;

    #[test]
    fn every_variant_maps_to_its_code() {
        let cases = [
            (BackendError::transient("503"), Code::Unavailable),
            (BackendError::NotFound("v".into()), Code::NotFound),
            (BackendError::Conflict("v".into()), Code::AlreadyExists),
            (
                BackendError::Unauthorized("401".into()),
                Code::Unauthenticated,
            ),
            (
                BackendError::InvalidArgument {
                    field: "parameters.type".into(),
                    reason: "unknown".into(),
                },
                Code::InvalidArgument,
            ),
            (
                BackendError::Exhausted("quota".into()),
                Code::ResourceExhausted,
            ),
            (BackendError::Malformed("<html>".into()), Code::Internal),
            (
                BackendError::Csi(CsiError::Aborted("busy".into())),
                Code::Aborted,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(CsiError::from(e.clone()).code(), code, "{e:?}");
        }
        let e = CsiError::from(BackendError::InvalidArgument {
            field: "parameters.type".into(),
            reason: "unknown key".into(),
        });
        assert!(e.to_string().contains("parameters.type"));
    }
}
