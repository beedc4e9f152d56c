//! Waiting on a provider within a call's deadline: transient errors
//! retried with backoff (a Retry-After honoured), and polling until what
//! the provider is making is ready. Every wait goes through the
//! [`Clock`], so tests and simulations spend no real time.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_driver::clock::Clock;
use csi_driver::{CallContext, CsiError, CsiResult};

use crate::config::RetryPolicy;
use crate::error::{BackendError, BackendResult};

/// When a call stops trying, and how it waits until then.
#[derive(Debug, Clone)]
pub struct Deadline {
    clock: Arc<dyn Clock>,
    at: Instant,
    policy: RetryPolicy,
}

impl Deadline {
    /// The call's deadline, or `policy.budget` from now when it has none.
    pub fn of(ctx: &CallContext, clock: Arc<dyn Clock>, policy: RetryPolicy) -> Self {
        let at = ctx
            .deadline()
            .unwrap_or_else(|| clock.now() + policy.budget);
        Self { clock, at, policy }
    }

    /// A deadline `after` from now.
    pub fn after(after: Duration, clock: Arc<dyn Clock>, policy: RetryPolicy) -> Self {
        let at = clock.now() + after;
        Self { clock, at, policy }
    }

    /// What is left of it.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(self.clock.now())
    }

    /// Runs `op`, retrying it after transient errors with backoff (at
    /// least the Retry-After a provider gave) while the deadline allows;
    /// any other error, or the last transient one, is returned.
    pub async fn retry<T, F, Fut>(&self, mut op: F) -> BackendResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = BackendResult<T>>,
    {
        let mut backoff = self.policy.initial;
        loop {
            match op().await {
                Err(BackendError::Transient {
                    message,
                    retry_after,
                }) => {
                    let wait = retry_after.map_or(backoff, |r| r.max(backoff));
                    if wait > self.remaining() {
                        return Err(BackendError::Transient {
                            message,
                            retry_after,
                        });
                    }
                    tracing::debug!(wait_ms = wait.as_millis() as u64, error = %message, "transient provider error; retrying");
                    self.clock.sleep(wait).await;
                    backoff = (backoff * 2).min(self.policy.max);
                }
                other => return other,
            }
        }
    }

    /// Polls `poll` (transient errors retried) until it answers
    /// `Some`, with backoff; DEADLINE_EXCEEDED naming `what` when the
    /// deadline comes first (the CO's retry finds and resumes it).
    pub async fn wait_until_ready<T, F, Fut>(&self, what: &str, mut poll: F) -> CsiResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = BackendResult<Option<T>>>,
    {
        let mut backoff = self.policy.initial;
        loop {
            if let Some(ready) = self.retry(&mut poll).await? {
                return Ok(ready);
            }
            let wait = backoff.min(self.remaining());
            if wait.is_zero() {
                return Err(CsiError::DeadlineExceeded(format!(
                    "{what} is not ready yet; a retry resumes waiting for it"
                )));
            }
            self.clock.sleep(wait).await;
            backoff = (backoff * 2).min(self.policy.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_driver::clock::FakeClock;
    use std::cell::Cell;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            budget: Duration::from_secs(10),
        }
    }

    #[tokio::test]
    async fn backoff_doubles_to_its_cap_and_stops_at_the_deadline() {
        let clock = Arc::new(FakeClock::new());
        let d = Deadline::after(Duration::from_secs(3), clock.clone(), policy());
        let calls = Cell::new(0);
        let err = d
            .retry(|| {
                calls.set(calls.get() + 1);
                async { Err::<(), _>(BackendError::transient("503")) }
            })
            .await
            .unwrap_err();
        assert!(err.is_transient());
        let ms: Vec<u128> = clock.sleeps().iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000]);
        assert_eq!(calls.get(), 6);
        assert!(clock.elapsed() <= Duration::from_secs(3));
    }

    #[tokio::test]
    async fn polling_ends_in_deadline_exceeded_naming_what() {
        let clock = Arc::new(FakeClock::new());
        let d = Deadline::after(Duration::from_secs(2), clock.clone(), policy());
        let err = d
            .wait_until_ready("volume v", || async { Ok::<Option<()>, _>(None) })
            .await
            .unwrap_err();
        assert_eq!(err.code(), csi_driver::Code::DeadlineExceeded);
        assert!(err.to_string().contains("volume v"));
        assert_eq!(clock.elapsed(), Duration::from_secs(2));
    }
}
