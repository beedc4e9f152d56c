//! csi-controller: the controller side every CSI driver would otherwise
//! write itself. A driver implements [`ControllerBackend`] and serves a
//! [`ControllerService`], which implements csi-driver's `Controller` and
//! `GroupController` traits.
//!
//! Two kinds of backend fit (see [`backend`](ControllerBackend)):
//!
//! - **Local data** (a directory, an image file): the service keeps the
//!   records in csi-store tables ([`Tables`]), one crash-safe file per
//!   record, in a state directory locked for the process's life
//!   ([`open_state`]); the backend makes, copies, grows and removes data.
//!   The service holds the guarantees: CreateVolume/CreateSnapshot repeat
//!   rules, claims ([`InFlight`]) that hold the ids of the work (a clone's
//!   source too) to its end so a cancelled call finishes once and a retry
//!   meanwhile gets ABORTED, capacity checked and reserved in one step
//!   ([`Ledger`]), RESOURCE_EXHAUSTED on a full disk with nothing left
//!   behind, the startup [`ControllerService::reconcile`] of data no record
//!   owns, attachments with an attach limit, inline ephemeral volumes and
//!   group snapshots.
//! - **A provider that is the source of truth** (a cloud's block API): the
//!   backend hands out a [`VolumeCatalog`] and the service keeps no state
//!   at all ([`ControllerService::without_store`]). CreateVolume finds the
//!   volume by name first, so a retry after a timeout, a restart or on
//!   another replica resumes the one volume instead of making a second;
//!   what the provider is still making (a volume, an attach) is polled
//!   with backoff until ready, within the call's deadline
//!   ([`Deadline`], from `grpc-timeout`). What the service needs of a
//!   volume that a provider does not keep (access type, parameters, clone
//!   source) rides with it in a field the provider stores ([`VolumeNotes`]).
//!
//! Optional abilities are sub-traits the backend hands out
//! ([`SnapshotBackend`], [`ExpandBackend`], [`ModifyBackend`],
//! [`GroupSnapshotBackend`], [`AttachBackend`]); the service declares
//! exactly what they cover ([`ControllerService::capabilities`]).
//!
//! Transient provider errors are retried with backoff inside the call's
//! deadline (a 429's Retry-After honoured), through the [`Config`]'s clock,
//! so tests spend no real time. Every backend error maps to one gRPC code:
//!
//! | [`BackendError`] | gRPC code | the CO |
//! |---|---|---|
//! | `Transient` (429, 5xx, timeout, refused) left after the retries | UNAVAILABLE | retries |
//! | `NotFound` | NOT_FOUND | per the RPC's spec |
//! | `Conflict` | ALREADY_EXISTS | fix the request |
//! | `Unauthorized` (401, 403) | UNAUTHENTICATED | retries with backoff |
//! | `InvalidArgument { field }` | INVALID_ARGUMENT naming the field | fix the request |
//! | `Exhausted` | RESOURCE_EXHAUSTED | retries with backoff |
//! | `Malformed` (garbage from the provider) | INTERNAL; nothing recorded | retries with backoff |
//! | `Csi(e)` | `e`'s own code | per the code |
//!
//! The service's own answers: a call's deadline passing while the provider
//! is still making something is DEADLINE_EXCEEDED (the retry resumes it);
//! work that cannot start because no thread can be made is
//! RESOURCE_EXHAUSTED with every claim released; an unknown CreateVolume
//! parameter (see [`ControllerBackend::accepted_parameters`]) is
//! INVALID_ARGUMENT naming `parameters.<key>`.
//!
//! With the `testing` feature, `FakeControllerBackend` (local data) and
//! `FakeProvider` (a provider) are the fakes for tests, with csi-store's
//! `FakeStore`.
//!
//! ```
//! use std::sync::Arc;
//! use csi_controller::{BackendResult, Config, ControllerBackend, ControllerService, VolumeRecord};
//! use csi_driver::{CallContext, Controller, Method, v1::*};
//!
//! /// A backend whose volumes take no space at all.
//! struct Nothing;
//!
//! #[csi_driver::async_trait]
//! impl ControllerBackend for Nothing {
//!     async fn create_volume(&self, _: &mut VolumeRecord) -> BackendResult<()> { Ok(()) }
//!     async fn delete_volume(&self, _: &str) -> BackendResult<bool> { Ok(false) }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = Arc::new(csi_store::FakeStore::new());
//! let service = ControllerService::with_store(store, Config::new("node-1"), Nothing).unwrap();
//! let req = CreateVolumeRequest {
//!     name: "pvc-1".into(),
//!     volume_capabilities: vec![VolumeCapability::mount("ext4")],
//!     ..Default::default()
//! };
//! let ctx = CallContext::detached(1, Method::CreateVolume);
//! let created = service.create_volume(&ctx, req.clone()).await.unwrap();
//! // A repeat answers the same volume.
//! assert_eq!(service.create_volume(&ctx, req).await.unwrap(), created);
//! // Only what the backend does is declared: no snapshots, clones or attach.
//! let caps = service.capabilities(csi_driver::Capabilities::new());
//! assert!(!caps.has_controller(csi_driver::ControllerRpc::CreateDeleteSnapshot));
//! # });
//! ```
mod access;
mod backend;
mod config;
mod controller;
mod create_volume;
mod delete_volume;
mod error;
mod expand;
#[cfg(feature = "testing")]
mod fake;
mod files;
mod group;
mod ids;
mod list;
mod modify;
mod notes;
mod offers;
mod publish;
mod records;
mod retry;
mod service;
mod snapshots;
mod startup;
mod state;
mod wire;

pub use access::{Access, ContentSource};
pub use backend::{
    AttachBackend, AttachState, ControllerBackend, ExpandBackend, GroupSnapshotBackend,
    ModifyBackend, ProviderPage, ProviderSnapshot, ProviderVolume, SnapshotBackend, VolumeCatalog,
};
pub use config::{Config, RetryPolicy};
pub use error::{BackendError, BackendResult};
#[cfg(feature = "testing")]
pub use fake::{FakeControllerBackend, FakeData, FakeProvider, Offers};
pub use files::{
    DataById, DataOnDisk, copy_failure, copy_sparse, create_sparse, data_by_id, free_space,
    grow_file, internal, io_failure, remove_path,
};
pub use ids::IdKind;
pub use notes::VolumeNotes;
pub use records::{
    Attached, GroupSnapshotRecord, LEGACY_STATE, SnapshotRecord, Tables, VolumeRecord,
    import_state_file,
};
pub use retry::Deadline;
pub use service::{ControllerService, WeakControllerService};
pub use state::{
    Claim, InFlight, Ledger, Records, Res, Reservation, load_table, open_state, open_state_on,
    report_quarantined,
};
pub use wire::{confirmed, now_nanos, page, sorted, timestamp, to_map};
