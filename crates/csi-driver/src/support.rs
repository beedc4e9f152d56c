//! What every driver's `main` and methods otherwise write themselves.

use crate::driver::CsiResult;
use crate::error::CsiError;
use crate::validate::MAX_NODE_ID;

/// `explicit` when given, else this machine's hostname (what kubelet
/// registers the node as by default), else `localhost`. Truncated to the
/// spec's 256 bytes at a character boundary.
pub fn node_id_or_hostname(explicit: Option<&str>) -> String {
    let mut id = explicit
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .or_else(|| {
            // gethostname(2) on Linux: this UTS namespace's node name.
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim_end().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned());
    if id.len() > MAX_NODE_ID {
        let mut end = MAX_NODE_ID;
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        id.truncate(end);
    }
    id
}

/// Runs blocking work (filesystem calls, `mkfs`, copies) on tokio's blocking
/// pool. A panic in `f` becomes INTERNAL naming no secrets (the panic
/// message is logged, not sent), and a runtime shutting down UNAVAILABLE.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> CsiResult<T> + Send + 'static,
) -> CsiResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(panic = %what, "blocking driver work panicked");
            Err(CsiError::Internal(
                "internal error: blocking work panicked in the driver".into(),
            ))
        }
        Err(_) => Err(CsiError::Unavailable("the plugin is shutting down".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn blocking_maps_panics_and_passes_results() {
        assert_eq!(blocking(|| Ok(7)).await.unwrap(), 7);
        let err = blocking(|| -> CsiResult<()> { Err(CsiError::NotFound("v".into())) })
            .await
            .unwrap_err();
        assert_eq!(err, CsiError::NotFound("v".into()));
        let err = blocking(|| -> CsiResult<()> { panic!("secret-token") })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal);
        assert!(!err.to_string().contains("secret-token"));
    }

    #[test]
    fn node_id_prefers_the_explicit_one_and_fits_the_spec() {
        assert_eq!(node_id_or_hostname(Some("n1")), "n1");
        assert!(!node_id_or_hostname(None).is_empty());
        let long = "é".repeat(200);
        let id = node_id_or_hostname(Some(&long));
        assert!(id.len() <= MAX_NODE_ID);
        assert!(id.starts_with('é'));
    }
}
