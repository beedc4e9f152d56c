//! What this node plugin staged and published, and the rules that guard it.
//!
//! A CSI node plugin must never touch what it does not own: not a
//! directory someone else mounted a tmpfs on, not another volume's staging
//! path, not the destination of a symlink, not a loop device another
//! volume now uses. [`NodeVolumes`] keeps a record per volume
//! ([`NodeVolumeRecord`]: staging path, capability with its mount flags
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
//! ([`NodeVolumes::volume_condition`]) instead of stopping the plugin. It
//! reads the mount table once for all volumes, and may run while serving
//! ([`NodeService::restore_in_background`]): a call on a volume not yet
//! restored is ABORTED.
//!
//! Most drivers need not call [`NodeVolumes`] themselves: [`NodeService`]
//! is a ready CSI Node service over it (stage, unstage, publish and
//! unpublish off the async runtime with the spec's codes, the access-type
//! check, NodeGetVolumeStats with the condition and the filesystem usage
//! or block size, NodeExpandVolume, NodeGetInfo, restore at start). The
//! driver implements [`NodeBackend`]: which volumes exist, their access type
//! and size, where their data is ([`VolumeSource`]), and optionally a stage
//! check, a stage lock and inline ephemeral volumes. A source is one of:
//!
//! - a directory, bind-mounted;
//! - an image file, attached as a loop device;
//! - a block device the controller attached, by path or stable name
//!   ([`device_by_name`]), waited for through mount-utils' `BlockDevices`
//!   seam, formatted only when it holds no filesystem, never reformatted
//!   ([`AttachedDevices`] is the whole backend of a driver whose controller
//!   attaches disks, and [`NodeHost`] with [`NodeService::builder_on`] its
//!   setup on the host's mounts, programs and devices);
//! - a filesystem mounted by type, source and options ([`FilesystemSource`]:
//!   NFS, SMB, CephFS, FUSE, tmpfs), its secret options taken from the
//!   NodeStage secrets for the mount call only, mounted in a directory only
//!   this plugin mounts in and moved to the staging path, so after a crash
//!   it is known by its mount id, never by its source string.
//!
//! Everything a driver needs can come from the request
//! ([`VolumeLocator::source_in`], [`NodeBackend::volume_in`] get its
//! [`VolumeContexts`]), so no controller has to run in the node's process.
//! A node plugin whose volumes are directories under
//! `/var/lib/example/volumes`:
//!
//! ```no_run
//! use std::path::{Path, PathBuf};
//! use std::sync::Arc;
//! use csi_driver::{Capabilities, NodeRpc};
//! use csi_node::{NodeBackend, NodeInfo, NodeService, VolumeSource, VolumeInfo, VolumeLocator};
//! use csi_server::{PluginInfo, Server};
//!
//! struct Dirs(PathBuf);
//!
//! impl VolumeLocator for Dirs {
//!     fn source(&self, id: &str) -> Option<VolumeSource> {
//!         // Ids become paths: only ids this driver could have made.
//!         let valid = id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
//!         let dir = self.0.join(id);
//!         (valid && dir.is_dir()).then_some(VolumeSource::Directory(dir))
//!     }
//! }
//!
//! impl NodeBackend for Dirs {
//!     fn volume(&self, id: &str) -> Option<VolumeInfo> {
//!         self.source(id).map(|_| VolumeInfo::new(false, 0))
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let driver = Arc::new(Dirs("/var/lib/example/volumes".into()));
//! let info = NodeInfo::new(csi_driver::node_id_or_hostname(None));
//! let mounter = Arc::new(mount_utils::LinuxMounter::new());
//! let node = NodeService::builder(driver, info, mounter).open_in(Path::new("/var/lib/example/node"))?;
//! node.restore(); // puts back what was staged and published; logs what cannot be
//! let caps = Capabilities::new().node([NodeRpc::StageUnstageVolume, NodeRpc::GetVolumeStats]);
//! Server::builder(PluginInfo::new("example.csi.dev", "1.0")?)
//!     .capabilities(caps)
//!     .node(Arc::new(node))
//!     .build()?
//!     .serve()
//!     .await?;
//! # Ok(())
//! # }
//! ```
//!
//! A driver that serves its controller in the same process registers its
//! controller separately (`ServerBuilder::controller`) and keeps an `Arc`
//! of the service to ask [`NodeService::volumes`] whether a volume is still
//! staged or published here.
//!
//! The same calls with fakes (the `testing` module, with the `testing`
//! feature), as a driver's unit test would make them:
//!
//! ```
//! use std::sync::Arc;
//! use csi_node::testing::FakeHost;
//! use csi_node::{NodeVolumes, NodeOutcome, VolumeSource};
//! use csi_store::FakeStore;
//! use csi_proto::v1::volume_capability::access_mode::Mode;
//! use csi_proto::v1::*;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let data = dir.path().join("vol-1");
//! std::fs::create_dir(&data).unwrap();
//! let host = FakeHost::new();
//! let data_dir = data.clone();
//! let locator = Arc::new(move |id: &str| (id == "vol-1").then(|| VolumeSource::Directory(data_dir.clone())));
//! let volumes = NodeVolumes::builder(host.mounter(), Arc::new(FakeStore::new()), locator)
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
//! assert_eq!(volumes.publish(&publish).unwrap(), NodeOutcome::Changed);
//! assert_eq!(volumes.publish(&publish).unwrap(), NodeOutcome::Unchanged);
//! assert!(host.mounts_at(&target)[0].is_read_only(), "read-only wins over rw");
//!
//! // Another volume id at this target is not this driver's to unpublish.
//! let other = NodeUnpublishVolumeRequest { volume_id: "vol-2".into(), target_path: publish.target_path.clone() };
//! assert!(volumes.unpublish(&other).is_err());
//! let unpublish = NodeUnpublishVolumeRequest { volume_id: "vol-1".into(), ..other };
//! volumes.unpublish(&unpublish).unwrap();
//! assert!(!target.exists());
//! ```
mod attached;
mod error;
mod host;
pub mod observe;
mod record;
pub mod rules;
mod seams;
mod service;
#[cfg(feature = "testing")]
pub mod testing;
mod usage;
mod volumes;

pub use attached::AttachedDevices;
pub use error::NodeError;
pub use host::NodeHost;
pub use record::{
    AccessKind, Capability, Device, FilesystemSource, MountFlags, NodeVolumeRecord, PublishRecord,
    PublishState, StageRecord, StageState, VolumeSource,
};
pub use seams::{
    FilesystemMount, PlainMount, Probe, VolumeContexts, VolumeLocator, device_by_name,
};
pub use service::{NodeBackend, NodeInfo, NodeService, NodeServiceBuilder, VolumeInfo};
pub use volumes::{
    DEFAULT_DEVICE_TIMEOUT, NodeOutcome, NodeVolumes, NodeVolumesBuilder, PUBLISHED_TABLE,
    RestoreReport, STAGED_TABLE,
};
