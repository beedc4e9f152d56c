use std::sync::Arc;

use super::actual::ActualAttachState;
use super::desired::DesiredAttachState;
use super::plan::{AttachConfig, AttachOperation, plan};
use crate::pass::{ExecutionResult, PassCore, reconciler_over_pass_core};
use crate::plugin::VolumePlugin;
use crate::types::Key;

/// The attach/detach controller's reconciler: attaches volumes to the
/// nodes whose pods want them and detaches them once unused.
pub struct AttachReconciler<V: Key, P: Key, N: Key> {
    config: AttachConfig,
    desired: Arc<DesiredAttachState<V, P, N>>,
    actual: Arc<ActualAttachState<V, N>>,
    plugin: Arc<dyn VolumePlugin<V, N>>,
    core: PassCore<V, P, N>,
}

impl<V: Key, P: Key, N: Key> std::fmt::Debug for AttachReconciler<V, P, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachReconciler")
            .field("config", &self.config)
            .field("passes", &self.core.passes())
            .finish_non_exhaustive()
    }
}

reconciler_over_pass_core!(AttachReconciler, AttachOperation<V, N>);

impl<V: Key, P: Key, N: Key> AttachReconciler<V, P, N> {
    /// A controller with a default gate and the system clock.
    pub fn new(
        config: AttachConfig,
        desired: Arc<DesiredAttachState<V, P, N>>,
        actual: Arc<ActualAttachState<V, N>>,
        plugin: Arc<dyn VolumePlugin<V, N>>,
    ) -> Self {
        Self {
            config,
            desired,
            actual,
            plugin,
            core: PassCore::new(),
        }
    }

    /// Plans one pass over the current snapshots, first dropping gate
    /// records of volumes that left both states (and stale ones).
    pub fn plan(&self) -> Vec<AttachOperation<V, N>> {
        let desired = self.desired.snapshot();
        let actual = self.actual.snapshot();
        let (gate, now) = self
            .core
            .begin_pass(|v| actual.get(v).is_some() || desired.wants_anywhere(v));
        plan(&desired, &actual, &gate, now, &self.config)
    }

    /// Executes one operation through the gate and the plugin.
    pub async fn execute(&self, op: AttachOperation<V, N>) -> ExecutionResult {
        let key = op.gate_key::<P>();
        let now = self.core.clock.now();
        match op {
            AttachOperation::MarkDetachRequested { volume, node } => {
                self.actual.mark_detach_requested(&volume, &node, now);
                ExecutionResult::Applied
            }
            AttachOperation::ResetDetachRequest { volume, node } => {
                self.actual.reset_detach_request(&volume, &node);
                ExecutionResult::Applied
            }
            AttachOperation::Detach { volume, node, .. } => {
                let Some(key) = key else {
                    return ExecutionResult::Applied;
                };
                self.core
                    .gated(&key, async {
                        self.actual.remove_from_reported(&volume, &node);
                        let result = self.plugin.detach(&volume, &node).await;
                        self.actual.apply_detach(&volume, &node, &result);
                        result
                    })
                    .await
            }
            AttachOperation::Attach { volume, node, spec } => {
                let Some(key) = key else {
                    return ExecutionResult::Applied;
                };
                self.core
                    .gated(&key, async {
                        let result = self.plugin.attach(&volume, &node, &spec).await;
                        self.actual.apply_attach(&volume, &node, &spec, &result);
                        result.map(|_| ())
                    })
                    .await
            }
        }
    }
}
