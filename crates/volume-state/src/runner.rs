//! The event-driven runner: a pass when the desired or actual state changes
//! or an operation finishes, when a backoff window ends, and every resync
//! period; never a tight poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// A reconciler the [`Runner`] can drive.
pub trait Reconcile: Send + Sync + 'static {
    /// What a pass plans.
    type Operation: Send + 'static;

    /// Plans one pass.
    fn plan_pass(&self) -> Vec<Self::Operation>;

    /// Runs one operation to completion.
    fn execute_operation(self: Arc<Self>, op: Self::Operation) -> BoxFuture<'static, ()>;

    /// Notified on every change of the desired and the actual state.
    fn change_signals(&self) -> [Arc<Notify>; 2];

    /// Time until the earliest backoff window ends, if any.
    fn next_retry_in(&self) -> Option<Duration>;
}

/// Runner timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// A pass runs at least this often even without events, to catch
    /// changes nobody signalled.
    pub resync_period: Duration,
    /// Minimum time between passes, so a burst of completions is handled in
    /// one pass.
    pub min_pass_interval: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            resync_period: Duration::from_secs(60),
            min_pass_interval: Duration::from_millis(10),
        }
    }
}

/// Drives a [`Reconcile`] on the tokio runtime; operations run as tasks.
#[derive(Debug)]
pub struct Runner {
    task: JoinHandle<()>,
    stop: Arc<Notify>,
    passes: Arc<AtomicU64>,
}

impl Runner {
    /// Starts the loop; the first pass runs at once.
    pub fn spawn<R: Reconcile>(reconciler: Arc<R>, config: RunnerConfig) -> Self {
        let stop = Arc::new(Notify::new());
        let passes = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run_loop(reconciler, config, stop.clone(), passes.clone()));
        Self { task, stop, passes }
    }

    /// Passes run so far.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Stops the loop (running operations finish on their own) and waits for it.
    pub async fn shutdown(self) {
        self.stop.notify_one();
        // A cancelled or panicked loop has nothing left to clean up.
        let _ = self.task.await;
    }
}

async fn run_loop<R: Reconcile>(
    reconciler: Arc<R>,
    config: RunnerConfig,
    stop: Arc<Notify>,
    passes: Arc<AtomicU64>,
) {
    let finished = Arc::new(Notify::new());
    let [desired_changed, actual_changed] = reconciler.change_signals();
    loop {
        passes.fetch_add(1, Ordering::Relaxed);
        for op in reconciler.plan_pass() {
            let task = reconciler.clone().execute_operation(op);
            let finished = finished.clone();
            tokio::spawn(async move {
                task.await;
                finished.notify_one();
            });
        }
        let wait = reconciler
            .next_retry_in()
            .map_or(config.resync_period, |d| d.min(config.resync_period));
        tokio::select! {
            _ = stop.notified() => return,
            _ = finished.notified() => {}
            _ = desired_changed.notified() => {}
            _ = actual_changed.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::select! {
            _ = stop.notified() => return,
            _ = tokio::time::sleep(config.min_pass_interval) => {}
        }
    }
}
