use std::sync::Arc;
use std::time::{Duration, Instant};

use super::actual::{ActualAttachSnapshot, NodeAttachment, NodeHealth};
use super::desired::DesiredAttachSnapshot;
use crate::gate::{GateState, OperationKey};
use crate::node::AttachState;
use crate::types::{Key, NodeAccess, OperationKind, VolumeSpec};

/// Controller settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachConfig {
    /// Detach a volume the node still reports in use once the node has been
    /// unhealthy and the detach pending this long; `None` never forces
    /// (Kubernetes: 6 min, `disable-force-detach-on-timeout`).
    pub max_wait_for_unmount: Option<Duration>,
    /// Attach a single-node volume while a failed detach elsewhere leaves
    /// it maybe still attached there, as Kubernetes does (its multi-attach
    /// check counts only confirmed attachments). Default `false`: wait for
    /// the detach to succeed. Only for storage that fences a volume to one
    /// node by itself.
    pub attach_while_detach_uncertain: bool,
}

impl Default for AttachConfig {
    fn default() -> Self {
        Self {
            max_wait_for_unmount: Some(Duration::from_secs(360)),
            attach_while_detach_uncertain: false,
        }
    }
}

/// One step the controller decided to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachOperation<V, N> {
    /// Remember when detaching was first wanted (bookkeeping).
    MarkDetachRequested {
        /// The volume.
        volume: V,
        /// The node.
        node: N,
    },
    /// The volume is wanted again: forget the detach request (bookkeeping).
    ResetDetachRequest {
        /// The volume.
        volume: V,
        /// The node.
        node: N,
    },
    /// Detach `volume` from `node`.
    Detach {
        /// The volume.
        volume: V,
        /// The node.
        node: N,
        /// Single- or multi-node (decides the gate key).
        access_mode: NodeAccess,
        /// The node still reported the volume in use (unhealthy past the
        /// max wait, or out of service).
        forced: bool,
    },
    /// Attach `volume` to `node`.
    Attach {
        /// The volume.
        volume: V,
        /// The node.
        node: N,
        /// Its spec.
        spec: Arc<VolumeSpec>,
    },
}

impl<V: Key, N: Key> AttachOperation<V, N> {
    /// The gate key, or `None` for bookkeeping.
    ///
    /// Like Kubernetes, single-node volumes use volume-level keys so attach
    /// and detach on different nodes exclude each other; multi-node volumes
    /// use node keys.
    pub fn gate_key<P>(&self) -> Option<OperationKey<V, P, N>> {
        let (volume, node, mode, operation) = match self {
            AttachOperation::Detach {
                volume,
                node,
                access_mode,
                ..
            } => (volume, node, *access_mode, OperationKind::Detach),
            AttachOperation::Attach { volume, node, spec } => {
                (volume, node, spec.access_mode, OperationKind::Attach)
            }
            AttachOperation::MarkDetachRequested { .. }
            | AttachOperation::ResetDetachRequest { .. } => {
                return None;
            }
        };
        Some(key(volume, node, mode, operation))
    }
}

fn key<V: Clone, P, N: Clone>(
    volume: &V,
    node: &N,
    mode: NodeAccess,
    operation: OperationKind,
) -> OperationKey<V, P, N> {
    OperationKey {
        volume: volume.clone(),
        pod: None,
        node: match mode {
            NodeAccess::SingleNode => None,
            NodeAccess::MultiNode => Some(node.clone()),
        },
        operation,
    }
}

/// Whether an attachment nobody wants may be detached now (pure).
///
/// Returns `Some(forced)` to detach, `None` to keep waiting for the node to
/// stop reporting the volume in use. Forced means the node still reports it:
/// allowed when the node is out of service, or unhealthy with the detach
/// requested longer than `max_wait` ago.
pub fn detach_decision(
    attachment: &NodeAttachment,
    health: NodeHealth,
    now: Instant,
    max_wait: Option<Duration>,
) -> Option<bool> {
    if !attachment.mounted_by_node {
        return Some(false);
    }
    if health.out_of_service {
        return Some(true);
    }
    let waited = attachment
        .detach_requested_at
        .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
    let timed_out = max_wait.is_some_and(|max| waited > max);
    (health.unhealthy && timed_out).then_some(true)
}

