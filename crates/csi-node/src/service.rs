//! [`NodeService`]: a ready CSI Node service over [`NodeVolumes`], so a
//! driver writes only what is its own ([`NodeBackend`]: which volumes exist,
//! their access type and size, inline ephemeral volumes).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use csi_driver::request::EPHEMERAL_CONTEXT_KEY;
use csi_driver::v1::*;
use csi_driver::{CallContext, CsiError, CsiResult, Node, blocking};
use csi_store::{FileStore, RecordStore};
use mount_utils::{FsUsage, Mounter, ResizeFs};

use crate::error::NodeError;
use crate::record::{StageRecord, VolumeSource};
use crate::seams::{VolumeContexts, VolumeLocator};
use crate::usage::{USAGE_WAIT, usage_within};
use crate::volumes::{NodeVolumes, NodeVolumesBuilder, RestoreReport};

/// What the node service needs to know of one of the driver's volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Created for raw block access (otherwise mount access): a capability
    /// of the other kind is FAILED_PRECONDITION.
    pub block: bool,
    /// Its size, NodeExpandVolume's answer for a volume with no device.
    pub capacity_bytes: i64,
}

impl VolumeInfo {
    /// A block (`block`) or mount volume of `capacity_bytes`.
    pub fn new(block: bool, capacity_bytes: i64) -> Self {
        VolumeInfo {
            block,
            capacity_bytes,
        }
    }
}

/// What is the driver's own on the node side; everything else is
/// [`NodeService`]'s. The [`VolumeLocator`] half says where a volume's data
/// is. Every method is called off the async runtime and may block.
pub trait NodeBackend: VolumeLocator + 'static {
    /// The volume `volume_id`, or `None` (NOT_FOUND). A driver that learns
    /// its volumes from the request implements
    /// [`volume_in`](Self::volume_in) instead.
    fn volume(&self, volume_id: &str) -> Option<VolumeInfo> {
        let _ = volume_id;
        None
    }

    /// The volume as a request's contexts describe it (NodeStage and
    /// NodePublish: the request's; NodeGetVolumeStats and NodeExpandVolume:
    /// those its stage was recorded with). [`volume`](Self::volume) by
    /// default.
    fn volume_in(
        &self,
        volume_id: &str,
        contexts: &VolumeContexts,
    ) -> Result<Option<VolumeInfo>, NodeError> {
        let _ = contexts;
        Ok(self.volume(volume_id))
    }

    /// Driver checks of a NodeStageVolume request (e.g. its publish
    /// context), before anything is touched. Nothing by default.
    fn check_stage(&self, req: &NodeStageVolumeRequest) -> CsiResult<()> {
        let _ = req;
        Ok(())
    }

    /// A lock held shared by NodeStage and NodeUnstage, so the driver can
    /// take it exclusively while no volume may be half attached (e.g. while
    /// cutting a group snapshot). None by default.
    fn stage_lock(&self) -> Option<&tokio::sync::RwLock<()>> {
        None
    }

    /// The inline ephemeral volume named `name` (NodePublishVolume with
    /// the ephemeral volume context), created on its first publish, and
    /// whether this call created it (it is removed again if the publish
    /// fails). INVALID_ARGUMENT by default: not supported.
    fn ephemeral_volume(
        &self,
        name: &str,
        req: &NodePublishVolumeRequest,
    ) -> CsiResult<(VolumeInfo, bool)> {
        let _ = (name, req);
        Err(CsiError::invalid(
            "volume_context",
            "this driver has no inline ephemeral volumes",
        ))
    }

    /// Whether `name` is a live inline ephemeral volume.
    fn is_ephemeral(&self, name: &str) -> bool {
        let _ = name;
        false
    }

    /// Removes the inline ephemeral volume `name` (its last publication is
    /// gone, or its first publish failed).
    fn remove_ephemeral(&self, name: &str) -> CsiResult<()> {
        let _ = name;
        Ok(())
    }

    /// Whether `name` is an inline ephemeral volume removed before: a
    /// repeated NodeUnpublishVolume of it is OK rather than NOT_FOUND.
    fn ephemeral_retired(&self, name: &str) -> bool {
        let _ = name;
        false
    }
}

