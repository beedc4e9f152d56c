use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use tokio::sync::Notify;

use super::actual::ActualStateOfWorld;
use super::desired::DesiredStateOfWorld;
use super::plan::{ControllerConfig, Operation, plan};
use crate::clock::{Clock, SystemClock};
use crate::gate::OperationGate;
use crate::node::{ExecutionResult, PassReport};
use crate::plugin::VolumePlugin;
use crate::runner::Reconcile;
use crate::types::Key;

/// The attach/detach controller reconciler.
pub struct Reconciler<V: Key, P: Key, N: Key> {
    config: ControllerConfig,
    desired: Arc<DesiredStateOfWorld<V, P, N>>,
    actual: Arc<ActualStateOfWorld<V, N>>,
    gate: Arc<OperationGate<V, P, N>>,
    plugin: Arc<dyn VolumePlugin<V, N>>,
    clock: Arc<dyn Clock>,
    passes: AtomicU64,
}

impl<V: Key, P: Key, N: Key> std::fmt::Debug for Reconciler<V, P, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("controller::Reconciler")
            .field("config", &self.config)
            .field("passes", &self.passes)
            .finish_non_exhaustive()
    }
}

impl<V: Key, P: Key, N: Key> Reconciler<V, P, N> {
    /// A controller with a default gate and the system clock.
    pub fn new(
        config: ControllerConfig,
        desired: Arc<DesiredStateOfWorld<V, P, N>>,
        actual: Arc<ActualStateOfWorld<V, N>>,
        plugin: Arc<dyn VolumePlugin<V, N>>,
    ) -> Self {
        Self {
            config,
            desired,
            actual,
            gate: Arc::default(),
            plugin,
            clock: Arc::new(SystemClock),
            passes: AtomicU64::new(0),
        }
    }

    /// Uses `clock` for backoff and detach timeouts.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Uses `gate`.
    pub fn with_gate(mut self, gate: Arc<OperationGate<V, P, N>>) -> Self {
        self.gate = gate;
        self
    }

    /// The gate.
    pub fn gate(&self) -> &Arc<OperationGate<V, P, N>> {
        &self.gate
    }

    /// How many passes were planned so far.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Plans one pass over the current snapshots, first dropping gate
    /// records of volumes that left both states (and stale ones).
    pub fn plan(&self) -> Vec<Operation<V, N>> {
        self.passes.fetch_add(1, Ordering::Relaxed);
        let desired = self.desired.snapshot();
        let actual = self.actual.snapshot();
        let now = self.clock.now();
        let mut gate = self.gate.state();
        if !gate.is_empty() {
            gate.purge(now, |v| {
                actual.get(v).is_some() || desired.wants_anywhere(v)
            });
        }
        plan(&desired, &actual, &gate, now, &self.config)
    }

    /// Plans one pass and runs its operations to completion, concurrently.
    pub async fn run_pass(&self) -> PassReport {
        PassReport::run(self.plan(), |op| self.execute(op)).await
    }

    /// Runs passes until one plans nothing or `max_passes` ran.
    pub async fn run_until_idle(&self, max_passes: usize) -> usize {
        PassReport::until_idle(max_passes, || self.run_pass()).await
    }

    /// Executes one operation through the gate and the plugin.
    pub async fn execute(&self, op: Operation<V, N>) -> ExecutionResult {
        let key = op.gate_key::<P>();
        match op {
            Operation::MarkDetachRequested { volume, node } => {
                self.actual
                    .mark_detach_requested(&volume, &node, self.clock.now());
                ExecutionResult::Applied
            }
            Operation::ResetDetachRequest { volume, node } => {
                self.actual.reset_detach_request(&volume, &node);
                ExecutionResult::Applied
            }
            Operation::Detach { volume, node, .. } => {
                let Some(key) = key else {
                    return ExecutionResult::Applied;
                };
                if let Err(e) = self.gate.try_start(&key, self.clock.now()) {
                    return ExecutionResult::Skipped(e);
                }
                self.actual.remove_from_reported(&volume, &node);
                let result = self.plugin.detach(&volume, &node).await;
                self.actual.apply_detach(&volume, &node, &result);
                self.finish(&key, result)
            }
            Operation::Attach { volume, node, spec } => {
                let Some(key) = key else {
                    return ExecutionResult::Applied;
                };
                if let Err(e) = self.gate.try_start(&key, self.clock.now()) {
                    return ExecutionResult::Skipped(e);
                }
                let result = self.plugin.attach(&volume, &node, &spec).await;
                self.actual.apply_attach(&volume, &node, &spec, &result);
                self.finish(&key, result.map(|_| ()))
            }
        }
    }

    fn finish(
        &self,
        key: &crate::OperationKey<V, P, N>,
        result: Result<(), crate::PluginError>,
    ) -> ExecutionResult {
        self.gate.finish(
            key,
            result.as_ref().map_err(|e| e.message.clone()).copied(),
            self.clock.now(),
        );
        match result {
            Ok(()) => ExecutionResult::Succeeded,
            Err(e) => ExecutionResult::Failed(e),
        }
    }
}

impl<V: Key, P: Key, N: Key> Reconcile for Reconciler<V, P, N> {
    type Operation = Operation<V, N>;

    fn plan_pass(&self) -> Vec<Self::Operation> {
        self.plan()
    }

    fn execute_operation(self: Arc<Self>, op: Self::Operation) -> BoxFuture<'static, ()> {
        async move {
            self.execute(op).await;
        }
        .boxed()
    }

    fn change_signals(&self) -> [Arc<Notify>; 2] {
        [self.desired.changed(), self.actual.changed()]
    }

    fn next_retry_in(&self) -> Option<Duration> {
        let now = self.clock.now();
        self.gate
            .state()
            .next_retry_at(now)
            .map(|at| at.saturating_duration_since(now))
    }
}
