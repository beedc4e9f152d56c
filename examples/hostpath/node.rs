//! The Node service: staging and publishing with real bind mounts and loop
//! devices through mount-utils.
//!
//! Mount volumes: NodeStage bind-mounts the volume directory at the staging
//! path; NodePublish bind-mounts the staging path at the target (read-only
//! and mount flags honoured). Block volumes: NodeStage attaches the image as
//! a loop device; NodePublish bind-mounts the device node on a file at the
//! target. Every step checks the mount table first, so a retry after a crash
//! between "mounted" and "recorded" converges instead of mounting twice.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use csi_proto::v1::*;
use csi_server::helpers::publish::{PublishDecision, check_publish};
use csi_server::helpers::stage::{StageDecision, Staging, check_stage};
use csi_server::request::EPHEMERAL_CONTEXT_KEY;
use csi_server::{CallContext, CsiError, CsiResult, Node};
use mount_utils::{LoopDevice, LoopOptions, MountError};
use prost::Message;

use crate::common::{bind_publish, detach_loop, device_present_at, fs_usage, publications};
use crate::config::TOPOLOGY_KEY;
use crate::driver::{HostPath, blocking};
use crate::store::{Access, IdKind, PublishedRecord, StagedRecord, VolumeRecord};

fn mount_err(what: &str, path: &Path, e: MountError) -> CsiError {
    CsiError::Internal(format!("{what} {}: {e}", path.display()))
}

fn io_err(what: &str, path: &Path, e: io::Error) -> CsiError {
    CsiError::Internal(format!("{what} {}: {e}", path.display()))
}