/// NodeGetInfo's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id the CO uses.
    pub node_id: String,
    /// How many volumes may be published here (0: no limit).
    pub max_volumes_per_node: i64,
    /// The node's topology segments (none: no accessible topology).
    pub topology: BTreeMap<String, String>,
}

impl NodeInfo {
    /// A node with no volume limit and no topology.
    pub fn new(node_id: impl Into<String>) -> Self {
        NodeInfo {
            node_id: node_id.into(),
            ..Default::default()
        }
    }

    /// With a volume limit (0: none).
    pub fn max_volumes(mut self, n: i64) -> Self {
        self.max_volumes_per_node = n;
        self
    }

    /// With a topology segment.
    pub fn topology(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.topology.insert(key.into(), value.into());
        self
    }

    fn response(&self) -> NodeGetInfoResponse {
        NodeGetInfoResponse {
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.max_volumes_per_node,
            accessible_topology: (!self.topology.is_empty()).then(|| Topology {
                segments: self.topology.clone().into_iter().collect(),
            }),
        }
    }
}

/// A CSI Node service: the driver's [`NodeBackend`] plus everything every
/// driver repeats (the record, the rules, the spec's codes, stats,
/// expansion, NodeGetInfo). Register it with `ServerBuilder::node`; a
/// driver serving its controller in the same process registers its
/// controller separately and asks [`volumes`](Self::volumes) whether a
/// volume is still on this node.
pub struct NodeService<D> {
    driver: Arc<D>,
    volumes: NodeVolumes,
    info: NodeInfo,
    resizer: Option<ResizeFs>,
}

/// Sets up a [`NodeService`].
pub struct NodeServiceBuilder<D> {
    driver: Arc<D>,
    info: NodeInfo,
    volumes: NodeVolumesBuilder,
    resizer: Option<ResizeFs>,
}

impl<D: NodeBackend> NodeServiceBuilder<D> {
    /// Sets up the record (loop devices, how filesystems are mounted,
    /// SINGLE_NODE_MULTI_WRITER): see [`NodeVolumesBuilder`].
    pub fn volumes(mut self, f: impl FnOnce(NodeVolumesBuilder) -> NodeVolumesBuilder) -> Self {
        self.volumes = f(self.volumes);
        self
    }

    /// NodeExpandVolume grows the filesystem on a mount volume's device
    /// with `resizer` (by default only the device's size is refreshed).
    pub fn resize_filesystems(mut self, resizer: ResizeFs) -> Self {
        self.resizer = Some(resizer);
        self
    }

    /// Opens the record in csi-store files under `dir` (created if absent);
    /// filesystem volumes are mounted in `dir/mounts` first unless
    /// [`NodeVolumesBuilder::private_mounts`] said otherwise.
    pub fn open_in(self, dir: &Path) -> Result<NodeService<D>, NodeError> {
        self.open_on(Arc::new(csi_store::RealFs), dir)
    }

    /// Opens the record in the driver's own `store` when the controller
    /// runs in the same process: one journal and one flush for both
    /// services' changes. A record an earlier version kept apart under
    /// `separate_dir` (with [`open_in`](Self::open_in)) is used while that
    /// directory holds one.
    pub fn open_shared(
        mut self,
        store: &FileStore,
        separate_dir: &Path,
    ) -> Result<NodeService<D>, NodeError> {
        if separate_dir.join(csi_store::LOCK_FILE).exists() {
            return self.open_in(separate_dir);
        }
        if !self.volumes.has_private_mounts() {
            self.volumes = self.volumes.private_mounts(separate_dir.join("mounts"));
        }
        self.open(Arc::new(store.clone()))
    }

