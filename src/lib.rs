//! csi-kit: building blocks for Kubernetes CSI drivers.
//!
//! This crate re-exports the workspace crates under short names, one cargo
//! feature per block (default: `server`):
//!
//! | module | crate | feature |
//! |---|---|---|
//! | [`proto`]: CSI v1.12.0 types and the method table | csi-proto | always |
//! | [`driver`]: what a driver implements (traits, errors, capabilities, the spec's rules, helpers) | csi-driver | always |
//! | `server`: serving a driver through tower layers | csi-server | `server` (`metrics`, `flags` add its options) |
//! | `client`: the typed client | csi-client | `client` |
//! | `controller`: the controller side over a storage backend (records, claims, capacity, crash safety) | csi-controller | `controller` |
//! | `node`: what a node plugin staged and published, and the rules that guard it | csi-node | `node` |
//! | `store`: crash-safe records | csi-store | `store` |
//! | `mount`: node-side mount utilities | mount-utils | `mount` |
//! | `copy`: tree copies that keep owners, xattrs and hard links | tree-copy | `copy` |
//! | `state`: volume lifecycle reconciliation | volume-state | `state` |
//! | `conformance`: the conformance suite | csi-conformance | `conformance` |
//!
//! `full` enables every block. The `csi` command-line client is the csi-cli
//! package.

#[cfg(feature = "client")]
pub use csi_client as client;
#[cfg(feature = "conformance")]
pub use csi_conformance as conformance;
#[cfg(feature = "controller")]
pub use csi_controller as controller;
pub use csi_driver as driver;
#[cfg(feature = "node")]
pub use csi_node as node;
pub use csi_proto as proto;
#[cfg(feature = "server")]
pub use csi_server as server;
#[cfg(feature = "store")]
pub use csi_store as store;
#[cfg(feature = "mount")]
pub use mount_utils as mount;
#[cfg(feature = "copy")]
pub use tree_copy as copy;
#[cfg(feature = "state")]
pub use volume_state as state;

/// The README's code examples, compiled as doc tests so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "full"))]
pub struct ReadmeDoctests;

/// docs/architecture.md's code examples, compiled as doc tests for the same
/// reason.
#[doc = include_str!("../docs/architecture.md")]
#[cfg(all(doctest, feature = "full"))]
pub struct ArchitectureDoctests;
