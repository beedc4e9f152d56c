//! The cloud underneath the `cloud-block` example driver: a block storage
//! provider shaped like a public cloud's (DigitalOcean's volumes API is the
//! model), run as its own process (`cloud-provider`), and the client the
//! driver calls it with.
//!
//! - [`api`]: the HTTP+JSON wire format, shared by both sides.
//! - [`client`]: [`ProviderClient`](client::ProviderClient), with
//!   [`HttpProvider`](client::HttpProvider) and, behind the `testing`
//!   feature, `FakeProvider`; every failure is a
//!   [`ProviderError`](client::ProviderError).
//! - [`cloud`]: the provider's rules without I/O (shared by the provider
//!   process and the fake, so they answer alike).
//! - [`provider`]: the process: effects on files, loop devices and by-id
//!   links, a crash-safe state file, the fault mode.
//! - [`token`]: the bearer token, redacted in `Debug`.
//! - [`driver`]: the `cloud-block` CSI driver on csi-controller's and
//!   csi-node's services.
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use cloud_block::api::{ActionStatus, CreateVolumeRequest};
//! use cloud_block::client::{FakeProvider, ProviderClient};
//!
//! let provider = FakeProvider::new();
//! let req = CreateVolumeRequest { name: "pvc-1".into(), size_gigabytes: 1, ..Default::default() };
//! let volume = provider.create_volume(&req).await.unwrap();
//! let action = provider.attach(&volume.id, "node-a").await.unwrap();
//! assert_eq!(provider.get_action(action.id).await.unwrap().status, ActionStatus::Completed);
//! # });
//! ```

pub mod api;
pub mod client;
pub mod cloud;
pub mod driver;
pub mod provider;
pub mod token;