    /// Opens the record in `store`.
    pub fn open(self, store: Arc<dyn RecordStore>) -> Result<NodeService<D>, NodeError> {
        Ok(NodeService {
            volumes: self.volumes.store(store).open()?,
            driver: self.driver,
            info: self.info,
            resizer: self.resizer,
        })
    }
}

impl<D: NodeBackend> NodeService<D> {
    /// Starts a builder for `driver`'s node service on `mounter`.
    pub fn builder(
        driver: Arc<D>,
        info: NodeInfo,
        mounter: Arc<dyn Mounter>,
    ) -> NodeServiceBuilder<D> {
        let locator: Arc<dyn VolumeLocator> = driver.clone();
        NodeServiceBuilder {
            volumes: NodeVolumes::builder_without_store(mounter, locator),
            driver,
            info,
            resizer: None,
        }
    }

    /// The record of what this node staged and published.
    pub fn volumes(&self) -> &NodeVolumes {
        &self.volumes
    }

    /// The driver's half.
    pub fn driver(&self) -> &Arc<D> {
        &self.driver
    }

    /// NodeGetInfo's answer.
    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    /// At start, before serving: puts back what the record says is staged
    /// and published; a volume that cannot be restored is logged and
    /// reported abnormal, never stops the plugin.
    pub fn restore(&self) -> RestoreReport {
        log_abnormal(self.volumes.restore())
    }

    /// [`restore`](Self::restore) while serving: every recorded volume is
    /// marked as being restored now, before this returns (a call on one is
    /// ABORTED until it is back, never answered from a half-restored
    /// node); the returned future restores them off the async runtime.
    /// Report ready (Probe) once it has finished. The driver's stage lock
    /// is held throughout, as for a NodeStage. An error means the restore
    /// could not start (the runtime is shutting down).
    pub fn restore_in_background(
        &self,
    ) -> impl Future<Output = CsiResult<RestoreReport>> + Send + 'static {
        self.volumes.begin_restore();
        let (driver, volumes) = (self.driver.clone(), self.volumes.clone());
        async move {
            let _held = match driver.stage_lock() {
                Some(lock) => Some(lock.read().await),
                None => None,
            };
            blocking(move || Ok(log_abnormal(volumes.restore()))).await
        }
    }

    /// Runs `f` off the async runtime; its errors get the spec's codes.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&D, &NodeVolumes) -> Result<T, NodeError> + Send + 'static,
    ) -> CsiResult<T> {
        let (driver, volumes) = (self.driver.clone(), self.volumes.clone());
        blocking(move || f(&driver, &volumes).map_err(CsiError::from)).await
    }

    /// The shared stage lock, if the driver has one.
    async fn hold(&self) -> Option<tokio::sync::RwLockReadGuard<'_, ()>> {
        match self.driver.stage_lock() {
            Some(lock) => Some(lock.read().await),
            None => None,
        }
    }
}

fn log_abnormal(report: RestoreReport) -> RestoreReport {
    for (volume, why) in &report.abnormal {
        tracing::warn!(%volume, %why, "volume is abnormal");
    }
    report
}

/// The driver's volume, or NOT_FOUND.
fn known<D: NodeBackend>(
    driver: &D,
    id: &str,
    contexts: &VolumeContexts,
) -> Result<VolumeInfo, NodeError> {
    driver
        .volume_in(id, contexts)?
        .ok_or_else(|| NodeError::not_found(format!("volume {id:?} does not exist")))
}

/// The contexts a volume was staged with (none when it is not staged).
fn staged_contexts(volumes: &NodeVolumes, id: &str) -> VolumeContexts {
    let stage = volumes.record(id).and_then(|r| r.stage);
    stage.map_or_else(VolumeContexts::default, |s| VolumeContexts {
        volume_context: s.volume_context,
        publish_context: s.publish_context,
    })
}

