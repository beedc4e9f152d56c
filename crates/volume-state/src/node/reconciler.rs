use std::sync::Arc;

use super::actual::{ActualNodeSnapshot, ActualNodeState, AttachState, DeviceState, PodMountState};
use super::desired::DesiredNodeState;
use super::plan::{AttachMode, NodeOperation, plan, volumes_in_use};
use crate::error::{GateError, PluginError};
use crate::journal::{Journal, PublishIntent, VolumeIntent};
use crate::mounts::{MountIdentity, MountTable};
use crate::pass::{ExecutionResult, PassCore, reconciler_over_pass_core};
use crate::plugin::{ExpandRequest, PublishRequest, StageRequest, VolumePlugin};
use crate::types::{AttachInfo, Key, VolumeSpec};

/// The node-mode reconciler: plans passes over the desired and actual state
/// and executes the operations through the gate and the plugin.
///
/// With a [journal](Self::with_journal) it records every intent durably
/// before acting, so a restart loses no tear-down; with a
/// [mount table](Self::with_mount_table) it also records what each stage
/// and publish mounted, so reconstruction can tell this volume's mounts
/// from anything else at the same paths.
pub struct NodeReconciler<V: Key, P: Key, N: Key> {
    node: N,
    mode: AttachMode,
    desired: Arc<DesiredNodeState<V, P>>,
    actual: Arc<ActualNodeState<V, P>>,
    plugin: Arc<dyn VolumePlugin<V, N>>,
    journal: Option<Arc<Journal<V, P>>>,
    mounts: Option<Arc<dyn MountTable>>,
    core: PassCore<V, P, N>,
}

impl<V: Key, P: Key, N: Key> std::fmt::Debug for NodeReconciler<V, P, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeReconciler")
            .field("node", &self.node)
            .field("mode", &self.mode)
            .field("passes", &self.core.passes())
            .finish_non_exhaustive()
    }
}

reconciler_over_pass_core!(NodeReconciler, NodeOperation<V, P>);

impl<V: Key, P: Key, N: Key> NodeReconciler<V, P, N> {
    /// A reconciler for `node` with a default gate and the system clock.
    pub fn new(
        node: N,
        mode: AttachMode,
        desired: Arc<DesiredNodeState<V, P>>,
        actual: Arc<ActualNodeState<V, P>>,
        plugin: Arc<dyn VolumePlugin<V, N>>,
    ) -> Self {
        Self {
            node,
            mode,
            desired,
            actual,
            plugin,
            journal: None,
            mounts: None,
            core: PassCore::new(),
        }
    }