/// Whether the capability fits a volume of the given access type.
fn check_access(volume: &VolumeRecord, cap: &VolumeCapability) -> CsiResult<()> {
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
            .volumes
            .get(id)
            .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
    }

    fn stage_blocking(
        &self,
        volume: &VolumeRecord,
        staging: &Path,
        cap: &VolumeCapability,
    ) -> CsiResult<Option<PathBuf>> {
        match volume.access {
            Access::Mount => {
                fs::create_dir_all(staging).map_err(|e| io_err("creating", staging, e))?;
                let mounted = self
                    .mounter
                    .is_mount_point(staging)
                    .map_err(|e| mount_err("inspecting", staging, e))?;
                if !mounted {
                    let source = self.backend.volume_path(&volume.id, Access::Mount);
                    self.mounter
                        .bind_mount(&source, staging, false)
                        .map_err(|e| mount_err("staging at", staging, e))?;
                }
                let _ = cap;
                Ok(None)
            }
            Access::Block => {
                let image = self.backend.volume_path(&volume.id, Access::Block);
                let existing = mount_utils::loopdev::find_by_backing_file(&image)
                    .map_err(|e| CsiError::Internal(format!("looking up loop devices: {e}")))?;
                if let Some(dev) = existing.into_iter().next() {
                    return Ok(Some(dev));
                }
                // No autoclear: a bind mount of the device node does not hold
                // the device open, so autoclear would detach it at once.
                let opts = LoopOptions {
                    autoclear: false,
                    ..LoopOptions::default()
                };
                let dev = LoopDevice::attach(&image, &opts).map_err(|e| {
                    CsiError::Internal(format!("attaching {}: {e}", image.display()))
                })?;
                Ok(Some(dev.keep()))
            }
        }
    }

    fn publish_blocking(
        &self,
        volume: &VolumeRecord,
        source: &Path,
        target: &Path,
        cap: &VolumeCapability,
        readonly: bool,
    ) -> CsiResult<()> {
        let flags: Vec<&str> = cap
            .mount_volume()
            .map(|m| m.mount_flags.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let device_node = volume.access == Access::Block;
        bind_publish(&self.mounter, source, target, device_node, readonly, &flags)
    }

    /// Creates the backing volume of an inline ephemeral volume on first publish.
    fn ephemeral_volume(&self, name: &str) -> CsiResult<VolumeRecord> {
        if let Some(v) = self.store.volumes.read(|all| {
            all.values()
                .find(|v| v.ephemeral && v.name == name)
                .cloned()
        }) {
            return Ok(v);
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
            ephemeral: true,
        };
        self.backend
            .create_volume(&record.id, Access::Mount, record.capacity_bytes)?;
        if let Err(e) = self.store.volumes.put(&record.id, record.clone()) {
            let _ = self.backend.delete_volume(&record.id, Access::Mount);
            return Err(e.into());
        }
        if let Some(r) = self.ledger.reserve(record.capacity_bytes, 0) {
            r.keep();
        }
        Ok(record)
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
        let cap = req.volume_capability.clone().unwrap_or_default();
        check_access(&volume, &cap)?;
        let staging = PathBuf::from(&req.staging_target_path);
        let encoded = cap.encode_to_vec();
        let existing = self.store.staged.get(&volume.id).map(|staged| Staging {
            staging_target_path: staged.staging_path.to_string_lossy().into_owned(),
            volume_capability: VolumeCapability::decode(staged.capability.as_slice()).ok(),
        });
        if check_stage(existing.as_ref(), &req)? == StageDecision::AlreadyStaged {
            return Ok(NodeStageVolumeResponse {});
        }
        let this = self.clone();
        let (v, s, c) = (volume.clone(), staging.clone(), cap.clone());
        let loop_device = blocking(move || this.stage_blocking(&v, &s, &c)).await?;
        self.store.staged.put(
            &volume.id,
            StagedRecord {
                staging_path: staging,
                capability: encoded,
                loop_device,
            },
        )?;
        Ok(NodeStageVolumeResponse {})
    }

    async fn node_unstage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        let staging = PathBuf::from(&req.staging_target_path);
        let staged = self.store.staged.get(&req.volume_id);
        if staged.is_none() {
            self.known_volume(&req.volume_id)?;
        }
        let this = self.clone();
        let record = staged.clone();
        let path = staging.clone();
        blocking(move || {
            this.mounter
                .unmount(&path, false)
                .map_err(|e| mount_err("unstaging", &path, e))?;
            match record.and_then(|r| r.loop_device) {
                Some(dev) => detach_loop(&dev),
                None => Ok(()),
            }
        })
        .await?;
        if staged.is_some() {
            // A delete: works on a full disk.
            self.store.staged.delete(&req.volume_id)?;
        }
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
        let volume = if ephemeral {
            self.ephemeral_volume(&req.volume_id)?
        } else {
            self.known_volume(&req.volume_id)?
        };
        let cap = req.volume_capability.clone().unwrap_or_default();
        check_access(&volume, &cap)?;
        let target = PathBuf::from(&req.target_path);
        let existing = self
            .store
            .published
            .read(|all| publications(all, &volume.id));
        if check_publish(&existing, &req, self.single_node_multi_writer())?
            == PublishDecision::AlreadyPublished
        {
            return Ok(NodePublishVolumeResponse {});
        }
        let source = if ephemeral {
            self.backend.volume_path(&volume.id, Access::Mount)
        } else {
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
            match volume.access {
                Access::Mount => staged.staging_path,
                Access::Block => staged.loop_device.ok_or_else(|| {
                    CsiError::Internal(format!("volume {} has no loop device", volume.id))
                })?,
            }
        };
        let readonly = req.readonly || cap.access_mode().is_read_only();
        let this = self.clone();
        let (v, t, c) = (volume.clone(), target.clone(), cap.clone());
        blocking(move || this.publish_blocking(&v, &source, &t, &c, readonly)).await?;
        let mut record = PublishedRecord::of(&req, readonly);
        // An ephemeral volume's record names the generated id, not the CO's name.
        record.volume_id = volume.id.clone();
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
        let volume = match &record {
            Some(r) => self.store.volumes.get(&r.volume_id),
            None => {
                // Unknown volume ids are NOT_FOUND; a known one is simply not
                // published here any more (idempotent repeat).
                let ephemeral = self.store.retired_ephemeral.contains_key(&req.volume_id)
                    || self
                        .store
                        .volumes
                        .read(|all| all.values().any(|v| v.ephemeral && v.name == req.volume_id));
                if !ephemeral {
                    self.known_volume(&req.volume_id)?;
                }
                None
            }
        };
        let this = self.clone();
        let t = target.clone();
        blocking(move || {
            this.mounter
                .cleanup_mount_point(&t)
                .map_err(|e| mount_err("unpublishing", &t, e))
        })
        .await?;
        if record.is_some() {
            // A delete: works on a full disk.
            self.store.published.delete(&req.target_path)?;
        }
        if let Some(v) = volume.filter(|v| v.ephemeral) {
            self.store.volumes.remove(&v.id)?;
            self.ledger.release(v.capacity_bytes);
            self.backend.delete_volume(&v.id, Access::Mount)?;
            // Best effort: on a full disk a repeated unpublish gets NOT_FOUND.
            if let Err(e) = self.store.retire_ephemeral(&v.name) {
                tracing::warn!(volume = %v.id, error = %e, "could not remember a removed ephemeral volume");
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
        let path = PathBuf::from(&req.volume_path);
        let (listed, device) = {
            let staged = self.store.staged.get(&volume.id);
            let listed = self
                .store
                .published
                .get(&req.volume_path)
                .is_some_and(|p| p.volume_id == volume.id)
                || staged.as_ref().is_some_and(|st| st.staging_path == path);
            (listed, staged.and_then(|st| st.loop_device))
        };
        let not_found = CsiError::NotFound(format!(
            "volume {} is not published or staged at {}",
            volume.id,
            path.display()
        ));
        let this = self.clone();
        blocking(move || {
            if listed {
                return this.volume_stats(&volume, &path);
            }
            // A block volume is also wherever its device node is: the
            // kubelet asks at the pod's volumeDevices path, not the target.
            match device {
                Some(dev) if device_present_at(&path, &dev) => Ok(NodeGetVolumeStatsResponse {
                    usage: this.block_usage(&volume),
                    volume_condition: Some(VolumeCondition {
                        abnormal: false,
                        message: format!("the volume's device {} is present", dev.display()),
                    }),
                }),
                _ => Err(not_found),
            }
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
        if !path.exists() {
            return Err(CsiError::NotFound(format!(
                "volume path {} does not exist",
                path.display()
            )));
        }
        if volume.access == Access::Block {
            let staged = self.store.staged.get(&volume.id);
            if let Some(dev) = staged.and_then(|s| s.loop_device) {
                let d = dev.clone();
                blocking(move || {
                    let loop_dev = LoopDevice::open(&d)
                        .map_err(|e| CsiError::Internal(format!("opening {}: {e}", d.display())))?;
                    loop_dev.set_capacity().map_err(|e| {
                        CsiError::Internal(format!("refreshing {}: {e}", d.display()))
                    })?;
                    let _ = loop_dev.keep();
                    Ok(())
                })
                .await?;
            }
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

impl HostPath {
    /// A block volume's size (used and available are not known below a
    /// filesystem, and the spec lets them be omitted).
    fn block_usage(&self, volume: &VolumeRecord) -> Vec<VolumeUsage> {
        let size = self
            .backend
            .volume_path(&volume.id, Access::Block)
            .metadata()
            .map(|m| m.len() as i64)
            .unwrap_or(0);
        vec![VolumeUsage {
            total: size,
            unit: volume_usage::Unit::Bytes as i32,
            ..Default::default()
        }]
    }

    fn volume_stats(
        &self,
        volume: &VolumeRecord,
        path: &Path,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let meta = match fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Published here but the path is gone: report it, not an error.
                return Ok(NodeGetVolumeStatsResponse {
                    usage: Vec::new(),
                    volume_condition: Some(VolumeCondition {
                        abnormal: true,
                        message: format!("{} no longer exists", path.display()),
                    }),
                });
            }
            Err(e) => return Err(io_err("inspecting", path, e)),
        };
        let mounted = self.mounter.is_mount_point(path).unwrap_or(false);
        let condition = VolumeCondition {
            abnormal: !mounted,
            message: if mounted {
                "volume is mounted".into()
            } else {
                format!("{} is not a mount point", path.display())
            },
        };
        if volume.access == Access::Block || !meta.is_dir() {
            return Ok(NodeGetVolumeStatsResponse {
                usage: self.block_usage(volume),
                volume_condition: Some(condition),
            });
        }
        Ok(NodeGetVolumeStatsResponse {
            usage: fs_usage(path)?,
            volume_condition: Some(condition),
        })
    }
}