/// A block capability for a mount volume (or the reverse) is
/// FAILED_PRECONDITION; a missing one is csi-node's to name.
fn check_access(
    id: &str,
    volume: VolumeInfo,
    cap: Option<&VolumeCapability>,
) -> Result<(), NodeError> {
    match cap {
        Some(cap) if cap.is_block() != volume.block => {
            let (was, asked) = if volume.block {
                ("block", "mount")
            } else {
                ("mount", "block")
            };
            Err(NodeError::failed_precondition(format!(
                "volume {id} was created for {was} access and cannot be used with {asked} access"
            )))
        }
        _ => Ok(()),
    }
}

/// A block volume's size: its device's, or its image file's when the
/// device shows none. Asked of the seams (loop devices, block devices), so
/// a fake host's sizes are what a test sees, never a real device's.
fn block_size(volumes: &NodeVolumes, stage: &StageRecord) -> u64 {
    let size = match (&stage.source, &stage.device) {
        (VolumeSource::Device(path), _) => volumes
            .block_devices()
            .find(path)
            .ok()
            .flatten()
            .map(|d| d.size),
        (VolumeSource::Image(_), Some(d)) => volumes
            .loop_devices()
            .info(&d.path)
            .ok()
            .flatten()
            .map(|i| i.size),
        _ => None,
    };
    size.filter(|&size| size > 0)
        .or_else(|| match &stage.source {
            VolumeSource::Image(image) => image.metadata().ok().map(|m| m.len()),
            _ => None,
        })
        .unwrap_or(0)
}

fn usage(u: FsUsage) -> Vec<VolumeUsage> {
    use volume_usage::Unit;
    vec![
        VolumeUsage {
            available: u.available_bytes as i64,
            total: u.total_bytes as i64,
            used: u.used_bytes as i64,
            unit: Unit::Bytes as i32,
        },
        VolumeUsage {
            available: u.free_inodes as i64,
            total: u.total_inodes as i64,
            used: u.used_inodes as i64,
            unit: Unit::Inodes as i32,
        },
    ]
}

