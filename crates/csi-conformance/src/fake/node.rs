//! The fake driver's Node service: staging and publishing are recorded in
//! memory, target paths are made and removed on disk.

use std::path::Path;

use csi_proto::v1::*;
use csi_server::helpers::publish::{Publication, PublishArgs, PublishDecision, check_publish};
use csi_server::helpers::stage::{StageDecision, Staging, check_stage};
use csi_server::{CallContext, CsiError, CsiResult, Node};

use super::{FakeDriver, Fault, MAX_VOLUMES_PER_NODE, PUBLISH_CONTEXT_KEY, device_of, is_block};

impl FakeDriver {
    /// A controller-published volume's node call must carry the
    /// publish_context ControllerPublishVolume returned, as a CO passes it
    /// on: with split endpoints that is the node's only way to learn it.
    fn check_publish_context(
        &self,
        st: &super::state::State,
        volume_id: &str,
        context: &std::collections::HashMap<String, String>,
    ) -> CsiResult<()> {
        let published = st
            .controller_pubs
            .contains_key(&(volume_id.to_string(), self.opts.node_id.clone()));
        if published && context.get(PUBLISH_CONTEXT_KEY) != Some(&device_of(volume_id)) {
            return Err(CsiError::invalid(
                format!("publish_context[{PUBLISH_CONTEXT_KEY:?}]"),
                "missing or not the value ControllerPublishVolume returned",
            ));
        }
        Ok(())
    }
}

#[csi_server::async_trait]
impl Node for FakeDriver {
    async fn node_stage_volume(
        &self,
        _: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let mut st = self.lock();
        if let Err(e) = self.volume(&st, &req.volume_id) {
            return Err(if self.has(Fault::LeaksSecretsInErrors) {
                CsiError::NotFound(format!("{e} (credentials {:?})", req.secrets))
            } else {
                e
            });
        }
        self.check_publish_context(&st, &req.volume_id, &req.publish_context)?;
        if check_stage(st.staged.get(&req.volume_id), &req)? != StageDecision::AlreadyStaged {
            st.staged.insert(
                req.volume_id,
                Staging {
                    staging_target_path: req.staging_target_path,
                    volume_capability: req.volume_capability,
                },
            );
        }
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        let mut st = self.lock();
        let here = st
            .staged
            .get(&req.volume_id)
            .is_some_and(|s| s.staging_target_path == req.staging_target_path);
        if here {
            st.staged.remove(&req.volume_id);
        } else {
            self.volume(&st, &req.volume_id)?;
        }
        Ok(NodeUnstageVolumeResponse {})
    }

    async fn node_publish_volume(
        &self,
        _: &CallContext,
        req: NodePublishVolumeRequest,
    ) -> CsiResult<NodePublishVolumeResponse> {
        let mut st = self.lock();
        self.volume(&st, &req.volume_id)?;
        if !self.opts.stage_unstage {
            self.check_publish_context(&st, &req.volume_id, &req.publish_context)?;
        }
        let staged_here = st
            .staged
            .get(&req.volume_id)
            .is_some_and(|s| s.staging_target_path == req.staging_target_path);
        if self.opts.stage_unstage && !staged_here {
            return Err(CsiError::FailedPrecondition(
                "the volume is not staged at staging_target_path".into(),
            ));
        }
        let mut existing = st
            .node_pubs
            .get(&req.volume_id)
            .cloned()
            .unwrap_or_default();
        if self.has(Fault::NoRepeatTable) {
            // Only the same-target rule: any other target is a new one.
            existing.retain(|p| p.target_path == req.target_path);
        }
        if check_publish(&existing, &req, true)? == PublishDecision::AlreadyPublished {
            return Ok(NodePublishVolumeResponse {});
        }
        if st
            .node_pubs
            .iter()
            .any(|(v, p)| *v != req.volume_id && p.iter().any(|p| p.target_path == req.target_path))
        {
            return Err(CsiError::AlreadyExists(format!(
                "another volume is published at {}",
                req.target_path
            )));
        }
        let target = Path::new(&req.target_path);
        let block = req
            .volume_capability
            .as_ref()
            .is_some_and(VolumeCapability::is_block);
        if block {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(target)?;
        } else if let Err(e) = std::fs::create_dir(target)
            && !target.is_dir()
        {
            return Err(e.into());
        }
        st.node_pubs
            .entry(req.volume_id.clone())
            .or_default()
            .push(Publication {
                target_path: req.target_path.clone(),
                args: PublishArgs::of(&req),
            });
        Ok(NodePublishVolumeResponse {})
    }

    async fn node_unpublish_volume(
        &self,
        _: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        let mut st = self.lock();
        let pubs = st.node_pubs.entry(req.volume_id.clone()).or_default();
        let before = pubs.len();
        pubs.retain(|p| p.target_path != req.target_path);
        if pubs.len() < before {
            if !self.has(Fault::NoTargetCleanup) {
                let p = Path::new(&req.target_path);
                if p.is_dir() {
                    std::fs::remove_dir(p)?;
                } else {
                    std::fs::remove_file(p)?;
                }
            }
        } else {
            self.volume(&st, &req.volume_id)?;
        }
        Ok(NodeUnpublishVolumeResponse {})
    }

    async fn node_get_volume_stats(
        &self,
        _: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let st = self.lock();
        let v = self.volume(&st, &req.volume_id)?;
        if !self.has(Fault::StatsAtAnyPath) {
            st.available_at(&req.volume_id, &req.volume_path)?;
        }
        let capacity = v.volume.capacity_bytes;
        let mut usage = vec![VolumeUsage {
            available: capacity,
            total: capacity,
            used: 0,
            unit: volume_usage::Unit::Bytes as i32,
        }];
        if !is_block(&v.request.volume_capabilities) {
            usage.push(VolumeUsage {
                available: 1 << 20,
                total: 1 << 20,
                used: 0,
                unit: volume_usage::Unit::Inodes as i32,
            });
        }
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        })
    }

    async fn node_expand_volume(
        &self,
        _: &CallContext,
        req: NodeExpandVolumeRequest,
    ) -> CsiResult<NodeExpandVolumeResponse> {
        let st = self.lock();
        let v = self.volume(&st, &req.volume_id)?;
        st.available_at(&req.volume_id, &req.volume_path)?;
        let required = req.capacity_range.map_or(0, |c| c.required_bytes);
        Ok(NodeExpandVolumeResponse {
            capacity_bytes: v.volume.capacity_bytes.max(required),
        })
    }

    async fn node_get_info(
        &self,
        _: &CallContext,
        _: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(NodeGetInfoResponse {
            node_id: self.opts.node_id.clone(),
            max_volumes_per_node: MAX_VOLUMES_PER_NODE,
            accessible_topology: (!self.has(Fault::NoNodeTopology)).then(super::topology),
        })
    }
}
