use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::error::PluginError;
use crate::node::AttachState;
use crate::state_cell::StateCell;
use crate::transition::StepOutcome;
use crate::types::{AttachInfo, Key, VolumeSpec};

/// One volume's attachment to one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAttachment {
    /// Attached (confirmed), attach-uncertain or detach-uncertain.
    /// Detached attachments are removed.
    pub state: AttachState,
    /// The node reports the volume in use (mounted). New attachments start
    /// as mounted until the node says otherwise, to avoid early detach.
    pub mounted_by_node: bool,
    /// When the controller first wanted to detach; reset when wanted again.
    pub detach_requested_at: Option<Instant>,
    /// Listed in the node's "attached volumes" status.
    pub reported_as_attached: bool,
    /// What attach reported.
    pub info: Arc<AttachInfo>,
}

/// A volume and the nodes it is (maybe) attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachedVolume<N> {
    /// The spec it was attached with.
    pub spec: Arc<VolumeSpec>,
    /// Attachments per node.
    pub nodes: BTreeMap<N, NodeAttachment>,
}

/// What the controller knows about a node's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeHealth {
    /// The node is not ready.
    pub unhealthy: bool,
    /// The node is marked out of service (shut down): detach without waiting.
    pub out_of_service: bool,
}

/// An immutable view of the controller's actual state.
#[derive(Debug, Clone)]
pub struct ActualAttachSnapshot<V, N> {
    volumes: BTreeMap<V, Arc<AttachedVolume<N>>>,
    health: BTreeMap<N, NodeHealth>,
}

impl<V: Key, N: Key> ActualAttachSnapshot<V, N> {
    /// Volumes with at least one attachment, in key order.
    pub fn volumes(&self) -> impl Iterator<Item = (&V, &AttachedVolume<N>)> {
        self.volumes.iter().map(|(v, a)| (v, a.as_ref()))
    }

    /// One volume.
    pub fn get(&self, volume: &V) -> Option<&AttachedVolume<N>> {
        self.volumes.get(volume).map(Arc::as_ref)
    }

    /// One attachment.
    pub fn attachment(&self, volume: &V, node: &N) -> Option<&NodeAttachment> {
        self.get(volume)?.nodes.get(node)
    }

    /// A node's health (healthy and in service if unknown).
    pub fn health(&self, node: &N) -> NodeHealth {
        self.health.get(node).copied().unwrap_or_default()
    }

    /// Volumes reported as attached to `node` (its status `volumesAttached`).
    pub fn attached_as_reported(&self, node: &N) -> Vec<V> {
        self.volumes
            .iter()
            .filter(|(_, a)| a.nodes.get(node).is_some_and(|n| n.reported_as_attached))
            .map(|(v, _)| v.clone())
            .collect()
    }

