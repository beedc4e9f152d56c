//! Node mode: the kubelet volume manager. Brings the volumes that pods on
//! this node want from detached to published and back.

mod actual;
mod desired;
mod plan;
mod reconciler;

pub use actual::{
    ActualSnapshot, ActualStateOfWorld, ActualVolume, AttachState, DeviceState, DiscoveredMount,
    PodMount, PodMountState, ReconstructionReport,
};
pub use desired::{DesiredSnapshot, DesiredStateOfWorld, DesiredVolume};
pub use plan::{AttachMode, Operation, Phase, plan, volumes_in_use};
pub use reconciler::{ExecutionResult, PassReport, Reconciler};
