//! The simulated kubelet's volume plugin: volume-state's calls become the
//! driver's RPCs, made in process on whatever driver process is running,
//! with the checks that need the moment of the call.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use csi_driver::{CallContext, Controller, CsiError, Method, Node, async_trait};
use csi_node::testing::requests::{publish_req, stage_req, unpublish_req, unstage_req};
use csi_proto::v1::{
    CapacityRange, ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest,
    NodeExpandVolumeRequest,
};
use mount_utils::Mounter;
use volume_state::controller::ActualAttachState;
use volume_state::csi::default_capability;
use volume_state::mounts::{MountIdentity, MountTable};
use volume_state::{
    AttachInfo, ExpandRequest, MountResult, PluginError, PublishRequest, StageRequest,
    VolumePlugin, VolumeSpec,
};

use crate::world::World;

/// The driver's services a call goes to.
type Driver = (Arc<dyn Controller>, Arc<dyn Node>);

/// Calls the driver for the node reconciler and the attach controller.
pub(crate) struct SimVolumePlugin {
    world: World,
    driver: Mutex<Option<Driver>>,
    /// The attach controller's state, which verify-attached reads (the
    /// node status' `volumesAttached`).
    attached: Arc<ActualAttachState<String, String>>,
    /// Volume ids some pod uses (the API server's view).
    in_use: Mutex<BTreeSet<String>>,
    /// The targets of pods that mount their volume read-only (a pod's
    /// choice in Kubernetes, not the volume's).
    read_only: Mutex<BTreeSet<PathBuf>>,
    /// Where pods' volumes are published.
    pods_dir: PathBuf,
    /// The size each volume's filesystem was grown to on the node:
    /// what NodeExpandVolume answered OK.
    expanded: Mutex<BTreeMap<String, i64>>,
    /// Invariants broken at the moment of a call.
    found: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ctx(method: Method) -> CallContext {
    CallContext::detached(0, method)
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

impl SimVolumePlugin {
    pub(crate) fn new(world: &World, attached: Arc<ActualAttachState<String, String>>) -> Self {
        SimVolumePlugin {
            world: world.clone(),
            driver: Mutex::new(None),
            attached,
            in_use: Mutex::default(),
            read_only: Mutex::default(),
            pods_dir: world.host_dir().join("kubelet/pods"),
            expanded: Mutex::default(),
            found: Mutex::default(),
        }
    }

    /// The driver process calls now go to.
    pub(crate) fn set_driver(&self, driver: Driver) {
        *lock(&self.driver) = Some(driver);
    }

    /// The volumes pods use now, and the targets to publish read-only.
    pub(crate) fn set_pods(&self, ids: BTreeSet<String>, read_only: BTreeSet<PathBuf>) {
        *lock(&self.in_use) = ids;
        *lock(&self.read_only) = read_only;
    }

    /// The size volume `id`'s filesystem was grown to on the node, if
    /// NodeExpandVolume answered OK for it.
    pub(crate) fn node_size(&self, id: &str) -> Option<i64> {
        lock(&self.expanded).get(id).copied()
    }

    /// The invariants broken at calls since the last take.
    pub(crate) fn take_found(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.found))
    }

    fn driver(&self) -> Result<Driver, PluginError> {
        match &*lock(&self.driver) {
            Some(d) if !self.world.crashed() => Ok(d.clone()),
            // The socket is gone: the call may or may not have started.
            _ => Err(PluginError::uncertain("the driver is not running")),
        }
    }

    /// The answer as the CO sees it: none from a process that crashed.
    fn answer<T>(&self, result: Result<T, CsiError>) -> Result<T, PluginError> {
        if self.world.crashed() {
            return Err(PluginError::uncertain("the driver crashed during the call"));
        }
        result.map_err(|e| PluginError::from_code(e.code(), e.to_string()))
    }

    fn broke(&self, what: String) {
        lock(&self.found).push(what);
    }

    /// Mounts showing volume `id`: elsewhere (staged) and under the pods'
    /// directory (published).
    fn mounts_of(&self, id: &str) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let mounts = self.world.mounter().mount_points().unwrap_or_default();
        mounts
            .into_iter()
            .filter(|m| !id.is_empty() && m.root.ends_with(id))
            .map(|m| m.mount_point)
            .partition(|p| !p.starts_with(&self.pods_dir))
    }

    fn used_by_pod(&self, id: &str) -> bool {
        lock(&self.in_use).contains(id)
    }
}

