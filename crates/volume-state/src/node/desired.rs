use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::state_cell::StateCell;
use crate::types::{Key, VolumeSpec};

/// A volume some pods on this node want.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredVolume<P> {
    /// How to attach, stage and publish it.
    pub spec: Arc<VolumeSpec>,
    /// The pods wanting it and each one's target (publish) path.
    pub pods: BTreeMap<P, PathBuf>,
    /// The node reports the volume as in use (node status `volumesInUse`);
    /// verify-attached waits for this so the controller will not detach it.
    pub reported_in_use: bool,
}

/// An immutable view of the desired state of world.
#[derive(Debug, Clone)]
pub struct DesiredNodeSnapshot<V, P> {
    volumes: BTreeMap<V, Arc<DesiredVolume<P>>>,
    populated: bool,
}

impl<V: Key, P: Key> DesiredNodeSnapshot<V, P> {
    /// The wanted volumes, in key order.
    pub fn volumes(&self) -> impl Iterator<Item = (&V, &DesiredVolume<P>)> {
        self.volumes.iter().map(|(v, d)| (v, d.as_ref()))
    }

    /// One volume.
    pub fn get(&self, volume: &V) -> Option<&DesiredVolume<P>> {
        self.volumes.get(volume).map(Arc::as_ref)
    }

    /// Whether `pod` wants `volume`.
    pub fn wants(&self, volume: &V, pod: &P) -> bool {
        self.get(volume).is_some_and(|d| d.pods.contains_key(pod))
    }

    /// Whether the populator has added all existing pods at least once;
    /// until then nothing is torn down.
    pub fn is_populated(&self) -> bool {
        self.populated
    }

    /// Number of wanted volumes.
    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    /// Whether no volume is wanted.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }
}

/// Which volumes the pods on this node want (kubelet's desired state of world).
///
/// Thread-safe. Snapshots are `Arc`s: taking one is O(1) and the next write
/// copies only if a snapshot is still held (copy-on-write).
#[derive(Debug)]
pub struct DesiredNodeState<V, P> {
    cell: StateCell<DesiredNodeSnapshot<V, P>>,
}

impl<V: Key, P: Key> Default for DesiredNodeState<V, P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Key, P: Key> DesiredNodeState<V, P> {
    /// An empty, not yet populated desired state.
    pub fn new() -> Self {
        Self {
            cell: StateCell::new(DesiredNodeSnapshot {
                volumes: BTreeMap::new(),
                populated: false,
            }),
        }
    }

    /// The current state.
    pub fn snapshot(&self) -> Arc<DesiredNodeSnapshot<V, P>> {
        self.cell.snapshot()
    }

    /// Signalled after every change (used by the runner).
    pub fn changed(&self) -> Arc<Notify> {
        self.cell.changed()
    }

    fn update<T>(&self, f: impl FnOnce(&mut DesiredNodeSnapshot<V, P>) -> (T, bool)) -> T {
        self.cell.update(f)
    }

    /// Records that `pod` wants `volume` published at `target_path`. A changed
    /// spec (e.g. a larger desired size) replaces the stored one.
    pub fn add_pod(
        &self,
        volume: V,
        spec: impl Into<Arc<VolumeSpec>>,
        pod: P,
        target_path: PathBuf,
    ) {
        let spec = spec.into();
        self.update(|s| {
            let entry = s.volumes.entry(volume).or_insert_with(|| {
                Arc::new(DesiredVolume {
                    spec: spec.clone(),
                    pods: BTreeMap::new(),
                    reported_in_use: false,
                })
            });
            let unchanged = entry.spec == spec && entry.pods.get(&pod) == Some(&target_path);
            if unchanged {
                return ((), false);
            }
            let entry = Arc::make_mut(entry);
            if entry.spec != spec {
                entry.spec = spec;
            }
            entry.pods.insert(pod, target_path);
            ((), true)
        })
    }

    /// Records that `pod` no longer wants `volume`; returns whether it did.
    /// The volume is dropped when no pod wants it.
    pub fn remove_pod(&self, volume: &V, pod: &P) -> bool {
        self.update(|s| {
            let Some(entry) = s.volumes.get_mut(volume) else {
                return (false, false);
            };
            if !entry.pods.contains_key(pod) {
                return (false, false);
            }
            Arc::make_mut(entry).pods.remove(pod);
            if entry.pods.is_empty() {
                s.volumes.remove(volume);
            }
            (true, true)
        })
    }

    /// Sets the reported-in-use flag of exactly the given volumes and clears
    /// it on all others (kubelet's `MarkVolumesAsReportedInUse`).
    pub fn mark_volumes_reported_in_use<'a>(&self, in_use: impl IntoIterator<Item = &'a V>) {
        let in_use: std::collections::BTreeSet<&V> = in_use.into_iter().collect();
        self.update(|s| {
            let mut changed = false;
            for (volume, entry) in s.volumes.iter_mut() {
                let want = in_use.contains(volume);
                if entry.reported_in_use != want {
                    Arc::make_mut(entry).reported_in_use = want;
                    changed = true;
                }
            }
            ((), changed)
        })
    }

    /// Marks the desired state as fully populated, allowing tear-down.
    pub fn mark_populated(&self) {
        self.update(|s| {
            let changed = !s.populated;
            s.populated = true;
            ((), changed)
        })
    }
}