#[csi_driver::async_trait]
impl<D: NodeBackend> Node for NodeService<D> {
    async fn node_stage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeStageVolumeRequest,
    ) -> CsiResult<NodeStageVolumeResponse> {
        let _held = self.hold().await;
        self.run(move |driver, volumes| {
            let contexts = VolumeContexts::of(&req.volume_context, &req.publish_context);
            let volume = known(driver, &req.volume_id, &contexts)?;
            check_access(&req.volume_id, volume, req.volume_capability.as_ref())?;
            driver.check_stage(&req)?;
            volumes.stage(&req)?;
            Ok(NodeStageVolumeResponse {})
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnstageVolumeRequest,
    ) -> CsiResult<NodeUnstageVolumeResponse> {
        // No lookup of the driver's volume: a crash may have left a device
        // of a volume the driver no longer has.
        let _held = self.hold().await;
        self.run(move |_, volumes| {
            volumes.unstage(&req)?;
            Ok(NodeUnstageVolumeResponse {})
        })
        .await
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
        self.run(move |driver, volumes| {
            let id = &req.volume_id;
            let (volume, created) = if ephemeral {
                driver.ephemeral_volume(id, &req)?
            } else {
                let contexts = VolumeContexts::of(&req.volume_context, &req.publish_context);
                (known(driver, id, &contexts)?, false)
            };
            let result = check_access(id, volume, req.volume_capability.as_ref())
                .and_then(|()| volumes.publish(&req));
            if let (Err(e), true) = (&result, created) {
                // Nothing references a volume created for a failed publish.
                tracing::debug!(volume = %id, error = %e, "removing the ephemeral volume of a failed publish");
                driver.remove_ephemeral(id)?;
            }
            result?;
            Ok(NodePublishVolumeResponse {})
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        _ctx: &CallContext,
        req: NodeUnpublishVolumeRequest,
    ) -> CsiResult<NodeUnpublishVolumeResponse> {
        self.run(move |driver, volumes| {
            let id = &req.volume_id;
            let ephemeral = driver.is_ephemeral(id);
            match volumes.unpublish(&req) {
                // A repeat for an ephemeral volume already removed.
                Err(e) if e.is_not_found() && !ephemeral && driver.ephemeral_retired(id) => {}
                other => drop(other?),
            }
            if ephemeral && volumes.record(id).is_none() {
                driver.remove_ephemeral(id)?;
            }
            Ok(NodeUnpublishVolumeResponse {})
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        _ctx: &CallContext,
        req: NodeGetVolumeStatsRequest,
    ) -> CsiResult<NodeGetVolumeStatsResponse> {
        let mounter = self.volumes.mounter().clone();
        self.run(move |driver, volumes| {
            let (id, path) = (&req.volume_id, &req.volume_path);
            known(driver, id, &staged_contexts(volumes, id))?;
            let mut condition = volumes.volume_condition(id, path)?;
            let stage = volumes.record(id).and_then(|r| r.stage);
            let usage = match stage.filter(|s| s.capability.is_block()) {
                Some(stage) => vec![VolumeUsage {
                    total: block_size(volumes, &stage) as i64,
                    unit: volume_usage::Unit::Bytes as i32,
                    ..Default::default()
                }],
                None if condition.abnormal => Vec::new(),
                None => match usage_within(&mounter, Path::new(path), USAGE_WAIT) {
                    Ok(found) => found.map(usage).unwrap_or_default(),
                    Err(message) => {
                        condition = VolumeCondition {
                            abnormal: true,
                            message,
                        };
                        Vec::new()
                    }
                },
            };
            Ok(NodeGetVolumeStatsResponse {
                usage,
                volume_condition: Some(condition),
            })
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        _ctx: &CallContext,
        req: NodeExpandVolumeRequest,
    ) -> CsiResult<NodeExpandVolumeResponse> {
        let loops = self.volumes.loop_devices().clone();
        let resizer = self.resizer.clone();
        self.run(move |driver, volumes| {
            let id = &req.volume_id;
            let volume = known(driver, id, &staged_contexts(volumes, id))?;
            let record = volumes.record_at(id, &req.volume_path)?;
            let staged = record.stage.and_then(|s| s.device.clone().map(|d| (s, d)));
            let Some((stage, dev)) = staged else {
                // A directory: nothing on the node to grow.
                return Ok(NodeExpandVolumeResponse {
                    capacity_bytes: volume.capacity_bytes,
                });
            };
            if stage.readonly {
                return Err(NodeError::failed_precondition(format!(
                    "volume {id} is staged read-only"
                )));
            }
            let size = match &stage.source {
                // The provider grew the disk: the kernel knows its new size.
                VolumeSource::Device(path) => volumes
                    .block_devices()
                    .find(path)
                    .map_err(|e| NodeError::block_device(path, &e))?
                    .map_or(0, |d| d.size),
                _ => loops
                    .set_capacity(&dev.path)
                    .map_err(|e| NodeError::loop_device("refreshing the size of", &dev.path, &e))?,
            };
            if let Some(resizer) = resizer.filter(|_| !stage.capability.is_block()) {
                let device = dev.path.to_string_lossy();
                let failed = |what: &str, e: mount_utils::ResizeError| {
                    CsiError::Internal(format!("{what} {}: {e}", dev.path.display()))
                };
                if resizer
                    .need_resize(&device, &stage.path)
                    .map_err(|e| failed("inspecting the filesystem on", e))?
                {
                    resizer
                        .resize(&device, &stage.path)
                        .map_err(|e| failed("growing the filesystem on", e))?;
                }
            }
            tracing::info!(volume = %id, capacity_bytes = size, "expanded volume on the node");
            Ok(NodeExpandVolumeResponse {
                capacity_bytes: size as i64,
            })
        })
        .await
    }

    async fn node_get_info(
        &self,
        _ctx: &CallContext,
        _req: NodeGetInfoRequest,
    ) -> CsiResult<NodeGetInfoResponse> {
        Ok(self.info.response())
    }
}
