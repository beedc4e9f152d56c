use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::state_cell::StateCell;
use crate::types::{Key, VolumeSpec};

/// A volume wanted on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredAttachment<P> {
    /// How to attach it.
    pub spec: Arc<VolumeSpec>,
    /// Pods on the node that want it.
    pub pods: BTreeSet<P>,
}

/// An immutable view of the controller's desired state: node → volume → pods.
#[derive(Debug, Clone)]
pub struct DesiredAttachSnapshot<V, P, N> {
    nodes: BTreeMap<N, Arc<BTreeMap<V, DesiredAttachment<P>>>>,
}

impl<V: Key, P: Key, N: Key> DesiredAttachSnapshot<V, P, N> {
    /// Every (node, volume) pair wanted, in key order.
    pub fn attachments(&self) -> impl Iterator<Item = (&N, &V, &DesiredAttachment<P>)> {
        self.nodes
            .iter()
            .flat_map(|(n, vs)| vs.iter().map(move |(v, a)| (n, v, a)))
    }

    /// Whether `volume` is wanted on `node`.
    pub fn wants(&self, node: &N, volume: &V) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|vs| vs.contains_key(volume))
    }

    /// Whether `volume` is wanted on any node (O(nodes)).
    pub fn wants_anywhere(&self, volume: &V) -> bool {
        self.nodes.values().any(|vs| vs.contains_key(volume))
    }

    /// Number of (node, volume) pairs.
    pub fn len(&self) -> usize {
        self.nodes.values().map(|v| v.len()).sum()
    }

    /// Whether nothing is wanted.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// Which volumes each node's pods want (the attach/detach controller's
/// desired state of world). Thread-safe with copy-on-write snapshots.
#[derive(Debug)]
pub struct DesiredAttachState<V, P, N> {
    cell: StateCell<DesiredAttachSnapshot<V, P, N>>,
}

impl<V: Key, P: Key, N: Key> Default for DesiredAttachState<V, P, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Key, P: Key, N: Key> DesiredAttachState<V, P, N> {
    /// An empty desired state.
    pub fn new() -> Self {
        Self {
            cell: StateCell::new(DesiredAttachSnapshot {
                nodes: BTreeMap::new(),
            }),
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> Arc<DesiredAttachSnapshot<V, P, N>> {
        self.cell.snapshot()
    }

    /// Signalled after every change.
    pub fn changed(&self) -> Arc<Notify> {
        self.cell.changed()
    }

    fn update<T>(&self, f: impl FnOnce(&mut DesiredAttachSnapshot<V, P, N>) -> (T, bool)) -> T {
        self.cell.update(f)
    }

    /// Records that `pod` on `node` wants `volume`.
    pub fn add_pod(&self, node: N, volume: V, spec: impl Into<Arc<VolumeSpec>>, pod: P) {
        let spec = spec.into();
        self.update(|s| {
            let volumes = Arc::make_mut(s.nodes.entry(node).or_default());
            let entry = volumes.entry(volume).or_insert_with(|| DesiredAttachment {
                spec: spec.clone(),
                pods: BTreeSet::new(),
            });
            let mut changed = entry.pods.insert(pod);
            if entry.spec != spec {
                entry.spec = spec;
                changed = true;
            }
            ((), changed)
        })
    }

    /// Records that `pod` on `node` no longer wants `volume`; returns whether it did.
    pub fn remove_pod(&self, node: &N, volume: &V, pod: &P) -> bool {
        self.update(|s| {
            let Some(volumes) = s.nodes.get_mut(node) else {
                return (false, false);
            };
            if !volumes.get(volume).is_some_and(|a| a.pods.contains(pod)) {
                return (false, false);
            }
            let volumes_mut = Arc::make_mut(volumes);
            if let Some(a) = volumes_mut.get_mut(volume) {
                a.pods.remove(pod);
                if a.pods.is_empty() {
                    volumes_mut.remove(volume);
                }
            }
            if volumes_mut.is_empty() {
                s.nodes.remove(node);
            }
            (true, true)
        })
    }

    /// Drops everything wanted on `node` (e.g. the node object was deleted).
    pub fn remove_node(&self, node: &N) {
        self.update(|s| ((), s.nodes.remove(node).is_some()))
    }
}
