//! Per-resource locking: one operation at a time per volume id, name,
//! snapshot id or node path, including the source of a snapshot or clone
//! (the keys come from the method table, see
//! [`RpcRequest::lock_keys`](csi_proto::methods::RpcRequest::lock_keys)). A
//! second call gets ABORTED at once, or after waiting up to a configured
//! time.
//!
//! The lock covers the work, not the request: the call below the layer runs
//! in a task of its own that owns the lock guard. When the client gives up
//! (deadline, cancellation) the work still finishes under the lock in the
//! background, and a retry meanwhile gets ABORTED instead of running a
//! second copy of the work concurrently. Guards are RAII, so keys are
//! released on success, error and panic, and a released key leaves no entry
//! behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::TryFutureExt;
use futures::future::Either;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::Layer;
use tracing::Instrument;

use super::CsiCall;
use super::wrap::{Wrap, WrapFuture, WrapInner, Wrapped};
use crate::error::CsiError;
use crate::request::{CsiRequest, LockKey};

/// The set of resources currently operated on.
#[derive(Debug, Default)]
pub struct LockMap {
    held: Mutex<HashMap<LockKey, Arc<Notify>>>,
    /// Signalled whenever keys are released.
    released: Notify,
}

/// Holds keys of a [`LockMap`] until dropped.
#[derive(Debug)]
pub struct LockGuard {
    map: Arc<LockMap>,
    keys: Vec<LockKey>,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let mut held = self.map.held();
        for key in &self.keys {
            if let Some(notify) = held.remove(key) {
                notify.notify_waiters();
            }
        }
        drop(held);
        self.map.released.notify_waiters();
    }
}

impl LockMap {
    /// An empty map.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// How many keys are held (0 when no call is in flight).
    pub fn len(&self) -> usize {
        self.held().len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until no key is held (every operation, including those whose
    /// caller went away, has finished).
    pub async fn idle(&self) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if self.is_empty() {
                return;
            }
            released.await;
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<LockKey, Arc<Notify>>> {
        // The map is consistent after every statement, so poison is harmless.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes every key or none: `Err` names a held key and its notifier.
    fn try_acquire(
        self: &Arc<Self>,
        keys: &[LockKey],
    ) -> Result<LockGuard, (LockKey, Arc<Notify>)> {
        let mut held = self.held();
        if let Some(busy) = keys.iter().find(|k| held.contains_key(*k)) {
            return Err((busy.clone(), held[busy].clone()));
        }
        for key in keys {
            held.insert(key.clone(), Arc::new(Notify::new()));
        }
        Ok(LockGuard {
            map: self.clone(),
            keys: keys.to_vec(),
        })
    }

    /// Locks all `keys`, waiting up to `wait` for busy ones (zero: fail at
    /// once). Fails with ABORTED naming the busy resource.
    pub async fn lock(
        self: &Arc<Self>,
        mut keys: Vec<LockKey>,
        wait: Duration,
    ) -> Result<LockGuard, CsiError> {
        keys.sort();
        keys.dedup();
        let deadline = Instant::now() + wait;
        loop {
            let (busy, notify) = match self.try_acquire(&keys) {
                Ok(guard) => return Ok(guard),
                Err(busy) => busy,
            };
            if wait.is_zero() || Instant::now() >= deadline {
                return Err(in_progress(&busy));
            }
            let notified = notify.notified();
            tokio::pin!(notified);
            // Register before re-checking, so a release in between is not missed.
            notified.as_mut().enable();
            if !self.held().contains_key(&busy) {
                continue;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(in_progress(&busy));
            }
        }
    }
}

fn in_progress(key: &LockKey) -> CsiError {
    CsiError::Aborted(format!("an operation for {key} is already in progress"))
}

/// Locks a call's resources for the whole of its work.
#[derive(Debug, Clone)]
pub struct LockingLayer {
    map: Arc<LockMap>,
    wait: Duration,
}

impl LockingLayer {
    /// Fails a conflicting call at once with ABORTED.
    pub fn new() -> Self {
        Self::with_map(LockMap::new(), Duration::ZERO)
    }

    /// Uses a given map (to inspect it in tests) and wait time.
    pub fn with_map(map: Arc<LockMap>, wait: Duration) -> Self {
        Self { map, wait }
    }

    /// Waits up to `wait` for a busy resource before ABORTED.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The lock map.
    pub fn map(&self) -> &Arc<LockMap> {
        &self.map
    }
}

impl Default for LockingLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for LockingLayer {
    type Service = Locking<S>;

    fn layer(&self, inner: S) -> Locking<S> {
        Wrapped::new(self.clone(), inner, true)
    }
}

/// The service of [`LockingLayer`].
pub type Locking<S> = Wrapped<LockingLayer, S>;

/// The service below is cloned into the task that owns the work, so it
/// must be `Clone + Send + 'static`.
impl<S: Clone + Send + 'static> Wrap<S> for LockingLayer {
    fn around<Req: CsiRequest>(&self, inner: &mut S, call: CsiCall<Req>) -> WrapFuture<S, Req>
    where
        S: WrapInner<Req>,
    {
        let keys = call.request.lock_keys();
        if keys.is_empty() {
            return Either::Left(inner.call(call).err_into());
        }
        // Take the service that was driven ready; leave a clone in its place.
        let clone = inner.clone();
        let mut inner = std::mem::replace(inner, clone);
        let map = self.map.clone();
        let wait = self.wait;
        Either::Right(Box::pin(async move {
            let guard = map.lock(keys, wait).await?;
            // The task owns the guard: dropping this future (the client went
            // away) leaves the work running, and its resources locked, until
            // it ends.
            let work = tokio::spawn(
                async move {
                    let result = inner.call(call).await;
                    drop(guard);
                    result.map_err(Into::into)
                }
                .in_current_span(),
            );
            match work.await {
                Ok(result) => result,
                // Re-raised so the panic layer reports it like any other.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Err(CsiError::Unavailable("the plugin is shutting down".into())),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::KeyKind;

    fn key(v: &str) -> LockKey {
        LockKey::new(KeyKind::Volume, v)
    }

    #[tokio::test]
    async fn conflicting_keys_abort_and_release_on_drop() {
        let map = LockMap::new();
        let g = map
            .lock(vec![key("a"), key("b")], Duration::ZERO)
            .await
            .unwrap();
        let err = map.lock(vec![key("b")], Duration::ZERO).await.unwrap_err();
        assert_eq!(
            err,
            CsiError::Aborted("an operation for volume \"b\" is already in progress".into())
        );
        let other = map.lock(vec![key("c")], Duration::ZERO).await.unwrap();
        assert_eq!(map.len(), 3);
        drop(g);
        drop(other);
        assert!(map.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_gets_the_lock_when_it_is_released() {
        let map = LockMap::new();
        let g = map.lock(vec![key("a")], Duration::ZERO).await.unwrap();
        let m2 = map.clone();
        let waiter = tokio::spawn(async move {
            m2.lock(vec![key("a")], Duration::from_secs(60))
                .await
                .map(drop)
        });
        tokio::task::yield_now().await;
        drop(g);
        waiter.await.unwrap().unwrap();
        assert!(map.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_gives_up_after_its_wait() {
        let map = LockMap::new();
        let _g = map.lock(vec![key("a")], Duration::ZERO).await.unwrap();
        let err = map
            .lock(vec![key("a")], Duration::from_millis(10))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted);
        assert_eq!(map.len(), 1);
    }
}
