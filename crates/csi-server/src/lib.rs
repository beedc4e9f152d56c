//! Trait-based scaffolding for CSI plugins: a driver implements only its
//! storage logic in async trait methods, and csi-server provides what a
//! spec-correct plugin needs around it — serving on a safe unix socket,
//! spec validation of every request, capability gating, per-resource
//! locking, tracing with secrets redacted, panic safety, Probe readiness and
//! graceful shutdown — plus helpers for the rules drivers usually get wrong
//! (idempotency, paging, the NodePublish repeat table, capacity and
//! topology resolution) and a typed client.
//!
//! A node-only driver:
//!
//! ```no_run
//! use std::sync::Arc;
//! use csi_proto::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
//! use csi_proto::v1::{NodePublishVolumeRequest, NodePublishVolumeResponse};
//! use csi_server::{CallContext, Capabilities, CsiResult, Node, PluginInfo, ServeMode, Server};
//!
//! struct HostPath;
//!
//! #[csi_server::async_trait]
//! impl Node for HostPath {
//!     async fn node_get_info(&self, _: &CallContext, _: NodeGetInfoRequest) -> CsiResult<NodeGetInfoResponse> {
//!         Ok(NodeGetInfoResponse { node_id: "node-1".into(), ..Default::default() })
//!     }
//!     async fn node_publish_volume(&self, _: &CallContext, req: NodePublishVolumeRequest) -> CsiResult<NodePublishVolumeResponse> {
//!         // Validated already: volume_id and an absolute target_path are set.
//!         std::fs::create_dir_all(&req.target_path)
//!             .map_err(|e| csi_server::CsiError::Internal(e.to_string()))?;
//!         Ok(NodePublishVolumeResponse {})
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Server::builder(PluginInfo::new("hostpath.csi.example.com", "0.1.0")?)
//!     .capabilities(Capabilities::new())
//!     .mode(ServeMode::Node)
//!     .endpoint("unix:///run/csi/csi.sock".parse()?)
//!     .node(Arc::new(HostPath))
//!     .build()?;
//! server.serve().await?; // until SIGTERM/SIGINT
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod authority;
pub mod capabilities;
pub mod client;
mod dispatch;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod helpers;
pub mod layer;
pub mod method;
pub mod persist;
pub mod request;
pub mod server;
pub mod socket;
pub mod validate;

pub use async_trait::async_trait;
pub use capabilities::{Capabilities, PluginInfo};
pub use client::{ClientOptions, ConnectError, CsiClient};
pub use driver::{
    CallContext, Controller, CsiResult, CsiStream, DefaultIdentity, GroupController, Identity,
    Node, SnapshotMetadata,
};
pub use endpoint::{CSI_ENDPOINT_ENV, Endpoint, EndpointError};
pub use error::CsiError;
pub use layer::{Layer, Readiness, ReadinessState, Stack};
pub use method::{Method, Service};
pub use request::{CsiRequest, LockKey};
pub use server::{ServeMode, Server, ServerBuilder, ServerError};
pub use validate::Validate;
