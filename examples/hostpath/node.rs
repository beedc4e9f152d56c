//! The Node service, on csi-node's record of what this node staged and
//! published: it applies the spec's repeat and ownership rules before any
//! syscall, saves the intent before mounting, and checks in mountinfo that
//! what is mounted is this volume (see `csi_node::NodeVolumes`).
//!
//! Mount volumes: NodeStage bind-mounts the volume directory at the staging
//! path; NodePublish bind-mounts the staging path at the target (read-only
//! wins over any `rw` flag). Block volumes: NodeStage attaches the image as
//! a loop device; NodePublish bind-mounts the device node on a file at the
//! target. This file adds what is the driver's own: which volumes exist,
//! their access type, and inline ephemeral volumes.

use std::path::PathBuf;

use csi_proto::v1::*;
use csi_server::request::EPHEMERAL_CONTEXT_KEY;
use csi_server::{CallContext, CsiError, CsiResult, Node};

use crate::common::{blocking, internal, node_stats, on_node};
use crate::config::TOPOLOGY_KEY;
use crate::driver::HostPath;
use crate::store::{Access, IdKind, VolumeRecord};

/// Whether the capability fits a volume of the given access type.
fn check_access(volume: &VolumeRecord, cap: Option<&VolumeCapability>) -> CsiResult<()> {
    let Some(cap) = cap else {
        return Ok(()); // csi-node names the missing field
    };
    match (volume.access, cap.is_block()) {
        (Access::Block, true) | (Access::Mount, false) => Ok(()),
        (Access::Block, false) => Err(CsiError::FailedPrecondition(format!(
            "volume {} is a block volume and cannot be used with mount access",
            volume.id
        ))),
        (Access::Mount, true) => Err(CsiError::FailedPrecondition(format!(
            "volume {} is a filesystem volume and cannot be used with block access",
            volume.id
        ))),
    }
}

impl HostPath {
    /// The record of a volume this node may use, or NOT_FOUND.
    pub(crate) fn known_volume(&self, id: &str) -> CsiResult<VolumeRecord> {
        if !IdKind::Volume.is_valid(id) {
            return Err(CsiError::NotFound(format!("volume {id:?} does not exist")));
        }
        self.store
            .read(|s| s.volumes.get(id).cloned())
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    /// The inline ephemeral volume named `name`, if it exists.
    fn ephemeral_named(&self, name: &str) -> Option<VolumeRecord> {
        self.store.read(|s| {
            s.volumes
                .values()
                .find(|v| v.ephemeral && v.name == name)
                .cloned()
        })
    }

    /// Creates the backing volume of an inline ephemeral volume on first
    /// publish; returns it and whether it was created now.
    fn ephemeral_volume(&self, name: &str) -> CsiResult<(VolumeRecord, bool)> {
        if let Some(v) = self.ephemeral_named(name) {
            return Ok((v, false));
        }
        let record = VolumeRecord {
            id: IdKind::Volume.generate(),
            name: name.to_owned(),
            capacity_bytes: crate::controller::DEFAULT_VOLUME_SIZE,
            access: Access::Mount,
            source: None,
            parameters: Default::default(),
            mutable_parameters: Default::default(),
            topology: Default::default(),
            request: Vec::new(),
            published_nodes: Default::default(),
            ephemeral: true,
        };
        self.backend
            .create_volume(&record.id, Access::Mount, record.capacity_bytes)?;
        self.store.update(|s| {
            s.volumes.insert(record.id.clone(), record.clone());
            Ok(())
        })?;
        Ok((record, true))
    }

    /// Removes an inline ephemeral volume: its record, then its data.
    fn remove_ephemeral(&self, volume: &VolumeRecord) -> CsiResult<()> {
        self.store.update(|s| {
            s.volumes.remove(&volume.id);
            s.retire_ephemeral(&volume.name);
            Ok(())
        })?;
        self.backend.delete_volume(&volume.id, Access::Mount)
    }

    /// Whether the node record holds anything of volume `id` (the
    /// controller refuses to delete it then).
    pub fn in_use_on_node(&self, id: &str) -> bool {
        self.node.record(id).is_some()
    }
}

#[csi_server::async_trait]
impl Node for HostPath {
    async fn node_stage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        check_access(&volume, req.volume_capability.as_ref())?;
        on_node(&self.node, move |node| node.stage(&req)).await?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        on_node(&self.node, move |node| node.unstage(&req)).await?;
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        _ctx: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let ephemeral = req
            .volume_context
            .get(EPHEMERAL_CONTEXT_KEY)
            .is_some_and(|v| v == "true");
        let (volume, created) = if ephemeral {
            self.ephemeral_volume(&req.volume_id)?
        } else {
            (self.known_volume(&req.volume_id)?, false)
        };
        check_access(&volume, req.volume_capability.as_ref())?;
        let result = on_node(&self.node, move |node| node.publish(&req)).await;
        if let (Err(e), true) = (&result, created) {
            // Nothing references a volume created for a publish that failed.
            tracing::debug!(volume = %volume.id, code = ?e.code(), "removing the ephemeral volume of a failed publish");
            self.remove_ephemeral(&volume)?;
        }
        result?;
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        let ephemeral = self.ephemeral_named(&req.volume_id);
        let retired = ephemeral.is_none()
            && self
                .store
                .read(|s| s.retired_ephemeral.contains(&req.volume_id));
        let target = PathBuf::from(&req.target_path);
        let id = req.volume_id.clone();
        let outcome = on_node(&self.node, move |node| node.unpublish(&req)).await;
        match outcome {
            // A repeat for an ephemeral volume already removed.
            Err(CsiError::NotFound(_)) if retired => {}
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if let Some(v) = ephemeral {
            let still = self.node.record(&id).is_some();
            if !still {
                self.remove_ephemeral(&v)?;
            } else {
                tracing::debug!(volume = %v.id, target = %target.display(), "ephemeral volume still published elsewhere");
            }
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        _ctx: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let volume = self.known_volume(&req.volume_id)?;
        let image = self.backend.volume_path(&volume.id, Access::Block);
        node_stats(&self.node, req.volume_id, req.volume_path, move |_| {
            image.metadata().ok().map(|m| m.len())
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
        let device = record.stage.and_then(|s| s.device);
        if let Some(dev) = device.filter(|_| volume.access == Access::Block) {
            let loops = self.loops.clone();
            blocking(move || {
                loops
                    .set_capacity(&dev.path)
                    .map(drop)
                    .map_err(|e| internal("refreshing the size of", &dev.path, e))
            })
            .await?;
        }
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: volume.capacity_bytes,
        })
    }

    async fn node_get_info(
        &self,
        _ctx: &CallContext,
        _req: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes_per_node(),
            accessible_topology: self.config.enable_topology.then(|| Topology {
                segments: [(TOPOLOGY_KEY.to_owned(), self.node_id.clone())].into(),
            }),
        })
    }
}
