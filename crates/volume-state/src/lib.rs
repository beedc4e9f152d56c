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
//! use volume_state::node::{ActualNodeState, AttachMode, DesiredNodeState, NodeReconciler};
//! use volume_state::{FakeVolumePlugin, OperationKind, VolumeSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let desired = Arc::new(DesiredNodeState::<String, String>::new());
//! let actual = Arc::new(ActualNodeState::new());
//! let plugin = Arc::new(FakeVolumePlugin::<String, String>::new());
//! let reconciler = NodeReconciler::new(
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
//! assert_eq!(methods, [OperationKind::Attach, OperationKind::Stage, OperationKind::Publish]);
//! assert!(actual.snapshot().pod_mount(&"vol-1".into(), &"pod-a".into()).is_some());
//! # }
//! ```
//!
//! Where kubelet's behaviour is a known bug, this crate does better by
//! default (see `docs/volume-state.md`): backoff is forgotten once a
//! volume is gone, a failed detach keeps a single-node volume from
//! attaching elsewhere, mounts are identified by what is mounted
//! ([`mounts`]), and a durable [`journal`] of node-side intents means a
//! restart never loses a tear-down.
//!
//! A node agent that stops between the last unpublish and the unstage
//! (kubernetes#85476) still unstages and detaches after its restart:
//!
//! ```
//! use std::path::Path;
//! use std::sync::Arc;
//! use volume_state::journal::{Journal, RecordJournalStore};
//! use volume_state::mounts::FakeMountTable;
//! use volume_state::node::{
//!     ActualNodeState, AttachMode, DesiredNodeState, DiscoveredMount, NodeReconciler,
//! };
//! use volume_state::{FakeVolumePlugin, OperationKind, VolumeSpec};
//!
//! type Plugin = FakeVolumePlugin<String, String>;
//! type Desired = DesiredNodeState<String, String>;
//!
//! /// One run of the agent, its state rebuilt from a mount scan and the
//! /// journal the previous run left in `dir`.
//! fn start(dir: &Path, plugin: Arc<Plugin>) -> (NodeReconciler<String, String, String>, Arc<Desired>) {
//!     let store = RecordJournalStore::open(dir).unwrap(); // a csi-store FileStore
//!     let journal = Arc::new(Journal::open(Arc::new(store)).unwrap());
//!     // On a node: `MounterTable::new()`, and the mounts found under the
//!     // pod directories. The pod's mount is gone here.
//!     let mounts = Arc::new(FakeMountTable::new());
//!     let found: Vec<DiscoveredMount<String, String>> = Vec::new();
//!     let found = found.into_iter().map(|m| m.checked(mounts.as_ref()));
//!     let actual = Arc::new(ActualNodeState::new());
//!     // No metadata either: the journal alone knows enough to tear down.
//!     actual.reconstruct_with_journal(found, &journal.records(), |_| None);
//!     let desired = Arc::new(Desired::new());
//!     let node = NodeReconciler::new("node-1".into(), AttachMode::ByNode, desired.clone(), actual, plugin)
//!         .with_journal(journal)
//!         .with_mount_table(mounts);
//!     (node, desired)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let dir = tempfile::tempdir().unwrap();
//! let plugin = Arc::new(FakeVolumePlugin::new());
//! let spec = VolumeSpec {
//!     attachable: true,
//!     staging_path: Some("/staging/vol-1".into()),
//!     ..VolumeSpec::default()
//! };
//!
//! let (node, desired) = start(dir.path(), plugin.clone());
//! desired.add_pod("vol-1".into(), spec, "pod-a".into(), "/pods/a/vol-1".into());
//! desired.mark_populated();
//! node.run_until_idle(10).await; // attach, stage, publish
//! desired.remove_pod(&"vol-1".into(), &"pod-a".into());
//! node.run_pass().await; // unpublish ... and the process stops here
//! drop((node, desired));
//!
//! plugin.take_calls();
//! let (node, desired) = start(dir.path(), plugin.clone());
//! desired.mark_populated(); // no pod wants vol-1 any more
//! node.run_until_idle(10).await;
//! let methods: Vec<_> = plugin.calls().into_iter().map(|c| c.method).collect();
//! assert_eq!(methods, [OperationKind::Unstage, OperationKind::Detach]);
//! assert!(node.actual_snapshot().is_empty());
//! # }
//! ```
mod clock;
pub mod controller;
#[cfg(feature = "csi")]
pub mod csi;
mod error;
#[cfg(feature = "testing")]
mod fake_plugin;
mod gate;
pub mod journal;
pub mod mounts;
pub mod node;
mod pass;
mod plugin;
mod runner;
mod state_cell;
pub mod transition;
mod types;

#[cfg(feature = "testing")]
pub use clock::FakeClock;
pub use clock::{Clock, SystemClock, TokioClock};
#[cfg(feature = "csi")]
pub use error::error_kind_for_code;
pub use error::{ErrorKind, GateError, PluginError};
#[cfg(feature = "testing")]
pub use fake_plugin::{CallHold, FakeVolumePlugin, PluginCall, PluginEvent};
pub use gate::{BackoffConfig, GateState, OperationGate, OperationKey, next_wait_after_failure};
pub use pass::{ExecutionResult, PassReport};
pub use plugin::{ExpandRequest, MountResult, PublishRequest, StageRequest, VolumePlugin};
pub use runner::{Reconcile, Runner, RunnerConfig};
pub use types::{AttachInfo, Key, NodeAccess, OperationKind, VolumeSpec};
