//! Node mode: the kubelet volume manager. Brings the volumes that pods on
//! this node want from detached to published and back.

mod actual;
mod desired;
mod plan;
mod reconciler;
mod reconstruct;

pub use actual::{
    ActualNodeSnapshot, ActualNodeState, ActualVolume, AttachState, DeviceState, PodMount,
    PodMountState,
};
pub use desired::{DesiredNodeSnapshot, DesiredNodeState, DesiredVolume};
pub use plan::{AttachMode, NodeOperation, Phase, plan, volumes_in_use};
pub use reconciler::NodeReconciler;
pub use reconstruct::{DiscoveredMount, ReconstructionReport};
