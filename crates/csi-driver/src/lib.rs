//! What a CSI driver implements and calls. A driver is storage logic in the
//! trait methods of this crate; [csi-server] serves it (socket, validation,
//! gating, locking, tracing) and [csi-client] talks to it.
//!
//! The map:
//!
//! - **The traits a driver implements**, one per CSI service, generated
//!   from csi.proto's method table with a doc per RPC: [`Identity`],
//!   [`Controller`], [`Node`], [`GroupController`], [`SnapshotMetadata`].
//!   Each method gets the request and a [`CallContext`] (request id, RPC,
//!   declared capabilities) and returns a [`CsiResult`].
//! - **Errors**: [`CsiError`], one variant per gRPC code the spec gives a
//!   meaning, mapped once to a status; `From` conversions from
//!   [`std::io::Error`], mount-utils' errors and tower's, so `?` works.
//! - **The declaration**: [`PluginInfo`] and [`Capabilities`], built from
//!   the capability enums [`ControllerRpc`], [`NodeRpc`],
//!   [`GroupControllerRpc`] and [`PluginService`] (and
//!   [`VolumeExpansion`]); the server answers the `*GetCapabilities` RPCs and
//!   gates every RPC by it.
//! - **The spec's rules**: [`validate`] (field rules of every request),
//!   [`request`] ([`CsiRequest`]: what a server layer knows about any
//!   request), and [`helpers`] for the rules drivers get wrong (idempotency,
//!   paging tokens, the NodeStage/NodePublish repeat tables, capacity and
//!   topology).
//! - **What every driver writes**: [`init_tracing`], [`node_id_or_hostname`],
//!   [`blocking`] (run blocking work, panics become INTERNAL, a thread
//!   that cannot start RESOURCE_EXHAUSTED), [`clock`] (time as a seam), and
//!   [`persist`] (crash-safe state files).
//!
//! ```
//! use csi_driver::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
//! use csi_driver::v1::{NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse};
//! use csi_driver::{CallContext, Capabilities, CsiResult, Method, Node, NodeRpc, PluginInfo};
//!
//! struct Tmpfs {
//!     node_id: String,
//! }
//!
//! #[csi_driver::async_trait]
//! impl Node for Tmpfs {
//!     async fn node_get_info(&self, _: &CallContext, _: NodeGetInfoRequest) -> CsiResult<NodeGetInfoResponse> {
//!         Ok(NodeGetInfoResponse { node_id: self.node_id.clone(), ..Default::default() })
//!     }
//!
//!     async fn node_unpublish_volume(
//!         &self,
//!         _: &CallContext,
//!         req: NodeUnpublishVolumeRequest,
//!     ) -> CsiResult<NodeUnpublishVolumeResponse> {
//!         // Blocking filesystem work off the runtime; io errors convert with `?`.
//!         csi_driver::blocking(move || {
//!             match std::fs::remove_dir(&req.target_path) {
//!                 Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
//!                 other => other?,
//!             }
//!             Ok(NodeUnpublishVolumeResponse {})
//!         })
//!         .await
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let driver = Tmpfs { node_id: csi_driver::node_id_or_hostname(None) };
//! // Driver methods are plain async functions: call them in unit tests.
//! let ctx = CallContext::for_test(
//!     Method::NodeGetInfo,
//!     PluginInfo::new("tmpfs.csi.example.com", "0.1.0").unwrap(),
//!     Capabilities::new().node([NodeRpc::GetVolumeStats]),
//! );
//! let info = driver.node_get_info(&ctx, NodeGetInfoRequest {}).await.unwrap();
//! assert!(!info.node_id.is_empty());
//! // Unimplemented methods answer UNIMPLEMENTED, as the spec wants.
//! let err = driver.node_stage_volume(&ctx, Default::default()).await.unwrap_err();
//! assert_eq!(err.code(), csi_driver::Code::Unimplemented);
//! # }
//! ```
//!
//! [csi-server]: https://docs.rs/csi-server
//! [csi-client]: https://docs.rs/csi-client
#![warn(missing_docs)]

pub mod capabilities;
pub mod clock;
pub mod driver;
pub mod error;
pub mod helpers;
pub mod persist;
pub mod request;
mod support;
pub mod validate;

pub use async_trait::async_trait;
pub use capabilities::{Capabilities, PluginInfo};
pub use csi_proto::methods::{
    ControllerRpc, GroupControllerRpc, KeyKind, LockKey, Method, MethodInfo, NodeRpc,
    PluginService, Requirement, RpcRequest, Service,
};
/// Plugin volume expansion modes (`PluginCapability.VolumeExpansion.Type`).
pub use csi_proto::v1::plugin_capability::volume_expansion::Type as VolumeExpansion;
pub use csi_proto::{self, v1};
pub use driver::{
    CallContext, Controller, CsiResult, CsiStream, Declared, DefaultIdentity, GroupController,
    Identity, Node, ResponseStream, SnapshotMetadata,
};
pub use error::CsiError;
pub use prost;
pub use request::{CsiRequest, FieldCapabilities};
#[cfg(feature = "testing")]
pub use support::FakeBlockingRunner;
pub use support::{
    BlockingJob, BlockingRunner, TokioBlocking, blocking, blocking_on, init_tracing,
    node_id_or_hostname,
};
pub use tonic::Code;
pub use validate::Validate;
