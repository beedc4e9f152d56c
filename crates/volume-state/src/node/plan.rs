use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::actual::{ActualNodeSnapshot, AttachState, DeviceState, PodMountState};
use super::desired::DesiredNodeSnapshot;
use super::reconstruct::DiscoveredMount;
use crate::gate::{GateState, OperationKey};
use crate::types::{AttachInfo, Key, OperationKind, VolumeSpec};

/// Who attaches volumes to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttachMode {
    /// The attach/detach controller attaches; the node only verifies
    /// (after reporting the volume in use) and forgets on detach.
    #[default]
    ByController,
    /// The node attaches and detaches itself.
    ByNode,
}

/// The fixed order of a pass; [`plan`] emits operations sorted by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Unpublish pods no longer wanted.
    Unpublish,
    /// Attach or verify attachments.
    Attach,
    /// Stage devices.
    Stage,
    /// Publish (and expand) for wanted pods.
    Publish,
    /// Unstage devices no longer used.
    Unstage,
    /// Detach or forget volumes, clean orphans.
    Detach,
}

/// One step the node reconciler decided to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOperation<V, P> {
    /// Unpublish `volume` from `pod`'s target path.
    Unpublish {
        /// The volume.
        volume: V,
        /// The pod.
        pod: P,
        /// Its target path.
        target_path: PathBuf,
    },
    /// Record a volume that needs no attach as attached (no plugin call).
    MarkAttached {
        /// The volume.
        volume: V,
        /// Its spec.
        spec: Arc<VolumeSpec>,
    },
    /// Attach the volume to this node.
    Attach {
        /// The volume.
        volume: V,
        /// Its spec.
        spec: Arc<VolumeSpec>,
    },
    /// Wait for the controller's attachment.
    VerifyAttached {
        /// The volume.
        volume: V,
        /// Its spec.
        spec: Arc<VolumeSpec>,
    },
    /// Stage the device.
    Stage {
        /// The volume.
        volume: V,
        /// Its spec.
        spec: Arc<VolumeSpec>,
        /// Where to stage.
        staging_path: PathBuf,
        /// What attach reported.
        attach: Arc<AttachInfo>,
    },
    /// Publish for a pod (also a remount of a mounted one).
    Publish {
        /// The volume.
        volume: V,
        /// The pod.
        pod: P,
        /// Its spec.
        spec: Arc<VolumeSpec>,
        /// The pod's target path.
        target_path: PathBuf,
        /// Where the device is staged, if it is.
        staging_path: Option<PathBuf>,
        /// What attach reported.
        attach: Arc<AttachInfo>,
    },
    /// Expand the filesystem to the desired size.
    Expand {
        /// The volume.
        volume: V,
        /// Its spec.
        spec: Arc<VolumeSpec>,
        /// A path where it is published.
        volume_path: PathBuf,
        /// Where it is staged, if it is.
        staging_path: Option<PathBuf>,
        /// Desired size in bytes.
        new_size: u64,
    },
    /// Unstage a device no longer used (also an uncertain one).
    Unstage {
        /// The volume.
        volume: V,
        /// The staging path.
        staging_path: PathBuf,
    },
    /// Detach the volume from this node.
    Detach {
        /// The volume.
        volume: V,
    },
    /// Forget the volume without a plugin call.
    MarkDetached {
        /// The volume.
        volume: V,
    },
    /// Unmount a discovered mount that has no metadata (once).
    CleanupOrphan {
        /// The mount (boxed: rare, and large next to the other variants).
        mount: Box<DiscoveredMount<V, P>>,
    },
    /// Drop an orphan record because its pod is wanted again; the normal
    /// publish path takes over.
    ForgetOrphan {
        /// The volume.
        volume: V,
        /// The pod.
        pod: P,
    },
}

impl<V: Key, P: Key> NodeOperation<V, P> {
    /// The phase this operation belongs to.
    pub fn phase(&self) -> Phase {
        match self {
            NodeOperation::Unpublish { .. } => Phase::Unpublish,
            NodeOperation::MarkAttached { .. }
            | NodeOperation::Attach { .. }
            | NodeOperation::VerifyAttached { .. } => Phase::Attach,
            NodeOperation::Stage { .. } => Phase::Stage,
            NodeOperation::Publish { .. } | NodeOperation::Expand { .. } => Phase::Publish,
            NodeOperation::Unstage { .. } => Phase::Unstage,
            NodeOperation::Detach { .. }
            | NodeOperation::MarkDetached { .. }
            | NodeOperation::CleanupOrphan { .. }
            | NodeOperation::ForgetOrphan { .. } => Phase::Detach,
        }
    }

