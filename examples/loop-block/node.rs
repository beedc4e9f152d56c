//! The Node service: the disk appears on the node as a loop device.
//!
//! Mount access: NodeStage attaches the backing file (named by the publish
//! context), formats it on first use and mounts it at the staging path;
//! NodePublish bind-mounts the staging path at the target. Block access:
//! NodeStage attaches the file (no autoclear, see [`LoopBlock::attach`]) and
//! records the device; NodePublish bind-mounts the device node on a file at
//! the target. Every step checks what is already attached or mounted first,
//! so a retry after a crash converges instead of doing it twice.

use std::path::{Path, PathBuf};

use csi_proto::v1::*;
use csi_server::helpers::publish::{PublishDecision, check_publish};
use csi_server::helpers::stage::{StageDecision, Staging, check_stage};
use csi_server::{CallContext, CsiError, CsiResult, Node};
use mount_utils::{DEFAULT_FS_TYPE, FormatError, LoopDevice};
use prost::Message;

use crate::common::state::Res;
use crate::common::{
    bind_publish, blocking, detach_loop, device_present_at, fs_usage, internal, publications,
};
use crate::controller::BACKING_FILE_KEY;
use crate::driver::LoopBlock;
use crate::store::{Access, PublishedRecord, StagedRecord, VolumeRecord};
use crate::tuning::Tuning;

/// SafeFormatAndMount's refusals are the caller's problem (the disk holds
/// something else, or cannot be formatted read-only); the rest is ours.
pub fn format_error(device: &Path, e: FormatError) -> CsiError {
    match e {
        FormatError::FilesystemMismatch { .. }
        | FormatError::UnformattedReadOnly { .. }
        | FormatError::HasPartitionTable { .. }
        | FormatError::HasFilesystemErrors { .. } => CsiError::FailedPrecondition(e.to_string()),
        FormatError::UnsupportedFilesystem { .. } => {
            CsiError::invalid("volume_capability.mount.fs_type", e.to_string())
        }
        e => internal("staging", device, e),
    }
}

/// A stored capability.
pub fn decode_capability(bytes: &[u8]) -> CsiResult<VolumeCapability> {
    VolumeCapability::decode(bytes)
        .map_err(|e| CsiError::Internal(format!("stored capability: {e}")))
}

/// A stored NodePublish request.
pub fn decode_publish(bytes: &[u8]) -> CsiResult<NodePublishVolumeRequest> {
    NodePublishVolumeRequest::decode(bytes)
        .map_err(|e| CsiError::Internal(format!("stored publish request: {e}")))
}

