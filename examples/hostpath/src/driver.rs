//! The driver value shared by every service, and startup reconciliation.
//! The controller side is csi-controller's service over [`Backend`].

use std::path::Path;
use std::sync::Arc;

use csi_controller::{ControllerService, open_state_on};
use csi_server::CsiError;
use csi_store::FileStore;
use mount_utils::{LoopDevices, Mounter};

use crate::backend::Backend;
use crate::config::{Config, TOPOLOGY_KEY};
use crate::node::NodeSide;

/// The hostpath driver: cheap to clone (everything shared is behind `Arc`).
#[derive(Clone)]
pub struct HostPath {
    /// This node's id (`--nodeid`, else the hostname).
    pub node_id: String,
    /// The Controller and GroupController, and the records.
    pub controller: ControllerService<Backend>,
    /// The volumes' and snapshots' data under the state directory.
    pub backend: Backend,
    /// The node service (csi-node's, over what this node staged and published).
    pub node: Arc<csi_node::NodeService<NodeSide>>,
}

/// The controller service's configuration from the flags.
pub fn controller_config(config: &Config) -> csi_controller::Config {
    csi_controller::Config {
        capacity: config.capacity,
        max_size: config.max_volume_size,
        topology_key: config.enable_topology.then(|| TOPOLOGY_KEY.to_owned()),
        attach_limit: config.attach_limit,
        keep_snapshot_sources: true,
        ..csi_controller::Config::new(config.common.node_id())
    }
}

impl HostPath {
    /// Opens (or creates) the state directory and locks it for the life of
    /// the process: a second instance on it gets an error naming the first.
    /// Its effects are crash points in test builds (crash-points, armed).
    pub fn open(config: Config, mounter: Arc<dyn Mounter>) -> Result<Self, String> {
        let loops = crash_points::loop_devices(Arc::new(mount_utils::LinuxLoopDevices::new()));
        Self::open_with(config, crash_points::mounter(mounter), loops)
    }

    /// [`open`](Self::open) with the loop devices to use (a fake in tests).
    pub fn open_with(
        config: Config,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
    ) -> Result<Self, String> {
        let statedir = config.statedir.clone();
        let fs = crash_points::file_system(Arc::new(csi_store::RealFs));
        let files = open_state_on(fs, &statedir, || {
            // A crash during a group snapshot can leave the state filesystem
            // frozen; thaw it before anything below writes to it.
            let dedicated = mount_utils::freeze::same_filesystem(&statedir, Path::new("/"))
                .is_ok_and(|on_root| !on_root);
            if dedicated && mount_utils::freeze::thaw(&statedir).unwrap_or(false) {
                tracing::warn!(statedir = %statedir.display(), "thawed a filesystem left frozen by a crash");
            }
        })?;
        Self::open_on(config, files, mounter, loops)
    }

    /// [`open_with`](Self::open_with) with its records in `files`, a store
    /// already open (csi-sim's simulated filesystem in the simulation
    /// test); the data stays under `--statedir`.
    pub fn open_on(
        config: Config,
        files: FileStore,
        mounter: Arc<dyn Mounter>,
        loops: Arc<dyn LoopDevices>,
    ) -> Result<Self, String> {
        let mut backend = Backend::new(&config.statedir, config.snapshotdir.as_deref())
            .map_err(|e| format!("preparing {}: {e}", config.statedir.display()))?;
        backend.attach = config.enable_attach;
        let shared = files.clone();
        let controller =
            ControllerService::open(files, controller_config(&config), backend.clone())?;
        let side = NodeSide(controller.downgrade());
        let node = side.open_service(&config, mounter, loops, &shared)?;
        let _ = backend.node.set(node.volumes().clone());
        Ok(Self {
            node,
            node_id: config.common.node_id(),
            controller,
            backend,
        })
    }

    /// Startup reconciliation, before serving: the controller's (group
    /// snapshots a crash left half done, data no record owns). What the
    /// node record says is staged and published is put back while serving
    /// (`NodeService::restore_in_background`).
    pub async fn reconcile_on_start(&self) -> Result<(), CsiError> {
        self.controller.reconcile().await
    }
}

impl csi_server::Identity for HostPath {}