    /// The volume concerned.
    pub fn volume(&self) -> &V {
        match self {
            NodeOperation::Unpublish { volume, .. }
            | NodeOperation::MarkAttached { volume, .. }
            | NodeOperation::Attach { volume, .. }
            | NodeOperation::VerifyAttached { volume, .. }
            | NodeOperation::Stage { volume, .. }
            | NodeOperation::Publish { volume, .. }
            | NodeOperation::Expand { volume, .. }
            | NodeOperation::Unstage { volume, .. }
            | NodeOperation::Detach { volume }
            | NodeOperation::MarkDetached { volume }
            | NodeOperation::ForgetOrphan { volume, .. } => volume,
            NodeOperation::CleanupOrphan { mount } => &mount.volume,
        }
    }

    /// The gate key, or `None` for pure bookkeeping that calls no plugin.
    ///
    /// Volume-wide steps (attach, stage, unstage, detach, expand) use
    /// volume-level keys so they exclude each other and all per-pod work.
    pub fn gate_key<N>(&self) -> Option<OperationKey<V, P, N>> {
        let (volume, pod, operation) = match self {
            NodeOperation::Unpublish { volume, pod, .. } => {
                (volume, Some(pod), OperationKind::Unpublish)
            }
            NodeOperation::Attach { volume, .. } => (volume, None, OperationKind::Attach),
            NodeOperation::VerifyAttached { volume, .. } => {
                (volume, None, OperationKind::VerifyAttached)
            }
            NodeOperation::Stage { volume, .. } => (volume, None, OperationKind::Stage),
            NodeOperation::Publish { volume, pod, .. } => {
                (volume, Some(pod), OperationKind::Publish)
            }
            NodeOperation::Expand { volume, .. } => (volume, None, OperationKind::Expand),
            NodeOperation::Unstage { volume, .. } => (volume, None, OperationKind::Unstage),
            NodeOperation::Detach { volume } => (volume, None, OperationKind::Detach),
            NodeOperation::CleanupOrphan { mount } => (
                &mount.volume,
                Some(&mount.pod),
                OperationKind::CleanupOrphan,
            ),
            NodeOperation::MarkAttached { .. }
            | NodeOperation::MarkDetached { .. }
            | NodeOperation::ForgetOrphan { .. } => return None,
        };
        Some(OperationKey {
            volume: volume.clone(),
            pod: pod.cloned(),
            node: None,
            operation,
        })
    }
}

/// Advances a cursor over a sorted map to `key`; returns its value if present.
fn seek<'a, K: Ord + 'a, T: 'a>(
    cursor: &mut std::iter::Peekable<impl Iterator<Item = (&'a K, &'a T)>>,
    key: &K,
) -> Option<&'a T> {
    while cursor.next_if(|(k, _)| *k < key).is_some() {}
    cursor.next_if(|(k, _)| *k == key).map(|(_, v)| v)
}

