//! Trait-based scaffolding for CSI plugins: serving, validation, capability
//! gating, locking, tracing and shutdown around a driver's storage logic.
#![warn(missing_docs)]

pub mod client;
pub mod endpoint;

pub use client::{ClientOptions, ConnectError, CsiClient};
pub use endpoint::{CSI_ENDPOINT_ENV, Endpoint, EndpointError};
