//! csi-controller: the controller side every CSI driver would otherwise
//! write itself. A driver implements [`VolumeBackend`] (make, copy, grow and
//! remove its volume and snapshot data) and serves an [`Engine`], which
//! implements csi-driver's `Controller` and `GroupController` traits:
//!
//! - records of volumes, snapshots, group snapshots and attachments in
//!   csi-store tables ([`Tables`]), one crash-safe file per record, in a
//!   state directory locked for the process's life ([`open_state`]);
//! - CreateVolume/CreateSnapshot repeat rules (csi-driver's idempotency
//!   helpers), topology, sizes, content sources;
//! - claims ([`InFlight`]): the work of a call runs in a blocking task that
//!   holds the ids it works on (a clone's source too) to its end, so a
//!   cancelled call finishes once and a retry or a delete of the source
//!   meanwhile gets ABORTED;
//! - capacity checked and reserved in one step ([`Ledger`]), RESOURCE_EXHAUSTED
//!   on a full disk with nothing left behind (data is made before its
//!   record is saved, a record removed before its data);
//! - the startup [`Engine::reconcile`]: group snapshots a crash left half
//!   done, and data no record owns, are removed;
//! - attachments with an attach limit, inline ephemeral volumes, the
//!   controller capabilities it serves ([`Engine::capabilities`]).
//!
//! [`MemBackend`] and csi-store's `MemStore` are the fakes for tests.
//!
//! ```
//! use std::sync::Arc;
//! use csi_controller::{Config, DataOnDisk, Engine, SnapshotRecord, VolumeBackend, VolumeRecord};
//! use csi_driver::{CallContext, Controller, CsiResult, Method, v1::*};
//!
//! /// A backend whose volumes take no space at all.
//! struct Nothing;
//!
//! impl VolumeBackend for Nothing {
//!     fn create_volume(&self, _: &VolumeRecord) -> CsiResult<()> { Ok(()) }
//!     fn delete_volume(&self, _: &str) -> CsiResult<bool> { Ok(false) }
//!     fn create_snapshot(&self, _: &SnapshotRecord) -> CsiResult<()> { Ok(()) }
//!     fn delete_snapshot(&self, _: &str) -> CsiResult<bool> { Ok(false) }
//!     fn expand_volume(&self, _: &VolumeRecord, _: i64) -> CsiResult<()> { Ok(()) }
//!     fn data(&self) -> DataOnDisk { DataOnDisk::default() }
//!     fn free_space(&self) -> i64 { 1 << 40 }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = Arc::new(csi_store::MemStore::new());
//! let engine = Engine::with_store(store, Config::new("node-1"), Nothing).unwrap();
//! let req = CreateVolumeRequest {
//!     name: "pvc-1".into(),
//!     volume_capabilities: vec![VolumeCapability::mount("ext4")],
//!     ..Default::default()
//! };
//! let ctx = CallContext::detached(1, Method::CreateVolume);
//! let created = engine.create_volume(&ctx, req.clone()).await.unwrap();
//! // A repeat answers the same volume.
//! assert_eq!(engine.create_volume(&ctx, req).await.unwrap(), created);
//! # });
//! ```
mod engine;
mod fake;
mod records;
mod state;
mod util;

pub use engine::{Config, Engine, VolumeBackend, WeakEngine};
pub use fake::{Data as MemData, MemBackend};
pub use records::{
    Attached, GroupSnapshotRecord, LEGACY_STATE, SnapshotRecord, Tables, VolumeRecord,
    import_state_file,
};
pub use state::{
    Claim, InFlight, Ledger, Records, Res, Reservation, load_table, open_state, report_quarantined,
};
pub use util::{
    Access, DataById, DataOnDisk, IdKind, Source, confirmed, copy_failure, copy_sparse,
    create_sparse, data_by_id, free_space, grow_file, internal, io_failure, now_nanos, page,
    parse_size, remove_path, sorted, timestamp, to_map,
};
