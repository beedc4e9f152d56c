//! The Node service: the disk appears on the node as a loop device, on
//! csi-node's record of what this node staged and published (the spec's
//! repeat and ownership rules before any syscall, the intent saved before
//! mounting, what is mounted checked in mountinfo).
//!
//! Mount access: NodeStage attaches the backing file (named by the publish
//! context), formats it on first use only (a disk formatted before that now
//! shows no filesystem is refused, never formatted again) and mounts it at
//! the staging path; NodePublish bind-mounts the staging path at the
//! target. Block access: NodeStage attaches the file and NodePublish
//! bind-mounts the device node on a file at the target; NodeUnstage of a
//! disk still published is refused, so its device is never reused under a
//! live target.

use std::path::PathBuf;

use csi_proto::v1::*;
use csi_server::{CallContext, CsiError, CsiResult, Node};

use crate::common::{blocking, internal, node_stats, on_node};
use crate::controller::BACKING_FILE_KEY;
use crate::driver::LoopBlock;
use crate::store::{Access, VolumeRecord};

/// Whether the capability fits a volume of the given access type.
fn check_access(volume: &VolumeRecord, cap: Option<&VolumeCapability>) -> CsiResult<()> {
    let Some(cap) = cap else {
        return Ok(()); // csi-node names the missing field
    };
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
    /// The backing file named by the publish context must be this volume's
    /// own file (csi-node attaches the one the backend names).
    fn check_backing_file(&self, req: &NodeStageVolumeRequest) -> CsiResult<()> {
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
        Ok(())
    }

    /// Whether the node record holds anything of volume `id` (the
    /// controller refuses to delete it then).
    pub fn in_use_on_node(&self, id: &str) -> bool {
        self.node.record(id).is_some()
    }

    /// Refreshes the loop device's size and grows the filesystem on it;
    /// returns the device's new size.
    fn expand_blocking(&self, stage: &csi_node::StageRecord) -> CsiResult<i64> {
        let dev = stage
            .device
            .as_ref()
            .map(|d| d.path.clone())
            .ok_or_else(|| {
                CsiError::FailedPrecondition(format!(
                    "volume {} has no loop device",
                    stage.volume_id
                ))
            })?;
        let size = self
            .loops
            .set_capacity(&dev)
            .map_err(|e| internal("refreshing the size of", &dev, e))?;
        if !stage.capability.is_block() {
            let device = dev.to_string_lossy();
            let grow = self
                .resizer
                .need_resize(&device, &stage.path)
                .map_err(|e| internal("inspecting the filesystem on", &dev, e))?;
            if grow {
                self.resizer
                    .resize(&device, &stage.path)
                    .map_err(|e| internal("growing the filesystem on", &dev, e))?;
            }
        }
        Ok(size as i64)
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
        check_access(&volume, req.volume_capability.as_ref())?;
        self.check_backing_file(&req)?;
        on_node(&self.node, move |node| node.stage(&req)).await?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        let _detaching = self.attachments.read().await;
        on_node(&self.node, move |node| node.unstage(&req)).await?;
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        _ctx: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        check_access(&volume, req.volume_capability.as_ref())?;
        on_node(&self.node, move |node| node.publish(&req)).await?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        on_node(&self.node, move |node| node.unpublish(&req)).await?;
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        _ctx: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        self.known_volume(&req.volume_id)?;
        node_stats(&self.node, req.volume_id, req.volume_path, |record| {
            let dev = record.stage.as_ref()?.device.as_ref()?;
            mount_utils::block::device_size(&dev.path).ok()
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        _ctx: &CallContext,
        req: NodeExpandVolumeRequest,
    ) -> CsiResult<NodeExpandVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let (id, path) = (req.volume_id.clone(), req.volume_path.clone());
        let record = on_node(&self.node, move |node| node.record_at(&id, &path)).await?;
        let Some(stage) = record.stage else {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is not staged",
                volume.id
            )));
        };
        if stage.readonly {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is staged read-only",
                volume.id
            )));
        }
        let this = self.clone();
        let capacity_bytes = blocking(move || this.expand_blocking(&stage)).await?;
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
