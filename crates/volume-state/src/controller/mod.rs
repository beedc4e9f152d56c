//! Controller mode: the attach/detach controller. Attaches volumes to the
//! nodes whose pods want them and detaches them once unused, detaching
//! before attaching elsewhere.

mod actual;
mod desired;
mod plan;
mod reconciler;

pub use actual::{
    ActualAttachSnapshot, ActualAttachState, AttachedVolume, NodeAttachment, NodeHealth,
};
pub use desired::{DesiredAttachSnapshot, DesiredAttachState, DesiredAttachment};
pub use plan::{AttachConfig, AttachOperation, detach_decision, plan};
pub use reconciler::AttachReconciler;
