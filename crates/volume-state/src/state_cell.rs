//! The cell every desired and actual state keeps its snapshot in.

use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

/// A snapshot behind a lock, replaced copy-on-write (readers keep the
/// `Arc` they got), with a signal the runner waits on.
#[derive(Debug)]
pub(crate) struct StateCell<S> {
    state: RwLock<Arc<S>>,
    changed: Arc<Notify>,
}

impl<S: Clone> StateCell<S> {
    pub(crate) fn new(initial: S) -> Self {
        Self {
            state: RwLock::new(Arc::new(initial)),
            changed: Arc::new(Notify::new()),
        }
    }

    pub(crate) fn snapshot(&self) -> Arc<S> {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// Applies `f`, which says whether it changed anything; a change is
    /// signalled once the lock is released.
    pub(crate) fn update<T>(&self, f: impl FnOnce(&mut S) -> (T, bool)) -> T {
        let mut guard = self.state.write().unwrap_or_else(|e| e.into_inner());
        let (out, changed) = f(Arc::make_mut(&mut guard));
        drop(guard);
        if changed {
            self.changed.notify_one();
        }
        out
    }
}
