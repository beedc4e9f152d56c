//! csi-kit: building blocks for Kubernetes CSI drivers.
//!
//! This crate re-exports the workspace crates under short names:
//! [`proto`] (CSI v1.12.0 types and the method table), [`driver`] (what a
//! driver implements: traits, errors, capabilities, the spec's rules and
//! helpers), [`server`] (serving a driver through tower layers), [`client`]
//! (the typed client), [`controller`] (the controller side over a storage
//! backend: records, claims, capacity, crash safety), [`node`] (the node
//! side: what a node plugin staged and published, and the rules that guard
//! it), [`store`] (crash-safe records), [`mount`] (node-side mount
//! utilities), [`copy`] (tree copies that keep owners, xattrs and hard
//! links), [`state`] (volume lifecycle reconciliation) and [`conformance`]
//! (the conformance suite).

pub use csi_client as client;
pub use csi_conformance as conformance;
pub use csi_controller as controller;
pub use csi_driver as driver;
pub use csi_node as node;
pub use csi_proto as proto;
pub use csi_server as server;
pub use csi_store as store;
pub use mount_utils as mount;
pub use tree_copy as copy;
pub use volume_state as state;

/// The README's code examples, compiled as doc tests so they cannot rot.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
