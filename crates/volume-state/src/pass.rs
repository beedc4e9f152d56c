//! What the node and the attach reconcilers share: running a pass, the
//! gate and clock around each plugin call, and the [`Reconcile`] glue the
//! [`Runner`](crate::Runner) drives them through.

use std::future::Future;
use std::sync::Arc;
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::join_all;

use crate::clock::{Clock, SystemClock};
use crate::error::{GateError, PluginError};
use crate::gate::{GateState, OperationGate, OperationKey};
use crate::types::Key;

/// What happened to one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutionResult {
    /// Bookkeeping applied to the actual state; no plugin call.
    Applied,
    /// Not started: the gate refused.
    Skipped(GateError),
    /// The plugin call succeeded.
    Succeeded,
    /// The plugin call failed.
    Failed(PluginError),
}

/// Summary of one pass (`run_pass` of either reconciler).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Operations planned.
    pub planned: usize,
    /// Plugin calls that failed.
    pub failed: usize,
    /// Operations the gate refused.
    pub skipped: usize,
}

impl PassReport {
    /// Runs `operations` concurrently to completion and tallies them.
    pub(crate) async fn run<O, F>(operations: Vec<O>, execute: impl Fn(O) -> F) -> Self
    where
        F: Future<Output = ExecutionResult>,
    {
        let mut report = PassReport {
            planned: operations.len(),
            ..PassReport::default()
        };
        for result in join_all(operations.into_iter().map(execute)).await {
            match result {
                ExecutionResult::Failed(_) => report.failed += 1,
                ExecutionResult::Skipped(_) => report.skipped += 1,
                ExecutionResult::Applied | ExecutionResult::Succeeded => {}
            }
        }
        report
    }

    /// Runs passes until one plans nothing or `max_passes` ran; returns how
    /// many passes planned work.
    pub(crate) async fn until_idle<F>(max_passes: usize, mut pass: impl FnMut() -> F) -> usize
    where
        F: Future<Output = PassReport>,
    {
        for n in 0..max_passes {
            if pass().await.planned == 0 {
                return n;
            }
        }
        max_passes
    }
}

/// The gate, the clock and the pass count of a reconciler.
pub(crate) struct PassCore<V: Key, P: Key, N: Key> {
    pub(crate) gate: Arc<OperationGate<V, P, N>>,
    pub(crate) clock: Arc<dyn Clock>,
    passes: AtomicU64,
}

impl<V: Key, P: Key, N: Key> PassCore<V, P, N> {
    /// A default gate and the system clock.
    pub(crate) fn new() -> Self {
        Self {
            gate: Arc::default(),
            clock: Arc::new(SystemClock),
            passes: AtomicU64::new(0),
        }
    }

    pub(crate) fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Counts a pass; returns the gate's state, without the records of
    /// volumes `keep` no longer knows (nor stale ones), and the time.
    pub(crate) fn begin_pass(
        &self,
        keep: impl FnMut(&V) -> bool,
    ) -> (MutexGuard<'_, GateState<V, P, N>>, Instant) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let mut gate = self.gate.state();
        if !gate.is_empty() {
            gate.purge(now, keep);
        }
        (gate, now)
    }

    /// Runs `call` if the gate lets `key` start, and records its result
    /// there (a failure starts the key's backoff).
    pub(crate) async fn gated(
        &self,
        key: &OperationKey<V, P, N>,
        call: impl Future<Output = Result<(), PluginError>>,
    ) -> ExecutionResult {
        if let Err(e) = self.gate.try_start(key, self.clock.now()) {
            return ExecutionResult::Skipped(e);
        }
        let result = call.await;
        self.gate.finish(
            key,
            result.as_ref().map_err(|e| e.message.clone()).copied(),
            self.clock.now(),
        );
        match result {
            Ok(()) => ExecutionResult::Succeeded,
            Err(e) => {
                tracing::debug!(?key, error = %e, "volume operation failed");
                ExecutionResult::Failed(e)
            }
        }
    }

    /// Time until the earliest backoff window ends, if any.
    pub(crate) fn next_retry_in(&self) -> Option<Duration> {
        let now = self.clock.now();
        self.gate
            .state()
            .next_retry_at(now)
            .map(|at| at.saturating_duration_since(now))
    }
}

/// The methods both reconcilers have, over their `core: PassCore`,
/// `desired` and `actual` (each with `changed()`), `plan()` and
/// `execute()`; and their [`Reconcile`](crate::Reconcile) impl.
macro_rules! reconciler_over_pass_core {
    ($reconciler:ident, $operation:ty) => {
        impl<V: Key, P: Key, N: Key> $reconciler<V, P, N> {
            /// Uses `clock` for backoff decisions (and the attach
            /// reconciler's detach timeouts).
            pub fn with_clock(mut self, clock: Arc<dyn crate::Clock>) -> Self {
                self.core.clock = clock;
                self
            }

            /// Uses `gate` (e.g. with a custom backoff).
            pub fn with_gate(mut self, gate: Arc<crate::OperationGate<V, P, N>>) -> Self {
                self.core.gate = gate;
                self
            }

            /// The gate.
            pub fn gate(&self) -> &Arc<crate::OperationGate<V, P, N>> {
                &self.core.gate
            }

            /// How many passes were planned so far.
            pub fn passes(&self) -> u64 {
                self.core.passes()
            }

            /// Plans one pass and runs its operations to completion,
            /// concurrently.
            pub async fn run_pass(&self) -> crate::PassReport {
                crate::PassReport::run(self.plan(), |op| self.execute(op)).await
            }

            /// Runs passes until one plans nothing or `max_passes` ran;
            /// returns the number of passes that planned work.
            pub async fn run_until_idle(&self, max_passes: usize) -> usize {
                crate::PassReport::until_idle(max_passes, || self.run_pass()).await
            }
        }

        impl<V: Key, P: Key, N: Key> crate::Reconcile for $reconciler<V, P, N> {
            type Operation = $operation;

            fn plan_pass(&self) -> Vec<Self::Operation> {
                self.plan()
            }

            fn execute_operation(
                self: Arc<Self>,
                op: Self::Operation,
            ) -> futures::future::BoxFuture<'static, ()> {
                futures::FutureExt::boxed(async move {
                    self.execute(op).await;
                })
            }

            fn change_signals(&self) -> [Arc<tokio::sync::Notify>; 2] {
                [self.desired.changed(), self.actual.changed()]
            }

            fn next_retry_in(&self) -> Option<std::time::Duration> {
                self.core.next_retry_in()
            }
        }
    };
}

pub(crate) use reconciler_over_pass_core;