    /// Nodes that hold `volume` or may still hold it after a failed
    /// detach: while there are any, a single-node volume is not attached
    /// elsewhere.
    pub fn holding_nodes(&self, volume: &V) -> Vec<N> {
        self.get(volume)
            .map(|a| {
                a.nodes
                    .iter()
                    .filter(|(_, n)| n.state.may_hold())
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Nodes where `volume` is confirmed attached.
    pub fn confirmed_nodes(&self, volume: &V) -> Vec<N> {
        self.get(volume)
            .map(|a| {
                a.nodes
                    .iter()
                    .filter(|(_, n)| n.state == AttachState::Attached)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether nothing is attached.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }
}

/// Which volumes are attached where (the attach/detach controller's actual
/// state of world), plus node health. Change it only through its updaters.
#[derive(Debug)]
pub struct ActualAttachState<V, N> {
    cell: StateCell<ActualAttachSnapshot<V, N>>,
}

impl<V: Key, N: Key> Default for ActualAttachState<V, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Key, N: Key> ActualAttachState<V, N> {
    /// An empty actual state.
    pub fn new() -> Self {
        Self {
            cell: StateCell::new(ActualAttachSnapshot {
                volumes: BTreeMap::new(),
                health: BTreeMap::new(),
            }),
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> Arc<ActualAttachSnapshot<V, N>> {
        self.cell.snapshot()
    }

    /// Signalled after every change.
    pub fn changed(&self) -> Arc<Notify> {
        self.cell.changed()
    }

    fn update<T>(&self, f: impl FnOnce(&mut ActualAttachSnapshot<V, N>) -> T) -> T {
        self.cell.update(|s| (f(s), true))
    }

    fn update_attachment(&self, volume: &V, node: &N, f: impl FnOnce(&mut NodeAttachment)) {
        self.update(|s| {
            if let Some(entry) = s.volumes.get_mut(volume)
                && entry.nodes.contains_key(node)
                && let Some(a) = Arc::make_mut(entry).nodes.get_mut(node)
            {
                f(a)
            }
        })
    }

    /// Applies an attach result.
    pub fn apply_attach(
        &self,
        volume: &V,
        node: &N,
        spec: &Arc<VolumeSpec>,
        result: &Result<AttachInfo, PluginError>,
    ) {
        self.update(|s| {
            let entry = Arc::make_mut(s.volumes.entry(volume.clone()).or_insert_with(|| {
                Arc::new(AttachedVolume {
                    spec: spec.clone(),
                    nodes: BTreeMap::new(),
                })
            }));
            let previous = entry
                .nodes
                .get(node)
                .map_or(AttachState::Detached, |a| a.state);
            let state = match previous.after_attach(StepOutcome::of(result)) {
                AttachState::Detached => {
                    entry.nodes.remove(node);
                    if entry.nodes.is_empty() {
                        s.volumes.remove(volume);
                    }
                    return;
                }
                state => state,
            };
            let attachment = entry
                .nodes
                .entry(node.clone())
                .or_insert_with(|| NodeAttachment {
                    state,
                    mounted_by_node: true,
                    detach_requested_at: None,
                    reported_as_attached: false,
                    info: Arc::default(),
                });
            attachment.state = state;
            if let Ok(info) = result {
                attachment.info = Arc::new(info.clone());
                attachment.reported_as_attached = true;
                entry.spec = spec.clone();
            }
        })
    }

    /// Applies a detach result: success forgets the attachment; failure of
    /// a confirmed attachment makes it [`AttachState::DetachUncertain`]
    /// (it keeps a single-node volume from attaching elsewhere), and the
    /// attachment is reported as attached again.
    pub fn apply_detach(&self, volume: &V, node: &N, result: &Result<(), PluginError>) {
        self.update(|s| {
            let Some(entry) = s.volumes.get_mut(volume) else {
                return;
            };
            let Some(previous) = entry.nodes.get(node).map(|a| a.state) else {
                return;
            };
            let entry_mut = Arc::make_mut(entry);
            match previous.after_detach(StepOutcome::of(result)) {
                AttachState::Detached => {
                    entry_mut.nodes.remove(node);
                    if entry_mut.nodes.is_empty() {
                        s.volumes.remove(volume);
                    }
                }
                state => {
                    if let Some(a) = entry_mut.nodes.get_mut(node) {
                        a.state = state;
                        a.reported_as_attached = true;
                    }
                }
            }
        })
    }

    /// Records the first time the controller wanted to detach.
    pub fn mark_detach_requested(&self, volume: &V, node: &N, at: Instant) {
        self.update_attachment(volume, node, |a| {
            a.detach_requested_at.get_or_insert(at);
        })
    }

    /// Clears the detach request (the volume is wanted again).
    pub fn reset_detach_request(&self, volume: &V, node: &N) {
        self.update_attachment(volume, node, |a| a.detach_requested_at = None)
    }

    /// Removes the attachment from the node's reported list before detaching.
    pub fn remove_from_reported(&self, volume: &V, node: &N) {
        self.update_attachment(volume, node, |a| a.reported_as_attached = false)
    }

    /// Sets `mounted_by_node` from the node's status: exactly the listed
    /// volumes are in use on `node`.
    pub fn set_volumes_in_use<'a>(&self, node: &N, in_use: impl IntoIterator<Item = &'a V>) {
        let in_use: std::collections::BTreeSet<&V> = in_use.into_iter().collect();
        self.update(|s| {
            for (volume, entry) in s.volumes.iter_mut() {
                let want = in_use.contains(volume);
                if entry
                    .nodes
                    .get(node)
                    .is_some_and(|a| a.mounted_by_node != want)
                    && let Some(a) = Arc::make_mut(entry).nodes.get_mut(node)
                {
                    a.mounted_by_node = want;
                }
            }
        })
    }

    /// Sets a node's health.
    pub fn set_node_health(&self, node: N, health: NodeHealth) {
        self.update(|s| {
            s.health.insert(node, health);
        })
    }
}
