//! What every driver's `main` and methods otherwise write themselves.

use std::io::IsTerminal;

use crate::driver::CsiResult;
use crate::error::CsiError;
use crate::validate::MAX_NODE_ID;

/// Logs to stderr with `RUST_LOG` as the filter, or `default_filter`
/// (e.g. `"info"`, `"my_driver=debug,info"`) when it is unset; colours only
/// on a terminal. Secrets never reach the log: requests are logged through
/// csi-proto's redacting `Debug`. Does nothing if a subscriber is already
/// installed.
pub fn init_tracing(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// `explicit` when given, else this machine's hostname (what kubelet
/// registers the node as by default), else `localhost`. Truncated to the
/// spec's 256 bytes at a character boundary.
pub fn node_id_or_hostname(explicit: Option<&str>) -> String {
    let mut id = explicit
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
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

/// A job for a [`BlockingRunner`].
pub type BlockingJob = Box<dyn FnOnce() + Send + 'static>;

/// Starts blocking work on some thread: the seam [`blocking_on`] runs work
/// through, so a test can make starting fail without exhausting real
/// threads.
pub trait BlockingRunner: Send + Sync + std::fmt::Debug + 'static {
    /// Starts `job`, or says why it cannot start. On `Err` the job must
    /// not have run and must never run.
    fn start(&self, job: BlockingJob) -> Result<(), String>;
}

/// tokio's blocking pool. tokio panics ("OS can't spawn worker thread")
/// when it needs a thread and the OS refuses one, as in a pids-limited
/// container; that panic becomes an `Err` here.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioBlocking;

impl BlockingRunner for TokioBlocking {
    fn start(&self, job: BlockingJob) -> Result<(), String> {
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(tokio::task::spawn_blocking(job));
        }));
        started.map_err(|payload| {
            payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "the runtime refused blocking work".to_owned())
        })
    }
}

/// Runs blocking work (filesystem calls, `mkfs`, copies) on tokio's blocking
/// pool: [`blocking_on`] with [`TokioBlocking`].
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> CsiResult<T> + Send + 'static,
) -> CsiResult<T> {
    blocking_on(&TokioBlocking, f).await
}

/// Runs blocking work through `runner`. A panic in `f` becomes INTERNAL
/// naming no secrets (the panic message is logged, not sent), and a runtime
/// shutting down UNAVAILABLE. When the work cannot start (no thread) the
/// answer is RESOURCE_EXHAUSTED and `f` is dropped at once, so whatever it
/// holds (claims, reservations) is released before the call returns and a
/// retry can run.
pub async fn blocking_on<T: Send + 'static>(
    runner: &dyn BlockingRunner,
    f: impl FnOnce() -> CsiResult<T> + Send + 'static,
) -> CsiResult<T> {
    type Slot<F> = std::sync::Arc<std::sync::Mutex<Option<F>>>;
    fn take<F>(slot: &Slot<F>) -> Option<F> {
        slot.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
    let slot: Slot<_> = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = {
        let slot = slot.clone();
        Box::new(move || {
            if let Some(f) = take(&slot) {
                let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
            }
        })
    };
    if let Err(why) = runner.start(job) {
        drop(take(&slot));
        tracing::error!(reason = %why, "blocking driver work could not start");
        return Err(CsiError::ResourceExhausted(
            "the plugin cannot start a worker thread now (the process or container may be at its thread or pid limit); retry later".into(),
        ));
    }
    match rx.await {
        Ok(Ok(result)) => result,
        Ok(Err(payload)) => {
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

/// A [`BlockingRunner`] whose next starts fail (then it runs jobs on
/// tokio's pool): the fault of a process at its thread limit.
#[cfg(feature = "testing")]
#[derive(Debug, Default)]
pub struct FakeBlockingRunner {
    failures: std::sync::atomic::AtomicUsize,
}

#[cfg(feature = "testing")]
impl FakeBlockingRunner {
    /// A runner whose next `n` starts fail.
    pub fn failing(n: usize) -> Self {
        Self {
            failures: std::sync::atomic::AtomicUsize::new(n),
        }
    }
}

#[cfg(feature = "testing")]
impl BlockingRunner for FakeBlockingRunner {
    fn start(&self, job: BlockingJob) -> Result<(), String> {
        use std::sync::atomic::Ordering;
        let failed = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        match failed {
            Ok(_) => Err("Resource temporarily unavailable (os error 11)".into()),
            Err(_) => TokioBlocking.start(job),
        }
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

    #[derive(Debug)]
    struct Refusing;

    impl BlockingRunner for Refusing {
        fn start(&self, _: BlockingJob) -> Result<(), String> {
            Err("os error 11".into())
        }
    }

    #[tokio::test]
    async fn work_that_cannot_start_is_resource_exhausted_and_dropped_at_once() {
        let held = std::sync::Arc::new(());
        let inside = held.clone();
        let err = blocking_on(&Refusing, move || {
            drop(inside);
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.to_string().contains("thread"), "{err}");
        assert_eq!(
            std::sync::Arc::strong_count(&held),
            1,
            "the work was dropped"
        );
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