/// The capability's mount flags (none for block).
pub fn mount_flags(cap: &VolumeCapability) -> Vec<&str> {
    cap.mount_volume()
        .map(|m| m.mount_flags.iter().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Whether the capability fits a volume of the given access type.
fn check_access(volume: &VolumeRecord, cap: &VolumeCapability) -> CsiResult<()> {
    if cap.is_block() == (volume.access == Access::Block) {
        return Ok(());
    }
    Err(CsiError::FailedPrecondition(format!(
        "volume {} was created for {:?} access, not {}",
        volume.id,
        volume.access,
        if cap.is_block() { "block" } else { "mount" }
    )))
}

impl LoopBlock {
    /// The backing file named by the publish context, which must be this
    /// volume's own file.
    fn backing_file(&self, req: &NodeStageVolumeRequest) -> CsiResult<PathBuf> {
        let field = format!("publish_context[{BACKING_FILE_KEY}]");
        let path = req.publish_context.get(BACKING_FILE_KEY).ok_or_else(|| {
            CsiError::invalid(&field, "required: ControllerPublishVolume returns it")
        })?;
        let path = PathBuf::from(path);
        if self.backend.volume_of(&path).as_deref() != Some(req.volume_id.as_str()) {
            return Err(CsiError::invalid(
                field,
                format!("not the backing file of volume {}", req.volume_id),
            ));
        }
        if !path.is_file() {
            return Err(CsiError::NotFound(format!(
                "backing file of volume {} is missing",
                req.volume_id
            )));
        }
        Ok(path)
    }

    /// Attaches (and for mount access formats and mounts) a disk; returns
    /// the loop device.
    fn stage_blocking(
        &self,
        image: &Path,
        staging: &Path,
        cap: &VolumeCapability,
        readonly: bool,
        tuning: Tuning,
    ) -> CsiResult<PathBuf> {
        let Some(mount) = cap.mount_volume() else {
            return Ok(self.attach(image, false, tuning)?.0.keep());
        };
        std::fs::create_dir_all(staging).map_err(|e| internal("creating", staging, e))?;
        let (dev, _) = self.attach(image, true, tuning)?;
        let mounted = self
            .mounter
            .is_mount_point(staging)
            .map_err(|e| internal("inspecting", staging, e))?;
        if !mounted {
            let fs_type = fs_type_of(mount);
            self.mount_staged(dev.path(), staging, fs_type, readonly, &mount_flags(cap))?;
        }
        // Autoclear: the mount now holds the device, NodeUnstage's unmount frees it.
        Ok(dev.keep())
    }

    /// Where `path` is this volume's staging path or one of its targets.
    fn is_volume_path(&self, volume_id: &str, path: &Path) -> bool {
        self.store
            .published
            .get(&path.to_string_lossy())
            .is_some_and(|p| p.volume_id == volume_id)
            || self
                .store
                .staged
                .get(volume_id)
                .is_some_and(|st| st.staging_path == path)
    }

    fn volume_stats(
        &self,
        staged: &StagedRecord,
        path: &Path,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let usage = if staged.fs_type.is_some() {
            fs_usage(path)?
        } else {
            let total = mount_utils::block::device_size(&staged.loop_device)
                .map_err(|e| internal("sizing", &staged.loop_device, e))?;
            vec![VolumeUsage {
                total: total as i64,
                unit: volume_usage::Unit::Bytes as i32,
                ..Default::default()
            }]
        };
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        })
    }

    /// Refreshes the loop device's size and grows the filesystem on it;
    /// returns the device's new size.
    fn expand_blocking(&self, staged: &StagedRecord) -> CsiResult<i64> {
        let dev = &staged.loop_device;
        let loop_dev = LoopDevice::open(dev).map_err(|e| internal("opening", dev, e))?;
        loop_dev
            .set_capacity()
            .map_err(|e| internal("refreshing the size of", dev, e))?;
        let size = loop_dev.size().map_err(|e| internal("sizing", dev, e))?;
        if staged.fs_type.is_some() {
            let device = dev.to_string_lossy();
            let grow = self
                .resizer
                .need_resize(&device, &staged.staging_path)
                .map_err(|e| internal("inspecting the filesystem on", dev, e))?;
            if grow {
                self.resizer
                    .resize(&device, &staged.staging_path)
                    .map_err(|e| internal("growing the filesystem on", dev, e))?;
            }
        }
        Ok(size as i64)
    }
}

fn fs_type_of(mount: &volume_capability::MountVolume) -> &str {
    if mount.fs_type.is_empty() {
        DEFAULT_FS_TYPE
    } else {
        &mount.fs_type
    }
}

