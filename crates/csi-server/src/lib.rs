//! Serving a CSI driver: the [`Server`] builder binds the unix socket
//! safely, registers the services of its mode, and runs every call through
//! a stack of [tower] layers before the driver's trait method
//! ([csi-driver](csi_driver)) sees it.
//!
//! The map:
//!
//! - [`server`]: [`Server`] and [`ServerBuilder`] (mode, endpoint, drivers,
//!   readiness, grace period, layers at any [`Position`]); `serve()` until
//!   SIGTERM/SIGINT, then a graceful shutdown that also waits for work whose
//!   caller went away.
//! - [`layer`]: the typed call ([`CsiCall`]) and the built-in tower layers,
//!   outermost first: tracing, metrics (feature `metrics`, served by hyper),
//!   panic guard, capability gating, validation, readiness, per-resource
//!   locking (which covers the work, not just the request).
//! - [`dispatch`]: a call's method and message to the stack, and the stack
//!   to the driver ([`DriverService`]), generated from csi.proto's method
//!   table.
//! - [`socket`]: creating the unix socket (0600, stale sockets replaced,
//!   anything else refused); each connection on it is served by h2-unary's
//!   HTTP/2, which accepts any `:authority` (gRPC C-core and grpc-java name
//!   the socket's path there). [`authority`] is the adapter that lets an
//!   h2-based server do the same.
//!
//! What a driver implements (traits, [`CsiError`], [`Capabilities`], the
//! spec's rules and helpers) is re-exported from csi-driver, so a driver
//! needs only this crate; the endpoint types come from csi-client.
//!
//! A node-only driver:
//!
//! ```no_run
//! use std::sync::Arc;
//! use csi_server::v1::{NodeGetInfoRequest, NodeGetInfoResponse};
//! use csi_server::v1::{NodePublishVolumeRequest, NodePublishVolumeResponse};
//! use csi_server::{CallContext, Capabilities, CsiResult, Node, PluginInfo, ServeMode, Server};
//!
//! struct HostPath;
//!
//! #[csi_server::async_trait]
//! impl Node for HostPath {
//!     async fn node_get_info(&self, _: &CallContext, _: NodeGetInfoRequest) -> CsiResult<NodeGetInfoResponse> {
//!         Ok(NodeGetInfoResponse { node_id: csi_server::node_id_or_hostname(None), ..Default::default() })
//!     }
//!     async fn node_publish_volume(&self, _: &CallContext, req: NodePublishVolumeRequest) -> CsiResult<NodePublishVolumeResponse> {
//!         // Validated already: volume_id and an absolute target_path are set.
//!         std::fs::create_dir_all(&req.target_path)?;
//!         Ok(NodePublishVolumeResponse {})
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! csi_server::init_tracing("info");
//! let server = Server::builder(PluginInfo::new("hostpath.csi.example.com", "0.1.0")?)
//!     .capabilities(Capabilities::new())
//!     .mode(ServeMode::Node)
//!     .endpoint("unix:///run/csi/csi.sock".parse()?)
//!     .node(Arc::new(HostPath))
//!     // Any tower layer, e.g. a time limit on the driver's work.
//!     .layer(tower::timeout::TimeoutLayer::new(std::time::Duration::from_secs(120)))
//!     .build()?;
//! server.serve().await?; // until SIGTERM/SIGINT
//! # Ok(()) }
//! ```
/// The HTTP/2 `:authority` adapter (the any-authority crate) for servers
/// built on h2 (hyperium/h2#442); csi-server's own connections do not need
/// it. Its raw client checks which `:authority` a server takes.
pub use any_authority as authority;
pub mod dispatch;
#[cfg(feature = "flags")]
pub mod flags;
pub mod layer;
mod logging;
mod serve_ready;
pub mod server;
pub mod socket;
mod transport;

pub use csi_client::endpoint;
pub use csi_client::{CSI_ENDPOINT_ENV, Endpoint, EndpointError};
// What a driver implements and calls (modules included), so a driver
// depends on one crate.
pub use csi_driver::*;
pub use dispatch::{DriverService, Drivers};
pub use layer::{BoxCsiService, CsiCall, CsiService, Readiness, ReadinessState};
pub use logging::init_tracing;
pub use serve_ready::ServeError;
pub use server::{Builtin, Position, ServeMode, Server, ServerBuilder, ServerError};
/// The tower crate the layers are built on.
pub use tower;