/// The volumes this node must report as in use (node status
/// `volumesInUse`) so the attach/detach controller neither detaches them
/// nor keeps the node waiting: every desired volume, plus every volume
/// still (or maybe still) staged or published here, including
/// reconstructed ones and orphans not yet cleaned. Sorted, no duplicates.
///
/// In [`AttachMode::ByController`], report this list, then pass it to
/// [`DesiredNodeState::mark_volumes_reported_in_use`](super::DesiredNodeState::mark_volumes_reported_in_use)
/// once the report is stored (kubelet's order), so verify-attached can
/// proceed.
pub fn volumes_in_use<V: Key, P: Key>(
    desired: &DesiredNodeSnapshot<V, P>,
    actual: &ActualNodeSnapshot<V, P>,
) -> Vec<V> {
    let mounted = actual
        .volumes()
        .filter(|(_, a)| a.device != DeviceState::NotMounted || !a.pods.is_empty())
        .map(|(v, _)| v);
    let mut out: Vec<V> = desired
        .volumes()
        .map(|(v, _)| v)
        .chain(mounted)
        .chain(actual.orphans().map(|m| &m.volume))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// One reconcile pass: compares desired and actual state and returns the
/// operations to run, in [`Phase`] order. Pure: reads only its arguments.
///
/// Operations that could not start (something nested pending, or inside the
/// backoff window) are left out; a volume advances at most one step per pass.
pub fn plan<V: Key, P: Key, N: Key>(
    desired: &DesiredNodeSnapshot<V, P>,
    actual: &ActualNodeSnapshot<V, P>,
    gate: &GateState<V, P, N>,
    now: Instant,
    mode: AttachMode,
) -> Vec<NodeOperation<V, P>> {
    let free = |volume: &V, pod: Option<&P>, op: OperationKind| {
        gate.can_start_parts(volume, pod, None, op, now)
    };
    let mut unpublish = Vec::new();
    let mut attach = Vec::new();
    let mut stage = Vec::new();
    let mut publish = Vec::new();
    let mut unstage = Vec::new();
    let mut detach = Vec::new();

    // Both maps are sorted by volume: walk them together instead of a
    // tree lookup per volume.
    let mut actual_cursor = actual.volumes().peekable();
    for (volume, wanted) in desired.volumes() {
        let have = seek(&mut actual_cursor, volume);
        let attached = have.is_some_and(|a| a.attach == AttachState::Attached);
        let Some(have) = have.filter(|_| attached) else {
            let spec = wanted.spec.clone();
            if !wanted.spec.attachable {
                attach.push(NodeOperation::MarkAttached {
                    volume: volume.clone(),
                    spec,
                });
            } else {
                match mode {
                    AttachMode::ByNode if free(volume, None, OperationKind::Attach) => {
                        attach.push(NodeOperation::Attach {
                            volume: volume.clone(),
                            spec,
                        })
                    }
                    // The controller must see the volume in use before the
                    // node relies on the attachment.
                    AttachMode::ByController
                        if wanted.reported_in_use
                            && free(volume, None, OperationKind::VerifyAttached) =>
                    {
                        attach.push(NodeOperation::VerifyAttached {
                            volume: volume.clone(),
                            spec,
                        })
                    }
                    _ => {}
                }
            }
            continue;
        };

        let staging_path = match (&wanted.spec.staging_path, &have.device) {
            (None, _) => None,
            (Some(_), DeviceState::Mounted { staging_path, .. }) => Some(staging_path.clone()),
            (Some(path), _) => {
                if free(volume, None, OperationKind::Stage) {
                    stage.push(NodeOperation::Stage {
                        volume: volume.clone(),
                        spec: wanted.spec.clone(),
                        staging_path: path.clone(),
                        attach: have.attach_info.clone(),
                    });
                }
                continue;
            }
        };

        for (pod, target_path) in &wanted.pods {
            let needed = have
                .pods
                .get(pod)
                .is_none_or(|m| m.state != PodMountState::Mounted || m.remount_required);
            if needed && free(volume, Some(pod), OperationKind::Publish) {
                publish.push(NodeOperation::Publish {
                    volume: volume.clone(),
                    pod: pod.clone(),
                    spec: wanted.spec.clone(),
                    target_path: target_path.clone(),
                    staging_path: staging_path.clone(),
                    attach: have.attach_info.clone(),
                });
            }
        }

        if let (Some(want), Some(size)) = (wanted.spec.desired_size, have.size)
            && want > size
            && let Some(mount) = have
                .pods
                .values()
                .find(|m| m.state == PodMountState::Mounted)
            && free(volume, None, OperationKind::Expand)
        {
            publish.push(NodeOperation::Expand {
                volume: volume.clone(),
                spec: wanted.spec.clone(),
                volume_path: mount.target_path.clone(),
                staging_path,
                new_size: want,
            });
        }
    }

    // Tear-down waits for a populated desired state, so volumes
    // reconstructed after a restart are not unmounted before their pods
    // are known.
    if desired.is_populated() {
        let mut desired_cursor = desired.volumes().peekable();
        for (volume, have) in actual.volumes() {
            let wanted = seek(&mut desired_cursor, volume);
            for (pod, mount) in &have.pods {
                let pod_wanted = wanted.is_some_and(|w| w.pods.contains_key(pod));
                if !pod_wanted && free(volume, Some(pod), OperationKind::Unpublish) {
                    unpublish.push(NodeOperation::Unpublish {
                        volume: volume.clone(),
                        pod: pod.clone(),
                        target_path: mount.target_path.clone(),
                    });
                }
            }
            if wanted.is_some() || !have.pods.is_empty() {
                continue;
            }
            let staging_path = match &have.device {
                DeviceState::Mounted { staging_path, .. } => Some(staging_path.clone()),
                DeviceState::Uncertain => have
                    .staging_path
                    .clone()
                    .or_else(|| have.spec.staging_path.clone()),
                DeviceState::NotMounted => None,
            };
            if let Some(staging_path) = staging_path {
                if free(volume, None, OperationKind::Unstage) {
                    unstage.push(NodeOperation::Unstage {
                        volume: volume.clone(),
                        staging_path,
                    });
                }
                continue;
            }
            // Never forget or detach while anything on the volume runs.
            if gate.is_pending(volume, None, None) {
                continue;
            }
            let needs_detach = mode == AttachMode::ByNode
                && have.spec.attachable
                && have.attach != AttachState::Detached;
            if !needs_detach {
                detach.push(NodeOperation::MarkDetached {
                    volume: volume.clone(),
                });
            } else if free(volume, None, OperationKind::Detach) {
                detach.push(NodeOperation::Detach {
                    volume: volume.clone(),
                });
            }
        }
        for mount in actual.orphans() {
            if desired.wants(&mount.volume, &mount.pod) {
                detach.push(NodeOperation::ForgetOrphan {
                    volume: mount.volume.clone(),
                    pod: mount.pod.clone(),
                });
            } else if free(
                &mount.volume,
                Some(&mount.pod),
                OperationKind::CleanupOrphan,
            ) {
                detach.push(NodeOperation::CleanupOrphan {
                    mount: Box::new(mount.clone()),
                });
            }
        }
    }

    let mut out = unpublish;
    out.extend(attach);
    out.extend(stage);
    out.extend(publish);
    out.extend(unstage);
    out.extend(detach);
    out
}