#[async_trait]
impl VolumePlugin<String, String> for SimVolumePlugin {
    async fn attach(
        &self,
        volume: &String,
        node: &String,
        spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError> {
        let (controller, _) = self.driver()?;
        let req = ControllerPublishVolumeRequest {
            volume_id: volume.clone(),
            node_id: node.clone(),
            volume_capability: Some(default_capability(spec)),
            readonly: spec.read_only,
            ..Default::default()
        };
        let r = controller
            .controller_publish_volume(&ctx(Method::ControllerPublishVolume), req)
            .await;
        self.answer(r).map(|resp| AttachInfo {
            device_path: None,
            publish_context: resp.publish_context.into_iter().collect(),
        })
    }

    async fn wait_for_attach(
        &self,
        volume: &String,
        node: &String,
        _spec: &VolumeSpec,
    ) -> Result<AttachInfo, PluginError> {
        let attached = self.attached.snapshot();
        match attached.attachment(volume, node) {
            Some(a)
                if a.state == volume_state::node::AttachState::Attached
                    && a.reported_as_attached =>
            {
                Ok((*a.info).clone())
            }
            _ => Err(PluginError::transient(
                "not in the node's attached volumes yet",
            )),
        }
    }

    async fn detach(&self, volume: &String, node: &String) -> Result<(), PluginError> {
        let (staged, published) = self.mounts_of(volume);
        if !staged.is_empty() || !published.is_empty() || self.used_by_pod(volume) {
            self.broke(format!(
                "ControllerUnpublishVolume of {volume} while it is mounted at {:?} or a pod uses it",
                [staged, published].concat()
            ));
        }
        let (controller, _) = self.driver()?;
        let req = ControllerUnpublishVolumeRequest {
            volume_id: volume.clone(),
            node_id: node.clone(),
            ..Default::default()
        };
        let r = controller
            .controller_unpublish_volume(&ctx(Method::ControllerUnpublishVolume), req)
            .await;
        self.answer(r).map(drop)
    }

    async fn stage(&self, request: &StageRequest<String>) -> Result<MountResult, PluginError> {
        let (_, node) = self.driver()?;
        if let Some(parent) = request.staging_path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let mut req = stage_req(
            &request.volume,
            &request.staging_path,
            default_capability(&request.spec),
        );
        req.publish_context = request.attach.publish_context.clone().into_iter().collect();
        let r = node
            .node_stage_volume(&ctx(Method::NodeStageVolume), req)
            .await;
        self.answer(r).map(|_| MountResult::default())
    }

    async fn unstage(&self, volume: &String, staging_path: &Path) -> Result<(), PluginError> {
        let (_, published) = self.mounts_of(volume);
        if !published.is_empty() || self.used_by_pod(volume) {
            self.broke(format!(
                "NodeUnstageVolume of {volume} while a pod uses it (published at {published:?})"
            ));
        }
        let (_, node) = self.driver()?;
        let req = unstage_req(volume, staging_path);
        let r = node
            .node_unstage_volume(&ctx(Method::NodeUnstageVolume), req)
            .await;
        self.answer(r).map(drop)
    }

    async fn publish(&self, request: &PublishRequest<String>) -> Result<MountResult, PluginError> {
        let staging = request.staging_path.clone().unwrap_or_default();
        let (staged, _) = self.mounts_of(&request.volume);
        if !staged.contains(&staging) {
            // What kubelet did after a reboot (kubernetes#120853).
            self.broke(format!(
                "NodePublishVolume of {} at {:?} before it is staged at {staging:?}",
                request.volume, request.target_path
            ));
        }
        let (_, node) = self.driver()?;
        if let Some(parent) = request.target_path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let mut req = publish_req(
            &request.volume,
            &staging,
            &request.target_path,
            default_capability(&request.spec),
        );
        req.readonly =
            request.spec.read_only || lock(&self.read_only).contains(&request.target_path);
        req.publish_context = request.attach.publish_context.clone().into_iter().collect();
        let r = node
            .node_publish_volume(&ctx(Method::NodePublishVolume), req)
            .await;
        self.answer(r).map(|_| MountResult::default())
    }

    async fn unpublish(&self, volume: &String, target_path: &Path) -> Result<(), PluginError> {
        let (_, node) = self.driver()?;
        let req = unpublish_req(volume, target_path);
        let r = node
            .node_unpublish_volume(&ctx(Method::NodeUnpublishVolume), req)
            .await;
        self.answer(r).map(drop)
    }

    async fn expand(&self, request: &ExpandRequest<String>) -> Result<u64, PluginError> {
        let (staged, published) = self.mounts_of(&request.volume);
        let staging = request.staging_path.clone().unwrap_or_default();
        if !staged.contains(&staging) || !published.contains(&request.volume_path) {
            self.broke(format!(
                "NodeExpandVolume of {} at {:?} while it is not staged at {staging:?} and published there \
                 (staged at {staged:?}, published at {published:?})",
                request.volume, request.volume_path
            ));
        }
        let (_, node) = self.driver()?;
        let size = i64::try_from(request.new_size)
            .map_err(|_| PluginError::final_error("size beyond CSI's int64"))?;
        let req = NodeExpandVolumeRequest {
            volume_id: request.volume.clone(),
            volume_path: path(&request.volume_path),
            staging_target_path: request
                .staging_path
                .as_deref()
                .map(path)
                .unwrap_or_default(),
            capacity_range: Some(CapacityRange {
                required_bytes: size,
                limit_bytes: 0,
            }),
            volume_capability: Some(default_capability(&request.spec)),
            ..Default::default()
        };
        let r = node
            .node_expand_volume(&ctx(Method::NodeExpandVolume), req)
            .await;
        let size = self.answer(r).map(|resp| {
            // 0: the driver does not say (CSI); kubelet then takes the
            // size it asked for.
            resp.capacity_bytes.max(size)
        })?;
        let mut expanded = lock(&self.expanded);
        let grown = expanded.entry(request.volume.clone()).or_default();
        *grown = (*grown).max(size);
        Ok(u64::try_from(size).unwrap_or(request.new_size))
    }
}

/// What kubelet reads of the mount table: the world's, by what is mounted.
#[derive(Debug)]
pub(crate) struct SimMountTable {
    mounter: Arc<mount_utils::FakeMounter>,
}

impl SimMountTable {
    pub(crate) fn new(world: &World) -> Self {
        SimMountTable {
            mounter: world.mounter().clone(),
        }
    }
}

impl MountTable for SimMountTable {
    fn source_at(&self, path: &Path) -> std::io::Result<Option<MountIdentity>> {
        if std::fs::symlink_metadata(path).is_err() {
            return Ok(None);
        }
        let found = self
            .mounter
            .mounted_at(path)
            .map_err(std::io::Error::other)?;
        Ok(found
            .filter(|m| m.mount_point == path)
            .map(|m| MountIdentity {
                device: (m.major, m.minor),
                root: m.root,
                fs_type: m.fs_type,
                source: m.source,
                // One boot: the simulated node never reboots.
                boot_id: Some("sim".into()),
            }))
    }
}
