//! A typed client for CSI plugins, for tools, tests and container
//! orchestrator code: parse an [`Endpoint`] (`unix:///…/csi.sock`, or
//! `tcp://` where allowed), connect with timeouts ([`ClientOptions`]), and
//! call any RPC by its method (one per RPC, generated from csi.proto's
//! method table) or generically with [`CsiClient::call`].
//!
//! ```no_run
//! use csi_client::CsiClient;
//! use csi_proto::v1::{NodeGetInfoRequest, ProbeRequest};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = CsiClient::connect("unix:///run/csi/csi.sock").await?;
//! let ready = client.probe(ProbeRequest {}).await?.ready;
//! // Any unary request, by type: the RPC follows from it.
//! let node = client.call(NodeGetInfoRequest {}).await?;
//! println!("{ready:?} {}", node.node_id);
//! # Ok(()) }
//! ```
pub mod client;
pub mod endpoint;
mod unary;

pub use client::{ClientOptions, ConnectError, CsiClient, UnaryRequest};
pub use endpoint::{CSI_ENDPOINT_ENV, Endpoint, EndpointError};
