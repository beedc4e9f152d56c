//! What this node plugin staged and published, and the rules that guard it.
//!
//! A CSI node plugin must never touch what it does not own: not a
//! directory someone else mounted a tmpfs on, not another volume's staging
//! path, not the destination of a symlink, not a loop device another
//! volume now uses. [`NodeVolumes`] keeps a record per volume
//! ([`VolumeRecord`]: staging path, capability with its mount flags
//! (stored, never shown), device and number or bind source, publications,
//! progress), persisted in csi-store as one record per stage and one per
//! publication (so forgetting one is a delete, which works on a full disk),
//! and does NodeStage, NodeUnstage, NodePublish and NodeUnpublish
//! in an order that keeps crashes harmless:
//!
//! 1. gather facts: the records, and what is at the path ([`observe`]:
//!    `lstat`, and the mounts there from mountinfo, each recognised as this
//!    volume's by device number and root, never by its source string);
//! 2. decide with pure functions ([`rules`]): the spec's repeat tables and
//!    the ownership rules, before any syscall;
//! 3. save the intent (`Staging`, `Publishing`, ...), so a crash between a
//!    mount and the next save still leaves a record to clean up from;
//! 4. act through the seams ([`Mounter`](mount_utils::Mounter),
//!    [`LoopDevices`](mount_utils::LoopDevices), [`FilesystemMount`], and csi-store's
//!    [`RecordStore`](csi_store::RecordStore) for the records);
//! 5. verify in mountinfo (this volume is what is mounted, read-only when
//!    it must be: read-only always wins over an `rw` flag), then save.
//!
//! A path is touched only when a record names it or when what is mounted
//! there is verifiably this volume, so a lost record neither leaks a mount
//! (the driver's [`VolumeLocator`] says where the volume's data is, and its
//! devices are found by backing file) nor lets someone else's mount be
//! removed. After a restart, [`NodeVolumes::restore`] puts mounts back,
//! never formats again, and reports a volume it cannot restore abnormal
//! ([`NodeVolumes::volume_condition`]) instead of stopping the plugin.
//!
//! A node service using it (the driver keeps its volumes as directories
//! under `/var/lib/example/volumes`):
//!
//! ```
//! use std::path::PathBuf;
//! use std::sync::Arc;
//! use csi_node::{NodeVolumes, Source};
//! use csi_store::RecordStore;
//! use csi_proto::v1::*;
//! use csi_driver::{CallContext, CsiError, CsiResult, Node};
//! use mount_utils::Mounter;
//!
//! struct ExampleNode {
//!     volumes: NodeVolumes,
//! }
//!
//! impl ExampleNode {
//!     fn new(mounter: Arc<dyn Mounter>, store: Arc<dyn RecordStore>) -> Result<Self, CsiError> {
//!         let locator = Arc::new(|id: &str| {
//!             // Ids become paths: only ids this driver could have made.
//!             let valid = id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
//!             let dir = PathBuf::from("/var/lib/example/volumes").join(id);
//!             (valid && dir.is_dir()).then_some(Source::Directory(dir))
//!         });
//!         let volumes = NodeVolumes::builder(mounter, store, locator).open()?;
//!         let report = volumes.restore();
//!         for (volume, why) in &report.abnormal {
//!             tracing::warn!(%volume, %why, "volume is abnormal");
//!         }
//!         Ok(Self { volumes })
//!     }
//!
//!     async fn blocking<T: Send + 'static>(
//!         &self,
//!         f: impl FnOnce(NodeVolumes) -> Result<T, csi_node::NodeError> + Send + 'static,
//!     ) -> CsiResult<T> {
//!         let volumes = self.volumes.clone();
//!         tokio::task::spawn_blocking(move || f(volumes))
//!             .await
//!             .map_err(|e| CsiError::Internal(e.to_string()))?
//!             .map_err(CsiError::from)
//!     }
//! }
//!
//! #[csi_driver::async_trait]
//! impl Node for ExampleNode {
//!     async fn node_stage_volume(&self, _: &CallContext, req: NodeStageVolumeRequest) -> CsiResult<NodeStageVolumeResponse> {
//!         self.blocking(move |v| v.stage(&req)).await?;
//!         Ok(NodeStageVolumeResponse {})
//!     }
//!     async fn node_unstage_volume(&self, _: &CallContext, req: NodeUnstageVolumeRequest) -> CsiResult<NodeUnstageVolumeResponse> {
//!         self.blocking(move |v| v.unstage(&req)).await?;
//!         Ok(NodeUnstageVolumeResponse {})
//!     }
//!     async fn node_publish_volume(&self, _: &CallContext, req: NodePublishVolumeRequest) -> CsiResult<NodePublishVolumeResponse> {
//!         self.blocking(move |v| v.publish(&req)).await?;
//!         Ok(NodePublishVolumeResponse {})
//!     }
//!     async fn node_unpublish_volume(&self, _: &CallContext, req: NodeUnpublishVolumeRequest) -> CsiResult<NodeUnpublishVolumeResponse> {
//!         self.blocking(move |v| v.unpublish(&req)).await?;
//!         Ok(NodeUnpublishVolumeResponse {})
//!     }
//!     async fn node_get_volume_stats(&self, _: &CallContext, req: NodeGetVolumeStatsRequest) -> CsiResult<NodeGetVolumeStatsResponse> {
//!         let condition = self.volumes.volume_condition(&req.volume_id, &req.volume_path)?;
//!         Ok(NodeGetVolumeStatsResponse { usage: vec![], volume_condition: Some(condition) })
//!     }
//!     async fn node_get_info(&self, _: &CallContext, _: NodeGetInfoRequest) -> CsiResult<NodeGetInfoResponse> {
//!         Ok(NodeGetInfoResponse { node_id: "node-1".into(), ..Default::default() })
//!     }
//! }
//! ```
//!
//! The same calls with fakes ([`testing`]), as a driver's unit test would
//! make them:
//!
//! ```
//! use std::sync::Arc;
//! use csi_node::testing::FakeHost;
//! use csi_node::{NodeVolumes, Outcome, Source};
//! use csi_store::MemStore;
//! use csi_proto::v1::volume_capability::access_mode::Mode;
//! use csi_proto::v1::*;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let data = dir.path().join("vol-1");
//! std::fs::create_dir(&data).unwrap();
//! let host = FakeHost::new();
//! let data_dir = data.clone();
//! let locator = Arc::new(move |id: &str| (id == "vol-1").then(|| Source::Directory(data_dir.clone())));
//! let volumes = NodeVolumes::builder(host.mounter(), Arc::new(MemStore::new()), locator)
//!     .loop_devices(host.loops())
//!     .open()
//!     .unwrap();
//!
//! let target = dir.path().join("pod");
//! let publish = NodePublishVolumeRequest {
//!     volume_id: "vol-1".into(),
//!     target_path: target.to_string_lossy().into(),
//!     volume_capability: Some(
//!         VolumeCapability::mount("").with_access_mode(Mode::SingleNodeReaderOnly).with_mount_flags(["rw"]),
//!     ),
//!     ..Default::default()
//! };
//! assert_eq!(volumes.publish(&publish).unwrap(), Outcome::Changed);
//! assert_eq!(volumes.publish(&publish).unwrap(), Outcome::Unchanged);
//! assert!(host.mounts_at(&target)[0].is_read_only(), "read-only wins over rw");
//!
//! // Another volume id at this target is not this driver's to unpublish.
//! let other = NodeUnpublishVolumeRequest { volume_id: "vol-2".into(), target_path: publish.target_path.clone() };
//! assert!(volumes.unpublish(&other).is_err());
//! let unpublish = NodeUnpublishVolumeRequest { volume_id: "vol-1".into(), ..other };
//! volumes.unpublish(&unpublish).unwrap();
//! assert!(!target.exists());
//! ```
#![warn(missing_docs)]

mod error;
pub mod observe;
mod record;
pub mod rules;
mod seams;
mod service;
pub mod testing;
mod volumes;

pub use error::NodeError;
pub use record::{
    AccessType, Capability, Device, MountFlags, PublishRecord, PublishState, Source, StageRecord,
    StageState, VolumeRecord,
};
pub use seams::{FilesystemMount, PlainMount, VolumeLocator};
pub use service::{Ephemeral, NodeDriver, NodeInfo, NodeService, NodeServiceBuilder, VolumeInfo};
pub use volumes::{
    NodeVolumes, NodeVolumesBuilder, Outcome, PUBLISHED_TABLE, RestoreReport, STAGED_TABLE,
};
