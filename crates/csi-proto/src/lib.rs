//! Container Storage Interface (CSI) v1.12.0 for Rust: every message, enum,
//! gRPC client and server, generated at build time by a pure-Rust protobuf
//! compiler (no `protoc`).
//!
//! Beyond the generated code it adds what driver authors otherwise write by
//! hand: `Debug` output that never shows a `csi_secret` field or mount flags,
//! capability constructors, access-mode helpers, a [`VolumeCapability`]
//! builder and byte-size helpers.
//!
//! ```
//! use csi_proto::v1::{ControllerServiceCapability, CreateVolumeRequest, VolumeCapability};
//! use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
//! use csi_proto::v1::volume_capability::access_mode::Mode;
//!
//! let cap = VolumeCapability::mount("ext4").with_access_mode(Mode::SingleNodeWriter);
//! assert!(cap.access_mode().is_single_node());
//!
//! let req = CreateVolumeRequest {
//!     name: "pvc-1".into(),
//!     volume_capabilities: vec![cap],
//!     secrets: [("password".to_string(), "hunter2".to_string())].into(),
//!     ..Default::default()
//! };
//! // Secrets never reach Debug output (and so never reach logs).
//! assert!(!format!("{req:?}").contains("hunter2"));
//!
//! let _cap = ControllerServiceCapability::from(Rpc::CreateDeleteVolume);
//! assert_eq!(csi_proto::SPEC_VERSION, "1.12.0");
//! ```
//!
//! [`VolumeCapability`]: v1::VolumeCapability
mod code;
mod helpers;
pub mod methods;
pub mod redact;
pub mod size;
#[cfg(feature = "testing")]
pub mod testing;

pub use code::code_name;

/// The CSI specification version this crate implements.
pub const SPEC_VERSION: &str = "1.12.0";

/// The encoded `FileDescriptorSet` of `csi.proto` and its imports, for gRPC
/// reflection and tooling.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/csi_descriptor.bin"));

/// The `csi.v1` package: messages, enums, `*_client` and `*_server` modules.
///
/// Field semantics are those of the CSI v1.12.0 specification.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/csi.v1.redact.rs"));
}

include!(concat!(env!("OUT_DIR"), "/csi.v1.for_each_method.rs"));
