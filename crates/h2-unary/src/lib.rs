//! HTTP/2 for unary gRPC calls, written for a small footprint.
//!
//! A CSI plugin is idle most of the time, and on a busy or virtualised
//! machine its code and data leave the CPU caches while it waits. A call
//! then pays for every cache line its stack touches, so the size of the
//! code on a call's path matters as much as its speed (docs/benchmarks.md,
//! "Session 19", measures both). This crate holds the parts of HTTP/2
//! (RFC 7540) that unary gRPC calls use, with nothing else on their path.
//!
//! [`hpack`] is header compression (RFC 7541), [`frame`] the frames,
//! [`client`] a connection making unary calls (csi-client's) and [`server`]
//! one serving them (csi-server's).

pub mod client;
mod conn;
pub mod frame;
pub mod hpack;
pub mod server;
