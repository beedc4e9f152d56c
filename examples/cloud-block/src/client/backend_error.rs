//! [`ProviderError`] as csi-controller's [`BackendError`], so a controller
//! backend over this client uses `?`: transient failures keep their
//! Retry-After for the service's retries, and each conflict gets the code
//! the spec gives its situation; [`found`] reads a 404 as nothing;
//! [`taken_is_transient`] and [`running`] say what the service retries.

use csi_controller::{BackendError, BackendResult};
use csi_driver::CsiError;

use super::{ConflictKind, ProviderError};
use crate::api::Action;

impl From<ProviderError> for BackendError {
    fn from(e: ProviderError) -> Self {
        let message = e.to_string();
        if e.is_transient() {
            let retry_after = e.retry_after();
            return BackendError::Transient {
                message,
                retry_after,
            };
        }
        match e {
            ProviderError::NotFound { .. } => BackendError::NotFound(message),
            ProviderError::Unauthorized { .. } => BackendError::Unauthorized(message),
            ProviderError::Garbage { .. } => BackendError::Malformed(message),
            // The provider's message starts with the field it refused.
            ProviderError::Invalid { .. } => BackendError::InvalidArgument {
                field: "provider request".into(),
                reason: message,
            },
            ProviderError::Conflict { kind, .. } => match kind {
                // Another action runs: retried until it ends.
                ConflictKind::ActionInProgress { .. } => BackendError::transient(message),
                ConflictKind::AttachLimit => BackendError::Exhausted(message),
                ConflictKind::AttachedElsewhere { .. } | ConflictKind::VolumeAttached => {
                    BackendError::Csi(CsiError::FailedPrecondition(message))
                }
                _ => BackendError::Conflict(message),
            },
            // The transient kinds were answered above.
            _ => BackendError::transient(message),
        }
    }
}

/// A thing that is gone is `None`.
pub fn found<T>(r: Result<T, ProviderError>) -> BackendResult<Option<T>> {
    match r {
        Err(e) if e.is_not_found() => Ok(None),
        r => Ok(Some(r?)),
    }
}

/// A name taken by a create whose answer was lost: transient, so the
/// service looks the name up again before any second create.
pub fn taken_is_transient(e: ProviderError) -> BackendError {
    match e.conflict() {
        Some(ConflictKind::NameTaken) => BackendError::transient(e.to_string()),
        _ => e.into(),
    }
}

/// An action that has not completed (or errored): transient, so the
/// service polls or retries it.
pub fn running(what: &str, a: &Action) -> BackendError {
    let why = a.error.as_deref().unwrap_or("running");
    BackendError::transient(format!("{what} (action {}): {why}", a.id))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use csi_driver::Code;

    use super::*;

    fn code(e: ProviderError) -> Code {
        CsiError::from(BackendError::from(e)).code()
    }

    #[test]
    fn each_provider_error_gets_the_code_of_its_situation() {
        let m = || "m".to_owned();
        let throttled = ProviderError::RateLimited {
            retry_after: Some(Duration::from_secs(3)),
            message: m(),
        };
        assert_eq!(
            BackendError::from(throttled.clone()),
            BackendError::Transient {
                message: throttled.to_string(),
                retry_after: Some(Duration::from_secs(3))
            }
        );
        let conflict = |kind| ProviderError::Conflict { kind, message: m() };
        let cases = [
            (ProviderError::NotFound { message: m() }, Code::NotFound),
            (
                ProviderError::Unauthorized {
                    status: 401,
                    message: m(),
                },
                Code::Unauthenticated,
            ),
            (
                ProviderError::Garbage {
                    request: "GET /v2/volumes".into(),
                    reason: m(),
                },
                Code::Internal,
            ),
            (
                ProviderError::Invalid { message: m() },
                Code::InvalidArgument,
            ),
            (conflict(ConflictKind::AttachLimit), Code::ResourceExhausted),
            (
                conflict(ConflictKind::VolumeAttached),
                Code::FailedPrecondition,
            ),
            (conflict(ConflictKind::NameTaken), Code::AlreadyExists),
            (
                conflict(ConflictKind::ActionInProgress { action_id: Some(1) }),
                Code::Unavailable,
            ),
            (
                ProviderError::Unavailable {
                    status: 503,
                    message: m(),
                },
                Code::Unavailable,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(code(e.clone()), want, "{e:?}");
        }
    }
}