/// One controller pass: detaches first, then attaches. Pure.
pub fn plan<V: Key, P: Key, N: Key>(
    desired: &DesiredAttachSnapshot<V, P, N>,
    actual: &ActualAttachSnapshot<V, N>,
    gate: &GateState<V, P, N>,
    now: Instant,
    config: &AttachConfig,
) -> Vec<AttachOperation<V, N>> {
    let mut out = Vec::new();
    for (volume, attached) in actual.volumes() {
        let mode = attached.spec.access_mode;
        for (node, attachment) in &attached.nodes {
            if desired.wants(node, volume) {
                continue;
            }
            // Never detach while anything on this volume/node runs.
            let node_part = (mode == NodeAccess::MultiNode).then_some(node);
            if gate.is_pending(volume, None, node_part) {
                continue;
            }
            if attachment.detach_requested_at.is_none() {
                out.push(AttachOperation::MarkDetachRequested {
                    volume: volume.clone(),
                    node: node.clone(),
                });
            }
            let Some(forced) = detach_decision(
                attachment,
                actual.health(node),
                now,
                config.max_wait_for_unmount,
            ) else {
                continue;
            };
            if gate.can_start_parts(volume, None, node_part, OperationKind::Detach, now) {
                out.push(AttachOperation::Detach {
                    volume: volume.clone(),
                    node: node.clone(),
                    access_mode: mode,
                    forced,
                });
            }
        }
    }
    for (node, volume, wanted) in desired.attachments() {
        let existing = actual.attachment(volume, node);
        if let Some(a) = existing
            && a.state == AttachState::Attached
        {
            if a.detach_requested_at.is_some() {
                out.push(AttachOperation::ResetDetachRequest {
                    volume: volume.clone(),
                    node: node.clone(),
                });
            }
            continue;
        }
        let mode = wanted.spec.access_mode;
        // Confirmed attachments elsewhere block, and so do failed detaches
        // (maybe still attached there); an uncertain attach does not: it
        // was never confirmed, nothing there relies on it, and it is
        // detached in this same pass if unwanted.
        let blocks = |state: AttachState| {
            state == AttachState::Attached
                || (state == AttachState::DetachUncertain && !config.attach_while_detach_uncertain)
        };
        if mode == NodeAccess::SingleNode
            && actual
                .get(volume)
                .is_some_and(|a| a.nodes.iter().any(|(n, at)| n != node && blocks(at.state)))
        {
            continue;
        }
        let node_part = (mode == NodeAccess::MultiNode).then_some(node);
        if gate.can_start_parts(volume, None, node_part, OperationKind::Attach, now) {
            out.push(AttachOperation::Attach {
                volume: volume.clone(),
                node: node.clone(),
                spec: wanted.spec.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(mounted: bool, requested: Option<Instant>) -> NodeAttachment {
        NodeAttachment {
            state: AttachState::Attached,
            mounted_by_node: mounted,
            detach_requested_at: requested,
            reported_as_attached: true,
            info: Arc::default(),
        }
    }

    #[test]
    fn detach_decision_table() {
        let now = Instant::now();
        let six = Duration::from_secs(360);
        let long_ago = Some(now - Duration::from_secs(361));
        let recently = Some(now - Duration::from_secs(10));
        let healthy = NodeHealth::default();
        let unhealthy = NodeHealth {
            unhealthy: true,
            out_of_service: false,
        };
        let oos = NodeHealth {
            unhealthy: false,
            out_of_service: true,
        };
        let cases = [
            (attachment(false, None), healthy, Some(six), Some(false)),
            (attachment(true, None), healthy, Some(six), None),
            (attachment(true, long_ago), healthy, Some(six), None),
            (attachment(true, recently), unhealthy, Some(six), None),
            (attachment(true, long_ago), unhealthy, Some(six), Some(true)),
            (attachment(true, long_ago), unhealthy, None, None),
            (attachment(true, None), oos, None, Some(true)),
        ];
        for (i, (a, health, max, expected)) in cases.into_iter().enumerate() {
            assert_eq!(detach_decision(&a, health, now, max), expected, "case {i}");
        }
    }
}