    /// Records intents in `journal` (see [`crate::journal`]).
    pub fn with_journal(mut self, journal: Arc<Journal<V, P>>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Looks up what each successful stage and publish mounted, for the
    /// journal.
    pub fn with_mount_table(mut self, mounts: Arc<dyn MountTable>) -> Self {
        self.mounts = Some(mounts);
        self
    }

    /// The desired state.
    pub fn desired(&self) -> &Arc<DesiredNodeState<V, P>> {
        &self.desired
    }

    /// The actual state.
    pub fn actual(&self) -> &Arc<ActualNodeState<V, P>> {
        &self.actual
    }

    /// Snapshot of the actual state.
    pub fn actual_snapshot(&self) -> Arc<ActualNodeSnapshot<V, P>> {
        self.actual.snapshot()
    }

    /// Plans one pass over the current snapshots, first dropping gate
    /// records of volumes that left both states (and stale ones).
    pub fn plan(&self) -> Vec<NodeOperation<V, P>> {
        let desired = self.desired.snapshot();
        let actual = self.actual.snapshot();
        let (gate, now) = self.core.begin_pass(|v| {
            desired.get(v).is_some() || actual.get(v).is_some() || actual.has_orphan(v)
        });
        plan(&desired, &actual, &gate, now, self.mode)
    }

    /// The volumes to report in use now; see [`volumes_in_use`].
    pub fn volumes_in_use(&self) -> Vec<V> {
        volumes_in_use(&self.desired.snapshot(), &self.actual.snapshot())
    }

    /// Executes one operation: takes the gate, calls the plugin and applies
    /// the result to the actual state through its updaters.
    pub async fn execute(&self, op: NodeOperation<V, P>) -> ExecutionResult {
        let op = match op {
            NodeOperation::MarkAttached { volume, spec } => {
                self.actual.mark_attached(&volume, &spec);
                return ExecutionResult::Applied;
            }
            NodeOperation::MarkDetached { volume } => {
                // Re-checked here: something may have started since planning.
                if self.core.gate.is_pending(&volume, None, None) {
                    return ExecutionResult::Skipped(GateError::AlreadyExists);
                }
                self.actual.mark_detached(&volume);
                self.record(&volume, |r| {
                    r.attached = false;
                    r.attach_info = None;
                })
                .await;
                return ExecutionResult::Applied;
            }
            NodeOperation::ForgetOrphan { volume, pod } => {
                self.actual.forget_orphan(&volume, &pod);
                return ExecutionResult::Applied;
            }
            op => op,
        };
        let Some(key) = op.gate_key::<N>() else {
            return ExecutionResult::Applied;
        };
        self.core
            .gated(&key, async {
                if self.journal.is_some() {
                    // Boxed: the journal's futures would otherwise enlarge every
                    // operation's future (10k of them per pass), journal or not.
                    Box::pin(self.call_journaled(op)).await
                } else {
                    self.call_plugin(op).await
                }
            })
            .await
    }

    async fn call_plugin(&self, op: NodeOperation<V, P>) -> Result<(), PluginError> {
        let plugin = &self.plugin;
        let actual = &self.actual;
        match op {
            NodeOperation::Attach { volume, spec } => {
                let result = plugin.attach(&volume, &self.node, &spec).await;
                actual.apply_attach(&volume, &spec, &result);
                result.map(|_| ())
            }
            NodeOperation::VerifyAttached { volume, spec } => {
                let result = plugin.wait_for_attach(&volume, &self.node, &spec).await;
                actual.apply_attach(&volume, &spec, &result);
                result.map(|_| ())
            }
            NodeOperation::Detach { volume } => {
                let result = plugin.detach(&volume, &self.node).await;
                actual.apply_detach(&volume, &result);
                result
            }
            NodeOperation::Stage {
                volume,
                spec,
                staging_path,
                attach,
            } => {
                let request = StageRequest {
                    volume,
                    spec,
                    staging_path,
                    attach,
                };
                let result = plugin.stage(&request).await;
                actual.apply_stage(&request.volume, &request.staging_path, &result);
                result.map(|_| ())
            }
            NodeOperation::Unstage {
                volume,
                staging_path,
            } => {
                let result = plugin.unstage(&volume, &staging_path).await;
                actual.apply_unstage(&volume, &result);
                result
            }
            NodeOperation::Publish {
                volume,
                pod,
                spec,
                target_path,
                staging_path,
                attach,
            } => {
                let request = PublishRequest {
                    volume,
                    spec,
                    target_path,
                    staging_path,
                    attach,
                };
                let result = plugin.publish(&request).await;
                actual.apply_publish(&request.volume, &pod, &request.target_path, &result);
                result.map(|_| ())
            }
            NodeOperation::Unpublish {
                volume,
                pod,
                target_path,
            } => {
                let result = plugin.unpublish(&volume, &target_path).await;
                actual.apply_unpublish(&volume, &pod, &result);
                result
            }
            NodeOperation::Expand {
                volume,
                spec,
                volume_path,
                staging_path,
                new_size,
            } => {
                let request = ExpandRequest {
                    volume,
                    spec,
                    volume_path,
                    staging_path,
                    new_size,
                };
                let result = plugin.expand(&request).await;
                actual.apply_expand(&request.volume, &result);
                result.map(|_| ())
            }
            NodeOperation::CleanupOrphan { mount } => {
                let mut result = plugin.unpublish(&mount.volume, &mount.target_path).await;
                let volume_in_use = actual.snapshot().get(&mount.volume).is_some()
                    || self.desired.snapshot().get(&mount.volume).is_some();
                if result.is_ok()
                    && !volume_in_use
                    && let Some(staging_path) = &mount.staging_path
                {
                    result = plugin.unstage(&mount.volume, staging_path).await;
                }
                if let Err(e) = &result {
                    tracing::warn!(volume = ?mount.volume, error = %e, "orphan cleanup failed; not retried");
                }
                // Orphans are cleaned once, whatever the result.
                actual.forget_orphan(&mount.volume, &mount.pod);
                Ok(())
            }
            NodeOperation::MarkAttached { .. }
            | NodeOperation::MarkDetached { .. }
            | NodeOperation::ForgetOrphan { .. } => Ok(()),
        }
    }
}

// Journal upkeep. An intent is written before the step and cleared only
// once the actual state shows the step undone, so the journal may claim
// more than is there (a redundant, idempotent tear-down after a restart)
// but never less. Each step touches only its own fields: concurrent
// publishes of one volume keep each other's intents.
impl<V: Key, P: Key, N: Key> NodeReconciler<V, P, N> {
    /// Writes the intent of `op`, runs it, records the outcome.
    async fn call_journaled(&self, op: NodeOperation<V, P>) -> Result<(), PluginError> {
        self.record_intent(&op).await?;
        let step = JournalStep::of(&op);
        let result = self.call_plugin(op).await;
        match step {
            JournalStep::Attach(volume) => self.record_attach(&volume).await,
            JournalStep::Device(volume, path) => {
                let source = path.and_then(|p| self.source_after(&result, &p));
                self.record_device(&volume, source).await
            }
            JournalStep::Pod(volume, pod, path) => {
                let source = path.and_then(|p| self.source_after(&result, &p));
                self.record_pod(&volume, &pod, source).await
            }
            JournalStep::Size(volume) => self.record_size(&volume).await,
            JournalStep::Nothing => {}
        }
        result
    }

