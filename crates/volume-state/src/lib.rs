//! Desired/actual state of world, an operation gate with per-key exponential
//! backoff, and reconcilers that drive volumes through attach, stage and
//! publish and back — the semantics of the kubelet volume manager
//! ([`node`]) and the Kubernetes attach/detach controller ([`controller`]),
//! without any Kubernetes dependency.
//!
//! The planners ([`node::plan`], [`controller::plan`]) are pure functions
//! over immutable snapshots; executing an operation goes through the
//! [`OperationGate`] and a [`VolumePlugin`] and records the result in the
//! actual state. [`Runner`] runs passes on events instead of polling.
//!
//! ```
//! use std::sync::Arc;
//! use volume_state::node::{ActualStateOfWorld, AttachMode, DesiredStateOfWorld, Reconciler};
//! use volume_state::{FakeVolumePlugin, PluginMethod, VolumeSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let desired = Arc::new(DesiredStateOfWorld::<String, String>::new());
//! let actual = Arc::new(ActualStateOfWorld::new());
//! let plugin = Arc::new(FakeVolumePlugin::<String, String>::new());
//! let reconciler = Reconciler::new(
//!     "node-1".to_string(),
//!     AttachMode::ByNode,
//!     desired.clone(),
//!     actual.clone(),
//!     plugin.clone(),
//! );
//!
//! let spec = VolumeSpec {
//!     attachable: true,
//!     staging_path: Some("/staging/vol-1".into()),
//!     ..VolumeSpec::default()
//! };
//! desired.add_pod("vol-1".into(), spec, "pod-a".into(), "/pods/a/vol-1".into());
//! desired.mark_populated();
//! reconciler.run_until_idle(10).await;
//!
//! let methods: Vec<_> = plugin.calls().into_iter().map(|c| c.method).collect();
//! assert_eq!(methods, [PluginMethod::Attach, PluginMethod::Stage, PluginMethod::Publish]);
//! assert!(actual.snapshot().pod_mount(&"vol-1".into(), &"pod-a".into()).is_some());
//! # }
//! ```
#![warn(missing_docs)]

mod clock;
pub mod controller;
#[cfg(feature = "csi")]
pub mod csi;
mod error;
mod gate;
pub mod journal;
pub mod mounts;
pub mod node;
mod plugin;
mod runner;
pub mod transition;
mod types;

pub use clock::{Clock, FakeClock, SystemClock, TokioClock};
pub use error::{ErrorKind, GateError, GrpcCode, PluginError, error_kind_for_grpc_code};
pub use gate::{BackoffConfig, GateState, OperationGate, OperationKey, next_wait_after_failure};
pub use plugin::{
    ExpandRequest, FakeVolumePlugin, PluginCall, PluginMethod, PublishRequest, StageRequest,
    VolumePlugin,
};
pub use runner::{Reconcile, Runner, RunnerConfig};
pub use types::{AccessMode, AttachInfo, Key, OperationKind, VolumeSpec};
