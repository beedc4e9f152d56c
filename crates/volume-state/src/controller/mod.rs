//! Controller mode: the attach/detach controller. Attaches volumes to the
//! nodes whose pods want them and detaches them once unused, detaching
//! before attaching elsewhere.

mod actual;
mod desired;
mod plan;
mod reconciler;

pub use actual::{ActualSnapshot, ActualStateOfWorld, AttachedVolume, NodeAttachment, NodeHealth};
pub use desired::{DesiredAttachment, DesiredSnapshot, DesiredStateOfWorld};
pub use plan::{ControllerConfig, Operation, detach_decision, plan};
pub use reconciler::Reconciler;