    /// Writes the intent of `op` before it runs; failing that, `op` does
    /// not run.
    async fn record_intent(&self, op: &NodeOperation<V, P>) -> Result<(), PluginError> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        // The attach info rides along: in controller-attach mode nothing
        // else would keep it (the node owes no detach).
        let keep_info = |r: &mut VolumeIntent<P>, info: &AttachInfo| {
            if *info != AttachInfo::default() {
                r.attach_info = Some(info.clone());
            }
        };
        // A first set-up is at the wanted size; a later one (the record
        // already has a size) must not claim an expansion not yet made.
        let keep_size = |r: &mut VolumeIntent<P>, spec: &VolumeSpec| {
            if r.size.is_none() {
                r.size = spec.desired_size;
            }
        };
        let written = match op {
            NodeOperation::Attach { volume, .. } => {
                journal.update(volume, |r| r.attached = true).await
            }
            NodeOperation::Stage {
                volume,
                spec,
                staging_path,
                attach,
            } => {
                journal
                    .update(volume, |r| {
                        r.staging_path = Some(staging_path.clone());
                        r.staged = None;
                        keep_info(r, attach);
                        keep_size(r, spec);
                    })
                    .await
            }
            NodeOperation::Publish {
                volume,
                pod,
                spec,
                target_path,
                attach,
                ..
            } => {
                journal
                    .update(volume, |r| {
                        keep_size(r, spec);
                        let record = r.pods.entry(pod.clone()).or_insert(PublishIntent {
                            target_path: target_path.clone(),
                            source: None,
                        });
                        if record.target_path != *target_path {
                            record.target_path = target_path.clone();
                            record.source = None;
                        }
                        keep_info(r, attach);
                    })
                    .await
            }
            _ => Ok(()),
        };
        written.map_err(|e| PluginError::transient(format!("journal: {e}")))
    }

    /// What a successful stage or publish mounted at `path`, if a mount
    /// table is configured.
    fn source_after<T, E>(
        &self,
        result: &Result<T, E>,
        path: &std::path::Path,
    ) -> Option<MountIdentity> {
        let table = self.mounts.as_ref().filter(|_| result.is_ok())?;
        table
            .source_at(path)
            .inspect_err(
                |e| tracing::warn!(path = %path.display(), error = %e, "mount table lookup failed"),
            )
            .ok()
            .flatten()
    }