#[csi_server::async_trait]
impl Node for LoopBlock {
    async fn node_stage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let _attaching = self.attachments.read().await;
        let volume = self.known_volume(&req.volume_id)?;
        let cap = req.volume_capability.clone().unwrap_or_default();
        check_access(&volume, &cap)?;
        // Held by the blocking task to its end: a retry while a cancelled
        // call's mkfs still runs is ABORTED instead of formatting again.
        let claim = self
            .in_flight
            .claim("NodeStageVolume", &[(Res::Staging, &volume.id)])?;
        let staging = PathBuf::from(&req.staging_target_path);
        let encoded = cap.encode_to_vec();
        let existing = self.store.staged.get(&volume.id).map(|staged| Staging {
            staging_target_path: staged.staging_path.to_string_lossy().into_owned(),
            volume_capability: VolumeCapability::decode(staged.capability.as_slice()).ok(),
        });
        if check_stage(existing.as_ref(), &req)? == StageDecision::AlreadyStaged {
            return Ok(NodeStageVolumeResponse {});
        }
        let image = self.backing_file(&req)?;
        let readonly = cap.access_mode().is_read_only();
        let fs_type = cap.mount_volume().map(|m| fs_type_of(m).to_owned());
        let this = self.clone();
        let (c, tuning, id) = (cap.clone(), volume.tuning, volume.id.clone());
        let loop_device = blocking(move || {
            let _claim = claim;
            let loop_device = this.stage_blocking(&image, &staging, &c, readonly, tuning)?;
            let record = StagedRecord {
                staging_path: staging,
                capability: encoded,
                loop_device: loop_device.clone(),
                fs_type,
                readonly,
            };
            this.store.staged.put(&id, record)?;
            Ok(loop_device)
        })
        .await?;
        tracing::info!(volume = %volume.id, device = %loop_device.display(), "staged volume");
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        let _detaching = self.attachments.read().await;
        let claim = self
            .in_flight
            .claim("NodeUnstageVolume", &[(Res::Staging, &req.volume_id)])?;
        let staged = self.store.staged.get(&req.volume_id);
        if staged.is_none() {
            self.known_volume(&req.volume_id)?;
        }
        let this = self.clone();
        let path = PathBuf::from(&req.staging_target_path);
        let image = self.backend.volume_path(&req.volume_id);
        let has_record = staged.is_some();
        let id = req.volume_id.clone();
        blocking(move || {
            let _claim = claim;
            this.mounter
                .unmount(&path, false)
                .map_err(|e| internal("unstaging", &path, e))?;
            if !has_record {
                return Ok(());
            }
            // Whatever device the file is on now (a restart may have renumbered it).
            let devices = mount_utils::loopdev::find_by_backing_file(&image)
                .map_err(|e| CsiError::Internal(format!("looking up loop devices: {e}")))?;
            devices.iter().try_for_each(|d| detach_loop(d))?;
            // A delete: works on a full disk.
            this.store.staged.delete(&id)?;
            tracing::info!(volume = %id, "unstaged volume");
            Ok(())
        })
        .await?;
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        _ctx: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let cap = req.volume_capability.clone().unwrap_or_default();
        check_access(&volume, &cap)?;
        let target = PathBuf::from(&req.target_path);
        let existing = self
            .store
            .published
            .read(|all| publications(all, &volume.id));
        if check_publish(&existing, &req, true)? == PublishDecision::AlreadyPublished {
            return Ok(NodePublishVolumeResponse {});
        }
        let staged = self.store.staged.get(&volume.id).ok_or_else(|| {
            CsiError::FailedPrecondition(format!("volume {} is not staged", volume.id))
        })?;
        if staged.staging_path != Path::new(&req.staging_target_path) {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is staged at {}, not at {}",
                volume.id,
                staged.staging_path.display(),
                req.staging_target_path
            )));
        }
        let block = staged.fs_type.is_none();
        let source = if block {
            staged.loop_device
        } else {
            staged.staging_path
        };
        let readonly = req.readonly || cap.access_mode().is_read_only();
        let (mounter, t, c) = (self.mounter.clone(), target.clone(), cap.clone());
        blocking(move || bind_publish(&mounter, &source, &t, block, readonly, &mount_flags(&c)))
            .await?;
        let record = PublishedRecord::of(&req, readonly);
        self.store.published.put(&req.target_path, record)?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        let target = PathBuf::from(&req.target_path);
        let record = self.store.published.get(&req.target_path);
        if record.is_none() {
            // Unknown volumes are NOT_FOUND; a known one is simply not
            // published here any more (idempotent repeat).
            self.known_volume(&req.volume_id)?;
        }
        let (mounter, t) = (self.mounter.clone(), target.clone());
        blocking(move || {
            mounter
                .cleanup_mount_point(&t)
                .map_err(|e| internal("unpublishing", &t, e))
        })
        .await?;
        if record.is_some() {
            // A delete: works on a full disk.
            self.store.published.delete(&req.target_path)?;
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        _ctx: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let path = PathBuf::from(&req.volume_path);
        let not_found = CsiError::NotFound(format!(
            "volume {} is not published or staged at {}",
            volume.id,
            path.display()
        ));
        let Some(staged) = self.store.staged.get(&volume.id) else {
            return Err(not_found);
        };
        let listed = self.is_volume_path(&volume.id, &path);
        let this = self.clone();
        blocking(move || {
            // A raw block volume is also wherever its device node is: the
            // kubelet asks at the pod's volumeDevices path, not the target.
            let device_here =
                staged.fs_type.is_none() && device_present_at(&path, &staged.loop_device);
            if !listed && !device_here {
                return Err(not_found);
            }
            this.volume_stats(&staged, &path)
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        _ctx: &CallContext,
        req: NodeExpandVolumeRequest,
    ) -> CsiResult<NodeExpandVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let path = PathBuf::from(&req.volume_path);
        let staged = self.store.staged.get(&volume.id);
        let Some(staged) = staged.filter(|_| self.is_volume_path(&volume.id, &path)) else {
            return Err(CsiError::NotFound(format!(
                "volume {} is not published or staged at {}",
                volume.id,
                path.display()
            )));
        };
        if staged.readonly {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is staged read-only",
                volume.id
            )));
        }
        let this = self.clone();
        let capacity_bytes = blocking(move || this.expand_blocking(&staged)).await?;
        tracing::info!(volume = %volume.id, capacity_bytes, "expanded volume on the node");
        Ok(NodeExpandVolumeResponse { capacity_bytes })
    }

    async fn node_get_info(
        &self,
        _ctx: &CallContext,
        _req: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.config.attach_limit,
            accessible_topology: None,
        })
    }
}