    /// Applies `change` to the journal record; a failure only leaves the
    /// record claiming more than is there, so it is logged.
    async fn record(&self, volume: &V, change: impl FnOnce(&mut VolumeIntent<P>)) {
        // Boxed: this is also awaited outside `call_journaled`.
        if let Some(journal) = &self.journal
            && let Err(e) = Box::pin(journal.update(volume, change)).await
        {
            tracing::warn!(?volume, error = %e, "journal update failed");
        }
    }

    /// After attach, verify-attached or detach: keeps what the actual
    /// state says (attached or not, and the attach info once confirmed).
    async fn record_attach(&self, volume: &V) {
        let (state, info) = match self.actual.snapshot().get(volume) {
            Some(a) => (a.attach, Some(a.attach_info.clone())),
            None => (AttachState::Detached, None),
        };
        self.record(volume, |r| {
            r.attached &= state != AttachState::Detached;
            match (state, info) {
                (AttachState::Attached, Some(info)) => r.attach_info = Some((*info).clone()),
                (AttachState::Detached, _) => r.attach_info = None,
                _ => {}
            }
        })
        .await
    }

    /// After an expansion: the size the actual state now has (the old one
    /// if it failed, so a restart expands again).
    async fn record_size(&self, volume: &V) {
        let size = self.actual.snapshot().get(volume).and_then(|a| a.size);
        if size.is_some() {
            self.record(volume, |r| r.size = size).await
        }
    }

    /// After stage or unstage; `source` is what a successful stage mounted.
    async fn record_device(&self, volume: &V, source: Option<MountIdentity>) {
        let (device, size) = match self.actual.snapshot().get(volume) {
            Some(a) => (Some(a.device.clone()), a.size),
            None => (None, None),
        };
        self.record(volume, |r| {
            if size.is_some() {
                r.size = size;
            }
            match device {
                None | Some(DeviceState::NotMounted) => {
                    r.staging_path = None;
                    r.staged = None;
                }
                Some(DeviceState::Uncertain) => r.staged = None,
                Some(DeviceState::Mounted { staging_path, .. }) => {
                    r.staging_path = Some(staging_path);
                    if source.is_some() {
                        r.staged = source;
                    }
                }
            }
        })
        .await
    }

    /// After publish or unpublish for `pod`; `source` is what a successful
    /// publish mounted.
    async fn record_pod(&self, volume: &V, pod: &P, source: Option<MountIdentity>) {
        let actual = self.actual.snapshot();
        let state = actual.pod_mount(volume, pod).map(|m| m.state);
        let size = actual.get(volume).and_then(|a| a.size);
        self.record(volume, |r| {
            if size.is_some() && state.is_some() {
                r.size = size;
            }
            match state {
                None => {
                    r.pods.remove(pod);
                }
                Some(state) => {
                    if let Some(record) = r.pods.get_mut(pod) {
                        if state == PodMountState::Uncertain {
                            record.source = None;
                        } else if source.is_some() {
                            record.source = source;
                        }
                    }
                }
            }
        })
        .await
    }
}

/// Which part of the journal record an operation's outcome updates, and
/// for a set-up step the path to look up what it mounted.
enum JournalStep<V, P> {
    Attach(V),
    Device(V, Option<std::path::PathBuf>),
    Pod(V, P, Option<std::path::PathBuf>),
    Size(V),
    Nothing,
}

impl<V: Key, P: Key> JournalStep<V, P> {
    fn of(op: &NodeOperation<V, P>) -> Self {
        match op {
            NodeOperation::Attach { volume, .. }
            | NodeOperation::VerifyAttached { volume, .. }
            | NodeOperation::Detach { volume } => JournalStep::Attach(volume.clone()),
            NodeOperation::Stage {
                volume,
                staging_path,
                ..
            } => JournalStep::Device(volume.clone(), Some(staging_path.clone())),
            NodeOperation::Unstage { volume, .. } => JournalStep::Device(volume.clone(), None),
            NodeOperation::Publish {
                volume,
                pod,
                target_path,
                ..
            } => JournalStep::Pod(volume.clone(), pod.clone(), Some(target_path.clone())),
            NodeOperation::Unpublish { volume, pod, .. } => {
                JournalStep::Pod(volume.clone(), pod.clone(), None)
            }
            NodeOperation::Expand { volume, .. } => JournalStep::Size(volume.clone()),
            _ => JournalStep::Nothing,
        }
    }
}
